#!/usr/bin/env python3
# SPDX-License-Identifier: Apache-2.0
"""A torch rank for test_torch_keep.py, on the CPU and regend's host
backend: an MLP with a BatchNorm (buffers its forward writes), its tensors
in libregen's host pool, regen.torch.restore() at its start and keep() +
commit() as it trains, with torch's Adam or regen.torch.optim.AdamW.

    keep_torch_rank.py SOCKET JOB STEPS OUT [--die STEP WHERE] [--die-after STEP FRACTION] [--opt adam|adamw]
                       [--journal copy|marks] [--lose-inside STEP] [--no-snapshot] [--async-commit] [--no-buffers] [--width W]
                       [--layers L] [--meta]

--die: SIGKILL itself at STEP, WHERE one of
  before_step   after the forward and backward, before opt.step()
  mid_step      inside torch's Adam: half the parameters updated (torch's
                own update, cut short by the kill), the rest not
  after_step    opt.step() done (a Run of regend's AdamW applied), before
                the commit
  mid_forward   after the BatchNorm wrote its statistics
  after_commit  right after the commit
--die-after: killed FRACTION (0 to 2) of a step's time after the line of
the STEP-th step past the one it resumed from, by a kernel timer (SIGALRM, whose default action ends the process as
SIGKILL does: no handler runs), at the pace this rank keeps now; SIGKILL
at step STEP+2's line where the timer has not fired.  The rank times its
own kill, so a loaded machine delaying the test's reading of its lines
cannot let it run to the end first.
--journal: regen's AdamW's journal (with marks the step's last write must
be opt.step(), so the "seen" buffer is counted before it, not after).
--lose-inside: from STEP on, a device_lost injected into regend a few ms
into each opt.step() until one lands inside its Run: with --journal marks,
opt.step() raises rt.Torn; the rank prints "torn ..." and exits 4.
--meta: the model is built on the meta device for restore() (built again
for real when nothing is kept).  OUT: the final state (torch.save).  Prints "resume START put_back WHAT
ptrs_in_pool BOOL" first, then "step N" as each step commits.
"""

import os
import signal
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.dirname(HERE))

import torch  # noqa: E402
import regen.torch as rt  # noqa: E402
from regen.pool import Pool  # noqa: E402


def into_pool(t):
    return rt.host_empty(list(t.shape), t.dtype).copy_(t)


def arg(name, default, cast=str):
    return cast(sys.argv[sys.argv.index(name) + 1]) if name in sys.argv else default


def die():
    os.kill(os.getpid(), signal.SIGKILL)


def cut_torch_adam_in_half():
    """torch's own Adam update, of the first half of the parameters, then
    the kill: the kept memory holds half an update."""
    import torch.optim.adam as adam_module
    whole = adam_module.adam

    def half(params, grads, exp_avgs, exp_avg_sqs, max_exp_avg_sqs, state_steps, *args, **kwargs):
        n = len(params) // 2
        whole(params[:n], grads[:n], exp_avgs[:n], exp_avg_sqs[:n], max_exp_avg_sqs[:n], state_steps[:n],
              *args, **kwargs)
        die()
    adam_module.adam = half


def lose_inside(opt, attempt, sock):
    """opt.step() with a device_lost injected into regend a few ms in,
    which may land inside its Run: rt.Torn ends the rank (exit 4)."""
    import threading
    import regen
    admin = regen.Client(sock, timeout=30)
    timer = threading.Timer((0.005, 0.01, 0.02, 0.03)[attempt % 4], lambda: admin.inject_fault(0, "device_lost"))
    timer.start()
    try:
        opt.step()
    except rt.Torn as e:
        print(f"torn {e}", flush=True)
        sys.exit(4)
    finally:
        timer.join()
        admin.close()
    if attempt > 16:
        print("no device_lost landed inside a Run", flush=True)
        sys.exit(5)


# --no-buffers: the model holds no buffer (no BatchNorm, no "seen"), as
# keep(async_commit=True) needs to commit without waiting.
BUFFERS = "--no-buffers" not in sys.argv


def build(width, layers, device=None):
    torch.manual_seed(0)
    norm = torch.nn.BatchNorm1d(width, device=device) if BUFFERS else torch.nn.Identity()
    mods = [torch.nn.Linear(32, width, device=device), norm, torch.nn.Tanh()]
    for _ in range(layers):
        mods += [torch.nn.Linear(width, width, device=device), torch.nn.Tanh()]
    mods.append(torch.nn.Linear(width, 8, device=device))
    model = torch.nn.Sequential(*mods)
    if BUFFERS:
        model.register_buffer("seen", torch.zeros(4, device=device))
    if device == "meta":
        return model
    for p in model.parameters():
        p.data = into_pool(p.data)
    for name, b in list(model.named_buffers()):
        module_name, _, attr = name.rpartition(".")
        model.get_submodule(module_name)._buffers[attr] = into_pool(b)
    return model


def main():
    sock, job, steps, out = sys.argv[1], sys.argv[2], int(sys.argv[3]), sys.argv[4]
    die_at = (int(sys.argv[sys.argv.index("--die") + 1]), sys.argv[sys.argv.index("--die") + 2]) \
        if "--die" in sys.argv else (None, None)
    kind, snapshot = arg("--opt", "adam"), "--no-snapshot" not in sys.argv
    async_commit = "--async-commit" in sys.argv
    die_after = (int(sys.argv[sys.argv.index("--die-after") + 1]),
                 float(sys.argv[sys.argv.index("--die-after") + 2])) if "--die-after" in sys.argv else None
    journal, lose_from = arg("--journal", "copy"), arg("--lose-inside", None, int)
    rt.configure(socket=sock, host_device=0)

    def optimizer(model):
        if kind == "adamw":
            import regen.torch.optim as ropt
            return ropt.AdamW(model.parameters(), lr=1e-2, weight_decay=0.1, journal=journal)
        # The update a parameter at a time (torch 1.13's default on the
        # CPU; torch 2's foreach path would make one call of it).
        return torch.optim.Adam(model.parameters(), lr=1e-2, foreach=False)
    shape = (arg("--width", 64, int), arg("--layers", 1, int))
    model = build(*shape, device="meta" if "--meta" in sys.argv else None)
    opt = optimizer(model)
    key = (job, 0)
    try:
        start = rt.restore(model, opt, key=key)
    except rt.Torn as e:
        print(f"torn {e}", flush=True)
        sys.exit(3)
    if start is None and "--meta" in sys.argv:
        model = build(*shape)
        opt = optimizer(model)
    pool = Pool.get()
    in_pool = all(pool.chunk_of(t.data_ptr()) is not None for t in list(model.parameters()) +
                  list(model.buffers()))
    kept = rt.keep(model, opt, key=key, snapshot=snapshot, async_commit=async_commit) if start is not None else None
    phases = rt.last_restore_phases(key)
    print(f"resume {start} put_back {rt.last_put_back(key)} ptrs_in_pool {in_pool} "
          f"restore_phases {','.join(sorted(k for k, v in phases.items() if v >= 0))}", flush=True)
    signal.signal(signal.SIGALRM, signal.SIG_DFL)
    kill_step = (start or 0) + die_after[0] if die_after is not None else None
    last_line = time.monotonic()
    for step in range((start or 0) + 1, steps + 1):
        if die_at == (step, "mid_forward"):
            model[2].register_forward_hook(lambda *_: die())
        g = torch.Generator().manual_seed(step)
        x = torch.randn(16, 32, generator=g)
        loss = model(x).square().mean()
        loss.backward()
        if kind == "adamw":
            for p in model.parameters():
                p.grad = into_pool(p.grad)
        if die_at == (step, "before_step"):
            die()
        if die_at == (step, "mid_step"):
            cut_torch_adam_in_half()
        if journal == "marks" and BUFFERS:
            model.seen += 1
        if lose_from is not None and step >= lose_from:
            lose_inside(opt, step - lose_from, sock)
        else:
            opt.step()
        opt.zero_grad(set_to_none=True)
        if journal != "marks" and BUFFERS:
            model.seen += 1
        if die_at == (step, "after_step"):
            die()
        if kept is None:
            # Adam made its moments with torch's allocator: into the pool,
            # where keep() can hand them to regend.
            for state in opt.state.values():
                for k, v in state.items():
                    if torch.is_tensor(v) and v.dim() > 0 and pool.chunk_of(v.data_ptr()) is None:
                        state[k] = into_pool(v)
            kept = rt.keep(model, opt, key=key, snapshot=snapshot, async_commit=async_commit)
        kept.commit(step)
        print(f"step {step}", flush=True)
        now = time.monotonic()
        step_s, last_line = now - last_line, now
        if kill_step is not None and step == kill_step:
            signal.setitimer(signal.ITIMER_REAL, max(die_after[1] * step_s, 1e-6))
        if kill_step is not None and step == kill_step + 2:
            die()
        if die_at == (step, "after_commit"):
            die()
    state = {f"p{i}": p.detach().clone() for i, p in enumerate(model.parameters())}
    state.update({f"b.{n}": b.clone() for n, b in model.named_buffers()})
    for i, p in enumerate(model.parameters()):
        for k, v in opt.state[p].items():
            state[f"s{i}.{k}"] = v.clone() if torch.is_tensor(v) else torch.tensor(v)
    torch.save(state, out)
    print(f"commits {'async' if kept is not None and kept._async_commit else 'sync'}", flush=True)
    if kept is not None:
        kept.close()       # the last commit written and told
    print("done", flush=True)


if __name__ == "__main__":
    main()
