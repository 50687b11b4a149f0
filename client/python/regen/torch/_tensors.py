# SPDX-License-Identifier: Apache-2.0
"""Torch tensors in regen.Client's calls: a tensor's storage imported into
regend by CUDA IPC (once per generation), a tensor as an Operand, the
ordering with torch's current streams, and the calls whose operands are
all imported tensors read straight onto the lane's ring by regen._accel.

regen.Client (standard library only) hands every operand that is not an
Operand here, and import_tensor and close_tensor too (regen.objects'
tensor_imports finds this module once torch is loaded).  This module
imports no torch itself: whoever passes a tensor has, and it takes torch
from sys.modules then.
"""

import sys

from .. import accel, errors
from ..compute import Operand, scalars_record
from ..objects import event_id, tensor_imports
from ..ops import DTYPE_CODES, NAME_SETS, OP_IDS, REQUIRED_NAMES, SLOT_NAMES

__all__ = ["TensorImports", "imports_of", "queue_tensors", "release_ipc_counter", "untyped_storage"]


def imports_of(client):
    """``client``'s TensorImports (made on first use)."""
    return tensor_imports(client)


class TensorImports:
    """One client's imports of torch tensors' storages."""

    def __init__(self, client):
        self.client = client
        self.buffers = {}          # (device, storage data_ptr) -> Buffer
        # Bumped whenever buffers or a generation changes: the address
        # spans regen._accel looks tensors up in are built again.
        self.epoch = 0
        self._spans, self._spans_epoch = {}, None
        # torch IPC counters of imports whose answer was lost: (device,
        # generation then, counter).
        self.unsure_counters = []

    # -- what the client asks ------------------------------------------------

    def is_tensor(self, x):
        return _is_torch_tensor(x)

    def is_column_major(self, x):
        """Whether ``x`` is a 2-D torch tensor laid out column-major (a
        transposed view), which a GEMM takes as its transpose, row-major."""
        return _is_torch_tensor(x) and x.dim() == 2 and x.stride(-1) != 1 and x.stride(-2) == 1

    def sync(self, tensors):
        _sync_torch(tensors)

    def operand(self, t, name):
        dtype = _tensor_dtype(t)
        if dtype is None:
            raise TypeError(f"operand {name}: regend takes f32, f16, bf16, float8_e4m3fn and float8_e5m2 (and int32 "
                            f"sequence lengths) tensors, not {t.dtype}")
        offset = t.storage_offset() * t.element_size()
        # The storage's start without making a storage object (a call's worth
        # of the client's own cost): an import found for it is the one to use.
        # get_device(), not device.index: no device object per operand (-1 on
        # the CPU, which import_tensor refuses by name).
        dev = t.get_device()
        buf = self.buffers.get((dev, t.data_ptr() - offset))
        if buf is None or buf.closed or buf.generation < self.client._generations.get(dev, 0):
            buf = self.client.import_tensor(t)
        return Operand.trusted(buf, offset, dtype, list(t.shape), list(t.stride()))

    def bound_at(self, t):
        """A Run's binding of tensor ``t``: (buffer id, byte offset)."""
        return str(self.client.import_tensor(t).id), t.storage_offset() * t.element_size()

    def import_tensor(self, tensor, device=None):
        """regen.Client.import_tensor's work."""
        if not getattr(tensor, "is_cuda", False):
            raise TypeError("import_tensor needs a CUDA tensor; for host memory use import_memfd")
        client = self.client
        storage = untyped_storage(tensor)
        dev = tensor.device.index if device is None else int(device)
        key = (dev, storage.data_ptr())
        buf = self.buffers.get(key)
        if buf is not None and not buf.closed and buf.generation >= client._generations.get(dev, 0):
            return buf
        shared = storage._share_cuda_()
        handle, size_bytes, offset_bytes = shared[1], shared[2], shared[3]
        ref_counter = (shared[4], shared[5])
        try:
            buf = client.import_cuda_ipc(dev, handle, offset_bytes, size_bytes, keepalive=tensor)
        except BaseException as e:
            self.counter_after_failed_import(dev, ref_counter, e)
            raise
        # _share_cuda_ set a reference counter that a torch consumer would
        # decrement when done; without that the storage, once freed, would
        # never return to torch's allocator.  regend is the consumer here, so
        # the client decrements it when regend unmaps the buffer.
        buf._on_drop = lambda: release_ipc_counter(*ref_counter)
        self.buffers[key] = buf
        self.epoch += 1
        return buf

    def close_tensor(self, tensor, device=None):
        """regen.Client.close_tensor's work."""
        dev = tensor.device.index if device is None else int(device)
        buf = self.buffers.get((dev, untyped_storage(tensor).data_ptr()))
        if buf is None:
            return False
        try:
            self.client.close_buffer(buf)
        except (errors.StaleGeneration, errors.NoSuchObject):
            pass
        return True

    def counter_after_failed_import(self, device, counter, exc):
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
            self.unsure_counters.append((device, self.client._generations.get(device, 0), counter))
        else:
            release_ipc_counter(*counter)

    def note_generation(self, device, generation):
        """Imports of ``device`` older than ``generation`` are gone."""
        for key, buf in list(self.buffers.items()):
            if buf.device == device and buf.generation < generation:
                del self.buffers[key]
        self.epoch += 1
        for held in [u for u in self.unsure_counters if u[0] == device and u[1] < generation]:
            self.unsure_counters.remove(held)
            release_ipc_counter(*held[2])

    def forget_buffer(self, buf):
        """``buf`` was closed."""
        for key, b in list(self.buffers.items()):
            if b is buf:
                del self.buffers[key]
                self.epoch += 1

    # -- calls read straight from the tensors -----------------------------------

    def spans(self, device):
        """[(start, end, Buffer)] of the storages of torch device ``device``
        imported in the current generation, sorted by start (regen._accel
        finds a tensor's buffer among them by bisection), or None where
        there are none."""
        if self._spans_epoch != self.epoch:
            spans = {}
            generations = self.client._generations
            for (dev, base), buf in self.buffers.items():
                if not buf.closed and buf.generation >= generations.get(dev, 0):
                    spans.setdefault(dev, []).append((base, base + buf.size, buf))
            for found in spans.values():
                found.sort(key=_span_start)
            self._spans, self._spans_epoch = spans, self.epoch
        return self._spans.get(device)

    def compute_accel(self, op_name, named, scalars, signal_event):
        """A compute call whose operands are all torch tensors already
        imported, on a lane on the ring, read by regen._accel: (lane,
        ticket, device) once queued, None with nothing queued (the client's
        usual way takes the call, and raises what is wrong with it)."""
        torch = sys.modules.get("torch")
        client = self.client
        if torch is None or accel.module is None or client.transport == "varlink":
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
        if local is None or local < 0 or not named.keys() <= NAME_SETS[op_name]:
            return None
        for name in REQUIRED_NAMES[op_name]:
            if named.get(name) is None:
                return None
        lane = client._lanes.get(local)
        if lane is None or not lane.ring or lane.transport_epoch != client._transport_epoch:
            return None
        spans = self.spans(local)
        if spans is None:
            return None
        record = scalars_record(op_name, scalars)
        _sync_torch(tensors)
        ticket = queue_tensors(client, local, op_name, SLOT_NAMES[op_name], named, local, spans,
                               _torch_dtype_codes(torch), record, signal_event)
        if ticket is None:
            return None
        client.accel_calls += 1
        return lane, ticket, local


def queue_tensors(client, device, op_name, names, tensors, local, kept, dtypes, record_scalars, signal_event=None):
    """Queues one call on ``device``'s ring straight from its tensors
    (regen._accel reads them; Client.queue_encoded takes the call from
    values resolved already): ``names`` the op's operand slots in order,
    ``tensors`` name -> tensor or None, all on torch device ``local`` (-1:
    host memory) and each inside one of ``kept``'s (start, end, buffer)
    spans, ``dtypes`` torch dtype -> dtype code.  Returns the ticket, or
    None with nothing queued where regen._accel is not loaded, the lane is
    not on the ring, or an operand is not covered (outside the spans, an
    unknown dtype, another device, rank 0 or over 4)."""
    lane = client._lanes.get(device)
    # A lane on the ring that needs no picking (as _lane finds it), else
    # _lane's picking.
    if lane is None or not lane.ring or not lane.decided or lane.transport_epoch != client._transport_epoch:
        if accel.module is None:
            return None
        lane = client._lane(device)
        if not lane.ring:
            return None
    signal_id = event_id(signal_event) if signal_event is not None else None
    r = accel.module.submit_tensors(client._ring_client, device, OP_IDS[op_name], record_scalars, signal_id, names,
                                    tensors, local, kept, dtypes)
    if r > 0:
        return r + lane.base
    if r == 0:
        return None
    return client._ring_ticket(device, lane, r)


# -- torch, taken from sys.modules by whoever handed a tensor ---------------------

def _is_torch_tensor(x):
    # A process that holds a tensor has imported torch; this module never
    # does.  isinstance, not the type's module and methods: torch 1.13's
    # tensors have no untyped_storage(), and a subclass (Parameter, a
    # user's) may live in any module.
    torch = sys.modules.get("torch")
    return torch is not None and isinstance(x, torch.Tensor)


def untyped_storage(t):
    """The storage ``t`` views, untyped: untyped_storage() from torch 2.0,
    the typed storage's untyped() before (1.13)."""
    get = getattr(t, "untyped_storage", None)
    return get() if get is not None else t.storage().untyped()


# torch's float8 dtypes (2.1 and later) are regend's FP8 ones.
_TORCH_DTYPES = {"torch.float32": "f32", "torch.float16": "f16", "torch.bfloat16": "bf16", "torch.int32": "i32",
                 "torch.float8_e4m3fn": "e4m3", "torch.float8_e5m2": "e5m2"}


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


_DTYPES_BY_TORCH: dict = {}


def release_ipc_counter(handle, offset):
    """Decrement torch's CUDA IPC reference counter for one _share_cuda_()
    (what a torch consumer does when it frees a received storage).  Best
    effort, like torch's own."""
    torch = sys.modules.get("torch")
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


def _torch_dtype_codes(torch):
    """torch dtype -> a record's dtype code, made once."""
    global _TORCH_DTYPE_CODES
    if _TORCH_DTYPE_CODES is None:
        _TORCH_DTYPE_CODES = {getattr(torch, name.split(".")[1]): DTYPE_CODES[code]
                              for name, code in _TORCH_DTYPES.items() if hasattr(torch, name.split(".")[1])}
    return _TORCH_DTYPE_CODES


_TORCH_DTYPE_CODES = None


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


_CURRENT_STREAMS: dict = {}
