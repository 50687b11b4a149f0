# SPDX-License-Identifier: Apache-2.0
"""Compute calls (libregen's compute.c): GEMM, attention and LayerNorm with
their backward passes, FP8's quantizations and delayed-scaling update,
each built by the op table (regen.ops, proto's) from Operands, and queued
on the device's lane: over the ring in the record's terms (regen.lane,
libregen), or as a Varlink call.

Operands that are torch tensors are resolved by regen.torch
(regen/torch/_tensors.py); this module knows no torch.
"""

import errno
from typing import Any, Dict, List, Optional, Sequence

from . import accel, errors, ops
from ._parts import JSON, ClientPart, EventLike, OperandLike
from .connection import id_device
from .objects import Buffer, buffer_id, event_id, tensor_imports

__all__ = ["Compute", "Operand", "DTYPE_SIZE", "scalars_record"]

# Every dtype's size, from the proto's table (regen/ops.py).
DTYPE_SIZE = dict(ops.DTYPE_SIZES)
# The dtypes a communicator's operands may have (proto/compute.h's
# RP_DTYPES_COMM).
COMM_DTYPES = frozenset(("f32", "f16", "bf16", "f64", "i32", "i64", "u8"))
# The dtypes an operand may have: those some op's table names, and a
# communicator's.
OPERAND_DTYPES = frozenset(dt for op in ops.OPS.values() for o in op.operands for dt in o.dtypes) | COMM_DTYPES
_EPILOGUES = tuple(ops.EPILOGUE_CODES)
_SCU_FORMATS = ops.OPS["scale_update"].choices["fp8_dtype"]
_SCU_AMAX = ops.OPS["scale_update"].choices["amax_compute"]
_TRANS_A, _TRANS_B, _CAUSAL = 0x1, 0x2, 0x4


class Operand:
    """A tensor inside an imported buffer: ``buffer`` (a Buffer or an id),
    ``offset`` in bytes, ``dtype`` ("f32", "f16", "bf16"; "i32" for
    attention's sequence lengths; "e4m3", "e5m2" for FP8), ``shape`` and
    ``strides`` in elements (None = row-major contiguous)."""

    __slots__ = ("buffer", "offset", "dtype", "shape", "strides")

    def __init__(self, buffer: Any, offset: int = 0, dtype: str = "f32", shape: Sequence[int] = (),
                 strides: Optional[Sequence[int]] = None) -> None:
        if dtype not in OPERAND_DTYPES:
            raise ValueError(f"dtype {dtype!r} is not one of {sorted(OPERAND_DTYPES)}")
        self.buffer = buffer
        self.offset = int(offset)
        self.dtype = dtype
        self.shape = [int(x) for x in shape]
        self.strides: Optional[List[int]] = None if strides is None else [int(x) for x in strides]

    @classmethod
    def trusted(cls, buffer: Any, offset: int, dtype: str, shape: List[int],
                strides: Optional[List[int]]) -> "Operand":
        """An Operand from fields already of the right types (a known dtype,
        int offset, lists of ints), as regen.torch builds them per call:
        without the constructor's conversions.  regend checks every operand
        regardless."""
        o = cls.__new__(cls)
        o.buffer, o.offset, o.dtype, o.shape, o.strides = buffer, offset, dtype, shape, strides
        return o

    @property
    def device(self) -> Optional[int]:
        if isinstance(self.buffer, Buffer):
            return self.buffer.device
        return id_device(str(self.buffer))

    def to_wire(self) -> JSON:
        w: JSON = {"buffer": buffer_id(self.buffer), "dtype": self.dtype, "shape": self.shape}
        if self.offset:
            w["offset"] = self.offset
        if self.strides is not None:
            w["strides"] = self.strides
        return w

    def transposed(self) -> "Operand":
        """The same memory seen as its transpose (2-D only); strides swap."""
        if len(self.shape) != 2:
            raise ValueError("transposed() needs a 2-D operand")
        st = self.strides or [self.shape[1], 1]
        return Operand(self.buffer, self.offset, self.dtype, self.shape[::-1], st[::-1])

    def __repr__(self) -> str:
        return (f"Operand({buffer_id(self.buffer)!r}, offset={self.offset}, dtype={self.dtype!r}, "
                f"shape={self.shape}, strides={self.strides})")


class Compute(ClientPart):
    """The compute part of :class:`regen.Client`."""

    def _operand(self, x, name, tensors):
        if x is None:
            return None
        if isinstance(x, Operand):
            return x
        glue = tensor_imports(self)
        if glue is not None and glue.is_tensor(x):
            tensors.append(x)
            return glue.operand(x, name)
        raise TypeError(f"operand {name} must be a regen.Operand or a torch tensor, not {type(x).__name__}")

    def _compute(self, op_name, named, scalars, wait_event, signal_event, retry=True, wait=True):
        op = ops.OPS[op_name]
        method = op.method
        names = ops.NAME_SETS[op_name]
        tensors = None
        given = {}
        device = None
        devices = None   # a set, once the operands name more than one device
        for n, x in named.items():
            if n not in names:
                raise ValueError(f"{method} has no operand {sorted(set(named) - names)}")
            if x is None:
                continue
            if type(x) is not Operand:
                if tensors is None:
                    tensors = []
                    # regen.torch reads a call whose operands are all
                    # tensors it imported straight onto the ring.
                    glue = tensor_imports(self) if wait_event is None else None
                    queued = glue.compute_accel(op_name, named, scalars, signal_event) if glue is not None else None
                    if queued is not None:
                        lane, ticket, device = queued
                        return self._answer(op_name, named, scalars, signal_event, device, lane, ticket,
                                            retry and self.auto_reimport, wait)
                x = self._operand(x, n, tensors)
            given[n] = x
            b = x.buffer
            dev = b.device if type(b) is Buffer else id_device(str(b))
            if dev != device and dev is not None:
                if device is None:
                    device = dev
                else:
                    devices = (devices or {device}) | {dev}
        for name in ops.REQUIRED_NAMES[op_name]:
            if name not in given:
                missing = [n for n in ops.REQUIRED_NAMES[op_name] if n not in given]
                raise ValueError(f"{method} needs operand(s) {missing}")
        if device is None or devices is not None:
            raise ValueError(f"{method}: operands must all live on one device, got "
                             f"{sorted(devices or ()) or 'none known'}")
        if tensors and wait_event is None:
            tensor_imports(self).sync(tensors)
        retry = retry and self.auto_reimport and bool(tensors)
        try:
            lane = self._lanes.get(device)
            if wait and (self.transport == "varlink" or
                         (lane is not None and lane.decided and not lane.ring and not lane.outstanding()
                          and lane.transport_epoch == self._transport_epoch)):
                # A blocking call on a Varlink lane is one call and its reply
                # (not once set_transport asked again: _lane picks then).
                return self._worker_call(device, method, _params(given, scalars, wait_event, signal_event)
                                         ).get("elapsed_us")
            lane, ticket = self._submit(device, op_name, given, scalars, wait_event, signal_event)
        except errors.StaleGeneration:
            # This call's own: its reply, or the refusal of what it needed
            # before it could be queued.
            if not retry:
                raise
            return self._compute(op_name, named, scalars, wait_event, signal_event, retry=False, wait=wait)
        return self._answer(op_name, named, scalars, signal_event, device, lane, ticket, retry, wait, wait_event)

    def _submit(self, device, op_name, given, scalars, wait_event, signal_event):
        """Queues a call on its device's lane: (lane, ticket)."""
        lane = self._lane(device)
        if lane.ring:
            ticket = self._queue_record(device, lane, op_name, given, scalars, wait_event, signal_event)
            if ticket is not None:
                return lane, ticket
        params = _params(given, scalars, wait_event, signal_event)
        return lane, self._queue_varlink(device, lane, ops.OPS[op_name].method, params)

    def _queue_record(self, device, lane, op_name, given, scalars, wait_event, signal_event):
        """A call in the record's terms, queued on the ring: its ticket, or
        None where the worker offers no ring (the lane took Varlink)."""
        codes = ops.DTYPE_CODES
        slots = [None if o is None else (o.buffer, codes.get(o.dtype, 255), o.offset, o.shape, o.strides)
                 for o in map(given.get, ops.SLOT_NAMES[op_name])]
        record = scalars_record(op_name, scalars)
        wait_id = event_id(wait_event) if wait_event is not None else None
        signal_id = event_id(signal_event) if signal_event is not None else None
        op_id = ops.OP_IDS[op_name]
        submit = accel.module.submit

        def queue(client):
            r = submit(client, device, op_id, record, wait_id, signal_id, slots)
            if r == -errno.ERANGE:
                raise _refusal(given)
            return r

        return self._ring_queue(device, lane, queue)

    def queue_encoded(self, device: int, op_name: str, slots: Sequence[Optional[tuple]], record_scalars: tuple,
                      signal_event: EventLike = None) -> Optional[int]:
        """Queues one compute call on ``device``'s ring without waiting for
        its answer (as ``wait=False``), its operands given already in the
        record's terms: ``slots`` has, per operand slot of the op (ops.OPS
        order), None or (buffer, dtype code, offset in bytes, shape,
        strides), shape and strides in elements; ``record_scalars`` is
        scalars_record()'s tuple.  For a caller that builds many calls
        from tensors it has resolved itself (regen.torch's runs of calls):
        no Operand, no per-method checks; regend checks every record
        regardless.  Returns the ticket, or None (nothing queued) where the
        lane is not on the ring: the op's method takes the call then."""
        lane = self._lane(device)
        if not lane.ring:
            return None
        signal_id = event_id(signal_event) if signal_event is not None else None
        op_id = ops.OP_IDS[op_name]
        submit = accel.module.submit

        def queue(client):
            r = submit(client, device, op_id, record_scalars, None, signal_id, slots)
            if r == -errno.ERANGE:
                raise errors.InvalidParameter(parameters={"parameter": "operands"})
            return r

        return self._ring_queue(device, lane, queue)

    def _answer(self, op_name, named, scalars, signal_event, device, lane, ticket, retry, wait, wait_event=None):
        """A queued compute call's ticket (``wait`` False), or its answer:
        regend's elapsed_us, its error raised, or after a StaleGeneration
        of its own the call once more (``retry``: its tensors imported
        again)."""
        if not wait:
            return ticket
        e, at = self._collect(device, lane, ticket)
        if e is None:
            return lane.elapsed_us
        # An error of a call queued before this one is that call's, for its
        # caller to meet here: retrying this call in its place would pass it
        # off as a success.
        if retry and at == ticket and isinstance(e, errors.StaleGeneration):
            return self._compute(op_name, named, scalars, wait_event, signal_event, retry=False)
        raise e

    def gemm(self, a: OperandLike, b: OperandLike, d: OperandLike, c: OperandLike = None, bias: OperandLike = None,
             trans_a: bool = False, trans_b: bool = False, alpha: float = 1.0, beta: float = 0.0,
             epilogue: Optional[str] = None, tf32: bool = False, wait_event: EventLike = None,
             signal_event: EventLike = None, wait: bool = True, aux: OperandLike = None,
             deadline_ms: Optional[int] = None, aux_out: OperandLike = None, a_scale: OperandLike = None,
             b_scale: OperandLike = None, d_scale: OperandLike = None, amax_d: OperandLike = None,
             fp8_fast_accum: bool = False) -> int:
        """D = alpha * op(A) @ op(B) + beta * C (+ bias, GELU per ``epilogue``:
        "bias", "gelu", "gelu_bias"; GELU is the tanh approximation).  With
        ``epilogue="dgelu"``, a GELU layer's backward: D = (alpha * op(A) @
        op(B) + beta * C) * GELU'(aux), ``aux`` the forward's pre-activation
        ([M, N], D's dtype; given exactly with dgelu, which takes no bias).
        "gelu_aux" and "gelu_aux_bias" are "gelu" and "gelu_bias" that also
        write GELU's input to ``aux_out`` ([M, N], D's dtype; given exactly
        with them), the ``aux`` of the backward's dgelu.
        Operands are Operands or torch tensors
        (a tensor's storage is imported on first use and kept alive until
        close_tensor/close_buffer or the next generation).  A transposed torch view
        for ``a`` or ``b`` is passed as its row-major storage with the
        transpose flag flipped.  Returns regend's elapsed_us; the reply means
        D is written.  With ``wait=False`` the call is queued on the
        device's lane and its ticket returned: ``wait(device, ticket)``.
        A lane holds at most 256 calls unanswered, on either transport: one
        more waits for the oldest's answer first (its error kept for the
        wait).
        ``deadline_ms`` (every compute call): how long the call may run
        before it raises Timeout; past regend's own call_deadline_ms too,
        regend reports the device hung and recovers it (a shorter deadline
        ends only this call); None: regend's default.
        FP8 (docs/protocol.md): ``a`` and ``b`` in "e4m3" or "e5m2" (not
        both e5m2; torch's float8_e4m3fn and float8_e5m2), a [M, K] and b
        [N, K] (``trans_b=True``), each with its scale, ``a_scale`` and
        ``b_scale``: f32 [1] operands that turn stored values into real
        ones (1 / the scale they were quantized with: scale_update's
        scale_inv); ``d`` in bf16, f16, f32, or FP8 with ``d_scale`` (f32
        [1]; e5m2 only from an e5m2 input), and then ``amax_d`` (f32 [1])
        receives max |result|.  ``fp8_fast_accum`` (FP8 inputs only):
        cuBLASLt's fast accumulation, faster and less exact (Transformer
        Engine's forward GEMMs)."""
        trans_a, trans_b = bool(trans_a), bool(trans_b)
        if type(a) is not Operand or type(b) is not Operand:
            glue = tensor_imports(self)
            if glue is not None:
                if type(a) is not Operand and glue.is_column_major(a):
                    a, trans_a = a.t(), not trans_a
                if type(b) is not Operand and glue.is_column_major(b):
                    b, trans_b = b.t(), not trans_b
        named = {"a": a, "b": b, "c": c, "d": d, "bias": bias, "aux": aux, "aux_out": aux_out, "a_scale": a_scale,
                 "b_scale": b_scale, "d_scale": d_scale, "amax_d": amax_d}
        scalars = {"trans_a": trans_a, "trans_b": trans_b, "alpha": _finite("alpha", alpha),
                   "beta": _finite("beta", beta)}
        if epilogue is not None:
            if epilogue not in _EPILOGUES:
                raise ValueError(f"epilogue {epilogue!r} is not one of {_EPILOGUES}")
            scalars["epilogue"] = epilogue
        if tf32 and fp8_fast_accum:
            raise ValueError("tf32 and fp8_fast_accum exclude each other: tf32 multiplies f32 inputs, "
                             "fp8_fast_accum sums FP8 ones")
        if tf32:
            scalars["compute"] = "tf32"
        elif fp8_fast_accum:
            scalars["compute"] = "fp8_fast_accum"
        _put_deadline(scalars, deadline_ms)
        return self._compute("gemm", named, scalars, wait_event, signal_event, wait=wait)

    def attention(self, q: OperandLike, k: OperandLike, v: OperandLike, o: OperandLike, stats: OperandLike = None,
                  scale: Optional[float] = None, causal: bool = False, causal_alignment: Optional[str] = None,
                  wait_event: EventLike = None, signal_event: EventLike = None, wait: bool = True,
                  seq_len_q: OperandLike = None, seq_len_kv: OperandLike = None,
                  deadline_ms: Optional[int] = None) -> int:
        """o = softmax(scale * q k^T [causal mask]) v; q [B, H, Sq, D],
        k [B, Hkv, Skv, D], v [B, Hkv, Skv, Dv], o [B, H, Sq, Dv] with H a
        multiple of Hkv (grouped-query attention); ``causal_alignment``
        "top_left" (default) or "bottom_right"; ``stats`` f32 [B, H, Sq]
        gets each row's log-sum-exp for the backward pass.  ``seq_len_q``
        and ``seq_len_kv`` (together; i32 [B], Operands or torch int32
        tensors): each batch entry's sequence lengths, the rows past them
        padding (o written 0 there, stats -inf)."""
        scalars = _attention_scalars(scale, causal, causal_alignment)
        _put_deadline(scalars, deadline_ms)
        named = {"q": q, "k": k, "v": v, "o": o, "stats": stats, "seq_len_q": seq_len_q, "seq_len_kv": seq_len_kv}
        return self._compute("attention", named, scalars, wait_event, signal_event, wait=wait)

    def attention_backward(self, q: OperandLike, k: OperandLike, v: OperandLike, o: OperandLike, d_o: OperandLike,
                           stats: OperandLike, d_q: OperandLike, d_k: OperandLike, d_v: OperandLike,
                           scale: Optional[float] = None, causal: bool = False,
                           causal_alignment: Optional[str] = None, wait_event: EventLike = None,
                           signal_event: EventLike = None, wait: bool = True, seq_len_q: OperandLike = None,
                           seq_len_kv: OperandLike = None, deadline_ms: Optional[int] = None) -> int:
        """Gradients of attention: writes d_q, d_k, d_v from the forward's
        q, k, v, o, stats and the incoming d_o; ``seq_len_q`` and
        ``seq_len_kv`` as the forward's (rows past them written 0)."""
        scalars = _attention_scalars(scale, causal, causal_alignment)
        _put_deadline(scalars, deadline_ms)
        named = {"q": q, "k": k, "v": v, "o": o, "d_o": d_o, "stats": stats, "d_q": d_q, "d_k": d_k, "d_v": d_v,
                 "seq_len_q": seq_len_q, "seq_len_kv": seq_len_kv}
        return self._compute("attention_backward", named, scalars, wait_event, signal_event, wait=wait)

    def layer_norm(self, x: OperandLike, weight: OperandLike, y: OperandLike, bias: OperandLike = None,
                   mean: OperandLike = None, rstd: OperandLike = None, eps: Optional[float] = None,
                   wait_event: EventLike = None, signal_event: EventLike = None, wait: bool = True,
                   deadline_ms: Optional[int] = None) -> int:
        """y = (x - mean) * rstd * weight + bias over each row of x [rows, n]
        (torch's F.layer_norm(x, [n], weight, bias, eps)), the statistics in
        f32; weight and bias [n] and y [rows, n] of x's dtype; ``mean`` and
        ``rstd`` (f32 [rows], optional) receive each row's statistics for
        layer_norm_backward.  ``eps``: None is regend's 1e-5; else finite
        and > 0.  Rows may be padded (row stride >= n)."""
        scalars: JSON = {}
        if eps is not None:
            scalars["eps"] = _finite("eps", eps)
        _put_deadline(scalars, deadline_ms)
        named = {"x": x, "weight": weight, "bias": bias, "y": y, "mean": mean, "rstd": rstd}
        return self._compute("layer_norm", named, scalars, wait_event, signal_event, wait=wait)

    def layer_norm_backward(self, d_y: OperandLike, x: OperandLike, weight: OperandLike, mean: OperandLike,
                            rstd: OperandLike, d_x: OperandLike, d_weight: OperandLike = None,
                            d_bias: OperandLike = None, d_residual: OperandLike = None, wait_event: EventLike = None,
                            signal_event: EventLike = None, wait: bool = True,
                            deadline_ms: Optional[int] = None) -> int:
        """Gradients of layer_norm from the forward's x, weight, mean, rstd
        and the incoming d_y: writes d_x (plus ``d_residual``, the gradient
        arriving through a residual connection, when given; d_x may be
        d_residual itself), and when given ``d_weight`` = sum over rows of
        d_y * (x - mean) * rstd and ``d_bias`` = sum over rows of d_y
        (weight's dtype, summed in f32)."""
        scalars: JSON = {}
        _put_deadline(scalars, deadline_ms)
        named = {"d_y": d_y, "x": x, "weight": weight, "mean": mean, "rstd": rstd, "d_x": d_x,
                 "d_weight": d_weight, "d_bias": d_bias, "d_residual": d_residual}
        return self._compute("layer_norm_backward", named, scalars, wait_event, signal_event, wait=wait)


    def quantize(self, x: OperandLike, scale: OperandLike, y: OperandLike, amax: OperandLike = None,
                 wait_event: EventLike = None, signal_event: EventLike = None, wait: bool = True,
                 deadline_ms: Optional[int] = None) -> int:
        """y = fp8(x * scale): x [rows, cols] in f32, f16 or bf16 (rows may
        be padded), ``scale`` an f32 [1] (stored = real * scale), y [rows,
        cols] in "e4m3" or "e5m2", the f32 product rounded to nearest even
        and saturated to y's largest finite value; ``amax`` (f32 [1],
        optional) receives max |x|: point it at row 0 of the tensor's
        column of an amax history (scale_update)."""
        scalars: Dict[str, Any] = {}
        _put_deadline(scalars, deadline_ms)
        named = {"x": x, "scale": scale, "y": y, "amax": amax}
        return self._compute("quantize", named, scalars, wait_event, signal_event, wait=wait)

    def transpose_quantize(self, x: OperandLike, scale: OperandLike, y_t: OperandLike, y: OperandLike = None,
                           amax: OperandLike = None, wait_event: EventLike = None, signal_event: EventLike = None,
                           wait: bool = True, deadline_ms: Optional[int] = None) -> int:
        """quantize() that writes ``y_t`` [cols, rows], y transposed, and
        ``y`` itself when given: the other layout an FP8 GEMM's operand may
        need (FP8 GEMMs take K-contiguous operands only)."""
        scalars: Dict[str, Any] = {}
        _put_deadline(scalars, deadline_ms)
        named = {"x": x, "scale": scale, "y": y, "amax": amax, "y_t": y_t}
        return self._compute("transpose_quantize", named, scalars, wait_event, signal_event, wait=wait)

    def scale_update(self, amax_history: OperandLike, scale: OperandLike, amax_history_out: OperandLike,
                     scale_out: OperandLike, scale_inv: OperandLike = None, fp8_dtype: Optional[str] = None,
                     amax_compute: Optional[str] = None, margin: Optional[float] = None,
                     wait_event: EventLike = None, signal_event: EventLike = None, wait: bool = True,
                     deadline_ms: Optional[int] = None) -> int:
        """Transformer Engine's delayed-scaling update over N tensors:
        ``amax_history`` f32 [H, N] (column i tensor i's amaxes, row 0 the
        newest), ``scale`` f32 [N]; the columns rolled into
        ``amax_history_out`` (row 0 zeroed), ``scale_out`` = fp8_max *
        2^-margin / amax (the column's max, or with ``amax_compute=
        "most_recent"`` its row 0) where amax is finite and positive, else
        the old scale; ``scale_inv`` (optional) = 1 / scale_out.
        ``fp8_dtype`` "e4m3" (None: regend's default, 448) or "e5m2"
        (57344). Each output may be its input itself (the update in place;
        not safe to run twice: a retry would roll the history again)."""
        scalars = {}
        for name, value, names in (("fp8_dtype", fp8_dtype, ops.OPS["scale_update"].choices["fp8_dtype"]),
                                   ("amax_compute", amax_compute, ops.OPS["scale_update"].choices["amax_compute"])):
            if value is not None:
                if value not in names:
                    raise ValueError(f"{name} {value!r} is not one of {names}")
                scalars[name] = value
        if margin is not None:
            scalars["margin"] = _finite("margin", margin)
        _put_deadline(scalars, deadline_ms)
        named = {"amax_history": amax_history, "scale": scale, "amax_history_out": amax_history_out,
                 "scale_out": scale_out, "scale_inv": scale_inv}
        return self._compute("scale_update", named, scalars, wait_event, signal_event, wait=wait)


def _params(given, scalars, wait_event, signal_event):
    """A call's parameters as Varlink carries them."""
    params = {n: o.to_wire() for n, o in given.items()}
    params.update(scalars)
    if wait_event is not None:
        params["wait_event"] = event_id(wait_event)
    if signal_event is not None:
        params["signal_event"] = event_id(signal_event)
    return params


def _refusal(given):
    """The InvalidParameter regend answers on Varlink for the first of
    ``given`` (name -> Operand) that a record cannot hold: a rank outside
    1 to 4, strides of another rank, a value past its field's 64 bits (an
    offset outside 0 to 2**64, a dimension or stride outside 64 bits)."""
    for name, op in given.items():
        rank = len(op.shape)
        if not 1 <= rank <= 4:
            return errors.InvalidParameter(parameters={"parameter": f"{name}.shape"})
        if op.strides is not None and len(op.strides) != rank:
            return errors.InvalidParameter(parameters={"parameter": f"{name}.strides"})
        for field, values, low, high in (("offset", (op.offset,), 0, 2**64), ("shape", op.shape, -2**63, 2**63),
                                         ("strides", op.strides or (), -2**63, 2**63)):
            if any(not low <= v < high for v in values):
                return errors.InvalidParameter(parameters={"parameter": f"{name}.{field}"})
    return errors.InvalidParameter(parameters={"parameter": "operands"})


def scalars_record(op_name, scalars):
    """(flags, epilogue, compute, alignment, alpha, beta, scale, deadline_ms)
    of a call's scalars as the client's methods build them: the record's
    terms (libregen's struct regen_record_call)."""
    deadline = record_deadline(scalars.get("deadline_ms"))
    if op_name == "gemm":
        flags = (_TRANS_A if scalars.get("trans_a") else 0) | (_TRANS_B if scalars.get("trans_b") else 0)
        # Client.gemm took alpha and beta as finite floats.
        return (flags, ops.EPILOGUE_CODES[scalars.get("epilogue", "none")],
                ops.COMPUTE_CODES[scalars.get("compute", "f32")], 0, scalars.get("alpha", 1.0),
                scalars.get("beta", 0.0), 0.0, deadline)
    if op_name in ("layer_norm", "layer_norm_backward"):
        # LayerNorm's eps travels as the record's scale.
        return (0, 0, 0, 0, 0.0, 0.0, _record_scale(scalars.get("eps")), deadline)
    if op_name in ("quantize", "transpose_quantize"):
        return (0, 0, 0, 0, 0.0, 0.0, 0.0, deadline)
    if op_name == "scale_update":
        # Its enums ride in the epilogue and compute bytes, its margin in
        # the scale (0: regend's default, as an absent margin).
        return (0, _SCU_FORMATS.index(scalars.get("fp8_dtype", "e4m3")),
                _SCU_AMAX.index(scalars.get("amax_compute", "max")), 0, 0.0, 0.0,
                float(scalars.get("margin", 0.0)), deadline)
    flags = _CAUSAL if scalars.get("causal") else 0
    return (flags, 0, 0, ops.ALIGNMENT_CODES[scalars.get("causal_alignment", "top_left")], 0.0, 0.0,
            _record_scale(scalars.get("scale")), deadline)


def record_deadline(d):
    """A record's deadline_ms: 0 is regend's default; a deadline the record
    cannot hold is refused here as Varlink would refuse it."""
    if d is None:
        return 0
    if type(d) is not int or not 1 <= d <= 0xFFFFFFFF:
        raise errors.InvalidParameter(parameters={"parameter": "deadline_ms"})
    return d


def _record_scale(value):
    """A record's scale field for an optional positive scalar: 0 is the
    default (absent); a given 0, which Varlink refuses, goes as NaN, which
    libregen refuses alike, by the same name."""
    if value is None:
        return 0.0
    value = float(value)
    return float("nan") if value == 0.0 else value


def _put_deadline(scalars, deadline_ms):
    # Passed as given: regend (or the record's encoder, alike) refuses what
    # is not a whole number of milliseconds from 1 to a day.
    if deadline_ms is not None:
        scalars["deadline_ms"] = deadline_ms


def _finite(name, value):
    """float(value), refused when JSON has no words for it (NaN, an
    infinity): the same ValueError on both transports, before either."""
    value = float(value)
    if value - value != 0.0:
        raise ValueError(f"{name} must be finite, not {value}")
    return value


def _attention_scalars(scale, causal, causal_alignment):
    scalars = {"causal": bool(causal)}
    if scale is not None:
        scalars["scale"] = _finite("scale", scale)
    if causal_alignment is not None:
        if causal_alignment not in ("top_left", "bottom_right"):
            raise ValueError(f"causal_alignment {causal_alignment!r} is not 'top_left' or 'bottom_right'")
        scalars["causal_alignment"] = causal_alignment
    return scalars
