#!/usr/bin/env python3
# SPDX-License-Identifier: Apache-2.0
"""regen demo: a GEMM and an attention forward through regend, checked
against float64, then a restart and what it means for a client's ids.

    python3 client/python/demo.py [--socket PATH] [--device N]

Host backend: memfds shared with SCM_RIGHTS, f32, references in pure
Python.  CUDA backend (when Status says "cuda" and torch imports): torch
CUDA tensors shared by CUDA IPC, the attention in bf16 (cuDNN's fused
attention takes bf16 and f16), references in torch float64.  Exit 0 only if
every check passed.
"""

import argparse
import math
import os
import random
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import regen  # noqa: E402
from regen import reference  # noqa: E402
from regen.host import HostTensor  # noqa: E402

# GEMM M×N×K (A is M×K, B is K×N) and attention B, H, S, D.
M, N, K = 64, 48, 32
B, H, S, D = 1, 2, 16, 8
TOL = {"f32": 1e-5, "bf16": 2e-2, "f16": 1e-2}

failures = []


def check(what, rel, maxe, tol, extra=""):
    ok = rel <= tol and math.isfinite(rel)
    print(f"  {what:<38} {'ok  ' if ok else 'FAIL'}  rel {rel:.2e}  max {maxe:.2e}  (tol {tol:.0e}){extra}")
    if not ok:
        failures.append(what)
    return ok


def expect(what, cond, detail=""):
    print(f"  {what:<38} {'ok  ' if cond else 'FAIL'}  {detail}")
    if not cond:
        failures.append(what)
    return cond


def print_status(st):
    print(f"status: epoch {st['epoch']}, {len(st['devices'])} device(s)")
    for d in st["devices"]:
        print(f"  dev {d['index']}  gen {d['generation']}  {d['state']:<8} {d['backend']:<5} "
              f"worker {d['worker_pid']} {d['worker_socket']}  respawns {d['respawns']}  "
              f"mem {d['memory_used']} B  ({d['reason']})")


# -- host backend ------------------------------------------------------------

class HostCase:
    def __init__(self, client, device, rng):
        self.c, self.dev = client, device
        self.a = HostTensor.random([M, K], rng=rng, name="demo-a")
        self.b = HostTensor.random([K, N], rng=rng, name="demo-b")
        self.d = HostTensor([M, N], name="demo-d")
        self.q = HostTensor.random([B, H, S, D], rng=rng, name="demo-q")
        self.k = HostTensor.random([B, H, S, D], rng=rng, name="demo-k")
        self.v = HostTensor.random([B, H, S, D], rng=rng, name="demo-v")
        self.o = HostTensor([B, H, S, D], name="demo-o")
        self.stats = HostTensor([B, H, S], name="demo-stats")
        self.gemm_ref = reference.gemm(self.a.read(), self.b.read(), M, N, K)
        self.attn_ref, self.lse_ref = reference.attention(self.q.read(), self.k.read(), self.v.read(),
                                                          B, H, S, S, D, D)

    def tensors(self):
        return (self.a, self.b, self.d, self.q, self.k, self.v, self.o, self.stats)

    def import_all(self):
        for t in self.tensors():
            t.import_into(self.c, self.dev)

    def gemm(self, label):
        self.d.write([0.0] * (M * N))
        us = self.c.gemm(self.a.op, self.b.op, self.d.op)
        out = self.d.read()
        return check(f"{label} {M}x{N}x{K} f32", reference.rel_error(out, self.gemm_ref),
                     reference.max_error(out, self.gemm_ref), TOL["f32"], f"  regend {us} us")

    def attention(self):
        us = self.c.attention(self.q.op, self.k.op, self.v.op, self.o.op, stats=self.stats.op)
        out = self.o.read()
        check(f"attention B{B} H{H} S{S} D{D} f32", reference.rel_error(out, self.attn_ref),
              reference.max_error(out, self.attn_ref), TOL["f32"], f"  regend {us} us")
        lse = self.stats.read()
        check("attention stats (log-sum-exp)", reference.rel_error(lse, self.lse_ref),
              reference.max_error(lse, self.lse_ref), TOL["f32"])

    def old_operand(self):
        return self.a.op, self.b.op, self.d.op


# -- CUDA backend --------------------------------------------------------------

class CudaCase:
    def __init__(self, client, device, torch):
        self.c, self.dev, self.torch = client, device, torch
        g = torch.Generator(device=f"cuda:{device}").manual_seed(int.from_bytes(os.urandom(4), "little"))
        dev = f"cuda:{device}"
        self.a = torch.rand(M, K, device=dev, generator=g) * 2 - 1
        self.b = torch.rand(K, N, device=dev, generator=g) * 2 - 1
        self.d = torch.zeros(M, N, device=dev)
        shape = (B, H, S, D)
        # cuDNN's fused attention takes half types: bf16 in, bf16 out, f32 stats.
        self.q, self.k, self.v = ((torch.rand(shape, device=dev, generator=g) * 2 - 1).to(torch.bfloat16)
                                  for _ in range(3))
        self.o = torch.zeros(shape, device=dev, dtype=torch.bfloat16)
        self.stats = torch.zeros(B, H, S, device=dev)
        self.gemm_ref = self.a.double() @ self.b.double()
        q, k, v = self.q.double(), self.k.double(), self.v.double()
        s = (q @ k.transpose(-1, -2)) / math.sqrt(D)
        self.lse_ref = torch.logsumexp(s, dim=-1)
        self.attn_ref = torch.softmax(s, dim=-1) @ v
        self.buffers = []

    def import_all(self):
        self.buffers = [self.c.import_tensor(t) for t in (self.a, self.b, self.d, self.q, self.k, self.v,
                                                          self.o, self.stats)]

    @staticmethod
    def _err(out, ref):
        out = out.double()
        rel = ((out - ref).norm() / ref.norm()).item()
        maxe = ((out - ref).abs().max() / ref.abs().max()).item()
        return rel, maxe

    def gemm(self, label):
        self.d.zero_()
        us = self.c.gemm(self.a, self.b, self.d)
        rel, maxe = self._err(self.d, self.gemm_ref)
        return check(f"{label} {M}x{N}x{K} f32", rel, maxe, TOL["f32"], f"  regend {us} us")

    def attention(self):
        try:
            us = self.c.attention(self.q, self.k, self.v, self.o, stats=self.stats)
        except regen.Error as e:
            expect(f"attention B{B} H{H} S{S} D{D} bf16", False, f"{type(e).__name__}: {e}")
            return
        rel, maxe = self._err(self.o, self.attn_ref)
        check(f"attention B{B} H{H} S{S} D{D} bf16", rel, maxe, TOL["bf16"], f"  regend {us} us")
        rel, maxe = self._err(self.stats, self.lse_ref)
        check("attention stats (log-sum-exp)", rel, maxe, TOL["bf16"])

    def old_operand(self):
        a, b, d = self.buffers[0], self.buffers[1], self.buffers[2]
        return (regen.Operand(a, 0, "f32", [M, K]), regen.Operand(b, 0, "f32", [K, N]),
                regen.Operand(d, 0, "f32", [M, N]))


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--socket", help="regend's socket (default $REGEN_SOCKET or /run/regen/regend.sock)")
    ap.add_argument("--device", type=int, default=0)
    ap.add_argument("--seed", type=int, help="seed for the host backend's data (default: fresh)")
    args = ap.parse_args()

    client = regen.Client(args.socket, timeout=60)
    print(f"regen demo: {client.socket_path}")
    try:
        st = client.status()
    except regen.Unavailable as e:
        print(f"cannot reach regend: {e}")
        return 1
    print_status(st)
    info = next((d for d in st["devices"] if d["index"] == args.device), None)
    if info is None:
        print(f"no device {args.device}")
        return 1

    backend = info["backend"]
    case = None
    if backend == "cuda":
        try:
            import torch
            if not torch.cuda.is_available():
                raise ImportError("torch.cuda.is_available() is False")
        except ImportError as e:
            print(f"backend cuda but torch with CUDA is not usable here ({e}): nothing to demo")
            return 1
        case = CudaCase(client, args.device, torch)
        print(f"\nbackend cuda, device {args.device}: torch {torch.__version__} tensors shared by CUDA IPC")
    else:
        seed = args.seed if args.seed is not None else int.from_bytes(os.urandom(4), "little")
        case = HostCase(client, args.device, random.Random(seed))
        print(f"\nbackend {backend}, device {args.device}: memfds passed by SCM_RIGHTS (seed {seed})")

    case.import_all()
    case.gemm("gemm")
    case.attention()

    # Restart, watched on a second connection as a scheduler would.
    gen0 = info["generation"]
    print(f"\nrestart(device={args.device}, reason=\"demo\") at generation {gen0}")
    watch = client.watch(timeout=10)
    first = watch.next(timeout=10)
    t0 = time.monotonic()
    rs = client.restart(args.device, reason="demo")
    wall_ms = (time.monotonic() - t0) * 1e3
    gen1 = next(d for d in rs["devices"] if d["index"] == args.device)["generation"]
    expect("restart returned", gen1 > gen0,
           f"generation {gen0} -> {gen1}, regend {rs['elapsed_us']} us, call {wall_ms:.1f} ms")
    seen = None
    try:
        while seen is None:
            ev = watch.next(timeout=10)
            if ev["device"] == args.device and ev["generation"] >= gen1:
                seen = ev
    except TimeoutError:
        pass
    watch.close()
    expect("watch saw the new generation", seen is not None,
           f"{first['reason']}, then: dev {seen['device']} gen {seen['generation']} "
           f"{seen['state']} ({seen['reason']})" if seen else "no event within 10 s")
    now = client.generation()
    gen_now = next(d for d in now["devices"] if d["index"] == args.device)["generation"]
    expect("Generation reads it back", gen_now == gen1, f"epoch {now['epoch']}, device {args.device} gen {gen_now}")

    a, b, d = case.old_operand()
    try:
        client.gemm(a, b, d)
        expect("old buffer refused", False, f"GEMM on {a.buffer} succeeded after the restart")
    except regen.StaleGeneration as e:
        expect("old buffer refused", e.generation == gen1,
               f"StaleGeneration (generation {e.generation}): {e.message}")
    except regen.Error as e:
        expect("old buffer refused", False, f"expected StaleGeneration, got {type(e).__name__}: {e}")

    case.import_all()
    case.gemm("re-import, gemm again")

    print()
    if failures:
        print(f"FAIL: {len(failures)} check(s) failed: {', '.join(failures)}")
        return 1
    print("PASS: every check passed")
    return 0


if __name__ == "__main__":
    try:
        sys.exit(main())
    except regen.Error as e:
        print(f"FAIL: {type(e).__name__}: {e}")
        sys.exit(1)
