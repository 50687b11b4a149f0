# SPDX-License-Identifier: Apache-2.0
"""Keep a model and its optimizer in regend (io.regen.Keep), so that a rank
whose process dies resumes from them in seconds instead of from a checkpoint.

    import regen.torch as rt
    rt.use_pool_for_process()                  # tensors in memory regend can keep
    model, opt = build()                       # freshly built, on CUDA
    key = (os.environ["SLURM_JOB_ID"], rank)
    start = rt.restore(model, opt, key=key) or 0   # None: nothing kept
    kept = rt.keep(model, opt, key=key) if start else None
    for step in range(start + 1, steps + 1):
        ...; opt.step(); opt.zero_grad()
        if kept is None:
            kept = rt.keep(model, opt, key=key)   # once the optimizer has its state
        kept.commit(step)

keep() hands regend the pool chunks that hold the parameters, buffers and
optimizer state (whole chunks: the tensors must come from libregen's pool,
rt.use_pool_for_process() or rt.pool()), and an index of where each tensor
is.  restore() takes them back, maps them at new addresses and makes the
parameters, buffers and state views of them: no copy.  commit() marks a
completed step (after synchronising the device), with the optimizer's CPU
scalars (Adam's step).

A kill at any instant resumes from a complete step, the last committed:

- torch's own optimizer (snapshot=True): each commit starts a copy of the
  optimizer's parameters and state into a twin of them, on a side stream,
  beside the next step's forward and backward; opt.step() waits for it and
  marks the kept memory as being updated.  A rank killed inside opt.step()
  (or after it, before its commit) is put back from the twin.  Costs the
  twin's memory and one copy a step that the forward hides;
- regen.torch.optim.AdamW: its program's journal holds the parameters and
  moments before its Run; the journal's header says which Run the memory
  holds, and a Run past the last commit is put back from it.  No twin.
  With AdamW(journal="marks") the journal holds the header alone: a Run
  past the commit that completed (DONE) is resumed from, the step after
  the commit (rolled forward, never put back), and one that began and did
  not complete (BEGUN: regend's worker faulted inside it too) is Torn;
- the buffers (a BatchNorm's statistics, written by the forward): a copy
  at each commit, in stream order before the next forward.

Three marks in kept memory say where the state stands: the step the twin
holds whole, the step the buffers' copy holds, and the step whose update
began (written on the stream before the optimizer's kernels).
"""

import ctypes
import json
import mmap
import os
import struct
import threading

from typing import Any, Dict, Optional, Tuple

import torch

from .. import errors
from ..client import Client
from ._runtime import Torn

__all__ = ["keep", "restore", "Kept"]

_INDEX = "index"
# The index memfd: two JSON records, each in two halves written in turn
# (so a kill mid-write leaves the other whole), each half led by its
# length; which half is live is the u64 at the record's selector.  The
# layout (chunks, tensors, twins) is written by keep(); the commit record
# (step, the optimizer's CPU values, the journal's Run) by every commit,
# small.  Memory is taken only where written.
_LAYOUT_SELECT, _COMMIT_SELECT = 0, 8
_COMMIT_AT, _COMMIT_HALF = 4096, 1 << 20
_LAYOUT_AT, _LAYOUT_HALF = _COMMIT_AT + 2 * _COMMIT_HALF, 32 << 20
_INDEX_BYTES = _LAYOUT_AT + 2 * _LAYOUT_HALF
_VERSION = 2
# The marks: the step the twin holds whole, the step the buffers' copy
# holds, the step whose update began; -1 none.
_MARK_TWIN, _MARK_BUFFERS, _MARK_DIRTY = 0, 1, 2
# Chunks taken back in this process: their pool serial -> their kept name,
# so that keeping them again keeps them under the same names.
_adopted: Dict[int, str] = {}
# What restore() made of a key's kept memory, for the keep() that follows
# it: its twins, marks and journal, and the step.
_restored: Dict[Any, Any] = {}
# What the last restore() of a key put back: "twin", "journal" or None; or
# "rolled_forward": nothing, the step after the commit resumed from.
_put_backs: Dict[Any, Optional[str]] = {}
# Where the last restore() of a key spent its time (last_restore_phases).
_phases: Dict[Any, Dict[str, float]] = {}


def _split(key):
    job, rank = key
    return (None if job is None else str(job)), int(rank)


def _runtime():
    from . import runtime
    rt = runtime()
    if rt.pool is None or not rt.pool.keep_available():
        raise errors.Error(parameters={"message": "regen.torch.keep needs libregen with kept state "
                                                  "(set REGEN_LIBREGEN to libregen.so.0)"})
    return rt


def _optimizer_state(optimizer):
    """(entry, parameter, key, value) of the optimizer's state, entry
    "i.key" by the position of the parameter in param_groups, which a
    freshly built optimizer repeats."""
    if optimizer is None:
        return
    params = [p for g in optimizer.param_groups for p in g["params"]]
    for i, p in enumerate(params):
        for k, v in optimizer.state.get(p, {}).items():
            yield f"{i}.{k}", p, k, v


class _Values:
    """The optimizer's state that is not kept as memory (Adam's step, a
    CPU scalar unless capturable): its values, which each commit writes
    into the index.  Which entries those are, and their tensors, are found
    again only when the optimizer's state changed (a new parameter, a
    state replaced, load_state_dict()): a commit a step must not walk
    every parameter's state in Python, and the scalar tensors of a dtype
    are read in one stack."""

    def __init__(self, memory):
        self._memory = memory
        self._params = None    # param_groups' parameters, and the state's entries, when found
        self._entries = 0
        self._tensors = []     # (param, key, tensor, entry)
        self._others = []      # (param, key, entry): values that are not tensors, read each time

    def _found(self, optimizer):
        self._tensors, self._others = [], []
        for entry, p, k, v in _optimizer_state(optimizer):
            if f"state:{entry}" in self._memory:
                continue
            if torch.is_tensor(v):
                self._tensors.append((p, k, v, entry))
            else:
                self._others.append((p, k, entry))

    def _same(self, state):
        for p, k, v, _ in self._tensors:
            st = state.get(p)
            if st is None or st.get(k) is not v:
                return False
        return True

    def __call__(self, optimizer):
        if optimizer is None:
            return {}
        params = [p for g in optimizer.param_groups for p in g["params"]]
        state = optimizer.state
        entries = sum(len(st) for st in state.values())
        if entries != self._entries or not _same_objects(self._params, params) or not self._same(state):
            self._found(optimizer)
            self._params, self._entries = params, entries
        out = {}
        scalars = {}
        for _, _, v, entry in self._tensors:
            if v.dim() == 0 and v.device.type == "cpu":
                scalars.setdefault(v.dtype, []).append((entry, v))
            else:
                out[entry] = {"value": v.tolist(), "dtype": str(v.dtype)[len("torch."):]}
        for dtype, items in scalars.items():
            name = str(dtype)[len("torch."):]
            values = torch.stack([v for _, v in items]).tolist()
            for (entry, _), value in zip(items, values):
                out[entry] = {"value": value, "dtype": name}
        for p, k, entry in self._others:
            out[entry] = {"value": state[p][k]}
        return out


def _journaled(optimizer):
    """Whether the optimizer's step is a program Run with a journal whose
    Runs it numbers (regen.torch.optim.AdamW)."""
    return optimizer is not None and hasattr(optimizer, "journal_seq") and hasattr(optimizer, "journal_layout")


# ---- The index ----

def _read_record(m, select, at, half):
    (live,) = struct.unpack_from("<Q", m, select)
    start = at + (live & 1) * half
    (length,) = struct.unpack_from("<Q", m, start)
    if length > half - 8:
        raise errors.Error(parameters={"message": "the kept index is damaged (a record longer than its half)"})
    return json.loads(bytes(m[start + 8:start + 8 + length]))


def _write_record(m, select, at, half, record):
    data = json.dumps(record, separators=(",", ":")).encode()
    if len(data) + 8 > half:
        raise ValueError(f"the index of kept tensors takes {len(data)} bytes, more than {half - 8}")
    (live,) = struct.unpack_from("<Q", m, select)
    other = (live + 1) & 1
    start = at + other * half
    m[start + 8:start + 8 + len(data)] = data
    struct.pack_into("<Q", m, start, len(data))
    # The switch last: until it is written the live half is the old one.
    struct.pack_into("<Q", m, select, other)


def _new_index():
    fd = os.memfd_create("regen-kept-index", os.MFD_CLOEXEC | os.MFD_ALLOW_SEALING)
    os.ftruncate(fd, _INDEX_BYTES)
    return fd


# ---- Memory ----

def _empty_like(t):
    """A twin of t in memory keep() can hand regend: libregen's pool (on
    CUDA under rt.use_pool_for_process() or rt.pool(); the host pool on
    the CPU)."""
    if t.device.type == "cpu":
        from ._runtime import host_empty
        return host_empty(list(t.shape), t.dtype)
    return torch.empty(t.shape, dtype=t.dtype, device=t.device)


def _marks_on(device):
    if device.type == "cpu":
        from ._runtime import host_empty
        m = host_empty([4], torch.int64)
    else:
        m = torch.empty(4, dtype=torch.int64, device=device)
    return m.fill_(-1)


def _copy_all(dst, src):
    """dst[i].copy_(src[i]) for each, in as few launches as torch has."""
    if not dst:
        return
    foreach_copy = getattr(torch, "_foreach_copy_", None)
    if foreach_copy is not None and all(d.device.type == "cuda" for d in dst):
        foreach_copy(dst, src)
        return
    for d, s in zip(dst, src):
        d.copy_(s)


class _Committer:
    """The one thread that writes a Kept's asynchronous commits, one at a
    time, started at the first: a thread started a step would cost the
    rank its start (the new thread's first run, taken with the GIL) every
    step."""

    def __init__(self) -> None:
        self._cond = threading.Condition()
        self._job: Optional[Tuple[Any, tuple]] = None
        self._thread: Optional[threading.Thread] = None
        self._stopping = False

    def submit(self, fn: Any, *args: Any) -> None:
        """fn(*args) on the thread; the last submitted must be done (wait())."""
        with self._cond:
            self._job = (fn, args)
            if self._thread is None:
                self._thread = threading.Thread(target=self._run, name="regen-keep-commit", daemon=True)
                self._thread.start()
            self._cond.notify_all()

    def wait(self) -> None:
        with self._cond:
            while self._job is not None:
                self._cond.wait()

    def stop(self) -> None:
        """The thread ends, what was submitted done first."""
        with self._cond:
            self._stopping = True
            self._cond.notify_all()
            thread, self._thread = self._thread, None
        if thread is not None:
            thread.join()

    def _run(self) -> None:
        while True:
            with self._cond:
                while self._job is None and not self._stopping:
                    self._cond.wait()
                if self._job is None:
                    return
                fn, args = self._job
            fn(*args)
            del fn, args           # nothing of the commit held between steps
            with self._cond:
                self._job = None
                self._cond.notify_all()


class Kept:
    """What keep() kept: commit() marks each completed step."""

    def __init__(self, rt: Any, job: Optional[str], rank: int, model: torch.nn.Module,
                 optimizer: Any, index_fd: int, layout: Any, live: Any, step: Optional[int],
                 views: Any, journal: Any, async_commit: bool = False) -> None:
        self._rt, self.job, self.rank = rt, job, rank
        self._committer = _Committer()                      # writes the commits (async_commit)
        self._commit_client: Optional[Client] = None        # the committer's connection
        self._commit_error: Optional[BaseException] = None
        self._optimizer = optimizer
        self._index = mmap.mmap(index_fd, _INDEX_BYTES)
        os.close(index_fd)
        self._layout = layout
        self._values = _Values(layout["tensors"])
        self.mode = layout["mode"]
        self.step = step
        self._live = live                  # entry -> the live tensor
        self._views = views                # entry -> twin, marks, journal
        self._marks = views["mark:"]
        self._device = self._marks.device
        self._twin = [(views[t], live[e]) for e, t in layout["twins"].items()]
        self._buffer_twins = [(views[t], live[e]) for e, t in layout["buffer_twins"].items()]
        # A commit the device has not reached yet may be written late only
        # where nothing is copied at it: a twin or a buffer's copy of step N
        # done before the index says N would be taken for a later step's.
        self._async_commit = async_commit and self.mode == "journal" and not self._buffer_twins
        self._side = None
        if self._device.type == "cuda" and self._twin:
            self._side = torch.cuda.Stream(self._device)
        self._hook = None
        if optimizer is not None and self.mode in ("twin", "none"):
            self._hook = _install_step_hook(optimizer, self)
        self._journal_seq, self._journal_entries = journal
        self._journal_signature = None     # what _journal_entries was last made of
        if self.mode == "journal":
            optimizer.before_run[:] = [f for f in optimizer.before_run if not getattr(f, "_regen_kept", False)]
            optimizer.before_run.append(self._before_run)

    def _before_run(self, optimizer):
        """regen's AdamW is about to Run: where it saves what (a copy
        journal) and which of its values the Run advances (a marks journal),
        if that changed (another program, other parameters with gradients),
        goes into the index first, so that a restore puts that Run back, or
        resumes after it, right."""
        self.wait_committed()
        signature = _journal_signature(optimizer)
        if _same_signature(self._journal_signature, signature):
            return
        self._journal_signature = signature
        entries = _journal_entries(optimizer, self._live)
        if entries != self._journal_entries:
            self._journal_entries = entries
            self._write_commit(self._record(self.step))

    _before_run._regen_kept = True  # type: ignore[attr-defined]

    def _record(self, step):
        return _commit_record(self._optimizer, self._layout, self._views, step, self._journal_seq,
                              self._journal_entries, self._values)

    def _write_commit(self, record):
        _write_record(self._index, _COMMIT_SELECT, _COMMIT_AT, _COMMIT_HALF, record)

    def _stream(self):
        return torch.cuda.current_stream(self._device) if self._device.type == "cuda" else None

    def _before_step(self):
        """opt.step() is about to write: the twin of the last commit must be
        whole first, and the marks say an update began."""
        self.wait_committed()
        if self.step is None:
            return
        main = self._stream()
        if main is not None and self._side is not None:
            main.wait_stream(self._side)
        self._marks[_MARK_DIRTY:_MARK_DIRTY + 1].fill_(self.step + 1)

    def _snapshot(self):
        """Copies of the committed state: the buffers on the rank's stream
        (before its next forward writes them), the twin on a side stream
        beside the next forward and backward (opt.step() waits for it)."""
        step = self.step
        if self._buffer_twins:
            _copy_all([d for d, _ in self._buffer_twins], [s for _, s in self._buffer_twins])
            self._marks[_MARK_BUFFERS:_MARK_BUFFERS + 1].fill_(step)
        if not self._twin:
            return
        if self._side is None:
            _copy_all([d for d, _ in self._twin], [s for _, s in self._twin])
            self._marks[_MARK_TWIN:_MARK_TWIN + 1].fill_(step)
            return
        self._side.wait_stream(self._stream())
        with torch.cuda.stream(self._side):
            _copy_all([d for d, _ in self._twin], [s for _, s in self._twin])
            self._marks[_MARK_TWIN:_MARK_TWIN + 1].fill_(step)

    def commit(self, step: int) -> None:
        """Step `step` is done: once the device finished it, the optimizer's
        values go into the index with the step (what restore() returns),
        regend records the step (Status, regenctl kept), and the copies of
        this step's state start (the twin, the buffers).  With
        keep(async_commit=True) the rank does not wait for the device: the
        values are taken now and written, and regend told, by a thread
        once the device reached this point of the rank's stream; the next
        opt.step() (its Run, for regen's AdamW) waits for that write first,
        so the memory is never more than one update past the index (what
        restore() puts back or rolls forward)."""
        self.wait_committed()
        if self.mode == "journal":
            self._journal_seq = self._optimizer.journal_seq
        step = int(step)
        record = self._record(step)
        if self._async_commit:
            done = None
            if self._device.type == "cuda":
                done = torch.cuda.Event()
                done.record(torch.cuda.current_stream(self._device))
            self._committer.submit(self._publish_when_done, done, record, step)
        else:
            if self._device.type == "cuda":
                torch.cuda.synchronize(self._device)
            self._publish(record, step)
        self.step = step
        self._snapshot()

    def _publish(self, record, step, client=None):
        """The commit of step written into the index, and regend told (on
        `client`, else the runtime's connection)."""
        self._write_commit(record)
        if client is not None:
            client.commit(self.rank, step, job=self.job)
            return
        with self._rt.lock:
            self._rt.client.commit(self.rank, step, job=self.job)

    def _publish_when_done(self, done, record, step):
        try:
            if done is not None:
                done.synchronize()
            # A connection of the commits' own: on the runtime's, under its
            # lock, each round trip would hold back the rank's next call.
            if self._commit_client is None:
                self._commit_client = Client(self._rt.socket, timeout=self._rt.timeout)
            self._publish(record, step, self._commit_client)
        except BaseException as e:   # the rank's next wait_committed() raises it
            self._commit_error = e

    def wait_committed(self) -> None:
        """Returns once the last commit() is written (at once, but with
        keep(async_commit=True)); raises what writing it raised."""
        self._committer.wait()
        if self._commit_error is not None:
            e, self._commit_error = self._commit_error, None
            raise e

    def close(self) -> None:
        """Stops marking opt.step() (the memory stays kept), the last
        commit written first."""
        self.wait_committed()
        self._committer.stop()
        if self._commit_client is not None:
            self._commit_client.close()
            self._commit_client = None
        if self._hook is not None:
            self._hook.remove()
            self._hook = None


def _journal_signature(optimizer):
    """What _journal_entries() is made of: the same (_same_signature), its
    entries are too (the kept tensors do not move).  The objects
    themselves, held, so that none is freed and its id taken by another."""
    return (getattr(optimizer, "journal_mode", "copy"),
            tuple(p for g in optimizer.param_groups for p in g["params"]),
            tuple((t.data_ptr(), offset, nbytes) for t, offset, nbytes in optimizer.journal_layout),
            tuple(getattr(optimizer, "journal_advances", ())))


def _same_objects(a, b):
    """Two sequences of the same objects (`is`: == on tensors compares
    their elements)."""
    return a is not None and len(a) == len(b) and all(x is y for x, y in zip(a, b))


def _same_signature(a, b):
    return (a is not None and a[0] == b[0] and _same_objects(a[1], b[1]) and a[2] == b[2] and
            len(a[3]) == len(b[3]) and all(p is q and k == l for (p, k), (q, l) in zip(a[3], b[3])))


def _journal_entries(optimizer, live):
    """What the optimizer's Run to come does to what is kept: its journal's
    mode, where it saves each kept tensor in its journal ([[entry, offset,
    bytes]]; none with marks only), and which of the optimizer's values
    ("i.key") it advances by one."""
    by_ptr = {t.data_ptr(): e for e, t in live.items()}
    saves = []
    for t, offset, nbytes in optimizer.journal_layout:
        entry = by_ptr.get(t.data_ptr())
        if entry is None:
            raise errors.Error(parameters={
                "message": "regen.torch.keep: the optimizer updates a tensor that is not kept: keep() again"})
        saves.append([entry, offset, nbytes])
    position = {id(p): i for i, p in enumerate(p for g in optimizer.param_groups for p in g["params"])}
    advances = [f"{position[id(p)]}.{k}" for p, k in getattr(optimizer, "journal_advances", ())]
    return {"mode": getattr(optimizer, "journal_mode", "copy"), "saves": saves, "advances": advances}


def _commit_record(optimizer, layout, views, step, journal_seq, journal_entries, values=None):
    """What a commit writes: the step, the optimizer's CPU values, and for
    a journal the Run the memory holds and what the Run after it does
    (_journal_entries: so that a restore puts that Run back, or resumes
    after it)."""
    values = values if values is not None else _Values(layout["tensors"])
    record = {"step": step, "values": values(optimizer)}
    if layout["mode"] == "journal":
        journal = views["journal:"]
        if optimizer._journal is None or optimizer._journal.data_ptr() != journal.data_ptr():
            raise errors.Error(parameters={
                "message": "regen.torch.keep: the optimizer's journal moved (its program changed): keep() again "
                           "after this step"})
        record["journal_seq"] = journal_seq
        record["journal_layout"] = journal_entries["saves"]
        record["journal_mode"] = journal_entries["mode"]
        record["journal_advances"] = journal_entries["advances"]
    return record


def _journal_run(commit):
    """What the commit record says the Run after it does (_journal_entries'
    form; an index written before marks journals says copies)."""
    return {"mode": commit.get("journal_mode", "copy"), "saves": commit.get("journal_layout", []),
            "advances": commit.get("journal_advances", [])}


class _Hook:
    def __init__(self, remove):
        self.remove = remove


def _install_step_hook(optimizer, kept):
    """kept._before_step() before every opt.step(): torch's step pre-hook
    where there is one (torch 2), else the instance's step wrapped. One per
    optimizer: a later keep() takes it over."""
    optimizer._regen_kept = kept
    if getattr(optimizer, "_regen_kept_hooked", False):
        return _Hook(lambda: setattr(optimizer, "_regen_kept", None))

    def pre(*_):
        k = getattr(optimizer, "_regen_kept", None)
        if k is not None:
            k._before_step()

    if hasattr(optimizer, "register_step_pre_hook"):
        optimizer.register_step_pre_hook(pre)
    else:
        step = optimizer.step

        def stepping(*args, **kwargs):
            pre()
            return step(*args, **kwargs)
        optimizer.step = stepping
    optimizer._regen_kept_hooked = True
    return _Hook(lambda: setattr(optimizer, "_regen_kept", None))


def _candidates(model, optimizer):
    """(entry, tensor) of what is kept: parameters, buffers, the
    optimizer's tensor state on a device or in the pool."""
    out = [(f"param:{n}", p) for n, p in model.named_parameters()]
    out += [(f"buffer:{n}", b) for n, b in model.named_buffers() if b is not None]
    out += [(f"state:{e}", v) for e, _, _, v in _optimizer_state(optimizer) if torch.is_tensor(v)]
    return out


def keep(model: torch.nn.Module, optimizer: Any = None,
         key: Optional[Tuple[Optional[str], int]] = None, lease_ms: Optional[int] = None,
         snapshot: bool = True, async_commit: bool = False) -> Kept:
    """Has regend keep the model's parameters and buffers and the
    optimizer's state under ``key`` = (job, rank) (job None: the job that
    names the rank's connection).  Call it once the optimizer has its state
    (after a first step, or after restore()).  ``snapshot``: True (the
    default) makes a kill at any instant resume from the last commit
    (regen.torch.optim.AdamW through its journal, torch's optimizers
    through a twin of their parameters and state); False keeps no twin, and
    restore() of a rank killed inside opt.step() raises Torn.
    ``async_commit``: commit() does not wait for the device (Kept.commit),
    where the optimizer journals its Run (regen.torch.optim.AdamW) and the
    model has no buffers; elsewhere it waits as by default.  Not yet the
    default (not yet run on a GPU).  Returns a Kept."""
    rt = _runtime()
    job, rank = _split(key)
    prev = _restored.pop((job, rank), None)
    mode = "none" if not snapshot else "journal" if _journaled(optimizer) else "twin"
    live = {}
    for entry, t in _candidates(model, optimizer):
        if entry.startswith("state:") and t.device.type == "cpu" and rt.pool.chunk_of(t.data_ptr()) is None:
            continue   # a value, in the index
        live[entry] = t
    device = next((t.device for t in live.values()), torch.device("cpu"))
    # The twins: of what opt.step() writes (the optimizer's parameters and
    # state) where the optimizer has no journal, and of the buffers always.
    opt_params = {id(p) for g in optimizer.param_groups for p in g["params"]} if optimizer is not None else set()
    named = dict(model.named_parameters())
    twin_of = [e for e, t in live.items()
               if mode == "twin" and (e.startswith("state:") or (e.startswith("param:") and
                                                                 id(named[e[len("param:"):]]) in opt_params))]
    buffer_of = [e for e in live if e.startswith("buffer:")]
    views = {}
    old = prev["views"] if prev else {}
    for prefix, wanted in (("twin:", twin_of), ("buffer_twin:", buffer_of)):
        for e in wanted:
            t, name = live[e], prefix + e
            o = old.get(name)
            views[name] = o if o is not None and o.shape == t.shape and o.dtype == t.dtype and \
                o.device == t.device else _empty_like(t)
    views["mark:"] = old.get("mark:") if old.get("mark:") is not None else _marks_on(device)
    if mode == "journal":
        if optimizer._journal is None:
            raise errors.Error(parameters={"message": "regen.torch.keep: keep() a regen.torch.optim.AdamW after its "
                                                      "first step (its journal is made there)"})
        views["journal:"] = optimizer._journal
    entries, chunks = {}, {}
    for entry, t in list(live.items()) + list(views.items()):
        where = rt.pool.chunk_of(t.data_ptr()) if t.numel() else None
        if where is None:
            raise errors.Error(parameters={
                "message": f"{entry} is not in libregen's pool: build the model under regen.torch.pool() "
                           "or after regen.torch.use_pool_for_process()"})
        chunk = _adopted.get(where["chunk"])
        if chunk is None:
            chunk = f"chunk-{where['chunk']}"
            if chunk not in chunks:
                rt.pool.keep(t.data_ptr(), rank, chunk, job=job, lease_ms=lease_ms or 0)
        # A chunk taken back is kept already, under its name, and held by
        # this process since: no second Keep (and no second check of it by
        # regend's worker) on the way to a resumed step.
        if chunk not in chunks:
            chunks[chunk] = {"kind": where["kind"], "bytes": where["bytes"], "device": where["device"]}
        entries[entry] = {"chunk": chunk, "offset": where["offset"], "dtype": str(t.dtype)[len("torch."):],
                          "shape": list(t.shape), "stride": list(t.stride())}
    layout = {"version": _VERSION, "mode": mode, "chunks": chunks, "tensors": entries,
              "twins": {e: "twin:" + e for e in twin_of}, "buffer_twins": {e: "buffer_twin:" + e for e in buffer_of}}
    step = prev["step"] if prev else None
    journal = (None, None)
    if mode == "journal":
        # After a restore the optimizer has made no Run yet: the Run to
        # come is laid out as the one before the kill.
        journal = (prev["journal_seq"], prev["journal_run"]) if prev else \
            (optimizer.journal_seq, _journal_entries(optimizer, live))
    fd = _new_index()
    with mmap.mmap(fd, _INDEX_BYTES) as m:
        _write_record(m, _LAYOUT_SELECT, _LAYOUT_AT, _LAYOUT_HALF, layout)
        _write_record(m, _COMMIT_SELECT, _COMMIT_AT, _COMMIT_HALF,
                      _commit_record(optimizer, layout, views, step, *journal))
    with rt.lock:
        job = rt.client.keep(rank, _INDEX, fd, job=job, lease_ms=lease_ms)["job"]
        # Names an earlier keep() made that this one no longer needs.
        for k in rt.client.kept(job=job, uid=os.getuid()):
            if k["rank"] == rank and k["name"] != _INDEX and k["name"] not in chunks:
                rt.client.drop(job, rank, k["name"])
    kept = Kept(rt, job, rank, model, optimizer, fd, layout, live, step, views, journal, async_commit)
    if prev and prev.get("rolled_forward"):
        # The step restore() resumed from is past regend's last commit.
        with rt.lock:
            rt.client.commit(rank, step, job=job)
    if step is not None:
        # The copies of the step restore() came back at, which its kill
        # may have left behind.
        kept._snapshot()
    return kept


def _chunk_tensor(base, nbytes, device):
    """A uint8 tensor over kept memory, no copy."""
    if device < 0:
        return torch.frombuffer((ctypes.c_uint8 * nbytes).from_address(base), dtype=torch.uint8)

    class _Memory:
        __cuda_array_interface__ = {"shape": (nbytes,), "typestr": "|u1", "data": (base, False), "version": 3}
    return torch.as_tensor(_Memory(), device=f"cuda:{device}")


def _journal_state(journal):
    from ..keep import JOURNAL_HEADER_BYTES, journal_header
    return journal_header(bytes(journal[:JOURNAL_HEADER_BYTES].cpu().tolist()))


def _roll_forward(commit):
    """The commit record of the step after `commit`, whose Run (a marks
    journal's) completed: the step and the journal's Run one further, the
    optimizer's values that Run advances one more."""
    run = _journal_run(commit)
    for entry in run["advances"]:
        v = commit["values"].get(entry)
        if v is None or isinstance(v["value"], (list, bool)) or not isinstance(v["value"], (int, float)):
            raise errors.Error(parameters={
                "message": f"regen.torch.restore: the optimizer's value {entry} is no number the Run advances by "
                           "one; the kept index is of another optimizer"})
        v["value"] += 1
    commit["step"] += 1
    commit["journal_seq"] = commit.get("journal_seq", 0) + 1


def _put_back(layout, commit, memory, views, marks):
    """Makes the kept memory hold a complete step whatever instant the rank
    died at: the committed one, put back, or (a marks journal's Run past it
    completed) the step after it, which `commit` then describes (rolled
    forward in place). Returns what was done ("twin", "journal",
    "rolled_forward", or None)."""
    step = commit["step"]
    done = None
    mode = layout["mode"]
    if mode in ("twin", "none") and marks[_MARK_DIRTY] > step:
        if mode == "none" or marks[_MARK_TWIN] != step:
            raise Torn(parameters={
                "message": f"the rank died inside opt.step() of step {step + 1}: its kept memory holds no complete "
                           "step (keep(..., snapshot=True) keeps a twin to put it back from); load a checkpoint"})
        for entry, twin in layout["twins"].items():
            views[entry].copy_(views[twin])
        done = "twin"
    if mode == "journal":
        journal = views["journal:"]
        state, seq = _journal_state(journal)
        committed = commit.get("journal_seq", 0)
        marks_only = _journal_run(commit)["mode"] == "marks"
        if marks_only and seq == committed + 1 and state == "done":
            # The Run after the commit completed, whole (a rank dies only
            # between Runs or with one regend finishes): the memory holds
            # the step after the commit, which there is no copy to put
            # back from; resume from it.
            _roll_forward(commit)
            done = "rolled_forward"
        elif seq == committed + 1 and state == "begun":
            # Only a fault of regend's worker stops a Run between its
            # marks (the rank's death does not): its retry was refused too.
            raise Torn(parameters={
                "message": f"the optimizer's Run of step {step + 1} began and did not complete: a fault of regend's "
                           "cut it, and its journal holds marks only (AdamW(journal=\"marks\")), so its parameters "
                           "and moments may hold part of the update; load a checkpoint"})
        elif state in ("saved", "done") and seq == committed + 1:
            # A Run past the commit (applied, or cut by a fault): its
            # inouts as they were before it, from the journal.
            for entry, offset, nbytes in commit.get("journal_layout", []):
                spec = layout["tensors"][entry]
                dst = memory[spec["chunk"]][spec["offset"]:spec["offset"] + nbytes]
                dst.copy_(journal[offset:offset + nbytes])
            done = "journal"
        elif state != "empty" and seq != committed:
            raise Torn(parameters={
                "message": f"the optimizer's journal holds Run {seq}, the last commit Run {committed}: more than one "
                           "step past it, which the journal cannot put back (commit after every opt.step())"})
    # The buffers as the committed step left them; rolled forward, as the
    # rank left them: the step's forward wrote them before its Run.
    if marks[_MARK_BUFFERS] == step and done != "rolled_forward":
        for entry, twin in layout["buffer_twins"].items():
            views[entry].copy_(views[twin])
    # Whole again: a kill from here on finds no update begun (one before
    # this line puts back again, from the same twin or journal).
    views["mark:"][_MARK_DIRTY:_MARK_DIRTY + 1].fill_(commit["step"])
    if views["mark:"].device.type == "cuda":
        torch.cuda.synchronize(views["mark:"].device)
    return done


def _bind_parameters(model, optimizer, views):
    """Each parameter becomes a view of kept memory: its .data, or, for a
    model built on the meta device (which allocates nothing: the rank needs
    no second copy of what comes back), a new Parameter in its place in
    every module that holds it and in the optimizer's param_groups."""
    swaps = {}
    for name, p in model.named_parameters():
        view = views[f"param:{name}"]
        if p.device.type != "meta":
            p.data = view
        else:
            swaps[id(p)] = torch.nn.Parameter(view, requires_grad=p.requires_grad)
    if not swaps:
        return
    for module in model.modules():
        for attr, p in list(module._parameters.items()):
            if p is not None and id(p) in swaps:
                module._parameters[attr] = swaps[id(p)]
    if optimizer is not None:
        for group in optimizer.param_groups:
            group["params"] = [swaps.get(id(p), p) for p in group["params"]]


def _take_back(rt, rank, name, job):
    """TakeBack, waiting while regend cannot hand the memory yet: a CUDA
    name kept across regend's own restart is checked by its device's worker
    first, which is Draining until the device serves (at most the runtime's
    recovery_timeout)."""
    import time
    deadline = time.monotonic() + rt.recovery_timeout
    while True:
        try:
            with rt.lock:
                return rt.client.take_back(rank, name, job=job)
        except errors.Draining:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.05)


def restore(model: torch.nn.Module, optimizer: Any = None,
            key: Optional[Tuple[Optional[str], int]] = None) -> Optional[int]:
    """Takes back what keep() kept under ``key`` into a freshly built model
    and optimizer (built on the meta device, it allocates nothing; or
    anywhere): parameters, buffers and optimizer state become views of
    the kept memory at its new addresses (no copy), holding the last
    committed step whatever instant the rank died at (put back from the
    twin or the journal where it died inside a step), or, with
    regen.torch.optim.AdamW(journal="marks") whose Run after the commit
    completed before the rank died, the step after it (rolled forward:
    last_put_back() says "rolled_forward").  Returns that step, or None
    when nothing is kept or nothing was committed since keep() (the model
    is left as it was).  Raises Torn when the memory holds no complete step
    (keep(snapshot=False) and a kill inside opt.step(); a marks journal's
    Run that began and did not complete, which only a fault of regend's
    inside it leaves)."""
    import time
    clock = [time.perf_counter()]
    phases = {"index": 0.0, "take_back": 0.0, "adopt": 0.0, "put_back": 0.0, "bind": 0.0}

    def lap(phase):
        now = time.perf_counter()
        phases[phase] += now - clock[0]
        clock[0] = now

    rt = _runtime()
    job, rank = _split(key)
    _phases[(job, rank)] = phases
    try:
        kept, fd = _take_back(rt, rank, _INDEX, job)
    except errors.NoSuchObject:
        return None
    with mmap.mmap(fd, kept["size"]) as m:
        if kept["size"] != _INDEX_BYTES:
            raise errors.Error(parameters={"message": f"the kept index of {key} is of another layout "
                                                      f"({kept['size']} bytes): drop it (regenctl drop)"})
        layout = _read_record(m, _LAYOUT_SELECT, _LAYOUT_AT, _LAYOUT_HALF)
        commit = _read_record(m, _COMMIT_SELECT, _COMMIT_AT, _COMMIT_HALF)
    os.close(fd)
    if layout.get("version") != _VERSION:
        raise errors.Error(parameters={"message": f"the kept index of {key} is version {layout.get('version')}, not "
                                                  f"{_VERSION}: drop it (regenctl drop)"})
    lap("index")
    if commit["step"] is None:
        return None
    memory = {}
    for name, c in layout["chunks"].items():
        k, cfd = _take_back(rt, rank, name, job)
        lap("take_back")
        addr = rt.pool.adopt(cfd, k["kind"], k["size"], c["device"])
        lap("adopt")
        _adopted[rt.pool.chunk_of(addr)["chunk"]] = name
        memory[name] = _chunk_tensor(addr, k["size"], c["device"])

    def view(spec):
        flat = memory[spec["chunk"]][spec["offset"]:].view(getattr(torch, spec["dtype"]))
        return flat.as_strided(spec["shape"], spec["stride"])

    views = {entry: view(spec) for entry, spec in layout["tensors"].items()}
    marks = views["mark:"].tolist()
    put_back = _put_back(layout, commit, memory, views, marks)
    lap("put_back")
    _bind_parameters(model, optimizer, views)
    for name, b in model.named_buffers():
        module_name, _, attr = name.rpartition(".")
        model.get_submodule(module_name)._buffers[attr] = views[f"buffer:{name}"]
    if optimizer is not None:
        params = [p for g in optimizer.param_groups for p in g["params"]]
        for entry in layout["tensors"]:
            if entry.startswith("state:"):
                i, k = entry[len("state:"):].split(".", 1)
                optimizer.state[params[int(i)]][k] = views[entry]
        for entry, v in commit["values"].items():
            i, k = entry.split(".", 1)
            value = torch.tensor(v["value"], dtype=getattr(torch, v["dtype"])) if "dtype" in v else v["value"]
            optimizer.state[params[int(i)]][k] = value
        if layout["mode"] == "journal":
            optimizer._journal = views["journal:"]
            optimizer.journal_seq = commit.get("journal_seq", 0)
    _restored[(job, rank)] = {"step": commit["step"], "views": views, "journal_seq": commit.get("journal_seq", 0),
                              "journal_run": _journal_run(commit), "rolled_forward": put_back == "rolled_forward"}
    _put_backs[(job, rank)] = put_back
    lap("bind")
    return int(commit["step"])


def last_restore_phases(key: Optional[Tuple[Optional[str], int]]) -> Dict[str, float]:
    """Where the last restore() of key spent its time, in seconds: "index"
    (the kept index taken back and read), "take_back" (regend handing over
    each chunk, which waits until no worker runs the dead rank's work any
    more), "adopt" (each chunk mapped into this process), "put_back" (the
    step's memory read and put back where it died inside one) and "bind"
    (the model and optimizer made views of it).  {} before any."""
    return dict(_phases.get(_split(key), {}))


def last_put_back(key: Optional[Tuple[Optional[str], int]]) -> Optional[str]:
    """What the last restore() of key put back: "twin" or "journal" (the
    rank died inside a step, or after it before its commit), None; or
    "rolled_forward": nothing, the rank died after a Run of
    AdamW(journal="marks") completed and before its commit, and restore()
    returned the step after the commit, which the memory holds."""
    return _put_backs.get(_split(key))
