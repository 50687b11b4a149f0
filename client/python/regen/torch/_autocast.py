# SPDX-License-Identifier: Apache-2.0
"""torch.autocast for regen.torch's operations: inside an autocast region
an operation takes its inputs in the dtype torch's own operation would
compute in there, and gives its result in that dtype.

torch's autocast is a dispatch key that casts the inputs of the operations
on its lists; regen.torch's custom ops are on none of them (autocast passes
them through), and regen.torch.enable() sees F.linear before autocast does.
So each public operation asks here first.  The dtype is torch's own answer:
the matching torch operation run once on one-element tensors of the same
device type and dtypes under the same autocast state, its result's dtype
kept per (operation, device type, dtypes, state).  No list is copied, so
what torch does in a version (linear and matmul in the region's dtype on
both device types; layer_norm in float32 on CUDA, untouched on the CPU of
torch 1.13) is what regen.torch does with it.  As autocast does, only
float16, bfloat16 and float32 tensors are cast; float64 stays.

The operation then runs with autocast off for its device type, so the
torch operations it makes itself (an output's allocation, a rank-side
copy) are not cast again, and its backward is autograd's through the
casts, as torch's: a float32 weight's gradient comes back float32.
"""

import contextlib
import threading
from typing import Any, Callable, Dict, Iterator, Optional, Sequence, Tuple

import torch
import torch.nn.functional as F

__all__ = ["state", "compute_dtype", "cast", "cast_to", "off"]

_CASTABLE = (torch.float16, torch.bfloat16, torch.float32)


def state(device_type: str) -> Tuple[bool, Optional[torch.dtype]]:
    """(enabled, dtype) of this thread's autocast for ``device_type``."""
    if hasattr(torch, "get_autocast_dtype"):  # torch >= 2.4: one API per device type
        # (Typed as Any: torch < 2.4's stubs know the one-argument-less form.)
        enabled_for: Any = torch.is_autocast_enabled
        dtype_for: Any = getattr(torch, "get_autocast_dtype")
        try:
            if enabled_for(device_type):
                return True, dtype_for(device_type)
        except (RuntimeError, TypeError):
            pass
        return False, None
    if device_type == "cuda":
        return (True, torch.get_autocast_gpu_dtype()) if torch.is_autocast_enabled() else (False, None)
    if device_type == "cpu" and hasattr(torch, "is_autocast_cpu_enabled"):
        return (True, torch.get_autocast_cpu_dtype()) if torch.is_autocast_cpu_enabled() else (False, None)
    return False, None


def _sdpa_probe(q, k, v):
    sdpa = getattr(F, "scaled_dot_product_attention", None)
    if sdpa is not None:
        return sdpa(q, k, v)
    # torch < 2.0 has no sdpa (nor autocast's entry for it): its matmuls'.
    return torch.matmul(torch.matmul(q, k.transpose(-1, -2)).softmax(-1), v)


# What torch itself runs for each regen.torch operation, on one-element
# tensors shaped so that it runs (the arguments' count and order are the
# operation's tensors').
_PROBES: Dict[str, Callable[..., torch.Tensor]] = {
    "matmul": lambda a, b: torch.matmul(a, b),
    "linear": lambda x, w, b=None: F.linear(x, w, b),
    "layer_norm": lambda x, w, b=None: F.layer_norm(x, [1], w, b),
    "sdpa": _sdpa_probe,
    "sdpa_packed": lambda qkv: _sdpa_probe(qkv, qkv, qkv),
}
_SHAPES: Dict[str, Sequence[Sequence[int]]] = {
    "matmul": ([1, 1], [1, 1]),
    "linear": ([1, 1], [1, 1], [1]),
    "layer_norm": ([1, 1], [1], [1]),
    "sdpa": ([1, 1, 1, 1], [1, 1, 1, 1], [1, 1, 1, 1]),
    "sdpa_packed": ([1, 1, 1, 1],),
}

_lock = threading.Lock()
_answers: Dict[tuple, Optional[torch.dtype]] = {}


def compute_dtype(op: str, *tensors: Optional[torch.Tensor]) -> Optional[torch.dtype]:
    """The dtype torch's ``op`` computes in for these tensors under this
    thread's autocast, or None where autocast is off for their device type
    (or torch refuses the mix: the operation then takes them as they are)."""
    first = next((t for t in tensors if t is not None), None)
    if first is None:
        return None
    device_type = first.device.type
    enabled, dtype = state(device_type)
    if not enabled:
        return None
    dtypes = tuple(None if t is None else t.dtype for t in tensors)
    key = (op, device_type, dtypes, dtype)
    try:
        return _answers[key]
    except KeyError:
        pass
    probe = [None if t is None else torch.ones(shape, dtype=t.dtype, device=t.device)
             for t, shape in zip(tensors, _SHAPES[op])]
    try:
        with torch.no_grad():
            answer = _PROBES[op](*probe).dtype
    except RuntimeError:
        answer = None
    with _lock:
        _answers[key] = answer
    return answer


def cast_to(dtype: torch.dtype, *tensors: Optional[torch.Tensor]):
    """``tensors`` converted to ``dtype`` as autocast converts (float16,
    bfloat16 and float32 ones; None and the others as they are): one
    tensor for one, else a tuple."""
    out = tuple(t.to(dtype) if t is not None and t.dtype in _CASTABLE and t.dtype != dtype else t for t in tensors)
    return out[0] if len(out) == 1 else out


def cast(op: str, *tensors: Optional[torch.Tensor]) -> Tuple[Optional[torch.Tensor], ...]:
    """``tensors`` as torch's autocast hands them to ``op`` here (themselves
    where autocast is off)."""
    dtype = compute_dtype(op, *tensors)
    if dtype is None:
        return tensors
    out = cast_to(dtype, *tensors)
    return out if isinstance(out, tuple) else (out,)


@contextlib.contextmanager
def off(device_type: str) -> Iterator[None]:
    """Autocast off for ``device_type`` inside (a no-op where it is off)."""
    if not state(device_type)[0]:
        yield
        return
    with torch.autocast(device_type=device_type, enabled=False):
        yield
