# SPDX-License-Identifier: Apache-2.0
"""A client's connections to regend (libregen's client.c): the main socket
for lifecycle calls, one worker socket per device for the rest, opened on
first use; the job stated on each; raw calls; and what errors and replies
say of the devices' generations.

When a connection breaks, the call in flight raises
:class:`regen.ConnectionReset` (it may or may not have run) and the next
call connects again, reading Status afresh for the worker's socket.  A
connection found closed by the peer while idle (a worker that was respawned
between two calls) is replaced before the next call is sent.
"""

import os
import time
import weakref
from types import TracebackType
from typing import Any, Optional, Sequence, Type

from . import errors
from ._parts import JSON, ClientPart
from .varlink import Connection

__all__ = ["Connections", "DEFAULT_SOCKET"]

DEFAULT_SOCKET = "/run/regen/regend.sock"

_live_clients: "weakref.WeakSet[Any]" = weakref.WeakSet()


def _after_fork_in_child():
    for c in list(_live_clients):
        c._forget_after_fork()


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_after_fork_in_child)


def id_device(ident):
    """The device an id names: "b0.3.17" -> 0.  None if it is not an id."""
    try:
        return int(ident[1:ident.index(".")])
    except (ValueError, IndexError):
        return None


class Connections(ClientPart):
    """The connections part of :class:`regen.Client`: sockets, the job,
    raw calls and generations.  The other parts (objects, compute, lanes,
    programs, communicators) keep their own state, set up by their
    ``_init_*`` and forgotten by their ``_forget_*``."""

    def __init__(self, socket_path: Optional[str] = None, timeout: Optional[float] = None,
                 auto_reimport: bool = False, reconnect_wait: float = 10.0, transport: Optional[str] = None,
                 job: Optional[str] = None) -> None:
        self.socket_path = socket_path or os.environ.get("REGEN_SOCKET") or DEFAULT_SOCKET
        self.job: Optional[str] = job if job is not None else (os.environ.get("REGEN_JOB") or None)
        self._job_unsupported = False
        self.timeout = timeout
        self.auto_reimport = auto_reimport
        self.reconnect_wait = reconnect_wait
        self._main: Optional[Connection] = None
        self._workers: "dict[int, Connection]" = {}
        self._init_lanes(transport)
        self._forget_objects()
        _live_clients.add(self)

    def _forget_after_fork(self):
        """In a forked child: the connections are the parent's (a call here
        would interleave with the parent's on the same sockets) and the
        objects are the parent process's (regend knows them by its pid).
        The child closes its copies of the sockets (the parent's stay open)
        and of the rings' mappings, forgets the rest without a call, and
        connects afresh when it calls."""
        self.close()
        self._forget_objects()

    def close(self) -> None:
        """Close every connection.  Imported buffers stay valid in regend
        until this process exits, closes them or their generation ends."""
        if self._main is not None:
            self._main.close()
            self._main = None
        for conn in self._workers.values():
            conn.close()
        self._workers.clear()
        self._close_lanes()

    def __enter__(self) -> "Connections":
        return self

    def __exit__(self, exc_type: Optional[Type[BaseException]], exc: Optional[BaseException],
                 tb: Optional[TracebackType]) -> None:
        self.close()

    # -- the job ---------------------------------------------------------------

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

    def set_job(self, job: Optional[str]) -> JSON:
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
        self._lanes_set_job(self.job)
        return reply

    # -- the main socket -------------------------------------------------------

    def _main_call(self, method, params=None, fds=()):
        reply, got = self._main_call_with_fds(method, params, fds)
        for fd in got:
            os.close(fd)
        return reply

    def _main_call_with_fds(self, method, params=None, fds=()):
        """A call on the main socket: (reply, [fds that came with it])."""
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
            reply, got = self._main.call_with_fds(method, params, fds)
        except errors.ConnectionReset:
            self._main = None
            raise
        self._note_devices(reply)
        return reply, got

    def _note_devices(self, reply):
        for d in reply.get("devices", ()) or ():
            idx = d.get("index")
            if idx is not None and "generation" in d:
                self._note_generation(idx, d["generation"])

    # -- worker sockets --------------------------------------------------------

    def _worker_path_here(self, reported):
        """Status's worker socket (regend's view of the filesystem) from
        here: beside the main socket this client uses, where regend puts it
        (PATH.devN), so a container that mounts /run/regen elsewhere reaches
        it at its own path."""
        if not reported or "/" not in reported:
            return reported
        return os.path.join(os.path.dirname(self.socket_path), os.path.basename(reported))

    def _worker(self, device):
        conn = self._workers.get(device)
        if self._varlink_outstanding(device, conn):
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
                self._drop_lane(device, conn)
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
            self._drop_lane(device, conn)
            raise
        except (errors.StaleGeneration, errors.DeviceLost, errors.Draining) as e:
            self._note_error(device, e)
            raise

    def call(self, method: str, parameters: Optional[JSON] = None, device: Optional[int] = None,
             fds: Sequence[int] = ()) -> JSON:
        """A raw Varlink call: on the main socket, or on ``device``'s worker
        socket.  Returns the reply's parameters; errors raise as usual."""
        if device is None:
            return self._main_call(method, parameters, fds)
        return self._worker_call(device, method, parameters, fds)

    # -- generations -----------------------------------------------------------

    def _note_generation(self, device, generation):
        """``device`` reached ``generation``: what this client holds of
        older ones is gone in regend, and is let go here."""
        old = self._generations.get(device)
        self._generations[device] = generation
        if old is not None and generation <= old:
            return
        self._forget_generation(device, generation)

    def _note_error(self, device, e):
        if isinstance(e, (errors.StaleGeneration, errors.DeviceLost, errors.Draining)):
            gen = e.parameters.get("generation")
            dev = e.parameters.get("device", device)
            if isinstance(gen, int) and isinstance(dev, int):
                self._note_generation(dev, gen)
