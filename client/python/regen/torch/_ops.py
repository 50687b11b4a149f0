# SPDX-License-Identifier: Apache-2.0
"""regen.torch's operations as torch.library custom ops (namespace
``regen``): torch.ops.regen.mm, linear, sdpa and sdpa_backward, each with a
fake (meta) implementation, so FakeTensor and torch.compile see their
shapes without running them, and autograd whose backward runs in regend
too.

On torch >= 2.4 they are torch.library.custom_op with register_fake and
register_autograd.  Older torch (down to 1.13) gets the same kernels
through torch.library.Library (CPU, CUDA and Meta kernels) with autograd
by torch.autograd.Function.  The kernels and the backward formulas are
shared.

A kernel allocates its outputs with torch.empty on the tensors' device
(inside regen.torch.pool() that is pool memory), or in libregen's host pool
for CPU tensors, and hands the work to the runtime, ordered with the
current stream.
"""

import math
import sys
from typing import Any, Callable, Dict, Optional, Tuple, TypeVar

import torch

from . import _autocast
from ._runtime import NotSupported, host_empty

__all__ = ["mm", "linear2d", "mlp2d", "sdpa", "sdpa_backward", "sdpa_packed", "HAVE_CUSTOM_OP"]

def _rt():
    return _package.runtime()


# regen.torch, which imports this module: runtime() is looked up per call
# (configure() replaces the runtime), and an import statement per call was
# a measurable part of a small one.
_package = sys.modules[__name__.rpartition(".")[0]]


def _empty(shape, dtype, like):
    if like.device.type == "cpu":
        return host_empty(shape, dtype)
    return torch.empty(shape, dtype=dtype, device=like.device)


def _contiguous(x):
    """x.contiguous(), telling the runtime first when that is a copy on the
    rank (see Runtime.rank_work)."""
    if x.is_contiguous():
        return x
    _rt().rank_work()
    return x.contiguous()


def _as_dtype(x, dtype):
    """x.to(dtype), telling the runtime first when that is a conversion on
    the rank."""
    if x.dtype == dtype:
        return x
    _rt().rank_work()
    return x.to(dtype)


def _gemm_input(x):
    """(tensor, transposed): ``x`` as regend's GEMM takes an operand
    (row-major with unit column stride), either itself or its transpose as a
    view of the same memory, with a copy only when neither is (a rank-side
    copy)."""
    r, c = x.shape
    s0, s1 = x.stride()
    if (s1 == 1 or c == 1) and (s0 >= c or r == 1):
        return x, False
    if (s0 == 1 or r == 1) and (s1 >= r or c == 1):
        return x.t(), True
    return _contiguous(x), False


_ONES_KEPT = 16
_ones: Dict[tuple, torch.Tensor] = {}


def _ones_row(m, like):
    """A [1, m] row of ones on ``like``'s device and dtype (kept for the
    next call of that size): a bias gradient, the column sums of a [m, n]
    gradient, is then one more GEMM in regend instead of rank work between
    two of its calls."""
    key = (like.device, like.dtype, m)
    row = _ones.get(key)
    if row is None:
        if len(_ones) >= _ONES_KEPT:
            _ones.pop(next(iter(_ones)))
        row = _empty([1, m], like.dtype, like)
        _rt().rank_work()
        row.fill_(1)
        _ones[key] = row
    return row


def _column_sums(grad):
    """grad.sum(0) of a 2-D gradient, computed in regend (f32 accumulation,
    as torch's sum of a bf16 or f16 tensor), through regen::mm (a backward
    torch.compile traces)."""
    return _raw_mm(_ones_row(grad.shape[0], grad), grad).view(-1)


def _column_sums_now(grad):
    """_column_sums without the custom op's dispatch (tens of µs a call on
    the rank), for code that calls regend's kernels directly anyway (the
    MLP's and the transformer blocks' backward)."""
    return _mm_kernel(_ones_row(grad.shape[0], grad), grad).view(-1)


def _probe_mode_off():
    """A context manager under which torch's Python function modes
    (regen.torch.enable()'s RegendMode, a debugging mode) do not see
    tensor operations, where this torch has one: torch._C.
    DisableTorchFunction turns modes off too on torch 2.x, not on 1.13
    (checked here once, with a mode of our own).  regen.torch's own runs
    of calls use it: every torch.empty, view and stride() inside them went
    through the mode's Python __torch_function__ otherwise (thousands a
    training step)."""
    import contextlib
    from torch.overrides import TorchFunctionMode
    disable = getattr(torch._C, "DisableTorchFunction", None)
    if disable is None:
        return contextlib.nullcontext
    seen = []

    class _Probe(TorchFunctionMode):
        def __torch_function__(self, func, types, args=(), kwargs=None):
            seen.append(func)
            return func(*args, **(kwargs or {}))
    try:
        with _Probe():
            with disable():
                torch.empty(0)
    except Exception:
        return contextlib.nullcontext
    return contextlib.nullcontext if seen else disable


_mode_off = _probe_mode_off()


def _last_unit(x):
    """Attention operands need unit stride in their last dimension."""
    return x if x.stride(-1) == 1 or x.shape[-1] == 1 else _contiguous(x)


# ---- kernels (run on real tensors) ------------------------------------------

def _gemm(a, b, out, epilogue=None, bias=None, aux=None, c=None, aux_out=None, trans_a=False, trans_b=False):
    """out = epilogue(op(a) @ op(b) (+ bias)) (+ c) in regend, a and b 2-D
    (views as regend takes them, a copy only where neither a tensor nor its
    transpose is one), op(x) x's transpose where ``trans_a`` (``trans_b``)
    says so: ``_gemm(x, w, out, trans_b=True)`` is ``_gemm(x, w.t(), out)``
    without the view w.t() and its undoing in _gemm_input (two torch calls
    per GEMM); ``c`` (out's shape and dtype): a residual added with beta 1;
    ``aux_out`` (out's shape and dtype): GELU's input, written by the
    gelu_aux epilogues."""
    aa, ta = _gemm_input(a)
    bb, tb = _gemm_input(b)
    ta, tb = ta != trans_a, tb != trans_b
    scalars = {"trans_a": ta, "trans_b": tb}
    if epilogue is not None:
        scalars["epilogue"] = epilogue
    if c is not None:
        scalars["beta"] = 1.0
    _rt().call("gemm", {"a": aa, "b": bb, "c": c, "d": out, "bias": None if bias is None else _contiguous(bias),
                        "aux": aux, "aux_out": aux_out}, scalars)
    return out


def _keeps_gelu_input(x, hidden):
    """Whether a GELU layer of ``hidden`` units on x's device may write its
    input ([rows, hidden], contiguous) from the GEMM's epilogue (gelu_aux)
    and read it there for the gradient (dgelu): cuBLASLt takes that
    matrix's rows a multiple of 8 elements apart."""
    return x.device.type != "cuda" or hidden % 8 == 0


def _mm_kernel(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    if a.dim() != 2 or b.dim() != 2 or a.shape[1] != b.shape[0]:
        raise ValueError(f"regen::mm takes [M, K] @ [K, N], got {list(a.shape)} @ {list(b.shape)}")
    if a.dtype != b.dtype:
        raise ValueError(f"regen::mm: dtypes differ ({a.dtype}, {b.dtype})")
    m, n = a.shape[0], b.shape[1]
    out = _empty([m, n], a.dtype, a)
    if m == 0 or n == 0:
        return out
    if a.shape[1] == 0:
        _rt().rank_work()
        return out.zero_()
    return _gemm(a, b, out)


_EPILOGUE = {("none", False): None, ("none", True): "bias", ("gelu", False): "gelu", ("gelu", True): "gelu_bias"}


def _linear_kernel(x: torch.Tensor, w: torch.Tensor, bias: Optional[torch.Tensor], activation: str) -> torch.Tensor:
    if x.dim() != 2 or w.dim() != 2 or x.shape[1] != w.shape[1]:
        raise ValueError(f"regen::linear takes x [M, K] and w [N, K], got {list(x.shape)}, {list(w.shape)}")
    if activation not in ("none", "gelu"):
        raise ValueError(f"regen::linear: activation {activation!r} is not 'none' or 'gelu'")
    if bias is not None and (bias.dim() != 1 or bias.shape[0] != w.shape[0]):
        raise ValueError(f"regen::linear: bias must be [{w.shape[0]}], got {list(bias.shape)}")
    m, n = x.shape[0], w.shape[0]
    out = _empty([m, n], x.dtype, x)
    if m == 0 or n == 0:
        return out
    if x.shape[1] == 0:
        out.zero_()
        if bias is not None:
            out += bias
        return torch.nn.functional.gelu(out, approximate="tanh") if activation == "gelu" else out
    return _gemm(x, w, out, _EPILOGUE[(activation, bias is not None)], bias, trans_b=True)


def _check_mlp(x, w1, b1, w2, b2):
    if x.dim() != 2 or w1.dim() != 2 or w2.dim() != 2 or x.shape[1] != w1.shape[1] or w2.shape[1] != w1.shape[0]:
        raise ValueError(f"regen::mlp takes x [M, K], w1 [H, K], w2 [N, H], got {list(x.shape)}, "
                         f"{list(w1.shape)}, {list(w2.shape)}")
    for name, b, w in (("b1", b1, w1), ("b2", b2, w2)):
        if b is not None and (b.dim() != 1 or b.shape[0] != w.shape[0]):
            raise ValueError(f"regen::mlp: {name} must be [{w.shape[0]}], got {list(b.shape)}")
    if len({x.dtype, w1.dtype, w2.dtype}) != 1:
        raise ValueError(f"regen::mlp: dtypes differ ({x.dtype}, {w1.dtype}, {w2.dtype})")


def _mlp_kernel(x: torch.Tensor, w1: torch.Tensor, b1: Optional[torch.Tensor], w2: torch.Tensor,
                b2: Optional[torch.Tensor]) -> Tuple[torch.Tensor, torch.Tensor]:
    """y = gelu(x @ w1.T + b1) @ w2.T + b2, and the hidden h = gelu(...),
    which the backward reads (as torch's down projection keeps its input):
    two GEMMs back to back in regend, GELU in the first one's epilogue."""
    _check_mlp(x, w1, b1, w2, b2)
    m = x.shape[0]
    h = _empty([m, w1.shape[0]], x.dtype, x)
    y = _empty([m, w2.shape[0]], x.dtype, x)
    if m == 0 or y.shape[1] == 0:
        return y, h
    if h.shape[1] == 0 or x.shape[1] == 0:
        # An empty inner dimension, which a GEMM cannot take: on the rank.
        h.copy_(torch.nn.functional.gelu(torch.nn.functional.linear(x, w1, b1), approximate="tanh"))
        y.copy_(torch.nn.functional.linear(h, w2, b2))
        return y, h
    with _rt().batch():
        _gemm(x, w1, h, _EPILOGUE[("gelu", b1 is not None)], b1, trans_b=True)
        _gemm(h, w2, y, _EPILOGUE[("none", b2 is not None)], b2, trans_b=True)
    return y, h


def _check_sdpa(q, k, v):
    if q.dim() != 4 or k.dim() != 4 or v.dim() != 4:
        raise ValueError("regen::sdpa takes q, k, v of 4 dimensions [B, H, S, D]")
    b, h, _, d = q.shape
    if k.shape[0] != b or v.shape[0] != b or k.shape[1] != v.shape[1] or k.shape[2] != v.shape[2] or k.shape[3] != d:
        raise ValueError(f"regen::sdpa: q {list(q.shape)}, k {list(k.shape)}, v {list(v.shape)} do not fit")
    if h % k.shape[1] != 0:
        raise ValueError(f"regen::sdpa: {h} query heads are not a multiple of {k.shape[1]} key/value heads")


def _attention_scalars(is_causal, scale):
    scalars = {"causal": bool(is_causal)}
    if is_causal:
        # torch's is_causal is the top-left aligned mask.
        scalars["causal_alignment"] = "top_left"
    if scale is not None:
        scalars["scale"] = float(scale)
    return scalars


def _sdpa_kernel(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, is_causal: bool,
                 scale: Optional[float]) -> Tuple[torch.Tensor, torch.Tensor]:
    _check_sdpa(q, k, v)
    b, h, sq, _ = q.shape
    # o [B, H, Sq, Dv] laid out as [B, Sq, H, Dv] (attention takes strides):
    # what a model does next, o.transpose(1, 2).reshape(B, Sq, H * Dv) for
    # the output projection, is then a view, not a copy on the rank between
    # two regend calls.
    o = _empty([b, sq, h, v.shape[3]], q.dtype, q).transpose(1, 2)
    lse = _empty([b, h, sq], torch.float32, q)
    if o.numel() == 0:
        return o, lse
    _rt().call("attention", {"q": _last_unit(q), "k": _last_unit(k), "v": _last_unit(v), "o": o, "stats": lse},
               _attention_scalars(is_causal, scale))
    return o, lse


def _sdpa_backward_kernel(grad: torch.Tensor, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, o: torch.Tensor,
                          lse: torch.Tensor, is_causal: bool,
                          scale: Optional[float]) -> Tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    _check_sdpa(q, k, v)
    dq = _empty(list(q.shape), q.dtype, q)
    dk = _empty(list(k.shape), k.dtype, k)
    dv = _empty(list(v.shape), v.dtype, v)
    if o.numel() == 0:
        _rt().rank_work()
        return dq.zero_(), dk.zero_(), dv.zero_()
    named = {"q": _last_unit(q), "k": _last_unit(k), "v": _last_unit(v), "o": _last_unit(o),
             "d_o": _last_unit(grad), "stats": _contiguous(lse), "d_q": dq, "d_k": dk, "d_v": dv}
    _rt().call("attention_backward", named, _attention_scalars(is_causal, scale))
    return dq, dk, dv


def _unpack_qkv(qkv, heads):
    """q, k, v [B, H, S, D] as views of a projection's output [B, S, 3 * H * D]
    (each [B, S, H, D] in memory): what attention reads in place."""
    b, s, w3 = qkv.shape
    if heads <= 0 or w3 % (3 * heads) != 0:
        raise ValueError(f"regen::sdpa_packed: {w3} features are not 3 x {heads} heads x a head size")
    parts = qkv.view(b, s, 3, heads, w3 // (3 * heads))
    return parts[:, :, 0].transpose(1, 2), parts[:, :, 1].transpose(1, 2), parts[:, :, 2].transpose(1, 2)


def _sdpa_packed_kernel(qkv: torch.Tensor, heads: int, is_causal: bool,
                        scale: Optional[float]) -> Tuple[torch.Tensor, torch.Tensor]:
    """Attention over a fused projection's output qkv [B, S, 3 * H * D]:
    o [B, S, H * D] (what the output projection reads) and the rows'
    log-sum-exp [B, H, S]. No copy on the rank before or after."""
    if qkv.dim() != 3 or qkv.stride(-1) != 1:
        raise ValueError(f"regen::sdpa_packed takes qkv [B, S, 3 * H * D] with unit last stride, got "
                         f"{list(qkv.shape)}")
    q, k, v = _unpack_qkv(qkv, heads)
    o, lse = _sdpa_kernel(q, k, v, is_causal, scale)
    return o.transpose(1, 2).reshape(qkv.shape[0], qkv.shape[1], -1), lse


def _sdpa_packed_backward(qkv, o, lse, grad, heads, is_causal, scale):
    """d(qkv) [B, S, 3 * H * D]: attention's backward writes dq, dk and dv
    into it in place (strided views), so the qkv projection's gradients
    follow with no rank work between (torch would stack three gradients)."""
    b, s, _ = qkv.shape
    q, k, v = _unpack_qkv(qkv, heads)
    dqkv = _empty(list(qkv.shape), qkv.dtype, qkv)
    dq, dk, dv = _unpack_qkv(dqkv, heads)
    d = q.shape[3]
    o4 = o.view(b, s, heads, d).transpose(1, 2)
    g4 = _contiguous(grad).view(b, s, heads, d).transpose(1, 2)
    named = {"q": q, "k": k, "v": v, "o": o4, "d_o": _last_unit(g4), "stats": _contiguous(lse),
             "d_q": dq, "d_k": dk, "d_v": dv}
    _rt().call("attention_backward", named, _attention_scalars(is_causal, scale))
    return dqkv


# ---- fake (meta) implementations: shapes only --------------------------------

def _mm_fake(a, b):
    return a.new_empty([a.shape[0], b.shape[1]])


def _linear_fake(x, w, bias, activation):
    return x.new_empty([x.shape[0], w.shape[0]])


def _sdpa_packed_fake(qkv, heads, is_causal, scale):
    b, s, w3 = qkv.shape
    return qkv.new_empty([b, s, w3 // 3]), qkv.new_empty([b, heads, s], dtype=torch.float32)


def _mlp_fake(x, w1, b1, w2, b2):
    return x.new_empty([x.shape[0], w2.shape[0]]), x.new_empty([x.shape[0], w1.shape[0]])


def _sdpa_fake(q, k, v, is_causal, scale):
    return q.new_empty([q.shape[0], q.shape[2], q.shape[1], v.shape[3]]).transpose(1, 2), \
        q.new_empty([q.shape[0], q.shape[1], q.shape[2]], dtype=torch.float32)


def _sdpa_backward_fake(grad, q, k, v, o, lse, is_causal, scale):
    return q.new_empty(q.shape), k.new_empty(k.shape), v.new_empty(v.shape)


# ---- backward formulas (shared by both registrations) ------------------------

def _mm_backward(needs, a, b, grad):
    ga = gb = None
    with _rt().batch():
        if needs[0]:
            ga = _raw_mm(grad, b.t())
        if needs[1]:
            gb = _raw_mm(a.t(), grad)
    return ga, gb


def _linear_backward(needs, x, w, bias, activation, grad):
    if activation == "gelu":
        # The pre-activation is recomputed in regend (the forward fused the
        # GELU into the GEMM and kept nothing): one GEMM more, no
        # activation memory held from the forward.
        z = _raw_linear(x, w, bias, "none")
        grad = torch.ops.aten.gelu_backward(grad, z, approximate="tanh")
    gx = gw = gb = None
    with _rt().batch():
        if needs[0]:
            gx = _raw_mm(grad, w)
        if needs[1]:
            gw = _raw_mm(grad.t(), x)
        if bias is not None and needs[2]:
            gb = _as_dtype(_column_sums(grad), bias.dtype)
    return gx, gw, gb


def _mlp_backward(needs, x, w1, b1, w2, b2, h, grad, z=None):
    """All of the MLP's gradients in regend, one run of calls with no rank
    work between them: the pre-activation z (recomputed, a GEMM, unless the
    forward kept it: ``z``), w2's and b2's gradients, dz = (grad @ w2) *
    GELU'(z) with GELU's gradient in the GEMM's epilogue (dgelu), then x's,
    w1's and b1's gradients."""
    gx = gw1 = gb1 = gw2 = gb2 = None
    m = x.shape[0]
    if m == 0 or h.shape[1] == 0 or x.shape[1] == 0 or grad.shape[1] == 0:
        return _mlp_backward_in_torch(needs, x, w1, b1, w2, b2, grad)
    with _rt().batch():
        if needs[3]:
            gw2 = _gemm(grad, h, _empty(list(w2.shape), w2.dtype, w2), trans_a=True)
        if b2 is not None and needs[4]:
            gb2 = _as_dtype(_column_sums_now(grad), b2.dtype)
        if needs[0] or needs[1] or (b1 is not None and needs[2]):
            if z is None:
                z = _gemm(x, w1, _empty([m, w1.shape[0]], x.dtype, x), _EPILOGUE[("none", b1 is not None)],
                          b1, trans_b=True)
            if not _keeps_gelu_input(x, w1.shape[0]):
                # cuBLASLt's DGELU takes aux rows a multiple of 8 elements
                # apart, as GELU_AUX writes them: GELU's gradient on the
                # rank for this width.
                dh = _gemm(grad, w2, _empty([m, w1.shape[0]], x.dtype, x))
                _rt().rank_work()
                dz = torch.ops.aten.gelu_backward(dh, z, approximate="tanh")
            else:
                dz = _gemm(grad, w2, _empty([m, w1.shape[0]], x.dtype, x), "dgelu", aux=z)
            if needs[0]:
                gx = _gemm(dz, w1, _empty(list(x.shape), x.dtype, x))
            if needs[1]:
                gw1 = _gemm(dz, x, _empty(list(w1.shape), w1.dtype, w1), trans_a=True)
            if b1 is not None and needs[2]:
                gb1 = _as_dtype(_column_sums_now(dz), b1.dtype)
    return gx, gw1, gb1, gw2, gb2


def _mlp_backward_in_torch(needs, x, w1, b1, w2, b2, grad):
    """The degenerate shapes (an empty dimension) the GEMMs cannot take."""
    with torch.enable_grad():
        leaves = [t.detach().requires_grad_(bool(n)) if t is not None else None
                  for t, n in zip((x, w1, b1, w2, b2), needs)]
        lx, lw1, lb1, lw2, lb2 = leaves
        y = torch.nn.functional.linear(torch.nn.functional.gelu(torch.nn.functional.linear(lx, lw1, lb1),
                                                                approximate="tanh"), lw2, lb2)
        want = [t for t in leaves if t is not None and t.requires_grad]
        got = iter(torch.autograd.grad(y, want, grad, allow_unused=True)) if want else iter(())
    return tuple(next(got) if t is not None and t.requires_grad else None for t in leaves)


# ---- registration --------------------------------------------------------------

HAVE_CUSTOM_OP = hasattr(torch.library, "custom_op") and hasattr(torch.library, "register_fake")

if HAVE_CUSTOM_OP:
    # Typed as Any: torch < 2.4's stubs have no custom_op.
    _custom_op: Any = getattr(torch.library, "custom_op")
    _mm_op = _custom_op("regen::mm", _mm_kernel, mutates_args=())
    _linear_op = _custom_op("regen::linear", _linear_kernel, mutates_args=())
    _sdpa_op = _custom_op("regen::sdpa", _sdpa_kernel, mutates_args=())
    _mlp_op = _custom_op("regen::mlp", _mlp_kernel, mutates_args=())
    _sdpa_packed_op = _custom_op("regen::sdpa_packed", _sdpa_packed_kernel, mutates_args=())
    _sdpa_backward_op = _custom_op("regen::sdpa_backward", _sdpa_backward_kernel, mutates_args=())
    _mm_op.register_fake(_mm_fake)
    _linear_op.register_fake(_linear_fake)
    _sdpa_op.register_fake(_sdpa_fake)
    _mlp_op.register_fake(_mlp_fake)
    _sdpa_packed_op.register_fake(_sdpa_packed_fake)
    _sdpa_backward_op.register_fake(_sdpa_backward_fake)

    def _mm_setup(ctx, inputs, output):
        ctx.save_for_backward(*inputs)

    def _mm_bwd(ctx, grad):
        a, b = ctx.saved_tensors
        return _mm_backward(ctx.needs_input_grad, a, b, grad)

    def _linear_setup(ctx, inputs, output):
        x, w, bias, activation = inputs
        ctx.activation = activation
        ctx.has_bias = bias is not None
        ctx.save_for_backward(x, w, bias)

    def _linear_bwd(ctx, grad):
        x, w, bias = ctx.saved_tensors
        gx, gw, gb = _linear_backward(ctx.needs_input_grad, x, w, bias if ctx.has_bias else None,
                                      ctx.activation, grad)
        return gx, gw, gb, None

    def _sdpa_packed_setup(ctx, inputs, output):
        qkv, heads, is_causal, scale = inputs
        ctx.heads, ctx.is_causal, ctx.scale = heads, is_causal, scale
        ctx.save_for_backward(qkv, output[0], output[1])

    def _sdpa_packed_bwd(ctx, grad_o, grad_lse):
        qkv, o, lse = ctx.saved_tensors
        return _sdpa_packed_backward(qkv, o, lse, grad_o, ctx.heads, ctx.is_causal, ctx.scale), None, None, None

    def _mlp_setup(ctx, inputs, output):
        x, w1, b1, w2, b2 = inputs
        ctx.has_b1, ctx.has_b2 = b1 is not None, b2 is not None
        ctx.save_for_backward(x, w1, b1, w2, b2, output[1])

    def _mlp_bwd(ctx, grad_y, grad_h):
        x, w1, b1, w2, b2, h = ctx.saved_tensors
        return _mlp_backward(ctx.needs_input_grad, x, w1, b1 if ctx.has_b1 else None, w2, b2 if ctx.has_b2 else None,
                             h, grad_y)

    def _sdpa_setup(ctx, inputs, output):
        q, k, v, is_causal, scale = inputs
        o, lse = output
        ctx.is_causal, ctx.scale = is_causal, scale
        ctx.save_for_backward(q, k, v, o, lse)

    def _sdpa_bwd(ctx, grad_o, grad_lse):
        q, k, v, o, lse = ctx.saved_tensors
        dq, dk, dv = _sdpa_backward_op(grad_o, q, k, v, o, lse, ctx.is_causal, ctx.scale)
        return dq, dk, dv, None, None

    _mm_op.register_autograd(_mm_bwd, setup_context=_mm_setup)
    _linear_op.register_autograd(_linear_bwd, setup_context=_linear_setup)
    _sdpa_op.register_autograd(_sdpa_bwd, setup_context=_sdpa_setup)
    _mlp_op.register_autograd(_mlp_bwd, setup_context=_mlp_setup)
    _sdpa_packed_op.register_autograd(_sdpa_packed_bwd, setup_context=_sdpa_packed_setup)

    def sdpa_packed(qkv, heads, is_causal, scale):
        return _sdpa_packed_op(qkv, heads, is_causal, scale)[0]

    def mlp2d(x, w1, b1, w2, b2):
        return _mlp_op(x, w1, b1, w2, b2)[0]

    def _raw_mm(a, b):
        return _mm_op(a, b)

    def _raw_linear(x, w, bias, activation):
        return _linear_op(x, w, bias, activation)

    mm = _mm_op
    linear2d = _linear_op

    def sdpa(q, k, v, is_causal, scale):
        return _sdpa_op(q, k, v, is_causal, scale)

    sdpa_backward = _sdpa_backward_op
else:
    _lib = torch.library.Library("regen", "DEF")
    _lib.define("mm(Tensor a, Tensor b) -> Tensor")
    _lib.define("linear(Tensor x, Tensor w, Tensor? bias, str activation) -> Tensor")
    _lib.define("sdpa(Tensor q, Tensor k, Tensor v, bool is_causal, float? scale) -> (Tensor, Tensor)")
    _lib.define("sdpa_backward(Tensor grad, Tensor q, Tensor k, Tensor v, Tensor o, Tensor lse, bool is_causal, "
                "float? scale) -> (Tensor, Tensor, Tensor)")
    _lib.define("mlp(Tensor x, Tensor w1, Tensor? b1, Tensor w2, Tensor? b2) -> (Tensor, Tensor)")
    _lib.define("sdpa_packed(Tensor qkv, int heads, bool is_causal, float? scale) -> (Tensor, Tensor)")
    for _name, _kernel, _fake in (("mm", _mm_kernel, _mm_fake), ("linear", _linear_kernel, _linear_fake),
                                  ("sdpa", _sdpa_kernel, _sdpa_fake),
                                  ("sdpa_backward", _sdpa_backward_kernel, _sdpa_backward_fake),
                                  ("mlp", _mlp_kernel, _mlp_fake),
                                  ("sdpa_packed", _sdpa_packed_kernel, _sdpa_packed_fake)):
        _lib.impl(_name, _kernel, "CPU")
        _lib.impl(_name, _kernel, "CUDA")
        _lib.impl(_name, _fake, "Meta")

    def _raw_mm(a, b):
        return torch.ops.regen.mm(a, b)

    def _raw_linear(x, w, bias, activation):
        return torch.ops.regen.linear(x, w, bias, activation)

    class _MM(torch.autograd.Function):
        @staticmethod
        def forward(ctx, a, b):
            ctx.save_for_backward(a, b)
            return torch.ops.regen.mm(a, b)

        @staticmethod
        def backward(ctx, grad):
            a, b = ctx.saved_tensors
            return _mm_backward(ctx.needs_input_grad, a, b, grad)

    class _Linear(torch.autograd.Function):
        @staticmethod
        def forward(ctx, x, w, bias, activation):
            ctx.activation = activation
            ctx.has_bias = bias is not None
            ctx.save_for_backward(x, w, bias)
            return torch.ops.regen.linear(x, w, bias, activation)

        @staticmethod
        def backward(ctx, grad):
            x, w, bias = ctx.saved_tensors
            gx, gw, gb = _linear_backward(ctx.needs_input_grad, x, w, bias if ctx.has_bias else None,
                                          ctx.activation, grad)
            return gx, gw, gb, None

    class _MLP(torch.autograd.Function):
        @staticmethod
        def forward(ctx, x, w1, b1, w2, b2):
            ctx.has_b1, ctx.has_b2 = b1 is not None, b2 is not None
            y, h = torch.ops.regen.mlp(x, w1, b1, w2, b2)
            ctx.save_for_backward(x, w1, b1, w2, b2, h)
            return y

        @staticmethod
        def backward(ctx, grad):
            x, w1, b1, w2, b2, h = ctx.saved_tensors
            return _mlp_backward(ctx.needs_input_grad, x, w1, b1 if ctx.has_b1 else None, w2,
                                 b2 if ctx.has_b2 else None, h, grad)

    def mlp2d(x, w1, b1, w2, b2):
        return _MLP.apply(x, w1, b1, w2, b2)

    class _SDPAPacked(torch.autograd.Function):
        @staticmethod
        def forward(ctx, qkv, heads, is_causal, scale):
            o, lse = torch.ops.regen.sdpa_packed(qkv, heads, is_causal, scale)
            ctx.heads, ctx.is_causal, ctx.scale = heads, is_causal, scale
            ctx.save_for_backward(qkv, o, lse)
            return o

        @staticmethod
        def backward(ctx, grad):
            qkv, o, lse = ctx.saved_tensors
            return _sdpa_packed_backward(qkv, o, lse, grad, ctx.heads, ctx.is_causal, ctx.scale), None, None, None

    def sdpa_packed(qkv, heads, is_causal, scale):
        return _SDPAPacked.apply(qkv, heads, is_causal, scale)

    class _SDPA(torch.autograd.Function):
        @staticmethod
        def forward(ctx, q, k, v, is_causal, scale):
            o, lse = torch.ops.regen.sdpa(q, k, v, is_causal, scale)
            ctx.is_causal, ctx.scale = is_causal, scale
            ctx.save_for_backward(q, k, v, o, lse)
            ctx.mark_non_differentiable(lse)
            return o, lse

        @staticmethod
        def backward(ctx, grad_o, grad_lse):
            q, k, v, o, lse = ctx.saved_tensors
            dq, dk, dv = torch.ops.regen.sdpa_backward(grad_o, q, k, v, o, lse, ctx.is_causal, ctx.scale)
            return dq, dk, dv, None, None

    def mm(a, b):
        return _MM.apply(a, b)

    def linear2d(x, w, bias, activation):
        return _Linear.apply(x, w, bias, activation)

    def sdpa(q, k, v, is_causal, scale):
        return _SDPA.apply(q, k, v, is_causal, scale)

    def sdpa_backward(grad, q, k, v, o, lse, is_causal, scale):
        return torch.ops.regen.sdpa_backward(grad, q, k, v, o, lse, is_causal, scale)


# ---- the public functions (torch's signatures) ------------------------------------

_Function = TypeVar("_Function", bound=Callable[..., Any])


def _autocasting(op: str, *names: str) -> Callable[[_Function], _Function]:
    """The public function's tensor arguments ``names`` as torch's autocast
    would hand torch's ``op`` its own (regen/torch/_autocast.py), and the
    function run with autocast off; nothing changes where autocast is off
    for the first argument's device type."""
    import functools
    import inspect

    def wrap(fn: _Function) -> _Function:
        signature = inspect.signature(fn)

        @functools.wraps(fn)
        def run(*args: Any, **kwargs: Any) -> Any:
            first = args[0] if args else kwargs.get(names[0])
            if not isinstance(first, torch.Tensor) or not _autocast.state(first.device.type)[0]:
                return fn(*args, **kwargs)
            bound = signature.bind(*args, **kwargs)
            given = [bound.arguments.get(n) for n in names]
            for n, t in zip(names, _autocast.cast(op, *given)):
                if n in bound.arguments:
                    bound.arguments[n] = t
            with _autocast.off(first.device.type):
                return fn(*bound.args, **bound.kwargs)
        return run  # type: ignore[return-value]
    return wrap


@_autocasting("matmul", "a", "b")
def matmul(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """torch.matmul through regend: 1-D and 2-D operands, and a left
    operand of any rank against a 2-D right one (its leading dimensions
    flattened into one GEMM).  A batched right operand raises NotSupported."""
    if a.dim() == 0 or b.dim() == 0:
        raise ValueError("matmul: both arguments need at least 1 dimension")
    if b.dim() == 1:
        return matmul(a, b.unsqueeze(-1)).squeeze(-1)
    if a.dim() == 1:
        return matmul(a.unsqueeze(0), b).squeeze(-2)
    if b.dim() > 2:
        raise NotSupported(parameters={"message": "regen.torch.matmul: a batched right operand "
                                       f"{list(b.shape)} is not supported (regend's GEMM is 2-D)"})
    if a.dim() == 2:
        return mm(a, b)
    lead = a.shape[:-1]
    return mm(a.reshape(-1, a.shape[-1]), b).reshape(*lead, b.shape[-1])


@_autocasting("linear", "x", "weight", "bias")
def linear(x: torch.Tensor, weight: torch.Tensor, bias: Optional[torch.Tensor] = None,
           activation: Optional[str] = None) -> torch.Tensor:
    """F.linear through regend (y = x @ weight.T + bias), with an optional
    fused activation: "gelu" (tanh approximation, F.gelu(approximate="tanh"))."""
    activation = activation or "none"
    if x.dim() == 0:
        raise ValueError("linear: input needs at least 1 dimension")
    if x.dim() == 1:
        return linear(x.unsqueeze(0), weight, bias, activation).squeeze(0)
    lead = x.shape[:-1]
    out = linear2d(x.reshape(-1, x.shape[-1]), weight, bias, activation)
    return out.reshape(*lead, weight.shape[0])


@_autocasting("linear", "x", "w1", "b1", "w2", "b2")
def mlp(x: torch.Tensor, w1: torch.Tensor, b1: Optional[torch.Tensor], w2: torch.Tensor,
        b2: Optional[torch.Tensor]) -> torch.Tensor:
    """A transformer's MLP, F.linear(F.gelu(F.linear(x, w1, b1),
    approximate="tanh"), w2, b2), as one operation: forward two GEMMs with
    GELU in the first one's epilogue, backward all five gradients in regend
    with GELU's gradient in a GEMM's epilogue, so no rank work falls between
    its calls (one hand-off each way instead of two or three).  b1, b2 may
    be None; x of any rank, its last dimension the features."""
    if x.dim() == 0:
        raise ValueError("mlp: input needs at least 1 dimension")
    if x.dim() == 1:
        return mlp(x.unsqueeze(0), w1, b1, w2, b2).squeeze(0)
    lead = x.shape[:-1]
    return mlp2d(x.reshape(-1, x.shape[-1]), w1, b1, w2, b2).reshape(*lead, w2.shape[0])


@_autocasting("sdpa_packed", "qkv")
def attention_packed(qkv: torch.Tensor, heads: int, is_causal: bool = False,
                     scale: Optional[float] = None) -> torch.Tensor:
    """Attention over a fused qkv projection's output [B, S, 3 * H * D]
    (q, k and v side by side in its last dimension, each H heads of D, as
    ``proj(x).view(B, S, 3, H, D)`` splits it), returning [B, S, H * D]:
    F.scaled_dot_product_attention(q, k, v) with q, k, v [B, H, S, D] taken
    from it, transposed back and flattened for the output projection.  No
    copy on the rank either way: the backward writes q's, k's and v's
    gradients straight into qkv's."""
    if qkv.dim() != 3:
        raise ValueError(f"attention_packed: qkv must be [B, S, 3 * H * D], got {list(qkv.shape)}")
    if qkv.stride(-1) != 1:
        qkv = qkv.contiguous()
    return sdpa_packed(qkv, int(heads), bool(is_causal), None if scale is None else float(scale))


@_autocasting("sdpa", "query", "key", "value")
def scaled_dot_product_attention(query: torch.Tensor, key: torch.Tensor, value: torch.Tensor,
                                 attn_mask: Optional[torch.Tensor] = None, dropout_p: float = 0.0,
                                 is_causal: bool = False, scale: Optional[float] = None,
                                 enable_gqa: bool = False) -> torch.Tensor:
    """F.scaled_dot_product_attention through regend (cuDNN's fused flash
    attention on the CUDA backend): q [B, H, Sq, D], k [B, Hkv, Skv, D],
    v [B, Hkv, Skv, Dv].  No attn_mask and no dropout (NotSupported);
    grouped-query heads with enable_gqa=True, as torch."""
    if attn_mask is not None:
        raise NotSupported(parameters={"message": "regen.torch: attn_mask is not supported (use is_causal)"})
    if dropout_p:
        raise NotSupported(parameters={"message": "regen.torch: dropout_p must be 0"})
    if query.dim() != 4:
        raise NotSupported(parameters={"message": f"regen.torch: attention takes 4-D [B, H, S, D] tensors, "
                                       f"got {query.dim()}-D"})
    if key.shape[1] != query.shape[1] and not enable_gqa:
        raise ValueError(f"scaled_dot_product_attention: {query.shape[1]} query heads and {key.shape[1]} key heads "
                         "need enable_gqa=True")
    o, _ = sdpa(query, key, value, bool(is_causal), None if scale is None else float(scale))
    return o


def default_scale(d):
    return 1.0 / math.sqrt(d)
