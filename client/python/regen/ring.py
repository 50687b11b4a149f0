"""A lane's ring (io.regen.Lane): compute calls as binary records in shared
memory beside the worker connection, as proto/ring.h defines them.

The ring lives in a sealed memfd this process maps and hands to the worker;
doorbells go over a datagram socket pair.  Records name buffers and events by
their index in the lane's id table, which the worker keeps and this side
fills with io.regen.Lane.Bind as calls name ids it does not hold yet.

Counters are read and written through ``counters()``, a memoryview of the
mapping cast to native unsigned ints: each item access is one aligned 4-byte
load or store.  ``struct.pack_into`` is not: it zero-fills its bytes before
it writes the value, so the worker, reading the submission counter in
between, saw it at 0, far behind what it had taken, and closed the lane as
a hostile client's ("the submission counter is ahead of the ring").
x86-64 keeps those accesses in program order (loads after loads, stores
after stores); the one ordering it does not keep, a store before a later
load, is forced by taking a lock (a locked instruction) between publishing
and looking at the other side's sleeping flag.  On other machines the
client does not use the ring (``supported()``).
"""

import ctypes
import fcntl
import mmap
import os
import platform
import select
import socket
import struct
import threading
import time

from . import accel, errors

MAGIC = 0x52474E52
VERSION = 3
HEADER_SIZE = 4096
RECORD_SIZE = 1024
COMPLETION_SIZE = 1024
NONE = 0xFFFFFFFF
TRANS_A, TRANS_B, CAUSAL = 0x1, 0x2, 0x4

# Offsets in the header (struct rp_ring_header), and the same as indexes of
# counters().
_SQ_TAIL, _SQ_HEAD, _SQ_SLEEPING, _CQ_TAIL, _CQ_HEAD, _CQ_WAITING = 64, 128, 132, 192, 256, 260
SQ_TAIL, SQ_HEAD, SQ_SLEEPING, CQ_TAIL, CQ_HEAD, CQ_WAITING = (o // 4 for o in (
    _SQ_TAIL, _SQ_HEAD, _SQ_SLEEPING, _CQ_TAIL, _CQ_HEAD, _CQ_WAITING))
# A record: its header (tag, op, flags, epilogue, compute, alignment,
# reserved0, wait, signal, deadline_ms, reserved1, alpha, beta, scale,
# reserved2: 64 bytes), then SLOTS operand slots of 80 bytes (index, dtype,
# rank, reserved, offset, shape[4], strides[4]).  A record is written by one
# pack_into of a Struct made for its slots' ranks (record_struct): the
# reserved fields and the zeros past a shape's or strides' rank are pad
# bytes there, so the call names only the values.
_HEADER_FORMAT = "<QHHBBBxIII4xddd8x"
# Operand slots of a record (proto/compute.h's RP_OP_OPERANDS_MAX).
SLOTS = 11
# An absent slot: index NONE, the rest zeros.
_ABSENT_FORMAT = "I76x"


def _slot_format(rank):
    """A present operand of ``rank`` (0 to 4; regend refuses 0) as index,
    dtype, rank, offset, then the shape's and the strides' ``rank`` values."""
    pad = 8 * (4 - rank)
    return f"IBB2xQ{rank}q{pad}x{rank}q{pad}x"


_SLOT_FORMATS = [_slot_format(r) for r in range(5)]
# Per count of absent slots after an op's last: their fields (NONE each).
_ABSENT_TAILS = [(NONE,) * n for n in range(SLOTS + 1)]
# record_struct()'s Structs by layout; a handful in use (one per op and
# pattern of ranks), bounded all the same.
_RECORD_STRUCTS = {}
_RECORD_STRUCTS_MAX = 256


def record_struct(layout):
    """The Struct of a whole record whose slots hold, in order, operands of
    the ranks in ``layout`` (a tuple; None: an absent slot), every slot past
    them absent.  Its fields: the header's values (no reserved ones), each
    present slot's index, dtype, rank, offset, shape and strides, an absent
    slot's NONE."""
    st = _RECORD_STRUCTS.get(layout)
    if st is None:
        formats = [_ABSENT_FORMAT if r is None else _SLOT_FORMATS[r] for r in layout]
        formats.extend([_ABSENT_FORMAT] * (SLOTS - len(layout)))
        st = struct.Struct(_HEADER_FORMAT + "".join(formats))
        if len(_RECORD_STRUCTS) >= _RECORD_STRUCTS_MAX:
            _RECORD_STRUCTS.clear()
        _RECORD_STRUCTS[layout] = st
    return st


# tag, status, error_len, elapsed_us, error_name; then the error's text
# (at most ERROR_MAX bytes with its NUL), a continuation's head and the
# worker's stage times.
ERROR_MAX = 896
_ERROR_AT = 88
# A completion read in one unpack_from: tag, status, error_len, elapsed_us,
# then (past the error's name and text) head (a continuation's: the number
# of its Run's record) and the stage times: taken_ns, launched_ns,
# finished_ns, published_ns (struct rp_ring_timing).
_COMPLETION = struct.Struct(f"<QIIQ64x{ERROR_MAX}xI4x4Q")
STATUS_OK, STATUS_ERROR, STATUS_CONTINUATION = 0, 1, 2

# io.regen.Program.Run as records (proto/ring.h): the Run's own record, a
# 64-byte header (tag, op, flags, continuations, reserved0, wait, signal,
# deadline_ms, program, journal, nbind, nscalars, journal_offset, seq,
# reserved1) and RUN_ENTRIES entries of 16 bytes; where they do not fit,
# continuation records right after it, a 16-byte header (tag, op, part,
# head) and CONTINUATION_ENTRIES entries. Entries: the bindings (bound
# position, buffer index, offset), then the scalars (bound position, 4
# reserved bytes, value).
OP_PROGRAM = 6
OP_CONTINUATION = 0xFFFF
RUN_RETRY = 0x1
RUN_ENTRIES = 60
CONTINUATION_ENTRIES = 63
CONTINUATIONS_MAX = 16
BOUND_MAX = 1024
_RUN_HEADER = struct.Struct("<QHHHHIIIIIHHQQ8x")
_CONTINUATION_HEADER = struct.Struct("<QHHI")


def run_records(entries):
    """Records a Run of ``entries`` bindings and scalars takes."""
    if entries <= RUN_ENTRIES:
        return 1
    return 1 + (entries - RUN_ENTRIES + CONTINUATION_ENTRIES - 1) // CONTINUATION_ENTRIES


def run_record_bytes(tag, head, flags, wait, signal, deadline_ms, program, journal, journal_offset, seq, bindings,
                     scalars):
    """The records of a Run, each RECORD_SIZE bytes, as proto/ring.h lays
    them out (rp_ring_encode_run writes the same bytes): ``bindings`` a list
    of (bound position, buffer index, offset), ``scalars`` of (bound
    position, value); ``head`` the number the Run's own record gets in the
    ring (its continuations name it), ``tag`` its tag (continuation k gets
    tag + k).  Values a field cannot hold fail the packing (struct.error)."""
    nb, ns = len(bindings), len(scalars)
    flat = [v for b in bindings for v in b]
    flat += [v for sc in scalars for v in sc]
    entries = _entries_struct(nb, ns).pack(*flat)
    n = run_records(nb + ns)
    out = [_RUN_HEADER.pack(tag, OP_PROGRAM, flags, n - 1, 0, wait, signal, deadline_ms, program, journal, nb, ns,
                            journal_offset, seq) + entries[:RUN_ENTRIES * 16]]
    for part in range(1, n):
        at = (RUN_ENTRIES + (part - 1) * CONTINUATION_ENTRIES) * 16
        out.append(_CONTINUATION_HEADER.pack(tag + part, OP_CONTINUATION, part, head)
                   + entries[at:at + CONTINUATION_ENTRIES * 16])
    return [rec + bytes(RECORD_SIZE - len(rec)) for rec in out]


# _entries_struct()'s Structs by counts (a handful in use: one per program).
_ENTRY_STRUCTS = {}


def _entries_struct(nbind, nscalars):
    """The Struct of a Run's entries: ``nbind`` bindings (bound, buffer,
    offset), then ``nscalars`` scalars (bound, 4 reserved bytes, value)."""
    st = _ENTRY_STRUCTS.get((nbind, nscalars))
    if st is None:
        if len(_ENTRY_STRUCTS) >= _RECORD_STRUCTS_MAX:
            _ENTRY_STRUCTS.clear()
        st = _ENTRY_STRUCTS[(nbind, nscalars)] = struct.Struct("<" + "IIQ" * nbind + "I4xd" * nscalars)
    return st

DTYPES = {"f32": 0, "f16": 1, "bf16": 2, "i32": 3}
OP_IDS = {"gemm": 0, "attention": 1, "attention_backward": 2, "layer_norm": 3, "layer_norm_backward": 4}
_EPILOGUES = {"none": 0, "bias": 1, "gelu": 2, "gelu_bias": 3, "dgelu": 4, "gelu_aux": 5, "gelu_aux_bias": 6}
_COMPUTE = {"f32": 0, "tf32": 1}
_ALIGNMENTS = {"top_left": 0, "bottom_right": 1}

# A lane's ring: records between writing one and reading its completion.
ENTRIES = 256

SPIN_MAX_S = 1e-3
# With fewer than four CPUs a spinning client takes the one the worker needs.
SPIN_MAX_FEW_CPUS_S = 10e-6


def supported():
    """Whether this machine orders the ring's accesses as the client needs."""
    return platform.machine() in ("x86_64", "AMD64") and hasattr(os, "memfd_create")


def ring_size(entries):
    return HEADER_SIZE + entries * (RECORD_SIZE + COMPLETION_SIZE)


def counters(mem):
    """The ring's header as 4-byte words (index: offset / 4), for the
    counters and flags the other side reads while this one writes them: an
    item is loaded or stored in one access (a memoryview's item is copied
    as one native unsigned int), never in pieces.  Release it before the
    mapping is closed."""
    return memoryview(mem)[:HEADER_SIZE].cast("I")


def _spin_max():
    default = SPIN_MAX_S if (os.cpu_count() or 1) >= 4 else SPIN_MAX_FEW_CPUS_S
    try:
        v = int(os.environ.get("REGEN_RING_SPIN_US", ""))
        return v * 1e-6 if 0 <= v <= 10_000_000 else default
    except ValueError:
        return default


class Ring:
    """One lane's ring, set up on an open worker Connection."""

    def __init__(self, conn, entries=ENTRIES, ids=256):
        self.conn = conn
        self.entries = entries
        self.mask = entries - 1
        self.nids = ids
        self.sq_tail = 0
        self.cq_head = 0
        self.bound = {}          # id text -> index
        self.by_index = [None] * ids
        self.next_victim = 0
        # Per slot: the number of the Run's record that the record there
        # continues (None: a record of its own), as its completion must say.
        self.continues = [None] * entries
        self.spin_max = _spin_max()
        self.spin = self.spin_max / 2
        # The worker's stage times of the last completion read (taken, launched,
        # finished, published; CLOCK_MONOTONIC ns, as time.monotonic_ns()).
        self.last_timing = (0, 0, 0, 0)
        # Doorbells rung (the worker said it sleeps when a record was
        # published): each one a system call here and a wake-up there.
        self.bells = 0
        self._fence = threading.Lock()
        size = ring_size(entries)
        fd = os.memfd_create("regen-ring", os.MFD_CLOEXEC | os.MFD_ALLOW_SEALING)
        try:
            os.ftruncate(fd, size)
            fcntl.fcntl(fd, fcntl.F_ADD_SEALS, fcntl.F_SEAL_SHRINK | fcntl.F_SEAL_GROW | fcntl.F_SEAL_SEAL)
            self.mem = mmap.mmap(fd, size)
            struct.pack_into("<III", self.mem, 0, MAGIC, VERSION, entries)
            self.ctr = counters(self.mem)
            # The mapping's address for regen._accel (None without it): a
            # ctypes view holds an export of the mapping, dropped before
            # it is closed.
            self._view = ctypes.c_char.from_buffer(self.mem) if accel.module is not None else None
            self.address = ctypes.addressof(self._view) if self._view is not None else None
            mine, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_DGRAM)
            try:
                conn.call("io.regen.Lane.Open", {"entries": entries, "ids": ids, "ring": 0, "doorbell": 1},
                          fds=[fd, theirs.fileno()])
            except BaseException:
                mine.close()
                self._unmap()
                raise
            finally:
                theirs.close()
        finally:
            os.close(fd)
        mine.setblocking(False)
        self.bell = mine

    def close(self):
        if self.bell is not None:
            self.bell.close()
            self.bell = None
            self._unmap()

    def _unmap(self):
        self.address = self._view = None
        self.ctr.release()
        self.mem.close()

    def _fence_now(self):
        with self._fence:
            pass

    # -- the id table --------------------------------------------------------

    def index(self, ident, outstanding, held=()):
        """The index that holds ``ident``, bound first if none does.  An index
        is taken back from another id only with nothing outstanding
        (``outstanding()`` waits for that): a queued record names its
        buffers by index until the worker takes it; and never one in
        ``held``, the indexes the record being built names already (its
        earlier operands'), or it would name this id in their place."""
        i = self.bound.get(ident)
        if i is not None:
            return i
        if len(self.bound) < self.nids:
            i = self.by_index.index(None)
        else:
            outstanding()
            # held is shorter than the table: this ends.
            while True:
                i = self.next_victim % self.nids
                self.next_victim += 1
                if i not in held:
                    break
        # The tables change once the worker took the Bind: one it refuses
        # (an id it does not know) leaves the index to the id it held.
        self.conn.call("io.regen.Lane.Bind", {"index": i, "ids": [ident]})
        old = self.by_index[i]
        if old is not None:
            del self.bound[old]
        self.bound[ident] = i
        self.by_index[i] = ident
        return i

    def forget(self, ident):
        i = self.bound.pop(ident, None)
        if i is not None:
            self.by_index[i] = None

    # -- records ---------------------------------------------------------------

    def full(self):
        # The counters wrap at 2**32, as the worker's (and libregen's)
        # uint32_t do: their difference is taken the same way.
        return (self.sq_tail - self.cq_head) & 0xFFFFFFFF >= self.entries

    def submit(self, header, layout, fields):
        """Writes one record and publishes it.  ``header``: the header's
        values (tag, op, flags, epilogue, compute, alignment, wait, signal,
        deadline_ms, alpha, beta, scale); ``layout`` and ``fields``: its
        operand slots as record_struct() takes them (put_operand and
        put_slot build them)."""
        tail = self.sq_tail
        record_struct(layout).pack_into(self.mem, HEADER_SIZE + (tail & self.mask) * RECORD_SIZE, *header, *fields,
                                        *_ABSENT_TAILS[SLOTS - len(layout)])
        self.continues[tail & self.mask] = None
        self.sq_tail = tail = (tail + 1) & 0xFFFFFFFF
        ctr = self.ctr
        ctr[SQ_TAIL] = tail
        # The locked instruction between publishing and reading the
        # sleeping flag (the module's docstring); acquire and release
        # rather than a with block: the fewest Python steps per record.
        fence = self._fence
        fence.acquire()
        fence.release()
        if ctr[SQ_SLEEPING]:
            self._wake()

    def room(self, records):
        """Whether ``records`` more fit before a completion must be read."""
        return (self.sq_tail - self.cq_head) & 0xFFFFFFFF <= self.entries - records

    def submit_records(self, records):
        """Writes whole records (RECORD_SIZE bytes each, a Run's and its
        continuations: run_record_bytes) into the next slots and publishes
        them together, with one store of the submission counter, so that
        the worker never sees a Run in part.  The caller checked room()."""
        tail = self.sq_tail
        for k, rec in enumerate(records):
            at = HEADER_SIZE + ((tail + k) & self.mask) * RECORD_SIZE
            self.mem[at:at + RECORD_SIZE] = rec
            self.continues[(tail + k) & self.mask] = tail if k else None
        self.sq_tail = tail = (tail + len(records)) & 0xFFFFFFFF
        ctr = self.ctr
        ctr[SQ_TAIL] = tail
        fence = self._fence
        fence.acquire()
        fence.release()
        if ctr[SQ_SLEEPING]:
            self._wake()

    def submit_tensors(self, tag, op, record_scalars, signal, names, tensors, local, kept, bound, dtypes):
        """submit() for a chained call regen._accel encodes from its tensors
        (accel.queue_tensors, which says what it takes); False with nothing
        written where it does not cover the call.  The caller checked the
        ring is not full and that ``address`` is set."""
        tail = self.sq_tail
        sleeping = accel.module.queue_tensors(self.address, self.entries, tail, tag, op, record_scalars, signal, names,
                                              tensors, local, kept, bound, dtypes)
        if sleeping < 0:
            return False
        self.continues[tail & self.mask] = None
        self.sq_tail = (tail + 1) & 0xFFFFFFFF
        if sleeping:
            self._wake()
        return True

    def _wake(self):
        """Rings the doorbell of a worker that said it sleeps (a published
        record waits for it); OSError where the worker's end is gone."""
        self.bells += 1
        try:
            self.bell.send(b"\0")
        except BlockingIOError:
            pass   # a full socket already holds a wake-up

    def _wait_one(self, timeout):
        """Until completion cq_head is published: spin a while, then sleep
        on the doorbell and the connection (whose end means the worker
        went).  A spin that saw the completion doubles the next one's
        length; after a sleep, the next spin covers twice the wait that
        ended it when the longest spin would have, and halves when even
        that would not (as libregen's)."""
        ctr = self.ctr
        head = self.cq_head
        if ctr[CQ_TAIL] != head:
            # There already (a queued call's, read later): a spin that saw it.
            self.spin = min(self.spin * 2 + 1e-6, self.spin_max)
            return
        t0 = time.perf_counter()
        budget = self.spin
        slept = False
        while ctr[CQ_TAIL] == head:
            now = time.perf_counter()
            if now - t0 < budget:
                continue
            ctr[CQ_WAITING] = 1
            self._fence_now()
            if ctr[CQ_TAIL] != head:
                break
            slept = True
            left = None if timeout is None else timeout - (now - t0)
            if left is not None and left <= 0:
                raise TimeoutError("no completion within the timeout")
            # poll, not select: select refuses fds of 1024 or more.
            conn_fd = self.conn.fileno()
            if conn_fd < 0:
                if ctr[CQ_TAIL] == head:
                    raise ConnectionResetError("the worker connection was closed with records in flight")
                break
            p = select.poll()
            p.register(self.bell, select.POLLIN)
            p.register(conn_fd, select.POLLIN)
            ready = {fd for fd, _ in p.poll(None if left is None else max(0, int(left * 1000) + 1))}
            if self.bell.fileno() in ready:
                try:
                    while self.bell.recv(64):
                        pass
                except BlockingIOError:
                    pass
            if conn_fd in ready and ctr[CQ_TAIL] == head:
                raise ConnectionResetError("the worker connection ended with records in flight")
        if slept:
            waited = time.perf_counter() - t0
            self.spin = min(2 * waited, self.spin_max) if waited < self.spin_max else self.spin / 2
        else:
            self.spin = min(self.spin * 2 + 1e-6, self.spin_max)

    def reap(self, timeout=None):
        """The oldest outstanding completion: (tag, elapsed_us, error or
        None, continued).  ``continued``: the completion of a Run's
        continuation, which answers nothing of its own (the Run's record's
        did, just before it); it must name the Run this side wrote it for,
        else ProtocolError."""
        self._wait_one(timeout)
        head = self.cq_head
        slot = head & self.mask
        off = HEADER_SIZE + self.entries * RECORD_SIZE + slot * COMPLETION_SIZE
        (tag, status, error_len, elapsed_us, run_head, taken, launched, finished,
         published) = _COMPLETION.unpack_from(self.mem, off)
        continues = self.continues[slot]
        self.cq_head = (head + 1) & 0xFFFFFFFF
        self.ctr[CQ_HEAD] = self.cq_head
        if status == STATUS_CONTINUATION:
            if continues is None or run_head != continues:
                raise errors.ProtocolError(parameters={
                    "message": f"completion {head} says it continues record {run_head}, which this client did "
                               f"not write it for"})
            return tag, None, None, True
        err = None
        if status:
            err = bytes(self.mem[off + _ERROR_AT:off + _ERROR_AT + min(error_len, ERROR_MAX - 1)])
        self.last_timing = (taken, launched, finished, published)
        return tag, elapsed_us, err, False


def put_operand(layout, fields, op, index, name="operand"):
    """Appends a regen.Operand's slot (``index``: its buffer's in the id
    table) to a record's ``layout`` and ``fields`` (Ring.submit).  What a
    record cannot hold, a rank outside 1 to 4 or strides of another rank, is
    refused here as regend refuses it on Varlink: InvalidParameter naming
    ``name``'s field (a value past 64 bits fails the record's packing:
    unpackable() names it); the rest the worker checks."""
    shape = op.shape
    rank = len(shape)
    dtype = DTYPES.get(op.dtype)
    if dtype is None:
        raise errors.InvalidParameter(parameters={"parameter": f"{name}.dtype"})
    if not 1 <= rank <= 4:
        raise errors.InvalidParameter(parameters={"parameter": f"{name}.shape"})
    strides = op.strides
    if strides is not None and len(strides) != rank:
        raise errors.InvalidParameter(parameters={"parameter": f"{name}.strides"})
    if strides is None:
        if rank == 2:
            strides = (shape[1], 1)
        else:
            strides, step = [0] * rank, 1
            for i in range(rank - 1, -1, -1):
                strides[i] = step
                step *= shape[i] if shape[i] > 0 else 1
    put_slot(layout, fields, index, dtype, op.offset, shape, strides)


def unpackable(operands):
    """The InvalidParameter regend answers on Varlink for the first of
    ``operands`` (name -> Operand) with a value a record's field cannot hold
    (an offset outside 0 to 2**64, a dimension or stride outside 64 bits),
    after Ring.submit's packing refused it; None if none has one."""
    for name, op in operands.items():
        for field, values, low, high in (("offset", (op.offset,), 0, 2**64), ("shape", op.shape, -2**63, 2**63),
                                         ("strides", op.strides or (), -2**63, 2**63)):
            if any(not low <= v < high for v in values):
                return errors.InvalidParameter(parameters={"parameter": f"{name}.{field}"})
    return None


def put_slot(layout, fields, index, dtype, offset, shape, strides):
    """Appends a slot from values already in the record's terms (a dtype
    code from DTYPES, the id table's index, shape and strides in elements,
    of rank 1 to 4) to a record's ``layout`` and ``fields``."""
    rank = len(shape)
    layout.append(rank)
    fields += (index, dtype, rank, offset)
    fields += shape
    fields += strides


def scalars_record(op_name, scalars):
    """(flags, epilogue, compute, alignment, alpha, beta, scale, deadline_ms)
    of a call's scalars as the client's methods build them."""
    return _scalars(op_name, scalars) + (_deadline(scalars),)


def _deadline(scalars):
    """A record's deadline_ms: 0 is regend's default; a deadline the record
    cannot hold is refused here as Varlink would refuse it."""
    d = scalars.get("deadline_ms")
    if d is None:
        return 0
    if type(d) is not int or not 1 <= d <= 0xFFFFFFFF:
        raise errors.InvalidParameter(parameters={"parameter": "deadline_ms"})
    return d


def _scalars(op_name, scalars):
    if op_name == "gemm":
        flags = (TRANS_A if scalars.get("trans_a") else 0) | (TRANS_B if scalars.get("trans_b") else 0)
        # Client.gemm took alpha and beta as finite floats.
        alpha, beta = scalars.get("alpha", 1.0), scalars.get("beta", 0.0)
        return (flags, _EPILOGUES[scalars.get("epilogue", "none")], _COMPUTE[scalars.get("compute", "f32")], 0,
                alpha, beta, 0.0)
    if op_name in ("layer_norm", "layer_norm_backward"):
        # LayerNorm's eps travels as the record's scale.
        return (0, 0, 0, 0, 0.0, 0.0, _record_scale(scalars.get("eps")))
    flags = CAUSAL if scalars.get("causal") else 0
    return (flags, 0, 0, _ALIGNMENTS[scalars.get("causal_alignment", "top_left")], 0.0, 0.0,
            _record_scale(scalars.get("scale")))


def _record_scale(value):
    """A record's scale field for an optional positive scalar: 0 is the
    default (absent); a given 0, which Varlink refuses, goes as NaN, which
    the worker refuses alike."""
    if value is None:
        return 0.0
    value = float(value)
    return float("nan") if value == 0.0 else value


def error_of(text):
    """The regen.Error a completion's Varlink error text names."""
    import json
    try:
        reply = json.loads(text.decode())
        return errors.error_from_reply(reply["error"], reply.get("parameters") or {})
    except (ValueError, KeyError, TypeError, UnicodeDecodeError) as e:
        return errors.ProtocolError(parameters={"message": f"malformed completion: {e}"})
