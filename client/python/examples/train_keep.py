#!/usr/bin/env python3
# SPDX-License-Identifier: Apache-2.0
"""Train, get SIGKILLed, resume from the memory regend kept (issue 33).

A small MLP trains on fixed data; after each step the rank commits it to
regend (rt.keep(...).commit(step)).  `--demo` does the whole story: it
starts this script as a child that trains and SIGKILLs itself right after
committing a random step, starts it again (it resumes with rt.restore(): the parameters and Adam's
state come back with the same contents, no checkpoint read), lets it
finish, and compares the final weights with a run that was never killed.
regend must be running (REGEN_SOCKET), with kept state (max_kept_gib > 0).
`--warm` runs the rank that is killed under `python3 -m regen.warm_start`,
which starts it again itself, forked from the imports it made once (torch,
torch._dynamo, regen.torch): the resume's own seconds are then regen's,
not torch's import.

    python3 client/python/examples/train_keep.py --demo [--device cuda|cpu] [--warm]
"""

import argparse
import os
import random
import signal
import subprocess
import sys
import tempfile
import time

STEPS = 200


def child(args):
    if args.device != "cpu":
        # Every CUDA allocation from libregen's pool: memory regend can keep.
        os.environ.setdefault("REGEN_TORCH_POOL", "process")
    import torch
    import regen.torch as rt
    torch.manual_seed(0)
    dev = args.device
    if dev == "cpu":
        # The host backend: tensors from libregen's host pool.
        def place(t):
            return rt.host_empty(list(t.shape), t.dtype).copy_(t)
    else:
        def place(t):
            return t.to(dev)
    model = torch.nn.Sequential(torch.nn.Linear(64, 256), torch.nn.GELU(), torch.nn.Linear(256, 64))
    for p in model.parameters():
        p.data = place(p.data)
    opt = torch.optim.Adam(model.parameters(), lr=1e-3)
    # Adam's state exists from its first step: make it now, with a zero step, so that keep() has it.
    for p in model.parameters():
        p.grad = torch.zeros_like(p)
    opt.step()
    opt.zero_grad(set_to_none=True)
    # Adam made its moments with torch's allocator: on the CPU they go into
    # the host pool, where keep() can hand them to regend (on CUDA the
    # process pool holds every allocation already).
    for state in opt.state.values():
        for k, v in state.items():
            if torch.is_tensor(v) and v.dim() > 0:
                state[k] = place(v)
    key = (args.job, 0)
    start = rt.restore(model, opt, key=key)
    start = 0 if start is None else start
    if start:
        print(f"resumed at step {start} from the memory regend kept", flush=True)
    kept = rt.keep(model, opt, key=key)
    g = torch.Generator().manual_seed(1)
    data = [(torch.randn(32, 64, generator=g), torch.randn(32, 64, generator=g)) for _ in range(8)]
    for step in range(start + 1, STEPS + 1):
        x, y = (place(t) for t in data[step % len(data)])
        loss = torch.nn.functional.mse_loss(model(x), y)
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
        kept.commit(step)
        if step == args.die_at:
            # A crash right after a committed step (a kill inside
            # opt.step() resumes from the same step: keep() puts the
            # state back from its twin).
            os.kill(os.getpid(), signal.SIGKILL)
        if step % 50 == 0:
            print(f"step {step}: loss {loss.item():.5f}", flush=True)
    # A copy of each: a restored parameter is a view of the kept memory, and
    # torch.save of a view writes its whole storage.
    torch.save([p.detach().to("cpu", copy=True) for p in model.parameters()], args.out)
    if args.drop:
        rt.runtime().client.drop(args.job)


def demo(args):
    me = [sys.executable, os.path.abspath(__file__), "--device", args.device]
    tag = f"keep-demo-{os.getpid()}"
    with tempfile.TemporaryDirectory(prefix=tag) as tmp:
        return demo_in(me, tag, os.path.join(tmp, "clean.pt"), os.path.join(tmp, "resumed.pt"), args.warm)


def demo_in(me, tag, clean, resumed, warm):
    import torch
    subprocess.check_call(me + ["--child", "--job", tag + "-a", "--out", clean, "--drop"])
    die = random.randint(20, STEPS - 20)
    rank = me + ["--child", "--job", tag + "-b", "--out", resumed, "--die-at", str(die), "--drop"]
    t0 = time.perf_counter()
    if warm:
        # The launcher starts the rank again when it dies; the new start
        # resumes past the step it died at, so --die-at does not recur.
        subprocess.check_call([me[0], "-m", "regen.warm_start", "--restarts", "1", "--"] + rank[1:])
        print(f"the rank was SIGKILLed after committing step {die}; regen.warm_start started it again and it "
              f"finished, {time.perf_counter() - t0:.1f} s in all", flush=True)
    else:
        rc = subprocess.call(rank)
        print(f"the rank was SIGKILLed after committing step {die} (exit {rc})", flush=True)
        t0 = time.perf_counter()
        subprocess.check_call(rank)
        print(f"the resumed rank finished {time.perf_counter() - t0:.1f} s after it started")
    a, b = torch.load(clean), torch.load(resumed)
    same = all(torch.equal(x, y) for x, y in zip(a, b))
    print("final weights bit-identical to the run never killed" if same else "final weights DIFFER")
    return 0 if same else 1


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--demo", action="store_true")
    ap.add_argument("--child", action="store_true")
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--job", default="keep-demo")
    ap.add_argument("--out", default="/tmp/keep-demo.pt")
    ap.add_argument("--die-at", type=int, default=None)
    ap.add_argument("--drop", action="store_true")
    ap.add_argument("--warm", action="store_true")
    args = ap.parse_args()
    if args.child:
        return child(args)
    return demo(args)


if __name__ == "__main__":
    sys.exit(main())
