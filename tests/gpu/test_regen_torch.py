#!/usr/bin/env python3
# SPDX-License-Identifier: Apache-2.0
"""regen.torch on a GPU, against regend with the CUDA backend (issue 13,
items 2-5).  Each check prints PASS/FAIL; the last line is "N passed, N
failed".

  ops        matmul, linear (bias, fused GELU) and SDPA (grouped-query heads,
             causal, scale) in bf16 and f16, forward and backward, against
             torch's own in float32; transposed views need no copy
  device     torch's device matched to regend's by UUID (Status health.uuid)
  pool       tensors from regen.torch.pool() need no block import; a pool
             chunk is imported once whatever the number of tensors in it
  blocks     tensors from torch's caching allocator: one import per
             cudaMalloc block, never one per tensor
  flat       10,000 steps allocating fresh activations (pool and not):
             live imports bounded, rank memory and regend's memory flat
  ordering   each of "wait", "events", "sync", "auto": regend reads what the rank's
             current stream wrote just before (behind a 50 ms spin), and the
             rank's stream sees what regend wrote
  chained    in each ordering, the MLP's batches (forward 2 calls, backward
             7) chain their later calls on regend's lane with no event, and
             rank work inside a batch (a bias copy, a new ones row) still
             orders the next call: values against torch in float32
  deferred   a batch's chained calls are queued without waiting for their
             answers: an error among them surfaces, named, at the batch's
             end (and the next operation works); a restart in the middle of
             a batch re-runs its queued calls in the new generation (values
             against float32), in orderings "wait" and "events"
  compile    torch.compile(fullgraph=True, backend="aot_eager") traces the
             custom ops (fake implementations) and runs them (torch >= 2.4)
  lifecycle  restart, device_lost and a worker crash between operations:
             the next operation waits for the new generation, re-imports
             (pool chunks, blocks, events) and succeeds; with retry off the
             error is named
  mps        regen.torch.mps_mode() reports, with regend's Status sharing
             (MPS itself is not set up here: tests/gpu/test_mps.py)

    python3 tests/gpu/test_regen_torch.py [REGEND] [--steps N]

regend defaults to $REGEND, then $REGEN_BUILD_ROOT/daemon/regend, then
build/daemon/regend; libregen to $REGEN_LIBREGEN or beside it
(client/libregen.so).  Exit 0 pass, 1 fail, 77 skipped (no torch, no CUDA,
no regend).
"""

import math
import os
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(os.path.dirname(HERE))
sys.path.insert(0, os.path.join(REPO, "client", "python"))
sys.path.insert(0, os.path.join(REPO, "tests", "lib"))
from regend_fixture import Regend, gpu_script_args, guarded, libregen_for, record, record_width, \
    require_torch, summary  # noqa: E402

torch = require_torch()

import regen  # noqa: E402

record_width(58)
DEV = 0
TOL = {torch.bfloat16: 2e-2, torch.float16: 5e-3}


def rel(a, b):
    a, b = a.double(), b.double()
    return ((a - b).norm() / max(b.norm().item(), 1e-30)).item()


def ref_sdpa(q, k, v, causal, scale):
    rep = q.shape[1] // k.shape[1]
    k, v = k.repeat_interleave(rep, 1), v.repeat_interleave(rep, 1)
    s = (q @ k.transpose(-1, -2)) * (scale if scale is not None else 1 / math.sqrt(q.shape[-1]))
    if causal:
        s = s.masked_fill(~torch.ones(q.shape[2], k.shape[2], dtype=torch.bool, device=q.device).tril(),
                          float("-inf"))
    return s.softmax(-1) @ v


def ops(rt):
    dev = f"cuda:{DEV}"
    for dt in (torch.bfloat16, torch.float16):
        tol = TOL[dt]
        a = torch.randn(512, 768, device=dev, dtype=dt, requires_grad=True)
        b = torch.randn(768, 384, device=dev, dtype=dt, requires_grad=True)
        y = rt.matmul(a, b)
        ref = a.float() @ b.float()
        g = torch.randn_like(y)
        ga, gb = torch.autograd.grad(y, (a, b), g)
        ra, rb = torch.autograd.grad(ref, (a, b), g.float())
        e = max(rel(y, ref), rel(ga, ra), rel(gb, rb))
        record(f"matmul {dt} fwd+bwd", e < tol, f"rel {e:.2e}")
        # Transposed views: flags, not copies.
        e = rel(rt.matmul(a.t().t(), b.t().contiguous().t()), ref)
        record(f"matmul {dt} transposed views", e < tol, f"rel {e:.2e}")
        for act in (None, "gelu"):
            x = torch.randn(4, 256, 512, device=dev, dtype=dt, requires_grad=True)
            w = torch.randn(1024, 512, device=dev, dtype=dt, requires_grad=True) / 16
            bias = torch.randn(1024, device=dev, dtype=dt, requires_grad=True)
            y = rt.linear(x, w, bias, activation=act)
            ref = torch.nn.functional.linear(x.float(), w.float(), bias.float())
            if act:
                ref = torch.nn.functional.gelu(ref, approximate="tanh")
            g = torch.randn_like(y)
            got = torch.autograd.grad(y, (x, w, bias), g)
            want = torch.autograd.grad(ref, (x, w, bias), g.float())
            e = max([rel(y, ref)] + [rel(p, q) for p, q in zip(got, want)])
            record(f"linear {dt} bias {act or 'none'} fwd+bwd", e < tol, f"rel {e:.2e}")
        for h, hkv, sq, skv, d, causal, scale in ((16, 16, 1024, 1024, 128, True, None),
                                                  (16, 4, 512, 512, 64, True, None),
                                                  (8, 8, 256, 384, 64, False, 0.1)):
            q = torch.randn(2, h, sq, d, device=dev, dtype=dt, requires_grad=True)
            k = torch.randn(2, hkv, skv, d, device=dev, dtype=dt, requires_grad=True)
            v = torch.randn(2, hkv, skv, d, device=dev, dtype=dt, requires_grad=True)
            o = rt.scaled_dot_product_attention(q, k, v, is_causal=causal, scale=scale, enable_gqa=h != hkv)
            ref = ref_sdpa(q.float(), k.float(), v.float(), causal, scale)
            g = torch.randn_like(o)
            got = torch.autograd.grad(o, (q, k, v), g)
            want = torch.autograd.grad(ref, (q, k, v), g.float())
            e = max([rel(o, ref)] + [rel(p, q_) for p, q_ in zip(got, want)])
            record(f"sdpa {dt} H{h}/{hkv} S{sq}x{skv} D{d} causal={causal}", e < tol, f"rel {e:.2e}")
        # The MLP as one operation: GELU's gradient in a GEMM's epilogue
        # (dgelu), all five gradients in regend.
        F = torch.nn.functional
        x = torch.randn(2, 256, 512, device=dev, dtype=dt, requires_grad=True)
        w1 = (torch.randn(2048, 512, device=dev, dtype=dt) / 16).requires_grad_()
        b1 = torch.randn(2048, device=dev, dtype=dt, requires_grad=True)
        w2 = (torch.randn(512, 2048, device=dev, dtype=dt) / 32).requires_grad_()
        b2 = torch.randn(512, device=dev, dtype=dt, requires_grad=True)
        y = rt.mlp(x, w1, b1, w2, b2)
        ref = F.linear(F.gelu(F.linear(x.float(), w1.float(), b1.float()), approximate="tanh"), w2.float(), b2.float())
        g = torch.randn_like(y)
        got = torch.autograd.grad(y, (x, w1, b1, w2, b2), g)
        want = torch.autograd.grad(ref, (x, w1, b1, w2, b2), g.float())
        e = max([rel(y, ref)] + [rel(p, q_) for p, q_ in zip(got, want)])
        record(f"mlp {dt} fwd+bwd (dgelu epilogue)", e < tol, f"rel {e:.2e}")
        # Attention on a fused projection's output, gradients written
        # interleaved into one [B, S, 3 * H * D] tensor by cuDNN.
        b_, s_, h_, d_ = 2, 512, 8, 64
        qkv = torch.randn(b_, s_, 3 * h_ * d_, device=dev, dtype=dt, requires_grad=True)
        o = rt.attention_packed(qkv, h_, is_causal=True)
        q, k, v = qkv.float().view(b_, s_, 3, h_, d_).permute(2, 0, 3, 1, 4)
        ref = ref_sdpa(q, k, v, True, None).transpose(1, 2).reshape(b_, s_, h_ * d_)
        g = torch.randn_like(o)
        (got,) = torch.autograd.grad(o, (qkv,), g)
        (want,) = torch.autograd.grad(ref, (qkv,), g.float())
        e = max(rel(o, ref), rel(got, want))
        record(f"attention_packed {dt} fwd+bwd (interleaved gradients)", e < tol, f"rel {e:.2e}")
        # A whole pre-LayerNorm block as one operation: LayerNorms in
        # regend, residuals in the GEMMs and LayerNormBackward.
        b_, s_, w_, h_ = 2, 256, 512, 8
        x = torch.randn(b_, s_, w_, device=dev, dtype=dt, requires_grad=True)
        shapes = [[w_], [w_], [3 * w_, w_], [3 * w_], [w_, w_], [w_], [w_], [w_], [4 * w_, w_], [4 * w_],
                  [w_, 4 * w_], [w_]]
        params = [(torch.randn(sh, device=dev, dtype=dt) / (sh[-1] ** 0.5 if len(sh) == 2 else 1))
                  .requires_grad_() for sh in shapes]
        y = rt.transformer_block(x, *params, h_)
        fp = [p.float() for p in params]

        def block_ref(xf):
            q, k, v = F.linear(F.layer_norm(xf, [w_], fp[0], fp[1]), fp[2], fp[3]).view(
                b_, s_, 3, h_, w_ // h_).permute(2, 0, 3, 1, 4)
            a = ref_sdpa(q, k, v, True, None).transpose(1, 2).reshape(b_, s_, w_)
            hh = xf + F.linear(a, fp[4], fp[5])
            return hh + F.linear(F.gelu(F.linear(F.layer_norm(hh, [w_], fp[6], fp[7]), fp[8], fp[9]),
                                        approximate="tanh"), fp[10], fp[11])

        ref = block_ref(x.float())
        g = torch.randn_like(y)
        got = torch.autograd.grad(y, [x] + params, g)
        want = torch.autograd.grad(ref, [x] + params, g.float())
        e = max([rel(y, ref)] + [rel(p, q_) for p, q_ in zip(got, want)])
        record(f"transformer_block {dt} fwd+bwd (LayerNorms in regend)", e < tol, f"rel {e:.2e}")


def device_map(rt, d):
    rtm = rt.runtime()
    idx = rtm.regend_device(torch.device("cuda", DEV))
    info = regen.Client(d.socket).device_info(idx)
    uuid = (info.get("health") or {}).get("uuid")
    from regen import devmatch
    from regen.torch._devices import local_identity
    mine = local_identity(DEV)[0]
    ok = devmatch.normalize_uuid(uuid) is not None and devmatch.normalize_uuid(uuid) == devmatch.normalize_uuid(mine)
    record("device matched by UUID", ok, f"torch {mine} regend {uuid} -> {idx}")


def pool_imports(rt):
    rtm = rt.runtime()
    before = rtm.stats()
    with rt.pool(DEV):
        ts = [torch.randn(256, 256, device=f"cuda:{DEV}", dtype=torch.bfloat16) for _ in range(64)]
        w = torch.randn(256, 256, device=f"cuda:{DEV}", dtype=torch.bfloat16)
        outs = [rt.matmul(t, w) for t in ts]
    after = rtm.stats()
    err = max(rel(o, t.float() @ w.float()) for o, t in zip(outs, ts))
    record("pool: 64 GEMMs right", err < 2e-2, f"rel {err:.2e}")
    record("pool: no block import", after["block_imports"] == before["block_imports"],
           f"{after['block_imports'] - before['block_imports']} block imports")
    pool_new = after["pool"]["import_calls"] - before["pool"]["import_calls"]
    record("pool: chunks imported once each", pool_new <= after["pool"]["chunks"],
           f"{pool_new} imports for {after['pool']['chunks']} chunks, {len(ts) + 1 + len(outs)} tensors")


def block_imports(rt):
    rtm = rt.runtime()
    rt.sweep()
    before = rtm.stats()["block_imports"]
    big = torch.randn(64, 256, 256, device=f"cuda:{DEV}", dtype=torch.bfloat16)   # one cudaMalloc block
    w = torch.randn(256, 256, device=f"cuda:{DEV}", dtype=torch.bfloat16)
    for i in range(64):
        rt.matmul(big[i], w)
    made = rtm.stats()["block_imports"] - before
    record("blocks: 64 tensors in one block, imports per block", made <= 3, f"{made} block imports")


def flat(rt, steps):
    """Fresh activations every step, inside and outside the pool."""
    rtm = rt.runtime()
    admin = regen.Client(rtm.socket)
    idx = rtm.regend_device(torch.device("cuda", DEV))
    w = torch.randn(1024, 1024, device=f"cuda:{DEV}", dtype=torch.bfloat16) / 32
    for where in ("pool", "caching allocator"):
        marks = {}
        for step in range(steps):
            ctx = rt.pool(DEV) if where == "pool" else _null()
            with ctx:
                x = torch.randn(512, 1024, device=f"cuda:{DEV}", dtype=torch.bfloat16)
                y = rt.linear(rt.matmul(x, w), w, activation="gelu")
                y.sum().item() if step % 1000 == 0 else None
            if step in (steps // 10, steps - 1):
                torch.cuda.synchronize()
                marks[step] = (rtm.live_imports(), rtm.stats()["pool"]["imports"], torch.cuda.memory_allocated(DEV),
                               torch.cuda.memory_reserved(DEV), admin.device_info(idx)["memory_used"])
        (i0, p0, a0, r0, g0), (i1, p1, a1, r1, g1) = marks[steps // 10], marks[steps - 1]
        ok = i1 <= max(i0, 1) + 4 and p1 <= p0 + 2 and a1 <= a0 + (16 << 20) and r1 <= r0 + (64 << 20) \
            and g1 <= g0 + (64 << 20)
        record(f"flat over {steps} steps ({where})", ok,
               f"imports {i0}->{i1}, pool imports {p0}->{p1}, rank allocated {a0 >> 20}->{a1 >> 20} MiB, "
               f"reserved {r0 >> 20}->{r1 >> 20} MiB, regend {g0 >> 20}->{g1 >> 20} MiB")
    admin.close()


class _null:
    def __enter__(self):
        return self

    def __exit__(self, *exc):
        return False


def ordering(rt, d):
    for mode in ("wait", "events", "sync", "auto"):
        rt.configure(socket=d.socket, ordering=mode)
        s = torch.cuda.Stream(DEV)
        with torch.cuda.stream(s):
            a = torch.zeros(256, 256, device=f"cuda:{DEV}", dtype=torch.bfloat16)
            b = torch.eye(256, device=f"cuda:{DEV}", dtype=torch.bfloat16)
            torch.cuda._sleep(int(50e-3 * 1.5e9))   # ~50 ms of GPU time before the write
            a.fill_(3.0)                              # regend must see this
            y = rt.matmul(a, b)
            z = y + 1                                 # the rank's stream must see regend's result
        s.synchronize()
        ok = bool((y == 3).all().item()) and bool((z == 4).all().item())
        record(f"ordering {mode}: both directions on a side stream", ok,
               f"y {y.float().mean().item():.2f} z {z.float().mean().item():.2f}")
    rt.configure(socket=d.socket)


def chained(rt, d):
    """A batch's calls after its first are ordered by regend's lane alone
    (no event through the rank's context); rank work inside the batch (a
    bias copied to be contiguous, a new ones row for the bias gradients)
    orders the next call after it again. The MLP forward and backward, in
    every ordering, on a side stream whose input is written behind a 50 ms
    spin, against torch in float32."""
    F = torch.nn.functional
    dev = f"cuda:{DEV}"
    for n, mode in enumerate(("wait", "events", "sync", "auto")):
        rt.configure(socket=d.socket, ordering=mode)
        m = 3 * 97 + n                        # a row count no ones row exists for yet
        s = torch.cuda.Stream(DEV)
        with torch.cuda.stream(s):
            x = torch.zeros(m, 256, device=dev, dtype=torch.bfloat16)
            w1 = (torch.randn(1024, 256, device=dev, dtype=torch.bfloat16) / 16).requires_grad_()
            wide = torch.randn(2048, device=dev, dtype=torch.bfloat16)
            b1 = wide[::2].detach().requires_grad_()     # strided: copied on the rank inside the batch
            w2 = (torch.randn(256, 1024, device=dev, dtype=torch.bfloat16) / 32).requires_grad_()
            b2 = torch.randn(256, device=dev, dtype=torch.bfloat16, requires_grad=True)
            src = torch.randn(m, 256, device=dev, dtype=torch.bfloat16)
            torch.cuda._sleep(int(50e-3 * 1.5e9))
            x.copy_(src)
            x.requires_grad_()
            before = rt.stats()["chained_calls"]
            y = rt.mlp(x, w1, b1, w2, b2)
            g = torch.randn_like(y)
            got = torch.autograd.grad(y, (x, w1, b1, w2, b2), g)
            chained_now = rt.stats()["chained_calls"] - before
        s.synchronize()
        leaves = [t.detach().float().requires_grad_() for t in (src, w1, b1, w2, b2)]
        ref = F.linear(F.gelu(F.linear(leaves[0], leaves[1], leaves[2]), approximate="tanh"), leaves[3], leaves[4])
        want = torch.autograd.grad(ref, leaves, g.float())
        e = max([rel(y, ref)] + [rel(p, q_) for p, q_ in zip(got, want)])
        record(f"chained batch, ordering {mode}: mlp fwd+bwd right", e < TOL[torch.bfloat16],
               f"rel {e:.2e}, {chained_now} chained calls")
        record(f"chained batch, ordering {mode}: calls chained", chained_now >= 3, f"{chained_now} chained calls")
    rt.configure(socket=d.socket)


def deferred(rt, d):
    """A batch's chained calls go without waiting for their answers: an
    error among them is raised, named, when the batch ends (not by the call,
    which returned), and the runtime serves on; a restart while calls are
    queued has them run again in the new generation, in order."""
    from regen.torch._ops import _empty, _gemm
    admin = regen.Client(d.socket)
    dev = f"cuda:{DEV}"
    a = torch.randn(128, 128, device=dev, dtype=torch.bfloat16) / 8
    b = torch.randn(128, 128, device=dev, dtype=torch.bfloat16) / 8
    want = a.float() @ b.float() @ b.float() @ b.float()
    for mode in ("wait", "events"):
        rt.configure(socket=d.socket, ordering=mode)
        rtm = rt.runtime()
        returned, named = False, None
        try:
            with rtm.batch():
                y1 = _gemm(a, b, _empty([128, 128], a.dtype, a))
                _gemm(y1, b, _empty([128, 64], a.dtype, a))     # D's shape is wrong: refused by regend
                returned = True
        except regen.Error as e:
            named = e
        record(f"deferred, ordering {mode}: an error surfaces at the batch's end", returned and named is not None,
               f"returned {returned}, {type(named).__name__}: {str(named)[:80]}")
        e_after = rel(rt.matmul(a, b), a.float() @ b.float())
        record(f"deferred, ordering {mode}: the next operation works", e_after < TOL[torch.bfloat16],
               f"rel {e_after:.2e}")
        idx = rtm.regend_device(torch.device("cuda", DEV))
        before = rtm.stats()
        try:
            with rtm.batch():
                y1 = _gemm(a, b, _empty([128, 128], a.dtype, a))
                y2 = _gemm(y1, b, _empty([128, 128], a.dtype, a))      # queued
                gen = admin.generation()["devices"][idx]["generation"]
                admin.restart(idx, reason="test_regen_torch deferred")
                deadline = time.monotonic() + 60
                while time.monotonic() < deadline and admin.generation()["devices"][idx]["generation"] <= gen:
                    time.sleep(0.02)
                y3 = _gemm(y2, b, _empty([128, 128], a.dtype, a))      # into the old generation's lane
            after = rtm.stats()
            e = rel(y3, want)
            ok = e < 3 * TOL[torch.bfloat16] and after["recoveries"] > before["recoveries"]
            record(f"deferred, ordering {mode}: a restart mid-batch re-runs the queued calls", ok,
                   f"rel {e:.2e}, {after['recoveries'] - before['recoveries']} recoveries, "
                   f"{after['flushes'] - before['flushes']} flushes")
        except Exception as e:
            record(f"deferred, ordering {mode}: a restart mid-batch re-runs the queued calls", False,
                   f"{type(e).__name__}: {e}")
    rt.configure(socket=d.socket)
    admin.close()


def capture(rt):
    """A regend operation inside a CUDA graph capture is refused by name,
    and the capture is left usable."""
    dev = f"cuda:{DEV}"
    a = torch.randn(64, 64, device=dev, dtype=torch.bfloat16)
    s = torch.cuda.Stream(dev)
    g = torch.cuda.CUDAGraph()
    named = None
    with torch.cuda.stream(s):
        with torch.cuda.graph(g, stream=s):
            b = a * 2
            try:
                rt.matmul(a, a)
            except rt.NotSupported as e:
                named = e
            c = b + 1
    g.replay()
    torch.cuda.synchronize()
    ok = named is not None and bool((c == a * 2 + 1).all().item())
    record("an operation in a CUDA graph capture: NotSupported, the capture still good", ok, str(named)[:120])


def compiled(rt):
    if not rt.HAVE_CUSTOM_OP:
        record("torch.compile traces the custom ops", True, "skipped: torch < 2.4")
        return

    def f(x, w, q, k, v, w2, qkv):
        h = rt.linear(x, w, activation="gelu")
        m = rt.mlp(x, w, None, w2, None)
        p = rt.attention_packed(qkv, 4, is_causal=True)
        return (h.sum() + rt.scaled_dot_product_attention(q, k, v, is_causal=True).float().sum() +
                m.float().sum() + p.float().sum())

    dev = f"cuda:{DEV}"
    x = torch.randn(64, 128, device=dev, dtype=torch.bfloat16)
    w = torch.randn(256, 128, device=dev, dtype=torch.bfloat16)
    w2 = torch.randn(128, 256, device=dev, dtype=torch.bfloat16) / 16
    q = k = v = torch.randn(1, 4, 64, 64, device=dev, dtype=torch.bfloat16)
    qkv = torch.randn(1, 64, 3 * 4 * 64, device=dev, dtype=torch.bfloat16)
    calls = rt.stats()["calls"]
    got = torch.compile(f, fullgraph=True, backend="aot_eager")(x, w, q, k, v, w2, qkv)
    want = f(x, w, q, k, v, w2, qkv)
    ok = abs(got.item() - want.item()) <= 1e-2 * max(1.0, abs(want.item())) and rt.stats()["calls"] > calls
    record("torch.compile(fullgraph) traces and runs the custom ops", ok, f"{got.item():.3f} vs {want.item():.3f}")


def lifecycle(rt, d):
    admin = regen.Client(d.socket)
    dev = f"cuda:{DEV}"
    a = torch.randn(256, 256, device=dev, dtype=torch.bfloat16)
    b = torch.randn(256, 256, device=dev, dtype=torch.bfloat16)
    with rt.pool(DEV):
        pa = a.clone()
    want = a.float() @ b.float()
    rtm = rt.runtime()
    idx = rtm.regend_device(torch.device("cuda", DEV))
    for kind in ("restart", "device_lost", "crash"):
        rt.matmul(a, b)
        gen = admin.generation()["devices"][idx]["generation"]
        before = rtm.stats()["recoveries"]
        if kind == "restart":
            admin.restart(idx, reason="test_regen_torch")
        else:
            admin.inject_fault(idx, kind)
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            try:
                if admin.generation()["devices"][idx]["generation"] > gen:
                    break
            except regen.Error:
                pass
            time.sleep(0.02)
        try:
            e1 = rel(rt.matmul(a, b), want)            # a block import, stale
            e2 = rel(rt.matmul(pa, b), want)           # a pool chunk, stale
            rec = rtm.stats()["recoveries"] - before
            record(f"lifecycle {kind}: operations go on", max(e1, e2) < 2e-2 and rec >= 1,
                   f"rel {max(e1, e2):.2e}, {rec} recoveries")
        except Exception as e:
            record(f"lifecycle {kind}: operations go on", False, f"{type(e).__name__}: {e}")
    own = rt.Runtime(socket=d.socket, retry=False)
    saved, rt._runtime = rt._runtime, own
    try:
        rt.matmul(a, b)
        admin.restart(idx, reason="no retry")
        try:
            rt.matmul(a, b)
            record("lifecycle without retry: a named error", False, "no error")
        except (regen.StaleGeneration, regen.ConnectionReset) as e:
            record("lifecycle without retry: a named error", True, e.name)
    finally:
        rt._runtime = saved
        own.client.close()
    admin.close()


def mps(rt):
    m = rt.mps_mode()
    record("mps_mode reports", isinstance(m.get("rank"), bool) and "isolated" in m, str(m))
    # regend says, per device, whether its worker is an MPS client (Status's sharing).
    record("mps_mode has regend's sharing for its device", isinstance(m.get("regend"), bool) and
           isinstance(m.get("regend_devices", {}).get(DEV), bool), str(m.get("regend_devices")))


def main():
    regend, steps = gpu_script_args(10000)
    os.environ["REGEN_LIBREGEN"] = libregen_for(regend)
    daemon = Regend(regend, devices=1, backend="cuda", ready_timeout=120)
    try:
        import regen.torch as rt
        rt.configure(socket=daemon.socket)
        why = rt.runtime().pool.cuda_available() if rt.runtime().pool else "libregen not found"
        record("libregen's CUDA pool is available", why is None, why or "")
        torch.manual_seed(0)
        guarded("device", lambda: device_map(rt, daemon))
        guarded("ops", lambda: ops(rt))
        guarded("pool", lambda: pool_imports(rt))
        guarded("blocks", lambda: block_imports(rt))
        guarded("ordering", lambda: ordering(rt, daemon))
        guarded("chained", lambda: chained(rt, daemon))
        guarded("deferred", lambda: deferred(rt, daemon))
        guarded("compile", lambda: compiled(rt))
        guarded("capture", lambda: capture(rt))
        guarded("flat", lambda: flat(rt, steps))
        guarded("lifecycle", lambda: lifecycle(rt, daemon))
        guarded("mps", lambda: mps(rt))
    except BaseException:
        daemon.finish(dump=True)
        raise
    else:
        daemon.stop()
    return summary()


if __name__ == "__main__":
    sys.exit(main())
