#!/usr/bin/env python3
# SPDX-License-Identifier: Apache-2.0
"""One communicator of N ranks over N GPUs through regend: N client
processes (this script again, with --rank R), rank R on GPU R and on the
worker of regend's device R; rank 0's unique id handed to the others
through a file store (tests/lib/ranks.py). Checks, on every rank:

- results: AllReduce (sum, max, avg), ReduceScatter (sum, max, avg),
  AllGather and Broadcast (root N-1, in place) on fresh random inputs in
  f32, f16 and bf16, against the float64 reference of every rank's input
  (each rank makes every rank's input from the shared seed);
- a peer's abort (N >= 2): the last rank aborts; every other rank's next
  collective fails by name (CommFailed, or CommTimeout at its deadline),
  not a hang;
- a peer's device fault (N >= 2, regend's InjectFault): the last rank's
  device loses its context (its worker resets, aborting its
  communicators); the other ranks' collective fails by name, their own
  devices stay ready in the same generation; then every rank destroys, a
  new unique id, Init again (the last rank in its device's new
  generation) and an AllReduce is right: a restart then Init, across
  ranks.
With N = 1 only the results (and an abort of the rank's own communicator)
are checked: the harness itself on one GPU.

    python3 tests/gpu/test_nccl_multi.py [path/to/regend] [--nranks N]   (default 2)

Exit 0 pass, 1 fail, 77 skipped (no torch, fewer than N GPUs, or regend
without NCCL).
"""

import argparse
import os
import shutil
import sys
import tempfile
import time
import traceback

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "..", "client", "python"))
sys.path.insert(0, os.path.join(HERE, "..", "lib"))
from regend_fixture import Regend, SKIP, find_regend, record, record_width, require_torch, summary  # noqa: E402
import ranks  # noqa: E402

torch = require_torch()

import regen  # noqa: E402

TOL = {"f32": 1e-5, "f16": 2e-3, "bf16": 1.6e-2}
TORCH_DTYPE = {"f32": torch.float32, "f16": torch.float16, "bf16": torch.bfloat16}
M = 1 << 14          # elements per rank's block
STEP_S = 120         # the longest a rank waits for the others at a step
PEER_DEADLINE_MS = 20000


class Rank:
    def __init__(self, rank, nranks, socket, store, seed):
        self.rank, self.n, self.dev = rank, nranks, rank
        self.seed = seed
        self.store = ranks.FileStore(store)
        torch.cuda.set_device(self.dev)
        self.c = regen.Client(socket, timeout=300)

    def check(self, name, ok, **detail):
        ranks.emit({"check": name, "ok": bool(ok), **detail})

    def barrier(self, name):
        self.store.barrier(name, self.rank, self.n, STEP_S)

    def init(self, key):
        """A communicator of every rank: rank 0's unique id under `key`."""
        if self.rank == 0:
            self.store.set(key, self.c.comm_unique_id(self.dev))
        return self.c.comm_init(self.store.get(key, STEP_S), self.rank, self.n, device=self.dev,
                                deadline_ms=STEP_S * 1000)

    def inputs(self, dtype):
        """Every rank's input (N * M elements each) for dtype, the same on
        every rank."""
        d = list(TOL).index(dtype)
        out = []
        for r in range(self.n):
            g = torch.Generator(device=f"cuda:{self.dev}").manual_seed(self.seed + 7 * r + 1000 * d)
            out.append(torch.randn(self.n * M, device=f"cuda:{self.dev}", generator=g).to(TORCH_DTYPE[dtype]))
        return out

    def results(self, comm):
        n, r = self.n, self.rank
        for dtype in TOL:
            ins = self.inputs(dtype)
            mine = ins[r].clone()
            every = torch.stack([t.double() for t in ins])
            for op, ref in (("sum", every.sum(0)), ("max", every.max(0).values), ("avg", every.mean(0))):
                y = torch.full_like(mine, float("nan"))
                self.c.comm_all_reduce(comm, mine, y, op=op)
                torch.cuda.synchronize()
                err = float((y.double() - ref).norm() / ref.norm())
                self.check(f"all_reduce {op} {dtype}", err <= TOL[dtype], err=err)
                z = torch.full([M], float("nan"), device=f"cuda:{self.dev}", dtype=mine.dtype)
                self.c.comm_reduce_scatter(comm, mine, z, op=op)
                torch.cuda.synchronize()
                block = ref[r * M:(r + 1) * M]
                err = float((z.double() - block).norm() / block.norm())
                self.check(f"reduce_scatter {op} {dtype}", err <= TOL[dtype], err=err)
            g = torch.full([n * n * M], float("nan"), device=f"cuda:{self.dev}", dtype=mine.dtype)
            self.c.comm_all_gather(comm, mine, g)
            b = mine.clone()
            self.c.comm_broadcast(comm, b, b, root=n - 1)
            torch.cuda.synchronize()
            self.check(f"all_gather {dtype}", torch.equal(g, torch.cat(ins)))
            self.check(f"broadcast root {n - 1} {dtype}", torch.equal(b, ins[n - 1]))
            self.check(f"inputs untouched {dtype}", torch.equal(mine, ins[r]))

    def named_failure(self, name, comm, x):
        """A collective whose peer is gone must fail by name, not hang."""
        t0 = time.monotonic()
        try:
            self.c.comm_all_reduce(comm, x, x, deadline_ms=PEER_DEADLINE_MS)
            self.check(name, False, got="it finished")
        except (regen.CommFailed, regen.CommTimeout) as e:
            s = time.monotonic() - t0
            self.check(name, s <= PEER_DEADLINE_MS / 1000 + 5, got=type(e).__name__,
                       reason=e.parameters.get("reason"), s=round(s, 2))

    def device(self):
        return self.c.generation()["devices"][self.dev]

    def peer_abort(self):
        comm = self.init("uid-abort")
        x = torch.ones(M, device=f"cuda:{self.dev}")
        last = self.n - 1
        if self.rank == last:
            self.c.comm_abort(comm)
            self.check("abort", True)
            self.barrier("aborted")
        else:
            self.barrier("aborted")
            self.named_failure("peer aborted: a named error, not a hang", comm, x)
        self.c.comm_destroy(comm, abort=True)

    def peer_fault(self):
        comm = self.init("uid-fault")
        x = torch.ones(M, device=f"cuda:{self.dev}")
        self.c.comm_all_reduce(comm, x, x)
        torch.cuda.synchronize()
        before = self.device()
        last = self.n - 1
        if self.rank == last:
            try:
                self.c.inject_fault(self.dev, "device_lost")
                injected = True
            except regen.Error as e:
                # Not root (NotPermitted), or a build without kernels/.
                injected = False
                self.check("inject a fault on the last rank's device", False, got=type(e).__name__,
                           message=str(e)[:300])
            self.store.set("fault", "1" if injected else "0")
            if injected:
                t0 = time.monotonic()
                while time.monotonic() - t0 < STEP_S:
                    d = self.device()
                    if d["generation"] > before["generation"] and d["state"] == "ready":
                        break
                    time.sleep(0.1)
                d = self.device()
                self.check("the faulted device serves again in a new generation",
                           d["generation"] > before["generation"] and d["state"] == "ready",
                           state=d["state"], generation=d["generation"], was=before["generation"])
        elif self.store.get("fault", STEP_S) == "1":
            self.named_failure("peer's device faulted: a named error, not a hang", comm, x)
            d = self.device()
            self.check("a peer's fault leaves this device alone",
                       d["state"] == "ready" and d["generation"] == before["generation"],
                       state=d["state"], generation=d["generation"], was=before["generation"])
        try:
            self.c.comm_destroy(comm, abort=True)
        except regen.StaleGeneration:
            pass   # the faulted device's: gone with its generation
        self.barrier("destroyed")
        # Every rank again, the last in its device's new generation.
        comm = self.init("uid-again")
        y = torch.ones(M, device=f"cuda:{self.dev}")
        self.c.comm_all_reduce(comm, y, y)
        torch.cuda.synchronize()
        self.check("Init again after a peer's fault, and AllReduce", bool((y == self.n).all()),
                   generation=comm.generation)
        self.c.comm_destroy(comm)

    def run(self):
        t0 = time.perf_counter()
        comm = self.init("uid")
        self.check("init", True, ms=round((time.perf_counter() - t0) * 1e3, 1))
        self.results(comm)
        if self.n == 1:
            x = torch.ones(M, device=f"cuda:{self.dev}")
            self.c.comm_abort(comm)
            try:
                self.c.comm_all_reduce(comm, x, x)
                self.check("a call after Abort fails", False, got="it ran")
            except regen.CommFailed as e:
                self.check("a call after Abort fails", e.parameters.get("reason") == "aborted",
                           reason=e.parameters.get("reason"))
            self.c.comm_destroy(comm, abort=True)
            return
        self.c.comm_destroy(comm)
        self.barrier("results")
        self.peer_abort()
        self.barrier("peer-abort")
        self.peer_fault()


def rank_main(args):
    try:
        Rank(args.rank, args.nranks, args.socket, args.store, args.seed).run()
        return 0
    except Exception:  # noqa: BLE001 - reported to the launcher
        ranks.emit({"check": "rank ran to its end", "ok": False, "error": traceback.format_exc()[-2000:]})
        return 1


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("regend", nargs="?")
    ap.add_argument("--nranks", type=int, default=2)
    ap.add_argument("--timeout", type=float, default=900)
    ap.add_argument("--rank", type=int)
    ap.add_argument("--socket")
    ap.add_argument("--store")
    ap.add_argument("--seed", type=int)
    args = ap.parse_args()
    if args.rank is not None:
        return rank_main(args)
    if args.nranks < 1:
        print("--nranks must be at least 1", file=sys.stderr)
        return 2
    if not ranks.enough_gpus(args.nranks, "test_nccl_multi"):
        return SKIP
    gpus = ranks.gpu_count()
    daemon = Regend(find_regend(args.regend), devices=gpus, backend="cuda", ready_timeout=120)
    store = tempfile.mkdtemp(prefix="regen-nccl-multi-")
    # A line is "PASS  rank N: <check, 52 columns> <detail>".
    record_width(len("rank 0: ") + 52)
    try:
        c = regen.Client(daemon.socket, timeout=120)
        try:
            c.comm_unique_id(0)
        except regen.MethodNotImplemented:
            print("regend's CUDA backend was built without NCCL: skipping")
            return SKIP
        c.close()
        seed = int.from_bytes(os.urandom(4), "little") >> 1
        print(f"{args.nranks} rank(s) on {gpus} GPU(s), seed {seed}", flush=True)
        outs = ranks.collect(ranks.spawn(__file__, args.nranks,
                                         ["--socket", daemon.socket, "--store", store, "--seed", str(seed)],
                                         env={"NCCL_DEBUG": os.environ.get("NCCL_DEBUG", "WARN")}), args.timeout)
        for rank, (code, lines) in enumerate(outs):
            for r in lines:
                record(f"rank {rank}: {r.get('check', '?')}", r.get("ok"),
                       {k: v for k, v in r.items() if k not in ('check', 'ok')})
            if code != 0 or not lines:
                record(f"rank {rank} exited {code}", False)
    finally:
        daemon.stop()
        shutil.rmtree(store, ignore_errors=True)
    return summary()


if __name__ == "__main__":
    sys.exit(main())
