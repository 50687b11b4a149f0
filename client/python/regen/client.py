# SPDX-License-Identifier: Apache-2.0
"""The regend client: lifecycle calls on the main socket, imports, compute
and programs on each device's worker socket.

A Client is one class made of parts that mirror libregen's files, each in
its own module: connection.py (the sockets, the job, raw calls,
generations), status.py and watch.py (io.regen.Device), objects.py
(buffers and events), compute.py (GEMM, attention, LayerNorm), lane.py (a
device's lane: libregen's ring through regen._accel, or Varlink calls),
program.py (io.regen.Program), comm.py (io.regen.Comm) and keep.py
(io.regen.Keep: kept state).  Torch tensors
are regen.torch's (regen/torch/_tensors.py): the client takes them where
it takes Operands, and imports no torch.

A Client is for one thread: give each thread its own.
"""

from .comm import Comm, Comms
from .compute import DTYPE_SIZE, Compute, Operand
from .connection import DEFAULT_SOCKET, Connections
from .keep import KeepCalls
from .lane import Lanes
from .objects import Buffer, Event, Objects, normalize_ipc_handle
from .program import Programs
from .status import StatusCalls
from .watch import Watch, WatchCalls

__all__ = ["Client", "Operand", "Buffer", "Event", "Comm", "Watch", "DEFAULT_SOCKET", "DTYPE_SIZE",
           "normalize_ipc_handle"]


class Client(Connections, StatusCalls, WatchCalls, Objects, Lanes, Compute, Programs, Comms, KeepCalls):
    """Talks to one regend.  ``socket_path`` defaults to $REGEN_SOCKET, then
    /run/regen/regend.sock.  ``timeout`` (seconds, None = wait forever)
    bounds each call; a call that times out closes its connection.

    ``transport``: how compute calls and Runs reach a worker, "ring"
    (io.regen.Lane through libregen), "varlink" or "auto" (the ring where
    regen._accel, libregen and the worker all offer it); $REGEN_TRANSPORT
    by default (set_transport).

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
