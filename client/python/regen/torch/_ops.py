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
from typing import Optional, Tuple

import torch

from ._runtime import NotSupported, host_empty

__all__ = ["mm", "linear2d", "sdpa", "sdpa_backward", "HAVE_CUSTOM_OP"]

_runtime = None


def _rt():
    from . import runtime
    return runtime()


def _empty(shape, dtype, like):
    if like.device.type == "cpu":
        return host_empty(shape, dtype)
    return torch.empty(shape, dtype=dtype, device=like.device)


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
    return x.contiguous(), False


_ONES_KEPT = 16
_ones = {}


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
        row = _empty([1, m], like.dtype, like).fill_(1)
        _ones[key] = row
    return row


def _column_sums(grad):
    """grad.sum(0) of a 2-D gradient, computed in regend (f32 accumulation,
    as torch's sum of a bf16 or f16 tensor)."""
    return _raw_mm(_ones_row(grad.shape[0], grad), grad).view(-1)


def _last_unit(x):
    """Attention operands need unit stride in their last dimension."""
    return x if x.stride(-1) == 1 or x.shape[-1] == 1 else x.contiguous()


# ---- kernels (run on real tensors) ------------------------------------------

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
        return out.zero_()
    aa, ta = _gemm_input(a)
    bb, tb = _gemm_input(b)
    _rt().call("gemm", {"a": aa, "b": bb, "d": out}, {"trans_a": ta, "trans_b": tb})
    return out


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
    xx, tx = _gemm_input(x)
    ww, tw = _gemm_input(w)
    scalars = {"trans_a": tx, "trans_b": not tw}
    epilogue = _EPILOGUE[(activation, bias is not None)]
    if epilogue is not None:
        scalars["epilogue"] = epilogue
    _rt().call("gemm", {"a": xx, "b": ww, "d": out, "bias": None if bias is None else bias.contiguous()}, scalars)
    return out


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
        return dq.zero_(), dk.zero_(), dv.zero_()
    named = {"q": _last_unit(q), "k": _last_unit(k), "v": _last_unit(v), "o": _last_unit(o),
             "d_o": _last_unit(grad), "stats": lse.contiguous(), "d_q": dq, "d_k": dk, "d_v": dv}
    _rt().call("attention_backward", named, _attention_scalars(is_causal, scale))
    return dq, dk, dv


# ---- fake (meta) implementations: shapes only --------------------------------

def _mm_fake(a, b):
    return a.new_empty([a.shape[0], b.shape[1]])


def _linear_fake(x, w, bias, activation):
    return x.new_empty([x.shape[0], w.shape[0]])


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
            gb = _column_sums(grad).to(bias.dtype)
    return gx, gw, gb


# ---- registration --------------------------------------------------------------

HAVE_CUSTOM_OP = hasattr(torch.library, "custom_op") and hasattr(torch.library, "register_fake")

if HAVE_CUSTOM_OP:
    _mm_op = torch.library.custom_op("regen::mm", _mm_kernel, mutates_args=())
    _linear_op = torch.library.custom_op("regen::linear", _linear_kernel, mutates_args=())
    _sdpa_op = torch.library.custom_op("regen::sdpa", _sdpa_kernel, mutates_args=())
    _sdpa_backward_op = torch.library.custom_op("regen::sdpa_backward", _sdpa_backward_kernel, mutates_args=())
    _mm_op.register_fake(_mm_fake)
    _linear_op.register_fake(_linear_fake)
    _sdpa_op.register_fake(_sdpa_fake)
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
    for _name, _kernel, _fake in (("mm", _mm_kernel, _mm_fake), ("linear", _linear_kernel, _linear_fake),
                                  ("sdpa", _sdpa_kernel, _sdpa_fake),
                                  ("sdpa_backward", _sdpa_backward_kernel, _sdpa_backward_fake)):
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

def matmul(a, b):
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


def linear(x, weight, bias=None, activation=None):
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


def scaled_dot_product_attention(query, key, value, attn_mask=None, dropout_p=0.0, is_causal=False, scale=None,
                                 enable_gqa=False):
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
