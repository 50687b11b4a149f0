#!/usr/bin/env python3
"""AllReduce through regend (io.regen.Comm, NCCL in regend's worker) against
torch.distributed's NCCL in the same process and run, on the same tensors.

    python3 tests/bench/bench_allreduce.py [--regend PATH] [--dtype bf16]
        [--sizes 4096,1048576,...] [--iters 50] [--json OUT]

nranks = 1 here (one GPU: NCCL's single-rank path, a device copy plus the
call's cost); the harness takes --nranks for a machine of more GPUs, where
each rank is a process of its own (--rank-of, spawned by this script) and
torch.distributed runs the same sizes over the same GPUs. Each timing is one
call until its result is on the device: regend's call returns when the work
finished; torch's is followed by a synchronize. Prints a table and the ratio
regend / torch per size (below 1: regend faster). Exit 77 without torch or
CUDA."""

import argparse
import json
import os
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
from _harness import Regend, find_regend, regen, require_torch, summary  # noqa: E402

torch = require_torch()
import torch.distributed as dist  # noqa: E402

DT = {"f32": torch.float32, "f16": torch.float16, "bf16": torch.bfloat16}


def time_calls(fn, iters, warmup=5):
    for _ in range(warmup):
        fn()
    samples = []
    for _ in range(iters):
        t0 = time.perf_counter()
        fn()
        samples.append(time.perf_counter() - t0)
    return summary(samples)


def run_rank(rank, nranks, socket, args, uid, store_port):
    dev = rank
    torch.cuda.set_device(dev)
    c = regen.Client(socket, timeout=300)
    comm = c.comm_init(uid, rank, nranks, device=dev, deadline_ms=300000)
    store = dist.TCPStore("127.0.0.1", store_port, nranks, rank == 0)
    dist.init_process_group("nccl", store=store, rank=rank, world_size=nranks, device_id=torch.device("cuda", dev))
    rows = []
    for n in args.sizes:
        x = torch.randn(n, device=f"cuda:{dev}").to(DT[args.dtype])
        y = torch.empty_like(x)
        c.import_tensor(x)
        c.import_tensor(y)

        def via_regend():
            c.comm_all_reduce(comm, x, y)

        def via_torch():
            dist.all_reduce(y, op=dist.ReduceOp.SUM)
            torch.cuda.synchronize()

        r = time_calls(via_regend, args.iters)
        t = time_calls(via_torch, args.iters)
        rows.append({"elements": n, "bytes": n * x.element_size(), "regend": r, "torch": t,
                     "ratio": r["median_us"] / t["median_us"]})
    dist.destroy_process_group()
    c.comm_destroy(comm)
    c.close()
    return rows


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--regend")
    ap.add_argument("--dtype", default="bf16", choices=sorted(DT))
    ap.add_argument("--sizes", default="1024,65536,1048576,16777216,67108864",
                    type=lambda s: [int(x) for x in s.split(",")])
    ap.add_argument("--iters", type=int, default=50)
    ap.add_argument("--nranks", type=int, default=1)
    ap.add_argument("--json")
    args = ap.parse_args()
    if args.nranks != 1:
        # Each rank a process of its own, sharing one regend: the next step
        # for a machine of several GPUs (spawn run_rank per rank, as
        # tests/gpu/test_nccl_multi.py does, and gather rank 0's rows).
        print("--nranks > 1 is not wired up yet; run with --nranks 1", file=sys.stderr)
        return 2
    daemon = Regend(args.regend or find_regend(), devices=1, backend="cuda", ready_timeout=120)
    try:
        c = regen.Client(daemon.socket, timeout=120)
        uid = c.comm_unique_id(0)
        c.close()
        os.environ.setdefault("NCCL_DEBUG", "WARN")
        rows = run_rank(0, 1, daemon.socket, args, uid, 29500 + os.getpid() % 1000)
    finally:
        daemon.stop()
    print(f"AllReduce sum {args.dtype}, nranks {args.nranks}, median of {args.iters} calls (us)")
    print(f"| elements | bytes | regend | torch.distributed | regend / torch |")
    print(f"| ---: | ---: | ---: | ---: | ---: |")
    for r in rows:
        print(f"| {r['elements']} | {r['bytes']} | {r['regend']['median_us']:.1f} | {r['torch']['median_us']:.1f} | "
              f"{r['ratio']:.2f} |")
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"dtype": args.dtype, "nranks": args.nranks, "rows": rows}, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
