# SPDX-License-Identifier: Apache-2.0
"""The regend client: lifecycle calls on the main socket, imports and compute
on each device's worker socket.

A Client holds one connection to the main socket and one per device worker,
opened on first use.  When a connection breaks, the call in flight raises
:class:`regen.ConnectionReset` (it may or may not have run) and the next call
connects again, reading Status afresh for the worker's socket.  A connection
found closed by the peer while idle (a worker that was respawned between two
calls) is replaced before the next call is sent, so that call runs normally.  A Client is
for one thread: give each thread its own.
"""

import fcntl
import os
import struct
import sys
import time
import weakref

from . import accel, errors, ops
from . import ring as ringmod
from .varlink import Connection

__all__ = ["Client", "Operand", "Buffer", "Event", "Comm", "Watch", "DEFAULT_SOCKET", "DTYPE_SIZE"]

DEFAULT_SOCKET = "/run/regen/regend.sock"
DTYPE_SIZE = {"f32": 4, "f16": 2, "bf16": 2, "i32": 4}
_EPILOGUES = ("none", "bias", "gelu", "gelu_bias", "dgelu", "gelu_aux", "gelu_aux_bias")
# A ring's lane idle longer than this is checked for a worker gone before
# its next call.
_IDLE_PROBE_S = 0.001
# Calls a Varlink lane has queued (wait=False) before the next waits for the
# oldest's answer: the ring's depth, so that both transports queue alike,
# and under regend's 1024 unanswered calls a connection may hold.
# Unbounded, a client that never waited was refused past those
# (LimitExceeded), and made regend hold ever more replies.
_VARLINK_QUEUE_MAX = ringmod.ENTRIES


class _Object:
    """What every object regend names has: its wire id (``str(obj)``), the
    device and generation it lives in, and whether it was closed."""

    __slots__ = ("id", "device", "generation", "closed")

    def __init__(self, id, device, generation):
        self.id = id
        self.device = device
        self.generation = generation
        self.closed = False

    def __str__(self):
        return self.id

    def _state(self):
        return " closed" if self.closed else ""


class Buffer(_Object):
    """An imported buffer.  ``str(buf)`` is its wire id (``b<dev>.<gen>.<n>``).
    ``keepalive`` is what must stay alive while regend maps the memory (the
    torch tensor of import_tensor); closing the buffer drops it."""

    __slots__ = ("size", "kind", "keepalive", "_on_drop")

    def __init__(self, id, device, generation, size, kind, keepalive=None):
        super().__init__(id, device, generation)
        self.size = size
        self.kind = kind
        self.keepalive = keepalive
        self._on_drop = None

    def _drop(self):
        """regend maps this memory no more: let it go."""
        self.keepalive = None
        on_drop, self._on_drop = self._on_drop, None
        if on_drop is not None:
            on_drop()

    def __repr__(self):
        state = self._state()
        return f"<regen.Buffer {self.id} {self.kind} {self.size} bytes dev={self.device} gen={self.generation}{state}>"


class Event(_Object):
    """An imported CUDA IPC event, for the ``wait_event`` and ``signal_event``
    of compute calls.  ``str(ev)`` is its wire id (``e<dev>.<gen>.<n>``)."""

    __slots__ = ()

    def __repr__(self):
        return f"<regen.Event {self.id} dev={self.device} gen={self.generation}{self._state()}>"


class Comm(_Object):
    """A communicator (io.regen.Comm) on one device: rank ``rank`` of
    ``nranks``.  ``str(comm)`` is its wire id (``c<dev>.<gen>.<n>``).
    ``collectives`` is what Attach reported (None after Init)."""

    __slots__ = ("rank", "nranks", "key", "collectives")

    def __init__(self, id, device, generation, rank, nranks, key=None, collectives=None):
        super().__init__(id, device, generation)
        self.rank = rank
        self.nranks = nranks
        self.key = key
        self.collectives = collectives

    def __repr__(self):
        return (f"<regen.Comm {self.id} rank {self.rank}/{self.nranks} dev={self.device} gen={self.generation}"
                f"{self._state()}>")


def _comm_id(comm):
    return comm.id if isinstance(comm, Comm) else str(comm)


def _buffer_id(buf):
    return buf.id if isinstance(buf, Buffer) else str(buf)


def _event_id(ev):
    return ev.id if isinstance(ev, Event) else str(ev)


def _id_device(ident):
    """The device an id names: "b0.3.17" -> 0.  None if it is not an id."""
    try:
        return int(ident[1:ident.index(".")])
    except (ValueError, IndexError):
        return None


class Operand:
    """A tensor inside an imported buffer: ``buffer`` (a Buffer or an id),
    ``offset`` in bytes, ``dtype`` ("f32", "f16", "bf16"; "i32" for
    attention's sequence lengths), ``shape`` and
    ``strides`` in elements (None = row-major contiguous)."""

    __slots__ = ("buffer", "offset", "dtype", "shape", "strides")

    def __init__(self, buffer, offset=0, dtype="f32", shape=(), strides=None):
        if dtype not in DTYPE_SIZE:
            raise ValueError(f"dtype {dtype!r} is not one of {sorted(DTYPE_SIZE)}")
        self.buffer = buffer
        self.offset = int(offset)
        self.dtype = dtype
        self.shape = [int(x) for x in shape]
        self.strides = None if strides is None else [int(x) for x in strides]

    @classmethod
    def trusted(cls, buffer, offset, dtype, shape, strides):
        """An Operand from fields already of the right types (a known dtype,
        int offset, lists of ints), as regen.torch builds them per call:
        without the constructor's conversions.  regend checks every operand
        regardless."""
        o = cls.__new__(cls)
        o.buffer, o.offset, o.dtype, o.shape, o.strides = buffer, offset, dtype, shape, strides
        return o

    @property
    def device(self):
        if isinstance(self.buffer, Buffer):
            return self.buffer.device
        return _id_device(str(self.buffer))

    def to_wire(self):
        w = {"buffer": _buffer_id(self.buffer), "dtype": self.dtype, "shape": self.shape}
        if self.offset:
            w["offset"] = self.offset
        if self.strides is not None:
            w["strides"] = self.strides
        return w

    def transposed(self):
        """The same memory seen as its transpose (2-D only); strides swap."""
        if len(self.shape) != 2:
            raise ValueError("transposed() needs a 2-D operand")
        st = self.strides or [self.shape[1], 1]
        return Operand(self.buffer, self.offset, self.dtype, self.shape[::-1], st[::-1])

    def __repr__(self):
        return (f"Operand({_buffer_id(self.buffer)!r}, offset={self.offset}, dtype={self.dtype!r}, "
                f"shape={self.shape}, strides={self.strides})")


class Watch:
    """Generation changes as they happen, on a connection of its own.  The
    first event is the current state of each device (reason "subscribed");
    iterate, or call ``next(timeout)``.  Close it (or use ``with``) when done."""

    def __init__(self, socket_path, timeout=None):
        self._conn = Connection(socket_path, timeout=timeout)
        self._conn.send("io.regen.Device.Watch", more=True)
        self._done = False

    def next(self, timeout=None):
        """The next event (a dict: epoch, device, generation, state, reason).
        Raises TimeoutError after ``timeout`` seconds (the watch stays open),
        StopIteration when regend ends the stream, ConnectionReset if it broke."""
        if self._done:
            raise StopIteration
        self._conn.settimeout(timeout)
        try:
            params, continues = self._conn.receive()
        except errors.Error:
            # An error reply ends the call (LimitExceeded, Draining): the
            # next next() is StopIteration, not a wait for ever.
            self._done = True
            raise
        if not continues:
            self._done = True
        return params

    def __iter__(self):
        return self

    def __next__(self):
        if self._done:
            raise StopIteration
        return self.next()

    def close(self):
        self._done = True
        self._conn.close()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()


_live_clients = weakref.WeakSet()


def _after_fork_in_child():
    for c in list(_live_clients):
        c._forget_after_fork()


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_after_fork_in_child)


class _Lane:
    """A device's lane on its worker connection: compute calls over its ring
    or as Varlink calls, counted by tickets; answers are read in order."""

    __slots__ = ("conn", "ring", "open_ring", "decided", "transport_epoch", "submitted", "completed", "error",
                 "error_ticket", "elapsed_us", "idle_since")

    def __init__(self, conn):
        self.conn = conn
        self.ring = None          # the one in use; None: Varlink
        self.open_ring = None     # the connection's, used or not
        self.decided = False
        self.transport_epoch = 0   # the client's when it was decided
        self.submitted = 0
        self.completed = 0
        self.error = None         # the first error not raised yet
        self.error_ticket = 0     # the call it answered
        self.elapsed_us = None
        self.idle_since = time.monotonic()

    def close(self):
        if self.open_ring is not None:
            self.open_ring.close()
        self.ring = self.open_ring = None


class Client:
    """Talks to one regend.  ``socket_path`` defaults to $REGEN_SOCKET, then
    /run/regen/regend.sock.  ``timeout`` (seconds, None = wait forever)
    bounds each call; a call that times out closes its connection.

    ``auto_reimport``: when a call that names torch tensors fails with
    StaleGeneration, import those tensors again and retry once (off by
    default: a rank usually wants to know its ids went stale).  Only the
    call's own StaleGeneration is retried: the answer of a blocking call,
    or the refusal of an id it names as it is queued (on the ring, the
    Bind of an id new to the lane; the retry is queued as the call was,
    ``wait=False`` too).  The answer of a call queued with ``wait=False``
    comes after the call returned: its error stays its own, raised by the
    wait (or the blocking call) that reads it.

    ``job``: the job this client works for, in its own words ($REGEN_JOB
    by default), stated on every connection it opens (io.regen.SetJob; see
    :meth:`set_job`).  A job regend refuses raises :class:`regen.InvalidJob`
    from the call that opened the connection."""

    def __init__(self, socket_path=None, timeout=None, auto_reimport=False, reconnect_wait=10.0, transport=None,
                 job=None):
        self.socket_path = socket_path or os.environ.get("REGEN_SOCKET") or DEFAULT_SOCKET
        self.job = job if job is not None else (os.environ.get("REGEN_JOB") or None)
        self._job_unsupported = False
        # How compute calls reach a worker: "ring" (io.regen.Lane, shared
        # memory), "varlink", or "auto" (the ring where the worker offers
        # it); $REGEN_TRANSPORT by default.
        self.transport = transport or os.environ.get("REGEN_TRANSPORT") or "auto"
        if self.transport not in ("auto", "ring", "varlink"):
            raise ValueError(f"transport {self.transport!r} is not 'auto', 'ring' or 'varlink'")
        self._lanes = {}          # device -> _Lane
        self.accel_calls = 0      # compute calls on torch tensors regen._accel encoded
        self._transport_epoch = 0  # bumped by set_transport
        self.timeout = timeout
        self.auto_reimport = auto_reimport
        self.reconnect_wait = reconnect_wait
        self._main = None
        self._workers = {}        # device -> Connection
        self._worker_paths = {}   # device -> worker socket path
        self._forget_objects()
        _live_clients.add(self)

    def _forget_objects(self):
        """What this process holds in regend, as the client knows it."""
        self._generations = {}    # device -> last generation seen
        self._buffers = {}        # id -> Buffer
        self._tensor_buffers = {}  # (device, storage data_ptr) -> Buffer
        # Bumped whenever _tensor_buffers or a generation changes: the
        # address spans regen._accel looks tensors up in are built again.
        self._tensor_epoch = getattr(self, "_tensor_epoch", 0) + 1
        self._spans, self._spans_epoch = {}, None
        self._events = {}         # id -> Event
        # torch IPC counters of imports whose answer was lost: (device,
        # generation then, counter).
        self._unsure_counters = []

    def _forget_after_fork(self):
        """In a forked child: the connections are the parent's (a call here
        would interleave with the parent's on the same sockets) and the
        objects are the parent process's (regend knows them by its pid).
        The child closes its copies of the sockets (the parent's stay open)
        and of the rings' mappings, forgets the rest without a call, and
        connects afresh when it calls."""
        self.close()
        self._forget_objects()

    # -- connections -------------------------------------------------------

    def close(self):
        """Close every connection.  Imported buffers stay valid in regend
        until this process exits, closes them or their generation ends."""
        if self._main is not None:
            self._main.close()
            self._main = None
        for conn in self._workers.values():
            conn.close()
        self._workers.clear()
        for lane in self._lanes.values():
            lane.close()
        self._lanes.clear()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    def _state_job(self, conn):
        """Says the client's job on a connection just opened (nothing to a
        regend without SetJob: the job is metadata, not worth failing for)."""
        if not self.job or self._job_unsupported:
            return
        try:
            conn.call("io.regen.SetJob", {"job": self.job})
        except errors.MethodNotFound:
            self._job_unsupported = True
        except BaseException:
            conn.close()
            raise

    def set_job(self, job):
        """States ``job`` (1 to 64 bytes of A-Z a-z 0-9 and . _ - : / @ + =,
        the first a letter or a digit; None forgets it) as the job this
        client works for, at once on the main connection and on every
        worker connection it has or opens.  regend names the client's work
        by it in Status, metrics, lifecycle reasons and logs where the
        client's cgroup names no job (the cgroup's wins; both are shown
        where they differ), and never grants anything for it.  Returns what
        regend answered: the job that names the main connection and its
        source.  A job regend refuses raises :class:`regen.InvalidJob` and
        changes nothing."""
        reply = self._main_call("io.regen.SetJob", {"job": job} if job else {})
        self.job = job or None
        self._job_unsupported = False
        for device, conn in list(self._workers.items()):
            self._settle(device)
            try:
                conn.call("io.regen.SetJob", {"job": job} if job else {})
            except errors.ConnectionReset:
                # States the job when it is opened again.
                self._workers.pop(device, None)
                self._drop_lane(device)
        return reply

    def _main_call(self, method, params=None):
        if self._main is None or not self._main.alive():
            if self._main is not None:
                self._main.close()
            self._main = Connection(self.socket_path, timeout=self.timeout)
            try:
                self._state_job(self._main)
            except BaseException:
                self._main = None
                raise
        try:
            reply = self._main.call(method, params)
        except errors.ConnectionReset:
            self._main = None
            raise
        self._note_devices(reply)
        return reply

    def _worker_path_here(self, reported):
        """Status's worker socket (regend's view of the filesystem) from
        here: beside the main socket this client uses, where regend puts it
        (PATH.devN), so a container that mounts /run/regen elsewhere reaches
        it at its own path."""
        if not reported or "/" not in reported:
            return reported
        return os.path.join(os.path.dirname(self.socket_path), os.path.basename(reported))

    def _note_devices(self, reply):
        for d in reply.get("devices", ()) or ():
            idx = d.get("index")
            if idx is None:
                continue
            if d.get("worker_socket"):
                self._worker_paths[idx] = d["worker_socket"]
            if "generation" in d:
                self._note_generation(idx, d["generation"])

    def _note_generation(self, device, generation):
        """Forget cached imports of ``device`` made before ``generation``:
        regend no longer knows them."""
        old = self._generations.get(device)
        self._generations[device] = generation
        if old is not None and generation <= old:
            return
        for key, buf in list(self._tensor_buffers.items()):
            if buf.device == device and buf.generation < generation:
                del self._tensor_buffers[key]
        self._tensor_epoch += 1
        # A new generation unmapped every older import of the device: what
        # kept their memory alive can go (the ids still raise StaleGeneration).
        for bid, buf in list(self._buffers.items()):
            if buf.device == device and buf.generation < generation:
                del self._buffers[bid]
                buf._drop()
        for eid, ev in list(self._events.items()):
            if ev.device == device and ev.generation < generation:
                del self._events[eid]
        for held in [u for u in self._unsure_counters if u[0] == device and u[1] < generation]:
            self._unsure_counters.remove(held)
            _release_ipc_counter(*held[2])

    def _worker(self, device):
        conn = self._workers.get(device)
        lane = self._lanes.get(device)
        if lane is not None and lane.completed < lane.submitted and lane.conn is conn:
            return conn   # answers are outstanding on it: alive() would read them
        if conn is not None and conn.alive():
            return conn
        if conn is not None:
            conn.close()
        self._workers.pop(device, None)
        self._drop_lane(device)
        # (Re)connecting: read the worker's socket afresh, and wait out a
        # respawn in progress rather than fail the call on a missing socket.
        deadline = time.monotonic() + self.reconnect_wait
        while True:
            status = self._main_call("io.regen.Device.Status")
            info = next((d for d in status.get("devices", ()) if d.get("index") == device), None)
            if info is None:
                raise errors.NoSuchDevice(parameters={
                    "device": device,
                    "message": f"regend at {self.socket_path} serves no device {device} "
                               f"(devices: {[d.get('index') for d in status.get('devices', ())]})"})
            try:
                conn = Connection(self._worker_path_here(info["worker_socket"]), timeout=self.timeout)
                self._state_job(conn)
                break
            except errors.Unavailable:
                if time.monotonic() >= deadline:
                    raise
                time.sleep(0.05)
        self._workers[device] = conn
        return conn

    def _abandon_worker(self, device, conn):
        """A call on worker connection ``conn`` was interrupted before its
        reply: the connection must go (the reply would answer the next
        call).  The worker closes a process's buffers and events with its
        last connection, so the next one is opened first (best effort),
        then this one closed: the imports outlive the interruption."""
        try:
            if self._workers.get(device) is conn:
                del self._workers[device]
                lane = self._lanes.get(device)
                if lane is not None and lane.conn is conn:
                    self._drop_lane(device)
                self._worker(device)
        except Exception:
            pass   # the next call connects again; the imports may be gone then
        finally:
            conn.close()

    def _worker_call(self, device, method, params, fds=()):
        self._settle(device)
        conn = self._worker(device)
        try:
            return conn.call(method, params, fds, abandon=lambda: self._abandon_worker(device, conn))
        except errors.ConnectionReset:
            self._workers.pop(device, None)
            self._drop_lane(device)
            raise
        except (errors.StaleGeneration, errors.DeviceLost, errors.Draining) as e:
            self._note_error(device, e)
            raise

    def _note_error(self, device, e):
        if isinstance(e, (errors.StaleGeneration, errors.DeviceLost, errors.Draining)):
            gen = e.parameters.get("generation")
            dev = e.parameters.get("device", device)
            if isinstance(gen, int) and isinstance(dev, int):
                self._note_generation(dev, gen)

    # -- lanes: compute calls over the ring or Varlink -----------------------

    def _drop_lane(self, device):
        lane = self._lanes.pop(device, None)
        if lane is not None:
            lane.close()

    def _lane(self, device):
        """The device's lane, its transport picked on the connection's first
        compute call."""
        lane = self._lanes.get(device)
        # A switch asked for while calls were outstanding applies once
        # they are answered.
        if lane is not None and lane.completed == lane.submitted and lane.transport_epoch != self._transport_epoch:
            lane.decided = False
        # A ring's lane busy a moment ago is not probed again (a worker gone
        # shows in the wait, as the connection ends); an idle one is, so
        # that a worker respawned in between is found before the call.
        if lane is not None and (lane.completed < lane.submitted or
                                 (lane.decided and lane.conn is self._workers.get(device) and not lane.conn.closed and
                                  ((lane.ring is not None and time.monotonic() - lane.idle_since < _IDLE_PROBE_S)
                                   or lane.conn.alive()))):
            return lane
        conn = self._worker(device)
        lane = self._lanes.get(device)
        if lane is None or lane.conn is not conn:
            lane = _Lane(conn)
            self._lanes[device] = lane
        if not lane.decided:
            self._pick_transport(device, lane)
        return lane

    def _pick_transport(self, device, lane):
        lane.transport_epoch = self._transport_epoch
        lane.ring = None
        if self.transport != "varlink":
            if lane.open_ring is None and ringmod.supported():
                try:
                    offered = "io.regen.Lane" in lane.conn.call("org.varlink.service.GetInfo").get("interfaces", ())
                except errors.ConnectionReset:
                    raise
                except errors.Error:
                    offered = False
                if offered:
                    lane.open_ring = ringmod.Ring(lane.conn)
            if lane.open_ring is not None:
                lane.ring = lane.open_ring
            elif self.transport == "ring":
                raise errors.ProtocolError(parameters={
                    "message": f"the worker of device {device} offers no ring (io.regen.Lane), or this machine "
                               "cannot use one, and the transport is forced to ring"})
        lane.decided = True

    def set_transport(self, transport):
        """"auto", "ring" or "varlink" from the next call on (a lane with
        calls outstanding switches after them).  A connection keeps the ring
        it opened for when it is wanted again."""
        if transport not in ("auto", "ring", "varlink"):
            raise ValueError(f"transport {transport!r} is not 'auto', 'ring' or 'varlink'")
        self.transport = transport
        # Each lane picks again on its next call made with nothing
        # outstanding (_lane).
        self._transport_epoch += 1

    def lane_transport(self, device):
        """"ring" or "varlink": what ``device``'s lane uses now (None before
        its first compute call)."""
        lane = self._lanes.get(device)
        if lane is None or not lane.decided:
            return None
        if lane.completed == lane.submitted and lane.transport_epoch != self._transport_epoch:
            return None   # picks again on its next call
        return "ring" if lane.ring is not None else "varlink"

    def last_timing(self, device):
        """Where ``device``'s last call answered over the ring spent its time
        in the worker: a dict of taken_ns, launched_ns, finished_ns and
        published_ns (CLOCK_MONOTONIC, the clock of time.monotonic_ns(); 0
        for a stage the record never reached, finished_ns 0 for a record
        answered before its work ended, as a Timeout is), or None where the
        lane is on Varlink or has answered nothing."""
        lane = self._lanes.get(device)
        if lane is None or lane.ring is None or not any(lane.ring.last_timing):
            return None
        return dict(zip(("taken_ns", "launched_ns", "finished_ns", "published_ns"), lane.ring.last_timing))

    def _lane_broken(self, device, lane, what):
        self._workers.pop(device, None)
        lane.conn.close()
        self._drop_lane(device)
        return errors.ConnectionReset(parameters={
            "message": f"connection to device {device}'s worker broke {what}; calls in flight may or may not "
                       "have run"})

    def _reap(self, device, lane):
        """Reads the oldest outstanding answer, keeping the first error."""
        try:
            continued = False
            if lane.ring is not None:
                tag, elapsed, err, continued = lane.ring.reap(self.timeout)
                lane.completed += 1
                if tag != lane.completed:
                    raise errors.ProtocolError(parameters={
                        "message": f"record {tag} completed where {lane.completed} was next"})
                e = ringmod.error_of(err) if err is not None else None
            else:
                try:
                    params, _ = lane.conn.receive()
                    e, elapsed = None, params.get("elapsed_us")
                except errors.ConnectionReset:
                    raise
                except errors.Error as x:
                    e, elapsed = x, None
                lane.completed += 1
        except (ConnectionResetError, errors.ConnectionReset, OSError) as x:
            raise self._lane_broken(device, lane, "while waiting for completions") from x
        except TimeoutError as x:
            raise self._lane_broken(device, lane, "past the timeout") from x
        if e is not None:
            self._note_error(device, e)
            if lane.error is None:
                lane.error, lane.error_ticket = e, lane.completed
        elif not continued:
            # A Run's continuations answer nothing: its time is its own
            # record's, read just before them.
            lane.elapsed_us = elapsed
        # What _lane reads once every answer is in: the time of the last.
        if lane.completed == lane.submitted:
            lane.idle_since = time.monotonic()

    def _drain(self, device):
        """Reads every answer outstanding on ``device``'s lane, ring or
        Varlink, keeping their first error for the next wait(): before an
        index of the ring's id table is taken back or an id closed, which a
        queued record may still name."""
        lane = self._lanes.get(device)
        while lane is not None and lane.completed < lane.submitted:
            self._reap(device, lane)

    def _settle(self, device):
        """Varlink answers outstanding on the lane come before another call
        on its connection (their error waits for the next wait())."""
        lane = self._lanes.get(device)
        while lane is not None and lane.ring is None and lane.completed < lane.submitted:
            self._reap(device, lane)

    def wait(self, device, ticket=None):
        """Waits for the calls queued on ``device``'s lane (with
        ``wait=False``) up to ``ticket`` (default: all); raises the first
        error among them.  Returns the elapsed_us of the last one answered."""
        lane = self._lanes.get(device)
        if lane is None:
            return None
        e, _ = self._collect(device, lane, lane.submitted if ticket is None else ticket)
        if e is not None:
            raise e
        return lane.elapsed_us

    def _collect(self, device, lane, ticket):
        """Reads the answers up to ``ticket``; returns their first error
        (None if none), now the caller's, and the ticket of its call."""
        while lane.completed < ticket:
            self._reap(device, lane)
        e, lane.error = lane.error, None
        return e, lane.error_ticket

    def _queue_varlink(self, device, lane, method, params):
        """Sends a call on a Varlink lane without waiting for its answer;
        its ticket."""
        while lane.submitted - lane.completed >= _VARLINK_QUEUE_MAX:
            self._reap(device, lane)
        try:
            lane.conn.send(method, params)
        except errors.ConnectionReset:
            self._workers.pop(device, None)
            self._drop_lane(device)
            raise
        lane.submitted += 1
        return lane.submitted

    def _submit(self, device, op_name, op, given, scalars, wait_event, signal_event):
        lane = self._lane(device)
        if lane.ring is None:
            params = {n: o.to_wire() for n, o in given.items()}
            params.update(scalars)
            if wait_event is not None:
                params["wait_event"] = _event_id(wait_event)
            if signal_event is not None:
                params["signal_event"] = _event_id(signal_event)
            self._queue_varlink(device, lane, op.method, params)
            return lane
        ring = lane.ring
        bound = ring.bound
        layout, fields, held = [], [], []
        for name in ops.SLOT_NAMES[op_name]:
            o = given.get(name)
            if o is None:
                layout.append(None)
                fields.append(ringmod.NONE)
                continue
            b = o.buffer
            ident = b.id if type(b) is Buffer else _buffer_id(b)
            index = bound.get(ident)
            if index is None:
                index = self._ring_index(device, ring, ident, held)
            else:
                held.append(index)
            ringmod.put_operand(layout, fields, o, index, name)
        try:
            self._ring_submit(device, lane, op_name, layout, fields, ringmod.scalars_record(op_name, scalars),
                              wait_event, signal_event, held)
        except struct.error:
            # Nothing was published: the record's packing stopped first.
            refusal = ringmod.unpackable(given)
            if refusal is None:
                raise
            raise refusal from None
        return lane

    def _ring_index(self, device, ring, ident, held):
        """The index of the lane's id table that holds the id ``ident``,
        bound first where none does (after the calls outstanding, when an
        index must be taken back, and never one of ``held``, the record's
        indexes so far); added to ``held``."""
        i = ring.bound.get(ident)
        if i is None:
            lane = self._lanes.get(device)
            try:
                # The queued calls' error stays theirs, for their wait().
                i = ring.index(ident, lambda: self._drain(device), held)
            except (errors.ConnectionReset, ConnectionError) as x:
                # The Bind met a worker gone: the lane goes with its
                # connection, as when a completion's wait meets it, so the
                # next call starts on a new one (the lane, its calls
                # outstanding, had been kept and served every retry the
                # dead connection).
                if lane is not None and lane.ring is ring:
                    raise self._lane_broken(device, lane, "while binding an id") from x
                raise
            except errors.Error as x:
                # A StaleGeneration here is the news a call's own would
                # bring: the imports of the older generation are gone, and
                # auto_reimport's retry imports them again.
                self._note_error(device, x)
                raise
        held.append(i)
        return i

    def _ring_submit(self, device, lane, op_name, layout, fields, record_scalars, wait_event, signal_event, held):
        """Writes the record of a call whose operand slots are in ``layout``
        and ``fields`` (ring.put_operand, ring.put_slot), ``held`` their
        indexes, and counts it submitted."""
        ring = lane.ring
        wait_i = (self._ring_index(device, ring, _event_id(wait_event), held) if wait_event is not None
                  else ringmod.NONE)
        signal_i = (self._ring_index(device, ring, _event_id(signal_event), held) if signal_event is not None
                    else ringmod.NONE)
        flags, epilogue, compute, alignment, alpha, beta, scale, deadline_ms = record_scalars
        while ring.full():
            self._reap(device, lane)
        try:
            ring.submit((lane.submitted + 1, ringmod.OP_IDS[op_name], flags, epilogue, compute, alignment, wait_i,
                         signal_i, deadline_ms, alpha, beta, scale), tuple(layout), fields)
        except OSError as x:   # the worker's end of the doorbell is gone with it
            raise self._lane_broken(device, lane, "as a call was queued") from x
        lane.submitted += 1

    def queue_encoded(self, device, op_name, slots, record_scalars, signal_event=None):
        """Queues one compute call on ``device``'s ring without waiting for
        its answer (as ``wait=False``), its operands given already in the
        record's terms: ``slots`` has, per operand slot of the op (ops.OPS
        order), None or (buffer, dtype code, offset in bytes, shape,
        strides), shape and strides in elements; ``record_scalars`` is
        ring.scalars_record()'s tuple.  For a caller that builds many calls
        from tensors it has resolved itself (regen.torch's runs of calls):
        no Operand, no per-method checks; regend checks every record
        regardless.  Returns the ticket, or None (nothing queued) where the
        lane is not on the ring: the op's method takes the call then."""
        lane = self._lane(device)
        ring = lane.ring
        if ring is None:
            return None
        bound = ring.bound
        layout, fields, held = [], [], []
        for slot in slots:
            if slot is None:
                layout.append(None)
                fields.append(ringmod.NONE)
                continue
            b, dtype, offset, shape, strides = slot
            ident = b.id if type(b) is Buffer else _buffer_id(b)
            index = bound.get(ident)
            if index is None:
                index = self._ring_index(device, ring, ident, held)
            else:
                held.append(index)
            ringmod.put_slot(layout, fields, index, dtype, offset, shape, strides)
        self._ring_submit(device, lane, op_name, layout, fields, record_scalars, None, signal_event, held)
        return lane.submitted

    def doorbells(self):
        """Doorbells rung on the lanes' rings open now (a ring opened again
        counts from 0): how often a record found the worker asleep."""
        return sum(lane.open_ring.bells for lane in self._lanes.values() if lane.open_ring is not None)

    def queue_tensors(self, device, op_name, names, tensors, local, kept, dtypes, record_scalars, signal_event=None):
        """queue_encoded's work done in C by regen._accel straight from the
        tensors: ``names`` the op's operand slots in order, ``tensors`` name
        -> tensor or None, all on torch device ``local`` (-1: host memory)
        and each inside one of ``kept``'s (start, end, Buffer) chunks,
        ``dtypes`` torch dtype -> ring dtype code.  Returns the ticket, or
        None with nothing queued where the accelerator is not loaded, the
        lane is not on the ring, or an operand is not covered (outside the
        chunks, its buffer or the signal event not bound on the lane, an
        unknown dtype, another device, rank 0 or over 4): queue_encoded or the
        op's method takes the call then."""
        if accel.module is None:
            return None
        lane = self._lane(device)
        ring = lane.ring
        if ring is None or ring.address is None:
            return None
        signal = ringmod.NONE
        if signal_event is not None:
            signal = ring.bound.get(_event_id(signal_event))
            if signal is None:
                return None
        while ring.full():
            self._reap(device, lane)
        try:
            if not ring.submit_tensors(lane.submitted + 1, ringmod.OP_IDS[op_name], record_scalars, signal, names,
                                       tensors, local, kept, ring.bound, dtypes):
                return None
        except OSError as x:   # the worker's end of the doorbell is gone with it
            raise self._lane_broken(device, lane, "as a call was queued") from x
        lane.submitted += 1
        return lane.submitted

    def call(self, method, parameters=None, device=None, fds=()):
        """A raw Varlink call: on the main socket, or on ``device``'s worker
        socket.  Returns the reply's parameters; errors raise as usual."""
        if device is None:
            if fds:
                raise ValueError("the main socket takes no file descriptors")
            return self._main_call(method, parameters)
        return self._worker_call(device, method, parameters, fds)

    # -- io.regen.Program (worker socket) -----------------------------------

    def define_program(self, device, definition):
        """Defines a program (a dict as regen.program.ProgramBuilder makes)
        on ``device``; returns a regen.program.Program. regend checks it
        whole: a wrong one raises InvalidProgram naming the node and why."""
        from .program import Program
        return Program(device, self._worker_call(device, "io.regen.Program.Define", definition, ()), definition)

    def run_program(self, program, bind, scalars=None, wait_event=None, signal_event=None, deadline_ms=None,
                    journal=None, seq=None, retry=False, wait=True):
        """Runs ``program`` once, on its device's lane in order with the
        lane's other calls: over the lane's ring where it has one (the Run's
        record and, for many bindings, its continuations), else as a Varlink
        call. ``bind`` maps each input, output and inout name to a torch
        CUDA tensor, an Operand or a (buffer, byte offset) pair, ``scalars``
        each scalar name to a number. Returns the reply ({"elapsed_us"}):
        the work finished, or with ``signal_event`` it is enqueued and the
        event fires when it finishes; with ``wait=False``, the Run's ticket
        at once (wait() reads its answer), as the compute calls' (a Run that
        must go as a blocking Varlink call on a ring's lane, one naming more
        ids than the lane's id table holds, has been answered by then).
        Torch tensors are not synchronized here: order the rank's work with
        wait_event, or synchronize before. ``journal`` (bound like a tensor,
        at least ``program.journal_bytes``) and ``seq`` make a Run of a
        program that updates in place safe to retry after a fault: the
        retry, with ``retry=True`` and the same seq, applies its updates
        exactly once (regen.program.run_exactly_once does it all)."""
        from .program import bound_at
        device = program.device
        binds = {name: bound_at(self, x) for name, x in bind.items()}
        journal = bound_at(self, journal) if journal is not None else None
        wait_id = str(getattr(wait_event, "id", wait_event)) if wait_event is not None else None
        signal_id = str(getattr(signal_event, "id", signal_event)) if signal_event is not None else None
        lane = self._lane(device)
        if lane.ring is not None:
            ticket = self._ring_run(device, lane, program, binds, scalars, wait_id, signal_id, deadline_ms, journal,
                                    seq, retry)
            if ticket is not None:
                if not wait:
                    return ticket
                e, _ = self._collect(device, lane, ticket)
                if e is not None:
                    raise e
                return {"elapsed_us": lane.elapsed_us}
            # More ids than the lane's table holds: a Varlink call, once
            # the ring's calls are answered (their error waits for wait()).
            self._drain(device)
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
        if seq is not None:
            params["seq"] = int(seq)
        if retry:
            params["retry"] = True
        if not wait and lane.ring is None:
            return self._queue_varlink(device, lane, "io.regen.Program.Run", params)
        reply = self._worker_call(device, "io.regen.Program.Run", params, ())
        return reply if wait else lane.submitted

    def _ring_run(self, device, lane, program, binds, scalars, wait_id, signal_id, deadline_ms, journal, seq,
                  retry):
        """Queues a Run on the lane's ring: its ticket (a Run of n records
        takes n tickets, its own the last), or None with nothing queued where
        it names more ids than the lane's id table holds. ``binds``: name ->
        (buffer id, offset), ``journal`` likewise. What a record cannot say
        is refused here as regend refuses it on Varlink: a name the program
        does not bind, an absent seq or journal beside the other (a record's
        0 means none), values past a field's width."""
        ring = lane.ring
        if len(binds) + 4 > ring.nids:
            needed = {program.id, *(ident for ident, _ in binds.values())}
            needed.update(x for x in (wait_id, signal_id, journal and journal[0]) if x)
            if len(needed) > ring.nids:
                return None
        if (journal is None) != (seq is None):
            raise errors.InvalidParameter(parameters={"parameter": "journal" if journal is None else "seq"})
        positions = program.positions
        values = []
        for name, v in (scalars or {}).items():
            pos = positions.get(name)
            if pos is None:
                raise errors.InvalidParameter(parameters={"parameter": f"scalars.{name}"})
            values.append((pos, float(v)))
        held = []
        index = ring.bound.get
        program_i = self._ring_index(device, ring, program.id, held)
        bindings = []
        for name, (ident, offset) in binds.items():
            pos = positions.get(name)
            if pos is None:
                raise errors.InvalidParameter(parameters={"parameter": f"bind.{name}"})
            i = index(ident)
            if i is None:
                i = self._ring_index(device, ring, ident, held)
            else:
                held.append(i)
            bindings.append((pos, i, offset))
        wait_i = self._ring_index(device, ring, wait_id, held) if wait_id is not None else ringmod.NONE
        signal_i = self._ring_index(device, ring, signal_id, held) if signal_id is not None else ringmod.NONE
        journal_i = self._ring_index(device, ring, journal[0], held) if journal is not None else ringmod.NONE
        deadline = ringmod._deadline({"deadline_ms": deadline_ms})
        try:
            records = ringmod.run_record_bytes(lane.submitted + 1, ring.sq_tail, ringmod.RUN_RETRY if retry else 0,
                                               wait_i, signal_i, deadline, program_i, journal_i,
                                               journal[1] if journal is not None else 0,
                                               int(seq) if seq is not None else 0, bindings, values)
        except struct.error:
            raise _unpackable_run(binds, journal, seq) from None
        while not ring.room(len(records)):
            self._reap(device, lane)
        # The records name the ring's number of the Run's own record: the
        # reaps above moved nothing of the submission side.
        try:
            ring.submit_records(records)
        except OSError as x:   # the worker's end of the doorbell is gone with it
            raise self._lane_broken(device, lane, "as a Run was queued") from x
        lane.submitted += len(records)
        return lane.submitted

    def drop_program(self, program):
        # A queued Run names it: that Run is taken first (as a queued call's
        # answer is read first), and its index is not given to another id
        # while one might.
        self._drain(program.device)
        self._worker_call(program.device, "io.regen.Program.Drop", {"program": program.id}, ())
        lane = self._lanes.get(program.device)
        if lane is not None and lane.open_ring is not None:
            lane.open_ring.forget(program.id)

    def program_status(self, device, program=None):
        """Status of one program, or of every program of this process on
        ``device``: a list of dicts (runs, run_us, scratch_bytes, modules,
        kernels, graph_captures, graph_launches, stream_runs, not_captured)."""
        params = {} if program is None else {"program": program.id}
        return self._worker_call(device, "io.regen.Program.Status", params, ())["programs"]

    # -- io.regen.Device (main socket) -------------------------------------

    def status(self):
        """{"epoch", "devices": [DeviceInfo...]} (see io.regen.Device)."""
        return self._main_call("io.regen.Device.Status")

    def generation(self):
        """{"epoch", "devices"}: cheap enough to poll."""
        return self._main_call("io.regen.Device.Generation")

    def device_info(self, device):
        for d in self.status()["devices"]:
            if d["index"] == device:
                return d
        raise errors.NoSuchDevice(parameters={"device": device, "message": f"no device {device}"})

    def info(self):
        """org.varlink.service.GetInfo."""
        return self._main_call("org.varlink.service.GetInfo")

    def watch(self, timeout=None):
        """A :class:`Watch` on its own connection, subscribed when this returns."""
        return Watch(self.socket_path, timeout=timeout)

    def _lifecycle(self, method, device, reason, extra=None):
        params = {}
        if device is not None:
            params["device"] = int(device)
        if reason is not None:
            params["reason"] = str(reason)
        if extra:
            params.update(extra)
        return self._main_call(method, params)

    def release(self, device=None, reason=None, deadline_ms=None):
        """Drain and release (CUDA usable).  Bumps the generation.  The
        protocol has no deadline for Release: ``deadline_ms`` must be None."""
        if deadline_ms is not None:
            raise TypeError("io.regen.Device.Release takes no deadline; use restart(deadline_ms=...)")
        return self._lifecycle("io.regen.Device.Release", device, reason)

    def reset(self, device=None, reason=None, deadline_ms=None):
        """Throw the context away and rebuild.  ``deadline_ms`` must be None."""
        if deadline_ms is not None:
            raise TypeError("io.regen.Device.Reset takes no deadline; use restart(deadline_ms=...)")
        return self._lifecycle("io.regen.Device.Reset", device, reason)

    def restart(self, device=None, reason=None, deadline_ms=None):
        """Drain (up to ``deadline_ms``), release or reset, new generation.
        Returns once the device serves again: {"epoch", "devices", "elapsed_us"}."""
        extra = {"deadline_ms": int(deadline_ms)} if deadline_ms is not None else None
        return self._lifecycle("io.regen.Device.Restart", device, reason, extra)

    def inject_fault(self, device, kind):
        """kind: "crash", "device_lost" or "hang" (regend --enable-fault-injection)."""
        return self._main_call("io.regen.Device.InjectFault", {"device": int(device), "kind": kind})

    # -- io.regen.Memory (worker socket) -----------------------------------

    def _import(self, device, params, fds=(), keepalive=None):
        reply = self._worker_call(device, "io.regen.Memory.ImportBuffer", params, fds)
        buf = Buffer(reply["buffer"], device, reply["generation"], reply["size"], params["kind"], keepalive)
        self._note_generation(device, buf.generation)
        self._buffers[buf.id] = buf
        return buf

    def _import_fd(self, device, kind, fd, size, offset):
        params = {"device": int(device), "kind": kind, "size": int(size), "fd": 0}
        if offset:
            params["offset"] = int(offset)
        return self._import(device, params, fds=[fd])

    def import_memfd(self, device, fd, size, offset=0):
        """Map ``size`` bytes at ``offset`` of a memfd the caller owns (host
        backend), made with os.MFD_ALLOW_SEALING: it is sealed against
        shrinking here (F_SEAL_SHRINK), which regend requires so that the
        memory cannot vanish under a call.  The fd is passed with
        SCM_RIGHTS; the caller may close its copy afterwards."""
        try:
            fcntl.fcntl(fd, fcntl.F_ADD_SEALS, fcntl.F_SEAL_SHRINK)
        except OSError:
            pass  # regend refuses it with ImportFailed, which says why
        return self._import_fd(device, "host_fd", fd, size, offset)

    def import_cuda_fd(self, device, fd, size, offset=0):
        """Map [offset, offset+size) of a CUDA VMM allocation exported as a
        POSIX file descriptor (cuMemExportToShareableHandle).  The fd is
        passed with SCM_RIGHTS; the caller may close its copy afterwards."""
        return self._import_fd(device, "cuda_fd", fd, size, offset)

    def import_cuda_ipc(self, device, handle_bytes, offset, size, keepalive=None):
        """Map [offset, offset+size) of the allocation a cudaIpcMemHandle_t
        names.  ``handle_bytes``: the 64-byte handle, torch's versioned
        shareable handle (a version byte, b"c", then the 64 bytes), or 128
        hex digits."""
        handle = normalize_ipc_handle(handle_bytes)
        params = {"device": int(device), "kind": "cuda_ipc", "size": int(size),
                  "offset": int(offset), "handle": handle}
        return self._import(device, params, keepalive=keepalive)

    def import_tensor(self, tensor, device=None):
        """Share a torch CUDA tensor's storage with regend by CUDA IPC.  The
        Buffer covers the whole storage and keeps ``tensor`` alive until it
        is closed.  A storage already imported in the current generation is
        not imported twice.  ``device``: regend's index for the tensor's GPU
        (default: the tensor's CUDA index; they differ only when
        CUDA_VISIBLE_DEVICES differs between this process and regend).
        An import that raises ConnectionReset may have been made: the
        storage is held from torch's reuse until the device's generation
        changes."""
        if not getattr(tensor, "is_cuda", False):
            raise TypeError("import_tensor needs a CUDA tensor; for host memory use import_memfd")
        storage = _untyped_storage(tensor)
        dev = tensor.device.index if device is None else int(device)
        key = (dev, storage.data_ptr())
        buf = self._tensor_buffers.get(key)
        if buf is not None and not buf.closed and buf.generation >= self._generations.get(dev, 0):
            return buf
        shared = storage._share_cuda_()
        handle, size_bytes, offset_bytes = shared[1], shared[2], shared[3]
        ref_counter = (shared[4], shared[5])
        try:
            buf = self.import_cuda_ipc(dev, handle, offset_bytes, size_bytes, keepalive=tensor)
        except BaseException as e:
            self._counter_after_failed_import(dev, ref_counter, e)
            raise
        # _share_cuda_ set a reference counter that a torch consumer would
        # decrement when done; without that the storage, once freed, would
        # never return to torch's allocator.  regend is the consumer here, so
        # the client decrements it when regend unmaps the buffer.
        buf._on_drop = lambda: _release_ipc_counter(*ref_counter)
        self._tensor_buffers[key] = buf
        self._tensor_epoch += 1
        return buf

    def _counter_after_failed_import(self, device, counter, exc):
        """Lets the IPC counter of an import that raised ``exc`` go where
        the import mapped nothing: regend refused it, or it was never sent
        (the storage, freed, would otherwise wait in torch's limbo for
        ever).  Where its answer was lost with the connection, or an
        exception came between its call and its answer, the worker may map
        the memory: the counter is held, so that torch neither reuses nor
        frees it, until the device's generation changes (the worker is gone
        then, or a reset unmapped it), as a buffer whose close was lost is
        kept."""
        if isinstance(exc, (errors.ConnectionReset, errors.ProtocolError)) or not isinstance(exc, Exception):
            # The generation known now is the import's, unless it changed
            # unseen just before the call (the one case this lets go early).
            self._unsure_counters.append((device, self._generations.get(device, 0), counter))
        else:
            _release_ipc_counter(*counter)

    def _close(self, method, key, ident, obj, forget):
        """Close a buffer or event (obj: ours, or None for a bare id) in its
        worker and forget it, unless the connection broke with the call in
        flight: then the worker may still hold it."""
        device = obj.device if obj is not None else _id_device(ident)
        # A queued record may name it: the record runs first, as a queued
        # Varlink call's answer is read first, and its ring index is not
        # given to another id while one might.
        if device is not None:
            self._drain(device)
        try:
            reply = self._worker_call(device, method, {key: ident})
        except (errors.StaleGeneration, errors.NoSuchObject):
            forget(obj)  # regend holds it no more either way
            raise
        forget(obj)
        return reply

    def close_buffer(self, buffer):
        """Unmap a buffer in regend, then drop what kept its memory alive.
        After a ConnectionReset the buffer is kept: the worker may still map it."""
        bid = _buffer_id(buffer)
        return self._close("io.regen.Memory.CloseBuffer", "buffer", bid, self._buffers.get(bid), self._forget)

    def close_tensor(self, tensor, device=None):
        """Close the buffer import_tensor (or a GEMM on the tensor) made for
        this tensor's storage, if any; returns whether there was one."""
        dev = tensor.device.index if device is None else int(device)
        buf = self._tensor_buffers.get((dev, _untyped_storage(tensor).data_ptr()))
        if buf is None:
            return False
        try:
            self.close_buffer(buf)
        except (errors.StaleGeneration, errors.NoSuchObject):
            pass
        return True

    def _forget(self, buf):
        if buf is None:
            return
        lane = self._lanes.get(buf.device)
        if lane is not None and lane.open_ring is not None:
            lane.open_ring.forget(buf.id)
        buf.closed = True
        self._buffers.pop(buf.id, None)
        for key, b in list(self._tensor_buffers.items()):
            if b is buf:
                del self._tensor_buffers[key]
                self._tensor_epoch += 1
        buf._drop()

    def import_event(self, device, handle_bytes):
        """Import a cudaIpcEventHandle_t (64 bytes, or 128 hex digits) of an
        event created with interprocess=True; returns an :class:`Event` for
        the ``wait_event``/``signal_event`` of compute calls."""
        handle = _handle_hex(handle_bytes, "cudaIpcEventHandle_t")
        reply = self._worker_call(device, "io.regen.Memory.ImportEvent", {"device": int(device), "handle": handle})
        ev = Event(reply["event"], int(device), reply["generation"])
        self._note_generation(ev.device, ev.generation)
        self._events[ev.id] = ev
        return ev

    def close_event(self, event):
        """Forget an event in regend (an Event or its id)."""
        eid = _event_id(event)
        return self._close("io.regen.Memory.CloseEvent", "event", eid, self._events.get(eid), self._forget_event)

    def _forget_event(self, ev):
        if ev is not None:
            lane = self._lanes.get(ev.device)
            if lane is not None and lane.open_ring is not None:
                lane.open_ring.forget(ev.id)
            ev.closed = True
            self._events.pop(ev.id, None)

    # -- io.regen.Compute (worker socket) ----------------------------------

    def _operand(self, x, name, tensors):
        if x is None:
            return None
        if isinstance(x, Operand):
            return x
        if _is_torch_tensor(x):
            tensors.append(x)
            return _tensor_operand(self, x, name)
        raise TypeError(f"operand {name} must be a regen.Operand or a torch tensor, not {type(x).__name__}")

    def _tensor_spans(self, device):
        """[(start, end, Buffer)] of the storages of torch device ``device``
        imported in the current generation, sorted by start (regen._accel
        finds a tensor's buffer among them by bisection), or None where
        there are none."""
        if self._spans_epoch != self._tensor_epoch:
            spans = {}
            for (dev, base), buf in self._tensor_buffers.items():
                if not buf.closed and buf.generation >= self._generations.get(dev, 0):
                    spans.setdefault(dev, []).append((base, base + buf.size, buf))
            for found in spans.values():
                found.sort(key=_span_start)
            self._spans, self._spans_epoch = spans, self._tensor_epoch
        return self._spans.get(device)

    def _compute_accel(self, op_name, named, scalars, signal_event):
        """A compute call whose operands are all torch tensors already
        imported, on a lane on the ring, encoded by regen._accel: (lane,
        ticket, device) once queued, None with nothing queued (the Python
        path takes the call, and raises what is wrong with it)."""
        torch = sys.modules.get("torch")
        if torch is None or self.transport == "varlink":
            return None
        tensor = torch.Tensor
        local = None
        tensors = []
        for x in named.values():
            if x is None:
                continue
            if not isinstance(x, tensor):
                return None
            tensors.append(x)
            if local is None:
                local = x.get_device()
        if local is None or local < 0 or not named.keys() <= ops.NAME_SETS[op_name]:
            return None
        for name in ops.REQUIRED_NAMES[op_name]:
            if named.get(name) is None:
                return None
        lane = self._lanes.get(local)
        if lane is None or lane.ring is None or lane.transport_epoch != self._transport_epoch:
            return None
        spans = self._tensor_spans(local)
        if spans is None:
            return None
        record = ringmod.scalars_record(op_name, scalars)
        _sync_torch(tensors)
        ticket = self.queue_tensors(local, op_name, ops.SLOT_NAMES[op_name], named, local, spans,
                                    _torch_ring_dtypes(torch), record, signal_event)
        if ticket is None:
            return None
        self.accel_calls += 1
        # The lane queue_tensors used: its _lane() may have put a new one
        # in place of an idle lane whose worker had gone.
        return self._lanes[local], ticket, local

    def _compute(self, op_name, named, scalars, wait_event, signal_event, retry=True, wait=True):
        if wait_event is None and accel.module is not None:
            queued = self._compute_accel(op_name, named, scalars, signal_event)
            if queued is not None:
                lane, ticket, device = queued
                return self._answer(op_name, named, scalars, signal_event, device, lane, ticket,
                                    retry and self.auto_reimport, wait)
        op = ops.OPS[op_name]
        method = op.method
        tensors = []
        names = ops.NAME_SETS[op_name]
        given = {}
        device = None
        devices = None   # a set, once the operands name more than one device
        for n, x in named.items():
            if n not in names:
                raise ValueError(f"{method} has no operand {sorted(set(named) - names)}")
            if x is None:
                continue
            o = x if type(x) is Operand else self._operand(x, n, tensors)
            given[n] = o
            b = o.buffer
            dev = b.device if type(b) is Buffer else _id_device(str(b))
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
            _sync_torch(tensors)
        retry = retry and self.auto_reimport and bool(tensors)
        try:
            lane = self._lanes.get(device)
            if wait and (self.transport == "varlink" or
                         (lane is not None and lane.decided and lane.ring is None and lane.completed == lane.submitted
                          and lane.transport_epoch == self._transport_epoch)):
                # A blocking call on a Varlink lane is one call and its reply
                # (not once set_transport asked again: _lane picks then).
                params = {n: o.to_wire() for n, o in given.items()}
                params.update(scalars)
                if wait_event is not None:
                    params["wait_event"] = _event_id(wait_event)
                if signal_event is not None:
                    params["signal_event"] = _event_id(signal_event)
                return self._worker_call(device, method, params).get("elapsed_us")
            lane = self._submit(device, op_name, op, given, scalars, wait_event, signal_event)
        except errors.StaleGeneration:
            # This call's own: its reply, or the refusal of what it needed
            # before it could be queued.
            if not retry:
                raise
            return self._compute(op_name, named, scalars, wait_event, signal_event, retry=False, wait=wait)
        return self._answer(op_name, named, scalars, signal_event, device, lane, lane.submitted, retry, wait,
                            wait_event)

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

    def gemm(self, a, b, d, c=None, bias=None, trans_a=False, trans_b=False, alpha=1.0, beta=0.0,
             epilogue=None, tf32=False, wait_event=None, signal_event=None, wait=True, aux=None, deadline_ms=None,
             aux_out=None):
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
        ends only this call); None: regend's default."""
        trans_a, trans_b = bool(trans_a), bool(trans_b)
        if type(a) is not Operand and _is_column_major(a):
            a, trans_a = a.t(), not trans_a
        if type(b) is not Operand and _is_column_major(b):
            b, trans_b = b.t(), not trans_b
        named = {"a": a, "b": b, "c": c, "d": d, "bias": bias, "aux": aux, "aux_out": aux_out}
        scalars = {"trans_a": trans_a, "trans_b": trans_b, "alpha": _finite("alpha", alpha),
                   "beta": _finite("beta", beta)}
        if epilogue is not None:
            if epilogue not in _EPILOGUES:
                raise ValueError(f"epilogue {epilogue!r} is not one of {_EPILOGUES}")
            scalars["epilogue"] = epilogue
        if tf32:
            scalars["compute"] = "tf32"
        _put_deadline(scalars, deadline_ms)
        return self._compute("gemm", named, scalars, wait_event, signal_event, wait=wait)

    def attention(self, q, k, v, o, stats=None, scale=None, causal=False, causal_alignment=None,
                  wait_event=None, signal_event=None, wait=True, seq_len_q=None, seq_len_kv=None, deadline_ms=None):
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

    def attention_backward(self, q, k, v, o, d_o, stats, d_q, d_k, d_v, scale=None, causal=False,
                           causal_alignment=None, wait_event=None, signal_event=None, wait=True, seq_len_q=None,
                           seq_len_kv=None, deadline_ms=None):
        """Gradients of attention: writes d_q, d_k, d_v from the forward's
        q, k, v, o, stats and the incoming d_o; ``seq_len_q`` and
        ``seq_len_kv`` as the forward's (rows past them written 0)."""
        scalars = _attention_scalars(scale, causal, causal_alignment)
        _put_deadline(scalars, deadline_ms)
        named = {"q": q, "k": k, "v": v, "o": o, "d_o": d_o, "stats": stats, "d_q": d_q, "d_k": d_k, "d_v": d_v,
                 "seq_len_q": seq_len_q, "seq_len_kv": seq_len_kv}
        return self._compute("attention_backward", named, scalars, wait_event, signal_event, wait=wait)

    def layer_norm(self, x, weight, y, bias=None, mean=None, rstd=None, eps=None, wait_event=None,
                   signal_event=None, wait=True, deadline_ms=None):
        """y = (x - mean) * rstd * weight + bias over each row of x [rows, n]
        (torch's F.layer_norm(x, [n], weight, bias, eps)), the statistics in
        f32; weight and bias [n] and y [rows, n] of x's dtype; ``mean`` and
        ``rstd`` (f32 [rows], optional) receive each row's statistics for
        layer_norm_backward.  ``eps``: None is regend's 1e-5; else finite
        and > 0.  Rows may be padded (row stride >= n)."""
        scalars = {}
        if eps is not None:
            scalars["eps"] = _finite("eps", eps)
        _put_deadline(scalars, deadline_ms)
        named = {"x": x, "weight": weight, "bias": bias, "y": y, "mean": mean, "rstd": rstd}
        return self._compute("layer_norm", named, scalars, wait_event, signal_event, wait=wait)

    def layer_norm_backward(self, d_y, x, weight, mean, rstd, d_x, d_weight=None, d_bias=None, d_residual=None,
                            wait_event=None, signal_event=None, wait=True, deadline_ms=None):
        """Gradients of layer_norm from the forward's x, weight, mean, rstd
        and the incoming d_y: writes d_x (plus ``d_residual``, the gradient
        arriving through a residual connection, when given; d_x may be
        d_residual itself), and when given ``d_weight`` = sum over rows of
        d_y * (x - mean) * rstd and ``d_bias`` = sum over rows of d_y
        (weight's dtype, summed in f32)."""
        scalars = {}
        _put_deadline(scalars, deadline_ms)
        named = {"d_y": d_y, "x": x, "weight": weight, "mean": mean, "rstd": rstd, "d_x": d_x,
                 "d_weight": d_weight, "d_bias": d_bias, "d_residual": d_residual}
        return self._compute("layer_norm_backward", named, scalars, wait_event, signal_event, wait=wait)

    # -- io.regen.Comm (worker socket) -------------------------------------

    def comm_unique_id(self, device=0):
        """A new unique id (256 hex digits) for rank 0 to hand to the others."""
        return self._worker_call(device, "io.regen.Comm.GetUniqueId", {})["unique_id"]

    def _comm_reply(self, device, reply, key=None):
        comm = Comm(reply["comm"], device, reply["generation"], reply["rank"], reply["nranks"], key,
                    reply.get("collectives"))
        self._note_generation(device, comm.generation)
        return comm

    def comm_init(self, unique_id, rank, nranks, device=0, key=None, deadline_ms=None):
        """Joins rank ``rank`` of ``nranks``; returns once every rank joined
        (CommTimeout after ``deadline_ms``).  ``key`` lets a later process of
        this user take the communicator back (comm_attach)."""
        params = {"unique_id": unique_id, "rank": int(rank), "nranks": int(nranks)}
        if key is not None:
            params["key"] = key
        if deadline_ms is not None:
            params["deadline_ms"] = int(deadline_ms)
        return self._comm_reply(device, self._worker_call(device, "io.regen.Comm.Init", params), key)

    def comm_attach(self, key, device=0):
        """Takes back the detached communicator ``key`` names (its process
        gone); ``comm.collectives`` says how many it ran."""
        return self._comm_reply(device, self._worker_call(device, "io.regen.Comm.Attach", {"key": key}), key)

    def _collective(self, kind, comm, send, recv, scalars, wait_event, signal_event, deadline_ms):
        method = "io.regen.Comm." + _COMM_METHODS[kind]
        tensors = []
        send = self._operand(send, "send", tensors)
        recv = self._operand(recv, "recv", tensors)
        if send is None or recv is None:
            raise ValueError(f"{method} needs send and recv")
        device = comm.device if isinstance(comm, Comm) else _id_device(str(comm))
        if device is None:
            raise ValueError(f"{method}: {comm!r} is not a communicator id")
        params = {"comm": _comm_id(comm), "send": send.to_wire(), "recv": recv.to_wire()}
        params.update(scalars)
        if wait_event is not None:
            params["wait_event"] = _event_id(wait_event)
        if signal_event is not None:
            params["signal_event"] = _event_id(signal_event)
        if deadline_ms is not None:
            params["deadline_ms"] = int(deadline_ms)
        if tensors and wait_event is None:
            _sync_torch(tensors)
        return self._worker_call(device, method, params).get("elapsed_us")

    def comm_all_reduce(self, comm, send, recv, op="sum", wait_event=None, signal_event=None, deadline_ms=None):
        """recv = send reduced over the ranks (op: sum, max, avg); recv may be send."""
        scalars = {} if op == "sum" else {"op": op}
        return self._collective("all_reduce", comm, send, recv, scalars, wait_event, signal_event, deadline_ms)

    def comm_all_gather(self, comm, send, recv, wait_event=None, signal_event=None, deadline_ms=None):
        """recv [nranks * n] = every rank's send [n], in rank order."""
        return self._collective("all_gather", comm, send, recv, {}, wait_event, signal_event, deadline_ms)

    def comm_reduce_scatter(self, comm, send, recv, op="sum", wait_event=None, signal_event=None,
                            deadline_ms=None):
        """recv [n] = this rank's block of send [nranks * n], reduced."""
        scalars = {} if op == "sum" else {"op": op}
        return self._collective("reduce_scatter", comm, send, recv, scalars, wait_event, signal_event, deadline_ms)

    def comm_broadcast(self, comm, send, recv, root, wait_event=None, signal_event=None, deadline_ms=None):
        """recv = root's send on every rank."""
        return self._collective("broadcast", comm, send, recv, {"root": int(root)}, wait_event, signal_event,
                                deadline_ms)

    def comm_abort(self, comm):
        """Stops the communicator now: its calls in flight and later ones fail
        with CommFailed (reason "aborted").  The id stays until comm_destroy."""
        device = comm.device if isinstance(comm, Comm) else _id_device(str(comm))
        self._worker_call(device, "io.regen.Comm.Abort", {"comm": _comm_id(comm)})

    def comm_destroy(self, comm, abort=False, deadline_ms=None):
        """Finalizes and destroys (a healthy one; its peers finalize too) or
        frees it; CommInFlight with calls in flight unless ``abort``."""
        device = comm.device if isinstance(comm, Comm) else _id_device(str(comm))
        params = {"comm": _comm_id(comm)}
        if abort:
            params["abort"] = True
        if deadline_ms is not None:
            params["deadline_ms"] = int(deadline_ms)
        self._worker_call(device, "io.regen.Comm.Destroy", params)
        if isinstance(comm, Comm):
            comm.closed = True


_HEXDIGITS = frozenset("0123456789abcdef")

_COMM_METHODS = {"all_reduce": "AllReduce", "all_gather": "AllGather", "reduce_scatter": "ReduceScatter",
                 "broadcast": "Broadcast"}


def _handle_hex(handle, what):
    """The 128 lowercase hex digits of a 64-byte CUDA IPC handle given as
    its bytes or in hex (either case)."""
    if isinstance(handle, str):
        h = handle.strip().lower()
        if len(h) != 128 or not _HEXDIGITS.issuperset(h):
            raise ValueError(f"a {what} in hex is 128 hex digits, got {len(h)} characters: {handle[:20]!r}...")
        return h
    raw = bytes(handle)
    if len(raw) != 64:
        raise ValueError(f"a {what} is 64 bytes, got {len(raw)}")
    return raw.hex()


def _unpackable_run(binds, journal, seq):
    """The InvalidParameter regend answers on Varlink for the first value of
    a Run that a record's field cannot hold (an offset or a seq outside 0
    to 2**64), after the packing refused it."""
    for name, (_, offset) in binds.items():
        if not 0 <= offset < 2**64:
            return errors.InvalidParameter(parameters={"parameter": f"bind.{name}.offset"})
    if journal is not None and not 0 <= journal[1] < 2**64:
        return errors.InvalidParameter(parameters={"parameter": "journal.offset"})
    return errors.InvalidParameter(parameters={"parameter": "seq"})


def _put_deadline(scalars, deadline_ms):
    # Passed as given: regend (or the ring's encoder, alike) refuses what is
    # not a whole number of milliseconds from 1 to a day.
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


def normalize_ipc_handle(handle):
    """128 hex digits of a cudaIpcMemHandle_t from what torch or CUDA gives."""
    if isinstance(handle, str):
        return _handle_hex(handle, "cudaIpcMemHandle_t")
    raw = bytes(handle)
    if len(raw) == 64:
        return raw.hex()
    # torch >= 2.2: a version byte, b"c" (cudaMalloc block), then the handle.
    if len(raw) == 66 and raw[1:2] == b"c":
        return raw[2:].hex()
    if len(raw) >= 2 and raw[1:2] == b"e":
        raise ValueError("this tensor lives in an expandable segment (PYTORCH_CUDA_ALLOC_CONF="
                         "expandable_segments:True), which CUDA IPC cannot share; allocate it "
                         "with expandable_segments:False")
    raise ValueError(f"unrecognised CUDA IPC handle of {len(raw)} bytes")


# -- torch, imported lazily so the client needs only the stdlib ---------------

def _is_torch_tensor(x):
    # A process that holds a tensor has imported torch; this module never
    # does.  isinstance, not the type's module and methods: torch 1.13's
    # tensors have no untyped_storage(), and a subclass (Parameter, a
    # user's) may live in any module.
    torch = sys.modules.get("torch")
    return torch is not None and isinstance(x, torch.Tensor)


def _is_column_major(x):
    """Whether ``x`` is a 2-D torch tensor laid out column-major (a
    transposed view), which a GEMM takes as its transpose, row-major."""
    return _is_torch_tensor(x) and x.dim() == 2 and x.stride(-1) != 1 and x.stride(-2) == 1


def _untyped_storage(t):
    """The storage ``t`` views, untyped: untyped_storage() from torch 2.0,
    the typed storage's untyped() before (1.13)."""
    get = getattr(t, "untyped_storage", None)
    return get() if get is not None else t.storage().untyped()


_TORCH_DTYPES = {"torch.float32": "f32", "torch.float16": "f16", "torch.bfloat16": "bf16", "torch.int32": "i32"}


def _tensor_dtype(t):
    """regend's name for t's dtype, None for one it does not take; kept by
    torch's dtype object, since str(dtype) per operand was a measurable
    part of a small call."""
    name = _DTYPES_BY_TORCH.get(t.dtype)
    if name is None:
        name = _TORCH_DTYPES.get(str(t.dtype))
        if name is not None:
            _DTYPES_BY_TORCH[t.dtype] = name
    return name


_DTYPES_BY_TORCH = {}


def _tensor_operand(client, t, name):
    dtype = _tensor_dtype(t)
    if dtype is None:
        raise TypeError(f"operand {name}: regend takes f32, f16, bf16 (and int32 sequence lengths) tensors, "
                        f"not {t.dtype}")
    offset = t.storage_offset() * t.element_size()
    # The storage's start without making a storage object (a call's worth
    # of the client's own cost): an import found for it is the one to use.
    # get_device(), not device.index: no device object per operand (-1 on
    # the CPU, which import_tensor refuses by name).
    dev = t.get_device()
    buf = client._tensor_buffers.get((dev, t.data_ptr() - offset))
    if buf is None or buf.closed or buf.generation < client._generations.get(dev, 0):
        buf = client.import_tensor(t)
    return Operand.trusted(buf, offset, dtype, list(t.shape), list(t.stride()))


def _release_ipc_counter(handle, offset):
    """Decrement torch's CUDA IPC reference counter for one _share_cuda_()
    (what a torch consumer does when it frees a received storage).  Best
    effort, like torch's own."""
    import torch
    try:
        release = getattr(torch.UntypedStorage, "_release_ipc_counter_cuda", None)
        if release is not None:
            release(handle, offset)
        else:
            torch.cuda.UntypedStorage._release_ipc_counter(handle, offset)
    except Exception:
        pass


def _span_start(span):
    return span[0]


def _torch_ring_dtypes(torch):
    """torch dtype -> a ring record's dtype code, made once."""
    global _TORCH_RING_DTYPES
    if _TORCH_RING_DTYPES is None:
        _TORCH_RING_DTYPES = {getattr(torch, name.split(".")[1]): ringmod.DTYPES[code]
                              for name, code in _TORCH_DTYPES.items()}
    return _TORCH_RING_DTYPES


_TORCH_RING_DTYPES = None


def _sync_torch(tensors):
    """regend runs on its own streams in another process: the work this
    process queued on its current streams must be done before it reads.
    Not when the call names a wait_event: the caller recorded it after that
    work, and regend's stream waits for it on the GPU (a host
    synchronisation there would hold the call back until the rank's stream
    drained, so it could never be in flight beside the rank's work)."""
    torch = sys.modules["torch"]
    raw = getattr(torch._C, "_cuda_getCurrentRawStream", None)
    for dev in {t.get_device() for t in tensors}:
        if raw is None:
            torch.cuda.current_stream(dev).synchronize()
            continue
        # A Stream object per current stream, found by its raw handle:
        # torch.cuda.current_stream() builds one per call (3 µs of a 60 µs
        # call on the H200 machine). The object only ever synchronises that
        # handle, which is the current stream's whatever became of the
        # stream it was made for.
        key = (dev, raw(dev))
        stream = _CURRENT_STREAMS.get(key)
        if stream is None:
            if len(_CURRENT_STREAMS) >= 64:
                _CURRENT_STREAMS.clear()
            stream = _CURRENT_STREAMS[key] = torch.cuda.current_stream(dev)
        stream.synchronize()


_CURRENT_STREAMS = {}
