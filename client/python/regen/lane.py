# SPDX-License-Identifier: Apache-2.0
"""A device's lane (libregen's lane.c): the compute calls and program Runs
of a client on one device, answered in order, counted by tickets, the first
error among them kept for the wait that reads it.

A lane takes one of two routes, picked when it has nothing outstanding:

- libregen's ring (io.regen.Lane), through regen._accel: libregen writes
  the records, binds the ids, rings the doorbells and reads the
  completions (client/lane.c); this side hands it each call in the
  record's terms and maps its tickets onto the lane's;
- Varlink calls on the client's own worker connection, queued or one at a
  time: where the transport is "varlink", or libregen, regen._accel or the
  worker's ring is missing.

Tickets go on counting across routes and connections: a caller that holds
one never finds it handed out again.
"""

import errno
import os
import time
from typing import Dict, Optional

from . import accel, errors
from ._parts import ClientPart

__all__ = ["Lane", "Lanes", "ring_supported", "QUEUE_MAX"]

# Calls a lane holds unanswered before the next waits for the oldest's
# answer: the ring's depth (libregen's), so that both routes queue alike,
# and under regend's 1024 unanswered calls a connection may hold.
# Unbounded, a client that never waited was refused past those
# (LimitExceeded), and made regend hold ever more replies.
QUEUE_MAX = 256


def ring_supported():
    """Whether this process can put a lane on the ring: regen._accel and
    libregen are loaded (regen.accel)."""
    return accel.ring() is not None


class Lane:
    """One device's lane, on the route it took."""

    __slots__ = ("client", "device", "conn", "ring", "decided", "transport_epoch", "base", "varlink_submitted",
                 "varlink_completed", "told_upto", "error", "error_ticket", "elapsed_us", "idle_since", "no_ring")

    def __init__(self, client, device):
        self.client = client      # the lane's owner, whose libregen client the ring route uses
        self.device = device
        self.conn = None          # the Varlink route's connection
        self.ring = False         # on libregen's ring
        self.decided = False
        self.transport_epoch = 0   # the client's when it was decided
        self.base = 0             # the ring route: this lane's ticket = libregen's + base
        self.varlink_submitted = self.varlink_completed = 0
        # Calls up to this ticket were lost with a connection, and the
        # caller was told (ConnectionReset): later waits pass over them.
        self.told_upto = 0
        self.error = None         # the first error not raised yet
        self.error_ticket = 0     # the call it answered
        self.elapsed_us = None
        self.idle_since = time.monotonic()
        self.no_ring = False      # the worker of this connection offers none

    def _lib_tickets(self):
        return accel.module.tickets(self.client._ring_client, self.device)

    @property
    def submitted(self):
        if self.ring:
            return self._lib_tickets()[0] + self.base
        return self.varlink_submitted

    @property
    def completed(self):
        if self.ring:
            return self._lib_tickets()[1] + self.base
        return self.varlink_completed

    def outstanding(self):
        if self.ring:
            submitted, completed = self._lib_tickets()
            return submitted > completed
        return self.varlink_submitted > self.varlink_completed


class Lanes(ClientPart):
    """The lanes part of :class:`regen.Client`: a lane per device, the
    transport, and the waits."""

    def _init_lanes(self, transport):
        # How compute calls reach a worker: "ring" (io.regen.Lane, shared
        # memory, through libregen), "varlink", or "auto" (the ring where
        # this process and the worker can use it); $REGEN_TRANSPORT by
        # default.
        self.transport = transport or os.environ.get("REGEN_TRANSPORT") or "auto"
        if self.transport not in ("auto", "ring", "varlink"):
            raise ValueError(f"transport {self.transport!r} is not 'auto', 'ring' or 'varlink'")
        self._lanes = {}          # device -> Lane
        self._transport_epoch = 0  # bumped by set_transport
        self._ring_client = None  # libregen's client of the ring route (regen._accel), opened on first use
        self.accel_calls = 0      # compute calls on torch tensors regen._accel read straight from the tensors

    def _close_lanes(self):
        self._lanes.clear()
        # libregen closes its connections and unmaps the rings (in a forked
        # child: its own copies only).
        self._ring_client = None

    def _lanes_set_job(self, job):
        if self._ring_client is not None:
            r = accel.module.set_job(self._ring_client, job)
            if r < 0:
                raise self._lib_error(r, None)

    # -- picking the route -------------------------------------------------

    def _drop_lane(self, device, conn=None):
        """The Varlink route's connection went (``conn``, or whatever it
        was): its calls outstanding are lost, and the lane picks again on
        its next call.  A lane on the ring is libregen's to keep."""
        lane = self._lanes.get(device)
        if lane is None or lane.ring or (conn is not None and lane.conn is not conn):
            return
        lane.varlink_completed = lane.varlink_submitted
        lane.conn = None
        lane.decided = False
        lane.no_ring = False

    def _varlink_outstanding(self, device, conn):
        lane = self._lanes.get(device)
        return lane is not None and not lane.ring and lane.conn is conn and conn is not None and \
            lane.varlink_completed < lane.varlink_submitted

    def _lane(self, device):
        """The device's lane, its route picked on its first call, and again
        after set_transport once it has nothing outstanding."""
        lane = self._lanes.get(device)
        if lane is None:
            lane = self._lanes[device] = Lane(self, device)
        elif lane.decided:
            if lane.transport_epoch != self._transport_epoch and not lane.outstanding():
                lane.decided = False
            elif lane.ring:
                return lane   # libregen looks after its own connection
            elif lane.varlink_completed < lane.varlink_submitted or (
                    lane.conn is self._workers.get(device) and not lane.conn.closed and lane.conn.alive()):
                return lane
            else:
                self._drop_lane(device)
        self._pick_route(device, lane)
        return lane

    def _pick_route(self, device, lane):
        # The kept error of the route it leaves stays the lane's.
        if lane.ring:
            self._leave_ring(device, lane)
        lane.transport_epoch = self._transport_epoch
        if self.transport != "varlink" and ring_supported() and not lane.no_ring:
            client = self._ring()
            submitted, completed = accel.module.tickets(client, device)
            if submitted != completed:
                raise errors.ProtocolError(parameters={
                    "message": f"libregen's lane of device {device} has calls outstanding this client did not "
                               "queue"})
            lane.base = lane.varlink_submitted - submitted
            lane.ring = True
            lane.conn = None
        else:
            if self.transport == "ring":
                raise errors.ProtocolError(parameters={
                    "message": f"the worker of device {device} offers no ring (io.regen.Lane), or this process "
                               "cannot use one (regen._accel and libregen, regen.accel), and the transport is forced "
                               "to ring"})
            lane.conn = self._worker(device)
        lane.decided = True

    def _leave_ring(self, device, lane):
        """The lane leaves the ring with nothing outstanding: libregen's kept
        error comes over, and its tickets stand where they are."""
        submitted = lane.submitted
        e, at = self._lib_collect(device, lane, submitted)
        if e is not None and lane.error is None:
            lane.error, lane.error_ticket = e, at
        lane.ring = False
        lane.varlink_submitted = lane.varlink_completed = submitted

    def _no_ring_here(self, device, lane):
        """libregen found no ring on the worker: "auto" takes Varlink for
        this connection's life (a ring forced is refused)."""
        if self.transport == "ring":
            raise self._lib_error(-errno.EPROTONOSUPPORT, device)
        lane.no_ring = True
        self._leave_ring(device, lane)
        lane.conn = self._worker(device)

    def _ring(self):
        """libregen's client for the ring route, opened on first use."""
        if self._ring_client is None:
            timeout = self.timeout if self.timeout is not None else 0.0
            try:
                self._ring_client = accel.module.connect(self.socket_path, float(timeout), self.job)
            except OSError as e:
                raise _errno_error(e.errno, f"libregen cannot connect to {self.socket_path}: {e.strerror}",
                                   None) from None
        return self._ring_client

    def set_transport(self, transport: str) -> None:
        """"auto", "ring" or "varlink" from the next call on (a lane with
        calls outstanding switches after them).  A connection keeps the ring
        it opened for when it is wanted again."""
        if transport not in ("auto", "ring", "varlink"):
            raise ValueError(f"transport {transport!r} is not 'auto', 'ring' or 'varlink'")
        self.transport = transport
        # Each lane picks again on its next call made with nothing
        # outstanding (_lane).
        self._transport_epoch += 1

    def lane_transport(self, device: int) -> Optional[str]:
        """"ring" or "varlink": what ``device``'s lane uses now (None before
        its first compute call)."""
        lane = self._lanes.get(device)
        if lane is None or not lane.decided:
            return None
        if lane.transport_epoch != self._transport_epoch and not lane.outstanding():
            return None   # picks again on its next call
        return "ring" if lane.ring else "varlink"

    def last_timing(self, device: int) -> Optional[Dict[str, int]]:
        """Where ``device``'s last call answered over the ring spent its time
        in the worker: a dict of taken_ns, launched_ns, finished_ns and
        published_ns (CLOCK_MONOTONIC, the clock of time.monotonic_ns(); 0
        for a stage the record never reached, finished_ns 0 for a record
        answered before its work ended, as a Timeout is), or None where the
        lane is on Varlink or has answered nothing."""
        lane = self._lanes.get(device)
        if lane is None or not lane.ring:
            return None
        t = accel.module.timing(self._ring_client, device)[1:5]
        if not any(t):
            return None
        return dict(zip(("taken_ns", "launched_ns", "finished_ns", "published_ns"), t))

    def doorbells(self) -> int:
        """Doorbells rung on the lanes' rings: how often a record found the
        worker asleep."""
        return accel.module.doorbells(self._ring_client) if self._ring_client is not None else 0

    # -- the ring route ----------------------------------------------------

    def _lib_error(self, r, device):
        """The error libregen's failure ``r`` (-errno) stands for, named as
        regend named it where it has a name; its generation noted."""
        name, params, message, _ = accel.module.error(self._ring_client)
        e = _errno_error(-r, message, name, params, device)
        if device is not None:
            self._note_error(device, e)
        return e

    def _ring_queue(self, device, lane, submit):
        """Queues on the ring what ``submit(libregen client)`` hands libregen
        (its ticket there, or -errno): the lane's ticket, or None where the
        worker offers no ring and the lane took Varlink."""
        return self._ring_ticket(device, lane, submit(self._ring_client))

    def _ring_ticket(self, device, lane, r):
        """The lane's ticket of what libregen answered a submission (its
        ticket there, or -errno: raised), or None where the worker offers
        no ring and the lane took Varlink."""
        if r >= 0:
            return r + lane.base
        if r == -errno.EPROTONOSUPPORT:
            self._no_ring_here(device, lane)
            return None
        e = self._lib_error(r, device)
        if isinstance(e, errors.ConnectionReset):
            # What was outstanding is lost, and this says so (nothing of
            # this call was queued).
            lane.told_upto = lane.submitted
        raise e

    def _lib_collect(self, device, lane, ticket):
        """libregen's answers up to ``ticket``: their first error (None if
        none) and the ticket of its call. A failure of the lane itself (its
        connection broke, the time ran out) raises: the calls outstanding
        are lost, told once."""
        if ticket <= max(lane.base, lane.told_upto):
            return None, 0
        r = accel.module.wait(self._ring_client, device, ticket - lane.base)
        if r >= 0:
            lane.elapsed_us = r
            return None, 0
        name, _, _, at = accel.module.error(self._ring_client)
        e = self._lib_error(r, device)
        if name is None:
            lane.told_upto = lane.submitted
            raise e
        return e, at + lane.base

    # -- the Varlink route -------------------------------------------------

    def _lane_broken(self, device, lane, what):
        self._workers.pop(device, None)
        lane.conn.close()
        self._drop_lane(device)
        return errors.ConnectionReset(parameters={
            "message": f"connection to device {device}'s worker broke {what}; calls in flight may or may not "
                       "have run"})

    def _reap(self, device, lane):
        """Reads the oldest outstanding Varlink answer, keeping the first
        error."""
        try:
            try:
                params, _ = lane.conn.receive()
                e, elapsed = None, params.get("elapsed_us")
            except errors.ConnectionReset:
                raise
            except errors.Error as x:
                e, elapsed = x, None
            lane.varlink_completed += 1
        except (ConnectionResetError, errors.ConnectionReset, OSError) as x:
            raise self._lane_broken(device, lane, "while waiting for answers") from x
        except TimeoutError as x:
            raise self._lane_broken(device, lane, "past the timeout") from x
        if e is not None:
            self._note_error(device, e)
            if lane.error is None:
                lane.error, lane.error_ticket = e, lane.varlink_completed
        else:
            lane.elapsed_us = elapsed
        if lane.varlink_completed == lane.varlink_submitted:
            lane.idle_since = time.monotonic()

    def _queue_varlink(self, device, lane, method, params):
        """Sends a call on a Varlink lane without waiting for its answer;
        its ticket."""
        while lane.varlink_submitted - lane.varlink_completed >= QUEUE_MAX:
            self._reap(device, lane)
        try:
            lane.conn.send(method, params)
        except errors.ConnectionReset:
            self._workers.pop(device, None)
            self._drop_lane(device)
            raise
        lane.varlink_submitted += 1
        return lane.varlink_submitted

    def _settle(self, device):
        """Varlink answers outstanding on the lane come before another call
        on its connection (their error waits for the next wait())."""
        lane = self._lanes.get(device)
        while lane is not None and not lane.ring and lane.varlink_completed < lane.varlink_submitted:
            self._reap(device, lane)

    # -- waits ---------------------------------------------------------------

    def _drain(self, device):
        """Reads every answer outstanding on ``device``'s lane, keeping their
        first error for the next wait(): before an id is closed, which a
        queued call may still name."""
        lane = self._lanes.get(device)
        if lane is None:
            return
        if lane.ring:
            e, at = self._lib_collect(device, lane, lane.submitted)
            if e is not None and lane.error is None:
                lane.error, lane.error_ticket = e, at
            return
        self._settle(device)

    def _collect(self, device, lane, ticket):
        """Reads the answers up to ``ticket``; returns their first error
        (None if none), now the caller's, and the ticket of its call."""
        e, at = lane.error, lane.error_ticket
        lane.error = None
        if lane.ring:
            if ticket > lane.base:
                le, lat = self._lib_collect(device, lane, ticket)
                if e is None:
                    e, at = le, lat
        else:
            while lane.varlink_completed < ticket:
                self._reap(device, lane)
            if lane.error is not None and e is None:
                e, at = lane.error, lane.error_ticket
            lane.error = None
        return e, at

    def wait(self, device: int, ticket: Optional[int] = None) -> Optional[int]:
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


def _errno_error(code, message, name=None, params=None, device=None):
    """The regen.Error (or the Python error) of a libregen failure: regend's
    own where it named one, else by errno."""
    if name:
        import json
        try:
            p = json.loads(params) if params else {}
        except ValueError:
            p = {}
        if message and "message" not in p:
            p["message"] = message
        return errors.error_from_reply(name, p)
    text = message or os.strerror(code)
    if code in (errno.ECONNRESET, errno.EPIPE, errno.ETIMEDOUT):
        return errors.ConnectionReset(parameters={"message": text})
    if code in (errno.ECONNREFUSED, errno.ENOENT, errno.EAGAIN):
        return errors.Unavailable(parameters={"message": text, "errno": code})
    if code == errno.EPROTONOSUPPORT:
        return errors.ProtocolError(parameters={"message": text})
    if code == errno.EPROTO:
        return errors.ProtocolError(parameters={"message": text})
    if code == errno.ENODEV:
        return errors.NoSuchDevice(parameters={"device": device, "message": text})
    if code == errno.ENOMEM:
        return MemoryError(text)
    if code == errno.EINVAL:
        return ValueError(text)
    return OSError(code, text)
