# SPDX-License-Identifier: Apache-2.0
"""regen.torch.fp8.Linear's custom ops in a compiled graph: regen::fp8_linear
and regen::fp8_linear_backward (regen.torch._fp8_ops) written as the nodes
of the layer's eager pass (regen.fp8_programs) into the surrounding
program.  Their state update is an output; the graph's copy_ of it into the
layer's buffers (aten.copy_, written by regen.lowering.aten as the
program's in-place assignment) follows."""

from .. import fp8_programs
from .aten import handles, need, out
from .graph import Val

__all__: list = []   # handlers only: registered into HANDLERS

_FLOATS = ("bf16", "f16", "f32")
_FP8 = ("e4m3", "e5m2")


class _Writer:
    """The lowering's builder as fp8_programs' node writers take one
    (ProgramBuilder's intermediate, view and node): scratch of its own,
    views, nodes (their names are the eager programs')."""

    def __init__(self, b):
        self.b = b

    def intermediate(self, name, dtype, shape):
        return self.b.scratch(dtype, shape)

    def view(self, name, base, shape, strides, offset=0):
        return self.b.view_named(base, shape, strides, offset)

    def node(self, op, inputs, outputs=None, name=None, **attrs):
        self.b.node(op, inputs, outputs, **attrs)


def _rows(v, what):
    """v [r, c] with unit column stride and rows apart (the quantizations
    read rows)."""
    need(isinstance(v, Val) and len(v.shape) == 2, f"fp8_linear's {what} is not a matrix")
    r, c = v.shape
    need((v.strides[1] == 1 or c == 1) and (v.strides[0] >= c or r == 1), f"fp8_linear's {what} is not row major")


def _state(v, shape, what):
    need(isinstance(v, Val) and v.dtype == "f32" and v.shape == shape and v.is_contiguous(),
         f"fp8_linear's {what} is not f32 {list(shape)}, contiguous")


def _outputs(op, shapes):
    vals = [out(op, i) for i in range(len(shapes))]
    for v, shape in zip(vals, shapes):
        need(v.shape == shape and v.is_contiguous(), f"{op.target}: an output of another shape than {list(shape)}")
    return vals


def _scaling(op, direction, history):
    a = op.a
    fmt = a["forward_format"] if direction == "forward" else a["backward_format"]
    need(fmt in _FP8 and a["forward_format"] in _FP8, f"{op.target}: FP8 formats {a['forward_format']!r}, "
         f"{a['backward_format']!r}")
    return fp8_programs.Scaling(fmt, a["amax_compute"], float(a["margin"]), history)


@handles("regen.fp8_linear.default")
def fp8_linear(b, op):
    a = op.a
    x, w, bias = a["input"], a["weight"], a.get("bias")
    hist, scale = a["amax_history_fwd"], a["scale_fwd"]
    _rows(x, "input")
    _rows(w, "weight")
    m, k = x.shape
    n = w.shape[0]
    need(w.shape[1] == k, "fp8_linear's weight does not take the input's columns")
    need(x.dtype in _FLOATS and w.dtype in _FLOATS, f"fp8_linear of {x.dtype} and {w.dtype}")
    if bias is not None:
        need(isinstance(bias, Val) and bias.dtype in _FLOATS and bias.shape == (n,) and bias.is_contiguous(),
             "fp8_linear's bias is not a contiguous row")
    need(isinstance(hist, Val) and len(hist.shape) == 2, "fp8_linear's amax history is not a matrix")
    h = hist.shape[0]
    _state(hist, (h, 2), "forward amax history")
    _state(scale, (2,), "forward scales")
    scaling = _scaling(op, "forward", h)
    y, xt, wt, inv, new_hist, new_scale = _outputs(op, ((m, n), (k, m), (k, n), (2,), (h, 2), (2,)))
    need(y.dtype == x.dtype and xt.dtype == wt.dtype == scaling.fp8_dtype, "fp8_linear's outputs' dtypes")
    t = {"input": b.read(x), "weight": b.read(w), "bias": b.read(bias) if bias is not None else None,
         "amax_history": b.read(hist), "scale": b.read(scale), "amax_history_out": b.write(new_hist),
         "scale_out": b.write(new_scale), "scale_inv": b.write(inv), "output": b.write(y), "input_t": b.write(xt),
         "weight_t": b.write(wt)}
    fp8_programs.forward_nodes(_Writer(b), t, m, n, k, scaling, x.dtype, bias.dtype if bias is not None else None)


@handles("regen.fp8_linear_backward.default")
def fp8_linear_backward(b, op):
    a = op.a
    dy, xt, wt, fwd_inv = a["grad_output"], a["input_fp8_t"], a["weight_fp8_t"], a["fwd_scale_inv"]
    hist, scale = a["amax_history"], a["scale"]
    _rows(dy, "output gradient")
    m, n = dy.shape
    need(isinstance(xt, Val) and isinstance(wt, Val) and len(xt.shape) == 2 and xt.shape[1] == m and
         wt.shape == (xt.shape[0], n) and xt.is_contiguous() and wt.is_contiguous(),
         "fp8_linear_backward's transposed copies are not [k, m] and [k, n], contiguous")
    k = xt.shape[0]
    need(dy.dtype in _FLOATS, f"fp8_linear_backward of {dy.dtype}")
    need(isinstance(hist, Val) and len(hist.shape) == 2, "fp8_linear_backward's amax history is not a matrix")
    h = hist.shape[0]
    _state(hist, (h, 1), "backward amax history")
    _state(scale, (1,), "backward scale")
    _state(fwd_inv, (2,), "forward scales' inverses")
    scaling = _scaling(op, "backward", h)
    need(xt.dtype == wt.dtype == a["forward_format"], "fp8_linear_backward's transposed copies' dtype")
    need_dx, need_dw = bool(a["need_input_grad"]), bool(a["need_weight_grad"])
    has_db = a.get("bias_dtype") is not None
    dx, dw, db, inv, new_hist, new_scale = _outputs(op, ((m, k) if need_dx else (0,), (n, k) if need_dw else (0,),
                                                          (n,) if has_db else (0,), (1,), (h, 1), (1,)))
    t = {"grad_output": b.read(dy), "input_t": b.read(xt), "weight_t": b.read(wt), "fwd.scale_inv": b.read(fwd_inv),
         "amax_history": b.read(hist), "scale": b.read(scale), "amax_history_out": b.write(new_hist),
         "scale_out": b.write(new_scale), "scale_inv": b.write(inv)}
    for key, v, wanted in (("grad_input", dx, need_dx), ("grad_weight", dw, need_dw), ("grad_bias", db, has_db)):
        if wanted:
            need(v.dtype in _FLOATS, f"fp8_linear_backward's {key} of {v.dtype}")
            t[key] = b.write(v)
        else:
            b.dummy(v)   # [0]: nothing to write
    fp8_programs.backward_nodes(_Writer(b), t, m, n, k, scaling)
