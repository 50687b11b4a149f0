# SPDX-License-Identifier: Apache-2.0
"""io.regen.Program from Python: a definition built tensor by tensor and node
by node (the JSON that io.regen.Program.Define takes, proto/program.h), and
the handle Define gives back.

    b = ProgramBuilder("mlp")
    x = b.input("x", "bf16", (M, K))
    w = b.input("w", "bf16", (N, K))
    y = b.output("y", "bf16", (M, N))
    b.node("gemm", {"a": x, "b": w, "d": y}, trans_b=True)
    prog = client.define_program(0, b.definition())
    client.run_program(prog, {"x": x_operand, "w": w_operand, "y": y_operand})

regend checks the whole definition at Define and names the node and the
reason of anything wrong (io.regen.InvalidProgram)."""

import errno
import math
import time
from typing import Any, List, Mapping, Optional, Sequence, Union

from . import accel, errors, ops
from ._parts import JSON, ClientPart, EventLike
from .compute import record_deadline
from .objects import tensor_imports

__all__ = ["ProgramBuilder", "Program", "Programs", "run_exactly_once", "attr_value", "JOURNAL_MODES",
           "JOURNAL_MARKS_BYTES"]

# What a Run's journal holds (proto/program_journal.h): "copy", the inouts
# saved before the Run writes them and the marks (program.journal_bytes);
# "marks", the marks alone (JOURNAL_MARKS_BYTES), no copy: a Run a fault
# of regend's cuts after it began is then not retried but refused
# (errors.RunTorn).
JOURNAL_MODES = ("copy", "marks")
JOURNAL_MARKS_BYTES = 32


def attr_value(v: Any) -> Any:
    """An attr as Define takes it: JSON has no infinities or NaN, so a
    non-finite float is spelled "inf", "-inf" or "nan" (a mask's -inf)."""
    if isinstance(v, float) and not math.isfinite(v):
        return "nan" if math.isnan(v) else ("inf" if v > 0 else "-inf")
    return v


class ProgramBuilder:
    """Collects tensors and nodes in program order. Every method that makes
    a tensor returns its name, which nodes take."""

    def __init__(self, name: Optional[str] = None) -> None:
        self.name = name
        self.tensors: List[JSON] = []
        self.nodes: List[JSON] = []
        self._names: set = set()

    def _tensor(self, name, kind, dtype, shape, strides=None, **extra):
        if name in self._names:
            raise ValueError(f"tensor {name!r} defined twice")
        t = {"name": name, "kind": kind, "dtype": dtype, "shape": list(shape)}
        if strides is not None:
            t["strides"] = list(strides)
        t.update(extra)
        self._names.add(name)
        self.tensors.append(t)
        return name

    def input(self, name: str, dtype: str, shape: Sequence[int], strides: Optional[Sequence[int]] = None) -> str:
        return self._tensor(name, "input", dtype, shape, strides)

    def output(self, name: str, dtype: str, shape: Sequence[int], strides: Optional[Sequence[int]] = None) -> str:
        return self._tensor(name, "output", dtype, shape, strides)

    def inout(self, name: str, dtype: str, shape: Sequence[int], strides: Optional[Sequence[int]] = None) -> str:
        """A bound tensor the program reads and updates in place (weights,
        optimizer state)."""
        return self._tensor(name, "inout", dtype, shape, strides)

    def scalar(self, name: str) -> str:
        """A value given with each Run (``scalars={name: value}``)."""
        return self._tensor(name, "scalar", "f64", ())

    def intermediate(self, name: str, dtype: str, shape: Sequence[int]) -> str:
        return self._tensor(name, "intermediate", dtype, shape)

    def view(self, name: str, base: str, shape: Sequence[int], strides: Sequence[int], offset: int = 0,
             dtype: Optional[str] = None) -> str:
        """Another shape and strides (elements) over ``base``'s memory,
        ``offset`` elements in; the dtype is the base's."""
        if dtype is None:
            dtype = next(t["dtype"] for t in self.tensors if t["name"] == base)
        return self._tensor(name, "view", dtype, shape, strides, base=base, offset=offset)

    def node(self, op: str, inputs: Union[Sequence[Optional[str]], Mapping[str, Optional[str]]],
             outputs: Optional[Sequence[str]] = None, name: Optional[str] = None, **attrs: Any) -> JSON:
        """``inputs``: a list of tensor names (None for an absent optional
        one), or, for the compute ops (gemm, attention, layer_norm, ...), a
        dict from the op's operand names to tensors, outputs included."""
        if isinstance(inputs, dict):
            # The compute ops' operands by name, split into inputs and
            # outputs as their table (regen.ops, from proto/) says.
            out = {o.name for o in ops.OPS[op].operands if o.output} if op in ops.OPS else set()
            n: JSON = {"op": op, "inputs": {k: v for k, v in inputs.items() if k not in out},
                 "outputs": {k: v for k, v in inputs.items() if k in out}}
        else:
            n = {"op": op, "inputs": list(inputs)}
            if outputs is not None:
                n["outputs"] = list(outputs)
        if name is not None:
            n["name"] = name
        if attrs:
            n["attrs"] = {k: attr_value(v) for k, v in attrs.items()}
        self.nodes.append(n)
        return n

    def definition(self) -> JSON:
        d: JSON = {"tensors": self.tensors, "nodes": self.nodes}
        if self.name is not None:
            d["name"] = self.name
        return d


class Program:
    """A defined program: its id on its device's worker and Define's reply
    (nodes after lowering, tensors, scratch_bytes, bound: the names a Run
    binds or gives as scalars)."""

    def __init__(self, device: int, reply: JSON, definition: Optional[JSON] = None) -> None:
        self.device = device
        # Kept to define it again where regend lost it: a restart of regend
        # itself (a respawned worker gets its definitions back from the
        # supervisor, under the same id).
        self.definition = definition
        self.id = reply["program"]
        self.nodes = reply.get("nodes")
        self.tensors = reply.get("tensors")
        self.scratch_bytes = reply.get("scratch_bytes")
        # Bytes of the copy journal a Run that may be retried binds (0:
        # the program updates nothing in place, and any Run may simply be
        # run again); a journal of marks only takes JOURNAL_MARKS_BYTES.
        self.journal_bytes = reply.get("journal_bytes", 0)
        self.bound = list(reply.get("bound", ()))
        # Where each bound name lies in binding order: a Run over the
        # ring names its tensors so (proto/ring.h).
        self.positions = {name: i for i, name in enumerate(self.bound)}

    def __repr__(self) -> str:
        return f"<regen.Program {self.id} on device {self.device}: {self.nodes} nodes>"


def bound_at(client, x):
    """Where a Run's binding lies, (buffer id, byte offset): an Operand-like
    (``.buffer``, ``.offset``), a (buffer or buffer id, byte offset) pair,
    or a torch CUDA tensor (its storage imported once, by regen.torch)."""
    if type(x) is tuple:
        buf, offset = x
    elif hasattr(x, "buffer"):
        buf, offset = x.buffer, getattr(x, "offset", 0)
    else:
        tensors = tensor_imports(client)
        if tensors is None or not tensors.is_tensor(x):
            raise TypeError(f"a binding is an Operand, a (buffer, offset) pair or a torch tensor, not "
                            f"{type(x).__name__}")
        return tensors.bound_at(x)
    return str(getattr(buf, "id", buf)), int(offset)


class Programs(ClientPart):
    """The programs part of :class:`regen.Client` (io.regen.Program, on
    the worker socket; libregen's program.c)."""

    def define_program(self, device: int, definition: JSON) -> Program:
        """Defines a program (a dict as ProgramBuilder makes) on ``device``;
        returns a Program. regend checks it whole: a wrong one raises
        InvalidProgram naming the node and why."""
        return Program(device, self._worker_call(device, "io.regen.Program.Define", definition, ()), definition)

    def run_program(self, program: Program, bind: Mapping[str, Any], scalars: Optional[Mapping[str, float]] = None,
                    wait_event: EventLike = None, signal_event: EventLike = None, deadline_ms: Optional[int] = None,
                    journal: Any = None, seq: Optional[int] = None, retry: bool = False,
                    wait: bool = True, journal_mode: str = "copy") -> Union[JSON, int]:
        """Runs ``program`` once, on its device's lane in order with the
        lane's other calls: over the lane's ring where it has one (the Run's
        record and, for many bindings, its continuations; a Run naming more
        ids than the lane's id table holds goes as a Varlink call there,
        answered before it returns), else as a Varlink call. ``bind`` maps
        each input, output and inout name to a torch CUDA tensor, an Operand
        or a (buffer, byte offset) pair, ``scalars`` each scalar name to a
        number. Returns the reply ({"elapsed_us"}): the work finished, or
        with ``signal_event`` it is enqueued and the event fires when it
        finishes; with ``wait=False``, the Run's ticket at once (wait()
        reads its answer), as the compute calls'.
        Torch tensors are not synchronized here: order the rank's work with
        wait_event, or synchronize before. ``journal`` (bound like a tensor,
        at least ``program.journal_bytes``) and ``seq`` make a Run of a
        program that updates in place safe to retry after a fault: the
        retry, with ``retry=True`` and the same seq, applies its updates
        exactly once (run_exactly_once does it all).  ``journal_mode``
        "marks": the journal holds the Run's marks alone (at least
        JOURNAL_MARKS_BYTES; no copy of the inouts a Run), and the retry of
        a Run a fault cut after it began raises errors.RunTorn instead."""
        if journal_mode not in JOURNAL_MODES or (journal_mode != "copy" and journal is None):
            # Refused here as regend refuses it, in its order (a record's
            # flag cannot say another mode, a call has no place for one
            # without a journal).
            first = "journal" if seq is not None and journal_mode in JOURNAL_MODES else \
                "retry" if retry and journal_mode in JOURNAL_MODES else "journal.mode"
            raise errors.InvalidParameter(parameters={"parameter": first})
        device = program.device
        binds = {name: bound_at(self, x) for name, x in bind.items()}
        journal = bound_at(self, journal) if journal is not None else None
        wait_id = str(getattr(wait_event, "id", wait_event)) if wait_event is not None else None
        signal_id = str(getattr(signal_event, "id", signal_event)) if signal_event is not None else None
        lane = self._lane(device)
        if lane.ring:
            ticket = self._queue_run(device, lane, program, binds, scalars, wait_id, signal_id, deadline_ms, journal,
                                     seq, retry, journal_mode == "marks")
            if ticket is not None:
                if not wait:
                    return ticket
                e, _ = self._collect(device, lane, ticket)
                if e is not None:
                    raise e
                return {"elapsed_us": lane.elapsed_us}
        params = {"program": program.id,
                  "bind": {name: {"buffer": ident, "offset": offset} for name, (ident, offset) in binds.items()}}
        if scalars:
            params["scalars"] = {k: float(v) for k, v in scalars.items()}
        if wait_id is not None:
            params["wait_event"] = wait_id
        if signal_id is not None:
            params["signal_event"] = signal_id
        if deadline_ms is not None:
            params["deadline_ms"] = int(deadline_ms)
        if journal is not None:
            params["journal"] = {"buffer": journal[0], "offset": journal[1]}
            if journal_mode != "copy":
                params["journal"]["mode"] = journal_mode
        if seq is not None:
            params["seq"] = int(seq)
        if retry:
            params["retry"] = True
        if not wait:
            return self._queue_varlink(device, lane, "io.regen.Program.Run", params)
        return self._worker_call(device, "io.regen.Program.Run", params, ())

    def _queue_run(self, device, lane, program, binds, scalars, wait_id, signal_id, deadline_ms, journal, seq,
                   retry, marks):
        """Queues a Run on the lane's ring (libregen writes its record and
        continuations, or sends it as a Varlink call where it names more
        ids than the lane's id table holds): its ticket (a Run of n records
        takes n tickets, its own the last), or None where the worker offers
        no ring (the lane took Varlink). ``binds``: name -> (buffer id,
        offset), ``journal`` likewise. What a record cannot say is refused
        here as regend refuses it on Varlink: a name the program does not
        bind, an absent seq or journal beside the other (a record's 0 means
        none), values past a field's width."""
        if (journal is None) != (seq is None):
            raise errors.InvalidParameter(parameters={"parameter": "journal" if journal is None else "seq"})
        positions = program.positions
        bindings = []
        for name, (ident, offset) in binds.items():
            pos = positions.get(name)
            if pos is None:
                raise errors.InvalidParameter(parameters={"parameter": f"bind.{name}"})
            bindings.append((pos, name, ident, offset))
        values = []
        for name, v in (scalars or {}).items():
            pos = positions.get(name)
            if pos is None:
                raise errors.InvalidParameter(parameters={"parameter": f"scalars.{name}"})
            values.append((pos, name, float(v)))
        deadline = record_deadline(deadline_ms)
        journal_id, journal_offset = journal if journal is not None else (None, 0)
        seq = int(seq) if seq is not None else 0
        run = accel.module.run

        def queue(client):
            r = run(client, device, program.id, bindings, values, wait_id, signal_id, deadline, journal_id,
                    journal_offset, seq, bool(retry), bool(marks))
            if r == -errno.ERANGE:
                raise _unpackable_run(binds, journal, seq)
            return r

        return self._ring_queue(device, lane, queue)

    def drop_program(self, program: Program) -> None:
        # A queued Run names it: that Run is taken first (as a queued call's
        # answer is read first).
        self._drain(program.device)
        self._worker_call(program.device, "io.regen.Program.Drop", {"program": program.id}, ())

    def program_status(self, device: int, program: Optional[Program] = None) -> List[JSON]:
        """Status of one program, or of every program of this process on
        ``device``: a list of dicts (runs, run_us, scratch_bytes, modules,
        module_bytes, compile_us, kernels, graph_captures, graph_launches,
        stream_runs, not_captured)."""
        params: JSON = {} if program is None else {"program": program.id}
        return self._worker_call(device, "io.regen.Program.Status", params, ())["programs"]


def _unpackable_run(binds, journal, seq):
    """The InvalidParameter regend answers on Varlink for the first value of
    a Run that a record's field cannot hold (an offset or a seq outside 0
    to 2**64)."""
    for name, (_, offset) in binds.items():
        if not 0 <= offset < 2**64:
            return errors.InvalidParameter(parameters={"parameter": f"bind.{name}.offset"})
    if journal is not None and not 0 <= journal[1] < 2**64:
        return errors.InvalidParameter(parameters={"parameter": "journal.offset"})
    return errors.InvalidParameter(parameters={"parameter": "seq"})


# Errors after which the device serves again, in a new generation or a new
# worker: a Run with a journal is retried.
_RECOVERABLE = (errors.StaleGeneration, errors.DeviceLost, errors.Draining, errors.ConnectionReset,
                errors.Unavailable)


def _wait_serving(client, device, after, deadline):
    """The device's generation once it serves again at a generation past
    ``after`` (or at it, when the failure was the connection's)."""
    while True:
        try:
            for d in client.generation()["devices"]:
                if d["index"] == device and d["state"] == "ready" and d["generation"] >= after:
                    return d["generation"]
        except _RECOVERABLE:
            pass
        if time.monotonic() > deadline:
            raise errors.Timeout(parameters={"message": f"device {device} did not serve again"})
        time.sleep(0.02)


def run_exactly_once(client: Any, program: Program, bind: Any, journal: Any, seq: int,
                     scalars: Optional[Mapping[str, float]] = None, timeout: float = 120.0,
                     journal_mode: str = "copy") -> int:
    """Runs ``program`` with its in-place updates applied exactly once,
    whatever faults come in between: after a fault it waits for the device
    to serve again, defines the program again if regend lost it (its own
    restart; a respawned worker keeps it), binds again (``bind`` and
    ``journal`` may be callables returning them, for buffers that must be
    imported again) and retries with the same ``seq``. Returns the number of
    attempts it took.  With ``journal_mode`` "marks" a Run that a fault cut
    after it began raises errors.RunTorn (nothing retried: its inouts may
    hold part of the update)."""
    deadline = time.monotonic() + timeout
    attempt = 0
    while True:
        try:
            # Inside: binding may import again, which a fault can fail too.
            b = bind() if callable(bind) else bind
            j = journal() if callable(journal) else journal
            client.run_program(program, b, scalars, journal=j, seq=seq, retry=attempt > 0, journal_mode=journal_mode)
            return attempt + 1
        except _RECOVERABLE as e:
            gen = e.parameters.get("generation") if isinstance(e.parameters, dict) else None
            want = (gen + 1) if isinstance(gen, int) and isinstance(e, (errors.DeviceLost, errors.Draining)) \
                else (gen or 0)
            gen = _wait_serving(client, program.device, want, deadline)
            # Imports of earlier generations are gone there: forget them
            # here, so that binding imports again.
            client._note_generation(program.device, gen)
        except errors.NoSuchObject as e:
            if str(e.parameters.get("id")) != program.id or program.definition is None:
                raise
            reply = client.define_program(program.device, program.definition)
            program.id = reply.id
        attempt += 1
        if time.monotonic() > deadline:
            raise errors.Timeout(parameters={"message": f"Run seq {seq} did not complete in {timeout} s"})
