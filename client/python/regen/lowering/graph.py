# SPDX-License-Identifier: Apache-2.0
"""A traced graph (torch.fx's, from AOTAutograd) split into what regend runs
as programs and what stays on the rank, without torch.

The graph arrives as Vals (tensors: shape, strides, storage offset, dtype
and which storage they live in, so that views are known as views) and Ops
(an ATen op by name, its arguments by schema name, its outputs).  regen.torch
builds them from an fx.GraphModule; tests build them by hand.

partition() walks the ops in order and gives each to a program segment where
a handler (regen.lowering.aten) can write it as program nodes, else to the
rank.  A rank op that does not read what the open segment makes runs before
it, so rank work between regend's ops splits a segment only where the data
says it must: every segment boundary is a hand-off (rank -> regend -> rank),
counted and explained.
"""

import math

__all__ = ["Val", "Const", "Op", "Graph", "Unsupported", "Segment", "RankStep", "partition", "contiguous_strides"]

# Past these a segment closes and the next opens (io.regen.Program's limits
# are 4096 tensors and nodes after lowering, 1024 bound tensors).
SEGMENT_NODES_MAX = 1500
SEGMENT_BOUND_MAX = 900


class Unsupported(Exception):
    """The op cannot run in a program: the reason, as explain() shows it."""


def contiguous_strides(shape):
    strides, step = [], 1
    for d in reversed(shape):
        strides.append(step)
        step *= max(d, 1)
    return tuple(reversed(strides))


class Val:
    """A tensor of the graph.  ``storage``: a key shared by the tensors that
    live in the same memory (a view and what it views); ``storage_numel``:
    that memory's size in elements; ``offset``: where this tensor starts in
    it (elements).  ``dtype`` is the program's name of the dtype, None where
    programs have none."""

    __slots__ = ("id", "shape", "strides", "offset", "dtype", "itemsize", "storage", "storage_numel", "users",
                 "is_output", "producer")

    def __init__(self, id, shape, strides, dtype, itemsize, storage, storage_numel, offset=0):
        self.id = id
        self.shape = tuple(shape)
        self.strides = tuple(strides)
        self.offset = offset
        self.dtype = dtype
        self.itemsize = itemsize
        self.storage = storage
        self.storage_numel = storage_numel
        self.users = []          # the Ops that read it
        self.is_output = False   # the graph returns it
        self.producer = None     # the Op that makes it (None: a graph input)

    @property
    def numel(self):
        return math.prod(self.shape)

    def is_contiguous(self):
        return all(st == want for d, st, want in zip(self.shape, self.strides, contiguous_strides(self.shape))
                   if d > 1)

    def owns_storage(self):
        """Contiguous from the start of its memory and covering all of it:
        the memory can be this very tensor."""
        return self.offset == 0 and self.is_contiguous() and self.numel == self.storage_numel

    def __repr__(self):
        return f"<Val {self.id} {self.dtype}{list(self.shape)}>"


class Const:
    """A non-tensor output of an op (a SymInt of the trace, fixed here)."""

    __slots__ = ("value",)

    def __init__(self, value):
        self.value = value


class Op:
    """One ATen call: ``target`` its name ("aten.mm.default"), ``a`` its
    arguments by schema name (Vals where tensors go, lists of them, or
    constants), ``outs`` its outputs in order (Val, Const or None).
    ``payload`` is the caller's (the fx node the rank runs)."""

    __slots__ = ("index", "target", "a", "outs", "payload")

    def __init__(self, index, target, a, outs, payload=None):
        self.index = index
        self.target = target
        self.a = a
        self.outs = list(outs)
        self.payload = payload

    def inputs(self):
        """The Vals it reads."""
        found = []
        for v in self.a.values():
            if isinstance(v, Val):
                found.append(v)
            elif isinstance(v, (list, tuple)):
                found.extend(x for x in v if isinstance(x, Val))
        return found

    def out_vals(self):
        return [v for v in self.outs if isinstance(v, Val)]

    def __repr__(self):
        return f"<Op {self.index} {self.target}>"


class Graph:
    """Ops in order, the graph's inputs and what it returns."""

    def __init__(self, inputs, ops, outputs):
        self.inputs = list(inputs)
        self.ops = list(ops)
        self.outputs = list(outputs)
        for op in self.ops:
            for v in op.inputs():
                v.users.append(op)
            for v in op.out_vals():
                v.producer = op
        for v in self.outputs:
            if isinstance(v, Val):
                v.is_output = True


class RankStep:
    """Ops the rank runs itself (torch's own kernels), in order, and why
    each stayed (op index -> reason)."""

    def __init__(self):
        self.ops = []
        self.reasons = {}


class Segment:
    """Ops regend runs as one program.  ``definition`` is what
    io.regen.Program.Define takes; ``inputs`` (name, Val) are bound to the
    rank's tensors at each Run; ``outputs`` (name, dtype, shape, storage)
    are memory the rank allocates and binds, contiguous; ``exports`` are
    the Vals the rank reads afterwards, each in an output's memory (by its
    storage key, at its offset and strides); ``dummies`` are outputs the rank must hold but nothing
    reads (an attention's unused RNG state).  ``updates``: whether the
    program writes inputs in place (inouts, bound as the inputs are: a
    graph's update of a buffer), so that a Run a fault cuts must not simply
    run again (a journal)."""

    def __init__(self, index):
        self.index = index
        self.ops = []
        self.definition = None
        self.inputs = []
        self.outputs = []
        self.exports = []
        self.dummies = []
        self.consts = []
        self.scalars = []   # names of the scalars a Run gives ("seed": a fresh random integer)
        self.updates = False


class _Builder:
    """A segment being written: program tensors for the Vals it touches."""

    def __init__(self, graph, index):
        self.graph = graph
        self.seg = Segment(index)
        self.tensors = []
        self.nodes = []
        self.name_of = {}      # Val.id -> program tensor name
        self.roots = {}        # storage -> (root tensor dict, the Val that made it)
        self.made = {}         # Val.id -> Val (made by this segment's nodes)
        self.external = {}     # Val.id -> Val (bound as inputs)
        self.absorbed = set()  # op indices a handler wrote with an earlier op
        self.counter = 0
        self.dummies = []
        self.consts = []
        self.scalar_names = []   # scalars each Run gives (the seed)
        self.streams = 0

    # -- names -------------------------------------------------------------

    def _fresh(self, stem):
        self.counter += 1
        return f"{stem}{self.counter}"

    def _add(self, t):
        self.tensors.append(t)
        return t["name"]

    # -- tensors -----------------------------------------------------------

    def read(self, v):
        """The program tensor that reads Val ``v``: what this segment made,
        or an input bound at Run."""
        name = self.name_of.get(v.id)
        if name is not None:
            return name
        if v.dtype is None:
            raise Unsupported(f"{v!r} has a dtype programs do not take")
        name = self._add({"name": self._fresh("in"), "kind": "input", "dtype": v.dtype, "shape": list(v.shape),
                          "strides": list(v.strides)})
        self.external[v.id] = v
        self.name_of[v.id] = name
        return name

    def write(self, v):
        """The program tensor a node writes for Val ``v`` (made here): its
        own memory, or a view of the memory it shares with a Val made
        earlier in the segment."""
        if v.dtype is None:
            raise Unsupported(f"{v!r} has a dtype programs do not take")
        root = self.roots.get(v.storage)
        if root is None:
            if v.owns_storage():
                t = {"name": self._fresh("t"), "kind": None, "dtype": v.dtype, "shape": list(v.shape) or [1]}
                if not v.shape:
                    # A rank-0 tensor: the program's are [1] where memory is theirs.
                    t["shape"] = [1]
                self.roots[v.storage] = (t, v)
                self._add(t)
                self.made[v.id] = v
                if v.shape:
                    self.name_of[v.id] = t["name"]
                    return t["name"]
                name = self._add({"name": self._fresh("v"), "kind": "view", "base": t["name"], "shape": [],
                                  "strides": [], "offset": 0})
                self.name_of[v.id] = name
                return name
            t = {"name": self._fresh("s"), "kind": None, "dtype": v.dtype, "shape": [v.storage_numel]}
            self.roots[v.storage] = (t, None)
            self._add(t)
        self.made[v.id] = v
        return self._view_of_root(v)

    def _view_of_root(self, v):
        t, _ = self.roots[v.storage]
        name = self._add({"name": self._fresh("v"), "kind": "view", "base": t["name"], "shape": list(v.shape),
                          "strides": list(v.strides), "offset": v.offset})
        self.name_of[v.id] = name
        return name

    def update(self, v):
        """The program tensor for graph input ``v`` that a node writes in
        place: bound where it lies, as an inout (read before, if at all, by
        this segment's earlier nodes)."""
        if v.producer is not None:
            raise Unsupported(f"{v!r} is not a graph input: only inputs are updated in place")
        name = self.read(v)
        for t in self.tensors:
            if t["name"] == name:
                t["kind"] = "inout"
        return name

    def alias(self, v):
        """Val ``v`` is a view (same storage) of a Val this segment made:
        a program view, no node."""
        self.made[v.id] = v
        return self._view_of_root(v)

    def view(self, of, shape, strides, offset=0):
        """A view of program tensor for Val ``of`` with other shape and
        strides (elements), ``offset`` elements further in."""
        return self.view_named(self.read(of), shape, strides, offset)

    def view_named(self, base, shape, strides, offset=0):
        """A view of program tensor ``base`` (a name)."""
        return self._add({"name": self._fresh("w"), "kind": "view", "base": base, "shape": list(shape),
                          "strides": list(strides), "offset": offset})

    def dtype_of(self, name):
        """The dtype of program tensor ``name`` (a view's, its base's)."""
        by_name = {t["name"]: t for t in self.tensors}
        t = by_name[name]
        while t.get("kind") == "view":
            t = by_name[t["base"]]
        return t["dtype"]

    def scratch(self, dtype, shape):
        return self._add({"name": self._fresh("x"), "kind": "intermediate", "dtype": dtype, "shape": list(shape)})

    def seed(self):
        """The segment's seed: a scalar tensor each Run gives afresh
        (Segment.scalars), the same again when a Run is retried."""
        if "seed" not in self.scalar_names:
            self._add({"name": "seed", "kind": "scalar", "dtype": "f64", "shape": []})
            self.scalar_names.append("seed")
        return "seed"

    def next_stream(self):
        """A number of its own for each random draw of the segment."""
        self.streams += 1
        return self.streams - 1

    def dummy(self, v):
        """An output the rank must hold that nothing in regend writes."""
        if isinstance(v, Val):
            self.dummies.append(v)
            self.made[v.id] = v

    def const(self, v):
        if isinstance(v, Const):
            self.consts.append(v)

    def node(self, op, inputs, outputs=None, **attrs):
        n = {"op": op}
        if isinstance(inputs, dict):
            from .. import ops as _ops
            out = {o.name for o in _ops.OPS[op].operands if o.output}
            n["inputs"] = {k: v for k, v in inputs.items() if k not in out and v is not None}
            n["outputs"] = {k: v for k, v in inputs.items() if k in out and v is not None}
        else:
            n["inputs"] = list(inputs)
            if outputs is not None:
                n["outputs"] = list(outputs)
        from ..program import attr_value
        attrs = {k: attr_value(v) for k, v in attrs.items() if v is not None}
        if attrs:
            n["attrs"] = attrs
        self.nodes.append(n)

    def absorb(self, op):
        self.absorbed.add(op.index)

    # -- closing -----------------------------------------------------------

    def finish(self, used_after):
        """Decides which memory is bound (read after the segment) and which
        is the program's own, and writes the definition."""
        seg = self.seg
        needed_roots = set()
        for v in self.made.values():
            if v.id in used_after and v not in self.dummies:
                needed_roots.add(v.storage)
        for storage, (t, v) in self.roots.items():
            if storage in needed_roots:
                t["kind"] = "output"
                seg.outputs.append((t["name"], t["dtype"], tuple(t["shape"]), storage))
            else:
                t["kind"] = "intermediate"
        for v in self.made.values():
            if v.id in used_after and v not in self.dummies:
                seg.exports.append(v)
        seg.inputs = [(self.name_of[v.id], v) for v in self.external.values()]
        seg.dummies = [v for v in self.dummies if v.id in used_after]
        seg.consts = self.consts
        seg.scalars = list(self.scalar_names)
        seg.updates = any(t["kind"] == "inout" for t in self.tensors)
        seg.definition = {"name": f"regen_compiled_{seg.index}", "tensors": self.tensors, "nodes": self.nodes}
        return seg

    def bound_count(self):
        return len(self.external) + len(self.roots)


def partition(graph, handlers, name="graph"):
    """Steps in order: RankStep and Segment.  ``handlers``: target name ->
    function(builder, op) that writes the op as program nodes or raises
    Unsupported (before writing anything)."""
    steps = []
    rank = RankStep()       # rank ops before any open segment
    hoisted = RankStep()    # rank ops met while a segment is open that do not read it: they run before it
    open_seg = None         # the _Builder being written
    made_here = set()       # Val ids the open segment makes
    nseg = 0

    def close():
        nonlocal open_seg, made_here, hoisted
        if open_seg is None:
            return
        if hoisted.ops:
            steps.append(hoisted)
            hoisted = RankStep()
        steps.append(open_seg)
        open_seg, made_here = None, set()

    def flush_rank():
        nonlocal rank
        if rank.ops:
            steps.append(rank)
            rank = RankStep()

    for op in graph.ops:
        if open_seg is not None and op.index in open_seg.absorbed:
            continue
        handler = handlers.get(op.target)
        reason = None
        if handler is None:
            reason = f"no program op for {op.target}"
        else:
            b = open_seg
            if b is not None and (len(b.nodes) >= SEGMENT_NODES_MAX or b.bound_count() >= SEGMENT_BOUND_MAX):
                close()   # full: the next segment takes it
                b = None
            if b is None:
                b = _Builder(graph, nseg)
            mark = (len(b.tensors), len(b.nodes), dict(b.name_of), dict(b.roots), dict(b.made), dict(b.external),
                    set(b.absorbed), len(b.dummies), len(b.consts), b.counter, list(b.scalar_names), b.streams)
            try:
                handler(b, op)
            except Unsupported as e:
                (nt, nn, b.name_of, b.roots, b.made, b.external, b.absorbed, nd, nc, b.counter, b.scalar_names,
                 b.streams) = mark
                del b.tensors[nt:], b.nodes[nn:], b.dummies[nd:], b.consts[nc:]
                reason = str(e)
            else:
                if open_seg is None:
                    flush_rank()
                    open_seg = b
                    nseg += 1
                open_seg.seg.ops.append(op)
                made_here.update(v.id for v in op.out_vals())
                for i in open_seg.absorbed:
                    made_here.update(v.id for v in graph.ops[i].out_vals())
                continue
        # The rank runs it: before the open segment where it reads nothing
        # of the segment's, else after it (the segment closes).
        if open_seg is not None and any(v.id in made_here for v in op.inputs()):
            close()
        (rank if open_seg is None else hoisted).ops.append(op)
        (rank if open_seg is None else hoisted).reasons[op.index] = reason
    close()
    flush_rank()

    # What each segment's Vals are read by afterwards: a later step or the
    # graph's return.
    step_of_op = {}
    for i, s in enumerate(steps):
        for op in s.ops if isinstance(s, RankStep) else s.seg.ops:
            step_of_op[op.index] = i
        if isinstance(s, _Builder):
            for j in s.absorbed:
                step_of_op[j] = i
    out = []
    for i, s in enumerate(steps):
        if isinstance(s, _Builder):
            used_after = set()
            for vid, v in s.made.items():
                if v.is_output or any(step_of_op.get(u.index, i) != i for u in v.users):
                    used_after.add(vid)
            seg = s.finish(used_after)
            seg.ops.extend(graph.ops[j] for j in s.absorbed)
            seg.ops.sort(key=lambda o: o.index)   # graph order: how the rank runs them if regend will not
            out.append(seg)
        else:
            out.append(s)
    return out
