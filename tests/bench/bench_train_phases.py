#!/usr/bin/env python3
# SPDX-License-Identifier: Apache-2.0
"""Where a train_gpt step's time goes on the rank's thread, in process and
through regend, in the same run: forward, loss, backward, optimizer, then
waiting for the GPU (loss.item()), medians over the steady steps.

    python3 tests/bench/bench_train_phases.py [path/to/regend] [--socket PATH] [--ordering events]
                                              [--steps 12] [--kernels stack|block] [--profile] [--json out.json]

The model is train_gpt.py's full one (8 layers, width 2048, 16 heads,
sequence 2048, bf16); through regend it runs as train_gpt does (under
regen.torch.pool() and enable(), backward on this thread), its blocks as
rt.transformer_blocks (--kernels stack) or rt.transformer_block each.
--profile prints a cProfile of three more regend steps (its overhead
distorts the times; the table is taken without it).  regen.torch's
counters are printed after the regend run.  Exit 77 without torch or a GPU.
"""

import argparse
import collections
import contextlib
import cProfile
import io
import json
import os
import pstats
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
from _harness import REPO, Daemon, markdown_table, require_torch, write_json  # noqa: E402

sys.path.insert(0, os.path.join(REPO, "client", "python", "examples"))
PHASES = ("forward", "loss", "backward", "optimizer", "gpu_wait", "step")


def run(torch, train_gpt, mode, socket, args):
    import torch.nn.functional as F
    import regen.torch as rt
    cfg = dict(train_gpt.FULL)
    dev = torch.device("cuda:0")
    scope = contextlib.ExitStack()
    if mode == "regend":
        rt.configure(socket=socket, ordering=args.ordering)
        scope.enter_context(torch.autograd.set_multithreading_enabled(False))
        scope.enter_context(rt.pool(0))
    times = collections.defaultdict(list)
    with scope:
        torch.manual_seed(0)
        model = train_gpt.GPT(**cfg).to(device=dev, dtype=torch.bfloat16)
        if mode == "regend":
            model.use_regend(rt, args.kernels)
        else:
            model.set_kernels(train_gpt.attention_in_torch, None)
        opt = torch.optim.AdamW(model.parameters(), lr=3e-4, weight_decay=0.0)
        data = train_gpt.batches(cfg, 1, dev)
        xs = [next(data) for _ in range(3)]
        extra = 3 if args.profile and mode == "regend" else 0
        prof = None
        for step in range(args.steps + extra):
            if step == args.steps:
                prof = cProfile.Profile()
                prof.enable()
            x, y = xs[step % 3]
            torch.cuda.synchronize()
            t0 = time.perf_counter()
            routed = rt.enable(devices=("cuda",)) if mode == "regend" else contextlib.nullcontext()
            with routed:
                logits = model(x)
                t1 = time.perf_counter()
                loss = F.cross_entropy(logits.float().view(-1, cfg["vocab"]), y.reshape(-1))
                t2 = time.perf_counter()
                loss.backward()
                t3 = time.perf_counter()
            opt.step()
            opt.zero_grad(set_to_none=True)
            t4 = time.perf_counter()
            loss.item()
            t5 = time.perf_counter()
            if 3 <= step < args.steps:
                for name, v in zip(PHASES, (t1 - t0, t2 - t1, t3 - t2, t4 - t3, t5 - t4, t5 - t0)):
                    times[name].append(v * 1e3)
        if prof is not None:
            prof.disable()
            out = io.StringIO()
            pstats.Stats(prof, stream=out).sort_stats("tottime").print_stats(30)
            print(out.getvalue())
        counters = rt.stats() if mode == "regend" else None
    return {k: sorted(v)[len(v) // 2] for k, v in times.items()}, counters


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("regend", nargs="?")
    p.add_argument("--socket")
    p.add_argument("--ordering", default="events", choices=("events", "wait", "sync", "auto"))
    p.add_argument("--steps", type=int, default=12)
    p.add_argument("--kernels", default="stack", choices=("stack", "block"))
    p.add_argument("--profile", action="store_true")
    p.add_argument("--json")
    args = p.parse_args()
    torch = require_torch()
    import train_gpt
    daemon = Daemon(args.socket, args.regend, "cuda")
    try:
        local, _ = run(torch, train_gpt, "torch", None, args)
        through, counters = run(torch, train_gpt, "regend", daemon.socket, args)
    finally:
        daemon.close()
    rows = [[name, f"{local[name]:.2f}", f"{through[name]:.2f}"] for name in PHASES]
    print(markdown_table(["phase (median ms)", "in process", f"regend ({args.ordering}, {args.kernels})"], rows))
    plain = {k: v for k, v in counters.items() if not isinstance(v, dict)}
    print("regen.torch counters over the run:", json.dumps(plain, default=round))
    write_json(args.json, {"in_process_ms": local, "regend_ms": through, "counters": plain,
                           "ordering": args.ordering, "kernels": args.kernels, "steps": args.steps})
    sys.stdout.flush()
    # torch's IPC teardown at exit would wait for a regend already gone.
    os._exit(0)


if __name__ == "__main__":
    sys.exit(main())
