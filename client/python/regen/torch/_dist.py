# SPDX-License-Identifier: Apache-2.0
"""torch.distributed's backend "regen": a process group whose collectives
run as io.regen.Comm calls on communicators regend owns, so NCCL lives in
regend's workers and not in the rank (TorchFT's ProcessGroupBabyNCCL is the
precedent).  `import regen.torch` registers it:

    import torch.distributed as dist, regen.torch
    dist.init_process_group(backend="regen")          # or "cuda:regen" (torch >= 2.1)
    model = torch.nn.parallel.DistributedDataParallel(model)

What it does (docs/torch.md, "torch.distributed: the regen backend"):

* One communicator per regend device the group's tensors live on, made at
  the group's first collective there: rank 0 asks its worker for a unique
  id and hands it to the others through torch's store.  Each communicator
  has a key (job, group, device kind, rank): a rank that comes back (a
  torchrun restart) Attaches the communicator its earlier process left
  instead of a new init, when every rank of the group attached one after as
  many collectives; otherwise the group inits afresh.
* CPU tensors go through regend's host backend (CI, tests): staged in a
  memfd the worker maps, on the device REGEN_TORCH_HOST_DEVICE names, else
  the rank's LOCAL_RANK modulo regend's devices.  CUDA tensors go in place
  (regen.torch's imports), regend's work ordered after the rank's current
  stream by an IPC event, answered when done.
* Calls run in issue order on one thread per group (every rank issues its
  collectives in one order, as NCCL requires), so the caller gets a Work at
  once and DDP overlaps its backward with them.
* A call that fails (a peer's loss: CommFailed; a device's new generation)
  fails its Work by name; the group's next call on that device builds the
  communicator again, on every rank, through the store.

Feature-tested, not version-pinned: torch 1.13's ProcessGroup trampoline and
register_backend(name, func) and torch 2.x's register_backend(..., devices=)
and ProcessGroup subclass alike.
"""

import atexit
import collections
import itertools
import mmap
import os
import queue
import sys
import threading
import time
import warnings
import weakref
from typing import Any, Optional
from datetime import timedelta

import torch
import torch.distributed as dist

from .. import errors
from ..client import Client, Operand

__all__ = ["ProcessGroupRegen", "register", "BACKEND_NAME"]

BACKEND_NAME = "regen"

_DTYPES = {torch.float32: "f32", torch.float16: "f16", torch.bfloat16: "bf16", torch.float64: "f64",
           torch.int32: "i32", torch.int64: "i64", torch.uint8: "u8", torch.bool: "u8"}
# Staging: the smallest memfd, and the alignment of every operand in it.
_STAGING_MIN = 1 << 20
_ALIGN = 256
# Errors after which the group's next call on the device builds its
# communicator again.
_REBUILD = (errors.CommFailed, errors.CommTimeout, errors.StaleGeneration, errors.DeviceLost, errors.Draining,
            errors.NoSuchObject, errors.ConnectionReset, errors.Unavailable)

_group_serial = itertools.count()


def _reduce_name(op, dtype):
    """io.regen.Comm's reduction for torch's ReduceOp (bool as torch's NCCL
    group does: SUM is MAX, PRODUCT is MIN)."""
    R = dist.ReduceOp
    table = [(R.SUM, "sum"), (R.MAX, "max"), (R.MIN, "min"), (R.PRODUCT, "prod")]
    if hasattr(R, "AVG"):
        table.append((R.AVG, "avg"))
    for value, name in table:
        if op == value:
            if dtype == torch.bool:
                return {"sum": "max", "prod": "min"}.get(name, name)
            return name
    raise NotImplementedError(f"regen process group: reduction {op} is not one regend runs (sum, max, min, "
                              "product, avg)")


def _work_from_future(fut):
    """A c10d Work that completes with ``fut`` and raises its error from
    wait().  Not torch's _create_work_from_future: its wait() returns at
    once on torch 1.13 and never raises the future's error (torch 2.x)."""
    return _PyWork(fut)


_WorkBase = getattr(dist, "_Work", None) or dist.Work


class _PyWork(_WorkBase):
    """A Work whose wait and future are Python's.  torch's C++ side (DDP)
    may hold it past the last Python reference, and a Python Work that died
    falls back to the C++ base's wait, which never returns: each is kept
    alive until done and among the last RECENT done ones after."""

    RECENT = 4096
    _alive = set()
    _recent = collections.deque(maxlen=RECENT)
    _lock = threading.Lock()

    def __init__(self, fut):
        super().__init__()
        self._fut = fut
        with _PyWork._lock:
            _PyWork._alive.add(self)
        fut.add_done_callback(lambda _: self._retire())

    def _retire(self):
        with _PyWork._lock:
            _PyWork._alive.discard(self)
            _PyWork._recent.append(self)

    def wait(self, timeout=None):
        self._fut.wait()
        return True

    def is_completed(self):
        return self._fut.done()

    def is_success(self):
        return self._fut.done()

    def get_future(self):
        return self._fut


class _Staging:
    """A memfd imported once into one regend device, viewed as a torch
    tensor: CPU tensors are copied through it (torch's allocator's memory
    is not a file regend can map)."""

    def __init__(self):
        self.fd, self.size, self.map, self.bytes, self.buffer = -1, 0, None, None, None

    def ensure(self, client, device, nbytes):
        if self.buffer is not None and nbytes <= self.size and not self.buffer.closed:
            return
        size = max(_STAGING_MIN, self.size)
        while size < nbytes:
            size *= 2
        self.close(client)
        # Sealable: the client seals it against shrinking, as regend asks.
        self.fd = os.memfd_create("regen-dist-staging", os.MFD_CLOEXEC | os.MFD_ALLOW_SEALING)
        os.ftruncate(self.fd, size)
        self.map = mmap.mmap(self.fd, size)
        self.bytes = torch.frombuffer(self.map, dtype=torch.uint8)
        self.size = size
        self.buffer = client.import_memfd(device, self.fd, size)

    def view(self, offset, n, dtype):
        nbytes = n * torch.empty((), dtype=dtype).element_size()
        return self.bytes[offset:offset + nbytes].view(dtype)

    def operand(self, offset, n, dtype):
        return Operand(self.buffer, offset, _DTYPES[dtype], [n])

    def close(self, client):
        if self.buffer is not None and not self.buffer.closed:
            try:
                client.close_buffer(self.buffer)
            except errors.Error:
                pass
        self.buffer = None
        self.bytes = None
        if self.map is not None:
            try:
                self.map.close()
            except BufferError:
                pass   # a view still lives: the mapping goes with it
        self.map = None
        if self.fd >= 0:
            os.close(self.fd)
        self.fd = -1


def _shutdown_at_exit(ref):
    """A process that ends well destroys its communicators; one that ends
    with an exception leaves them detached in regend (keyed), for its next
    process to re-attach (a crash or a signal leaves them so anyway)."""
    pg = ref()
    if pg is not None:
        try:
            pg.shutdown(destroy=getattr(sys, "last_value", None) is None)
        except Exception:  # noqa: BLE001 - the process is ending
            pass


def _aligned(n):
    return (n + _ALIGN - 1) // _ALIGN * _ALIGN


def _nbytes(t):
    return t.numel() * t.element_size()


def _job():
    """What names the job in communicator keys: torchrun's run id, else
    REGEN_JOB, else the store's address."""
    for name in ("TORCHELASTIC_RUN_ID", "REGEN_JOB"):
        v = os.environ.get(name)
        if v:
            return "".join(c if 0x21 <= ord(c) <= 0x7e else "_" for c in v)[:48]
    return (os.environ.get("MASTER_ADDR", "local") + ":" + os.environ.get("MASTER_PORT", "0"))[:48]


class ProcessGroupRegen(dist.ProcessGroup):
    """A torch.distributed process group over regend's communicators (see
    the module's doc).  Made by init_process_group(backend="regen") and
    new_group(backend="regen"); ``socket`` is regend's ($REGEN_SOCKET)."""

    def __init__(self, store: Any, rank: int, size: int, timeout: Any = None, socket: Optional[str] = None) -> None:
        try:
            super().__init__(rank, size)
        except TypeError:
            super().__init__(store, rank, size)
        self._store = store
        self._rank, self._size = rank, size
        timeout = timeout if timeout is not None else timedelta(minutes=30)
        self._deadline_ms = max(1, min(int(timeout.total_seconds() * 1000), 86400000))
        self._client = Client(socket, timeout=max(60.0, timeout.total_seconds() + 30))
        self._tag = f"pg{next(_group_serial)}"
        self._comms = {}        # regend device -> regen.Comm
        self._broken = set()    # regend devices whose communicator must be built again
        self._staging = {}      # regend device -> _Staging
        self._host_device = None
        self._queue = queue.Queue()
        self._thread = threading.Thread(target=self._serve, name=f"regen-{self._tag}", daemon=True)
        self._thread.start()
        atexit.register(_shutdown_at_exit, weakref.ref(self))
        self.reattached = {}    # regend device -> bool: the last build re-attached

    # -- what torch asks of a process group ------------------------------------

    def getBackendName(self) -> str:
        return BACKEND_NAME

    def _get_backend_name(self):
        return BACKEND_NAME

    def name(self) -> str:
        return BACKEND_NAME

    def size(self) -> int:
        return self._size

    def rank(self) -> int:
        return self._rank

    # -- the calls' thread --------------------------------------------------------

    def _submit(self, fn, result, cuda_device=None):
        """Runs fn() on the group's thread after the calls before it;
        returns a Work whose future gives ``result`` (the tensors, as torch's
        groups do) once fn returned, or fn's exception."""
        fut = None
        if cuda_device is not None:
            # A CUDA-aware future (torch >= 1.9): its waiters' streams
            # are ordered after what the group's thread wrote.
            try:
                fut = torch.futures.Future(devices=[cuda_device])
            except TypeError:
                fut = None
        if fut is None:
            fut = torch.futures.Future()
        self._queue.put((fn, result, fut))
        return _work_from_future(fut)

    def _serve(self):
        while True:
            item = self._queue.get()
            if item is None:
                return
            fn, result, fut = item
            try:
                fn()
            except BaseException as e:  # noqa: BLE001 - handed to the Work
                fut.set_exception(e)
            else:
                fut.set_result(result)

    def shutdown(self, destroy: bool = True) -> None:
        """Ends the group's thread and destroys its communicators (torch 2.x
        calls it at destroy_process_group; the process's exit otherwise);
        with ``destroy`` false they are left detached (keyed) for a later
        process of the job. Calling it again does nothing."""
        if self._thread is None:
            return
        self._queue.put(None)
        self._thread.join(30)
        self._thread = None
        # torch's store (rank 0's holds the TCPStore's server thread) goes
        # with torch's own references, before the interpreter's teardown.
        self._store = None
        for dev, comm in list(self._comms.items()):
            if not destroy and dev not in self._broken:
                continue
            try:
                self._client.comm_destroy(comm, abort=dev in self._broken)
            except errors.Error:
                pass
        self._comms.clear()
        for dev, st in self._staging.items():
            st.close(self._client)
        self._client.close()

    # -- devices and communicators ------------------------------------------------

    def _device_of(self, t):
        if t.is_cuda:
            from . import runtime
            return runtime().regend_device(t.device)
        if self._host_device is None:
            told = os.environ.get("REGEN_TORCH_HOST_DEVICE")
            if told is not None:
                self._host_device = int(told)
            else:
                n = len(self._client.status().get("devices", [])) or 1
                self._host_device = int(os.environ.get("LOCAL_RANK", self._rank)) % n
        return self._host_device

    def _key(self, device, kind):
        return f"{_job()}/{self._tag}/n{self._size}/{kind}{device}/r{self._rank}"[:128]

    def _comm(self, device, kind):
        comm = self._comms.get(device)
        if comm is not None and device not in self._broken:
            return comm
        if comm is not None:
            try:
                self._client.comm_destroy(comm, abort=True)
            except errors.Error:
                pass
            del self._comms[device]
        self._broken.discard(device)
        comm = self._build(device, kind)
        self._comms[device] = comm
        return comm

    def _again(self, fn, *args, **kw):
        """fn(...) until the device serves (a fault or restart under way
        answers Draining, Unavailable or DeviceLost for a moment), within
        the group's timeout."""
        until = time.monotonic() + self._deadline_ms / 1000
        while True:
            try:
                return fn(*args, **kw)
            except (errors.Draining, errors.Unavailable, errors.DeviceLost, errors.ConnectionReset):
                if time.monotonic() > until:
                    raise
                time.sleep(0.05)

    def _build(self, device, kind):
        """The group's communicator on ``device``: re-attached where every
        rank attached one after as many collectives, else made afresh (rank
        0's unique id through the store)."""
        key = self._key(device, kind)
        store, n, me = self._store, self._size, self._rank
        # Ranks sit on devices of their own: the rendezvous is by kind.
        arrival = store.add(f"regen/{self._tag}/{kind}/arrivals", 1)
        epoch = (arrival - 1) // n
        base = f"regen/{self._tag}/{kind}/{epoch}"
        attached = None
        try:
            attached = self._again(self._client.comm_attach, key, device=device)
        except (errors.NoSuchObject, errors.CommFailed, errors.CommInFlight):
            attached = None
        if attached is not None and (attached.rank != me or attached.nranks != n):
            self._client.comm_destroy(attached, abort=True)
            attached = None
        store.set(f"{base}/attached/{me}", str(attached.collectives if attached is not None else -1))
        counts = [int(store.get(f"{base}/attached/{r}")) for r in range(n)]
        if counts[0] >= 0 and all(c == counts[0] for c in counts):
            self.reattached[device] = True
            return self._noted(attached, device, kind)
        if attached is not None:
            self._client.comm_destroy(attached, abort=True)
        if me == 0:
            store.set(f"{base}/uid", self._again(self._client.comm_unique_id, device))
        uid = store.get(f"{base}/uid").decode()
        try:
            comm = self._again(self._client.comm_init, uid, me, n, device=device, key=key,
                               deadline_ms=self._deadline_ms)
        except errors.InvalidParameter as e:
            if e.parameters.get("parameter") != "key":
                raise
            # The key's communicator is still held (a call of an earlier
            # process in flight): this one goes without re-attach.
            warnings.warn(f"regen process group: key {key!r} is taken on device {device}; this communicator "
                          "cannot be re-attached after a restart", stacklevel=2)
            comm = self._client.comm_init(uid, me, n, device=device, deadline_ms=self._deadline_ms)
        self.reattached[device] = False
        return self._noted(comm, device, kind)

    def _noted(self, comm, device, kind):
        """regen.torch's imports (CUDA) learn the communicator's
        generation: those of an older one are made again."""
        if kind == "cuda":
            from . import runtime
            rt = runtime()
            with rt.lock:
                rt._seen_generation(device, comm.generation)
        return comm

    def _call(self, device, kind, method, *args, **kw):
        """One io.regen.Comm call on the group's communicator on ``device``;
        a failure marks it to be built again at the group's next call."""
        comm = self._comm(device, kind)
        try:
            return getattr(self._client, method)(comm, *args, deadline_ms=self._deadline_ms, **kw)
        except _REBUILD:
            self._broken.add(device)
            # A new generation unmapped the staging too: made again next.
            staging = self._staging.pop(device, None)
            if staging is not None:
                staging.close(self._client)
            raise

    # -- staging and ordering -------------------------------------------------------

    def _prepare(self, tensors):
        """(device, kind, cuda device or None, ordering) of the call's
        tensors, which must be on one device. For CUDA the rank's current
        stream is recorded now, at issue, on the (device, stream)'s IPC
        event that regend's work will wait for; ordering is (stream, local
        index) then, None where the stream was idle."""
        devs = {t.device for t in tensors}
        if len(devs) != 1:
            raise ValueError(f"regen process group: a call's tensors must be on one device, got {sorted(map(str, devs))}")
        d = next(iter(devs))
        if d.type == "cpu":
            return self._device_of(tensors[0]), "host", None, None
        if d.type != "cuda":
            raise NotImplementedError(f"regen process group: {d.type} tensors are not regend's")
        from . import runtime
        rt = runtime()
        device = rt.regend_device(d)
        stream = torch.cuda.current_stream(d)
        ordering = None
        with rt.lock:
            if rt.ordering == "sync":
                stream.synchronize()
            elif not stream.query():
                rt._events_for(device, stream, d.index).before.record(stream)
                ordering = (stream, d.index)
        return device, "cuda", d, ordering

    def _cuda_operand(self, t, device):
        from . import runtime
        rt = runtime()
        with rt.lock:
            found = rt._place(t, False, device)
        return Operand.trusted(found[0], found[1], _DTYPES[t.dtype], [t.numel()], [1])

    def _run(self, tensors, body, result):
        """Submits ``body(io)`` for the call's tensors; io moves them to and
        from regend (staging for CPU tensors, in place for CUDA ones)."""
        for t in tensors:
            if t.dtype not in _DTYPES:
                raise NotImplementedError(f"regen process group: {t.dtype} is not a dtype regend's communicators "
                                          "carry (float32/16, bfloat16, float64, int32/64, uint8, bool)")
        device, kind, cuda, ordering = self._prepare(tensors)
        io = _CudaIO(self, device, cuda, ordering) if cuda is not None else _HostIO(self, device)

        def run():
            # The communicator first: a rebuild after a fault learns the
            # device's new generation before the operands are placed.
            self._comm(device, kind)
            body(io, device, kind)
        return self._submit(run, result, cuda)

    # -- collectives ------------------------------------------------------------------

    def allreduce(self, tensors: Any, opts: Any = None) -> Any:
        op = opts.reduceOp if opts is not None else dist.ReduceOp.SUM

        def body(io, device, kind):
            for t in tensors:
                o = io.inout(t)
                self._call(device, kind, "comm_all_reduce", o, o, op=_reduce_name(op, t.dtype), **io.events())
                io.done()
        return self._run(tensors, body, tensors)

    def allreduce_coalesced(self, tensors: Any, opts: Any = None) -> Any:
        return self.allreduce(tensors, opts)

    def broadcast(self, tensors: Any, opts: Any = None) -> Any:
        root = opts.rootRank if opts is not None else 0

        def body(io, device, kind):
            for t in tensors:
                o = io.inout(t)
                self._call(device, kind, "comm_broadcast", o, o, root=root, **io.events())
                io.done()
        return self._run(tensors, body, tensors)

    def allgather(self, output_tensors: Any, input_tensors: Any, opts: Any = None) -> Any:
        def body(io, device, kind):
            for outs, t in zip(output_tensors, input_tensors):
                src = io.input(t)
                dst = io.output_flat(t.dtype, t.numel() * self._size)
                self._call(device, kind, "comm_all_gather", src, dst, **io.events())
                io.done()
                flat = io.result()
                for k, o in enumerate(outs):
                    o.copy_(flat[k * t.numel():(k + 1) * t.numel()].view_as(o))
        return self._run(list(input_tensors) + [o for outs in output_tensors for o in outs], body, output_tensors)

    def _allgather_base(self, output, input, opts=None):
        def body(io, device, kind):
            src = io.input(input)
            dst = io.output(output)
            self._call(device, kind, "comm_all_gather", src, dst, **io.events())
            io.done()
        return self._run([output, input], body, [output])

    def allgather_into_tensor_coalesced(self, outputs: Any, inputs: Any, opts: Any = None) -> Any:
        def body(io, device, kind):
            for out, inp in zip(outputs, inputs):
                src = io.input(inp)
                dst = io.output(out)
                self._call(device, kind, "comm_all_gather", src, dst, **io.events())
                io.done()
        return self._run(list(outputs) + list(inputs), body, list(outputs))

    def reduce_scatter(self, output_tensors: Any, input_tensors: Any, opts: Any = None) -> Any:
        op = opts.reduceOp if opts is not None else dist.ReduceOp.SUM

        def body(io, device, kind):
            for out, ins in zip(output_tensors, input_tensors):
                whole = torch.cat([x.reshape(-1) for x in ins])
                src = io.input(whole if kind == "host" else io._here(whole))
                dst = io.output(out)
                self._call(device, kind, "comm_reduce_scatter", src, dst, op=_reduce_name(op, out.dtype),
                           **io.events())
                io.done()
        return self._run(list(output_tensors) + [x for ins in input_tensors for x in ins], body, output_tensors)

    def _reduce_scatter_base(self, output, input, opts=None):
        op = opts.reduceOp if opts is not None else dist.ReduceOp.SUM

        def body(io, device, kind):
            src = io.input(input)
            dst = io.output(output)
            self._call(device, kind, "comm_reduce_scatter", src, dst, op=_reduce_name(op, output.dtype),
                       **io.events())
            io.done()
        return self._run([output, input], body, [output])

    def reduce_scatter_tensor_coalesced(self, outputs: Any, inputs: Any, opts: Any = None) -> Any:
        op = opts.reduceOp if opts is not None else dist.ReduceOp.SUM

        def body(io, device, kind):
            for out, inp in zip(outputs, inputs):
                src = io.input(inp)
                dst = io.output(out)
                self._call(device, kind, "comm_reduce_scatter", src, dst, op=_reduce_name(op, out.dtype),
                           **io.events())
                io.done()
        return self._run(list(outputs) + list(inputs), body, list(outputs))

    def reduce(self, tensors: Any, opts: Any = None) -> Any:
        op = opts.reduceOp if opts is not None else dist.ReduceOp.SUM
        root = opts.rootRank if opts is not None else 0

        def body(io, device, kind):
            for t in tensors:
                src = io.input(t)
                dst = io.output_flat(t.dtype, t.numel())
                self._call(device, kind, "comm_all_reduce", src, dst, op=_reduce_name(op, t.dtype), **io.events())
                io.done()
                if self._rank == root:
                    t.copy_(io.result().view_as(t))
        return self._run(tensors, body, tensors)

    def gather(self, output_tensors: Any, input_tensors: Any, opts: Any = None) -> Any:
        root = opts.rootRank if opts is not None else 0

        def body(io, device, kind):
            t = input_tensors[0]
            src = io.input(t)
            dst = io.output_flat(t.dtype, t.numel() * self._size)
            self._call(device, kind, "comm_all_gather", src, dst, **io.events())
            io.done()
            if self._rank == root:
                flat = io.result()
                for k, o in enumerate(output_tensors[0]):
                    o.copy_(flat[k * t.numel():(k + 1) * t.numel()].view_as(o))
        outs = [o for lst in output_tensors for o in lst]
        return self._run(list(input_tensors) + outs, body, output_tensors)

    def scatter(self, output_tensors: Any, input_tensors: Any, opts: Any = None) -> Any:
        root = opts.rootRank if opts is not None else 0

        def body(io, device, kind):
            out = output_tensors[0]
            n = out.numel()
            if self._rank == root:
                whole = torch.cat([x.reshape(-1) for x in input_tensors[0]])
            else:
                whole = torch.empty(n * self._size, dtype=out.dtype, device=out.device)
            o = io.inout(whole if kind == "host" else io._here(whole))
            self._call(device, kind, "comm_broadcast", o, o, root=root, **io.events())
            io.done()
            out.copy_(whole[self._rank * n:(self._rank + 1) * n].view_as(out))
        ins = [x for lst in input_tensors for x in lst]
        return self._run(list(output_tensors) + ins, body, output_tensors)

    def barrier(self, opts: Any = None) -> Any:
        device = getattr(opts, "device", None) if opts is not None else None
        ids = getattr(opts, "device_ids", None) if opts is not None else None
        if ids:
            t = torch.zeros(1, device=torch.device("cuda", ids[0]))
        elif device is not None and getattr(device, "type", "cpu") == "cuda":
            t = torch.zeros(1, device=device)
        else:
            t = torch.zeros(1)
        return self.allreduce([t])

    def _padded_all_to_all(self, io, device, kind, sends, recv_counts, dtype):
        """AllToAll of uneven blocks: every block padded to the largest of
        any rank's (agreed through a max AllReduce), then unpadded.
        ``sends``: this rank's block for each rank (flat); returns the
        blocks received, recv_counts[k] elements from rank k."""
        where = sends[0].device
        width = torch.tensor([max([s.numel() for s in sends] + list(recv_counts) + [0])], dtype=torch.int64,
                             device=where)
        o = io.inout(width if kind == "host" else io._here(width))
        self._call(device, kind, "comm_all_reduce", o, o, op="max", **io.events())
        io.done()
        width = int(width[0])
        packed = torch.zeros(self._size * width, dtype=dtype, device=where)
        for k, s in enumerate(sends):
            packed[k * width:k * width + s.numel()] = s
        src = io.input(packed if kind == "host" else io._here(packed))
        dst = io.output_flat(dtype, self._size * width)
        self._call(device, kind, "comm_all_to_all", src, dst, **io.events())
        io.done()
        flat = io.result()
        return [flat[k * width:k * width + recv_counts[k]] for k in range(self._size)]

    def alltoall_base(self,
            output: Any, input: Any, output_split_sizes: Any, input_split_sizes: Any, opts: Any = None) -> Any:
        def body(io, device, kind):
            if not output_split_sizes and not input_split_sizes:
                src = io.input(input)
                dst = io.output(output)
                self._call(device, kind, "comm_all_to_all", src, dst, **io.events())
                io.done()
                return
            row = input[0].numel() if input.dim() > 1 and input.size(0) else 1
            ins = list(input_split_sizes) or [input.size(0) // self._size] * self._size
            outs = list(output_split_sizes) or [output.size(0) // self._size] * self._size
            flat_in = input.reshape(-1)
            sends, at = [], 0
            for c in ins:
                sends.append(flat_in[at:at + c * row])
                at += c * row
            got = self._padded_all_to_all(io, device, kind, sends, [c * row for c in outs], input.dtype)
            output.copy_(torch.cat(got).view_as(output))
        return self._run([output, input], body, [output])

    def alltoall(self, output_tensors: Any, input_tensors: Any, opts: Any = None) -> Any:
        def body(io, device, kind):
            sends = [x.reshape(-1) for x in input_tensors]
            got = self._padded_all_to_all(io, device, kind, sends, [o.numel() for o in output_tensors],
                                          input_tensors[0].dtype)
            for o, g in zip(output_tensors, got):
                o.copy_(g.view_as(o))
        return self._run(list(output_tensors) + list(input_tensors), body, output_tensors)

    def send(self, tensors: Any, dst: Any, tag: Any = 0) -> Any:
        def body(io, device, kind):
            for t in tensors:
                self._call(device, kind, "comm_send", io.input(t), dst, **io.events())
                io.done()
        return self._run(tensors, body, tensors)

    def recv(self, tensors: Any, src: Any, tag: Any = 0) -> Any:
        def body(io, device, kind):
            for t in tensors:
                self._call(device, kind, "comm_recv", io.output(t), src, **io.events())
                io.done()
        return self._run(tensors, body, tensors)

    def recv_anysource(self, tensors: Any, tag: Any = 0) -> Any:
        raise NotImplementedError("regen process group: recv from any source is not supported (NCCL has none "
                                  "either); name the source rank")


class _HostIO:
    """A call's CPU tensors through the device's staging memfd: inputs
    copied in as they are named, outputs out once the call returned
    (io.done())."""

    def __init__(self, pg, device):
        self.pg, self.device = pg, device
        self.staging = None  # taken at the first operand, on the group's thread
        self.retired = []    # stagings outgrown during the call: operands still name them
        self.plan = []       # (staging, tensor or None, offset, n, dtype)
        self.at = 0
        self.last = None

    @staticmethod
    def _wire_dtype(dtype):
        return torch.uint8 if dtype == torch.bool else dtype

    def _place(self, n, dtype):
        """An offset for n elements; a bigger memfd where the current one
        is full (the earlier operands keep theirs until done())."""
        nbytes = n * torch.empty((), dtype=dtype).element_size()
        if self.staging is None:
            self.staging = self.pg._staging.setdefault(self.device, _Staging())
        if self.staging.buffer is not None and self.at + nbytes > self.staging.size:
            self.retired.append(self.staging)
            bigger = _Staging()
            bigger.size = self.staging.size
            self.staging = self.pg._staging[self.device] = bigger
            self.at = 0
        self.staging.ensure(self.pg._client, self.device, self.at + nbytes)
        offset = self.at
        self.at = _aligned(offset + nbytes)
        return offset

    def inout(self, t):
        return self._add(t, True, True)

    def input(self, t):
        return self._add(t, True, False)

    def output(self, t):
        return self._add(t, False, True)

    def output_flat(self, dtype, n):
        dtype = self._wire_dtype(dtype)
        offset = self._place(n, dtype)
        self.plan.append((self.staging, None, offset, n, dtype))
        return self.staging.operand(offset, n, dtype)

    def _add(self, t, copy_in, copy_out):
        dtype = self._wire_dtype(t.dtype)
        n = t.numel()
        offset = self._place(n, dtype)
        if copy_out:
            self.plan.append((self.staging, t, offset, n, dtype))
        if copy_in:
            flat = t.reshape(-1)
            self.staging.view(offset, n, dtype).copy_(flat.view(dtype) if t.dtype == torch.bool else flat)
        return self.staging.operand(offset, n, dtype)

    def events(self):
        return {}

    def done(self):
        """The call returned: outputs go where the caller wants them (a
        flat one is kept for result())."""
        for staging, t, offset, n, dtype in self.plan:
            view = staging.view(offset, n, dtype)
            if t is None:
                self.last = view.clone()
            elif t.dtype == torch.bool:
                t.copy_(view.view(t.shape).bool())
            else:
                t.copy_(view.view(t.shape))
        for old in self.retired:
            old.close(self.pg._client)
        self.plan, self.retired, self.at = [], [], 0

    def result(self):
        return self.last


class _CudaIO:
    """A call's CUDA tensors, in place (regen.torch's imports). What the
    group's thread makes itself (a contiguous copy, a packed buffer) is
    synchronised on its stream before regend reads it."""

    def __init__(self, pg, device, cuda, ordering):
        self.pg, self.device, self.cuda, self.ordering = pg, device, cuda, ordering
        self.copies = []
        self.made_here = False
        self.last = None

    def _operand(self, t):
        return self.pg._cuda_operand(t.view(torch.uint8) if t.dtype == torch.bool else t, self.device)

    def _here(self, t):
        self.made_here = True
        return t

    def inout(self, t):
        if t.is_contiguous():
            return self._operand(t)
        c = self._here(t.contiguous())
        self.copies.append((t, c))
        return self._operand(c)

    def input(self, t):
        return self._operand(t if t.is_contiguous() else self._here(t.contiguous()))

    def output(self, t):
        return self.inout(t)

    def output_flat(self, dtype, n):
        self.last = torch.empty(n, dtype=dtype, device=self.cuda)
        return self._operand(self.last)

    def events(self):
        # The first call of the Work waits for the rank's stream (the event
        # recorded at issue; its import made again here where the device's
        # generation moved since); regend's lane keeps the rest in order.
        if self.made_here:
            torch.cuda.current_stream(self.cuda).synchronize()
            self.made_here = False
        if self.ordering is None:
            return {}
        stream, local = self.ordering
        self.ordering = None
        from . import runtime
        rt = runtime()
        with rt.lock:
            return {"wait_event": rt._events_for(self.device, stream, local).ids[0]}

    def done(self):
        for t, c in self.copies:
            t.copy_(c)
        self.copies = []

    def result(self):
        return self.last


def _create(store, rank, size, timeout):
    return ProcessGroupRegen(store, rank, size, timeout)


def _create_extended(opts, backend_options=None):
    return ProcessGroupRegen(opts.store, opts.group_rank, opts.group_size, opts.timeout)


def register():
    """Registers "regen" with torch.distributed (once; where it is
    available).  True when it is registered."""
    if not dist.is_available():
        return False
    if BACKEND_NAME.upper() in getattr(dist.Backend, "_plugins", {}):
        return True
    import inspect
    try:
        params = inspect.signature(dist.Backend.register_backend).parameters
    except (TypeError, ValueError):
        params = {}
    kwargs = {}
    if "devices" in params:
        kwargs["devices"] = ["cpu", "cuda"]
    dist.Backend.register_backend(BACKEND_NAME, _create, **kwargs)
    return True
