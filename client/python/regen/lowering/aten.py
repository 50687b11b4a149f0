# SPDX-License-Identifier: Apache-2.0
"""ATen ops written as io.regen.Program nodes: one handler per op name.

A handler checks everything first and raises Unsupported (with the reason
explain() shows) before it writes anything; then it asks the builder for
the program tensors of what the op reads and writes (b.read, b.write) and
adds nodes.  Views cost nothing: a view of what the segment made is a
program view of the same memory (b.alias); a view of a tensor the rank
holds stays on the rank (free there too) and is bound as it is.
"""

import math

from .graph import Unsupported, Val, contiguous_strides

__all__ = ["HANDLERS", "VIEW_OPS"]

HANDLERS = {}


def handles(*targets):
    def register(fn):
        for t in targets:
            HANDLERS[t] = fn
        return fn
    return register


FLOATS = ("f32", "bf16", "f16", "f64")


def need(cond, why):
    if not cond:
        raise Unsupported(why)


def need_float(*vals):
    for v in vals:
        if isinstance(v, Val):
            need(v.dtype in FLOATS, f"{v!r}: the op computes on floats, this is {v.dtype}")


def is_scalar(x):
    return isinstance(x, (int, float)) and not isinstance(x, bool)


def out(op, i=0):
    v = op.outs[i] if i < len(op.outs) else None
    need(isinstance(v, Val), f"{op.target}: output {i} is not a tensor")
    return v


# ---- views -------------------------------------------------------------------

VIEW_OPS = (
    "aten.view.default", "aten._unsafe_view.default", "aten.reshape.default", "aten.permute.default",
    "aten.t.default", "aten.transpose.int", "aten.expand.default", "aten.slice.Tensor", "aten.select.int",
    "aten.unsqueeze.default", "aten.squeeze.dim", "aten.squeeze.dims", "aten.squeeze.default",
    "aten.split.Tensor", "aten.split_with_sizes.default", "aten.unbind.int", "aten.alias.default",
    "aten.detach.default", "aten.as_strided.default", "aten.narrow.default", "aten.unflatten.int",
    "aten.flatten.using_ints", "aten.diagonal.default", "aten.chunk.default",
)


@handles(*VIEW_OPS)
def view(b, op):
    src = op.a.get("self")
    need(isinstance(src, Val), f"{op.target}: no tensor to view")
    need(src.id in b.made, "a view of a tensor the rank holds: the rank makes it (no GPU work)")
    outs = op.out_vals()
    for v in outs:
        need(v.storage == src.storage, f"{op.target} copied instead of viewing")
    for v in outs:
        b.alias(v)


# ---- copies and casts ------------------------------------------------------

@handles("aten.clone.default", "aten._to_copy.default", "prims.convert_element_type.default",
         "aten.contiguous.default", "aten.lift_fresh_copy.default")
def copy(b, op):
    src, dst = op.a.get("self", op.a.get("a")), out(op)
    need(isinstance(src, Val), f"{op.target}: no tensor to copy")
    need(src.dtype is not None and dst.dtype is not None, f"{op.target}: a dtype programs do not take")
    need(dst.shape == src.shape, f"{op.target}: the shape changes")
    if _cast_into_softmax(b, src, dst):
        return
    base = _reshaped_from(b, src)
    if base is not None and dst.owns_storage():
        # A cast of a reshape (the loss's gradient [N, V] as [B, S, V]):
        # written in the shape of what the segment made, so that it joins
        # the kernel that makes it and that tensor stays in registers.
        b.node("cast", [b.read(base)], [b.view_named(b.write(dst), base.shape, contiguous_strides(base.shape))])
        return
    _pointwise(b, "cast", [src], dst)


@handles("aten.copy.default")
def copy_functional(b, op):
    """Functionalization's form of an in-place copy_ (a layer's
    ``buffer.copy_(new)``, the FP8 state update among them): a new tensor
    of self's shape and dtype holding src; self's values are not read.
    AOTAutograd's copy_ of it into the input, where the graph ends, is
    copy_into_input's."""
    dst, src = out(op), op.a.get("src")
    need(isinstance(src, Val), f"aten.copy of {type(src).__name__}")
    need(src.dtype is not None and dst.dtype is not None, "aten.copy: a dtype programs do not take")
    need(src.shape == dst.shape, f"aten.copy that broadcasts {list(src.shape)} to {list(dst.shape)}")
    _pointwise(b, "cast", [src], dst)


@handles("aten.copy_.default")
def copy_into_input(b, op):
    """AOTAutograd's write-back of an input the graph updates (a buffer:
    the FP8 scaling state, a running statistic), which it keeps in the
    graph as copy_ (a forward's, where the backend asks it to, and every
    backward's), after everything that reads the input: the input bound
    as an inout and assigned in place, the program's last word on it.  A
    Run of such a program names a journal (Segment.updates), so a Run a
    fault cuts applies the update once."""
    dst, src = op.a.get("self"), op.a.get("src")
    need(isinstance(dst, Val) and dst.producer is None, "copy_ into a tensor the graph made, not into an input")
    need(isinstance(src, Val), f"copy_ of {type(src).__name__} into an input")
    need(dst.dtype is not None and src.dtype is not None, "copy_ of a dtype programs do not take")
    need(src.shape == dst.shape, f"copy_ that broadcasts {list(src.shape)} to {list(dst.shape)}")
    need(all(u is op or u.index < op.index for u in dst.users), "copy_ into an input that ops after it read")
    result = op.outs[0] if op.outs else None
    need(not isinstance(result, Val) or (not result.users and not result.is_output), "copy_ whose result is read")
    need(all(v.storage != dst.storage or v.id == dst.id for v in b.external.values()),
         "copy_ into an input whose memory another input of the segment views")
    b.node("cast", [b.read(src)], [b.update(dst)])


def _cast_into_softmax(b, src, dst):
    """A cast read by a softmax alone, through reshapes (a model's
    ``logits.float().view(-1, V)`` before its loss): the softmax reads the
    cast's input and writes its own dtype (it computes in f32 either way),
    and the cast's output, as large as the logits in f32, is never
    written.  False where that does not apply."""
    if src.dtype not in FLOATS or dst.dtype not in FLOATS or not src.is_contiguous():
        return False
    chain, v = [], dst
    while True:
        if v.is_output or len(v.users) != 1:
            return False
        user = v.users[0]
        if user.target in ("aten._log_softmax.default", "aten._softmax.default") and user.a.get("self") is v:
            break
        outs = user.out_vals()
        if user.target not in ("aten.view.default", "aten._unsafe_view.default", "aten.reshape.default") or \
                user.a.get("self") is not v or len(outs) != 1:
            return False
        chain.append(user)
        v = outs[0]
        if not (v.offset == 0 and v.is_contiguous() and v.numel == src.numel):
            return False
    y = user.outs[0]
    d = user.a.get("dim")
    if not (isinstance(y, Val) and y.dtype in FLOATS and isinstance(d, int) and d % len(v.shape) == len(v.shape) - 1
            and y.is_contiguous()):
        return False
    x = b.read(src) if v.shape == src.shape else b.view(src, v.shape, contiguous_strides(v.shape))
    _write_softmax(b, user, x, y, dst.producer.index)
    b.made[dst.id] = dst
    for op in chain:
        b.made[op.out_vals()[0].id] = op.out_vals()[0]
        b.absorb(op)
    b.absorb(user)
    return True


def _reshaped_from(b, v):
    """The tensor of this segment that contiguous Val ``v`` reshapes (the
    same memory, every element, in order; another shape), or None."""
    root = b.roots.get(v.storage)
    base = root[1] if root else None
    if base is None or base.shape == v.shape or base.id not in b.name_of:
        return None
    if not (v.owns_storage() and base.owns_storage() and v.numel == base.numel):
        return None
    return base


@handles("aten.cat.default")
def cat(b, op):
    """Each input copied into its slice of the output."""
    ins, y = op.a["tensors"], out(op)
    need(all(isinstance(v, Val) for v in ins), "cat of something other than tensors")
    need(y.dtype is not None and all(v.dtype is not None for v in ins), "cat of a dtype programs do not take")
    r = len(y.shape)
    dim = op.a.get("dim", 0) % r
    parts = [v for v in ins if v.numel > 0]
    need(all(len(v.shape) == r for v in parts), "cat of tensors of another rank")
    whole = b.write(y)
    at = 0
    for v in parts:
        b.node("cast", [b.read(v)], [b.view_named(whole, v.shape, y.strides, at * y.strides[dim])])
        at += v.shape[dim]


@handles("aten.slice_backward.default", "aten.select_backward.default")
def into_zeros(b, op):
    """The gradient of a slice or a select: zeros, and the gradient copied
    into the part that was taken."""
    g, y = op.a["grad_output"], out(op)
    need(isinstance(g, Val) and g.dtype is not None and y.dtype is not None, f"{op.target} of another dtype")
    need(list(op.a["input_sizes"]) == list(y.shape), f"{op.target}: sizes")
    r = len(y.shape)
    dim = op.a["dim"] % r
    whole = b.write(y)
    b.node("fill", [], [whole], scalar=0.0)
    if op.target == "aten.select_backward.default":
        index = op.a["index"] % y.shape[dim]
        shape = y.shape[:dim] + y.shape[dim + 1:]
        strides = y.strides[:dim] + y.strides[dim + 1:]
        b.node("cast", [b.read(g)], [b.view_named(whole, shape, strides, index * y.strides[dim])])
        return
    start, end, step = op.a.get("start") or 0, op.a.get("end"), op.a.get("step", 1)
    size = y.shape[dim]
    start = start + size if start < 0 else start
    need(0 <= start <= size and step >= 1, f"{op.target}: a slice from {start} in steps of {step}")
    strides = list(y.strides)
    strides[dim] *= step
    del end
    b.node("cast", [b.read(g)], [b.view_named(whole, g.shape, strides, start * y.strides[dim])])


# ---- pointwise -------------------------------------------------------------

UNARY = {
    "aten.neg.default": "neg", "aten.exp.default": "exp", "aten.log.default": "log", "aten.tanh.default": "tanh",
    "aten.erf.default": "erf", "aten.sigmoid.default": "sigmoid", "aten.silu.default": "silu",
    "aten.relu.default": "relu", "aten.sqrt.default": "sqrt", "aten.rsqrt.default": "rsqrt",
    "aten.abs.default": "abs", "aten.reciprocal.default": "reciprocal",
}


def _frame_of(v, y):
    """(shape, strides) of Val ``v`` in y's frame: y's leading dims as one,
    [rows, last] (v like y, or a row statistic [..., 1]) or v's last dim
    alone (v broadcast over every row); None where v does not fit."""
    r = len(y.shape)
    pad = r - len(v.shape)
    if pad < 0:
        return None
    shape = (1,) * pad + tuple(v.shape)
    strides = (0,) * pad + tuple(v.strides)
    if all(d == 1 for d in shape[:-1]):
        return [shape[-1]], [strides[-1] if shape[-1] > 1 else 1]
    if shape[:-1] != tuple(y.shape[:-1]) or shape[-1] not in (1, y.shape[-1]):
        return None
    row_stride = _lead_stride(shape, strides)
    if row_stride is None:
        return None
    return [math.prod(shape[:-1]), shape[-1]], [row_stride, strides[-1] if shape[-1] > 1 else 1]


def _pointwise(b, fn, ins, y, **attrs):
    """A pointwise node of Vals ``ins`` into Val ``y``.  Over three dims or
    more it runs in y's frame, [rows, last]: the same shape as the GEMMs'
    outputs and the reductions' inputs the model's views go between, so
    that the chain fuses with them (the program's kernels group nodes of
    one shape)."""
    if len(y.shape) >= 3 and y.is_contiguous():
        frames = [_frame_of(v, y) for v in ins]
        if all(f is not None for f in frames):
            names = [b.view_named(b.read(v), *f) for v, f in zip(ins, frames)]
            rows, last = math.prod(y.shape[:-1]), y.shape[-1]
            b.node(fn, names, [b.view_named(b.write(y), [rows, last], [last, 1])], **attrs)
            return
    b.node(fn, [b.read(v) for v in ins], [b.write(y)], **attrs)


@handles(*UNARY)
def unary(b, op):
    x, y = op.a["self"], out(op)
    need_float(x, y)
    _pointwise(b, UNARY[op.target], [x], y)


@handles("aten.gelu.default")
def gelu(b, op):
    x, y = op.a["self"], out(op)
    need_float(x, y)
    form = op.a.get("approximate", "none")
    need(form in ("none", "tanh"), f"gelu approximate={form!r}")
    _pointwise(b, "gelu_tanh" if form == "tanh" else "gelu", [x], y)


BACKWARD = {
    "aten.gelu_backward.default": None, "aten.silu_backward.default": "silu_backward",
    "aten.sigmoid_backward.default": "sigmoid_backward", "aten.tanh_backward.default": "tanh_backward",
    "aten.threshold_backward.default": "relu_backward",
}


@handles(*BACKWARD)
def activation_backward(b, op):
    dy = op.a["grad_output"]
    x = op.a.get("self", op.a.get("output"))
    dx = out(op)
    need_float(dy, x, dx)
    name = BACKWARD[op.target]
    if op.target == "aten.gelu_backward.default":
        form = op.a.get("approximate", "none")
        need(form in ("none", "tanh"), f"gelu_backward approximate={form!r}")
        name = "gelu_tanh_backward" if form == "tanh" else "gelu_backward"
    if op.target == "aten.threshold_backward.default":
        need(op.a.get("threshold") == 0, "threshold_backward with a threshold other than 0")
    _pointwise(b, name, [dy, x], dx)


BINARY = {
    "aten.add.Tensor": "add", "aten.add.Scalar": "add", "aten.sub.Tensor": "sub", "aten.sub.Scalar": "sub",
    "aten.mul.Tensor": "mul", "aten.mul.Scalar": "mul", "aten.div.Tensor": "div", "aten.div.Scalar": "div",
    "aten.maximum.default": "maximum", "aten.minimum.default": "minimum",
    "aten.pow.Tensor_Tensor": "pow", "aten.pow.Tensor_Scalar": "pow",
    "aten.rsub.Scalar": "sub", "aten.rsub.Tensor": "sub",
}
COMPARE = {f"aten.{c}.{k}": c for c in ("eq", "ne", "lt", "le", "gt", "ge") for k in ("Tensor", "Scalar")}


def _binary(b, op, fn, x, other, y, floats=True):
    reverse = op.target.startswith("aten.rsub")
    if floats:
        need_float(x, other, y)
    if isinstance(other, Val):
        _pointwise(b, fn, [other, x] if reverse else [x, other], y)
    else:
        need(is_scalar(other), f"{op.target}: its other operand is {type(other).__name__}")
        _pointwise(b, fn, [x], y, scalar=float(other), scalar_first=True if reverse else None)


@handles(*BINARY)
def binary(b, op):
    x, other, y = op.a["self"], op.a.get("other", op.a.get("exponent")), out(op)
    need(isinstance(x, Val), f"{op.target}: its first operand is not a tensor")
    fn = BINARY[op.target]
    if op.target.startswith("aten.div"):
        need(op.a.get("rounding_mode") is None, "div with a rounding mode")
    alpha = op.a.get("alpha", 1)
    if alpha != 1:
        need(fn in ("add", "sub") and isinstance(other, Val) and is_scalar(alpha), f"{op.target} alpha={alpha}")
        need_float(x, other, y)
        scaled = b.scratch(y.dtype if y.dtype != "bf16" else "f32", other.shape)
        b.node("mul", [b.read(other)], [scaled], scalar=float(alpha))
        b.node(fn, [scaled, b.read(x)] if op.target.startswith("aten.rsub") else [b.read(x), scaled], [b.write(y)])
        return
    if fn == "pow" and not isinstance(other, Val) and other == 2:
        need_float(x, y)
        _pointwise(b, "square", [x], y)
        return
    _binary(b, op, fn, x, other, y)


@handles(*COMPARE)
def compare(b, op):
    _binary(b, op, COMPARE[op.target], op.a["self"], op.a["other"], out(op), floats=False)


@handles("aten.masked_fill.Scalar", "aten.masked_fill.Tensor")
def masked_fill(b, op):
    x, mask, value, y = op.a["self"], op.a["mask"], op.a["value"], out(op)
    need(isinstance(mask, Val) and isinstance(x, Val), "masked_fill without tensors")
    if isinstance(value, Val):
        _pointwise(b, "where", [mask, value, x], y)
        return
    need(is_scalar(value) or isinstance(value, bool), f"masked_fill with {value!r}")
    _pointwise(b, "where", [mask, x], y, scalar=float(value), scalar_first=True)


@handles("aten.where.self")
def where(b, op):
    cond, x, other, y = op.a["condition"], op.a["self"], op.a["other"], out(op)
    need(isinstance(cond, Val) and isinstance(x, Val) and isinstance(other, Val), "where with a scalar")
    _pointwise(b, "where", [cond, x, other], y)


# ---- dropout ---------------------------------------------------------------------

@handles("aten.native_dropout.default")
def dropout(b, op):
    """The mask drawn in regend (dropout_mask: Philox from the Run's seed,
    the same on a retried Run), then the kept values scaled."""
    x, p, train = op.a["input"], op.a["p"], op.a.get("train", True)
    y, mask = out(op, 0), out(op, 1)
    need_float(x, y)
    need(is_scalar(p) and 0 <= p < 1, f"dropout with p={p!r}")
    need(mask.shape == x.shape and mask.dtype is not None, "dropout's mask")
    keep = b.write(mask)
    if not train or p == 0:
        b.node("fill", [], [keep], scalar=1.0)
        b.node("cast", [b.read(x)], [b.write(y)])
        return
    b.node("dropout_mask", [b.seed()], [keep], p=float(p), stream=b.next_stream())
    scaled = b.scratch("f32", x.shape)
    b.node("mul", [b.read(x)], [scaled], scalar=1.0 / (1.0 - float(p)))
    b.node("where", [keep, scaled], [b.write(y)], scalar=0.0)


@handles("aten.native_dropout_backward.default")
def dropout_backward(b, op):
    g, mask, scale, dx = op.a["grad_output"], op.a["mask"], op.a["scale"], out(op)
    need_float(g, dx)
    need(is_scalar(scale), f"dropout's backward with scale {scale!r}")
    scaled = b.scratch("f32", g.shape)
    b.node("mul", [b.read(g)], [scaled], scalar=float(scale))
    b.node("where", [b.read(mask), scaled], [b.write(dx)], scalar=0.0)


# ---- tensors made from nothing ------------------------------------------------

@handles("aten.full.default", "aten.zeros.default", "aten.ones.default", "aten.zeros_like.default",
         "aten.ones_like.default", "aten.full_like.default", "aten.scalar_tensor.default", "aten.new_zeros.default",
         "aten.new_ones.default", "aten.new_full.default")
def fill(b, op):
    y = out(op)
    need(y.dtype is not None, f"{op.target}: a dtype programs do not take")
    name = op.target.split(".")[1]
    if name.startswith(("zeros", "new_zeros")):
        value = 0.0
    elif name.startswith(("ones", "new_ones")):
        value = 1.0
    else:
        value = op.a.get("fill_value", op.a.get("s"))
    need(is_scalar(value) or isinstance(value, bool), f"{op.target}: fill value {value!r}")
    b.node("fill", [], [b.write(y)], scalar=float(value))


@handles("aten.arange.default", "aten.arange.start", "aten.arange.start_step")
def arange(b, op):
    y = out(op)
    need(op.a.get("start", 0) == 0 and op.a.get("step", 1) == 1, "arange not from 0 in steps of 1")
    need(len(y.shape) == 1 and y.dtype is not None, "arange of a dtype programs do not take")
    b.node("iota", [], [b.write(y)], axis=0)


# ---- reductions --------------------------------------------------------------

REDUCE = {"aten.sum.dim_IntList": "sum", "aten.sum.default": "sum", "aten.mean.dim": "mean",
          "aten.amax.default": "amax", "aten.mean.default": "mean"}


@handles(*REDUCE)
def reduce(b, op):
    x, y = op.a["self"], out(op)
    need_float(x, y)
    need(op.a.get("dtype") is None or y.dtype in FLOATS, f"{op.target} with dtype")
    r = len(x.shape)
    need(r > 0, "a reduction of a rank-0 tensor")
    dims = op.a.get("dim")
    if dims is None or (isinstance(dims, (list, tuple)) and len(dims) == 0):
        dims = list(range(r))
    if isinstance(dims, int):
        dims = [dims]
    dims = sorted({d % r for d in dims})
    fn = REDUCE[op.target]
    src = b.read(x) if x.is_contiguous() else None
    if src is None:
        # The reductions read rows of memory in order: a strided input is
        # copied first.
        src = b.scratch(x.dtype, x.shape)
        b.node("cast", [b.read(x)], [src])
    if dims == list(range(r)):
        # A whole reduction: the flat view's last (only) dimension.
        b.node(fn, [b.view_named(src, [x.numel], [1])], [_out_as(b, y, [])], axis="last")
        return
    if dims == [r - 1]:
        # Over three dims or more, in the pointwise nodes' frame: [rows, last].
        rows = math.prod(x.shape[:-1])
        flat = b.view_named(src, [rows, x.shape[-1]], [x.shape[-1], 1]) if r >= 3 else src
        b.node(fn, [flat], [_out_as(b, y, [rows] if r >= 3 else x.shape[:-1])], axis="last")
        return
    k = len(dims)
    if dims == list(range(k)):
        # The first k dims: [prod(first k), prod(rest)], all but the last.
        lead, rest = math.prod(x.shape[:k]), math.prod(x.shape[k:])
        b.node(fn, [b.view_named(src, [lead, rest], [rest, 1])], [_out_as(b, y, [rest])], axis="leading")
        return
    if dims == list(range(r - k, r)):
        lead, rest = math.prod(x.shape[:r - k]), math.prod(x.shape[r - k:])
        b.node(fn, [b.view_named(src, [lead, rest], [rest, 1])], [_out_as(b, y, [lead])], axis="last")
        return
    raise Unsupported(f"{op.target} over dims {dims} of a rank-{r} tensor (programs reduce leading or trailing "
                      "dims)")


def _out_as(b, y, shape):
    """The program tensor for output y, viewed with ``shape`` (y's own
    shape with its kept dims dropped)."""
    name = b.write(y)
    if list(y.shape) == list(shape):
        return name
    need(y.is_contiguous(), "a strided reduction output")
    return b.view_named(name, shape, contiguous_strides(shape))


# ---- GEMM ---------------------------------------------------------------------

def _gemm_operand(b, v):
    """(program tensor, transposed): v as the GEMM takes an operand, row
    major with unit column stride, itself or its transpose."""
    need(len(v.shape) == 2, f"a GEMM operand of rank {len(v.shape)}")
    if _transposed(v.shape, v.strides):
        return b.view(v, [v.shape[1], v.shape[0]], [v.strides[1], v.strides[0]]), True
    return b.read(v), False


@handles("aten.mm.default", "aten.addmm.default")
def mm(b, op):
    a, m2, d = op.a.get("mat1", op.a["self"]), op.a.get("mat2"), out(op)
    need_float(a, m2, d)
    need(a.dtype == m2.dtype and a.dtype in ("bf16", "f16", "f32"), f"a GEMM of {a.dtype} and {m2.dtype}")
    need(d.is_contiguous() and d.offset == 0, "a GEMM output that is not contiguous")
    bias = None
    if op.target == "aten.addmm.default":
        bias = op.a["self"]
        need(op.a.get("beta", 1) == 1 and op.a.get("alpha", 1) == 1, "addmm with beta or alpha")
        need(isinstance(bias, Val) and bias.shape == (d.shape[1],) and bias.strides == (1,),
             "addmm whose bias is not a contiguous row")
        need(bias.dtype == d.dtype, "addmm whose bias has another dtype")
    aa, ta = _gemm_operand(b, a)
    bb, tb = _gemm_operand(b, m2)
    params = {"a": aa, "b": bb, "d": b.write(d)}
    attrs = {"trans_a": ta or None, "trans_b": tb or None}
    if bias is not None:
        params["bias"] = b.read(bias)
        attrs["epilogue"] = "bias"
    b.node("gemm", params, **attrs)


BMM_BATCHES_MAX = 256


def _transposed(shape, strides):
    """Whether a 2-D operand is the GEMM's as its transpose (column major);
    Unsupported where it is neither row nor column major."""
    r, c = shape
    s0, s1 = strides
    if (s1 == 1 or c == 1) and (s0 >= c or r == 1):
        return False
    if (s0 == 1 or r == 1) and (s1 >= r or c == 1):
        return True
    raise Unsupported("a GEMM operand that is neither row nor column major")


def _gemm_slice(b, name, shape, strides, offset):
    """(program tensor, transposed) for one batch's 2-D matrix of a batched
    operand (name: its program tensor)."""
    if _transposed(shape, strides):
        return b.view_named(name, [shape[1], shape[0]], [strides[1], strides[0]], offset), True
    return b.view_named(name, list(shape), list(strides), offset), False


@handles("aten.bmm.default")
def bmm(b, op):
    """One GEMM node a batch entry, over views of the operands."""
    a, m2, d = op.a["self"], op.a["mat2"], out(op)
    need(len(a.shape) == 3 and len(m2.shape) == 3 and len(d.shape) == 3, "bmm of other than [B, M, K] @ [B, K, N]")
    need_float(a, m2, d)
    need(a.dtype == m2.dtype and a.dtype in ("bf16", "f16", "f32"), f"a GEMM of {a.dtype} and {m2.dtype}")
    need(d.is_contiguous() and d.offset == 0, "a batched GEMM output that is not contiguous")
    batches = a.shape[0]
    need(batches <= BMM_BATCHES_MAX, f"bmm of {batches} batches (programs write one GEMM a batch, at most "
         f"{BMM_BATCHES_MAX})")
    for v in (a, m2):
        _transposed(v.shape[1:], v.strides[1:])   # refuses before anything is written
    an, mn, dn = b.read(a), b.read(m2), b.write(d)
    for i in range(batches):
        aa, ta = _gemm_slice(b, an, a.shape[1:], a.strides[1:], i * a.strides[0])
        bb, tb = _gemm_slice(b, mn, m2.shape[1:], m2.strides[1:], i * m2.strides[0])
        dd = b.view_named(dn, d.shape[1:], d.strides[1:], i * d.strides[0])
        b.node("gemm", {"a": aa, "b": bb, "d": dd}, trans_a=ta or None, trans_b=tb or None)


@handles("aten._scaled_mm.default")
def scaled_mm(b, op):
    """torch._scaled_mm: FP8 a [M, K] row major times b [K, N] column major
    (cuBLASLt's TN, the only FP8 layout regend takes), per-tensor scales
    that turn stored values into real ones (as regend's a_scale and
    b_scale), an optional bias, and for an FP8 result its scale;
    use_fast_accum as regend's compute fp8_fast_accum."""
    a, m2, d = op.a["self"], op.a["mat2"], out(op)
    sa, sb, bias, sd = op.a["scale_a"], op.a["scale_b"], op.a.get("bias"), op.a.get("scale_result")
    need(a.dtype in ("e4m3", "e5m2") and m2.dtype in ("e4m3", "e5m2"), f"_scaled_mm of {a.dtype} and {m2.dtype}")
    need(not _transposed(a.shape, a.strides) and _transposed(m2.shape, m2.strides),
         "_scaled_mm whose a is not row major or whose b is not column major (regend's FP8 GEMM is TN)")
    for sc in (sa, sb) + ((sd,) if sd is not None else ()):
        need(isinstance(sc, Val) and sc.numel == 1 and sc.dtype == "f32", "_scaled_mm with other than one f32 scale "
             "a tensor (block scales are not taken)")
    need(d.is_contiguous() and d.offset == 0, "_scaled_mm into a strided result")
    params = {"a": b.read(a), "b": b.view(m2, [m2.shape[1], m2.shape[0]], [m2.strides[1], m2.strides[0]]),
              "d": b.write(d), "a_scale": b.view(sa, [1], [1]), "b_scale": b.view(sb, [1], [1])}
    attrs = {"trans_b": True}
    if sd is not None and d.dtype in ("e4m3", "e5m2"):
        params["d_scale"] = b.view(sd, [1], [1])
    if bias is not None:
        need(bias.shape == (d.shape[1],) and bias.strides == (1,), "_scaled_mm whose bias is not a row")
        need(d.dtype in ("bf16", "f16"), f"_scaled_mm with a bias into {d.dtype} (regend adds one into bf16 or f16)")
        params["bias"] = b.read(bias)
        attrs["epilogue"] = "bias"
    if op.a.get("use_fast_accum"):
        attrs["compute"] = "fp8_fast_accum"
    b.node("gemm", params, **attrs)


# ---- layer norm ---------------------------------------------------------------

def _lead_stride(shape, strides):
    """The stride of the leading dims (all but the last) read as one: the
    innermost's, where each outer one steps over the whole of the inner
    (dims of one element do not count); None where they do not collapse,
    or are all of one element."""
    lead = [(d, st) for d, st in zip(shape[:-1], strides[:-1]) if d > 1]
    if not lead:
        return None
    step = lead[-1][1]
    for d, st in reversed(lead):
        if st != step:
            return None
        step = st * d
    return lead[-1][1]


def _even_rows(v):
    """The row stride of v [..., n] read as [rows, n], or None."""
    n = v.shape[-1]
    if not (v.strides[-1] == 1 or n == 1):
        return None
    if all(d == 1 for d in v.shape[:-1]):
        return n
    row_stride = _lead_stride(v.shape, v.strides)
    return row_stride if row_stride is not None and row_stride >= n else None


def _rows(b, v, write=False):
    """v [..., n] as the norms take it, [rows, n] with rows strided; a
    read of other strides is copied to a contiguous scratch first."""
    need(len(v.shape) >= 1, "a rank-0 tensor where rows are wanted")
    n = v.shape[-1]
    rows = math.prod(v.shape[:-1])
    row_stride = _even_rows(v)
    if row_stride is None:
        need(not write, "rows that are not evenly strided")
        copy = b.scratch(v.dtype, v.shape)
        b.node("cast", [b.read(v)], [copy])
        return b.view_named(copy, [rows, n], [n, 1])
    name = b.write(v) if write else b.read(v)
    if len(v.shape) == 2 and v.strides[0] == row_stride:
        return name
    return b.view_named(name, [rows, n], [row_stride, 1])


def _weight(b, w, x):
    """LayerNorm's weight, or ones where the layer has none
    (elementwise_affine=False): the program's layer_norm takes one."""
    if w is not None:
        return b.read(w)
    ones = b.scratch(x.dtype, [x.shape[-1]])
    b.node("fill", [], [ones], scalar=1.0)
    return ones


@handles("aten.native_layer_norm.default")
def layer_norm(b, op):
    x, w, bias = op.a["input"], op.a["weight"], op.a["bias"]
    need(len(op.a["normalized_shape"]) == 1, "layer_norm over more than the last dimension")
    need_float(x, w)
    need((w is None or w.dtype == x.dtype) and (bias is None or bias.dtype == x.dtype),
         "layer_norm's weight in another dtype")
    need((w is None or w.is_contiguous()) and (bias is None or bias.is_contiguous()), "layer_norm's weight is strided")
    y, mean, rstd = op.outs[0], op.outs[1], op.outs[2]
    need(isinstance(y, Val) and y.is_contiguous(), "layer_norm's output is strided")
    rows = x.numel // x.shape[-1]
    for s in (mean, rstd):
        need(not isinstance(s, Val) or (s.dtype == "f32" and s.is_contiguous()), "layer_norm's statistics")
    params = {"x": _rows(b, x), "weight": _weight(b, w, x), "bias": b.read(bias) if bias is not None else None,
              "y": _rows(b, y, write=True)}
    for key, s in (("mean", mean), ("rstd", rstd)):
        if isinstance(s, Val):
            params[key] = b.view_named(b.write(s), [rows], [1])
    b.node("layer_norm", params, eps=float(op.a["eps"]))


@handles("aten.native_layer_norm_backward.default")
def layer_norm_backward(b, op):
    dy, x, mean, rstd, w = op.a["grad_out"], op.a["input"], op.a["mean"], op.a["rstd"], op.a["weight"]
    need(len(op.a["normalized_shape"]) == 1, "layer_norm over more than the last dimension")
    need_float(dy, x, w)
    dx, dw, db = (op.outs + [None, None, None])[:3]
    need(isinstance(dx, Val) and dx.is_contiguous(), "layer_norm_backward without d_x, or strided")
    rows = x.numel // x.shape[-1]
    for s in (mean, rstd):
        need(s.dtype == "f32" and s.is_contiguous() and s.numel == rows, "layer_norm's statistics")
    need(w is None or w.is_contiguous(), "layer_norm's weight is strided")
    for g in (dw, db):
        need(not isinstance(g, Val) or (g.is_contiguous() and g.dtype == (w or x).dtype), "a strided weight gradient")
    params = {"d_y": _rows(b, dy), "x": _rows(b, x), "weight": _weight(b, w, x),
              "mean": b.view_named(b.read(mean), [rows], [1]), "rstd": b.view_named(b.read(rstd), [rows], [1])}
    summed = _residual_sum(b, dx)
    if summed is not None:
        # d_x + the gradient through the residual connection, in one pass.
        residual, total, add = summed
        params["d_residual"] = _rows(b, residual)
        params["d_x"] = _rows(b, total, write=True)
        b.made[dx.id] = dx
        b.absorb(add)
    else:
        params["d_x"] = _rows(b, dx, write=True)
    if isinstance(dw, Val):
        params["d_weight"] = b.write(dw)
    if isinstance(db, Val):
        params["d_bias"] = b.write(db)
    b.node("layer_norm_backward", params)


def _residual_sum(b, dx):
    """(residual, total, add) where LayerNorm's d_x is read by one add
    alone, total = d_x + residual, the residual already made (before the
    norm's backward, in this segment or by the rank) and all three of one
    shape, dtype and contiguous layout: LayerNormBackward's d_residual
    writes the sum itself.  None otherwise."""
    if dx.is_output or len(dx.users) != 1:
        return None
    add = dx.users[0]
    if add.target != "aten.add.Tensor" or add.a.get("alpha", 1) != 1:
        return None
    a, c = add.a.get("self"), add.a.get("other")
    residual = c if a is dx else a if c is dx else None
    total = add.outs[0] if add.outs else None
    if not (isinstance(residual, Val) and residual is not dx and isinstance(total, Val)):
        return None
    if residual.producer is not None and residual.id not in b.made:
        return None
    same = all(v.shape == dx.shape and v.dtype == dx.dtype and v.is_contiguous() for v in (residual, total))
    return (residual, total, add) if same else None


# ---- attention -------------------------------------------------------------------

ATTENTION = ("aten._scaled_dot_product_flash_attention.default",
             "aten._scaled_dot_product_efficient_attention.default",
             "aten._scaled_dot_product_cudnn_attention.default")
ATTENTION_BACKWARD = ("aten._scaled_dot_product_flash_attention_backward.default",
                      "aten._scaled_dot_product_efficient_attention_backward.default",
                      "aten._scaled_dot_product_cudnn_attention_backward.default")


def _att_operand(v, what):
    need(isinstance(v, Val) and len(v.shape) == 4, f"attention's {what} is not [B, H, S, D]")
    need(v.dtype in ("bf16", "f16"), f"attention's {what} is {v.dtype} (bf16 or f16 only)")
    need(v.strides[-1] == 1, f"attention's {what} has a last stride other than 1")


def _att_common(op, q, k, v):
    for x, what in ((q, "query"), (k, "key"), (v, "value")):
        _att_operand(x, what)
    need(not op.a.get("dropout_p"), "attention with dropout")
    need(op.a.get("attn_bias") is None, "attention with a bias or mask")
    causal = bool(op.a.get("is_causal", False))
    need(not causal or q.shape[2] == k.shape[2], "causal attention with Sq != Skv (alignment)")
    scale = op.a.get("scale")
    need(scale is None or is_scalar(scale), "attention scale")
    return {"causal": causal or None, "scale": None if scale is None else float(scale)}


def _stats_view(b, lse, shape, write):
    need(isinstance(lse, Val) and lse.dtype == "f32" and len(lse.shape) >= 3, "attention's log-sum-exp")
    B, H, S = shape
    need(lse.shape[0] == B and lse.shape[1] == H and lse.shape[2] >= S, "attention's log-sum-exp shape")
    name = b.write(lse) if write else b.read(lse)
    return b.view_named(name, [B, H, S], [lse.strides[0], lse.strides[1], lse.strides[2]])


@handles(*ATTENTION)
def attention(b, op):
    q, k, v = op.a["query"], op.a["key"], op.a["value"]
    attrs = _att_common(op, q, k, v)
    o = out(op)
    _att_operand(o, "output")
    lse = op.outs[1] if len(op.outs) > 1 else None
    params = {"q": b.read(q), "k": b.read(k), "v": b.read(v), "o": b.write(o)}
    if isinstance(lse, Val) and lse.numel > 0:
        params["stats"] = _stats_view(b, lse, q.shape[:3], write=True)
    b.node("attention", params, **attrs)
    for extra in op.outs[2:] + ([lse] if isinstance(lse, Val) and lse.numel == 0 else []):
        b.dummy(extra) if isinstance(extra, Val) else b.const(extra)


@handles(*ATTENTION_BACKWARD)
def attention_backward(b, op):
    do = op.a.get("grad_out", op.a.get("grad_out_"))
    q, k, v, o, lse = op.a["query"], op.a["key"], op.a["value"], op.a["out"], op.a["logsumexp"]
    attrs = _att_common(op, q, k, v)
    _att_operand(o, "output")
    _att_operand(do, "output's gradient")
    dq, dk, dv = op.outs[0], op.outs[1], op.outs[2]
    for g, what in ((dq, "d_q"), (dk, "d_k"), (dv, "d_v")):
        _att_operand(g, what)
    if len(op.outs) > 3 and isinstance(op.outs[3], Val):
        need(op.outs[3].numel == 0, "attention's bias gradient")
        b.dummy(op.outs[3])
    b.node("attention_backward", {"q": b.read(q), "k": b.read(k), "v": b.read(v), "o": b.read(o),
                                  "d_o": b.read(do), "stats": _stats_view(b, lse, q.shape[:3], write=False),
                                  "d_q": b.write(dq), "d_k": b.write(dk), "d_v": b.write(dv)}, **attrs)


# ---- embedding -------------------------------------------------------------------

@handles("aten.embedding.default")
def embedding(b, op):
    table, index, rows = op.a["weight"], op.a["indices"], out(op)
    need(op.a.get("padding_idx", -1) == -1 and not op.a.get("scale_grad_by_freq") and not op.a.get("sparse"),
         "embedding with padding_idx, scale_grad_by_freq or sparse")
    need(index.dtype in ("i64", "i32"), f"embedding indices of {index.dtype}")
    need(table.is_contiguous() and rows.is_contiguous(), "a strided embedding table")
    b.node("embedding", [b.read(table), b.read(index)], [b.write(rows)])


@handles("aten.embedding_dense_backward.default")
def embedding_backward(b, op):
    grad, index, table_grad = op.a["grad_output"], op.a["indices"], out(op)
    need(op.a.get("padding_idx", -1) == -1 and not op.a.get("scale_grad_by_freq"),
         "embedding backward with padding_idx or scale_grad_by_freq")
    need(index.dtype in ("i64", "i32"), f"embedding indices of {index.dtype}")
    need(grad.is_contiguous() and table_grad.is_contiguous(), "a strided embedding gradient")
    b.node("embedding_backward", [b.read(grad), b.read(index)], [b.write(table_grad)])


# ---- softmax and the loss --------------------------------------------------------

def _last_dim(op, x):
    d = op.a.get("dim")
    need(isinstance(d, int) and d % len(x.shape) == len(x.shape) - 1, "softmax over a dim other than the last")


@handles("aten._log_softmax.default", "aten._softmax.default")
def softmax(b, op):
    x, y = op.a["self"], out(op)
    need_float(x, y)
    _last_dim(op, x)
    need(x.is_contiguous() and y.is_contiguous(), "a strided softmax")
    _write_softmax(b, op, b.read(x), y, op.index)


def _write_softmax(b, op, x, y, at):
    """Softmax ``op`` of program tensor ``x`` into Val ``y``; but
    log-probabilities that only a loss reads (_loss_of) are never written:
    the rows' logsumexp is, and the loss reads the logits (a [N, V] f32
    tensor as large as the logits twice over, written and read back, where
    the vocabulary is large).  ``at``: the index of the op being written
    (the softmax's, or a cast's before it that it absorbs)."""
    found = _loss_of(op, y, at) if "log" in op.target else None
    if found is None:
        b.node("log_softmax" if "log" in op.target else "softmax", [x], [b.write(y)])
        return
    readers, aliases = found
    loss = readers[0]
    lse = b.scratch("f32", [y.shape[0]])
    b.node("logsumexp", [x], [lse], axis="last")
    if loss.target == "aten.nll_loss_forward.default":
        _nll_loss_rows(b, loss, x, lse)
    else:
        _cross_entropy_backward(b, loss, readers[1], x, lse)
    b.absorb(loss)
    b.dummy(y)
    for a in aliases:
        b.absorb(a)
        b.dummy(a.out_vals()[0])


_ALIASES = ("aten.detach.default", "aten.alias.default")


def _loss_of(op, y, at):
    """The loss that alone reads log-probabilities ``y`` (not returned),
    directly or through aliases (detach): nll_loss_forward, or
    nll_loss_backward with the log_softmax backward that alone reads it
    (the backward recomputes the log-probabilities from the saved logits,
    regen.torch._partition); its checks passed, and everything else it
    reads made before op ``at``, where the softmax is written.  (readers,
    aliases): the loss, then its log_softmax backward where it has one; or
    None."""
    if y.is_output or not y.users or len(y.shape) != 2 or not y.is_contiguous():
        return None
    readers, aliases, seen = [], [], [y]
    while seen:
        v = seen.pop()
        for u in v.users:
            outs = u.out_vals()
            if u.target in _ALIASES and u.a.get("self") is v and len(outs) == 1:
                w = outs[0]
                if w.is_output or (w.storage, w.offset, w.shape, w.strides) != (y.storage, y.offset, y.shape, y.strides):
                    return None
                aliases.append(u)
                seen.append(w)
            elif u not in readers:
                readers.append(u)
    readers.sort(key=lambda u: u.index)
    first = readers[0]
    try:
        if first.target == "aten.nll_loss_forward.default" and len(readers) == 1 and first.a.get("self") is y:
            _need_nll(first, y)
        elif first.target == "aten.nll_loss_backward.default" and len(readers) == 2 and first.a.get("self") is y:
            if _log_softmax_backward_of(first, y) is not readers[1]:
                return None
            _need_nll(first, y)
        else:
            return None
    except Unsupported:
        return None
    ours = readers + aliases
    for u in readers:
        for v in u.inputs():
            if v.producer is not None and v.producer is not op and v.producer not in ours and \
                    v.producer.index > at:
                return None
    return readers, aliases


@handles("aten._log_softmax_backward_data.default", "aten._softmax_backward_data.default")
def softmax_backward(b, op):
    dy, y, dx = op.a["grad_output"], op.a["output"], out(op)
    need_float(dy, y, dx)
    _last_dim(op, y)
    need(dy.is_contiguous() and y.is_contiguous(), "a strided softmax")
    name = "log_softmax_backward" if "log" in op.target else "softmax_backward"
    b.node(name, [b.read(dy), b.read(y)], [b.write(dx)])


def _scalar_scratch(b, dtype):
    root = b.scratch(dtype, [1])
    return b.view_named(root, [], [])


def _need_nll(op, logp):
    """What the nll handlers take: no class weights, a mean or a sum, [N, C]
    log-probabilities, integer targets."""
    need(op.a.get("weight") is None, "nll_loss with class weights")
    need(op.a.get("reduction", 1) in (1, 2), "nll_loss without a reduction")
    need(len(logp.shape) == 2 and logp.is_contiguous(), "nll_loss of other than [N, C]")
    target = op.a["target"]
    need(isinstance(target, Val) and target.dtype in ("i64", "i32") and target.is_contiguous(), "nll_loss targets")
    need_float(logp)


@handles("aten.nll_loss_forward.default")
def nll_loss(b, op):
    """Of log-probabilities: each row's loss is minus its target's
    log-probability, picked by a gather (the log-probabilities seen as rows
    of one element, row i * C + target), 0 where the target is
    ignore_index; summed and divided by the rows kept.  One element a row
    is read, not the row: the log-probabilities are as large as the logits.
    A target outside [0, C) (other than ignore_index) is a bad index the
    gather reports by name, as torch's kernel asserts."""
    logp = op.a["self"]
    _need_nll(op, logp)
    _nll_loss_rows(b, op, b.read(logp), None)


def _nll_loss_rows(b, op, rows_of, lse):
    """nll_loss_forward ``op`` over program tensor ``rows_of`` [N, C]: the
    log-probabilities, or (``lse`` the rows' logsumexp, [N]) the logits,
    whose target's log-probability is its logit minus the row's lse."""
    logp, target = op.a["self"], op.a["target"]
    reduction = op.a.get("reduction", 1)
    loss, total = out(op, 0), out(op, 1)
    ignore = float(op.a.get("ignore_index", -100))
    n, c = logp.shape
    # The index in f64 (exact below 2**53; programs compute on floats),
    # cast to i64 for the gather.
    t = b.read(target)
    keep = b.scratch("u8", [n])
    b.node("ne", [t], [keep], scalar=ignore)
    tf = b.scratch("f64", [n])
    b.node("cast", [t], [tf])
    row = b.scratch("f64", [n])
    b.node("iota", [], [row], axis=0)
    start = b.scratch("f64", [n])
    b.node("mul", [row], [start], scalar=float(c))
    index = b.scratch("f64", [n])
    b.node("add", [start, tf], [index])
    for cmp, bound in (("ge", 0.0), ("lt", float(c))):
        inside = b.scratch("u8", [n])
        b.node(cmp, [t], [inside], scalar=bound)
        checked = b.scratch("f64", [n])
        b.node("where", [inside, index], [checked], scalar=-1.0)
        index = checked
    kept_index = b.scratch("f64", [n])
    b.node("where", [keep, index], [kept_index], scalar=0.0)
    safe = b.scratch("i64", [n])
    b.node("cast", [kept_index], [safe])
    picked = b.scratch(b.dtype_of(rows_of), [n, 1])
    b.node("embedding", [b.view_named(rows_of, [n * c, 1], [1, 1]), safe], [picked])
    minus = b.scratch("f32", [n])
    if lse is None:
        b.node("neg", [b.view_named(picked, [n], [1])], [minus])
    else:
        b.node("sub", [lse, b.view_named(picked, [n], [1])], [minus])
    rows = b.scratch("f32", [n])
    b.node("where", [keep, minus], [rows], scalar=0.0)
    kept = b.scratch("f32", [n])
    b.node("cast", [keep], [kept])
    b.node("sum", [kept], [b.write(total)], axis="last")
    if reduction == 2:
        b.node("sum", [rows], [b.write(loss)], axis="last")
        return
    s = _scalar_scratch(b, "f32")
    b.node("sum", [rows], [s], axis="last")
    b.node("div", [s, b.read(total)], [b.write(loss)])


def _log_softmax_backward_of(op, logp):
    """The log_softmax backward that alone reads nll_loss_backward ``op``'s
    gradient, of the same log-probabilities ``logp``; else Unsupported."""
    grad_logp = out(op)
    users = grad_logp.users
    need(len(users) == 1 and not grad_logp.is_output,
         f"nll_loss_backward's gradient is read by {[u.target for u in users]}"
         f"{' and returned' if grad_logp.is_output else ''}, not by log_softmax's backward alone")
    need(users[0].target == "aten._log_softmax_backward_data.default" and users[0].a.get("grad_output") is grad_logp,
         f"nll_loss_backward is followed by {users[0].target}, not log_softmax's backward")
    read = users[0].a.get("output")
    need(isinstance(read, Val) and (read.storage, read.offset, read.shape, read.strides) ==
         (logp.storage, logp.offset, logp.shape, logp.strides),
         f"log_softmax's backward reads {read!r}, not the log-probabilities {logp!r} the loss read")
    need(out(users[0]).is_contiguous(), "nll_loss of other than [N, C]")
    return users[0]


@handles("aten.nll_loss_backward.default")
def nll_loss_backward(b, op):
    """With the log_softmax backward that reads it: softmax minus one-hot,
    times the loss's gradient over the rows kept, as cross_entropy_backward
    writes it (log-probabilities in, their log-sum-exp 0)."""
    logp = op.a["self"]
    _need_nll(op, logp)
    consumer = _log_softmax_backward_of(op, logp)
    zero = b.scratch("f32", [logp.shape[0]])
    b.node("fill", [], [zero], scalar=0.0)
    _cross_entropy_backward(b, op, consumer, b.read(logp), zero)


def _cross_entropy_backward(b, op, consumer, rows_of, lse):
    """nll_loss_backward ``op`` and ``consumer``, the log_softmax backward
    after it (_log_softmax_backward_of), as one cross_entropy_backward over
    program tensor ``rows_of`` [N, C] with its rows' logsumexp ``lse``
    (log-probabilities and 0, or the logits and theirs)."""
    g, logp, target, total = op.a["grad_output"], op.a["self"], op.a["target"], op.a["total_weight"]
    dx = out(consumer)
    ignore = float(op.a.get("ignore_index", -100))
    n = logp.shape[0]
    dl = b.scratch("f32", [n])
    if op.a.get("reduction", 1) == 1:
        b.node("div", [b.read(g), b.read(total)], [dl])
    else:
        b.node("cast", [b.read(g)], [dl])
    b.node("cross_entropy_backward", [dl, rows_of, b.read(target), lse], [b.write(dx)], ignore_index=ignore)
    b.absorb(consumer)
    b.dummy(out(op))
