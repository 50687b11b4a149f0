# SPDX-License-Identifier: Apache-2.0
"""Kept state (io.regen.Keep, libregen's keep.c): memory regend holds for a
rank, so that a new process of the same job and rank takes it back after the
rank's process died and resumes from it, instead of from a checkpoint.

    fd = os.memfd_create("w", os.MFD_ALLOW_SEALING)       # the rank's memory
    c.keep(rank=3, name="w", fd=fd, job="train-7")         # once
    c.commit(rank=3, step=step, job="train-7")             # after each step
    ...                                                    # the process dies
    kept, fd = c.take_back(rank=3, name="w", job="train-7")   # a new process
    view = mmap.mmap(fd, kept["size"])                     # the same bytes

The memory is the rank's own (a memfd, or a CUDA VMM allocation exported as
a POSIX fd: libregen's pool, regen.pool.Pool.keep); regend holds its fd
under (job, rank, name), per uid.  The set of a job and rank is held while
the process that last kept, committed or took back in it has a connection to
the main socket; when that process goes, a lease of ``lease_ms`` starts, and
at its end regend lets the memory go.  ``job`` None: the job that names the
connection (its cgroup's, or the client's ``job``).  A consistent point to
resume from: the set's committed step (:meth:`commit`), or, for state a
program updates in place with a journal, the journal's header
(:func:`journal_header`).
"""

import os
import struct
from typing import Any, List, Optional, Tuple

from ._parts import JSON, ClientPart

__all__ = ["KeepCalls", "journal_header", "journal_layout", "JOURNAL_HEADER_BYTES"]

# proto/program_journal.h: {magic, seq, state, reserved}, little-endian u64s.
_JOURNAL_MAGIC = 0x6c6e72756f6a6772
_JOURNAL_STATES = {0: "empty", 1: "saved", 2: "done", 3: "begun"}
JOURNAL_HEADER_BYTES = 32
# proto/program_journal.h: each inout's saved bytes start at a multiple of
# this, after the header's own RP_PROG_JOURNAL_ALIGN bytes.
_JOURNAL_ALIGN = 256


def journal_header(data: Any) -> Tuple[str, Optional[int]]:
    """What a program's journal (its first JOURNAL_HEADER_BYTES bytes) says
    of the last Run that named it: ("done", seq) the Run of seq applied
    whole; ("saved", seq) a copy journal's Run that began (saved the
    inouts), or was cut by a fault of the worker after (retry it with
    ``retry=True`` and the same seq, or put them back); ("begun", seq) a
    marks journal's Run that began, or was cut by a fault after (its
    inouts may hold part of it: nothing puts them back); ("empty", None)
    no Run with this journal yet."""
    magic, seq, state, _ = struct.unpack("<4Q", bytes(data[:JOURNAL_HEADER_BYTES]))
    if magic != _JOURNAL_MAGIC or state not in (1, 2, 3):
        return "empty", None
    return _JOURNAL_STATES[state], seq


def _align(n):
    return (n + _JOURNAL_ALIGN - 1) // _JOURNAL_ALIGN * _JOURNAL_ALIGN


_BOUND_KINDS = ("input", "output", "inout", "scalar")


def journal_layout(definition, bound=None):
    """Where a Run with a journal saves each inout of the program
    ``definition`` (as io.regen.Program.Define takes it): {name: (offset,
    bytes)} in the journal, as proto/program_journal.h lays it out (the
    header, then each inout root's bytes in binding order, each at a
    multiple of 256).  ``bound``: Define's reply's binding order; by
    default the order the definition declares its bound tensors in, which
    is Define's.  A rank that finds its journal SAVED or DONE by a Run it
    must undo copies these bytes back into its tensors."""
    from .ops import DTYPE_SIZES
    tensors = {t["name"]: t for t in definition["tensors"]}
    if bound is None:
        bound = [t["name"] for t in definition["tensors"] if t["kind"] in _BOUND_KINDS]
    out, offset = {}, _JOURNAL_ALIGN
    for name in bound:
        t = tensors.get(name)
        if t is None or t["kind"] != "inout":
            continue
        shape = t["shape"]
        strides = t.get("strides")
        if strides is None:
            strides, step = [], 1
            for n in reversed(shape):
                strides.insert(0, step)
                step *= n
        span = sum((n - 1) * s for n, s in zip(shape, strides))
        nbytes = (span + 1) * DTYPE_SIZES[t["dtype"]]
        out[name] = (offset, nbytes)
        offset += _align(nbytes)
    return out


class KeepCalls(ClientPart):
    """The kept-state part of :class:`regen.Client`."""

    @staticmethod
    def _key(job: Optional[str], rank: Optional[int] = None, name: Optional[str] = None) -> JSON:
        params: JSON = {}
        if job is not None:
            params["job"] = str(job)
        if rank is not None:
            params["rank"] = int(rank)
        if name is not None:
            params["name"] = str(name)
        return params

    def keep(self, rank: int, name: str, fd: int, size: Optional[int] = None, kind: str = "host_fd",
             device: Optional[int] = None, job: Optional[str] = None, lease_ms: Optional[int] = None) -> JSON:
        """Keeps the memory of ``fd`` (the caller keeps its fd) under (job,
        rank, name); a name kept before in the set is replaced.  host_fd: a
        memfd made with MFD_ALLOW_SEALING (regend seals it against
        shrinking and growing); ``size`` defaults to its size.  cuda_fd: a
        VMM export of ``size`` bytes on regend's ``device``.  ``lease_ms``:
        at most (and by default) regend's keep_lease_ms.  Returns what
        regend lists of it (io.regen.Keep.Kept)."""
        if size is None:
            if kind != "host_fd":
                raise TypeError("keep(): a cuda_fd needs its size")
            size = os.fstat(fd).st_size
        params = self._key(job, rank, name)
        params.update(kind=kind, fd=0, size=int(size))
        if device is not None:
            params["device"] = int(device)
        if lease_ms is not None:
            params["lease_ms"] = int(lease_ms)
        return self._main_call("io.regen.Keep.Keep", params, (fd,))["kept"]

    def commit(self, rank: int, step: int, job: Optional[str] = None) -> List[str]:
        """Records ``step`` as the set's last completed step, once its
        writes are done (for state the rank updates with its own kernels:
        after its stream is synchronised).  Returns the names in the set."""
        params = self._key(job, rank)
        params["step"] = int(step)
        return self._main_call("io.regen.Keep.Commit", params)["names"]

    def take_back(self, rank: int, name: str, job: Optional[str] = None, uid: Optional[int] = None) -> Tuple[JSON, int]:
        """Takes back one name: (kept, fd), the fd the caller's to map and
        close.  The name stays kept and this process holds the set from now
        on.  :class:`regen.NoSuchObject` when nothing is kept under it;
        ``uid`` (another's) is for admins."""
        params = self._key(job, rank, name)
        if uid is not None:
            params["uid"] = int(uid)
        reply, fds = self._main_call_with_fds("io.regen.Keep.TakeBack", params)
        if not fds:
            from . import errors
            raise errors.ProtocolError(parameters={"message": "io.regen.Keep.TakeBack's reply carried no fd"})
        for extra in fds[1:]:
            os.close(extra)
        return reply["kept"], fds[0]

    def drop(self, job: str, rank: Optional[int] = None, name: Optional[str] = None, uid: Optional[int] = None) -> JSON:
        """Frees kept memory now: one name, one set (no name) or every set
        of the job.  {"names", "bytes"} dropped."""
        params = self._key(job, rank, name)
        if uid is not None:
            params["uid"] = int(uid)
        return self._main_call("io.regen.Keep.Drop", params)

    def kept(self, job: Optional[str] = None, uid: Optional[int] = None) -> List[JSON]:
        """Every name kept on the node, or those of ``job`` and ``uid``."""
        params = self._key(job)
        if uid is not None:
            params["uid"] = int(uid)
        return self._main_call("io.regen.Keep.List", params)["kept"]
