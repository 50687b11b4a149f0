# SPDX-License-Identifier: Apache-2.0
"""A pre-LayerNorm transformer block as one regen.torch operation:

    h = x + proj(attention(qkv(ln1(x))))
    y = h + down(gelu(up(ln2(h))))

Forward and backward each run as one batch of regend calls with no rank
work between them: the LayerNorms run in regend (io.regen.Compute.LayerNorm
and LayerNormBackward), the residual adds ride in the projections' GEMMs
(C = the residual, beta 1) going forward and in LayerNormBackward's
d_residual going back, GELU and its gradient in GEMM epilogues, attention
reads q, k, v in place from the qkv projection's output and writes their
gradients in place.  So a block costs one hand-off each way (two context
switches) where its parts as separate operations cost four or more, with
a LayerNorm and a residual add on the rank between each.

The saved activations are those autograd would keep for the same layers:
x, ln1's output and statistics, qkv, attention's output and log-sum-exp,
h, ln2's output and statistics, GELU's input and its output.  GELU's input
comes from the up projection's epilogue (gelu_aux_bias) beside its output,
so the backward does not compute it again; where cuBLASLt cannot write it (a
hidden width off 8 on CUDA) it is recomputed there (one GEMM), as rt.mlp
does.
"""

from typing import Sequence

import torch

from . import _autocast
from ._ops import (_column_sums_now, _empty, _gemm, _keeps_gelu_input, _mlp_backward, _mode_off, _rt,
                   _sdpa_packed_backward, _sdpa_packed_kernel)

__all__ = ["transformer_block", "transformer_blocks", "BLOCK_PARAMETERS"]

# The parameters, in the order transformer_block takes them.
BLOCK_PARAMETERS = ("ln1_weight", "ln1_bias", "qkv_weight", "qkv_bias", "proj_weight", "proj_bias",
                    "ln2_weight", "ln2_bias", "up_weight", "up_bias", "down_weight", "down_bias")
# What a layer's forward keeps for its backward (_forward_layer's second result).
_SAVED = 13


def _layer_norm(x, weight, bias, eps):
    """(y, mean, rstd) of LayerNorm over x's rows, in regend."""
    rows = x.shape[0]
    y = _empty(list(x.shape), x.dtype, x)
    mean = _empty([rows], torch.float32, x)
    rstd = _empty([rows], torch.float32, x)
    _rt().call("layer_norm", {"x": x, "weight": weight, "bias": bias, "y": y, "mean": mean, "rstd": rstd},
               {"eps": float(eps)})
    return y, mean, rstd


def _layer_norm_backward(d_y, x, weight, mean, rstd, d_residual, needs_weight, needs_bias):
    """(d_x, d_weight, d_bias): LayerNorm's gradients, d_residual added to
    d_x in the same call."""
    d_x = _empty(list(x.shape), x.dtype, x)
    d_w = _empty(list(weight.shape), weight.dtype, weight) if needs_weight else None
    d_b = _empty(list(weight.shape), weight.dtype, weight) if needs_bias else None
    _rt().call("layer_norm_backward", {"d_y": d_y, "x": x, "weight": weight, "mean": mean, "rstd": rstd,
                                       "d_x": d_x, "d_weight": d_w, "d_bias": d_b, "d_residual": d_residual}, {})
    return d_x, d_w, d_b


def _check(x, layers, heads):
    """Refuses, before any work, what the blocks cannot take: ``layers`` is
    a sequence of each block's 12 parameters."""
    if x.dim() != 3:
        raise ValueError(f"transformer_block: x must be [B, S, W], got {list(x.shape)}")
    w = x.shape[2]
    if heads <= 0 or w % heads != 0:
        raise ValueError(f"transformer_block: width {w} is not a multiple of {heads} heads")
    dtype, device = x.dtype, x.device
    for params in layers:
        if len(params) != len(BLOCK_PARAMETERS):
            raise ValueError(f"transformer_blocks: a layer takes {len(BLOCK_PARAMETERS)} parameters "
                             f"({', '.join(BLOCK_PARAMETERS)}), got {len(params)}")
        hidden = params[8].shape[0] if params[8].dim() == 2 else -1
        want = ((w,), (w,), (3 * w, w), (3 * w,), (w, w), (w,), (w,), (w,), (hidden, w), (hidden,), (w, hidden),
                (w,))
        for name, p, shape in zip(BLOCK_PARAMETERS, params, want):
            if p.shape != shape:
                raise ValueError(f"transformer_block: {name} must be {list(shape)}, got {list(p.shape)}")
            if p.dtype != dtype or p.device != device:
                raise ValueError(f"transformer_block: {name} is {p.dtype} on {p.device}, x {dtype} on {device}")


def _forward_layer(x2d, params, heads, eps, b, s, w):
    """One block's forward calls (inside the caller's batch): its output
    [b * s, w] and what its backward reads."""
    ln1_w, ln1_b, qkv_w, qkv_b, proj_w, proj_b, ln2_w, ln2_b, up_w, up_b, down_w, down_b = params
    a1, mean1, rstd1 = _layer_norm(x2d, ln1_w, ln1_b, eps)
    qkv = _gemm(a1, qkv_w, _empty([b * s, 3 * w], x2d.dtype, x2d), "bias", qkv_b, trans_b=True)
    o, lse = _sdpa_packed_kernel(qkv.view(b, s, 3 * w), heads, True, None)
    o2d = o.view(b * s, w)
    h = _gemm(o2d, proj_w, _empty([b * s, w], x2d.dtype, x2d), "bias", proj_b, c=x2d, trans_b=True)
    a2, mean2, rstd2 = _layer_norm(h, ln2_w, ln2_b, eps)
    hidden = up_w.shape[0]
    u = _empty([b * s, hidden], x2d.dtype, x2d)
    if _keeps_gelu_input(x2d, hidden):
        z = _empty([b * s, hidden], x2d.dtype, x2d)
        _gemm(a2, up_w, u, "gelu_aux_bias", up_b, aux_out=z, trans_b=True)
    else:
        z = None
        _gemm(a2, up_w, u, "gelu_bias", up_b, trans_b=True)
    y = _gemm(u, down_w, _empty([b * s, w], x2d.dtype, x2d), "bias", down_b, c=h, trans_b=True)
    return y, (x2d, a1, mean1, rstd1, qkv, o2d, lse, h, a2, mean2, rstd2, u, z)


def _backward_layer(g, saved, params, heads, b, s, w):
    """One block's backward calls (inside the caller's batch) for the
    gradient g [b * s, w] of its output: (d_x, the 12 parameters'
    gradients)."""
    x2d, a1, mean1, rstd1, qkv, o2d, lse, h, a2, mean2, rstd2, u, z = saved
    ln1_w, ln1_b, qkv_w, qkv_b, proj_w, proj_b, ln2_w, ln2_b, up_w, up_b, down_w, down_b = params
    rows = b * s
    out = [None] * 12
    # The MLP's gradients, as rt.mlp's backward takes them (GELU's input as
    # the forward kept it, its gradient in a GEMM's epilogue).
    d_a2, out[8], out[9], out[10], out[11] = _mlp_backward((True,) * 5, a2, up_w, up_b, down_w, down_b, u, g, z)
    # ln2, the residual's gradient (g) added in the same call.
    d_h, out[6], out[7] = _layer_norm_backward(d_a2, h, ln2_w, mean2, rstd2, g, True, True)
    # The projection, attention (dq, dk, dv into one d_qkv), qkv.
    out[4] = _gemm(d_h, o2d, _empty(list(proj_w.shape), proj_w.dtype, proj_w), trans_a=True)
    out[5] = _column_sums_now(d_h)
    d_o = _gemm(d_h, proj_w, _empty([rows, w], h.dtype, h))
    d_qkv = _sdpa_packed_backward(qkv.view(b, s, 3 * w), o2d.view(b, s, w), lse, d_o.view(b, s, w),
                                  heads, True, None).view(rows, 3 * w)
    out[2] = _gemm(d_qkv, a1, _empty(list(qkv_w.shape), qkv_w.dtype, qkv_w), trans_a=True)
    out[3] = _column_sums_now(d_qkv)
    d_a1 = _gemm(d_qkv, qkv_w, _empty([rows, w], a1.dtype, a1))
    # ln1, h's gradient (the residual) added in the same call.
    d_x, out[0], out[1] = _layer_norm_backward(d_a1, x2d, ln1_w, mean1, rstd1, d_h, True, True)
    return d_x, out


class _Blocks(torch.autograd.Function):
    """``layers`` blocks in a row (12 parameters each, flat), each way one
    run of regend calls: the rank's thread waits once for the worker's
    answers where it would wait once a layer."""

    @staticmethod
    def forward(ctx, x, heads, eps, layers, *params):
        # All of it with function modes off: every tensor access here would
        # pass through rt.enable()'s Python __torch_function__ otherwise.
        with _mode_off():
            b, s, w = x.shape
            y = x.contiguous().view(b * s, w)
            params = [p.contiguous() for p in params]
            saved = []
            with _rt().batch():
                for i in range(layers):
                    y, kept = _forward_layer(y, params[12 * i:12 * i + 12], heads, eps, b, s, w)
                    saved.extend(kept)
            ctx.heads, ctx.shape, ctx.layers = heads, (b, s, w), layers
            ctx.save_for_backward(*saved, *params)
            return y.view(b, s, w)

    @staticmethod
    def backward(ctx, grad):
        with _mode_off():
            tensors = ctx.saved_tensors
            layers = ctx.layers
            saved, params = tensors[:_SAVED * layers], tensors[_SAVED * layers:]
            b, s, w = ctx.shape
            g = grad.contiguous().view(b * s, w)
            grads = [None] * (12 * layers)
            with _rt().batch():
                for i in reversed(range(layers)):
                    g, grads[12 * i:12 * i + 12] = _backward_layer(g, saved[_SAVED * i:_SAVED * i + _SAVED],
                                                                   params[12 * i:12 * i + 12], ctx.heads, b, s, w)
            needs = ctx.needs_input_grad[4:]
            return (g.view(b, s, w), None, None, None, *[gp if n else None for gp, n in zip(grads, needs)])


def transformer_block(x: torch.Tensor, ln1_weight: torch.Tensor, ln1_bias: torch.Tensor, qkv_weight: torch.Tensor,
                      qkv_bias: torch.Tensor, proj_weight: torch.Tensor, proj_bias: torch.Tensor,
                      ln2_weight: torch.Tensor, ln2_bias: torch.Tensor, up_weight: torch.Tensor,
                      up_bias: torch.Tensor, down_weight: torch.Tensor, down_bias: torch.Tensor, heads: int,
                      eps: float = 1e-5) -> torch.Tensor:
    """A pre-LayerNorm GPT block (causal attention over ``heads`` heads,
    GELU with the tanh approximation) on x [B, S, W], forward and backward
    each as one run of regend calls (one hand-off each way).  The weights
    are nn.Linear's ([out, in]) and nn.LayerNorm's, all of x's dtype and
    device."""
    params = (ln1_weight, ln1_bias, qkv_weight, qkv_bias, proj_weight, proj_bias, ln2_weight, ln2_bias,
              up_weight, up_bias, down_weight, down_bias)
    return _run_blocks(x, [params], heads, eps)


def _run_blocks(x, layers, heads, eps):
    """The blocks' one autograd node, inside torch.autocast with x and
    every parameter in the dtype autocast gives a linear layer there (the
    blocks' GEMMs; LayerNorm's statistics are f32 in regend either way), so
    the output is in that dtype too, where torch's unfused layers would
    give float32 from a residual sum that promotes."""
    device_type = x.device.type
    if _autocast.state(device_type)[0]:
        dtype = _autocast.compute_dtype("linear", x, layers[0][2], layers[0][3])
        if dtype is not None:
            x, layers = _autocast.cast_to(dtype, x), [_autocast.cast_to(dtype, *params) for params in layers]
        with _autocast.off(device_type):
            return _run_blocks(x, layers, heads, eps)
    with _mode_off():
        _check(x, layers, int(heads))
    return _Blocks.apply(x, int(heads), float(eps), len(layers), *[p for params in layers for p in params])


def transformer_blocks(x: torch.Tensor, layers: Sequence[Sequence[torch.Tensor]], heads: int,
                       eps: float = 1e-5) -> torch.Tensor:
    """Blocks as transformer_block's, one after another on x [B, S, W]
    (``layers``: a sequence of each block's 12 parameters, in
    BLOCK_PARAMETERS order): the whole stack's forward is one run of regend
    calls, and its backward another, where a block each would make one run
    per layer each way.  A run's calls are queued on regend's lane without
    waiting; the rank's thread waits for the worker's answers once at the
    run's end, so the stack costs one such wait (and, with ordering
    "events", one hand-off) each way instead of one a layer."""
    layers = [tuple(params) for params in layers]
    if not layers:
        return x
    return _run_blocks(x, layers, heads, eps)
