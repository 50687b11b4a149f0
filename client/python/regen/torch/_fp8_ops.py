# SPDX-License-Identifier: Apache-2.0
"""regen.torch.fp8.Linear's passes as custom ops, the form torch.compile
traces (namespace regen):

  fp8_linear(input [m, k], weight [n, k], bias?, amax_history_fwd [H, 2],
             scale_fwd [2], amax_history_bwd [H, 1], scale_bwd [1],
             forward_format, backward_format, amax_compute, margin)
    -> (output [m, n], input_fp8_t [k, m], weight_fp8_t [k, n],
        scale_inv [2], amax_history_out [H, 2], scale_out [2])
  fp8_linear_backward(grad_output [m, n], input_fp8_t, weight_fp8_t,
             fwd_scale_inv [2], amax_history [H, 1], scale [1],
             forward_format, backward_format, amax_compute, margin,
             weight_dtype, bias_dtype?, need_input_grad, need_weight_grad)
    -> (grad_input [m, k], grad_weight [n, k], grad_bias [n],
        scale_inv [1], amax_history_out [H, 1], scale_out [1])

Both are functional: the state goes in, its update comes out, and the
caller copies the update into the layer's buffers (linear() here after the
forward, the autograd formula after the backward).  Under
torch.compile(backend="regen") that copy_ is AOTAutograd's, kept in the
graph (the forward's with keep_inference_input_mutations, the backward's
always), and the compile backend writes each op as the nodes of the eager
pass (regen.fp8_programs, through regen.lowering.fp8) and each copy_ as the
program's own in-place assignment, under a journal.  The backward's
bwd state travels as forward inputs (the backward updates them) and its
unwanted gradients as empty tensors ([0]; grad_bias [0] where bias_dtype
is None).

Where an op runs on the rank (a CPU tensor, a segment regend refused, or
a call outside a compiled graph) its kernel is one functional program Run
of the same definition.  torch >= 2.4: torch.library.custom_op with
register_fake and register_autograd; older torch (Debian's 1.13, CI's):
the same kernels on the regen library (CPU, CUDA, Meta) and autograd by
torch.autograd.Function, so the eager form is tested there too.
"""

import torch

from . import _ops
from ._ops import HAVE_CUSTOM_OP
from .fp8 import (FP8_STORAGE_DTYPES, _DTYPES, _bindable, _check_cuda_shape, _definition, _dtype_of,
                  _empty, _package, _rows, _strides)
from ..fp8_programs import Scaling, backward_definition, forward_definition

__all__ = ["linear", "FORWARD_SCHEMA", "BACKWARD_SCHEMA"]

FORWARD_SCHEMA = ("(Tensor input, Tensor weight, Tensor? bias, Tensor amax_history_fwd, Tensor scale_fwd, "
                  "Tensor amax_history_bwd, Tensor scale_bwd, str forward_format, str backward_format, "
                  "str amax_compute, float margin) -> (Tensor, Tensor, Tensor, Tensor, Tensor, Tensor)")
BACKWARD_SCHEMA = ("(Tensor grad_output, Tensor input_fp8_t, Tensor weight_fp8_t, Tensor fwd_scale_inv, "
                   "Tensor amax_history, Tensor scale, str forward_format, str backward_format, str amax_compute, "
                   "float margin, ScalarType weight_dtype, ScalarType? bias_dtype, bool need_input_grad, "
                   "bool need_weight_grad) -> (Tensor, Tensor, Tensor, Tensor, Tensor, Tensor)")


def _none(dtype, like):
    """A gradient not wanted: empty, nothing binds it."""
    return torch.empty(0, dtype=dtype, device=like.device)


# ---- kernels: one functional program Run each ---------------------------------------

def _forward_kernel(x, weight, bias, hist, scale, hist_bwd, scale_bwd, forward_format, backward_format,
                    amax_compute, margin):
    n, k = weight.shape
    xdt, wdt = _dtype_of("input", x), _dtype_of("weight", weight)
    bdt = _dtype_of("bias", bias) if bias is not None else None
    x2 = _rows(x, k)
    m = x2.shape[0]
    _check_cuda_shape(x, m, n, k)
    scaling = Scaling(forward_format, amax_compute, float(margin), hist.shape[0])
    x2, w, b = _bindable(x2), _bindable(weight), _bindable(bias)
    fp8 = FP8_STORAGE_DTYPES[forward_format]
    out = {"output": _empty([m, n], x.dtype, x), "input.fp8_t": _empty([k, m], fp8, x),
           "weight.fp8_t": _empty([k, n], fp8, x), "fwd.scale_inv": _empty([2], torch.float32, x),
           "fwd.amax_history.new": _empty(list(hist.shape), torch.float32, x),
           "fwd.scale.new": _empty([2], torch.float32, x)}
    key, definition = _definition(forward_definition, m, n, k, xdt, wdt, bdt, _strides(x2), _strides(w),
                                  scaling, False)
    tensors = {"input": x2, "weight": w, "fwd.amax_history": _bindable(hist), "fwd.scale": _bindable(scale)}
    if b is not None:
        tensors["bias"] = b
    tensors.update(out)
    _package.runtime().run_program(("fp8_linear", key), definition, tensors)
    return tuple(out.values())


def _forward_fake(x, weight, bias, hist, scale, hist_bwd, scale_bwd, forward_format, backward_format, amax_compute,
                  margin):
    m, k = x.shape
    n = weight.shape[0]
    fp8 = FP8_STORAGE_DTYPES[forward_format]
    return (x.new_empty([m, n]), x.new_empty([k, m], dtype=fp8), x.new_empty([k, n], dtype=fp8),
            hist.new_empty([2]), hist.new_empty(list(hist.shape)), scale.new_empty([2]))


def _backward_kernel(grad, xt, wt, fwd_inv, hist, scale, forward_format, backward_format, amax_compute, margin,
                     weight_dtype, bias_dtype, need_dx, need_dw):
    m, n = grad.shape
    k = xt.shape[0]
    xdt = _dtype_of("grad_output", grad)
    wdt, bdt = _DTYPES[weight_dtype], (_DTYPES[bias_dtype] if bias_dtype is not None else None)
    dy = _bindable(_rows(grad, n))
    scaling = Scaling(backward_format, amax_compute, float(margin), hist.shape[0])
    grads = {"grad_input": _empty([m, k], grad.dtype, grad) if need_dx else None,
             "grad_weight": _empty([n, k], weight_dtype, grad) if need_dw else None,
             "grad_bias": _empty([n], bias_dtype, grad) if bdt is not None else None}
    state = {"bwd.scale_inv": _empty([1], torch.float32, grad),
             "bwd.amax_history.new": _empty(list(hist.shape), torch.float32, grad),
             "bwd.scale.new": _empty([1], torch.float32, grad)}
    key, definition = _definition(backward_definition, m, n, k, xdt, wdt, bdt, _strides(dy), scaling,
                                  forward_format, need_dx, need_dw, False)
    tensors = {"grad_output": dy, "input.fp8_t": _bindable(xt), "weight.fp8_t": _bindable(wt),
               "fwd.scale_inv": _bindable(fwd_inv), "bwd.amax_history": _bindable(hist), "bwd.scale": _bindable(scale)}
    tensors.update((name, t) for name, t in grads.items() if t is not None)
    tensors.update(state)
    _package.runtime().run_program(("fp8_linear", key), definition, tensors)
    dx, dw, db = (t if t is not None else _none(dt, grad)
                  for t, dt in zip(grads.values(), (grad.dtype, weight_dtype, bias_dtype or grad.dtype)))
    return (dx, dw, db) + tuple(state.values())


def _backward_fake(grad, xt, wt, fwd_inv, hist, scale, forward_format, backward_format, amax_compute, margin,
                   weight_dtype, bias_dtype, need_dx, need_dw):
    m, n = grad.shape
    k = xt.shape[0]
    return (grad.new_empty([m, k] if need_dx else [0]), grad.new_empty([n, k] if need_dw else [0], dtype=weight_dtype),
            grad.new_empty([n] if bias_dtype is not None else [0], dtype=bias_dtype or grad.dtype),
            hist.new_empty([1]), hist.new_empty(list(hist.shape)), scale.new_empty([1]))


# ---- autograd ---------------------------------------------------------------------

def _setup(ctx, inputs, output):
    x, weight, bias, _, _, hist_bwd, scale_bwd, forward_format, backward_format, amax_compute, margin = inputs
    y, xt, wt, inv, new_hist, new_scale = output
    ctx.mark_non_differentiable(xt, wt, inv, new_hist, new_scale)
    ctx.save_for_backward(xt, wt, inv)
    # The backward state as it is when the backward runs, not as saved: the
    # layer's own buffers, which another pass's backward may have updated
    # since (a layer called twice before its backward), as the eager pass
    # reads them.
    ctx.state = (hist_bwd, scale_bwd)
    ctx.recipe = (forward_format, backward_format, amax_compute, margin)
    ctx.dtypes = (y.dtype, weight.dtype, bias.dtype if bias is not None else None)


def _backward(ctx, grad, *unused):
    xt, wt, inv = ctx.saved_tensors
    hist, scale = ctx.state
    ydt, wdt, bdt = ctx.dtypes
    need_dx, need_dw = ctx.needs_input_grad[0], ctx.needs_input_grad[1]
    need_db = bdt is not None and ctx.needs_input_grad[2]
    if grad.dtype != ydt:
        grad = grad.to(ydt)
    if not _row_major(grad):
        grad = grad.contiguous()
    dx, dw, db, _, new_hist, new_scale = _backward_op(grad, xt, wt, inv, hist, scale, *ctx.recipe, wdt,
                                                      bdt if need_db else None, need_dx, need_dw)
    with torch.no_grad():
        hist.copy_(new_hist)
        scale.copy_(new_scale)
    return (dx if need_dx else None, dw if need_dw else None, db if need_db else None) + (None,) * 8


def _row_major(t):
    return t.dim() == 2 and (t.stride(1) == 1 or t.shape[1] == 1) and (t.stride(0) >= t.shape[1] or t.shape[0] <= 1)


# ---- registration --------------------------------------------------------------------

if HAVE_CUSTOM_OP:
    _custom_op = getattr(torch.library, "custom_op")
    _forward_op = _custom_op("regen::fp8_linear", _forward_kernel, mutates_args=(), schema=FORWARD_SCHEMA)
    _backward_op = _custom_op("regen::fp8_linear_backward", _backward_kernel, mutates_args=(),
                              schema=BACKWARD_SCHEMA)
    _forward_op.register_fake(_forward_fake)
    _backward_op.register_fake(_backward_fake)
    _forward_op.register_autograd(_backward, setup_context=_setup)

    def _apply(*args):
        return _forward_op(*args)
else:
    # torch < 2.4: the regen library _ops defined (one per namespace there).
    _ops._lib.define("fp8_linear" + FORWARD_SCHEMA)
    _ops._lib.define("fp8_linear_backward" + BACKWARD_SCHEMA)
    for _name, _kernel, _fake in (("fp8_linear", _forward_kernel, _forward_fake),
                                  ("fp8_linear_backward", _backward_kernel, _backward_fake)):
        _ops._lib.impl(_name, _kernel, "CPU")
        _ops._lib.impl(_name, _kernel, "CUDA")
        _ops._lib.impl(_name, _fake, "Meta")

    def _backward_op(*args):
        return torch.ops.regen.fp8_linear_backward(*args)

    class _Function(torch.autograd.Function):
        @staticmethod
        def forward(ctx, *args):
            output = torch.ops.regen.fp8_linear(*args)
            _setup(ctx, args, output)
            return output

        @staticmethod
        def backward(ctx, *grads):
            return _backward(ctx, *grads)

    def _apply(*args):
        return _Function.apply(*args)


def linear(layer, x, recipe, state):
    """y = layer(x) in FP8 as one custom op (autograd through its
    backward op), the forward state's update copied into ``state`` (the
    layer's four buffers, fwd then bwd) after it."""
    weight = layer.weight
    n, k = weight.shape
    hist, scale, hist_bwd, scale_bwd = state
    forward_format, backward_format = recipe.fp8_format.value
    y, _, _, _, new_hist, new_scale = _apply(x.reshape(-1, k), weight, layer.bias, hist, scale, hist_bwd, scale_bwd,
                                             forward_format, backward_format, recipe.amax_compute_algo,
                                             recipe.margin)
    with torch.no_grad():
        hist.copy_(new_hist)
        scale.copy_(new_scale)
    return y.view(*x.shape[:-1], n)
