# SPDX-License-Identifier: Apache-2.0
"""torch.compile(model, backend="regen"): AOTAutograd's forward and backward
graphs (ATen ops) become io.regen.Program segments that regend runs whole,
one Run each; what regend cannot run stays on the rank as torch's own
kernels, and every boundary between the two is a hand-off, counted in
regen.torch.stats() and listed by regen.torch.explain().

regen.lowering does the splitting and writes the programs (no torch
there); this module turns an fx.GraphModule into its graph, and runs the
steps: the rank's ops as the graph would have, the segments as program Runs
on torch's current stream (ordered by the runtime's IPC events), each
defined on first use per device and again after its worker was replaced.
"""

import itertools
import json
import operator
import os
import threading
import weakref

import torch
import torch.fx

from .. import errors
from ..lowering import HANDLERS, VIEW_OPS, Const, Graph, Op, RankStep, Segment, Val, partition
from ._partition import with_recompute

__all__ = ["backend", "explain", "compiled_graphs"]

PROGRAM_DTYPES = {torch.float32: "f32", torch.float16: "f16", torch.bfloat16: "bf16", torch.float64: "f64",
                  torch.int64: "i64", torch.int32: "i32", torch.bool: "u8", torch.uint8: "u8"}
TORCH_DTYPES = {"f32": torch.float32, "f16": torch.float16, "bf16": torch.bfloat16, "f64": torch.float64,
                "i64": torch.int64, "i32": torch.int32, "u8": torch.uint8}
# FP8 where this torch has it (2.1 and later).
for _name, _attr in (("e4m3", "float8_e4m3fn"), ("e5m2", "float8_e5m2")):
    if hasattr(torch, _attr):
        PROGRAM_DTYPES[getattr(torch, _attr)] = _name
        TORCH_DTYPES[_name] = getattr(torch, _attr)

# Checks of metadata the trace already fixed: nothing to run.
_DROPPED = ("aten._assert_tensor_metadata.default", "aten._assert_scalar.default",
            "aten.sym_constrain_range_for_size.default", "aten._assert_async.msg")

_lock = threading.Lock()
_graphs = []   # weak references to every CompiledGraph, for explain()
# Each compiled graph's programs are keyed by its own serial, never by an
# id() that a later object may take once it is gone.
_serials = itertools.count(1)


class _Symbolic(Exception):
    pass


def _concrete(xs):
    out = []
    for x in xs:
        if isinstance(x, torch.SymInt):
            raise _Symbolic("a dynamic shape")
        out.append(int(x))
    return tuple(out)


def _storage_key(t):
    from torch.multiprocessing.reductions import StorageWeakRef
    return StorageWeakRef(t.untyped_storage()).cdata


def _val(t, ident):
    shape = _concrete(t.shape)
    strides = _concrete(t.stride())
    dtype = PROGRAM_DTYPES.get(t.dtype) if t.device.type == "cuda" else None
    itemsize = t.element_size()
    nbytes = t.untyped_storage().nbytes()
    return Val(ident, shape, strides, dtype, itemsize, _storage_key(t), nbytes // itemsize,
               int(t.storage_offset()))


def _arguments(node):
    """The call's arguments by schema name (defaults filled), or None for a
    target that is not an ATen overload."""
    schema = getattr(node.target, "_schema", None)
    if schema is None:
        return None
    a = {}
    for i, arg in enumerate(schema.arguments):
        if i < len(node.args) and not arg.kwarg_only:
            a[arg.name] = node.args[i]
        elif arg.name in node.kwargs:
            a[arg.name] = node.kwargs[arg.name]
        elif arg.has_default_value():
            a[arg.name] = arg.default_value
    return a


def to_graph(gm):
    """The lowering's Graph of an fx.GraphModule, and node -> what it stands
    for (a Val, a Const, a list of them, or None)."""
    ref = {}
    inputs, ops = [], []
    ident = 0

    def make(x):
        nonlocal ident
        if isinstance(x, torch.Tensor):
            ident += 1
            return _val(x, ident)
        if isinstance(x, (list, tuple)):
            return [make(e) for e in x]
        if isinstance(x, torch.SymInt):
            _concrete([x])
        return Const(x) if x is not None else None

    def arg_of(x):
        if isinstance(x, torch.fx.Node):
            r = ref.get(x)
            if isinstance(r, Const):
                return r.value
            return r
        if isinstance(x, (list, tuple)):
            return [arg_of(e) for e in x]
        return x

    for node in gm.graph.nodes:
        val = node.meta.get("val")
        if node.op == "placeholder":
            ref[node] = make(val)
            if isinstance(ref[node], Val):
                inputs.append(ref[node])
        elif node.op == "call_function" and node.target is operator.getitem:
            src = ref.get(node.args[0])
            ref[node] = src[node.args[1]] if isinstance(src, list) else make(val)
        elif node.op == "call_function":
            made = make(val)
            ref[node] = made
            outs = made if isinstance(made, list) else [made]
            a = _arguments(node)
            target = str(node.target) if a is not None else getattr(node.target, "__name__", str(node.target))
            if target in _DROPPED:
                continue
            a = {k: arg_of(v) for k, v in (a or {}).items()}
            ops.append(Op(len(ops), target, a, outs, payload=node))
        elif node.op == "output":
            results = node.args[0]
            outputs = [arg_of(r) if isinstance(r, torch.fx.Node) else r for r in results]
        elif node.op == "get_attr":
            ref[node] = Const(getattr(gm, node.target))
    return Graph(inputs, ops, outputs), ref


class CompiledGraph:
    """One AOTAutograd graph (forward, backward or inference) as steps:
    segments that regend runs, ops the rank runs."""

    def __init__(self, gm, kind, recycle=False):
        # AOTAutograd passes the inputs as one list it may clear (an
        # instance attribute: torch._dynamo.disable's wrapper copies those).
        self._boxed_call = True
        self.gm = gm
        self.kind = kind
        # (segment index, output storage) -> its last tensors, kept to be
        # used again once nothing else holds them (options={"recycle": True})
        self.kept_outputs = {} if recycle and _use_count is not None else None
        self.recycled = _recycle_counts()
        self.calls = 0
        self.why_eager = None
        try:
            self.graph, self.ref = to_graph(gm)
            self.steps = partition(self.graph, HANDLERS)
        except _Symbolic as e:
            self.graph, self.steps = None, None
            self.why_eager = f"{e}: the graph runs on the rank (compile with dynamic=False)"
        self.serial = next(_serials)
        for s in self.steps or ():
            if isinstance(s, Segment):
                # Named for what it is in Status, metrics and traces.
                s.definition["name"] = f"compiled{self.serial}_{kind}_{s.index}"
        self.failed = {}         # segment index -> why regend refused it
        self.journals = {}       # segment index -> the journal of its Runs, where it updates inputs in place
        self.relaid = 0          # segment runs on the rank: inputs laid out otherwise than traced
        self.placeholders = [n for n in gm.graph.nodes if n.op == "placeholder"]
        if self.steps is not None:
            self._plan_frees()
        with _lock:
            _graphs.append(weakref.ref(self))
        # Its programs go with it (a recompile, torch._dynamo.reset()).
        weakref.finalize(self, forget_programs, self.serial)
        dump = os.environ.get("REGEN_COMPILE_DUMP")
        if dump:
            # The graph as AOTAutograd gave it, for reading beside explain().
            os.makedirs(dump, exist_ok=True)
            with open(os.path.join(dump, f"{self.serial:03d}_{kind}.py"), "w") as f:
                f.write(gm.code)
            # Each program as io.regen.Program.Define gets it: to plan and
            # run again without torch or a GPU.
            for s in self.steps or ():
                if isinstance(s, Segment):
                    with open(os.path.join(dump, f"{s.definition['name']}.json"), "w") as f:
                        json.dump(s.definition, f)

    def _plan_frees(self):
        """After each step, the Vals no later step reads and the graph does
        not return: dropped, so memory goes as torch's own run would free it."""
        last = {}
        for i, s in enumerate(self.steps):
            for op in (s.ops if isinstance(s, RankStep) else s.ops):
                for v in op.inputs():
                    last[v.id] = i
        keep = {v.id for v in self.graph.outputs if isinstance(v, Val)}
        self.frees = [[] for _ in self.steps]
        for vid, i in last.items():
            if vid not in keep:
                self.frees[i].append(vid)

    # -- running -------------------------------------------------------------

    def __call__(self, *given):
        args = given[0] if len(given) == 1 and isinstance(given[0], list) else list(given)
        self.calls += 1
        if self.steps is None:
            out = self.gm(*args)
            args.clear()
            return out
        from . import runtime
        rt = runtime()
        env = {}
        for node, x in zip(self.placeholders, args):
            r = self.ref.get(node)
            if isinstance(r, Val):
                env[r.id] = x
        args.clear()
        for i, step in enumerate(self.steps):
            if isinstance(step, Segment) and step.index not in self.failed:
                self._run_segment(rt, step, env)
            else:
                self._run_rank(rt, step.ops, env, isinstance(step, Segment))
            for vid in self.frees[i]:
                env.pop(vid, None)
        return [self._value(v, env) for v in self.graph.outputs]

    @staticmethod
    def _value(v, env):
        if isinstance(v, Val):
            return env[v.id]
        if isinstance(v, Const):
            return v.value
        if isinstance(v, list):
            return [CompiledGraph._value(e, env) for e in v]
        return v

    def _run_rank(self, rt, ops, env, fallback):
        work = False
        for op in ops:
            node = op.payload
            a = torch.fx.node.map_arg(node.args, lambda n: self._arg(n, env))
            kw = torch.fx.node.map_arg(node.kwargs, lambda n: self._arg(n, env))
            result = node.target(*a, **kw)
            outs = op.outs
            if len(outs) == 1 and not isinstance(result, (list, tuple)):
                result = [result]
            for o, r in zip(outs, result):
                if isinstance(o, Val):
                    env[o.id] = r
            work = work or op.target not in VIEW_OPS
        if work:
            rt.rank_work_between_programs(fallback)

    def _arg(self, node, env):
        r = self.ref.get(node)
        if r is None and node.op == "call_function" and node.target is operator.getitem:
            return None
        return self._value(r, env)

    def _run_segment(self, rt, seg, env):
        binds = {}
        device_tensor = None
        for name, v in seg.inputs:
            t = env[v.id]
            if tuple(t.shape) != v.shape or (t.numel() > 1 and not _same_layout(t, v)):
                # Not as traced (the program's tensors have the trace's
                # strides): this call runs the segment on the rank.
                self.relaid += 1
                self._run_rank(rt, seg.ops, env, True)
                return
            binds[name] = t
            device_tensor = t
        device = device_tensor.device if device_tensor is not None else torch.device("cuda",
                                                                                       torch.cuda.current_device())
        roots = self._outputs_of(seg, device)
        for name, _, _, storage in seg.outputs:
            binds[name] = roots[storage]
        for v in seg.exports:
            root = roots[v.storage]
            env[v.id] = root.as_strided(v.shape, v.strides, v.offset)
        for v in seg.dummies:
            env[v.id] = torch.empty_strided(v.shape, v.strides, dtype=_torch_dtype(v), device=device)
        # A fresh seed a call for the segment's random draws (dropout), from
        # torch's generator: torch.manual_seed makes a run repeat.
        scalars = {name: float(torch.randint(0, 2**53, (1,)).item()) for name in seg.scalars} or None
        # A segment that updates inputs in place (a buffer's copy_: the FP8
        # scaling state) names a journal: a Run a fault cuts is put back
        # and run again in the new generation, its update applied once.
        journal = self._journal_for(seg.index, device) if seg.updates else None
        try:
            rt.run_program((("graph", self.serial), seg.index), seg.definition, binds, scalars, journal=journal)
        except errors.InvalidProgram as e:
            # regend refused what the lowering wrote: this segment runs on
            # the rank from now on, and explain() says why.
            self.failed[seg.index] = f"regend refused the program: {e}"
            for v in seg.exports:
                env.pop(v.id, None)
            self._run_rank(rt, seg.ops, env, True)

    def _outputs_of(self, seg, device):
        """seg's outputs for this call, by storage. With options recycle,
        each is one this graph made before that nothing else holds any
        more (the step that read it is over: the backward has run, the
        optimizer has taken the gradient and zero_grad let it go), to be
        written again; one still held (a loss the caller keeps) is made
        anew, the others still come back. A program's graph is captured
        for its library operands' addresses and replayed while they come
        back: outputs allocated anew moved nearly every step (an H100's
        Llama, 16 of 20 Runs launched on the stream). Runs are ordered
        after the rank's queued work, so nothing of the rank still reads
        what they write."""
        roots, fresh = {}, []
        for _, dtype, shape, storage in seg.outputs:
            if storage in roots:
                continue
            roots[storage] = None
            if self.kept_outputs is not None:
                for t, ref in self.kept_outputs.get((seg.index, storage), ()):
                    uses = _use_count(ref)
                    if uses == 1:
                        roots[storage] = t
                        self.recycled["reused"] += 1
                        break
                    held = self.recycled["held"]
                    held[uses] = held.get(uses, 0) + 1
            if roots[storage] is None:
                fresh.append((storage, dtype, shape))
        if fresh:
            self.recycled["made"] += len(fresh)
            with _outputs_pool(device):
                for storage, dtype, shape in fresh:
                    roots[storage] = torch.empty(shape, dtype=TORCH_DTYPES[dtype], device=device)
            if self.kept_outputs is not None:
                for storage, _, _ in fresh:
                    # The older of two let go: a graph called again before
                    # the last call's outputs are free (two forwards before
                    # a backward) makes another, not more.
                    kept = self.kept_outputs.setdefault((seg.index, storage), [])
                    kept.append((roots[storage], _storage_ref(roots[storage])))
                    del kept[:-_KEPT_OUTPUTS]
        return roots

    def _journal_for(self, index, device):
        """The journal of segment ``index``'s Runs (one at a time), from the
        outputs' memory, grown as its program needs."""
        def journal(program):
            j = self.journals.get(index)
            need = max(program.journal_bytes, 8)
            if j is None or j.numel() < need or j.device != device:
                with _outputs_pool(device):
                    j = self.journals[index] = torch.empty(need, dtype=torch.uint8, device=device)
            return j
        return journal

    # -- reporting -----------------------------------------------------------

    def report(self):
        """What ran where: segments (ops, program nodes), rank steps with
        the ops that stayed and why, and hand-offs per call."""
        if self.steps is None:
            return {"kind": self.kind, "calls": self.calls, "eager": self.why_eager, "segments": [], "rank": [],
                    "handoffs": 0}
        segs, rank = [], []
        handoffs = 0
        for s in self.steps:
            if isinstance(s, Segment):
                entry = {"index": s.index, "ops": len(s.ops), "program_nodes": len(s.definition["nodes"]),
                         "bound": len(s.inputs) + len(s.outputs), "updates": s.updates}
                if s.index in self.failed:
                    entry["refused"] = self.failed[s.index]
                else:
                    handoffs += 1
                segs.append(entry)
            else:
                for op in s.ops:
                    rank.append({"op": op.target, "why": s.reasons.get(op.index)})
        out = {"kind": self.kind, "calls": self.calls, "eager": None, "segments": segs, "rank": rank,
               "handoffs": handoffs, "relaid": self.relaid}
        if self.kept_outputs is not None:
            out["recycled"] = dict(self.recycled, held=dict(self.recycled["held"]))
        return out


_no_pool = set()   # devices whose outputs cannot come from regen.torch.pool() (torch < 2.5, no libregen)


def _outputs_pool(device):
    """Where a segment's outputs are allocated: regen.torch.pool()'s memory
    for the device (mapped by regend once per chunk: no block import, and
    torch's allocator statistics and OutOfMemoryError as for any tensor),
    whichever thread runs the graph (autograd's backward thread too); the
    current allocator where that pool is not to be had."""
    import contextlib
    if device.type != "cuda" or device.index in _no_pool:
        return contextlib.nullcontext()
    from . import pool
    try:
        scope = pool(device.index)
        scope.__enter__()
    except Exception:
        _no_pool.add(device.index)
        return contextlib.nullcontext()
    return _Entered(scope)


class _Entered:
    """A context manager already entered: leaving it leaves the scope."""

    def __init__(self, scope):
        self.scope = scope

    def __enter__(self):
        return None

    def __exit__(self, *exc):
        return self.scope.__exit__(*exc)


def forget_programs(serial, kind="graph"):
    """Drops a compiled graph's (or an optimizer's) programs in regend."""
    try:
        from . import _runtime as current   # the process's Runtime, or None: none is made for this
        if current is not None:
            current.forget_programs((kind, serial))
    except Exception:   # at interpreter exit, or with regend gone: nothing left to drop
        pass


def _same_layout(t, v):
    return all(a == b for d, a, b in zip(v.shape, t.stride(), v.strides) if d > 1)


def _torch_dtype(v):
    return TORCH_DTYPES.get(v.dtype, torch.uint8)


# How many of each segment output's tensors are kept to be used again
# (options recycle).
_KEPT_OUTPUTS = 2
# How many tensors hold a storage, by its StorageWeakRef's cdata (torch's
# CUDA graph trees ask the same); None where torch has no such count.
_use_count = getattr(torch._C, "_storage_Use_Count", None)


def _recycle_counts():
    """What recycling did, for report(): outputs written into kept ones,
    outputs made anew, and the use counts of the kept ones found still
    held (the caller's, autograd's: what kept them from coming back)."""
    return {"reused": 0, "made": 0, "held": {}}


def _storage_ref(t):
    """What _use_count takes for t's storage, holding none of it."""
    from torch.multiprocessing.reductions import StorageWeakRef
    return StorageWeakRef(t.untyped_storage()).cdata


def _compiler(kind, recycle=False):
    def compile_graph(gm, example_inputs):
        return CompiledGraph(gm, kind, recycle)
    return compile_graph


def _flag(options, name):
    """options[name], taken out of options: False where absent, and a
    ValueError where not a bool."""
    value = options.pop(name, False)
    if not isinstance(value, bool):
        raise ValueError(f'regen backend: options["{name}"] is True or False, not {value!r}')
    return value


def backend(gm, example_inputs, options=None, mode=None):
    """The "regen" backend: AOTAutograd with our forward and backward
    compilers.  A forward's update of an input that needs no gradient (a
    buffer: FP8 scaling state, running statistics) stays in the graph as
    copy_ (keep_inference_input_mutations, as Inductor asks), which the
    lowering writes into the program, in place, rather than AOTAutograd
    copying after the Run on the rank (a backward's update is in its graph
    whatever is asked).

    torch.compile(..., options={"partition": "min_cut"}) splits forward
    from backward as Inductor does (the backward recomputes cheap
    pointwise work rather than the forward saving it: less memory, fewer
    bytes written); "default", the default, is AOTAutograd's own split.
    options={"recompute": True} has the backward make again what it can
    from half the bytes (a loss's log-probabilities, an f32 copy of a bf16
    tensor, an activation of an input it reads anyway) rather than the
    forward saving it (_partition.py), with either split. Not the default:
    on the H100 (2026-12-07) GPT and TransformerEncoder trained 4% slower
    with it and Llama's rewritten graph was refused by the split (split as
    it came since).  options={"recycle": True} writes each of a segment's
    outputs into one of an earlier call that nothing holds any more, so that
    its program's operands come back at the same addresses and its
    captured graph replays (not measured yet: off by default).  mode is
    Inductor's and means nothing here."""
    from torch._dynamo.backends.common import aot_autograd
    from torch._functorch import partitioners
    options = dict(options or {})
    partition = options.pop("partition", "default")
    recompute, recycle = _flag(options, "recompute"), _flag(options, "recycle")
    if partition == "min_cut":
        split = partitioners.min_cut_rematerialization_partition
    elif partition == "default":
        split = partitioners.default_partition
    else:
        raise ValueError(f'regen backend: options["partition"] is "default" or "min_cut", not {partition!r}')
    if options:
        raise ValueError(f"regen backend: unknown options {sorted(options)}; "
                         "it takes \"partition\", \"recompute\" and \"recycle\"")
    return aot_autograd(fw_compiler=_compiler("forward", recycle), bw_compiler=_compiler("backward", recycle),
                        inference_compiler=_compiler("inference", recycle),
                        partition_fn=with_recompute(split) if recompute else split,
                        keep_inference_input_mutations=True)(gm, example_inputs)


def compiled_graphs():
    with _lock:
        alive = [g() for g in _graphs]
        _graphs[:] = [weakref.ref(g) for g in alive if g is not None]
        return [g for g in alive if g is not None]


def explain(show=True):
    """What torch.compile(..., backend="regen") made of the graphs compiled
    so far: per graph, the segments regend runs, the ops that stayed on the
    rank and why, and the hand-offs a call costs.  Returns the reports (a
    list of dicts); prints them too unless show=False."""
    reports = [g.report() for g in compiled_graphs()]
    if show:
        for i, r in enumerate(reports):
            print(f"graph {i} ({r['kind']}, {r['calls']} calls): {len(r['segments'])} program segment(s), "
                  f"{len(r['rank'])} op(s) on the rank, {r['handoffs']} hand-off(s) per call")
            if r.get("relaid"):
                print(f"  {r['relaid']} segment run(s) on the rank: inputs arrived laid out otherwise than traced")
            if r["eager"]:
                print(f"  all on the rank: {r['eager']}")
            for s in r["segments"]:
                extra = ", updates inputs in place (journal)" if s.get("updates") else ""
                extra += f" REFUSED: {s['refused']}" if "refused" in s else ""
                print(f"  segment {s['index']}: {s['ops']} ops -> {s['program_nodes']} program nodes, "
                      f"{s['bound']} bound{extra}")
            for x in r["rank"]:
                print(f"  rank: {x['op']}: {x['why']}")
    return reports


def register():
    """Registers "regen" with torch._dynamo (once).  regen.torch calls it
    when torch._dynamo is imported (regen.torch._on_import), not at its own
    import; an installed wheel's entry point (group torch_dynamo_backends)
    names the backend too, which torch loads on lookup: a name torch found
    there (an EntryPoint in _BACKENDS) is left to it."""
    try:
        from torch._dynamo.backends import registry
    except ImportError:   # pragma: no cover - a torch without dynamo
        return False
    if "regen" not in registry._BACKENDS and "regen" not in getattr(registry, "_COMPILER_FNS", {}):
        registry.register_backend(compiler_fn=backend, name="regen")
    return True
