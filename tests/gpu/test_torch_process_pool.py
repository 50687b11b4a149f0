#!/usr/bin/env python3
# SPDX-License-Identifier: Apache-2.0
"""regen.torch's whole-process pool on a GPU (issue 13, item 2: "or for the
whole process"): every CUDA allocation of the process from libregen's pool
(regen.torch.use_pool_for_process(), REGEN_TORCH_POOL=process).  Each
scenario runs in a fresh Python (torch swaps its allocator only before its
first CUDA allocation); each check prints PASS/FAIL; the last line is "N
passed, N failed".

  process    REGEN_TORCH_POOL=process at import: every tensor is pool
             memory (inputs, outputs, autograd's gradients made on its
             backward thread, a side stream's); matmul and linear through
             regend match torch in float32, with no block import at all
  streams    memory freed on one stream while a kernel queued there (behind
             a ~100 ms spin) still reads it is not handed to another stream:
             the kernel reads what was there, and the other stream's tensor
             lives elsewhere
  flat       2,000 steps allocating fresh activations: the pool's chunks and
             imports bounded, regend's memory flat; a freed 300 MiB tensor's
             chunk stays cached until regen.torch.empty_cache() gives it
             back
  late       use_pool_for_process() after torch's first CUDA allocation:
             PoolTooLate, nothing changed, the scoped pool and the operations
             still work; REGEN_TORCH_POOL=process after CUDA was initialised:
             PoolTooLate at import; REGEN_TORCH_POOL=bogus: ValueError

    python3 tests/gpu/test_torch_process_pool.py [REGEND] [--steps N]

Exit 0 pass, 1 fail, 77 skipped (no torch, no CUDA, no regend).
"""

import json
import os
import subprocess
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(os.path.dirname(HERE))
sys.path.insert(0, os.path.join(REPO, "tests", "lib"))
from regend_fixture import Regend, gpu_script_args, libregen_for, record, record_width, require_torch, \
    summary  # noqa: E402

require_torch()

# What every child starts with: its checks go to stdout as one JSON line
# each, {"check", "ok", "detail"}.
PRELUDE = r"""
import json, os, sys, traceback
sys.path.insert(0, %(pkg)r)
def record(name, ok, detail=""):
    print("CHECK " + json.dumps({"check": name, "ok": bool(ok), "detail": str(detail)}), flush=True)
def rel(a, b):
    a, b = a.double(), b.double()
    return ((a - b).norm() / max(b.norm().item(), 1e-30)).item()
"""

PROCESS = r"""
import torch
import regen, regen.torch as rt
record("REGEN_TORCH_POOL=process: the pool is the process allocator", rt.process_pool_enabled())
rt.configure(socket=%(sock)r)
rtm = rt.runtime()
pool = rtm.pool
dev = "cuda:0"
x = torch.randn(4, 256, 512, device=dev, dtype=torch.bfloat16, requires_grad=True)
w = (torch.randn(1024, 512, device=dev, dtype=torch.bfloat16) / 16).requires_grad_()
b = torch.randn(1024, device=dev, dtype=torch.bfloat16, requires_grad=True)
y = rt.linear(x, w, b, activation="gelu")
ref = torch.nn.functional.gelu(torch.nn.functional.linear(x.float(), w.float(), b.float()), approximate="tanh")
g = torch.randn_like(y)
y.backward(g)
want = torch.autograd.grad(ref, (x, w, b), g.float())
e = max([rel(y, ref)] + [rel(p.grad, q) for p, q in zip((x, w, b), want)])
record("linear bf16 fwd+bwd through regend, every tensor from the pool", e < 2e-2, "rel %%.2e" %% e)
a2 = torch.randn(512, 768, device=dev, dtype=torch.float16)
b2 = torch.randn(768, 384, device=dev, dtype=torch.float16)
e = rel(rt.matmul(a2, b2), a2.float() @ b2.float())
record("matmul f16 through regend", e < 5e-3, "rel %%.2e" %% e)
side = torch.cuda.Stream()
with torch.cuda.stream(side):
    s = torch.randn(1024, device=dev)
side.synchronize()
tensors = {"input": x, "weight": w, "output": y, "grad (backward thread)": w.grad, "grad x": x.grad,
           "side stream": s, "reference (torch op)": ref}
missing = [k for k, t in tensors.items() if pool.lookup(t.data_ptr()) is None]
record("every CUDA tensor is pool memory", not missing, "not: %%s" %% missing if missing else "")
st = rt.stats()
record("no block import: regend maps pool chunks only", st["block_imports"] == 0 and st["block_imports_live"] == 0,
       "block imports %%d, pool %%s" %% (st["block_imports"], st["pool"]))
record("stats say the pool is the process allocator", st["pool"].get("process") is True)
with rt.pool() as mp:
    inside = torch.ones(16, device=dev)
record("pool() changes nothing (yields None)", mp is None and pool.lookup(inside.data_ptr()) is not None)
try:
    torch.cuda.memory_allocated(0)
    print("note: torch.cuda.memory_allocated works under the pluggable allocator")
except Exception as e:
    print("note: torch.cuda.memory_allocated: %%s: %%s" %% (type(e).__name__, str(e)[:160]))
"""

STREAMS = r"""
import torch
import regen.torch as rt
record("use_pool_for_process() before any CUDA work", (rt.use_pool_for_process(), rt.process_pool_enabled())[1])
dev = "cuda:0"
n = 1 << 22
main = torch.cuda.current_stream()
other = torch.cuda.Stream()
bad = 0
for trial in range(5):
    x = torch.full((n,), 1.0, device=dev)
    torch.cuda._sleep(int(0.1 * 1.5e9))     # ~100 ms of GPU time on main before y reads x
    y = x * 2
    where = x.data_ptr()
    del x                                      # freed on main, still to be read there
    with torch.cuda.stream(other):
        z = torch.full((n,), 7.0, device=dev)  # runs at once on the other stream
    torch.cuda.synchronize()
    if z.data_ptr() == where or not bool((y == 2).all()):
        bad += 1
    del y, z
record("a free is not handed to another stream while its stream still reads it", bad == 0,
       "%%d of 5 trials went wrong" %% bad)
x = torch.full((n,), 1.0, device=dev)
where = x.data_ptr()
del x
again = torch.empty((n,), device=dev)
print("note: the same stream took the freed memory again: %%s" %% (again.data_ptr() == where))
"""

FLAT = r"""
import torch
import regen, regen.torch as rt
record("REGEN_TORCH_POOL=process", rt.process_pool_enabled())
rt.configure(socket=%(sock)r)
rtm = rt.runtime()
admin = regen.Client(%(sock)r)
idx = rtm.regend_device(torch.device("cuda", 0))
w = torch.randn(1024, 1024, device="cuda", dtype=torch.bfloat16) / 32
marks = {}
steps = %(steps)d
for step in range(steps):
    x = torch.randn(512, 1024, device="cuda", dtype=torch.bfloat16)
    y = rt.linear(rt.matmul(x, w), w, activation="gelu")
    if step %% 500 == 0:
        y.sum().item()
    if step in (steps // 10, steps - 1):
        torch.cuda.synchronize()
        p = rt.stats()["pool"]
        marks[step] = (p["chunks"], p["chunk_bytes"], p["imports"], admin.device_info(idx)["memory_used"])
(c0, b0, i0, g0), (c1, b1, i1, g1) = marks[steps // 10], marks[steps - 1]
record("flat over %%d steps (every allocation from the pool)" %% steps,
       c1 <= c0 + 1 and b1 <= b0 + (256 << 20) and i1 <= i0 + 1 and g1 <= g0 + (64 << 20),
       "chunks %%d->%%d (%%d->%%d MiB), imports %%d->%%d, regend %%d->%%d MiB" %%
       (c0, c1, b0 >> 20, b1 >> 20, i0, i1, g0 >> 20, g1 >> 20))
record("no block import", rt.stats()["block_imports"] == 0)
del x, y
big = torch.empty(300 << 20, dtype=torch.uint8, device="cuda")   # a chunk of its own
big.fill_(1)
del big
torch.cuda.synchronize()
before = rt.stats()["pool"]
rt.empty_cache()
after = rt.stats()["pool"]
record("the freed 300 MiB stay cached until regen.torch.empty_cache() gives them back",
       before["chunk_bytes"] - after["chunk_bytes"] >= (300 << 20) and after["chunks"] < before["chunks"],
       "chunks %%d -> %%d, %%d -> %%d MiB held for %%d MiB used" %% (before["chunks"], after["chunks"],
       before["chunk_bytes"] >> 20, after["chunk_bytes"] >> 20, after["used_bytes"] >> 20))
e = rel(rt.matmul(w, w), w.float() @ w.float())
record("operations after the trim", e < 2e-2, "rel %%.2e" %% e)
admin.close()
"""

LATE = r"""
import torch
import regen, regen.torch as rt
t = torch.zeros(8, device="cuda")
try:
    rt.use_pool_for_process()
    record("use_pool_for_process() after CUDA work: PoolTooLate", False, "no error")
except rt.PoolTooLate as e:
    record("use_pool_for_process() after CUDA work: PoolTooLate", e.name == "io.regen.torch.PoolTooLate", e)
record("nothing changed: not the process allocator", not rt.process_pool_enabled())
rt.configure(socket=%(sock)r)
rtm = rt.runtime()
with rt.pool() as mp:
    a = torch.randn(256, 256, device="cuda", dtype=torch.bfloat16)
b = torch.randn(256, 256, device="cuda", dtype=torch.bfloat16)
record("the scoped pool still works", mp is not None and rtm.pool.lookup(a.data_ptr()) is not None and
       rtm.pool.lookup(b.data_ptr()) is None)
e = rel(rt.matmul(a, b), a.float() @ b.float())
record("operations still work (pool and caching allocator)", e < 2e-2, "rel %%.2e" %% e)
"""

LATE_ENV = r"""
import torch
torch.zeros(8, device="cuda")
try:
    import regen.torch as rt
    record("REGEN_TORCH_POOL=process after CUDA was initialised: PoolTooLate at import", False, "imported")
except Exception as e:
    record("REGEN_TORCH_POOL=process after CUDA was initialised: PoolTooLate at import",
           type(e).__name__ == "PoolTooLate", "%%s: %%s" %% (type(e).__name__, e))
"""

BOGUS_ENV = r"""
try:
    import regen.torch
    record("REGEN_TORCH_POOL=bogus: ValueError at import", False, "imported")
except ValueError as e:
    record("REGEN_TORCH_POOL=bogus: ValueError at import", "REGEN_TORCH_POOL" in str(e), e)
"""

# A line is "PASS  <child, 8 columns> <check, 72 columns> <detail>".
record_width(8 + 1 + 72)


def child(name, body, env, params):
    code = (PRELUDE + body) % dict(params, pkg=os.path.join(REPO, "client", "python"))
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=900,
                       env=dict(os.environ, **env))
    got = 0
    for line in r.stdout.splitlines():
        if line.startswith("CHECK "):
            c = json.loads(line[len("CHECK "):])
            record(f"{name:<8} {c['check']}", c["ok"], c["detail"])
            got += 1
        elif line.startswith("note:"):
            print(f"      {name:<8} {line}", flush=True)
    if r.returncode != 0 or got == 0:
        record(f"{name:<8} the child ran to its end", False,
               f"exit {r.returncode}\n{r.stdout[-2000:]}\n{r.stderr[-4000:]}")


def main():
    regend, steps = gpu_script_args(2000)
    base = {"REGEN_LIBREGEN": libregen_for(regend)}
    with Regend(regend, devices=1, backend="cuda", ready_timeout=120) as d:
        params = {"sock": d.socket, "steps": steps}
        process = dict(base, REGEN_TORCH_POOL="process")
        child("process", PROCESS, process, params)
        child("streams", STREAMS, base, params)
        child("flat", FLAT, process, params)
        child("late", LATE, base, params)
        child("late", LATE_ENV, process, params)
        child("late", BOGUS_ENV, dict(base, REGEN_TORCH_POOL="bogus"), params)
    return summary()


if __name__ == "__main__":
    sys.exit(main())
