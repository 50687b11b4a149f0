# SPDX-License-Identifier: Apache-2.0
"""The runtime behind regen.torch's operations: one regen.Client for the
process, the memory regend reads tensors from, the ordering with torch's
streams, the device map, and recovery after a generation change.

Memory (the operand of a tensor):
  * CUDA memory from regen.torch.pool() (libregen's pool): the chunk is
    imported once per generation by libregen; the operand is a buffer id
    and an offset.  No import per tensor, none per allocation.
  * Other CUDA memory (torch's caching allocator): the cudaMalloc block
    that holds the tensor is imported once (its CUDA IPC handle names the
    block; tensors are offsets in it).  The import holds torch's IPC
    reference counter of one storage in the block (the pin), so torch can
    neither reuse that storage nor free the block while regend maps it.
    When the pinned storage dies, the next tensor seen in the block becomes
    the pin; a block whose pin died and that no operation used for
    SWEEP_OPS operations is closed in regend and its counter released.
  * CPU memory (regend's host backend): libregen's host pool (memfd chunks).
    Outputs are allocated there; inputs that live elsewhere are copied in.

Ordering with torch's current stream (CUDA), per configure(ordering=...):
  "wait"   (default) the rank records an IPC event on its current stream and
           regend's work waits for it on the GPU; regend answers when its
           work is done, so the rank's stream never waits on anything regend
           records.  A regend crash can never hang the rank's GPU.
  "events" as "wait", and regend records a second IPC event when done,
           which the rank's stream waits for; the call returns once the
           work is queued, so the host runs ahead as with any CUDA kernel.
           Faster; but a regend worker that dies with the work queued may
           leave the rank's stream waiting on an event that never fires.
  "sync"   the host synchronises the current stream first, and waits for
           regend's answer: the simplest.
  "auto"   "wait" or "sync", chosen per kind of call (operation and size)
           by the wall time each took lately: both first, then the faster,
           the other tried again now and then.
docs/torch.md gives the measurements behind the default.  "wait" and
"events" keep a pair of IPC events per (device, stream), imported into
regend once per generation; past EVENT_PAIRS_MAX streams of one device the
pair used least lately is closed in regend.
"""

import bisect
import collections
import os
import threading
import time
import warnings
import weakref
from typing import Sequence

import torch

from .. import errors
from ..client import Client, Operand
from ..compute import scalars_record
from ..ops import DTYPE_CODES, NAME_SETS, OPS, REQUIRED_NAMES, SLOT_NAMES
from ..pool import Pool
from ._tensors import imports_of, queue_tensors, release_ipc_counter, untyped_storage as _storage

__all__ = ["Runtime", "WorkLost", "Torn", "RecoveryFailed", "NotSupported", "PoolTooLate", "ORDERINGS"]

ORDERINGS = ("wait", "events", "sync", "auto")
DTYPES = {torch.float32: "f32", torch.float16: "f16", torch.bfloat16: "bf16"}
# A block import whose pin died is closed after this many operations
# without use.
SWEEP_OPS = 32
# Event pairs kept per regend device: a rank that uses stream after stream
# (one per micro-batch, say) would otherwise hold two event imports in
# regend for every stream it ever ordered a call on.  Past this many, the
# pair used least lately is closed there.
EVENT_PAIRS_MAX = 16
# Errors after which the device serves again in a new generation (or the
# worker is back): the operation is retried when that is safe.
_RECOVERABLE = (errors.StaleGeneration, errors.DeviceLost, errors.Draining, errors.ConnectionReset,
                errors.Unavailable)


class WorkLost(errors.Error):
    """regend lost work that it had accepted and this process had already
    moved on from (ordering "events"): results computed since the previous
    synchronisation are not to be trusted.  Redo the step."""

    name = "io.regen.torch.WorkLost"


class Torn(errors.Error):
    """State that a step updates in place holds no complete step: a fault
    of regend's cut the step's update after it began, and nothing can put
    it back (a program Run with a journal of marks only:
    regen.torch.optim.AdamW(journal="marks")), or, from restore(), the
    rank died inside an update that nothing can put back
    (keep(snapshot=False)).  Nothing was retried; load a checkpoint."""

    name = "io.regen.torch.Torn"


class RecoveryFailed(errors.Error):
    """The device did not serve again in time after a fault or restart, or
    the operation failed again after it did."""

    name = "io.regen.torch.RecoveryFailed"


class PoolTooLate(errors.Error, RuntimeError):
    """regen.torch.use_pool_for_process() (or REGEN_TORCH_POOL=process) came
    after torch had set up its CUDA allocator: torch swaps its allocator only
    before the process's first CUDA allocation.  Nothing was changed; call it
    (or import regen.torch with the variable set) before any CUDA work."""

    name = "io.regen.torch.PoolTooLate"


def out_of_memory(e, what):
    """regend's io.regen.OutOfMemory as torch's own kernels say it
    (torch.cuda.OutOfMemoryError, a RuntimeError, since torch 1.13;
    RuntimeError before): training loops catch it to shrink a batch."""
    oom = getattr(torch.cuda, "OutOfMemoryError", RuntimeError)
    return oom(f"regend ran out of memory for {what}: {e}")


class NotSupported(errors.Error, NotImplementedError):
    """regend does not run this (dtype, device, argument); regen.torch.enable()
    leaves such calls to torch."""

    name = "io.regen.torch.NotSupported"


def _env_float(name, default):
    try:
        return float(os.environ.get(name, "") or default)
    except ValueError:
        return default


class _Block:
    """One cudaMalloc block imported into regend."""

    __slots__ = ("buffer", "base", "size", "device", "pin_ref", "pin_counter", "last_used")

    def __init__(self, buffer, base, size, device):
        self.buffer = buffer
        self.base = base
        self.size = size
        self.device = device
        self.pin_ref = None
        self.pin_counter = None
        self.last_used = 0


class _EventPair:
    """The IPC events of one (device, stream): ``before`` (the rank records,
    regend waits) and ``after`` (regend records, the rank waits; "events")."""

    __slots__ = ("before", "after", "ids", "generation")

    def __init__(self, local_device):
        with torch.cuda.device(local_device):
            self.before = torch.cuda.Event(interprocess=True)
            self.after = torch.cuda.Event(interprocess=True)
        self.ids = None
        self.generation = 0


class _AutoOrdering:
    """Chooses "wait" or "sync" per kind of call from the time each took:
    the first calls of a kind alternate, then the faster (by a moving
    average) is used and the other tried again every REPROBE calls."""

    MODES = ("wait", "sync")
    PROBES = 4
    REPROBE = 128

    def __init__(self):
        self.kinds = {}   # kind -> {"n": calls, "avg": {mode: seconds}}

    def choose(self, kind):
        k = self.kinds.setdefault(kind, {"n": 0, "avg": {}})
        n = k["n"]
        k["n"] += 1
        # Until each mode has a time (a call that failed noted none), probe.
        if n < 2 * self.PROBES or n % self.REPROBE == 0 or len(k["avg"]) < len(self.MODES):
            tried = [m for m in self.MODES if m not in k["avg"]]
            return tried[n % len(tried)] if tried else self.MODES[n % 2]
        if n % self.REPROBE == 1:
            return max(k["avg"], key=k["avg"].get)
        return min(k["avg"], key=k["avg"].get)

    def note(self, kind, mode, seconds):
        avg = self.kinds[kind]["avg"]
        avg[mode] = seconds if mode not in avg else 0.8 * avg[mode] + 0.2 * seconds

    def table(self):
        return {f"{op}/2^{size}": {m: round(v * 1e6, 1) for m, v in k["avg"].items()}
                for (op, size), k in self.kinds.items()}


class Runtime:
    """What regen.torch's operations run through.  One per process
    (regen.torch.runtime()); thread-safe: calls are serialised."""

    def __init__(self, socket=None, ordering=None, timeout=None, recovery_timeout=None, host_device=0,
                 device_map=None, retry=True):
        ordering = ordering or os.environ.get("REGEN_TORCH_ORDERING") or "wait"
        if ordering not in ORDERINGS:
            raise ValueError(f"ordering {ordering!r} is not one of {ORDERINGS}")
        self.ordering = ordering
        self.timeout = timeout if timeout is not None else _env_float("REGEN_TORCH_TIMEOUT", 120.0)
        self.recovery_timeout = (recovery_timeout if recovery_timeout is not None
                                 else _env_float("REGEN_TORCH_RECOVERY_TIMEOUT", 120.0))
        self.host_device = int(host_device)
        self.retry = bool(retry)
        self.client = Client(socket, timeout=self.timeout)
        self.socket = self.client.socket_path
        self.pool = Pool.get()
        if self.pool is not None:
            self.pool.configure(self.socket)
        self._device_map = dict(device_map or {})
        self._fresh_state()
        self._tick = 0
        self._auto = _AutoOrdering()
        self.counters = {"calls": 0, "handoffs": 0, "idle_calls": 0, "retries": 0, "recoveries": 0,
                         "block_imports": 0, "block_closes": 0, "repins": 0, "host_copies": 0, "fallbacks": 0,
                         # Event pairs' imports closed in regend (EVENT_PAIRS_MAX).
                         "event_closes": 0,
                         # Where the rank's host time in calls goes: all of
                         # call(), and the part spent in the client's call
                         # (submit and its reply: at launch with a
                         # signal_event, else at completion).
                         "host_us": 0.0, "reply_us": 0.0,
                         # Calls of a batch after its first: ordered by
                         # regend's lane alone (batch()), and queued
                         # without waiting for their answers.
                         "chained_calls": 0, "flushes": 0,
                         # Chained calls regen._accel encoded (the C
                         # encoder; the rest went through Python's).
                         "accel_calls": 0,
                         # The rank's host time collecting queued answers
                         # (flush(): the worker still launching, or with
                         # "wait" the GPU still running, what was queued).
                         "flush_us": 0.0,
                         # torch.compile(backend="regen"): program Runs,
                         # their definitions (again after a worker was
                         # replaced), and rank steps with GPU work between
                         # two Runs (a segment that regend refused runs
                         # on the rank: fallback_segments).
                         "program_runs": 0, "program_defines": 0, "rank_steps": 0, "fallback_segments": 0}
        self._programs = {}   # (graph key, regend device) -> regen.Program
        self._program_seq = 0  # the seq of the last Run with a journal
        _live_runtimes.add(self)

    def _fresh_state(self):
        """What the runtime holds for this process in regend (imports,
        pins, events, queued calls, kept lookups) as it is before any
        call, and its lock."""
        self.lock = threading.RLock()
        self._mapped = set()
        self._blocks = {}          # (regend device, base) -> _Block
        # Blocks whose close met a broken connection: the worker may still
        # map them, so their pins stay until the generation moves.
        self._unclosed = []
        # (regend device, stream handle) -> _EventPair, used least lately first.
        self._events = collections.OrderedDict()
        # Events whose close met a broken connection: the worker may still
        # hold them; closed again with the next evictions, forgotten with
        # their generation.  (regend device, Event) each.
        self._unclosed_events = []
        self._generation = {}      # regend device -> newest generation seen
        self._pending = {}         # regend device -> (after event, generation): ordering "events"
        self._batch_depth = 0
        self._batch_calls = 0
        # Inside a batch, the (device, stream) whose last call was ordered
        # with no rank work since: the next call there needs no ordering.
        self._chained = None
        self._chained_stream = None
        # A batch's chained calls, queued without waiting for their
        # answers: (op, tensors, scalars) each, and where they went
        # (device, stream, event pair).  flush() collects the answers.
        self._deferred = []
        self._deferred_at = None
        self._redoing = False
        # Pool lookups kept per chunk, CPU and CUDA apart: (start, end,
        # buffer) each, while the pool's epoch stays.
        self._chunks = ([], [])
        self._chunks_epoch = None

    def _forget_after_fork(self):
        """In a forked child (its Client forgets its own state the same
        way): the imports, pins, events and queued calls are the parent
        process's, and the lock may be held by a thread the child does not
        have.  Forgotten without a call; the child imports afresh."""
        self._fresh_state()

    # -- devices -------------------------------------------------------------

    def regend_device(self, device):
        """regend's index for a torch device."""
        if device.type == "cpu":
            return self.host_device
        if device.type != "cuda":
            raise NotSupported(parameters={"message": f"regend takes CUDA or CPU tensors, not {device.type}"})
        local = device.index if device.index is not None else torch.cuda.current_device()
        found = self._device_map.get(local)
        if found is not None and local in self._mapped:
            return found
        # The client is one connection and not thread-safe: its Status
        # goes under the lock the calls take (regen.torch.pool() asks from
        # any thread).
        with self.lock:
            found = self._device_map.get(local)
            if found is None:
                found = self._find_device(local)
                self._device_map[local] = found
            if local not in self._mapped and self.pool is not None:
                self.pool.map_device(local, found)
                self._mapped.add(local)
        return found

    def _find_device(self, local):
        """By UUID, then PCI bus id, as Status reports them; else the same
        index, which is right only when this process and regend see the
        same CUDA_VISIBLE_DEVICES."""
        from ._devices import match_device
        status = self.client.status()
        index, how = match_device(local, status.get("devices", []))
        if how == "index" and os.environ.get("CUDA_VISIBLE_DEVICES") is not None:
            warnings.warn(f"regen.torch: regend reports no UUID or PCI bus id to match CUDA device {local} by; "
                          f"using regend's device {index}, which is right only if regend sees the same "
                          "CUDA_VISIBLE_DEVICES (regen.torch.configure(device_map={...}) sets it)", stacklevel=4)
        return index

    # -- generations -----------------------------------------------------------

    def _note_generation(self, device, generation):
        """``device`` is at ``generation``: forget what older ones held,
        wherever it is (also when this generation was seen before: an import
        made by libregen's pool or in the middle of an operation may still
        name an older one)."""
        # The newest generation known, never an older one: the client keeps
        # the last it was told and would take a stale one back.
        generation = max(generation, self._generation.get(device, 0))
        self._generation[device] = generation
        self.client._note_generation(device, generation)
        if self.pool is not None:
            self.pool.note_generation(device, generation)
        # regend unmapped every import of older generations: the pins can go.
        for key, blk in list(self._blocks.items()):
            if blk.device == device and blk.buffer.generation < generation:
                del self._blocks[key]
                self._unpin(blk)
        for blk in [b for b in self._unclosed if b.device == device and b.buffer.generation < generation]:
            self._unclosed.remove(blk)
            self._unpin(blk)
        self._unclosed_events = [(d, ev) for d, ev in self._unclosed_events
                                 if d != device or ev.generation >= generation]

    def _seen_generation(self, device, generation):
        if generation > self._generation.get(device, 0):
            self._note_generation(device, generation)

    # -- memory ----------------------------------------------------------------

    def operand(self, t, device):
        """The Operand regend reads ``t`` through (``t`` on regend's
        ``device``), and the tensor actually used (a copy for CPU memory from
        outside the host pool; ``t`` itself otherwise)."""
        dtype = DTYPES.get(t.dtype)
        if dtype is None:
            raise NotSupported(parameters={"message": f"regend takes float32, float16 and bfloat16, not {t.dtype}"})
        on_cpu = t.is_cpu
        found = self._place(t, on_cpu, device)
        if found is None:
            copy = host_empty(t.shape, t.dtype)
            copy.copy_(t)
            self.counters["host_copies"] += 1
            t = copy
            # The allocation may have made a chunk where one just went
            # (a finalizer freed it): the kept lookups must not answer
            # for the new one with the old one's id.
            self._check_chunks()
            found = self._place(t, True, device)
        return Operand.trusted(found[0], found[1], dtype, list(t.shape), _strides(t)), t

    def _place(self, t, on_cpu, device):
        """(buffer, offset) regend reads ``t`` at: its pool chunk, else (CUDA
        memory) the import of its cudaMalloc block; None for CPU memory
        outside the host pool, which the caller copies in or declines."""
        ptr = t.data_ptr()
        found = self._pool_ref(ptr, on_cpu, device) if self.pool is not None else None
        if found is not None or on_cpu:
            return found
        blk = self._block_of(t, device)
        return blk.buffer, ptr - blk.base

    def _check_chunks(self):
        """Forgets the kept pool lookups when the pool's epoch moved (an
        import closed or forgotten): once per call."""
        epoch = self.pool.epoch()
        if epoch is None or epoch != self._chunks_epoch:
            self._chunks = ([], [])
            self._chunks_epoch = epoch

    def _pool_ref(self, ptr, on_cpu, device):
        """(buffer, offset) of pool memory at ``ptr``, or None: from the kept
        lookup of its chunk (nearly every tensor of a step), else libregen's
        (which imports the chunk when it must; its generation is noted then,
        and holds while the lookup is kept)."""
        kept = self._chunks[on_cpu]
        for start, end, buffer in kept:
            if start <= ptr < end:
                return buffer, ptr - start
        ref = self.pool.lookup(ptr, self.host_device) if on_cpu else self.pool.lookup(ptr)
        if ref is None:
            return None
        self._seen_generation(device, ref.generation)
        if self._chunks_epoch is not None:
            # Sorted by start: regen._accel bisects it.
            bisect.insort(kept, (ptr - ref.offset, ptr + ref.extent, ref.buffer))
        return ref.buffer, ref.offset

    def _block_of(self, t, device):
        storage = _storage(t)
        if self.pool is None:
            raise NotSupported(parameters={"message": "libregen was not found (set REGEN_LIBREGEN): "
                                           "CUDA tensors outside regen.torch.pool() need it to be imported"})
        base, size = self.pool.address_range(storage.data_ptr())
        key = (device, base)
        blk = self._blocks.get(key)
        if blk is not None and (blk.size != size or blk.buffer.closed):
            # The block was freed and another of a different size made at
            # the same address: that import is of memory torch gave back.
            del self._blocks[key]
            self._close_block(blk)
            blk = None
        if blk is None:
            blk = self._import_block(storage, device, base, size)
            self._blocks[key] = blk
        elif blk.pin_ref is None or blk.pin_ref.expired():
            self._pin(blk, storage)
            self.counters["repins"] += 1
        blk.last_used = self._tick
        return blk

    def _import_block(self, storage, device, base, size):
        shared = storage._share_cuda_()
        handle, offset = shared[1], shared[3]
        counter = (shared[4], shared[5])
        try:
            if storage.data_ptr() - base != offset:
                raise errors.ImportFailed(parameters={"message": "torch's IPC handle does not name the block "
                                                      "cuMemGetAddressRange reports (expandable segments?)"})
            try:
                buf = self.client.import_cuda_ipc(device, handle, 0, size)
            except ValueError as e:
                # An expandable segment: CUDA IPC cannot share it; regen.torch.pool() can.
                raise NotSupported(parameters={"message": f"{e}; or allocate it under regen.torch.pool()"}) from e
        except BaseException as e:
            imports_of(self.client).counter_after_failed_import(device, counter, e)
            raise
        self._note_generation(device, buf.generation)
        blk = _Block(buf, base, size, device)
        self._set_pin(blk, storage, counter)
        self.counters["block_imports"] += 1
        return blk

    def _pin(self, blk, storage):
        shared = storage._share_cuda_()
        self._set_pin(blk, storage, (shared[4], shared[5]))

    def _set_pin(self, blk, storage, counter):
        from torch.multiprocessing.reductions import StorageWeakRef
        old = blk.pin_counter
        blk.pin_ref = StorageWeakRef(storage)
        blk.pin_counter = counter
        # The new pin holds the block before the old one lets go.
        if old is not None:
            _release_counter(old)

    def _unpin(self, blk):
        counter, blk.pin_counter, blk.pin_ref = blk.pin_counter, None, None
        if counter is not None:
            _release_counter(counter)
            # torch frees storages held back for an IPC consumer when it
            # collects; without this the block would wait for the next one.
            try:
                torch.cuda.ipc_collect()
            except Exception:
                pass

    def _close_block(self, blk):
        """regend unmaps first; only then may torch reuse or free the block."""
        try:
            self.client.close_buffer(blk.buffer)
        except (errors.StaleGeneration, errors.NoSuchObject, errors.DeviceLost):
            pass
        except errors.ConnectionReset:
            # The worker may still map it: keep the pin until the generation
            # changes (the worker is gone then, or a reset unmapped it).  Not
            # in _blocks: a new import of the same address would take its
            # place there, and the pin would never be let go.
            self._unclosed.append(blk)
            return
        self._unpin(blk)
        self.counters["block_closes"] += 1

    def sweep(self, force=False):
        """Close block imports whose pinned storage died and that no
        operation used lately (all such, with force)."""
        with self.lock:
            for key, blk in list(self._blocks.items()):
                dead = blk.pin_ref is None or blk.pin_ref.expired()
                if dead and (force or self._tick - blk.last_used >= SWEEP_OPS):
                    del self._blocks[key]
                    self._close_block(blk)
            self._trim_events()

    def live_imports(self):
        """Block imports held now (pool chunks are in regen.pool stats)."""
        return len(self._blocks)

    # -- ordering --------------------------------------------------------------

    def _events_for(self, device, stream, local):
        key = (device, stream.cuda_stream)
        pair = self._events.get(key)
        if pair is None:
            pair = self._events[key] = _EventPair(local)
            self._trim_events()
        else:
            self._events.move_to_end(key)
        if pair.ids is None or pair.generation < self._generation.get(device, 0):
            # An event is made on the device current when it is first used.
            with torch.cuda.device(local):
                handles = bytes(pair.before.ipc_handle()), bytes(pair.after.ipc_handle())
            before = self.client.import_event(device, handles[0])
            after = self.client.import_event(device, handles[1])
            pair.ids = (before, after)
            pair.generation = before.generation
            self._note_generation(device, before.generation)
        return pair

    def _trim_events(self):
        """Closes the pairs used least lately past EVENT_PAIRS_MAX per
        device.  Not while calls are queued unanswered (a batch's): a close
        waits for the lane's answers, which flush() collects, and the last
        of them may be ordered on a pair."""
        if self._deferred:
            return
        per_device = collections.Counter(device for device, _ in self._events)
        for key in list(self._events):
            if per_device[key[0]] > EVENT_PAIRS_MAX:
                per_device[key[0]] -= 1
                self._close_events(key[0], self._events.pop(key).ids)
        retry, self._unclosed_events = self._unclosed_events, []
        for device, ev in retry:
            self._close_events(device, (ev,))

    def _close_events(self, device, events):
        """Closes a pair's imports in regend (none to close once their
        generation is gone).  A close that met a broken connection is tried
        again later: the worker may still hold the event."""
        for ev in events or ():
            if ev.generation < self._generation.get(device, 0):
                continue
            try:
                self.client.close_event(ev)
            except (errors.StaleGeneration, errors.NoSuchObject):
                pass
            except errors.Error:
                self._unclosed_events.append((device, ev))
            else:
                self.counters["event_closes"] += 1

    # -- calls -----------------------------------------------------------------

    def batch(self):
        """Calls made inside ``with rt.batch():`` follow each other on
        regend's side with no rank work between them: one hand-off.  Only
        the first orders itself after the rank's stream; the others follow
        it on regend's lane, which keeps calls in order, so no event passes
        through the rank's context between them (each would cost a context
        switch each way).  All are queued without waiting for their
        answers: the batch's end collects them (flush()), and an error
        among them surfaces there.  GPU work on the rank inside a batch is
        announced first with ``rank_work()``."""
        return _Batch(self)

    def rank_work(self):
        """Called before queuing GPU work on the rank's stream inside a
        batch (a copy, a fill, a conversion): the calls queued so far are
        answered and the rank's stream ordered after them first (that work
        may read their outputs, or reuse memory they still read), and the
        next call waits for the rank's work."""
        with self.lock:
            self.flush()
            self._chained = None

    def flush(self):
        """Collects the answers of the calls queued without waiting (a
        batch's chained calls) and orders the rank's stream after them
        ("events").  A device that changed generation under them: they are
        run again in order, each answered, once it serves again (their
        outputs are fresh, their inputs the rank's unchanged ones)."""
        deferred = self._deferred
        if not deferred:
            return
        device, stream, pair = self._deferred_at
        self._deferred, self._deferred_at = [], None
        self.counters["flushes"] += 1
        entered = time.perf_counter()
        try:
            self.client.wait(device)
        except _RECOVERABLE as e:
            self._redo(e, deferred)
            return
        except BaseException as e:
            # A call among them was refused; the others were answered at
            # launch and may still run: the rank's stream waits for them
            # all the same, or its next kernels could reuse memory they
            # still write once the caller carries on.
            if pair is not None:
                self._follow(device, stream, pair)
            if isinstance(e, errors.OutOfMemory):
                raise out_of_memory(e, "a batch's call") from e
            raise
        finally:
            self.counters["flush_us"] += (time.perf_counter() - entered) * 1e6
        if pair is not None:
            self._follow(device, stream, pair)

    def _follow(self, device, stream, pair):
        """"events": the rank's stream waits for the event regend's last
        call signalled, which stays pending (WorkLost) until it fires."""
        stream.wait_event(pair.after)
        self._pending[device] = (pair.after, pair.generation)

    def _redo(self, err, calls):
        """Runs ``calls`` again in order, answered each, after ``err`` (a
        generation change or a broken connection) took one of them."""
        self._chained = None
        attempts, deadline = 1, time.monotonic() + self.recovery_timeout
        self._recover(err, calls[0][1], attempts, deadline)
        self.counters["retries"] += 1
        self._redoing = True
        try:
            i = 0
            while i < len(calls):
                op, tensors, scalars = calls[i]
                try:
                    self._call_once(op, tensors, scalars)
                    i += 1
                except _RECOVERABLE as e:
                    attempts += 1
                    self._recover(e, tensors, attempts, deadline)
                    self.counters["retries"] += 1
        finally:
            self._redoing = False

    def call(self, op, tensors, scalars, outputs=()):
        """Run ``op`` (one of _OPS, the client's method of that name) on the
        tensors (a dict of name -> tensor or None) with scalars; ``outputs``
        names the outputs (freshly allocated by the caller, so a retry after
        a fault is always safe)."""
        with self.lock:
            entered = time.perf_counter()
            self._tick += 1
            try:
                chained = self._chained is not None and not self._redoing and self._queue_chained(op, tensors, scalars)
                idle = chained or self._call_once(op, tensors, scalars)
            except _RECOVERABLE as e:
                # Calls queued before this one (a batch's) go again first.
                calls, self._deferred, self._deferred_at = self._deferred + [(op, tensors, scalars)], [], None
                try:
                    self._redo(e, calls)
                except errors.OutOfMemory as oom:
                    raise out_of_memory(oom, op) from oom
                idle = False
            except errors.OutOfMemory as e:
                raise out_of_memory(e, op) from e
            self.counters["calls"] += 1
            # A call that found the rank's stream idle follows the last
            # regend call with no rank GPU work between: the same hand-off.
            if idle:
                self.counters["idle_calls"] += 1
            elif self._batch_depth == 0 or self._batch_calls == 0:
                self.counters["handoffs"] += 1
            if self._batch_depth:
                self._batch_calls += 1
            if self._tick % SWEEP_OPS == 0 and not self._deferred:
                self.sweep()
            self.counters["host_us"] += (time.perf_counter() - entered) * 1e6

    def _queue_chained(self, op, tensors, scalars):
        """A batch's chained call (it follows the one before on regend's
        lane, with no rank work between) queued on the ring straight from
        the tensors: each operand's record fields from its kept pool chunk
        or block import, no Operand and no client method per call.  Most of
        a run's calls go this way; what _call_once does for them besides
        (ordering, the device's stream) the run's first call did.  False,
        with nothing done, where it does not apply: another lane, a tensor
        on another device or of another dtype, CPU memory outside the host
        pool (copied, and answered), missing or unknown operands, or a
        lane on Varlink; _call_once takes the call then (and raises where
        the call is wrong)."""
        names = SLOT_NAMES.get(op)
        if names is None or self.pool is None or not tensors.keys() <= NAME_SETS[op]:
            return False
        for n in REQUIRED_NAMES[op]:
            if tensors.get(n) is None:
                return False
        local = tensors[names[0]].get_device()
        lane_key = (local, _current_raw_stream(local)) if local >= 0 else ("cpu",)
        if lane_key != self._chained:
            return False
        device = self._device_map.get(local) if local >= 0 else self.host_device
        if device is None:
            return False
        self._check_chunks()
        on_cpu = local < 0
        kept = self._chunks[on_cpu]
        pair = None
        if self.ordering == "events" and not on_cpu:
            pair = self._deferred_at[2] if self._deferred else None
            if pair is None:
                pair = self._events_for(device, self._chained_stream, local)
        signal = pair.ids[1] if pair is not None else None
        record = scalars_record(op, scalars)
        sent = time.perf_counter()
        # regen._accel reads the tensors where it covers the call (every
        # operand in a kept chunk), else the loop here resolves them.
        ticket = queue_tensors(self.client, device, op, names, tensors, local, kept, _RING_DTYPES, record, signal)
        if ticket is None:
            slots = self._slots(names, tensors, local, kept, on_cpu, device)
            if slots is None:
                return False
            sent = time.perf_counter()
            ticket = self.client.queue_encoded(device, op, slots, record, signal)
            if ticket is None:
                return False
        else:
            self.counters["accel_calls"] += 1
        self.counters["reply_us"] += (time.perf_counter() - sent) * 1e6
        self._deferred.append((op, tensors, scalars))
        self._deferred_at = (device, self._chained_stream, pair)
        self.counters["chained_calls"] += 1
        return True

    def _slots(self, names, tensors, local, kept, on_cpu, device):
        """A chained call's operand slots for Client.queue_encoded (None
        where the call cannot be chained)."""
        slots = []
        for n in names:
            t = tensors.get(n)
            if t is None:
                slots.append(None)
                continue
            dtype = _RING_DTYPES.get(t.dtype)
            shape = t.shape
            # A record holds rank 4 at most: _call_once's Operand is refused
            # by name.
            if dtype is None or t.get_device() != local or len(shape) > 4:
                return None
            # The tensor's place from the kept lookup of its pool chunk,
            # without a call (nearly every tensor of a run); _place where
            # none holds it.
            ptr = t.data_ptr()
            for start, end, buffer in kept:
                if start <= ptr < end:
                    offset = ptr - start
                    break
            else:
                found = self._place(t, on_cpu, device)
                if found is None:
                    return None
                buffer, offset = found
            # Shapes and strides go as the tensor has them, as _call_once's
            # Operands carry them: a layout regend cannot take (a GEMM
            # operand whose rows are not contiguous) is its refusal, named,
            # either way; the ops hand GEMMs row-major views (_gemm_input).
            # A dimension of size 1 takes _strides' row-major stride.
            slots.append((buffer, dtype, offset, shape, _strides(t) if 1 in shape else t.stride()))
        return slots

    def _call_once(self, op, tensors, scalars):
        """One try of the call; True when the rank's stream was idle (it
        needed no ordering towards regend)."""
        if op not in _OPS:
            raise ValueError(f"regen.torch: no operation {op!r}")
        present = {n: t for n, t in tensors.items() if t is not None}
        # get_device() is an int (-1 on the CPU): no torch.device per tensor.
        indices = {t.get_device() for t in present.values()}
        if len(indices) != 1 or (-1 in indices and len({t.device.type for t in present.values()}) != 1):
            raise ValueError("regen.torch: the tensors of one operation must be on one device, got "
                             f"{sorted({str(t.device) for t in present.values()})}")
        tdev = next(iter(present.values())).device
        stream = None
        raw = None
        if tdev.type == "cuda":
            raw = _current_raw_stream(tdev.index)
        # A later call of a batch follows the one before on regend's lane:
        # nothing of the rank's to wait for (see batch()).  CPU tensors
        # (the host backend) chain alike: the rank's own work on them is
        # announced as on the GPU.
        lane_key = (tdev.index, raw) if raw is not None else ("cpu",)
        chained = self._batch_depth > 0 and self._chained == lane_key
        if chained:
            stream = self._chained_stream
        elif tdev.type == "cuda":
            if torch.cuda.is_current_stream_capturing():
                # regend's work can be no graph node, and an import, a query
                # of the stream or an event would break the capture: refused
                # before any of them, so the capture stays valid.  (A
                # chained call follows one that was checked.)
                raise NotSupported(parameters={
                    "message": "regen.torch: an operation in regend cannot be captured into a CUDA graph "
                               "(torch.cuda.graph, torch.compile mode='reduce-overhead'): it runs in another "
                               "process; run it outside the capture"})
            stream = torch.cuda.current_stream(tdev)
        device = self.regend_device(tdev)
        if self.pool is not None:
            self._check_chunks()
        named = {}
        copies = {}
        for name, t in present.items():
            named[name], used = self.operand(t, device)
            if used is not t:
                copies[name] = used
        kw = dict(scalars)
        pair = None
        ordering = self.ordering
        kind = None
        start = time.perf_counter()
        if self._deferred and not chained:
            # Another device or stream, or rank work since: the queued
            # calls are answered first.
            self.flush()
        # Everything the rank queued on its stream is done (a host query, no
        # GPU work): regend may read now, and nothing is recorded on the
        # rank's stream for it, which would bring the rank's context back to
        # the GPU between two regend calls (a context switch, ~140 us).
        idle = stream is not None and (chained or stream.query())
        # "auto" learns from calls that needed an ordering; an idle call
        # would teach it nothing.
        if stream is not None and ordering == "auto" and not idle:
            numel = max(t.numel() for t in present.values())
            kind = (op, numel.bit_length())
            ordering = self._auto.choose(kind)
        # Every call of a batch, its first too, is queued without waiting:
        # the batch's end (or rank work inside it) collects the answers and
        # orders the rank's stream after the last.  Answered now: a call
        # with a copy (CPU memory from outside the host pool, which lives
        # only as long as the call), one "auto" times, and the calls of a
        # re-run.  (The first call's wait on the rank's event is taken by
        # the worker before its answer, so before flush() returns: the
        # next run's first call may record that event again.)
        defer = self._batch_depth > 0 and not self._redoing and not copies and kind is None
        if stream is not None:
            if idle and ordering != "events":
                pass
            elif ordering == "sync":
                stream.synchronize()
            else:
                pair = self._events_for(device, stream, tdev.index)
                if not idle:
                    pair.before.record(stream)
                    kw["wait_event"] = pair.ids[0]
                if ordering == "events":
                    kw["signal_event"] = pair.ids[1]
        fn = getattr(self.client, op)   # the client's method of the same name
        if defer:
            kw["wait"] = False
        sent = time.perf_counter()
        fn(**named, **kw)
        self.counters["reply_us"] += (time.perf_counter() - sent) * 1e6
        if defer:
            self._deferred.append((op, tensors, scalars))
            self._deferred_at = (device, stream, pair if ordering == "events" else None)
        else:
            if kind is not None and not idle:
                self._auto.note(kind, ordering, time.perf_counter() - start)
            if pair is not None and ordering == "events":
                self._follow(device, stream, pair)
        if chained:
            self.counters["chained_calls"] += 1
        if self._batch_depth > 0:
            self._chained, self._chained_stream = lane_key, stream
        # Outputs regend wrote into copies (CPU tensors from outside the
        # host pool) go back where the caller wants them.
        for name, used in copies.items():
            if name in _OUTPUT_NAMES[op]:
                tensors[name].copy_(used)
        return idle

    def run_program(self, key, definition, tensors, scalars=None, journal=None, seq=None, journal_mode="copy"):
        """Runs an io.regen.Program ``definition``, defined once per regend
        device under ``key`` (again where its worker was replaced), with
        its bound tensors (name -> torch tensor, all on one device: CUDA on
        torch's current stream, or CPU tensors in the host pool for the host
        backend) and scalars.  It waits for what the rank queued, and the
        rank's stream waits for it ("events") or the call for its end (the
        other orderings).  After a generation change it waits for the device
        and runs again.  A program that updates tensors in place (an
        optimizer step) passes ``journal``, a function of the Program giving
        a tensor of at least its journal_bytes: the retry then applies the
        update exactly once (io.regen.Program.Run's journal, seq, retry);
        ``seq``, the Run's number, is the caller's where it numbers the Runs
        on its journal itself (an optimizer's steps, which kept state reads
        back from the journal), else the runtime's.  ``journal_mode``
        "marks": the journal holds the Run's marks only (32 bytes, no copy
        of the tensors it updates); the Run is then answered once its work
        is done whatever the ordering, and one that a fault of regend's cut
        after it began raises Torn (nothing retried).  Returns the
        Program."""
        with self.lock:
            entered = time.perf_counter()
            attempts, deadline = 0, None
            self._program_seq += 1
            if journal is None:
                seq = None
            elif seq is None:
                seq = self._program_seq
            while True:
                try:
                    program = self._run_program_once(key, definition, tensors, scalars, journal, seq, attempts > 0,
                                                     journal_mode)
                    break
                except errors.RunTorn as e:
                    raise Torn(parameters={
                        "message": f"a fault of regend's cut program Run {e.parameters.get('seq')} after it began "
                                   "updating its tensors in place (an optimizer's parameters and moments), and its "
                                   "journal holds marks only (journal=\"marks\"): nothing was retried, and they may "
                                   "hold part of the update; load them from a checkpoint",
                        "seq": e.parameters.get("seq")}) from e
                except _RECOVERABLE as e:
                    attempts += 1
                    if deadline is None:
                        deadline = time.monotonic() + self.recovery_timeout
                    self._recover(e, tensors, attempts, deadline)
                    self.counters["retries"] += 1
                except errors.OutOfMemory as e:
                    raise out_of_memory(e, "a program Run") from e
                except errors.NoSuchObject:
                    # A new worker knows no program of ours: define again.
                    attempts += 1
                    if attempts > 3:
                        raise
                    for k in [k for k in self._programs if k[0] == key]:
                        del self._programs[k]
            self.counters["program_runs"] += 1
            # A Run touches many blocks: it sweeps as often as a call does,
            # so blocks whose tensors are gone are let go.
            self._tick += 1
            if self._tick % SWEEP_OPS == 0 and not self._deferred:
                self.sweep()
            self.counters["host_us"] += (time.perf_counter() - entered) * 1e6
            return program

    def _run_program_once(self, key, definition, tensors, scalars, journal, seq, retry, journal_mode="copy"):
        first = next(iter(tensors.values()))
        tdev = first.device
        on_cpu = tdev.type == "cpu"
        if not on_cpu and torch.cuda.is_current_stream_capturing():
            raise NotSupported(parameters={
                "message": "regen.torch: a program Run cannot be captured into a CUDA graph"})
        self.flush()
        stream = None if on_cpu else torch.cuda.current_stream(tdev)
        device = self.regend_device(tdev)
        program = self._programs.get((key, device))
        if program is None:
            program = self.client.define_program(device, definition)
            self._programs[(key, device)] = program
            self.counters["program_defines"] += 1
        if self.pool is not None:
            self._check_chunks()

        def place(name, t):
            if t.device != tdev:
                raise ValueError(f"regen.torch: a program's tensors are on one device; {name} is on {t.device}, "
                                 f"not {tdev}")
            found = self._place(t, on_cpu, device)
            if found is None:
                raise NotSupported(parameters={
                    "message": f"regen.torch: {name} is CPU memory outside the host pool (regen.torch.host_empty): "
                               "a program binds tensors where they are"})
            return found
        bind = {name: place(name, t) for name, t in tensors.items()}
        kw = {}
        if journal is not None:
            kw.update(journal=place("the journal", journal(program)), seq=seq, retry=retry)
            if journal_mode != "copy":
                kw["journal_mode"] = journal_mode
        events = False
        pair = None
        if stream is not None:
            pair = self._events_for(device, stream, tdev.index)
            if not stream.query():
                pair.before.record(stream)
                kw["wait_event"] = pair.ids[0]
                self.counters["handoffs"] += 1
            else:
                self.counters["idle_calls"] += 1
            # A Run with a journal of marks only is answered when its work
            # is done: one a fault cuts must be refused (Torn) by the call
            # that made it, not found later as lost work to redo.
            events = self.ordering == "events" and not (journal is not None and journal_mode == "marks")
            if events:
                kw["signal_event"] = pair.ids[1]
        sent = time.perf_counter()
        self.client.run_program(program, bind, scalars, **kw)
        self.counters["reply_us"] += (time.perf_counter() - sent) * 1e6
        if events:
            self._follow(device, stream, pair)
        return program

    def forget_programs(self, owner):
        """Drops in regend the programs run under keys (owner, ...): a
        compiled graph or an optimizer that is gone (a recompile, a
        torch._dynamo.reset()), so that they neither count against the
        process's programs nor stay defined."""
        with self.lock:
            for k in [k for k in self._programs if isinstance(k[0], tuple) and k[0][0] == owner]:
                program = self._programs.pop(k)
                try:
                    self.client.drop_program(program)
                except (errors.Error, OSError):
                    pass   # its generation or its worker is gone: so is the program

    def rank_work_between_programs(self, fallback=False):
        """A compiled graph ran GPU work of its own on the rank between two
        of its segments (counted; a refused segment counts as a fallback)."""
        self.counters["rank_steps"] += 1
        if fallback:
            self.counters["fallback_segments"] += 1

    def _recover(self, err, tensors, attempts, deadline):
        """Wait until the device serves again, forget what the old
        generation held, and return if the operation may run again; else
        raise."""
        present = [t for t in tensors.values() if t is not None]
        device = self.regend_device(present[0].device) if present else self.host_device
        if not self.retry:
            raise err
        if attempts > 20 or time.monotonic() >= deadline:
            raise RecoveryFailed(parameters={
                "message": f"the operation failed {attempts} times across generation changes; last: {err}",
                "device": device}) from err
        pending = self._pending.pop(device, None)
        old = self._generation.get(device, 0)
        gen = err.parameters.get("generation") if isinstance(err.parameters, dict) else None
        gen = gen if isinstance(gen, int) and not isinstance(gen, bool) else None
        if isinstance(err, errors.StaleGeneration):
            # The current generation: ours were older.
            want = gen if gen is not None else old + 1
        elif isinstance(err, (errors.DeviceLost, errors.Draining)):
            # The device is leaving `gen`: it serves again in a later one.
            want = max(old, gen or 0) + 1
        else:
            # The connection broke (a worker that died, or regend coming
            # back): ready again, in this generation or a later one; a
            # call that fails again comes back here until the deadline.
            want = old
            time.sleep(0.05)
        self.counters["recoveries"] += 1
        gen = self._wait_ready(device, want, err, deadline)
        self._note_generation(device, gen)
        if pending is not None:
            event, pending_gen = pending
            if pending_gen < gen and not event.query():
                raise WorkLost(parameters={
                    "message": f"device {device} changed generation ({pending_gen} -> {gen}) before work it had "
                               "accepted finished (ordering 'events'): results since the last synchronisation "
                               "are lost; redo the step", "device": device, "generation": gen}) from err

    def _wait_ready(self, device, want, err, deadline):
        """The device's generation once it is ready at ``want`` or later
        (Watch; Status when the main socket is itself coming back)."""
        last = None
        while True:
            left = deadline - time.monotonic()
            if left <= 0:
                raise RecoveryFailed(parameters={
                    "message": f"device {device} did not serve again at generation >= {want} within "
                               f"{self.recovery_timeout:.0f} s (last seen: {last}); cause: {err}",
                    "device": device}) from err
            try:
                with self.client.watch(timeout=min(left, 5.0)) as w:
                    while time.monotonic() < deadline:
                        try:
                            ev = w.next(timeout=max(0.01, min(deadline - time.monotonic(), 5.0)))
                        except TimeoutError:
                            continue
                        if ev.get("device") != device:
                            continue
                        last = (ev.get("state"), ev.get("generation"))
                        if ev.get("state") == "ready" and ev.get("generation", 0) >= want:
                            return ev["generation"]
            except (errors.Unavailable, errors.ConnectionReset, StopIteration, OSError):
                time.sleep(0.05)

    def close(self):
        """Close every block import (regend unmaps, then the pins go) and
        the connections.  Pool chunks stay: they belong to the process."""
        with self.lock:
            for key, blk in list(self._blocks.items()):
                del self._blocks[key]
                self._close_block(blk)
            # regend keeps a process's imports while any of its connections
            # is open (libregen's pool has one of its own): closed, not
            # only forgotten.
            for (device, _), pair in self._events.items():
                self._close_events(device, pair.ids)
            self._events.clear()
            self._unclosed_events = []
            self.client.close()

    # -- statistics --------------------------------------------------------------

    def stats(self):
        with self.lock:
            out = dict(self.counters)
            out["block_imports_live"] = len(self._blocks)
            out["doorbells"] = self.client.doorbells()
            out["ordering"] = self.ordering
            if self.ordering == "auto":
                out["auto_us"] = self._auto.table()
            if self.pool is not None:
                out["pool"] = self.pool.stats()
                out["pool"]["process"] = self.pool.process_allocator
            return out


_OPS = frozenset(OPS)
_RING_DTYPES = {t: DTYPE_CODES[n] for t, n in DTYPES.items()}
# Per op, the operands it writes.
_OUTPUT_NAMES = {name: frozenset(o.name for o in op.operands if o.output) for name, op in OPS.items()}


class _Batch:
    def __init__(self, rt):
        self.rt = rt

    def __enter__(self):
        self.rt.lock.acquire()
        if self.rt._batch_depth == 0:
            self.rt._batch_calls = 0
            self.rt._chained = None
        self.rt._batch_depth += 1
        return self

    def __exit__(self, exc_type, exc, tb):
        rt = self.rt
        try:
            if rt._batch_depth == 1:
                try:
                    rt.flush()
                except Exception:
                    # An error already on its way out of the batch is the
                    # one to see; the queue is empty either way.
                    if exc_type is None:
                        raise
        finally:
            rt._batch_depth -= 1
            if rt._batch_depth == 0:
                rt._chained = None
            rt.lock.release()


_live_runtimes: "weakref.WeakSet[Runtime]" = weakref.WeakSet()


def _after_fork_in_child():
    global _host_pool_lock
    _host_pool_lock = threading.Lock()
    for r in list(_live_runtimes):
        r._forget_after_fork()


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_after_fork_in_child)


def _raw_stream_getter():
    """The raw cudaStream_t of a device's current stream, as an int: torch's
    own getter where it has one (no torch.cuda.Stream object built per
    call), else through current_stream()."""
    get = getattr(torch._C, "_cuda_getCurrentRawStream", None)
    if get is not None:
        def raw(index):
            return get(torch.cuda.current_device() if index is None else index)
        return raw
    return lambda index: torch.cuda.current_stream(index).cuda_stream


_current_raw_stream = _raw_stream_getter()


def _strides(t):
    """t's strides as regend takes them: a dimension of size 1 may have any
    stride in torch; regend wants the row-major one there."""
    shape, strides = t.shape, list(t.stride())
    if 1 not in shape:
        return strides
    step = 1
    for i in range(len(shape) - 1, -1, -1):
        if shape[i] == 1:
            strides[i] = step
        step *= max(shape[i], 1)
    return strides


def _release_counter(counter):
    release_ipc_counter(*counter)


_host_pool_lock = threading.Lock()


def host_empty(shape: Sequence[int], dtype: torch.dtype) -> torch.Tensor:
    """An uninitialised CPU tensor in libregen's host pool (memfd chunks
    regend's host backend maps): what regen.torch allocates outputs of CPU
    operations in."""
    import ctypes
    pool = Pool.get()
    if pool is None:
        raise NotSupported(parameters={"message": "libregen was not found (set REGEN_LIBREGEN): CPU tensors "
                                       "for regend's host backend live in its host pool"})
    shape = [int(s) for s in shape]
    numel = 1
    for s in shape:
        numel *= s
    nbytes = max(numel * torch.empty((), dtype=dtype).element_size(), 1)
    ptr = pool.alloc_host(nbytes)
    raw = (ctypes.c_uint8 * nbytes).from_address(ptr)
    # The tensor keeps `raw` alive; when the last view of it goes, the
    # memory goes back to the pool.  Not at the interpreter's exit while a
    # tensor still lives: finalize's default would hand the memory back
    # (the chunk unmapped, or carved again) under code that still runs then
    # (atexit handlers, daemon threads, __del__), which then read freed
    # memory or crashed; the process's end gives it back anyway.
    weakref.finalize(raw, pool.free_host, ptr).atexit = False
    flat = torch.frombuffer(raw, dtype=torch.uint8)
    return flat[:numel * torch.empty((), dtype=dtype).element_size()].view(dtype).reshape(shape)

