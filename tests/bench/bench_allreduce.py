#!/usr/bin/env python3
# SPDX-License-Identifier: Apache-2.0
"""AllReduce through regend (io.regen.Comm, NCCL in regend's workers)
against torch.distributed's NCCL on the same GPUs, in the same run, on the
same tensors; bandwidth reported as nccl-tests reports it. Two ways
through regend: the client's call (io.regen.Comm.AllReduce on imported
tensors), and torch.distributed.all_reduce on a group of the "regen"
backend (regen.torch's ProcessGroupRegen: what DDP and FSDP call).

    python3 tests/bench/bench_allreduce.py [--regend PATH] [--nranks N] [--dtype bf16]
        [--sizes 1024,65536,...|issue36] [--iters 50] [--warmup 5] [--json OUT]

--sizes issue36 is issue 36's range: 64 MiB, 128 MiB, 256 MiB, 512 MiB and
1 GiB messages; its target is regend's busbw at least 0.95 of torch's
NCCL on 2, 4 and 8 GPUs, which the table's last column says per size.

N ranks are N processes (this script again, with --rank R), rank R on GPU
R; regend serves every GPU of the machine, and rank R's communicator lives
in the worker of regend's device R. Rank 0 asks regend for the unique id
and hands it to the others through a file store (tests/lib/ranks.py);
torch.distributed joins through a file:// store in the same directory.
N = 1 (the default) is NCCL's single-rank path: a device copy plus the
call's cost. An N above the number of GPUs is refused (exit 2).

For each size every rank first checks both results (rank r's input is
r + 1 everywhere, so the sum is N(N+1)/2, exact in every dtype for N <= 22),
then times `iters` calls of each, in place: regend's call returns once the
work finished; torch's all_reduce is followed by a synchronize. The time of
a size is the slowest rank's median. algbw = bytes / time and busbw =
algbw * 2(N-1)/N, nccl-tests' factor for AllReduce (on a ring each rank
sends and receives 2(N-1)/N of the buffer), so busbw compares with the
links' bandwidth and is 0 for one rank. Prints a table and the ratio
regend / torch per size (below 1: regend faster).

Exit 0; 1 a wrong result or a rank failed; 2 usage (too few GPUs); 77 no
torch, no CUDA, or a regend without NCCL."""

import argparse
import json
import os
import shutil
import sys
import tempfile
import time
import traceback

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
from _harness import Regend, find_regend, regen, require_torch, summary  # noqa: E402
import ranks  # noqa: E402  (tests/lib, on the path through _harness)

torch = require_torch()
import torch.distributed as dist  # noqa: E402

DT = {"f32": torch.float32, "f16": torch.float16, "bf16": torch.bfloat16}


def time_calls(fn, iters, warmup):
    for _ in range(warmup):
        fn()
    samples = []
    for _ in range(iters):
        t0 = time.perf_counter()
        fn()
        samples.append(time.perf_counter() - t0)
    return summary(samples)


def init_torch(rank, nranks, store_dir, dev):
    kw = {"init_method": "file://" + os.path.join(store_dir, "torch-store"), "rank": rank, "world_size": nranks}
    try:
        dist.init_process_group("nccl", device_id=torch.device("cuda", dev), **kw)
    except TypeError:   # a torch before device_id (2.3)
        dist.init_process_group("nccl", **kw)


def run_rank(args):
    """One rank: emits {"rank", "rows"} or {"rank", "error"}."""
    rank, n, dev = args.rank, args.nranks, args.rank
    try:
        torch.cuda.set_device(dev)
        store = ranks.FileStore(args.store)
        c = regen.Client(args.socket, timeout=600)
        if rank == 0:
            store.set("unique_id", c.comm_unique_id(dev))
        comm = c.comm_init(store.get("unique_id", 120), rank, n, device=dev, deadline_ms=300000)
        init_torch(rank, n, args.store, dev)
        os.environ["REGEN_SOCKET"] = args.socket
        import regen.torch  # noqa: F401 - registers the "regen" backend
        regen_group = dist.new_group(backend="regen")
        want = n * (n + 1) / 2
        rows = []
        for count in args.sizes:
            x = torch.full((count,), float(rank + 1), device=f"cuda:{dev}", dtype=DT[args.dtype])
            y = torch.full_like(x, float("nan"))
            t = x.clone()
            torch.cuda.synchronize()
            bx, by = c.import_tensor(x, device=dev), c.import_tensor(y, device=dev)
            ox = regen.Operand(bx, 0, args.dtype, [count])
            oy = regen.Operand(by, 0, args.dtype, [count])
            p = x.clone()
            c.comm_all_reduce(comm, ox, oy)
            dist.all_reduce(t, op=dist.ReduceOp.SUM)
            dist.all_reduce(p, op=dist.ReduceOp.SUM, group=regen_group)
            torch.cuda.synchronize()
            right = {"regend": bool((y == want).all()), "torch": bool((t == want).all()),
                     "regen_group": bool((p == want).all())}

            def via_torch():
                dist.all_reduce(t, op=dist.ReduceOp.SUM)
                torch.cuda.synchronize()

            def via_group():
                dist.all_reduce(p, op=dist.ReduceOp.SUM, group=regen_group)
                torch.cuda.synchronize()

            # In place on both sides: the values grow alike (N times per
            # call); the time does not depend on them.
            r = time_calls(lambda: c.comm_all_reduce(comm, oy, oy), args.iters, args.warmup)
            tt = time_calls(via_torch, args.iters, args.warmup)
            tg = time_calls(via_group, args.iters, args.warmup)
            rows.append({"elements": count, "bytes": count * x.element_size(), "regend": r, "torch": tt,
                         "regen_group": tg, "right": right})
            del p
            c.close_buffer(bx)
            c.close_buffer(by)
        dist.destroy_process_group()
        c.comm_destroy(comm)
        c.close()
        ranks.emit({"rank": rank, "rows": rows})
        return 0
    except Exception:  # noqa: BLE001 - reported to the launcher
        ranks.emit({"rank": rank, "error": traceback.format_exc()[-2000:]})
        return 1


def gbps(nbytes, us):
    return nbytes / (us * 1e-6) / 1e9 if us > 0 else 0.0


def combine(outs, n):
    """Per size: the slowest rank's median, both results right everywhere,
    algbw and busbw."""
    per_rank = [next(line for line in lines if "rows" in line)["rows"] for _, lines in outs]
    factor = 2 * (n - 1) / n
    rows = []
    for i, first in enumerate(per_rank[0]):
        mine = [pr[i] for pr in per_rank]
        row = {"elements": first["elements"], "bytes": first["bytes"],
               "right": all(all(m["right"].values()) for m in mine),
               "wrong": [{"rank": r, **m["right"]} for r, m in enumerate(mine) if not all(m["right"].values())]}
        for side in ("regend", "torch", "regen_group"):
            us = max(m[side]["median_us"] for m in mine)
            row[side] = {"us": us, "algbw_gbps": gbps(first["bytes"], us),
                         "busbw_gbps": gbps(first["bytes"], us) * factor}
        row["ratio"] = row["regend"]["us"] / row["torch"]["us"]
        # busbw of each way through regend over torch's NCCL (issue 36's
        # target: at least 0.95 from 64 MiB up).
        row["busbw_vs_torch"] = row["torch"]["us"] / row["regend"]["us"]
        row["group_busbw_vs_torch"] = row["torch"]["us"] / row["regen_group"]["us"]
        rows.append(row)
    return rows


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--regend")
    ap.add_argument("--nranks", type=int, default=1)
    ap.add_argument("--dtype", default="bf16", choices=sorted(DT))
    ap.add_argument("--sizes", default="1024,65536,1048576,16777216,67108864",
                    help="elements per message, or issue36 (64 MiB to 1 GiB messages of --dtype)")
    ap.add_argument("--iters", type=int, default=50)
    ap.add_argument("--warmup", type=int, default=5)
    ap.add_argument("--timeout", type=float, default=1800, help="seconds for every rank to finish")
    ap.add_argument("--json")
    # A rank of the launcher's (not for a person to give).
    ap.add_argument("--rank", type=int)
    ap.add_argument("--socket")
    ap.add_argument("--store")
    args = ap.parse_args()
    if args.sizes == "issue36":
        width = torch.empty((), dtype=DT[args.dtype]).element_size()
        args.sizes = [(mib << 20) // width for mib in (64, 128, 256, 512, 1024)]
    else:
        args.sizes = [int(x) for x in str(args.sizes).split(",")]
    if args.rank is not None:
        return run_rank(args)
    gpus = ranks.gpu_count()
    if gpus == 0:
        print("no CUDA GPU: skipping", file=sys.stderr)
        return 77
    if args.nranks < 1:
        print("--nranks must be at least 1", file=sys.stderr)
        return 2
    if not ranks.enough_gpus(args.nranks, "bench_allreduce"):
        return 2
    n = args.nranks
    daemon = Regend(find_regend(args.regend), devices=gpus, backend="cuda", ready_timeout=120)
    store_dir = tempfile.mkdtemp(prefix="regen-allreduce-")
    try:
        c = regen.Client(daemon.socket, timeout=120)
        try:
            c.comm_unique_id(0)
        except regen.MethodNotImplemented:
            print("regend's CUDA backend was built without NCCL: skipping", file=sys.stderr)
            return 77
        c.close()
        passed = ["--socket", daemon.socket, "--store", store_dir, "--dtype", args.dtype,
                  "--sizes", ",".join(map(str, args.sizes)), "--iters", str(args.iters), "--warmup", str(args.warmup)]
        outs = ranks.collect(ranks.spawn(__file__, n, passed, env={"NCCL_DEBUG": os.environ.get("NCCL_DEBUG", "WARN")}),
                             args.timeout)
    finally:
        daemon.stop()
        shutil.rmtree(store_dir, ignore_errors=True)
    bad = False
    for r, (code, lines) in enumerate(outs):
        if code != 0 or not any("rows" in line for line in lines):
            bad = True
            errors = [line["error"] for line in lines if "error" in line]
            print(f"rank {r} exited {code}: {errors[0] if errors else 'no result'}", file=sys.stderr)
    if bad:
        return 1
    rows = combine(outs, n)
    print(f"AllReduce sum {args.dtype}, nranks {n} (of {gpus} GPUs), in place; the slowest rank's median of "
          f"{args.iters} calls; GB/s as nccl-tests (busbw = algbw * 2(n-1)/n); 'call' is io.regen.Comm.AllReduce "
          f"from the client, 'group' dist.all_reduce on a \"regen\" group, 'torch' torch's NCCL group")
    print("| elements | bytes | call us | call busbw | group us | group busbw | torch us | torch busbw | "
          "call / torch busbw | group / torch busbw | right |")
    print("| ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | :---: |")
    for r in rows:
        g, p, t = r["regend"], r["regen_group"], r["torch"]
        print(f"| {r['elements']} | {r['bytes']} | {g['us']:.1f} | {g['busbw_gbps']:.2f} | {p['us']:.1f} | "
              f"{p['busbw_gbps']:.2f} | {t['us']:.1f} | {t['busbw_gbps']:.2f} | {r['busbw_vs_torch']:.3f} | "
              f"{r['group_busbw_vs_torch']:.3f} | {'yes' if r['right'] else 'NO ' + json.dumps(r['wrong'])} |")
    big = [r for r in rows if r["bytes"] >= 64 << 20]
    if big and n > 1:
        worst = min(min(r["busbw_vs_torch"], r["group_busbw_vs_torch"]) for r in big)
        print(f"issue 36's target (busbw >= 0.95 of torch's NCCL from 64 MiB up): worst {worst:.3f}, "
              f"{'met' if worst >= 0.95 else 'NOT met'}")
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"dtype": args.dtype, "nranks": n, "gpus": gpus, "rows": rows,
                       "ranks": [lines for _, lines in outs]}, f, indent=1)
    return 0 if all(r["right"] for r in rows) else 1


if __name__ == "__main__":
    sys.exit(main())
