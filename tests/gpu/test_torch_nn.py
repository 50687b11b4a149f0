#!/usr/bin/env python3
# SPDX-License-Identifier: Apache-2.0
"""regen.torch.nn and torch.autocast on a GPU, against regend with the
CUDA backend.  Each check prints PASS/FAIL; the last line is "N passed, N
failed".

  layers    rt.nn.Linear, LayerNorm and TransformerLayer (both input
            formats) in bf16 on CUDA, inputs from rt.pool() where torch has
            torch.cuda.MemPool: output and every gradient against float64
            of the same parameters, the calls counted
  autocast  torch.autocast("cuda", bfloat16) around float32 layers: the
            output's and the gradients' dtypes what torch's own layers give
            (linear bf16, layer_norm float32 on CUDA), values within
            bfloat16 of float64; a routed F.linear under rt.enable()
  oom       a Linear whose output is larger than the GPU's whole memory:
            torch.cuda.OutOfMemoryError from regend's OutOfMemory, or
            torch's own allocator's first (either is torch's error), and
            the next operation works

    python3 tests/gpu/test_torch_nn.py [REGEND]

Exit 0 pass, 1 fail, 77 skipped (no torch, no CUDA, no regend).
"""

import math
import os
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(os.path.dirname(HERE))
sys.path.insert(0, os.path.join(REPO, "client", "python"))
sys.path.insert(0, os.path.join(REPO, "tests", "lib"))
from regend_fixture import Regend, gpu_script_args, guarded, libregen_for, record, record_width, \
    require_torch, summary  # noqa: E402

torch = require_torch()
F = torch.nn.functional

record_width(58)
rt = None   # regen.torch, once main() configured it


def rel(a, b):
    a, b = a.double(), b.double()
    return ((a - b).norm() / max(b.norm().item(), 1e-30)).item()


def causal_attention(q, k, v):
    s = (q @ k.transpose(-1, -2)) / math.sqrt(q.shape[-1])
    mask = torch.ones(q.shape[2], k.shape[2], dtype=torch.bool, device=q.device).tril()
    return s.masked_fill(~mask, float("-inf")).softmax(-1) @ v


def reference_layer(x, p, heads, eps):
    ln1_w, ln1_b, qkv_w, qkv_b, proj_w, proj_b, ln2_w, ln2_b, up_w, up_b, down_w, down_b = p
    b, s, w = x.shape
    q, k, v = F.linear(F.layer_norm(x, [w], ln1_w, ln1_b, eps), qkv_w, qkv_b) \
        .view(b, s, 3, heads, w // heads).permute(2, 0, 3, 1, 4)
    h = x + F.linear(causal_attention(q, k, v).transpose(1, 2).reshape(b, s, w), proj_w, proj_b)
    return h + F.linear(F.gelu(F.linear(F.layer_norm(h, [w], ln2_w, ln2_b, eps), up_w, up_b), approximate="tanh"),
                        down_w, down_b)


def against_float64(name, layer, x, ref_fn, params, tol):
    st = rt.stats()["calls"]
    y = layer(x)
    calls = rt.stats()["calls"] - st
    p64 = [p.detach().double().requires_grad_() for p in params]
    x64 = x.detach().double().requires_grad_()
    ref = ref_fn(x64, p64)
    g = torch.randn_like(y)
    got = torch.autograd.grad(y, [x] + list(params), g)
    want = torch.autograd.grad(ref, [x64] + p64, g.double())
    e = max([rel(y, ref)] + [rel(a, b) for a, b in zip(got, want)])
    record(name, e < tol and calls >= 1, f"rel {e:.2e}, {calls} calls")


def layers():
    dev, dt = "cuda", torch.bfloat16
    scope = rt.pool() if hasattr(torch.cuda, "MemPool") else None
    if scope is not None:
        scope.__enter__()
    try:
        x = torch.randn(4, 256, 1024, device=dev, dtype=dt, requires_grad=True)
    finally:
        if scope is not None:
            scope.__exit__(None, None, None)
    lin = rt.nn.Linear(1024, 2048, device=dev, dtype=dt)
    against_float64("Linear bf16 fwd+bwd", lin, x, lambda x, p: F.linear(x, *p), list(lin.parameters()), 2e-2)
    ln = rt.nn.LayerNorm(1024, device=dev, dtype=dt)
    with torch.no_grad():
        ln.weight.copy_(torch.randn(1024))
        ln.bias.copy_(torch.randn(1024))
    against_float64("LayerNorm bf16 fwd+bwd", ln, x, lambda x, p: F.layer_norm(x, [1024], *p),
                    list(ln.parameters()), 2e-2)
    for fmt in ("bshd", "sbhd"):
        layer = rt.nn.TransformerLayer(1024, 4096, 16, attn_input_format=fmt, device=dev, params_dtype=dt)
        xs = x if fmt == "bshd" else x.detach().transpose(0, 1).contiguous().requires_grad_()
        params = list(layer.parameters_in_order())

        def ref(x64, p, fmt=fmt):
            y = reference_layer(x64 if fmt == "bshd" else x64.transpose(0, 1), p, 16, 1e-5)
            return y if fmt == "bshd" else y.transpose(0, 1)
        against_float64(f"TransformerLayer {fmt} bf16 fwd+bwd", layer, xs, ref, params, 3e-2)


def autocast():
    dev = "cuda"
    x = torch.randn(512, 1024, device=dev, requires_grad=True)
    for name, ours, theirs in (("Linear", rt.nn.Linear(1024, 512, device=dev), torch.nn.Linear(1024, 512, device=dev)),
                               ("LayerNorm", rt.nn.LayerNorm(1024, device=dev), torch.nn.LayerNorm(1024, device=dev))):
        theirs.load_state_dict(ours.state_dict())
        xa, xb = (x.detach().clone().requires_grad_() for _ in range(2))
        with torch.autocast("cuda", dtype=torch.bfloat16):
            got, want = ours(xa), theirs(xb)
        g = torch.randn(want.shape, device=dev).to(want.dtype)
        gg = torch.autograd.grad(got, [xa] + list(ours.parameters()), g)
        wg = torch.autograd.grad(want, [xb] + list(theirs.parameters()), g)
        same = got.dtype == want.dtype and all(a.dtype == b.dtype for a, b in zip(gg, wg))
        e = max([rel(got, want)] + [rel(a, b) for a, b in zip(gg, wg)])
        record(f"autocast cuda bf16 {name}: dtypes as torch's ({want.dtype})", same and e < 2e-2, f"rel {e:.2e}")
    w = torch.randn(256, 1024, device=dev)
    before = rt.stats()
    with torch.autocast("cuda", dtype=torch.bfloat16), rt.enable():
        y = F.linear(x.detach(), w)
    after = rt.stats()
    routed = after["calls"] > before["calls"] and after["fallbacks"] == before["fallbacks"]
    e = rel(y, x.detach().double() @ w.double().t())
    record("autocast cuda bf16 routed F.linear", routed and y.dtype == torch.bfloat16 and e < 2e-2, f"rel {e:.2e}")


def oom():
    _, total = torch.cuda.mem_get_info()
    # A bf16 output (side x side, 2 bytes each) larger than the whole GPU,
    # not only than what is free (regend's worker may have more free).
    side = math.isqrt(total // 2) + 4096
    assert side * side * 2 > total
    x = torch.randn(side, 64, device="cuda", dtype=torch.bfloat16)
    w = torch.randn(side, 64, device="cuda", dtype=torch.bfloat16)
    try:
        rt.linear(x, w)
        record("a GEMM larger than the GPU raises torch's error", False, "it ran")
    except torch.cuda.OutOfMemoryError as e:
        record("a GEMM larger than the GPU raises torch's error", True, str(e)[:80])
    y = rt.linear(x[:128], w[:128])
    record("the next operation works", rel(y, x[:128].double() @ w[:128].double().t()) < 2e-2)


def main():
    global rt
    regend, _ = gpu_script_args(0)
    os.environ["REGEN_LIBREGEN"] = libregen_for(regend)
    daemon = Regend(regend, devices=1, backend="cuda", ready_timeout=120)
    try:
        import regen.torch as rt_module
        rt = rt_module
        rt.configure(socket=daemon.socket)
        torch.manual_seed(0)
        guarded("layers", layers)
        guarded("autocast", autocast)
        guarded("oom", oom)
    except BaseException:
        daemon.finish(dump=True)
        raise
    else:
        daemon.stop()
    return summary()


if __name__ == "__main__":
    sys.exit(main())
