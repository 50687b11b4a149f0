# SPDX-License-Identifier: Apache-2.0
"""The FP8 Linear's programs (issue 34), their nodes written once.

An FP8 Linear's pass is Transformer Engine's delayed scaling as program
nodes:

  forward   scale_update of the forward state (the history's max, or its
            newest, and the margin, into new scales; the history rolled),
            transpose_quantize of the input and of the weight (each into
            FP8 and FP8 transposed, their amax into the new history's row
            0), the FP8 gemm y = x @ w.T with the new scales' inverses and
            fast accumulation (Transformer Engine's forward GEMM: its
            partial sums never promoted to f32 midway), the bias;
  backward  scale_update of the backward state, transpose_quantize of the
            output gradient, the FP8 gemms dx = dy @ w and dw = dy.T @ x
            from the forward's transposed copies (FP8 GEMMs are TN only;
            their sums promoted to f32, as Transformer Engine's gradients),
            the bias gradient summed in f32.

forward_nodes and backward_nodes write those nodes into any program, given
the names of the tensors a pass reads and writes: regen.torch.fp8's eager
passes and its custom ops' kernels define whole programs around them
(forward_definition, backward_definition), and the compile backend writes
them into a compiled graph's program (regen.lowering.fp8).  A pass's state
update lands in new tensors (amax_history_out, scale_out); where a
definition is ``in_place`` (the eager layer's Runs) its last nodes assign
them to the state, bound as inouts, so a node refused midway leaves the
state as it was and a Run with a journal applies it once; otherwise the
update is an output the caller copies into the state (the custom ops, and
under torch.compile AOTAutograd's copy_, which the lowering writes as the
program's own in-place assignment).
"""

from typing import Any, Dict, NamedTuple, Optional, Sequence

from .program import ProgramBuilder

__all__ = ["Scaling", "forward_nodes", "backward_nodes", "forward_definition", "backward_definition",
           "fused_bias"]


class Scaling(NamedTuple):
    """One direction's delayed scaling, as its nodes take it: the FP8
    dtype it quantizes to ("e4m3", "e5m2"), how amax is taken from the
    history ("max", "most_recent"), the margin (binades) and the history's
    length (rows)."""
    fp8_dtype: str
    amax_compute: str
    margin: float
    history: int


def fused_bias(xdt: str, bdt: Optional[str]) -> bool:
    """Whether the forward GEMM adds the bias itself: its epilogue adds a
    bias of the output's dtype into bf16 or f16; another is one pointwise
    add after it."""
    return bdt is not None and xdt in ("bf16", "f16") and bdt == xdt


def _element(b, name, base, i):
    return b.view(name, base, [1], [1], i)


def _update(b, direction, t, scaling):
    b.node("scale_update", {"amax_history": t["amax_history"], "scale": t["scale"],
                            "amax_history_out": t["amax_history_out"], "scale_out": t["scale_out"],
                            "scale_inv": t["scale_inv"]}, name=f"{direction}.update",
           fp8_dtype=scaling.fp8_dtype, amax_compute=scaling.amax_compute, margin=float(scaling.margin))


def forward_nodes(b: Any, t: Dict[str, Optional[str]], m: int, n: int, k: int, scaling: Scaling, xdt: str,
                  bdt: Optional[str]) -> None:
    """y = x @ w.T (+ bias) in FP8, into builder ``b`` (a ProgramBuilder,
    or anything with its intermediate, view and node).  ``t`` names the
    pass's tensors: input [m, k] and weight [n, k] (rows of unit stride),
    bias [n] or None, amax_history [H, 2] and scale [2] (the input's and
    the weight's, read), amax_history_out, scale_out and scale_inv (their
    update and the new scales' inverses, written), output [m, n] of the
    input's dtype, input_t [k, m] and weight_t [k, n] (the FP8 transposed
    copies the backward takes)."""
    fmt = scaling.fp8_dtype
    _update(b, "fwd", t, scaling)
    xq = b.intermediate("input.fp8", fmt, [m, k])
    wq = b.intermediate("weight.fp8", fmt, [n, k])
    for i, (src, q, transposed, what) in enumerate(((t["input"], xq, t["input_t"], "input"),
                                                    (t["weight"], wq, t["weight_t"], "weight"))):
        b.node("transpose_quantize", {"x": src, "scale": _element(b, f"scale.{what}", t["scale_out"], i), "y": q,
                                      "y_t": transposed,
                                      "amax": _element(b, f"amax.{what}", t["amax_history_out"], i)},
               name=f"quantize.{what}")
    gemm = {"a": xq, "b": wq, "d": t["output"], "a_scale": _element(b, "scale_inv.input", t["scale_inv"], 0),
            "b_scale": _element(b, "scale_inv.weight", t["scale_inv"], 1)}
    bias = t.get("bias")
    fused = bias is not None and fused_bias(xdt, bdt)
    if fused:
        gemm["bias"] = bias
    b.node("gemm", gemm, name="gemm", trans_b=True, compute="fp8_fast_accum",
           **({"epilogue": "bias"} if fused else {}))
    if bias is not None and not fused:
        b.node("add", [t["output"], bias], [t["output"]], name="bias")


def backward_nodes(b: Any, t: Dict[str, Optional[str]], m: int, n: int, k: int, scaling: Scaling) -> None:
    """dx = dy @ w and dw = dy.T @ x in FP8, and the bias gradient, into
    builder ``b``.  ``t`` names: grad_output [m, n] (rows of unit stride),
    input_t [k, m] and weight_t [k, n] (the forward's FP8 transposed
    copies), fwd.scale_inv [2] (the inverses they were quantized with),
    amax_history [H, 1] and scale [1] (the output gradient's, read),
    amax_history_out, scale_out, scale_inv (written), and grad_input [m, k],
    grad_weight [n, k], grad_bias [n] f32-summed, each absent or None where
    it is not wanted."""
    fmt = scaling.fp8_dtype
    _update(b, "bwd", t, scaling)
    dyq = b.intermediate("grad_output.fp8", fmt, [m, n])
    dyt = b.intermediate("grad_output.fp8_t", fmt, [n, m])
    b.node("transpose_quantize", {"x": t["grad_output"], "scale": _element(b, "scale.grad_output", t["scale_out"], 0),
                                  "y": dyq, "y_t": dyt,
                                  "amax": _element(b, "amax.grad_output", t["amax_history_out"], 0)},
           name="quantize.grad_output")
    if t.get("grad_input"):
        b.node("gemm", {"a": dyq, "b": t["weight_t"], "d": t["grad_input"], "a_scale": t["scale_inv"],
                        "b_scale": _element(b, "fwd.scale_inv.weight", t["fwd.scale_inv"], 1)},
               name="gemm.grad_input", trans_b=True)
    if t.get("grad_weight"):
        b.node("gemm", {"a": dyt, "b": t["input_t"], "d": t["grad_weight"], "a_scale": t["scale_inv"],
                        "b_scale": _element(b, "fwd.scale_inv.input", t["fwd.scale_inv"], 0)},
               name="gemm.grad_weight", trans_b=True)
    if t.get("grad_bias"):
        b.node("sum", [t["grad_output"]], [t["grad_bias"]], name="grad_bias", axis="leading")


# ---- whole programs, one pass each -------------------------------------------------

def _state(b, direction, n, scaling, in_place):
    """A direction's state and its update: bound as inouts and updated in
    the program's memory first (in place), or read as inputs with the
    update an output."""
    h = scaling.history
    if in_place:
        hist = b.inout(f"{direction}.amax_history", "f32", [h, n])
        scale = b.inout(f"{direction}.scale", "f32", [n])
        new_hist = b.intermediate(f"{direction}.amax_history.new", "f32", [h, n])
        new_scale = b.intermediate(f"{direction}.scale.new", "f32", [n])
    else:
        hist = b.input(f"{direction}.amax_history", "f32", [h, n])
        scale = b.input(f"{direction}.scale", "f32", [n])
        new_hist = b.output(f"{direction}.amax_history.new", "f32", [h, n])
        new_scale = b.output(f"{direction}.scale.new", "f32", [n])
    inv = b.output(f"{direction}.scale_inv", "f32", [n])
    return {"amax_history": hist, "scale": scale, "amax_history_out": new_hist, "scale_out": new_scale,
            "scale_inv": inv}


def _assign(b, direction, t):
    """The update assigned to the state, the Run's last nodes."""
    b.node("cast", [t["amax_history_out"]], [t["amax_history"]], name=f"{direction}.assign_history")
    b.node("cast", [t["scale_out"]], [t["scale"]], name=f"{direction}.assign_scale")


def forward_definition(m: int, n: int, k: int, xdt: str, wdt: str, bdt: Optional[str], x_strides: Sequence[int],
                       w_strides: Sequence[int], scaling: Scaling, in_place: bool) -> Dict[str, Any]:
    """The forward pass as one program.  Bound: input, weight, bias (where
    bdt), fwd.amax_history, fwd.scale, fwd.scale_inv, output, input.fp8_t,
    weight.fp8_t, and where not ``in_place`` fwd.amax_history.new and
    fwd.scale.new."""
    b = ProgramBuilder("fp8_linear_forward")
    fmt = scaling.fp8_dtype
    t: Dict[str, Optional[str]] = {"input": b.input("input", xdt, [m, k], x_strides),
                                   "weight": b.input("weight", wdt, [n, k], w_strides),
                                   "bias": b.input("bias", bdt, [n]) if bdt is not None else None}
    t.update(_state(b, "fwd", 2, scaling, in_place))
    t["output"] = b.output("output", xdt, [m, n])
    t["input_t"] = b.output("input.fp8_t", fmt, [k, m])
    t["weight_t"] = b.output("weight.fp8_t", fmt, [k, n])
    forward_nodes(b, t, m, n, k, scaling, xdt, bdt)
    if in_place:
        _assign(b, "fwd", t)
    return b.definition()


def backward_definition(m: int, n: int, k: int, xdt: str, wdt: str, bdt: Optional[str], dy_strides: Sequence[int],
                        scaling: Scaling, fwd_fp8_dtype: str, need_dx: bool, need_dw: bool,
                        in_place: bool) -> Dict[str, Any]:
    """The backward pass as one program.  Bound: grad_output, input.fp8_t,
    weight.fp8_t, fwd.scale_inv, bwd.amax_history, bwd.scale,
    bwd.scale_inv, grad_input (need_dx), grad_weight (need_dw), grad_bias
    (where bdt), and where not ``in_place`` bwd.amax_history.new and
    bwd.scale.new."""
    b = ProgramBuilder("fp8_linear_backward")
    t: Dict[str, Optional[str]] = {"grad_output": b.input("grad_output", xdt, [m, n], dy_strides),
                                   "input_t": b.input("input.fp8_t", fwd_fp8_dtype, [k, m]),
                                   "weight_t": b.input("weight.fp8_t", fwd_fp8_dtype, [k, n]),
                                   "fwd.scale_inv": b.input("fwd.scale_inv", "f32", [2])}
    t.update(_state(b, "bwd", 1, scaling, in_place))
    t["grad_input"] = b.output("grad_input", xdt, [m, k]) if need_dx else None
    t["grad_weight"] = b.output("grad_weight", wdt, [n, k]) if need_dw else None
    t["grad_bias"] = b.output("grad_bias", bdt, [n]) if bdt is not None else None
    backward_nodes(b, t, m, n, k, scaling)
    if in_place:
        _assign(b, "bwd", t)
    return b.definition()
