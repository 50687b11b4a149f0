#!/usr/bin/env python3
# SPDX-License-Identifier: Apache-2.0
"""PyTorch and regend on one GPU: a torch process shares its CUDA tensors with
regend by CUDA IPC (regen.Client.import_tensor), runs GEMMs there and checks
them against torch float64 on the same fresh random inputs, and attention
(cuDNN's, bf16 and f16: grouped-query heads, both causal alignments, several
head dimensions and layouts, forward and backward, with and without
per-entry sequence lengths) against torch's SDPA in f32 (with an explicit
boolean mask built from the lengths); checks what the CUDA backend refuses; then faults the
device (device_lost, restart, worker crash) and checks that the torch
process's own tensors and CUDA context come through untouched and that work
carries on after re-importing.

    python3 tests/gpu/test_torch_interop.py [path/to/regend] [--only gemm,events,attention,varlen,lifecycle]

regend defaults to $REGEND, then $REGEN_BUILD_ROOT/daemon/regend, then
build/daemon/regend.  Exit 0 = pass, 1 = fail, 77 = skipped (no torch or no
CUDA).  Prints one line per check and "N passed, N failed" last.
"""

import math
import os
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "..", "client", "python"))
sys.path.insert(0, os.path.join(HERE, "..", "lib"))
from regend_fixture import Regend, failed_count, find_regend, guarded, record, record_width, \
    require_torch, summary, torch_rel_error as rel_err  # noqa: E402

# Skips (77) without torch or a CUDA device; keeps memory shareable by CUDA IPC.
torch = require_torch()

import regen  # noqa: E402

DEV = 0
# ||out - ref|| / ||ref|| allowed, ref = float64 on the inputs as stored.
TOL = {"f32": 1e-5, "tf32": 1e-3, "bf16": 1e-2, "f16": 1e-2}
TORCH_DTYPE = {"f32": torch.float32, "bf16": torch.bfloat16, "f16": torch.float16}

record_width(52)


def fresh_generator():
    seed = int.from_bytes(os.urandom(8), "little") & ((1 << 63) - 1)
    return torch.Generator(device=f"cuda:{DEV}").manual_seed(seed)


def randn(shape, dtype, g):
    return torch.randn(shape, device=f"cuda:{DEV}", generator=g, dtype=torch.float32).to(dtype)


def gelu_tanh(x):
    return 0.5 * x * (1.0 + torch.tanh(math.sqrt(2.0 / math.pi) * (x + 0.044715 * x ** 3)))


def gemm_case(c, m, n, k, dtype="f32", out_dtype=None, trans_a=False, trans_b=False, alpha=1.0, beta=0.0,
              with_c=False, epilogue=None, tf32=False, views=False, layout=None):
    """One GEMM through regend on fresh torch tensors, against float64.
    views: pass transposes as torch views (a.t()) rather than flags.
    layout: "offset" (a is a row slice of a bigger tensor) or "padded"
    (a's rows are K + 64 apart)."""
    out_dtype = out_dtype or dtype
    td, to = TORCH_DTYPE[dtype], TORCH_DTYPE[out_dtype]
    g = fresh_generator()
    a_store = randn([k, m] if trans_a else [m, k], td, g)
    if layout == "offset":
        big = randn([m + 37, k], td, g)
        a_store = big[37:]
    elif layout == "padded":
        big = randn([m, k + 64], td, g)
        a_store = big[:, :k]
    b_store = randn([n, k] if trans_b else [k, n], td, g)
    d = torch.full((m, n), float("nan"), device=f"cuda:{DEV}", dtype=to)
    c_t = randn([m, n], to, g) if with_c else None
    bias = randn([n], to, g) if epilogue in ("bias", "gelu_bias") else None
    # dgelu's pre-activation, wide enough to reach GELU's tails.
    aux = (2.0 * randn([m, n], torch.float32, g)).to(to) if epilogue == "dgelu" else None

    a_op = a_store.t() if trans_a else a_store     # op(A) as a [m, k] view
    b_op = b_store.t() if trans_b else b_store     # op(B) as a [k, n] view
    if views:
        us = c.gemm(a_op, b_op, d, c=c_t, bias=bias, alpha=alpha, beta=beta, epilogue=epilogue, tf32=tf32,
                    aux=aux)
    else:
        us = c.gemm(a_store, b_store, d, c=c_t, bias=bias, trans_a=trans_a, trans_b=trans_b, alpha=alpha,
                    beta=beta, epilogue=epilogue, tf32=tf32, aux=aux)
    ref = alpha * (a_op.double() @ b_op.double())
    if with_c:
        ref = ref + beta * c_t.double()
    if bias is not None:
        ref = ref + bias.double()
    if epilogue in ("gelu", "gelu_bias"):
        ref = gelu_tanh(ref)
    if epilogue == "dgelu":
        # torch's own GELU backward, in float64 on the stored aux.
        ref = torch.ops.aten.gelu_backward(ref, aux.double(), approximate="tanh")
    torch.cuda.synchronize()
    err = rel_err(d, ref)
    tol = TOL["tf32"] if tf32 else max(TOL[dtype], TOL[out_dtype])
    flags = ("T" if trans_a else "N") + ("T" if trans_b else "N")
    extras = []
    if out_dtype != dtype:
        extras.append(f"->{out_dtype}")
    if tf32:
        extras.append("tf32")
    if with_c:
        extras.append(f"a={alpha} b={beta} +C")
    if epilogue:
        extras.append(epilogue)
    if views:
        extras.append("views")
    if layout:
        extras.append(layout)
    name = f"gemm {dtype} {m}x{n}x{k} {flags} {' '.join(extras)}".strip()
    ok = math.isfinite(err) and err <= tol
    record(name, ok, f"rel {err:.2e} (tol {tol:.0e})  regend {us} us")


def run_gemms(c):
    cases = [
        dict(m=512, n=384, k=1024),
        dict(m=127, n=65, k=33),
        dict(m=256, n=192, k=320, trans_a=True),
        dict(m=256, n=192, k=320, trans_b=True),
        dict(m=256, n=192, k=320, trans_a=True, trans_b=True),
        dict(m=256, n=192, k=320, trans_a=True, trans_b=True, views=True),
        dict(m=512, n=384, k=1024, tf32=True),
        dict(m=256, n=192, k=320, alpha=0.5, beta=-1.5, with_c=True),
        dict(m=256, n=192, k=320, epilogue="bias"),
        dict(m=256, n=192, k=320, epilogue="gelu"),
        dict(m=256, n=192, k=320, epilogue="gelu_bias", alpha=2.0, beta=0.5, with_c=True),
        dict(m=256, n=192, k=320, epilogue="dgelu"),
        dict(m=256, n=192, k=320, epilogue="dgelu", alpha=2.0, beta=0.5, with_c=True, trans_b=True),
        dict(m=200, n=128, k=256, layout="offset"),
        dict(m=200, n=128, k=256, layout="padded"),
    ]
    for dt in ("bf16", "f16"):
        cases += [
            dict(m=1024, n=768, k=2048, dtype=dt),
            dict(m=127, n=72, k=40, dtype=dt),
            dict(m=256, n=192, k=320, dtype=dt, trans_a=True),
            dict(m=256, n=192, k=320, dtype=dt, trans_b=True),
            dict(m=256, n=192, k=320, dtype=dt, trans_a=True, trans_b=True, views=True),
            dict(m=512, n=384, k=1024, dtype=dt, out_dtype="f32"),
            dict(m=256, n=192, k=320, dtype=dt, alpha=0.5, beta=-1.5, with_c=True),
            dict(m=256, n=192, k=320, dtype=dt, epilogue="bias"),
            dict(m=256, n=192, k=320, dtype=dt, epilogue="gelu_bias"),
            dict(m=256, n=192, k=320, dtype=dt, epilogue="dgelu", trans_a=True),
            dict(m=256, n=192, k=320, dtype=dt, epilogue="dgelu", alpha=0.5, beta=-1.5, with_c=True),
        ]
    for case in cases:
        guarded(f"gemm {case}", gemm_case, c, **case)
    for transport in ("ring", "varlink"):
        guarded(f"gemm on the same tensors ({transport})", repeat_case, c, transport)
    c.set_transport("auto")


def repeat_case(c, transport, calls=6):
    """The same torch tensors in call after call, fresh values each time
    (a is a row slice at an offset, b a transposed view, with a bias): from the
    second call on, where regen._accel is loaded and the lane is on the
    ring, it encodes the call (the imports found by address), against
    float64 every time."""
    from regen import accel
    c.set_transport(transport)
    g = fresh_generator()
    big = randn([300, 256], torch.bfloat16, g)
    a = big[44:]
    b_store = randn([384, 256], torch.bfloat16, g)
    b = b_store.t()
    bias = randn([384], torch.bfloat16, g)
    d = torch.empty(256, 384, device=f"cuda:{DEV}", dtype=torch.bfloat16)
    before = c.accel_calls
    worst = 0.0
    for _ in range(calls):
        for t in (big, b_store, bias):
            t.copy_(randn(list(t.shape), torch.bfloat16, g))
        d.fill_(float("nan"))
        c.gemm(a, b, d, bias=bias, epilogue="bias")
        ref = a.double() @ b.double() + bias.double()
        torch.cuda.synchronize()
        worst = max(worst, rel_err(d, ref))
    encoded = c.accel_calls - before
    record(f"gemm on the same tensors x{calls} ({transport}): results", worst <= TOL["bf16"], f"worst rel {worst:.2e}")
    if accel.module is not None and transport == "ring":
        record(f"gemm on the same tensors x{calls} ({transport}): regen._accel encoded the later calls",
               encoded == calls - 1, f"{encoded} of {calls}")
    else:
        record(f"gemm on the same tensors x{calls} ({transport}): regen._accel took none", encoded == 0,
               f"{encoded} of {calls} (accel {'loaded' if accel.module else 'not loaded'})")


# -- attention ------------------------------------------------------------------
# Against torch's SDPA in f32 on the same (upcast) inputs: ||out - ref|| /
# ||ref|| for o and the stats, then for d_q, d_k, d_v, which start from o as
# stored (rounded to the dtype): a little more room there.
ATT_TOL = {"bf16": 1e-2, "f16": 3e-3}
ATT_BWD_TOL = {"bf16": 2e-2, "f16": 6e-3}


def causal_keep(sq, skv, alignment, device):
    """True where query row i may attend to key j."""
    i = torch.arange(sq, device=device)[:, None]
    j = torch.arange(skv, device=device)[None, :]
    return j <= i + (skv - sq if alignment == "bottom_right" else 0)


def attention_reference(q, k, v, scale, causal, alignment):
    """torch's SDPA (math backend) in f32 with grouped-query heads and either
    causal alignment; the rows' log-sum-exp; and a function giving the input
    gradients for an incoming d_o (autograd, f32)."""
    from torch.nn.attention import SDPBackend, sdpa_kernel
    q32, k32, v32 = (t.float().detach().requires_grad_(True) for t in (q, k, v))
    keep = causal_keep(q.shape[2], k.shape[2], alignment, q.device) if causal else None
    with sdpa_kernel(SDPBackend.MATH):
        o = torch.nn.functional.scaled_dot_product_attention(q32, k32, v32, attn_mask=keep, scale=scale,
                                                             enable_gqa=True)
    group = q.shape[1] // k.shape[1]
    s = (q32.detach() @ k32.detach().repeat_interleave(group, dim=1).transpose(-1, -2)) * scale
    if keep is not None:
        s = s.masked_fill(~keep, float("-inf"))
    lse = torch.logsumexp(s, dim=-1)

    def grads(d_o):
        return torch.autograd.grad(o, (q32, k32, v32), d_o.float(), retain_graph=True)
    return o.detach(), lse, grads


def att_tensor(shape, layout, td, g, fill=None):
    """A [B, H, S, D] tensor laid out as `layout`: "bhsd" (contiguous),
    "bshd" (a transposed view of [B, S, H, D]: what a model's projections
    give) or "padded" (rows 16 elements apart more than D)."""
    b, h, s, d = shape
    if layout == "bshd":
        store = [b, s, h, d]
    elif layout == "padded":
        store = [b, h, s, d + 16]
    else:
        store = shape
    t = randn(store, td, g) if fill is None else torch.full(store, fill, device=f"cuda:{DEV}", dtype=td)
    if layout == "bshd":
        t = t.transpose(1, 2)
    elif layout == "padded":
        t = t[..., :d]
    return t


def attention_case(c, b, h, sq, skv, d, dv, dtype, causal=False, alignment="top_left", hkv=None, layout="bhsd",
                   with_stats=True):
    hkv = hkv or h
    td = TORCH_DTYPE[dtype]
    g = fresh_generator()
    q = att_tensor([b, h, sq, d], layout, td, g)
    k = att_tensor([b, hkv, skv, d], layout, td, g)
    v = att_tensor([b, hkv, skv, dv], layout, td, g)
    o = att_tensor([b, h, sq, dv], layout, td, g, fill=float("nan"))
    stats = torch.full([b, h, sq], float("nan"), device=q.device, dtype=torch.float32)
    scale = 1.0 / math.sqrt(d)
    ref_o, ref_lse, grads = attention_reference(q, k, v, scale, causal, alignment)
    mask = f" causal {alignment}" if causal else ""
    name = f"attention {dtype} B{b} H{h}/{hkv} Sq{sq} Skv{skv} D{d}/{dv}{mask} {layout}"
    alignment_arg = alignment if causal else None
    us = c.attention(q, k, v, o, stats=stats if with_stats else None, causal=causal, causal_alignment=alignment_arg)
    torch.cuda.synchronize()
    tol = ATT_TOL[dtype]
    e_o = rel_err(o, ref_o)
    e_l = rel_err(stats, ref_lse) if with_stats else 0.0
    ok = bool(torch.isfinite(o).all()) and e_o < tol and e_l < tol
    record(name, ok, f"o {e_o:.1e}  lse {e_l:.1e}  (tol {tol:g})  {us} us" if with_stats
           else f"o {e_o:.1e} (tol {tol:g}, no stats)  {us} us")
    if not with_stats:
        return
    d_o = att_tensor([b, h, sq, dv], layout, td, g)
    dq, dk, dvv = (att_tensor(list(t.shape), layout, td, g, fill=float("nan")) for t in (q, k, v))
    us = c.attention_backward(q, k, v, o, d_o, stats, dq, dk, dvv, causal=causal, causal_alignment=alignment_arg)
    torch.cuda.synchronize()
    ref_dq, ref_dk, ref_dv = grads(d_o)
    errs = [rel_err(x, r) for x, r in ((dq, ref_dq), (dk, ref_dk), (dvv, ref_dv))]
    btol = ATT_BWD_TOL[dtype]
    ok = all(bool(torch.isfinite(t).all()) for t in (dq, dk, dvv)) and max(errs) < btol
    record(name + " backward", ok, f"dq {errs[0]:.1e} dk {errs[1]:.1e} dv {errs[2]:.1e} (tol {btol:g})  {us} us")


def attention_refused(c, label, want, call):
    """call() must fail with InvalidOperand whose message contains `want`."""
    try:
        call()
        record(f"refused: {label}", False, "the call succeeded")
    except regen.InvalidOperand as e:
        record(f"refused: {label}", want in str(e), f"InvalidOperand: {str(e)[:150]}")
    except regen.Error as e:
        record(f"refused: {label}", False, f"expected InvalidOperand, got {type(e).__name__}: {e}")


def run_attention(c):
    cases = []
    for dtype in ("bf16", "f16"):
        for causal in (False, True):
            cases.append(dict(b=2, h=4, sq=128, skv=128, d=64, dv=64, dtype=dtype, causal=causal))
    cases += [
        # grouped-query and multi-query heads, both alignments, Sq != Skv
        dict(b=2, h=8, hkv=2, sq=256, skv=256, d=128, dv=128, dtype="bf16", causal=True, layout="bshd"),
        dict(b=1, h=4, hkv=1, sq=200, skv=333, d=64, dv=64, dtype="f16", layout="bshd"),
        dict(b=2, h=8, hkv=2, sq=77, skv=200, d=128, dv=128, dtype="bf16", causal=True, alignment="bottom_right"),
        dict(b=1, h=4, sq=300, skv=128, d=64, dv=64, dtype="f16", causal=True),
        dict(b=1, h=4, hkv=2, sq=64, skv=192, d=64, dv=64, dtype="f16", causal=True, alignment="bottom_right",
             layout="bshd"),
        # head dimensions
        dict(b=1, h=4, sq=128, skv=128, d=32, dv=32, dtype="bf16", causal=True),
        dict(b=1, h=4, sq=160, skv=160, d=96, dv=96, dtype="bf16", layout="padded"),
        dict(b=1, h=2, sq=128, skv=256, d=192, dv=192, dtype="bf16", causal=True, alignment="bottom_right"),
        dict(b=1, h=2, sq=128, skv=128, d=256, dv=256, dtype="f16", causal=True, layout="bshd"),
        dict(b=1, h=4, sq=128, skv=128, d=128, dv=64, dtype="bf16"),
        # forward only, no stats (inference)
        dict(b=1, h=4, sq=128, skv=128, d=64, dv=64, dtype="bf16", causal=True, with_stats=False),
    ]
    for case in cases:
        guarded(f"attention {case}", attention_case, c, **case)

    # What the CUDA backend refuses, by name, leaving the lane usable.
    g = fresh_generator()
    x32 = [randn([1, 2, 64, 64], torch.float32, g) for _ in range(4)]
    attention_refused(c, "f32 attention on the CUDA backend", "bf16 or f16",
                      lambda: c.attention(x32[0], x32[1], x32[2], x32[3]))
    odd = [randn([1, 2, 64, 36], torch.bfloat16, g) for _ in range(4)]
    attention_refused(c, "head dim 36 (not a multiple of 8)", "multiple",
                      lambda: c.attention(odd[0], odd[1], odd[2], odd[3]))
    # cuDNN's backward takes head dimensions up to 256: refused with its
    # own reason when the plan is built, nothing run.
    wide = [randn([1, 2, 64, 264], torch.bfloat16, g) for _ in range(8)]
    lse = randn([1, 2, 64], torch.float32, g)
    attention_refused(c, "backward head dim 264 (cuDNN's reason)", "256",
                      lambda: c.attention_backward(wide[0], wide[1], wide[2], wide[3], wide[4], lse, wide[5], wide[6],
                                                   wide[7]))
    big = randn([1 * 2 * 64 * 64 + 4], torch.bfloat16, g)
    shifted = big[4:].view(1, 2, 64, 64)    # 8 bytes past the storage's start
    ok = [randn([1, 2, 64, 64], torch.bfloat16, g) for _ in range(3)]
    attention_refused(c, "q not 16-byte aligned", "16-byte aligned",
                      lambda: c.attention(shifted, ok[0], ok[1], ok[2]))
    guarded("attention after refusals", attention_case, c, 1, 2, 64, 64, 64, 64, "bf16", causal=True)


# -- attention with sequence lengths ------------------------------------------------
# Against torch's SDPA in f32 with an explicit boolean mask built from the
# lengths (and the causal diagonal, each entry's own). A padding query row
# sees no key, which torch's SDPA answers with NaN, and NaN would reach
# d_k and d_v through autograd: the reference lets such a row see key 0
# and gives it d_o 0, so it adds nothing, and its own outputs are compared
# with what the protocol says instead (o 0, stats -inf, gradients 0).

def lengths_mask(lq, lkv, sq, skv, causal, alignment, device):
    """keep [B, 1, Sq, Skv]: row i of entry b sees key j."""
    i = torch.arange(sq, device=device)[None, :, None]
    j = torch.arange(skv, device=device)[None, None, :]
    lq_t = torch.tensor(lq, device=device)[:, None, None]
    lkv_t = torch.tensor(lkv, device=device)[:, None, None]
    keep = (i < lq_t) & (j < lkv_t)
    if causal:
        keep &= j <= i + ((lkv_t - lq_t) if alignment == "bottom_right" else 0)
    return keep[:, None]


def varlen_case(c, b, h, sq, skv, d, dtype, lq, lkv, causal=False, alignment="top_left", hkv=None, layout="bhsd",
                padding=None, label=""):
    """One forward and backward with per-entry lengths lq, lkv (what regend
    is given; clamped into [0, Sq] and [0, Skv] for the reference, as the
    CUDA backend does). padding: what the padding rows of q, k, v and d_o
    hold (None: random values like the rest; or a float such as NaN)."""
    hkv = hkv or h
    td = TORCH_DTYPE[dtype]
    dev = f"cuda:{DEV}"
    g = fresh_generator()
    eff_q = [min(max(x, 0), sq) for x in lq]
    eff_kv = [min(max(x, 0), skv) for x in lkv]
    q = att_tensor([b, h, sq, d], layout, td, g)
    k = att_tensor([b, hkv, skv, d], layout, td, g)
    v = att_tensor([b, hkv, skv, d], layout, td, g)
    d_o = att_tensor([b, h, sq, d], layout, td, g)
    if padding is not None:
        for n in range(b):
            for t, ln in ((q, eff_q[n]), (k, eff_kv[n]), (v, eff_kv[n]), (d_o, eff_q[n])):
                t[n, :, ln:] = padding
    o = att_tensor([b, h, sq, d], layout, td, g, fill=float("nan"))
    stats = torch.full([b, h, sq], float("nan"), device=dev, dtype=torch.float32)
    seq_q = torch.tensor(lq, device=dev, dtype=torch.int32)
    seq_kv = torch.tensor(lkv, device=dev, dtype=torch.int32)
    scale = 1.0 / math.sqrt(d)

    keep = lengths_mask(eff_q, eff_kv, sq, skv, causal, alignment, dev)
    row_padded = ~keep.any(dim=-1, keepdim=True)                     # [B, 1, Sq, 1]
    ref_keep = keep.clone()
    ref_keep[..., 0] |= row_padded[..., 0]
    clean = [torch.where(torch.isfinite(t), t, torch.zeros_like(t)) for t in (q, k, v, d_o)]
    from torch.nn.attention import SDPBackend, sdpa_kernel
    q32, k32, v32 = (t.float().detach().requires_grad_(True) for t in clean[:3])
    with sdpa_kernel(SDPBackend.MATH):
        ref_o = torch.nn.functional.scaled_dot_product_attention(q32, k32, v32, attn_mask=ref_keep, scale=scale,
                                                                 enable_gqa=True)
    group = h // hkv
    sc = (q32.detach() @ k32.detach().repeat_interleave(group, dim=1).transpose(-1, -2)) * scale
    ref_lse = torch.logsumexp(sc.masked_fill(~keep, float("-inf")), dim=-1)   # -inf on padding rows
    pad_rows = row_padded[:, :, :, 0].expand(b, h, sq)                        # [B, H, Sq]

    mask_txt = f" causal {alignment}" if causal else ""
    name = (f"varlen {dtype} B{b} H{h}/{hkv} Sq{sq} Skv{skv} D{d}{mask_txt} {layout} "
            f"lq{lq} lkv{lkv}{label}")
    us = c.attention(q, k, v, o, stats=stats, causal=causal, causal_alignment=alignment if causal else None,
                     seq_len_q=seq_q, seq_len_kv=seq_kv)
    torch.cuda.synchronize()
    tol = ATT_TOL[dtype]
    live = ~pad_rows
    e_o = rel_err(o[live], ref_o.detach()[live])
    e_l = rel_err(stats[live], ref_lse[live])
    pad_o = bool((o[pad_rows] == 0).all())
    pad_l = bool((stats[pad_rows] == float("-inf")).all())
    ok = bool(torch.isfinite(o).all()) and e_o < tol and e_l < tol and pad_o and pad_l
    record(name, ok, f"o {e_o:.1e} lse {e_l:.1e} (tol {tol:g}); padding rows o 0: {pad_o}, stats -inf: {pad_l}; "
           f"{us} us")

    dq, dk, dvv = (att_tensor(list(t.shape), layout, td, g, fill=float("nan")) for t in (q, k, v))
    us = c.attention_backward(q, k, v, o, d_o, stats, dq, dk, dvv, causal=causal,
                              causal_alignment=alignment if causal else None, seq_len_q=seq_q, seq_len_kv=seq_kv)
    torch.cuda.synchronize()
    ref_do = clean[3].float().masked_fill(pad_rows[..., None], 0.0)
    ref_dq, ref_dk, ref_dv = torch.autograd.grad(ref_o, (q32, k32, v32), ref_do)
    errs = [rel_err(x, r) for x, r in ((dq, ref_dq), (dk, ref_dk), (dvv, ref_dv))]
    kv_pad = torch.arange(skv, device=dev)[None, None, :] >= torch.tensor(eff_kv, device=dev)[:, None, None]
    zeros = (bool((dq[pad_rows] == 0).all()) and bool((dk[kv_pad.expand(b, hkv, skv)] == 0).all()) and
             bool((dvv[kv_pad.expand(b, hkv, skv)] == 0).all()))
    btol = ATT_BWD_TOL[dtype]
    ok = all(bool(torch.isfinite(t).all()) for t in (dq, dk, dvv)) and max(errs) < btol and zeros
    record(name + " backward", ok,
           f"dq {errs[0]:.1e} dk {errs[1]:.1e} dv {errs[2]:.1e} (tol {btol:g}); padding rows 0: {zeros}; {us} us")


def run_varlen_attention(c):
    cases = [
        # plain, an empty entry, a full one
        dict(b=3, h=4, sq=128, skv=128, d=64, dtype="bf16", lq=[100, 0, 128], lkv=[77, 128, 128]),
        # grouped-query heads, BSHD, causal top-left, Sq != Skv
        dict(b=3, h=8, hkv=2, sq=96, skv=160, d=128, dtype="f16", lq=[96, 40, 1], lkv=[160, 33, 90], causal=True,
             layout="bshd"),
        # bottom-right on each entry's own diagonal, Sq > Skv (the lengths decide)
        dict(b=4, h=4, hkv=1, sq=200, skv=128, d=64, dtype="bf16", lq=[100, 128, 7, 0], lkv=[128, 128, 60, 5],
             causal=True, alignment="bottom_right"),
        dict(b=2, h=4, sq=64, skv=256, d=128, dtype="f16", lq=[64, 17], lkv=[256, 200], causal=True,
             alignment="bottom_right", layout="padded"),
        # padding rows holding large values must reach no result (finite:
        # NaN there reaches o and the gradients through cuDNN's products
        # with the mask's zero weights, as in torch; the protocol says so)
        dict(b=3, h=4, sq=128, skv=128, d=64, dtype="bf16", lq=[100, 50, 128], lkv=[77, 128, 100], causal=True,
             padding=1000.0, label=" large padding"),
        # hostile lengths: clamped into [0, S] on the device, nothing read or
        # written outside the operands, the device healthy afterwards
        dict(b=3, h=4, sq=128, skv=128, d=64, dtype="bf16", lq=[2**31 - 1, -7, 5], lkv=[1 << 30, 3, 2**31 - 1],
             label=" hostile lengths"),
    ]
    for case in cases:
        guarded(f"varlen {case}", varlen_case, c, **case)
    # One length operand alone is refused by the parser, as on the host.
    g = fresh_generator()
    x = [randn([2, 2, 64, 64], torch.bfloat16, g) for _ in range(4)]
    lens = torch.tensor([64, 32], device=f"cuda:{DEV}", dtype=torch.int32)
    attention_refused(c, "seq_len_q without seq_len_kv", "pairs",
                      lambda: c.attention(x[0], x[1], x[2], x[3], seq_len_q=lens))
    guarded("attention after sequence lengths", attention_case, c, 1, 2, 64, 64, 64, 64, "bf16", causal=True)


def event_chain_case(c):
    """The rank produces A on its own stream and records an interprocess
    event; regend's GEMM waits on it and records the rank's second event;
    the rank's stream waits on that before reading D. No host
    synchronisation between producer and GEMM: if regend did not wait, it
    would read A's NaN poison."""
    g = fresh_generator()
    n = 1024
    a_real = randn([n, n], torch.float32, g)
    b = randn([n, n], torch.float32, g)
    a = torch.full([n, n], float("nan"), device=b.device)
    d = torch.full([n, n], float("nan"), device=b.device)
    ref = a_real.double() @ b.double()
    ev_in = torch.cuda.Event(interprocess=True)
    ev_out = torch.cuda.Event(interprocess=True)
    ev_in.record()
    ev_out.record()
    torch.cuda.synchronize()
    bufs = {name: c.import_tensor(t) for name, t in (("a", a), ("b", b), ("d", d))}
    e_in = c.import_event(DEV, ev_in.ipc_handle())
    e_out = c.import_event(DEV, ev_out.ipc_handle())
    ops = {name: regen.Operand(buf.id, 0, "f32", [n, n]) for name, buf in bufs.items()}
    # The worker's first GEMM of this shape builds its plan and loads its
    # kernel (CUDA loads modules lazily, which may wait for the context):
    # done here, so the timed call below measures when it is answered.
    t0 = time.monotonic()
    c.gemm(ops["a"], ops["b"], ops["d"])
    warm_ms = 1000 * (time.monotonic() - t0)
    torch.cuda._sleep(100_000_000)          # ~50 ms of GPU time before A exists
    a.copy_(a_real)
    ev_in.record()
    t0 = time.monotonic()
    c.gemm(ops["a"], ops["b"], ops["d"], wait_event=e_in, signal_event=e_out)
    call_ms = 1000 * (time.monotonic() - t0)
    torch.cuda.current_stream().wait_event(ev_out)
    out = d.clone()                          # ordered after regend's GEMM on the rank's stream
    torch.cuda.synchronize()
    err = rel_err(out, ref)
    record("wait/signal events chain a rank's stream and regend's GEMM", bool(torch.isfinite(out).all()) and err < 1e-5,
           f"rel {err:.2e}, call {call_ms:.1f} ms")
    # io.regen.Compute: with a signal_event the reply means "enqueued"; the
    # GEMM cannot run before the rank's ~50 ms sleep ends.
    record("a call with a signal_event is answered once enqueued, before its work runs", call_ms < 25,
           f"answered after {call_ms:.1f} ms; the work waited ~50 ms for the rank's stream "
           f"(the shape's first call, unordered: {warm_ms:.1f} ms)")
    c.close_event(e_in)
    c.close_event(e_out)
    for t in (a, b, d):
        c.close_tensor(t)


def event_limit_case(regend):
    """A process holds at most max_events imported events per device: each
    is a driver event the worker opened (cuIpcOpenEventHandle) and keeps
    until it is closed, and before issue 30's last audit nothing bounded
    them. regend --max-events 4: four import, the 5th is LimitExceeded
    {events, 4} and opens nothing; another process imports beside it; a
    close frees a slot."""
    daemon = Regend(regend, devices=1, backend="cuda", ready_timeout=120, extra=["--max-events", "4"])
    try:
        c = regen.Client(daemon.socket, timeout=120)
        events = [torch.cuda.Event(interprocess=True) for _ in range(6)]
        for ev in events:
            ev.record()
        torch.cuda.synchronize()
        handles = [ev.ipc_handle() for ev in events]
        held = [c.import_event(DEV, h) for h in handles[:4]]
        refused = None
        try:
            held.append(c.import_event(DEV, handles[4]))
        except regen.LimitExceeded as e:
            refused = e
        record("the 5th event of a process is LimitExceeded {events, 4} (--max-events 4)",
               refused is not None and refused.parameters.get("resource") == "events"
               and refused.parameters.get("limit") == 4, repr(refused))
        code = ("import sys, regen; c = regen.Client(sys.argv[1], timeout=60); "
                "c.import_event(%d, sys.argv[2]); print('ok')" % DEV)
        env = dict(os.environ, PYTHONPATH=os.path.dirname(os.path.dirname(os.path.abspath(regen.__file__))))
        other = subprocess.run([sys.executable, "-c", code, daemon.socket, bytes(handles[5]).hex()],
                               capture_output=True, text=True, timeout=120, env=env)
        record("another process imports an event beside the full one", other.stdout.strip() == "ok",
               (other.stdout + other.stderr)[-300:])
        c.close_event(held.pop())
        held.append(c.import_event(DEV, handles[4]))
        record("a closed event frees a slot", len(held) == 4)
        for e in held:
            c.close_event(e)
        c.close()
    finally:
        daemon.stop()


# -- lifecycle ------------------------------------------------------------------

def snapshot(tensors):
    torch.cuda.synchronize()
    return {k: v.detach().to("cpu", copy=True) for k, v in tensors.items()}


def intact(tensors, snap):
    torch.cuda.synchronize()
    bad = [k for k, v in tensors.items() if not torch.equal(v.cpu(), snap[k])]
    return not bad, bad


def torch_healthy():
    """The torch process's own context still works: a matmul of its own."""
    g = fresh_generator()
    x = torch.randn(1024, 1024, device=f"cuda:{DEV}", generator=g)
    y = x @ x
    torch.cuda.synchronize()
    return rel_err(y, x.double() @ x.double())


def wait_new_generation(c, gen0, probe=None, timeout=60.0):
    """Poll Generation until the device serves a generation after gen0.  If
    nothing changed after a second, call ``probe`` once: a backend may only
    notice a lost context on the next call."""
    start = time.monotonic()
    probed = False
    while True:
        info = next(d for d in c.generation()["devices"] if d["index"] == DEV)
        if info["generation"] > gen0 and info["state"] == "ready":
            return info
        elapsed = time.monotonic() - start
        if probe is not None and not probed and elapsed > 1.0 and info["generation"] == gen0:
            probed = True
            try:
                probe()
            except regen.Error as e:
                print(f"      probe call: {type(e).__name__}")
        if elapsed > timeout:
            raise TimeoutError(f"device {DEV} still at {info} after {timeout} s")
        time.sleep(0.02)


def lifecycle_case(c, kind):
    g = fresh_generator()
    a = randn([512, 256], torch.bfloat16, g)
    b = randn([256, 384], torch.bfloat16, g)
    d = torch.zeros(512, 384, device=f"cuda:{DEV}", dtype=torch.bfloat16)
    weights = randn([1024, 1024], torch.float32, g)   # never shared
    optimizer_state = randn([4096], torch.float32, g)  # never shared
    ref = a.double() @ b.double()

    bufs = [c.import_tensor(t) for t in (a, b, d)]
    c.gemm(a, b, d)
    err = rel_err(d, ref)
    if not record(f"{kind}: gemm before", err <= TOL["bf16"], f"rel {err:.2e}"):
        return
    mine = {"a": a, "b": b, "d": d, "weights": weights, "optimizer_state": optimizer_state}
    snap = snapshot(mine)
    gen0 = bufs[0].generation

    t0 = time.monotonic()
    if kind == "device_lost":
        c.inject_fault(DEV, "device_lost")
    elif kind == "crash":
        c.inject_fault(DEV, "crash")
    elif kind == "restart":
        c.restart(DEV, reason="torch interop test")
    probe = lambda: c.gemm(regen.Operand(bufs[0], 0, "bf16", [512, 256]),  # noqa: E731
                           regen.Operand(bufs[1], 0, "bf16", [256, 384]),
                           regen.Operand(bufs[2], 0, "bf16", [512, 384]))
    info = wait_new_generation(c, gen0, probe)
    ms = (time.monotonic() - t0) * 1e3
    record(f"{kind}: new generation", info["generation"] > gen0,
           f"gen {gen0} -> {info['generation']} in {ms:.0f} ms ({info['reason']}), respawns {info['respawns']}")

    ok, bad = intact(mine, snap)
    record(f"{kind}: torch's own tensors intact", ok, "bitwise equal" if ok else f"changed: {bad}")
    err = torch_healthy()
    record(f"{kind}: torch's own context healthy", err <= 1e-3, f"own matmul rel {err:.2e}")

    old = regen.Operand(bufs[0], 0, "bf16", [512, 256])
    try:
        c.gemm(old, regen.Operand(bufs[1], 0, "bf16", [256, 384]), regen.Operand(bufs[2], 0, "bf16", [512, 384]))
        record(f"{kind}: old ids refused", False, "GEMM on old buffers succeeded")
    except regen.StaleGeneration as e:
        record(f"{kind}: old ids refused", e.generation == info["generation"],
               f"StaleGeneration (generation {e.generation})")
    except regen.Error as e:
        record(f"{kind}: old ids refused", False, f"expected StaleGeneration, got {type(e).__name__}: {e}")

    d.zero_()
    new = c.import_tensor(a)
    c.gemm(a, b, d)  # b and d are imported again on the way
    err = rel_err(d, ref)
    record(f"{kind}: re-import and gemm", new.generation == info["generation"] and err <= TOL["bf16"],
           f"{new.id}, rel {err:.2e}")
    ok, bad = intact({"weights": weights, "optimizer_state": optimizer_state},
                     {"weights": snap["weights"], "optimizer_state": snap["optimizer_state"]})
    record(f"{kind}: unshared tensors still intact", ok, "" if ok else f"changed: {bad}")
    # The cuDNN handle and attention plans were released or forgotten with
    # the old generation: the next attention builds them again.
    attention_case(c, 1, 4, 128, 128, 64, 64, "bf16", causal=True)


PARTS = ("gemm", "events", "event_limit", "attention", "varlen", "lifecycle")


def main():
    args = sys.argv[1:]
    only = set(PARTS)
    if "--only" in args:
        i = args.index("--only")
        only = set(args[i + 1].split(","))
        del args[i:i + 2]
        if not only <= set(PARTS):
            print(f"--only takes {','.join(PARTS)}")
            return 2
    regend = find_regend(args[0] if args else None)
    if not regend or not os.access(regend, os.X_OK):
        print(f"FAIL: no regend at {regend} (pass its path as the first argument)")
        return 1
    print(f"torch {torch.__version__}, CUDA {torch.version.cuda}, {torch.cuda.get_device_name(DEV)}; regend {regend}")
    daemon = Regend(regend, devices=1, backend="cuda", ready_timeout=120)
    try:
        c = regen.Client(daemon.socket, timeout=120)
        st = c.status()
        info = st["devices"][DEV]
        print(f"regend: backend {info['backend']}, worker {info['worker_pid']}, generation {info['generation']}")
        if info["backend"] != "cuda":
            record("regend runs the cuda backend", False, f"backend is {info['backend']}")
        if "gemm" in only:
            run_gemms(c)
        if "events" in only:
            # Both transports answer a call with a signal_event at launch.
            for transport in ("ring", "varlink"):
                c.set_transport(transport)
                guarded(f"wait/signal events ({transport})", event_chain_case, c)
            c.set_transport("auto")
        if "event_limit" in only:
            guarded("event limit", event_limit_case, regend)
        for part, run in (("attention", run_attention), ("varlen", run_varlen_attention)):
            if part in only:
                guarded(part, run, c)
        for kind in ("device_lost", "restart", "crash") if "lifecycle" in only else ():
            guarded(f"{kind}: lifecycle", lifecycle_case, c, kind)
        torch.cuda.synchronize()
        c.close()
    finally:
        if failed_count():
            print("--- regend log (tail) ---")
            print(daemon.log_tail(60))
        daemon.stop()
    return summary()


if __name__ == "__main__":
    sys.exit(main())
