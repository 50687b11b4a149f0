# SPDX-License-Identifier: Apache-2.0
"""F.layer_norm through regend: io.regen.Compute.LayerNorm forward and
LayerNormBackward backward (statistics in f32, as torch's kernels keep
them), with autograd.

The normalized dimensions are x's last ones, flattened into one row: a
LayerNorm over [..., d1, d2] is one over rows of d1 * d2.  regend takes a
weight of x's dtype always: without one (elementwise_affine=False) the
operation gives it a row of ones, kept per device, dtype and width, and
returns no gradient for it; a weight or bias of another dtype than x's is
converted on the rank (autograd takes the gradient back through the
conversion).
"""

from typing import Dict, Optional, Sequence, Tuple, Union

import torch

from . import _autocast
from ._block import _layer_norm, _layer_norm_backward
from ._ops import _empty, _mode_off, _rt
from ._runtime import DTYPES, NotSupported

__all__ = ["layer_norm"]

_ONES_KEPT = 16
_ones: Dict[tuple, torch.Tensor] = {}


def _ones_vector(n: int, like: torch.Tensor) -> torch.Tensor:
    key = (like.device, like.dtype, n)
    row = _ones.get(key)
    if row is None:
        if len(_ones) >= _ONES_KEPT:
            _ones.pop(next(iter(_ones)))
        row = _empty([n], like.dtype, like)
        _rt().rank_work()
        row.fill_(1)
        _ones[key] = row
    return row


class _LayerNorm(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x2d, weight, bias, eps):
        with _mode_off():
            w = weight if weight is not None else _ones_vector(x2d.shape[1], x2d)
            y, mean, rstd = _layer_norm(x2d, w, bias, eps)
            ctx.has_weight, ctx.has_bias = weight is not None, bias is not None
            ctx.save_for_backward(x2d, w, mean, rstd)
            return y

    @staticmethod
    def backward(ctx, grad):
        with _mode_off():
            x2d, w, mean, rstd = ctx.saved_tensors
            needs_x, needs_w, needs_b = ctx.needs_input_grad[:3]
            d_x, d_w, d_b = _layer_norm_backward(grad.contiguous(), x2d, w, mean, rstd, None,
                                                 ctx.has_weight and needs_w, ctx.has_bias and needs_b)
            return (d_x if needs_x else None), d_w, d_b, None


def _layer_norm_now(x: torch.Tensor, shape: Tuple[int, ...], weight: Optional[torch.Tensor],
                    bias: Optional[torch.Tensor], eps: float) -> torch.Tensor:
    k = len(shape)
    if tuple(x.shape[x.dim() - k:]) != shape or x.dim() < k:
        raise ValueError(f"layer_norm: normalized_shape {list(shape)} is not the last dimensions of {list(x.shape)}")
    for name, t in (("weight", weight), ("bias", bias)):
        if t is not None and tuple(t.shape) != shape:
            raise ValueError(f"layer_norm: {name} must be {list(shape)}, got {list(t.shape)}")
    if x.dtype not in DTYPES:
        raise NotSupported(parameters={"message": f"regen.torch.layer_norm: {x.dtype} is not taken (float32, "
                                                  "bfloat16 or float16)"})
    n = 1
    for d in shape:
        n *= d
    rows = x.numel() // n if n else 0
    if rows == 0 or n == 0:
        return torch.empty_like(x)
    x2d = x.reshape(rows, n)
    if x2d.stride(-1) != 1 or x2d.stride(0) < n:
        _rt().rank_work()
        x2d = x2d.contiguous()
    w: Optional[torch.Tensor] = None if weight is None else weight.reshape(n)
    b: Optional[torch.Tensor] = None if bias is None else bias.reshape(n)
    if w is not None and w.dtype != x.dtype:
        _rt().rank_work()
        w = w.to(x.dtype)
    if b is not None and b.dtype != x.dtype:
        _rt().rank_work()
        b = b.to(x.dtype)
    return _LayerNorm.apply(x2d, w, b, float(eps)).view(x.shape)


def layer_norm(input: torch.Tensor, normalized_shape: Union[int, Sequence[int]],
               weight: Optional[torch.Tensor] = None, bias: Optional[torch.Tensor] = None,
               eps: float = 1e-5) -> torch.Tensor:
    """F.layer_norm through regend (torch's signature): over the last
    ``len(normalized_shape)`` dimensions of ``input``, float32, bfloat16
    or float16 (others raise NotSupported); inside torch.autocast in the
    dtype torch's layer_norm computes in there."""
    shape = (int(normalized_shape),) if isinstance(normalized_shape, int) else tuple(int(d) for d in normalized_shape)
    if _autocast.state(input.device.type)[0]:
        x, w, b = _autocast.cast("layer_norm", input, weight, bias)
        assert x is not None
        with _autocast.off(x.device.type):
            return _layer_norm_now(x, shape, w, b, eps)
    return _layer_norm_now(input, shape, weight, bias, eps)
