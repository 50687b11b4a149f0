# SPDX-License-Identifier: Apache-2.0
"""libregen's memory pool, through ctypes: memory that regend maps once per
chunk (client/pool.c; include/regen.h says the contract).

    from regen.pool import Pool
    pool = Pool.get()                      # None when libregen is not found
    ptr = pool.alloc_host(1 << 20)         # host memory in a memfd chunk
    ref = pool.lookup(ptr, host_device=0)  # imports the chunk once
    regen.Operand(ref.buffer, ref.offset, "f32", [256, 1024])

Standard library only.  libregen is found at $REGEN_LIBREGEN, then in the
build tree ($REGEN_BUILD_ROOT or $REGEN_TEST_BUILD_ROOT: client/libregen.so),
then where the dynamic linker finds libregen.so.0; REGEN_LIBREGEN=none
loads none (the pool is then unavailable: Pool.get() is None).
``Pool.path`` is the file torch's CUDAPluggableAllocator must load.
"""

import ctypes
import ctypes.util
import errno
import os
import threading

from . import errors

__all__ = ["Pool", "PoolRef", "PoolError", "find_libregen"]


class PoolError(errors.Error):
    """The pool could not do what was asked; ``errno`` says the class of
    failure, the message says why (regend's named error, where it was
    regend's, is ``name``)."""


class _Ref(ctypes.Structure):
    _fields_ = [("size", ctypes.c_size_t), ("buffer", ctypes.c_char * 64), ("device", ctypes.c_int),
                ("generation", ctypes.c_uint64), ("offset", ctypes.c_uint64), ("extent", ctypes.c_uint64),
                ("chunk", ctypes.c_uint64), ("chunk_size", ctypes.c_uint64)]


class _Stats(ctypes.Structure):
    _fields_ = [("size", ctypes.c_size_t), ("chunks", ctypes.c_uint64), ("chunk_bytes", ctypes.c_uint64),
                ("used_bytes", ctypes.c_uint64), ("imports", ctypes.c_uint64), ("allocs", ctypes.c_uint64),
                ("frees", ctypes.c_uint64), ("import_calls", ctypes.c_uint64), ("unclosed", ctypes.c_uint64),
                ("imports_unanswered", ctypes.c_uint64)]


class _Chunk(ctypes.Structure):
    _fields_ = [("size", ctypes.c_size_t), ("chunk", ctypes.c_uint64), ("offset", ctypes.c_uint64),
                ("bytes", ctypes.c_uint64), ("device", ctypes.c_int), ("kind", ctypes.c_int)]


_KINDS = ("host_fd", "cuda_fd")


class PoolRef:
    """Where a pointer lives in regend: ``buffer`` (the chunk's id),
    ``offset`` (bytes), ``device`` and ``generation`` of the import,
    ``extent`` (bytes to the chunk's end), ``chunk`` (serial)."""

    __slots__ = ("buffer", "device", "generation", "offset", "extent", "chunk", "chunk_size")

    def __init__(self, raw):
        self.buffer = raw.buffer.decode()
        self.device = raw.device
        self.generation = raw.generation
        self.offset = raw.offset
        self.extent = raw.extent
        self.chunk = raw.chunk
        self.chunk_size = raw.chunk_size

    def __repr__(self):
        return (f"PoolRef({self.buffer!r}, offset={self.offset}, device={self.device}, "
                f"generation={self.generation}, chunk={self.chunk})")


def find_libregen():
    """The path of libregen.so to load, or None: $REGEN_LIBREGEN ("none":
    none), a build tree's ($REGEN_BUILD_ROOT), the one inside this package
    (the wheel's, regen/libregen.so.0: it speaks this package's protocol),
    else the system's (libregen0, meson install)."""
    given = os.environ.get("REGEN_LIBREGEN")
    if given == "none":
        return None
    if given:
        return given
    for root in (os.environ.get("REGEN_BUILD_ROOT"), os.environ.get("REGEN_TEST_BUILD_ROOT")):
        if root:
            path = os.path.join(root, "client", "libregen.so")
            if os.path.exists(path):
                return path
    inside = os.path.join(os.path.dirname(os.path.abspath(__file__)), "libregen.so.0")
    if os.path.exists(inside):
        return inside
    found = ctypes.util.find_library("regen")
    if found:
        return found
    for name in ("libregen.so.0", "libregen.so"):
        try:
            ctypes.CDLL(name)
            return name
        except OSError:
            pass
    return None


_VOIDP = ctypes.c_void_p


class Pool:
    """libregen's pool (one per process).  Methods raise PoolError."""

    _instance = None
    _lock = threading.Lock()

    def __init__(self, path):
        self.path = path
        lib = ctypes.CDLL(path)
        self._lib = lib
        lib.regen_pool_alloc.restype = _VOIDP
        lib.regen_pool_alloc.argtypes = [ctypes.c_size_t, ctypes.c_int, _VOIDP]
        lib.regen_pool_free.restype = None
        lib.regen_pool_free.argtypes = [_VOIDP, ctypes.c_size_t, ctypes.c_int, _VOIDP]
        lib.regen_pool_alloc_host.restype = _VOIDP
        lib.regen_pool_alloc_host.argtypes = [ctypes.c_size_t]
        lib.regen_pool_free_host.restype = None
        lib.regen_pool_free_host.argtypes = [_VOIDP]
        lib.regen_pool_configure.restype = ctypes.c_int
        lib.regen_pool_configure.argtypes = [ctypes.c_char_p, ctypes.c_uint64]
        lib.regen_pool_map_device.restype = ctypes.c_int
        lib.regen_pool_map_device.argtypes = [ctypes.c_int, ctypes.c_int]
        lib.regen_pool_lookup.restype = ctypes.c_int
        lib.regen_pool_lookup.argtypes = [_VOIDP, ctypes.c_int, ctypes.POINTER(_Ref)]
        lib.regen_pool_note_generation.restype = None
        lib.regen_pool_note_generation.argtypes = [ctypes.c_int, ctypes.c_uint64]
        try:
            epoch = lib.regen_pool_epoch
        except AttributeError:   # an older libregen: nothing may be cached
            epoch = None
        else:
            epoch.restype = ctypes.c_uint64
            epoch.argtypes = []
        self._epoch = epoch
        lib.regen_pool_stats_get.restype = ctypes.c_int
        lib.regen_pool_stats_get.argtypes = [ctypes.POINTER(_Stats)]
        lib.regen_pool_error.restype = ctypes.c_char_p
        lib.regen_pool_error.argtypes = []
        lib.regen_pool_error_name.restype = ctypes.c_char_p
        lib.regen_pool_error_name.argtypes = []
        lib.regen_pool_cuda_available.restype = ctypes.c_int
        lib.regen_pool_cuda_available.argtypes = []
        # Newer than the pool itself: a libregen without them has no
        # process allocator (process_allocator_available()).
        self._process = hasattr(lib, "regen_pool_set_process_allocator") and hasattr(lib, "regen_pool_trim")
        self.process_allocator = False
        if self._process:
            lib.regen_pool_set_process_allocator.restype = ctypes.c_int
            lib.regen_pool_set_process_allocator.argtypes = [ctypes.c_int]
            lib.regen_pool_trim.restype = ctypes.c_int
            lib.regen_pool_trim.argtypes = []
        lib.regen_cuda_address_range.restype = ctypes.c_int
        lib.regen_cuda_address_range.argtypes = [_VOIDP, ctypes.POINTER(ctypes.c_uint64),
                                                 ctypes.POINTER(ctypes.c_uint64)]
        # Kept state; a libregen older than it has none (keep_available()).
        self._keep = hasattr(lib, "regen_pool_keep") and hasattr(lib, "regen_pool_adopt")
        if self._keep:
            lib.regen_pool_chunk_of.restype = ctypes.c_int
            lib.regen_pool_chunk_of.argtypes = [_VOIDP, ctypes.POINTER(_Chunk)]
            lib.regen_pool_keep.restype = ctypes.c_int
            lib.regen_pool_keep.argtypes = [_VOIDP, ctypes.c_char_p, ctypes.c_uint32, ctypes.c_char_p,
                                            ctypes.c_uint32]
            lib.regen_pool_adopt.restype = ctypes.c_int
            lib.regen_pool_adopt.argtypes = [ctypes.c_int, ctypes.c_int, ctypes.c_int, ctypes.c_uint64,
                                             ctypes.POINTER(_VOIDP)]

    @classmethod
    def get(cls):
        """The process's Pool, or None when libregen cannot be found."""
        with cls._lock:
            if cls._instance is None:
                path = find_libregen()
                if path is None:
                    return None
                try:
                    cls._instance = Pool(path)
                except (OSError, AttributeError):
                    # Not found, or a libregen older than the pool.
                    return None
            return cls._instance

    def _fail(self, r, what):
        msg = (self._lib.regen_pool_error() or b"").decode(errors="replace")
        name = self._lib.regen_pool_error_name()
        code = -r
        text = f"{what}: {msg or os.strerror(code)}"
        if name:
            # regend refused: its own error class, so callers handle it as
            # they handle it from any call (StaleGeneration, DeviceLost...).
            raise errors.error_from_reply(name.decode(), {"message": text})
        if code in (errno.ECONNRESET, errno.EPIPE):
            # The pool's own connection broke with the import in flight: a
            # worker that died; the caller treats it as any broken call.
            raise errors.ConnectionReset(parameters={"message": text, "errno": code})
        if code in (errno.ECONNREFUSED, errno.ETIMEDOUT, errno.ENOENT, errno.EAGAIN):
            raise errors.Unavailable(parameters={"message": text, "errno": code})
        e = PoolError(parameters={"message": text, "errno": code})
        e.errno = code
        raise e

    # -- allocation --------------------------------------------------------

    def alloc(self, size, device):
        """CUDA memory on this process's ``device`` (an int)."""
        p = self._lib.regen_pool_alloc(int(size), int(device), None)
        if not p:
            self._fail(-errno.ENOMEM, f"allocating {size} bytes on CUDA device {device}")
        return p

    def free(self, ptr):
        self._lib.regen_pool_free(ptr, 0, 0, None)

    def alloc_host(self, size):
        """Host memory in a memfd chunk, for regend's host backend."""
        p = self._lib.regen_pool_alloc_host(int(size))
        if not p:
            self._fail(-errno.ENOMEM, f"allocating {size} bytes of host memory")
        return p

    def free_host(self, ptr):
        self._lib.regen_pool_free_host(ptr)

    # -- regend ------------------------------------------------------------

    def configure(self, socket_path=None, chunk_bytes=0):
        r = self._lib.regen_pool_configure(socket_path.encode() if socket_path else None, int(chunk_bytes))
        if r < 0:
            self._fail(r, "configuring the pool")

    def map_device(self, local_device, regend_device):
        r = self._lib.regen_pool_map_device(int(local_device), int(regend_device))
        if r < 0:
            self._fail(r, f"mapping device {local_device} to regend's {regend_device}")

    def lookup(self, ptr, host_device=-1):
        """The PoolRef of ``ptr`` (importing its chunk when needed), or None
        when ``ptr`` is not pool memory."""
        raw = _Ref()
        raw.size = ctypes.sizeof(_Ref)
        r = self._lib.regen_pool_lookup(ptr, int(host_device), ctypes.byref(raw))
        if r == -errno.ENOENT:
            return None
        if r < 0:
            self._fail(r, f"importing the pool chunk of {ptr:#x}")
        return PoolRef(raw)

    def note_generation(self, device, generation):
        self._lib.regen_pool_note_generation(int(device), int(generation))

    def epoch(self):
        """A number that changes whenever an answer of lookup() may no longer
        hold (regen_pool_epoch); None when this libregen has none, and then
        no answer may be kept."""
        return self._epoch() if self._epoch is not None else None

    def stats(self):
        """{"chunks", "chunk_bytes", "used_bytes", "imports", "allocs", "frees", "import_calls",
        "unclosed", "imports_unanswered"} (regen.h's struct regen_pool_stats; a
        libregen older than a field leaves it 0)."""
        raw = _Stats()
        raw.size = ctypes.sizeof(_Stats)
        self._lib.regen_pool_stats_get(ctypes.byref(raw))
        return {name: getattr(raw, name) for name, _ in _Stats._fields_ if name != "size"}

    def cuda_available(self):
        """None when CUDA chunks can be made, else why not."""
        if self._lib.regen_pool_cuda_available() == 0:
            return None
        return (self._lib.regen_pool_error() or b"").decode(errors="replace") or "no CUDA"

    def process_allocator_available(self):
        """Whether this libregen can be the process's whole CUDA allocator."""
        return self._process

    def set_process_allocator(self, on):
        """The pool serves every CUDA allocation of the process (torch's
        current allocator): it keeps empty chunks and orders frees by
        stream itself (regen.h says how).  Off trims first."""
        if not self._process:
            raise PoolError(parameters={"message": f"{self.path} has no process allocator (too old)",
                                        "errno": errno.ENOTSUP})
        r = self._lib.regen_pool_set_process_allocator(1 if on else 0)
        if r < 0:
            self._fail(r, "switching the process allocator off")
        self.process_allocator = bool(on)

    def trim(self):
        """Synchronises the devices the pool has chunks on and gives back
        the empty chunks (regen_pool_trim)."""
        if not self._process:
            return
        r = self._lib.regen_pool_trim()
        if r < 0:
            self._fail(r, "trimming the pool")

    def address_range(self, ptr):
        """(base, size) of the CUDA allocation holding ``ptr``."""
        base, size = ctypes.c_uint64(), ctypes.c_uint64()
        r = self._lib.regen_cuda_address_range(ptr, ctypes.byref(base), ctypes.byref(size))
        if r < 0:
            self._fail(r, f"finding the CUDA allocation of {ptr:#x}")
        return base.value, size.value

    # -- kept state (io.regen.Keep) -----------------------------------------

    def keep_available(self):
        """Whether this libregen keeps pool memory (regen_pool_keep)."""
        return self._keep

    def chunk_of(self, ptr):
        """{"chunk", "offset", "bytes", "device", "kind"} of the chunk that
        holds ``ptr`` (``device`` the local CUDA ordinal, -1 for host
        memory; ``kind`` how regend keeps it), or None when ``ptr`` is not
        pool memory."""
        raw = _Chunk()
        raw.size = ctypes.sizeof(_Chunk)
        r = self._lib.regen_pool_chunk_of(ptr, ctypes.byref(raw))
        if r == -errno.ENOENT:
            return None
        if r < 0:
            self._fail(r, f"finding the pool chunk of {ptr:#x}")
        return {"chunk": raw.chunk, "offset": raw.offset, "bytes": raw.bytes, "device": raw.device,
                "kind": _KINDS[raw.kind]}

    def keep(self, ptr, rank, name, job=None, lease_ms=0):
        """Keeps the whole chunk that holds ``ptr`` under (job, rank, name),
        on the pool's own connection (io.regen.Keep.Keep)."""
        r = self._lib.regen_pool_keep(ptr, job.encode() if job else None, int(rank), name.encode(), int(lease_ms))
        if r < 0:
            self._fail(r, f"keeping the pool chunk of {ptr:#x} as {name}")

    def adopt(self, fd, kind, size, device=-1):
        """Maps memory taken back (Client.take_back's fd, which it takes) as
        a chunk of this process's pool: its address.  ``device``: the local
        CUDA ordinal it belongs to (-1: host memory)."""
        base = _VOIDP()
        r = self._lib.regen_pool_adopt(int(fd), _KINDS.index(kind), int(device), int(size), ctypes.byref(base))
        if r < 0:
            self._fail(r, "mapping kept memory")
        return base.value
