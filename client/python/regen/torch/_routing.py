# SPDX-License-Identifier: Apache-2.0
"""regen.torch.enable(): torch.matmul (and ``@``), F.linear and
F.scaled_dot_product_attention sent to regend inside a scope, through a
TorchFunctionMode.  What regend does not run (other dtypes or devices,
masks, dropout, a batched right operand, float32 attention on the CUDA
backend) goes to torch unchanged and is counted as a fallback."""

import torch
import torch.nn.functional as F
from torch.overrides import TorchFunctionMode

from . import _autocast, _ops
from ._runtime import DTYPES, NotSupported

_SDPA = getattr(F, "scaled_dot_product_attention", None)
_MATMULS = {torch.matmul, torch.Tensor.matmul, torch.Tensor.__matmul__}
_LINEARS = {F.linear}


def _tensors_ok(tensors, devices):
    dev = None
    for t in tensors:
        if t is None:
            continue
        if not isinstance(t, torch.Tensor) or t.dtype not in DTYPES or t.device.type not in devices:
            return False
        if dev is None:
            dev = t.device
        elif t.device != dev:
            return False
    return dev is not None


def _one_dtype(op, *tensors):
    """Whether the tensors meet regend's operation in one dtype: theirs, or
    the one torch's autocast gives ``op`` here."""
    if len({t.dtype for t in tensors}) == 1:
        return True
    return _autocast.compute_dtype(op, *tensors) is not None


class RegendMode(TorchFunctionMode):
    """What enable() pushes.  ``devices``: the torch device types sent to
    regend ("cuda"; add "cpu" for regend's host backend)."""

    def __init__(self, devices=("cuda",), ops=("matmul", "linear", "sdpa")):
        super().__init__()
        self.devices = tuple(devices)
        self.ops = frozenset(ops)

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        try:
            if "matmul" in self.ops and func in _MATMULS and not kwargs.get("out") and len(args) == 2:
                a, b = args
                if _tensors_ok((a, b), self.devices) and _one_dtype("matmul", a, b) and b.dim() <= 2:
                    return _ops.matmul(a, b)
            elif "linear" in self.ops and func in _LINEARS:
                # F.linear(input, weight, bias=None), any of them by name.
                bound = dict(zip(("input", "weight", "bias"), args))
                bound.update(kwargs)
                x, w, bias = bound.get("input"), bound.get("weight"), bound.get("bias")
                if (len(bound) == len(args) + len(kwargs) and set(bound) <= {"input", "weight", "bias"} and
                        _tensors_ok((x, w, bias), self.devices) and w is not None and _one_dtype("linear", x, w)):
                    return _ops.linear(x, w, bias)
            elif "sdpa" in self.ops and _SDPA is not None and func is _SDPA:
                routed = self._sdpa(args, kwargs)
                if routed is not None:
                    return routed
        except NotSupported:
            pass
        if func in _MATMULS or func in _LINEARS or (func is _SDPA and _SDPA is not None):
            from . import runtime
            runtime().counters["fallbacks"] += 1
        return func(*args, **kwargs)

    def _sdpa(self, args, kwargs):
        names = ("query", "key", "value", "attn_mask", "dropout_p", "is_causal", "scale", "enable_gqa")
        bound = dict(zip(names, args))
        bound.update(kwargs)
        if set(bound) - set(names):
            return None
        q, k, v = bound.get("query"), bound.get("key"), bound.get("value")
        if not _tensors_ok((q, k, v), self.devices) or not _one_dtype("sdpa", q, k, v):
            return None
        if bound.get("attn_mask") is not None or bound.get("dropout_p", 0.0) or q.dim() != 4:
            return None
        # cuDNN's attention (the CUDA backend) takes bf16 and f16 only.
        if q.device.type == "cuda" and (_autocast.compute_dtype("sdpa", q, k, v) or q.dtype) == torch.float32:
            return None
        return _ops.scaled_dot_product_attention(q, k, v, is_causal=bool(bound.get("is_causal", False)),
                                                 scale=bound.get("scale"),
                                                 enable_gqa=bool(bound.get("enable_gqa", False)))
