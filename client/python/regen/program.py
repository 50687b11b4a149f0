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

import time

from . import errors, ops

__all__ = ["ProgramBuilder", "Program", "run_exactly_once"]


class ProgramBuilder:
    """Collects tensors and nodes in program order. Every method that makes
    a tensor returns its name, which nodes take."""

    def __init__(self, name=None):
        self.name = name
        self.tensors = []
        self.nodes = []
        self._names = set()

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

    def input(self, name, dtype, shape, strides=None):
        return self._tensor(name, "input", dtype, shape, strides)

    def output(self, name, dtype, shape, strides=None):
        return self._tensor(name, "output", dtype, shape, strides)

    def inout(self, name, dtype, shape, strides=None):
        """A bound tensor the program reads and updates in place (weights,
        optimizer state)."""
        return self._tensor(name, "inout", dtype, shape, strides)

    def scalar(self, name):
        """A value given with each Run (``scalars={name: value}``)."""
        return self._tensor(name, "scalar", "f64", ())

    def intermediate(self, name, dtype, shape):
        return self._tensor(name, "intermediate", dtype, shape)

    def view(self, name, base, shape, strides, offset=0, dtype=None):
        """Another shape and strides (elements) over ``base``'s memory,
        ``offset`` elements in; the dtype is the base's."""
        if dtype is None:
            dtype = next(t["dtype"] for t in self.tensors if t["name"] == base)
        return self._tensor(name, "view", dtype, shape, strides, base=base, offset=offset)

    def node(self, op, inputs, outputs=None, name=None, **attrs):
        """``inputs``: a list of tensor names (None for an absent optional
        one), or, for the compute ops (gemm, attention, layer_norm, ...), a
        dict from the op's operand names to tensors, outputs included."""
        if isinstance(inputs, dict):
            # The compute ops' operands by name, split into inputs and
            # outputs as their table (regen.ops, from proto/) says.
            out = {o.name for o in ops.OPS[op].operands if o.output} if op in ops.OPS else set()
            n = {"op": op, "inputs": {k: v for k, v in inputs.items() if k not in out},
                 "outputs": {k: v for k, v in inputs.items() if k in out}}
        else:
            n = {"op": op, "inputs": list(inputs)}
            if outputs is not None:
                n["outputs"] = list(outputs)
        if name is not None:
            n["name"] = name
        if attrs:
            n["attrs"] = attrs
        self.nodes.append(n)
        return n

    def definition(self):
        d = {"tensors": self.tensors, "nodes": self.nodes}
        if self.name is not None:
            d["name"] = self.name
        return d


class Program:
    """A defined program: its id on its device's worker and Define's reply
    (nodes after lowering, tensors, scratch_bytes, bound: the names a Run
    binds or gives as scalars)."""

    def __init__(self, device, reply, definition=None):
        self.device = device
        # Kept to define it again where its worker was replaced (a respawn
        # loses the definitions a worker held).
        self.definition = definition
        self.id = reply["program"]
        self.nodes = reply.get("nodes")
        self.tensors = reply.get("tensors")
        self.scratch_bytes = reply.get("scratch_bytes")
        # Bytes of the journal a Run that may be retried binds (0: the
        # program updates nothing in place, and any Run may simply be
        # run again).
        self.journal_bytes = reply.get("journal_bytes", 0)
        self.bound = list(reply.get("bound", ()))
        # Where each bound name lies in binding order: a Run over the
        # ring names its tensors so (proto/ring.h).
        self.positions = {name: i for i, name in enumerate(self.bound)}

    def __repr__(self):
        return f"<regen.Program {self.id} on device {self.device}: {self.nodes} nodes>"


def bound_at(client, x):
    """Where a Run's binding lies, (buffer id, byte offset): a torch CUDA
    tensor (its storage imported once), an Operand-like (``.buffer``,
    ``.offset``) or a (buffer or buffer id, byte offset) pair."""
    if type(x) is tuple:
        buf, offset = x
    elif hasattr(x, "untyped_storage") and getattr(x, "is_cuda", False):
        return str(client.import_tensor(x).id), x.storage_offset() * x.element_size()
    else:
        buf, offset = x.buffer, getattr(x, "offset", 0)
    return str(getattr(buf, "id", buf)), int(offset)



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


def run_exactly_once(client, program, bind, journal, seq, scalars=None, timeout=120.0):
    """Runs ``program`` with its in-place updates applied exactly once,
    whatever faults come in between: after a fault it waits for the device
    to serve again, defines the program again if its worker was replaced,
    binds again (``bind`` and ``journal`` may be callables returning them,
    for buffers that must be imported again) and retries with the same
    ``seq``. Returns the number of attempts it took."""
    deadline = time.monotonic() + timeout
    attempt = 0
    while True:
        try:
            # Inside: binding may import again, which a fault can fail too.
            b = bind() if callable(bind) else bind
            j = journal() if callable(journal) else journal
            client.run_program(program, b, scalars, journal=j, seq=seq, retry=attempt > 0)
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
