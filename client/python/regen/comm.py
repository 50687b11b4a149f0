# SPDX-License-Identifier: Apache-2.0
"""Communicators, io.regen.Comm on the worker socket (libregen's comm.c):
NCCL on the CUDA backend; on the host backend the ranks are connections to
the workers of one regend, one per device or several on one (the control
plane's tests, not the GPU path)."""

from typing import List, Optional, Union

from ._parts import ClientPart, EventLike, OperandLike
from .connection import id_device
from .objects import _Object, event_id, tensor_imports

__all__ = ["Comm", "Comms"]

_COMM_METHODS = {"all_reduce": "AllReduce", "all_gather": "AllGather", "reduce_scatter": "ReduceScatter",
                 "broadcast": "Broadcast", "all_to_all": "AllToAll", "send": "Send", "recv": "Recv"}


class Comm(_Object):
    """A communicator (io.regen.Comm) on one device: rank ``rank`` of
    ``nranks``.  ``str(comm)`` is its wire id (``c<dev>.<gen>.<n>``).
    ``collectives`` is what Attach reported (None after Init)."""

    __slots__ = ("rank", "nranks", "key", "collectives")

    def __init__(self, id: str, device: int, generation: int, rank: int, nranks: int, key: Optional[str] = None,
                 collectives: Optional[List[str]] = None) -> None:
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


def _comm_device(comm):
    return comm.device if isinstance(comm, Comm) else id_device(str(comm))


class Comms(ClientPart):
    """The communicators part of :class:`regen.Client`."""

    def comm_unique_id(self, device: int = 0) -> str:
        """A new unique id (256 hex digits) for rank 0 to hand to the others."""
        return self._worker_call(device, "io.regen.Comm.GetUniqueId", {})["unique_id"]

    def _comm_reply(self, device, reply, key=None):
        comm = Comm(reply["comm"], device, reply["generation"], reply["rank"], reply["nranks"], key,
                    reply.get("collectives"))
        self._note_generation(device, comm.generation)
        return comm

    def comm_init(self, unique_id: str, rank: int, nranks: int, device: int = 0, key: Optional[str] = None,
                  deadline_ms: Optional[int] = None) -> Comm:
        """Joins rank ``rank`` of ``nranks``; returns once every rank joined
        (CommTimeout after ``deadline_ms``).  ``key`` lets a later process of
        this user take the communicator back (comm_attach)."""
        params = {"unique_id": unique_id, "rank": int(rank), "nranks": int(nranks)}
        if key is not None:
            params["key"] = key
        if deadline_ms is not None:
            params["deadline_ms"] = int(deadline_ms)
        return self._comm_reply(device, self._worker_call(device, "io.regen.Comm.Init", params), key)

    def comm_attach(self, key: str, device: int = 0) -> Comm:
        """Takes back the detached communicator ``key`` names (its process
        gone); ``comm.collectives`` says how many it ran."""
        return self._comm_reply(device, self._worker_call(device, "io.regen.Comm.Attach", {"key": key}), key)

    def _collective(self, kind, comm, send, recv, scalars, wait_event, signal_event, deadline_ms):
        method = "io.regen.Comm." + _COMM_METHODS[kind]
        tensors = []
        send = self._operand(send, "send", tensors)
        recv = self._operand(recv, "recv", tensors)
        if (send is None and kind != "recv") or (recv is None and kind != "send"):
            raise ValueError(f"{method} needs {'send' if send is None else 'recv'}")
        device = _comm_device(comm)
        if device is None:
            raise ValueError(f"{method}: {comm!r} is not a communicator id")
        params = {"comm": _comm_id(comm)}
        if send is not None:
            params["send"] = send.to_wire()
        if recv is not None:
            params["recv"] = recv.to_wire()
        params.update(scalars)
        if wait_event is not None:
            params["wait_event"] = event_id(wait_event)
        if signal_event is not None:
            params["signal_event"] = event_id(signal_event)
        if deadline_ms is not None:
            params["deadline_ms"] = int(deadline_ms)
        if tensors and wait_event is None:
            tensor_imports(self).sync(tensors)
        return self._worker_call(device, method, params).get("elapsed_us")

    def comm_all_reduce(self, comm: Union[Comm, str], send: OperandLike, recv: OperandLike, op: str = "sum",
                        wait_event: EventLike = None, signal_event: EventLike = None,
                        deadline_ms: Optional[int] = None) -> Optional[int]:
        """recv = send reduced over the ranks (op: sum, max, min, prod, avg);
        recv may be send."""
        scalars = {} if op == "sum" else {"op": op}
        return self._collective("all_reduce", comm, send, recv, scalars, wait_event, signal_event, deadline_ms)

    def comm_all_gather(self, comm: Union[Comm, str], send: OperandLike, recv: OperandLike,
                        wait_event: EventLike = None, signal_event: EventLike = None,
                        deadline_ms: Optional[int] = None) -> Optional[int]:
        """recv [nranks * n] = every rank's send [n], in rank order."""
        return self._collective("all_gather", comm, send, recv, {}, wait_event, signal_event, deadline_ms)

    def comm_reduce_scatter(self, comm: Union[Comm, str], send: OperandLike, recv: OperandLike, op: str = "sum",
                            wait_event: EventLike = None, signal_event: EventLike = None,
                            deadline_ms: Optional[int] = None) -> Optional[int]:
        """recv [n] = this rank's block of send [nranks * n], reduced."""
        scalars = {} if op == "sum" else {"op": op}
        return self._collective("reduce_scatter", comm, send, recv, scalars, wait_event, signal_event, deadline_ms)

    def comm_broadcast(self, comm: Union[Comm, str], send: OperandLike, recv: OperandLike, root: int,
                       wait_event: EventLike = None, signal_event: EventLike = None,
                       deadline_ms: Optional[int] = None) -> Optional[int]:
        """recv = root's send on every rank."""
        return self._collective("broadcast", comm, send, recv, {"root": int(root)}, wait_event, signal_event,
                                deadline_ms)

    def comm_all_to_all(self, comm: Union[Comm, str], send: OperandLike, recv: OperandLike,
                        wait_event: EventLike = None, signal_event: EventLike = None,
                        deadline_ms: Optional[int] = None) -> Optional[int]:
        """recv [nranks * n]: block k is rank k's block ``rank`` of its send."""
        return self._collective("all_to_all", comm, send, recv, {}, wait_event, signal_event, deadline_ms)

    def comm_send(self, comm: Union[Comm, str], send: OperandLike, peer: int, wait_event: EventLike = None,
                  signal_event: EventLike = None, deadline_ms: Optional[int] = None) -> Optional[int]:
        """Sends ``send`` to rank ``peer`` (its matching comm_recv takes it)."""
        return self._collective("send", comm, send, None, {"peer": int(peer)}, wait_event, signal_event,
                                deadline_ms)

    def comm_recv(self, comm: Union[Comm, str], recv: OperandLike, peer: int, wait_event: EventLike = None,
                  signal_event: EventLike = None, deadline_ms: Optional[int] = None) -> Optional[int]:
        """Receives into ``recv`` what rank ``peer`` sends with comm_send."""
        return self._collective("recv", comm, None, recv, {"peer": int(peer)}, wait_event, signal_event,
                                deadline_ms)

    def comm_abort(self, comm: Union[Comm, str]) -> None:
        """Stops the communicator now: its calls in flight and later ones fail
        with CommFailed (reason "aborted").  The id stays until comm_destroy."""
        self._worker_call(_comm_device(comm), "io.regen.Comm.Abort", {"comm": _comm_id(comm)})

    def comm_destroy(self, comm: Union[Comm, str], abort: bool = False, deadline_ms: Optional[int] = None) -> None:
        """Finalizes and destroys (a healthy one; its peers finalize too) or
        frees it; CommInFlight with calls in flight unless ``abort``."""
        params = {"comm": _comm_id(comm)}
        if abort:
            params["abort"] = True
        if deadline_ms is not None:
            params["deadline_ms"] = int(deadline_ms)
        self._worker_call(_comm_device(comm), "io.regen.Comm.Destroy", params)
        if isinstance(comm, Comm):
            comm.closed = True
