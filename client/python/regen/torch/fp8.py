# SPDX-License-Identifier: Apache-2.0
"""FP8 training through regend, as Transformer Engine's delayed scaling.

    import regen.torch as rt
    from regen.torch import fp8

    layer = fp8.Linear(1024, 4096, device="cuda", dtype=torch.bfloat16)
    recipe = fp8.DelayedScaling(amax_history_len=16, amax_compute_algo="max", margin=0,
                                fp8_format=fp8.Format.HYBRID)
    with rt.fp8_autocast(enabled=True, recipe=recipe):
        y = layer(x)                 # FP8 GEMM in regend; outside the scope, regend's bf16 GEMM
    y.float().sum().backward()      # the gradients' GEMMs in FP8 too (e5m2 gradients with HYBRID)

A Linear's FP8 scaling state is the rank's tensors, buffers of the module
(so state_dict(), rt.keep() and a checkpoint carry it): per direction an
amax history [amax_history_len, n] and a scale [n] (forward: the input's and
the weight's, n = 2; backward: the output gradient's, n = 1), f32. regend
reads and updates them where they are, so a restart or a fault of regend's
worker loses none of it, and each pass's update lands exactly once.

Eagerly each pass is one io.regen.Program Run (regen.torch's run_program,
on torch's current stream), one hand-off; under torch.compile(backend=
"regen") its nodes are part of the compiled forward's and backward's
programs (below).  The nodes (regen.fp8_programs, written once):

  forward   ScaleUpdate of the forward state (Transformer Engine's
            amax_and_scale_update: the history's max, or its newest, and
            the margin, into a new scale; the history rolled), both
            TransposeQuantizes (the input and the weight into e4m3 and e4m3
            transposed, their amax into the history's row 0), the FP8 GEMM
            y = x @ w.T with the new scales' inverses, the bias;
  backward  ScaleUpdate of the backward state, TransposeQuantize of the
            output gradient (e5m2 with HYBRID, e4m3 with E4M3), the two FP8
            GEMMs dx = dy @ w (w's transposed copy from the forward) and
            dw = dy.T @ x (x's), the bias gradient summed in f32.

The updates are computed into the program's own memory and assigned to the
state as its last nodes, and every Run names a journal: a Run a fault cuts
is retried once the device serves again and applies the update once, never
twice or half (io.regen.Program.Run's journal); a Run regend refuses (a bad
scale: 0, negative, infinite or NaN, which the host backend checks) leaves
the state as it was. The scales' inverses each pass used are fresh tensors
(``layer.fp8_scale_inv_fwd``, ``fp8_scale_inv_bwd``), kept for the backward,
so a second forward before a backward changes nothing the first needs.

Under torch.compile(backend="regen") (torch 2.5 and later:
graphs_take_fp8()) the layer is traced as the custom ops regen::fp8_linear
and regen::fp8_linear_backward (_fp8_ops), functional, each followed by
the copy_ of its state update into the buffers: AOTAutograd keeps those
copy_s in the forward's and the backward's graphs, and the backend writes
the ops as the nodes above and each copy_ as an assignment of the buffer,
bound as an inout, in the same program; a whole training step is then two
Runs, each with a journal where it updates state, so a Run a fault cuts
applies it once there too.  The state is made as dynamo traces the first
call (_make_state); the scales' inverses are not kept on the layer there.

FP8 tensors are torch's float8_e4m3fn / float8_e5m2 where torch has them
(2.1 and later), uint8 storage of the same bytes otherwise (torch 1.13).
docs/torch.md ("FP8") says what the CUDA backend needs (dimensions
multiples of 16).
"""

import contextlib
import enum
import itertools
import math
import sys
import threading
import weakref
from typing import Any, Dict, Iterator, Optional

import torch

from ..fp8_programs import Scaling, backward_definition, forward_definition
from ._on_import import when_imported
from ._runtime import NotSupported, host_empty

__all__ = ["Format", "DelayedScaling", "fp8_autocast", "is_fp8_enabled", "get_fp8_recipe", "Linear",
           "FP8_STORAGE_DTYPES", "graphs_take_fp8"]

_package = sys.modules[__name__.rpartition(".")[0]]

# torch's FP8 dtypes where it has them; uint8 holds the same bytes where it
# does not (torch 1.13).
FP8_STORAGE_DTYPES = {name: getattr(torch, attr, torch.uint8)
                      for name, attr in (("e4m3", "float8_e4m3fn"), ("e5m2", "float8_e5m2"))}
_DTYPES = {torch.float32: "f32", torch.float16: "f16", torch.bfloat16: "bf16"}
# cuBLASLt's FP8 kernels want 16-byte rows (docs/protocol.md, Gemm's FP8).
_CUDA_MULTIPLE = 16


class Format(enum.Enum):
    """Which FP8 format each pass quantizes to (Transformer Engine's
    recipe.Format): E4M3 everywhere, or HYBRID, E4M3 forward (activations
    and weights) and E5M2 backward (gradients: more range, less
    precision). All-E5M2 is not offered: cuBLASLt has no GEMM of two E5M2
    operands."""
    E4M3 = ("e4m3", "e4m3")
    HYBRID = ("e4m3", "e5m2")

    @property
    def forward(self):
        return self.value[0]

    @property
    def backward(self):
        return self.value[1]


class DelayedScaling:
    """Transformer Engine's delayed-scaling recipe: each tensor's scale for
    this step comes from the amaxes of earlier steps, ``scale = fp8_max *
    2^-margin / amax``, amax the largest of the last ``amax_history_len``
    (``amax_compute_algo="max"``) or the newest (``"most_recent"``)."""

    __slots__ = ("margin", "fp8_format", "amax_history_len", "amax_compute_algo")

    def __init__(self, margin=0, fp8_format=Format.HYBRID, amax_history_len=1024, amax_compute_algo="max"):
        if isinstance(fp8_format, str):
            fp8_format = Format.__members__.get(fp8_format.upper(), fp8_format)
        if not isinstance(fp8_format, Format):
            raise ValueError(f"fp8_format {fp8_format!r}: Format.E4M3 or Format.HYBRID (no E5M2 forward: "
                             "cuBLASLt multiplies no two E5M2 operands)")
        if isinstance(margin, bool) or not isinstance(margin, (int, float)) or not math.isfinite(margin) \
                or abs(margin) > 126:
            raise ValueError(f"margin {margin!r}: a finite number of binades, |margin| <= 126")
        if isinstance(amax_history_len, bool) or not isinstance(amax_history_len, int) or amax_history_len < 1:
            raise ValueError(f"amax_history_len {amax_history_len!r}: a whole number >= 1")
        if amax_compute_algo not in ("max", "most_recent"):
            raise ValueError(f"amax_compute_algo {amax_compute_algo!r}: 'max' or 'most_recent' (a callable, "
                             "as Transformer Engine allows, cannot run in regend)")
        self.margin = float(margin)
        self.fp8_format = fp8_format
        self.amax_history_len = amax_history_len
        self.amax_compute_algo = amax_compute_algo

    def _scaling(self, direction):
        """The recipe as a direction's nodes take it ("forward", "backward")."""
        return Scaling(getattr(self.fp8_format, direction), self.amax_compute_algo, self.margin,
                       self.amax_history_len)

    def __repr__(self):
        return (f"DelayedScaling(margin={self.margin:g}, fp8_format=Format.{self.fp8_format.name}, "
                f"amax_history_len={self.amax_history_len}, amax_compute_algo={self.amax_compute_algo!r})")


_autocast = threading.local()


@contextlib.contextmanager
def fp8_autocast(enabled: bool = True, recipe: Optional["DelayedScaling"] = None,
                 fp8_recipe: Optional["DelayedScaling"] = None) -> Iterator[None]:
    """Inside the scope (this thread's), regen.torch.fp8 layers run their
    GEMMs in FP8 with ``recipe`` (a DelayedScaling; None: the default one;
    ``fp8_recipe`` is Transformer Engine's name for it). Scopes nest; the
    innermost decides. The backward of a forward made inside runs in FP8
    too, wherever it runs."""
    recipe = recipe if recipe is not None else fp8_recipe
    if recipe is not None and not isinstance(recipe, DelayedScaling):
        raise TypeError(f"recipe must be a regen.torch.fp8.DelayedScaling, not {type(recipe).__name__}")
    stack = getattr(_autocast, "stack", None)
    if stack is None:
        stack = _autocast.stack = []
    stack.append((bool(enabled), recipe or DelayedScaling()))
    try:
        yield
    finally:
        stack.pop()


def is_fp8_enabled():
    stack = getattr(_autocast, "stack", None)
    return bool(stack) and stack[-1][0]


def get_fp8_recipe():
    """The recipe of the innermost enabled scope, or None."""
    stack = getattr(_autocast, "stack", None)
    return stack[-1][1] if stack and stack[-1][0] else None


# ---- tensors where regend binds them ------------------------------------------

def _empty(shape, dtype, like):
    if like.device.type == "cpu":
        return host_empty(shape, dtype)
    return torch.empty(shape, dtype=dtype, device=like.device)


def _in_host_pool(t):
    """Whether CPU tensor ``t`` lies whole in libregen's host pool (a
    program Run binds CPU tensors there only); a local lookup, no call."""
    pool = _package.runtime().pool
    if pool is None:
        return False
    chunk = pool.chunk_of(t.data_ptr())
    return chunk is not None and chunk["device"] == -1 and \
        chunk["offset"] + _extent(t) * t.element_size() <= chunk["bytes"]


def _extent(t):
    """Elements from t's first to one past its last."""
    return 1 + sum((n - 1) * s for n, s in zip(t.shape, t.stride())) if t.numel() else 0


def _bindable(t):
    """``t`` where a Run can bind it: itself on the GPU or in the host pool,
    else a copy into the host pool (a CPU tensor from elsewhere)."""
    if t is None or t.device.type != "cpu" or _in_host_pool(t):
        return t
    copy = host_empty(list(t.shape), t.dtype)
    copy.copy_(t)
    return copy


def _rows(t, cols):
    """``t`` as [rows, cols] with unit column stride (a view where it can
    be, else a copy on the rank)."""
    t2 = t.reshape(-1, cols)
    if t2.stride(-1) != 1 or (t2.shape[0] > 1 and t2.stride(0) < cols):
        _package.runtime().rank_work()
        t2 = t2.contiguous()
    return t2


def _strides(t):
    """Row-major strides where a dimension is 1 (torch gives such a
    dimension any stride; a program's tensor wants the row-major one)."""
    return [t.stride(0) if t.shape[0] > 1 else t.shape[1], 1]


def _dtype_of(name, t):
    dt = _DTYPES.get(t.dtype)
    if dt is None:
        raise TypeError(f"regen.torch.fp8: {name} is {t.dtype}; FP8 layers take float32, float16 or bfloat16")
    return dt


# ---- the two programs (regen.fp8_programs writes them) ------------------------

_definitions: Dict[Any, Any] = {}


def _definition(make, *args):
    """make(*args) (a pass's program), made once per arguments: the key
    the Run goes by, and the definition."""
    key = (make.__name__,) + tuple(tuple(a) if isinstance(a, list) else a for a in args)
    d = _definitions.get(key)
    if d is None:
        d = _definitions[key] = make(*args)
    return key, d


class _Fp8LinearFunction(torch.autograd.Function):
    """The FP8 Linear's two passes, one program Run each."""

    @staticmethod
    def forward(ctx, x, weight, bias, layer, recipe):
        n, k = weight.shape
        xdt, wdt = _dtype_of("input", x), _dtype_of("weight", weight)
        bdt = _dtype_of("bias", bias) if bias is not None else None
        if x.shape[-1] != k:
            raise ValueError(f"regen.torch.fp8.Linear: input's last dimension is {x.shape[-1]}, the layer takes {k}")
        x2 = _rows(x, k)
        m = x2.shape[0]
        _check_cuda_shape(x, m, n, k)
        state = layer._fp8_state(recipe.amax_history_len, weight.device)
        x2, w, b = _bindable(x2), _bindable(weight), _bindable(bias)
        fmt = recipe.fp8_format.forward
        y = _empty([m, n], x.dtype, x)
        xt = _empty([k, m], FP8_STORAGE_DTYPES[fmt], x)
        wt = _empty([k, n], FP8_STORAGE_DTYPES[fmt], x)
        inv = _empty([2], torch.float32, x)
        scaling = recipe._scaling("forward")
        key, definition = _definition(forward_definition, m, n, k, xdt, wdt, bdt, _strides(x2), _strides(w),
                                      scaling, True)
        tensors = {"input": x2, "weight": w, "fwd.amax_history": state["fp8_amax_history_fwd"],
                   "fwd.scale": state["fp8_scale_fwd"], "fwd.scale_inv": inv, "output": y, "input.fp8_t": xt,
                   "weight.fp8_t": wt}
        if b is not None:
            tensors["bias"] = b
        _package.runtime().run_program(("fp8_linear", key), definition, tensors, journal=layer._fp8_journal)
        layer.fp8_scale_inv_fwd = inv
        ctx.save_for_backward(xt, wt, inv)
        ctx.layer, ctx.recipe = layer, recipe
        ctx.shapes = (m, n, k, xdt, wdt, bdt, x.shape)
        return y.view(*x.shape[:-1], n)

    @staticmethod
    def backward(ctx, grad):
        xt, wt, fwd_inv = ctx.saved_tensors
        m, n, k, xdt, wdt, bdt, x_shape = ctx.shapes
        layer, recipe = ctx.layer, ctx.recipe
        need_dx, need_dw = ctx.needs_input_grad[0], ctx.needs_input_grad[1]
        need_db = bdt is not None and ctx.needs_input_grad[2]
        if grad.dtype != _DTYPE_TORCH[xdt]:
            _package.runtime().rank_work()
            grad = grad.to(_DTYPE_TORCH[xdt])
        dy = _bindable(_rows(grad, n))
        state = layer._fp8_state(recipe.amax_history_len, xt.device)
        like = xt
        dx = _empty([m, k], _DTYPE_TORCH[xdt], like) if need_dx else None
        dw = _empty([n, k], _DTYPE_TORCH[wdt], like) if need_dw else None
        db = _empty([n], _DTYPE_TORCH[bdt], like) if need_db else None
        inv = _empty([1], torch.float32, like)
        scaling = recipe._scaling("backward")
        key, definition = _definition(backward_definition, m, n, k, xdt, wdt, bdt if need_db else None,
                                      _strides(dy), scaling, recipe.fp8_format.forward, need_dx, need_dw, True)
        tensors = {"grad_output": dy, "input.fp8_t": xt, "weight.fp8_t": wt, "fwd.scale_inv": fwd_inv,
                   "bwd.amax_history": state["fp8_amax_history_bwd"], "bwd.scale": state["fp8_scale_bwd"],
                   "bwd.scale_inv": inv}
        for name, t in (("grad_input", dx), ("grad_weight", dw), ("grad_bias", db)):
            if t is not None:
                tensors[name] = t
        _package.runtime().run_program(("fp8_linear", key), definition, tensors, journal=layer._fp8_journal)
        layer.fp8_scale_inv_bwd = inv
        return (dx.view(x_shape) if dx is not None else None), dw, db, None, None


_DTYPE_TORCH = {v: k for k, v in _DTYPES.items()}


def _check_cuda_shape(x, m, n, k):
    """The CUDA backend's FP8 GEMMs take rows of 16-byte multiples (the
    host backend any): named here, before anything runs."""
    if x.device.type != "cuda":
        return
    for name, v in (("rows of the input (its leading dimensions multiplied)", m), ("out_features", n),
                    ("in_features", k)):
        if v % _CUDA_MULTIPLE:
            raise NotSupported(parameters={"message": f"regen.torch.fp8.Linear on CUDA: {name} is {v}, not a "
                                           f"multiple of {_CUDA_MULTIPLE} (cuBLASLt's FP8 GEMMs take 16-byte rows)"})


_STATE = (("fp8_amax_history_fwd", 2, True), ("fp8_scale_fwd", 2, False), ("fp8_amax_history_bwd", 1, True),
          ("fp8_scale_bwd", 1, False))


class Linear(torch.nn.Module):
    """torch.nn.Linear whose GEMMs run in FP8 in regend inside
    fp8_autocast (in its dtype, through regend's GEMM, outside): weight
    [out_features, in_features] and bias [out_features] as nn.Linear's
    (initialised alike), and the FP8 scaling state as buffers, made at the
    first FP8 forward with the recipe's history length (a later recipe of
    another length keeps the newest amaxes, as Transformer Engine does):
    ``fp8_amax_history_fwd`` [H, 2] and ``fp8_scale_fwd`` [2] (the input's
    and the weight's), ``fp8_amax_history_bwd`` [H, 1] and
    ``fp8_scale_bwd`` [1] (the output gradient's), f32; on the CPU (regend's
    host backend) in libregen's host pool."""

    def __init__(self, in_features, out_features, bias=True, device=None, dtype=None):
        super().__init__()
        self.in_features, self.out_features = in_features, out_features
        self.weight = torch.nn.Parameter(torch.empty(out_features, in_features, device=device, dtype=dtype))
        if bias:
            self.bias = torch.nn.Parameter(torch.empty(out_features, device=device, dtype=dtype))
        else:
            self.register_parameter("bias", None)
        for name, _, _ in _STATE:
            self.register_buffer(name, None)
        self.fp8_scale_inv_fwd = self.fp8_scale_inv_bwd = None
        self._journal = None
        self._fp8_serial = _register(self)
        self.reset_parameters()

    def __setstate__(self, state):
        # A copy (copy.deepcopy, unpickling) is a layer of its own.
        super().__setstate__(state)
        self._fp8_serial = _register(self)

    def reset_parameters(self):
        torch.nn.Linear.reset_parameters(self)

    def extra_repr(self):
        return f"in_features={self.in_features}, out_features={self.out_features}, bias={self.bias is not None}"

    def forward(self, x):
        return _forward(self, x)

    # -- the scaling state -------------------------------------------------------

    def _state_tensor(self, shape, device, fill):
        t = host_empty(list(shape), torch.float32) if device.type == "cpu" else \
            torch.empty(list(shape), dtype=torch.float32, device=device)
        return t.fill_(fill)

    def _fp8_state(self, h, device):
        """The four state buffers, made (history zeros, scales ones: the
        first step quantizes with scale 1, as Transformer Engine's), grown
        or cut to a recipe's history length ``h``, and checked: f32, on the
        weight's device, contiguous, in the host pool on the CPU (a Run
        updates them in place: moved there, once, where they are not)."""
        state = {}
        for name, n, is_history in _STATE:
            t = self._buffers.get(name)
            want = [h, n] if is_history else [n]
            if t is None:
                t = self._state_tensor(want, device, 0.0 if is_history else 1.0)
            else:
                if t.dtype != torch.float32:
                    raise TypeError(f"regen.torch.fp8.Linear: {name} is {t.dtype}; the FP8 scaling state is "
                                    "float32 (load it as saved, or leave it out of a conversion)")
                if t.device != device:
                    raise ValueError(f"regen.torch.fp8.Linear: {name} is on {t.device}, the weight on {device}")
                if is_history and list(t.shape) != want and t.dim() == 2 and t.shape[1] == n:
                    # Transformer Engine's way: the newest rows kept, zeros
                    # after them.
                    grown = self._state_tensor(want, device, 0.0)
                    rows = min(h, t.shape[0])
                    grown[:rows].copy_(t[:rows])
                    t = grown
                if list(t.shape) != want:
                    raise ValueError(f"regen.torch.fp8.Linear: {name} is {list(t.shape)}, not {want}")
                if not t.is_contiguous() or (t.device.type == "cpu" and not _in_host_pool(t)):
                    moved = self._state_tensor(want, device, 0.0)
                    moved.copy_(t)
                    t = moved
            self._buffers[name] = t
            state[name] = t
        return state

    def _fp8_journal(self, program):
        """The rank's memory a Run's journal lies in (one per layer: its
        Runs go one at a time), grown as needed."""
        need = max(program.journal_bytes, 8)
        j = self._journal
        device = self.weight.device
        if j is None or j.numel() < need or j.device != device:
            j = host_empty([need], torch.uint8) if device.type == "cpu" else \
                torch.empty(need, dtype=torch.uint8, device=device)
            self._journal = j
        return j

    def _load_from_state_dict(self, state_dict, prefix, local_metadata, strict, missing_keys, unexpected_keys,
                              error_msgs):
        # State saved after FP8 steps into a layer that has taken none: made
        # first (on the weight's device, where Runs want it), then loaded.
        for name, _, _ in _STATE:
            src = state_dict.get(prefix + name)
            if src is not None and self._buffers.get(name) is None:
                self._buffers[name] = self._state_tensor(src.shape, self.weight.device, 0.0)
        super()._load_from_state_dict(state_dict, prefix, local_metadata, strict, missing_keys, unexpected_keys,
                                      error_msgs)


_layers: "weakref.WeakValueDictionary[int, Linear]" = weakref.WeakValueDictionary()
_serials = itertools.count(1)


def _register(layer):
    """A number for the layer that _make_state finds it by (a traced call
    passes constants, not modules)."""
    serial = next(_serials)
    _layers[serial] = layer
    return serial


def _forward(layer, x):
    """The layer's forward: eager, the pass one program Run that updates
    the state in place (_Fp8LinearFunction); as torch.compile traces it,
    _graph_forward.  The scope is this thread's state: dynamo reads it
    where it traces (and guards on it: another recipe, or none, compiles
    anew)."""
    recipe = get_fp8_recipe()
    if _compiling():
        return _graph_forward(layer, x, recipe)
    if recipe is None:
        return _package.linear(x, layer.weight, layer.bias)
    return _eager_pass(layer, x, recipe)


def _eager_pass(layer, x, recipe):
    """The FP8 pass eagerly; under torch.compile a graph break
    (_on_dynamo_import), where the state cannot be had as the traced pass
    takes it."""
    return _Fp8LinearFunction.apply(x, layer.weight, layer.bias, layer, recipe)


def _graph_forward(layer, x, recipe):
    """The forward as torch.compile(backend="regen") sees it: outside the
    scope F.linear (ATen ops the backend writes into its programs), inside
    the custom op regen::fp8_linear and the copy_ of the forward state's
    update into the layer's buffers, which AOTAutograd keeps in the graph
    and the backend writes as the program's in-place update (_fp8_ops,
    regen.lowering.fp8).  The state is made first where it is not yet as
    the recipe wants it (the first FP8 step, another history length), as
    dynamo traces (_make_state); dynamo guards on the buffers it then
    reads."""
    if recipe is None:
        return torch.nn.functional.linear(x, layer.weight, layer.bias)
    _make_state(layer._fp8_serial, recipe.amax_history_len)
    state = _state_if_ready(layer, recipe)
    if state is None:
        return _eager_pass(layer, x, recipe)
    weight = layer.weight
    n, k = weight.shape
    for what, t in (("input", x), ("weight", weight), ("bias", layer.bias)):
        if t is not None:
            _dtype_of(what, t)
    if x.shape[-1] != k:
        raise ValueError(f"regen.torch.fp8.Linear: input's last dimension is {x.shape[-1]}, the layer takes {k}")
    _check_cuda_shape(x, x.numel() // k, n, k)
    return _fp8_ops.linear(layer, x, recipe, state)


def _make_state(serial, history):
    """Makes the state of layer ``serial`` as a recipe of ``history`` rows
    wants it, where it is not (Linear._fp8_state).  Under torch.compile it
    runs as dynamo traces, not in the graph (assume_constant_result, set
    by _on_dynamo_import: its True is the trace's constant), so the
    buffers the trace reads next exist and the first compiled call is
    whole: a graph break there would leave the model's graph cut at the
    layer for good, dynamo guarding the caller's frame on nothing the
    layer reads."""
    layer = _layers.get(serial)
    if layer is not None:
        layer._fp8_state(history, layer.weight.device)
    return True


def _state_if_ready(layer, recipe):
    """The four state buffers (fwd history and scale, bwd history and
    scale) where they exist as the recipe's pass takes them (f32,
    contiguous, on the weight's device, the recipe's history length), else
    None."""
    device = layer.weight.device
    h = recipe.amax_history_len
    found = []
    for name, n, is_history in _STATE:
        t = getattr(layer, name)
        if t is None or t.dtype != torch.float32 or t.device != device or not t.is_contiguous() or \
                tuple(t.shape) != ((h, n) if is_history else (n,)):
            return None
        found.append(t)
    return found


def graphs_take_fp8() -> bool:
    """Whether torch.compile can trace the FP8 pass as custom ops: they
    need torch.library.custom_op (torch 2.4), torch.compiler.is_compiling,
    and AOTAutograd keeping a backward's update of a forward input (the
    backward state) in the backward graph (torch 2.5: ViewAndMutationMeta's
    indices_of_inputs_that_requires_grad_with_mutations_in_bw).  Where not,
    the layer's forward is a graph break, run eagerly."""
    if not (_fp8_ops.HAVE_CUSTOM_OP and _compiling is not _never):
        return False
    try:
        import dataclasses
        from torch._functorch._aot_autograd.schemas import ViewAndMutationMeta
    except ImportError:
        return False
    return "indices_of_inputs_that_requires_grad_with_mutations_in_bw" in \
        {f.name for f in dataclasses.fields(ViewAndMutationMeta)}


def _never():
    return False


# torch.compiler.is_compiling where torch has it (2.3): True while dynamo
# traces, so the branch it takes is the only one in the graph.
_compiling = getattr(getattr(torch, "compiler", None), "is_compiling", _never)


def _on_dynamo_import():
    """Once torch._dynamo is imported (not at regen.torch's import: seconds
    on torch 2.x): where graphs take the FP8 pass, _make_state run as
    dynamo traces and the eager pass left out of graphs; where not, the
    whole forward left out (a graph break, the layer eager).
    Linear.forward looks _forward up at each call, as dynamo does when it
    traces it."""
    global _forward, _eager_pass
    from torch._dynamo import disable
    if graphs_take_fp8():
        from torch._dynamo import assume_constant_result
        assume_constant_result(_make_state)
        _eager_pass = disable(_eager_pass)
    else:
        _forward = disable(_forward)


from . import _fp8_ops  # noqa: E402  (its kernels use the helpers above)

# Last: where torch._dynamo is imported already, it runs now.
when_imported("torch._dynamo", _on_dynamo_import)
