#!/usr/bin/env python3
"""One communicator of 2 ranks over 2 GPUs through regend: two client
processes, rank r on device r (each talking to its own device's worker),
rank 0's unique id handed to rank 1 through a pipe (the job's store).
AllReduce (sum, max, avg), AllGather, ReduceScatter and Broadcast on fresh
random inputs in f32, f16 and bf16, checked against the float64 reference
of both ranks' inputs; then rank 1 aborts and rank 0's next collective must
fail by name (CommFailed, or CommTimeout at its deadline), not hang.

    python3 tests/gpu/test_nccl_multi.py [path/to/regend]

Exit 0 pass, 1 fail, 77 skipped (no torch, fewer than 2 GPUs, or no NCCL).
"""

import json
import os
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "..", "client", "python"))
sys.path.insert(0, os.path.join(HERE, "..", "lib"))
from regend_fixture import Regend, SKIP, find_regend, require_torch  # noqa: E402

torch = require_torch()

import regen  # noqa: E402

TOL = {"f32": 1e-5, "f16": 2e-3, "bf16": 1.6e-2}
TORCH_DTYPE = {"f32": torch.float32, "f16": torch.float16, "bf16": torch.bfloat16}
N = 1 << 16


def rank_main(rank, socket, seed):
    """One rank: prints JSON lines of its checks."""
    dev = rank
    torch.cuda.set_device(dev)
    c = regen.Client(socket, timeout=120)
    if rank == 0:
        uid = c.comm_unique_id(dev)
        print(json.dumps({"uid": uid}), flush=True)
    else:
        uid = json.loads(sys.stdin.readline())["uid"]
    t0 = time.perf_counter()
    comm = c.comm_init(uid, rank, 2, device=dev, deadline_ms=120000)
    print(json.dumps({"check": "init", "ok": True, "ms": (time.perf_counter() - t0) * 1e3}), flush=True)
    out = []
    for dtype in TOL:
        gens = [torch.Generator(device=f"cuda:{dev}").manual_seed(seed + 7 * r + 1000 * list(TOL).index(dtype)) for r in (0, 1)]
        ins = [torch.randn(2 * N, device=f"cuda:{dev}", generator=g).to(TORCH_DTYPE[dtype]) for g in gens]
        mine = ins[rank].clone()
        both = torch.stack([t.double() for t in ins])
        for op, ref in (("sum", both.sum(0)), ("max", both.max(0).values), ("avg", both.mean(0))):
            y = torch.full_like(mine, float("nan"))
            c.comm_all_reduce(comm, mine, y, op=op)
            torch.cuda.synchronize()
            err = float((y.double() - ref).norm() / ref.norm())
            out.append({"check": f"all_reduce {op} {dtype}", "ok": err <= TOL[dtype], "err": err})
            z = torch.full([N], float("nan"), device=f"cuda:{dev}", dtype=mine.dtype)
            c.comm_reduce_scatter(comm, mine, z, op=op)
            torch.cuda.synchronize()
            refb = ref[rank * N:(rank + 1) * N]
            err = float((z.double() - refb).norm() / refb.norm())
            out.append({"check": f"reduce_scatter {op} {dtype}", "ok": err <= TOL[dtype], "err": err})
        g = torch.full([4 * N], float("nan"), device=f"cuda:{dev}", dtype=mine.dtype)
        c.comm_all_gather(comm, mine, g)
        b = mine.clone()
        c.comm_broadcast(comm, b, b, root=1)
        torch.cuda.synchronize()
        out.append({"check": f"all_gather {dtype}", "ok": bool(torch.equal(g, torch.cat(ins)))})
        out.append({"check": f"broadcast {dtype}", "ok": bool(torch.equal(b, ins[1]))})
    for o in out:
        print(json.dumps(o), flush=True)
    # Rank 1 aborts; rank 0 must learn of it by name.
    x = torch.ones(N, device=f"cuda:{dev}")
    if rank == 1:
        c.comm_abort(comm)
        print(json.dumps({"check": "abort", "ok": True}), flush=True)
        time.sleep(2)
    else:
        time.sleep(1)
        t0 = time.monotonic()
        try:
            c.comm_all_reduce(comm, x, x, deadline_ms=20000)
            res = {"check": "peer aborted: a named error, not a hang", "ok": False, "got": "finished"}
        except (regen.CommFailed, regen.CommTimeout) as e:
            res = {"check": "peer aborted: a named error, not a hang", "ok": True, "got": type(e).__name__,
                   "reason": e.parameters.get("reason"), "s": time.monotonic() - t0}
        print(json.dumps(res), flush=True)
    c.comm_destroy(comm, abort=True)
    c.close()


def main():
    if len(sys.argv) > 1 and sys.argv[1] == "--rank":
        rank_main(int(sys.argv[2]), sys.argv[3], int(sys.argv[4]))
        return 0
    if torch.cuda.device_count() < 2:
        print(f"{torch.cuda.device_count()} GPU(s): this test needs 2; skipping")
        return SKIP
    regend = sys.argv[1] if len(sys.argv) > 1 else find_regend()
    daemon = Regend(regend, devices=2, backend="cuda", ready_timeout=120)
    failed = passed = 0
    try:
        c = regen.Client(daemon.socket, timeout=120)
        try:
            c.comm_unique_id(0)
        except regen.MethodNotImplemented:
            print("regend's CUDA backend was built without NCCL: skipping")
            return SKIP
        c.close()
        seed = int.from_bytes(os.urandom(4), "little")
        me = os.path.abspath(__file__)
        p0 = subprocess.Popen([sys.executable, me, "--rank", "0", daemon.socket, str(seed)], stdout=subprocess.PIPE,
                              text=True)
        p1 = subprocess.Popen([sys.executable, me, "--rank", "1", daemon.socket, str(seed)], stdin=subprocess.PIPE,
                              stdout=subprocess.PIPE, text=True)
        first = json.loads(p0.stdout.readline())
        p1.stdin.write(json.dumps(first) + "\n")
        p1.stdin.flush()
        outs = [p.communicate(timeout=200)[0] for p in (p0, p1)]
        for rank, (p, text) in enumerate(zip((p0, p1), outs)):
            lines = [json.loads(line) for line in text.splitlines() if line.startswith("{")]
            for r in lines:
                ok = r.get("ok")
                passed += bool(ok)
                failed += not ok
                print(f"{'PASS' if ok else 'FAIL'}  rank {rank}: {r['check']:<44} "
                      f"{ {k: v for k, v in r.items() if k not in ('check', 'ok')} }")
            if p.returncode != 0 or not lines:
                failed += 1
                print(f"FAIL  rank {rank} exited {p.returncode}")
    finally:
        daemon.stop()
    print(f"{passed} passed, {failed} failed")
    return 1 if failed or not passed else 0


if __name__ == "__main__":
    sys.exit(main())
