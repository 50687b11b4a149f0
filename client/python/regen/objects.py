# SPDX-License-Identifier: Apache-2.0
"""What regend names for this process (libregen's objects.c): buffers and
events imported into a device's worker, each an id that lives in one
generation, open until closed; their imports and closes (io.regen.Memory).

Torch tensors are imported by regen.torch (regen/torch/_tensors.py):
``import_tensor`` and ``close_tensor`` hand them over, and operands that
are tensors are resolved there; this module knows no torch.
"""

import fcntl
import importlib
import sys
from typing import Any, Callable, Optional, Union

from . import errors
from ._parts import JSON, ClientPart
from .connection import id_device

__all__ = ["Objects", "Buffer", "Event", "normalize_ipc_handle"]


class _Object:
    """What every object regend names has: its wire id (``str(obj)``), the
    device and generation it lives in, and whether it was closed."""

    __slots__ = ("id", "device", "generation", "closed")

    def __init__(self, id: str, device: int, generation: int) -> None:
        self.id = id
        self.device = device
        self.generation = generation
        self.closed = False

    def __str__(self) -> str:
        return self.id

    def _state(self):
        return " closed" if self.closed else ""


class Buffer(_Object):
    """An imported buffer.  ``str(buf)`` is its wire id (``b<dev>.<gen>.<n>``).
    ``keepalive`` is what must stay alive while regend maps the memory (the
    torch tensor of import_tensor); closing the buffer drops it."""

    __slots__ = ("size", "kind", "keepalive", "_on_drop")

    def __init__(self, id: str, device: int, generation: int, size: int, kind: str, keepalive: Any = None) -> None:
        super().__init__(id, device, generation)
        self.size = size
        self.kind = kind
        self.keepalive = keepalive
        self._on_drop: Optional[Callable[[], None]] = None

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


def buffer_id(buf: Union[Buffer, str]) -> str:
    return buf.id if isinstance(buf, Buffer) else str(buf)


def event_id(ev: Union["Event", str]) -> str:
    return ev.id if isinstance(ev, Event) else str(ev)


def tensor_imports(client, create=True):
    """regen.torch's imports of torch tensors for ``client``
    (regen/torch/_tensors.py), or None where torch is not loaded (nothing
    can be a tensor then) or ``create`` is false and there are none yet."""
    tensors = getattr(client, "_tensors", None)
    if tensors is not None or not create:
        return tensors
    glue = sys.modules.get("regen.torch._tensors")
    if glue is None:
        if "torch" not in sys.modules:
            return None
        glue = importlib.import_module("regen.torch._tensors")
    tensors = client._tensors = glue.TensorImports(client)
    return tensors


class Objects(ClientPart):
    """The objects part of :class:`regen.Client`: imports, closes, and the
    generations they live in."""

    def _forget_objects(self):
        """What this process holds in regend, as the client knows it."""
        self._generations = {}    # device -> last generation seen
        self._buffers = {}        # id -> Buffer
        self._events = {}         # id -> Event
        self._tensors = None      # regen.torch's TensorImports, once a tensor came

    def _forget_generation(self, device, generation):
        """A new generation unmapped every older import of the device: what
        kept their memory alive can go (the ids still raise
        StaleGeneration)."""
        for bid, buf in list(self._buffers.items()):
            if buf.device == device and buf.generation < generation:
                del self._buffers[bid]
                buf._drop()
        for eid, ev in list(self._events.items()):
            if ev.device == device and ev.generation < generation:
                del self._events[eid]
        if self._tensors is not None:
            self._tensors.note_generation(device, generation)

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

    def import_memfd(self, device: int, fd: int, size: int, offset: int = 0) -> Buffer:
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

    def import_cuda_fd(self, device: int, fd: int, size: int, offset: int = 0) -> Buffer:
        """Map [offset, offset+size) of a CUDA VMM allocation exported as a
        POSIX file descriptor (cuMemExportToShareableHandle).  The fd is
        passed with SCM_RIGHTS; the caller may close its copy afterwards."""
        return self._import_fd(device, "cuda_fd", fd, size, offset)

    def import_cuda_ipc(self, device: int, handle_bytes: Union[bytes, str], offset: int, size: int,
                        keepalive: Any = None) -> Buffer:
        """Map [offset, offset+size) of the allocation a cudaIpcMemHandle_t
        names.  ``handle_bytes``: the 64-byte handle, torch's versioned
        shareable handle (a version byte, b"c", then the 64 bytes), or 128
        hex digits."""
        handle = normalize_ipc_handle(handle_bytes)
        params = {"device": int(device), "kind": "cuda_ipc", "size": int(size),
                  "offset": int(offset), "handle": handle}
        return self._import(device, params, keepalive=keepalive)

    def import_tensor(self, tensor: Any, device: Optional[int] = None) -> Buffer:
        """Share a torch CUDA tensor's storage with regend by CUDA IPC.  The
        Buffer covers the whole storage and keeps ``tensor`` alive until it
        is closed.  A storage already imported in the current generation is
        not imported twice.  ``device``: regend's index for the tensor's GPU
        (default: the tensor's CUDA index; they differ only when
        CUDA_VISIBLE_DEVICES differs between this process and regend).
        An import that raises ConnectionReset may have been made: the
        storage is held from torch's reuse until the device's generation
        changes.  (regen.torch does the work.)"""
        tensors = tensor_imports(self)
        if tensors is None or not tensors.is_tensor(tensor):
            raise TypeError("import_tensor needs a CUDA tensor; for host memory use import_memfd")
        return tensors.import_tensor(tensor, device)

    def close_tensor(self, tensor: Any, device: Optional[int] = None) -> bool:
        """Close the buffer import_tensor (or a GEMM on the tensor) made for
        this tensor's storage, if any; returns whether there was one."""
        tensors = tensor_imports(self, create=False)
        return tensors is not None and tensors.close_tensor(tensor, device)

    def _close(self, method, key, ident, obj, forget):
        """Close a buffer or event (obj: ours, or None for a bare id) in its
        worker and forget it, unless the connection broke with the call in
        flight: then the worker may still hold it."""
        device = obj.device if obj is not None else id_device(ident)
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

    def close_buffer(self, buffer: Union[Buffer, str]) -> JSON:
        """Unmap a buffer in regend, then drop what kept its memory alive.
        After a ConnectionReset the buffer is kept: the worker may still map it."""
        bid = buffer_id(buffer)
        return self._close("io.regen.Memory.CloseBuffer", "buffer", bid, self._buffers.get(bid), self._forget)

    def _forget(self, buf):
        if buf is None:
            return
        buf.closed = True
        self._buffers.pop(buf.id, None)
        if self._tensors is not None:
            self._tensors.forget_buffer(buf)
        buf._drop()

    def import_event(self, device: int, handle_bytes: Union[bytes, str]) -> "Event":
        """Import a cudaIpcEventHandle_t (64 bytes, or 128 hex digits) of an
        event created with interprocess=True; returns an :class:`Event` for
        the ``wait_event``/``signal_event`` of compute calls."""
        handle = _handle_hex(handle_bytes, "cudaIpcEventHandle_t")
        reply = self._worker_call(device, "io.regen.Memory.ImportEvent", {"device": int(device), "handle": handle})
        ev = Event(reply["event"], int(device), reply["generation"])
        self._note_generation(ev.device, ev.generation)
        self._events[ev.id] = ev
        return ev

    def close_event(self, event: Union["Event", str]) -> JSON:
        """Forget an event in regend (an Event or its id)."""
        eid = event_id(event)
        return self._close("io.regen.Memory.CloseEvent", "event", eid, self._events.get(eid), self._forget_event)

    def _forget_event(self, ev):
        if ev is not None:
            ev.closed = True
            self._events.pop(ev.id, None)


_HEXDIGITS = frozenset("0123456789abcdef")


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


def normalize_ipc_handle(handle: Union[bytes, bytearray, memoryview, str]) -> str:
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
