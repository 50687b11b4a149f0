# SPDX-License-Identifier: Apache-2.0
"""regen.torch: matmul, linear and attention in regend, with autograd, on
torch's current stream, through restarts and faults.

    import torch, regen.torch as rt
    with rt.pool():                                   # memory regend maps once per chunk
        x = torch.randn(4096, 2048, device="cuda", dtype=torch.bfloat16)
    y = rt.linear(x, w, b, activation="gelu")         # in regend; y.backward() too
    rt.use_pool_for_process()                         # or: every CUDA allocation (before the first)
    with rt.enable():                                 # torch.matmul, F.linear, F.sdpa -> regend
        loss = model(x).sum()

    h = rt.mlp(x, w1, b1, w2, b2)                   # a transformer's MLP: one run of calls each way
    a = rt.attention_packed(qkv, heads, is_causal=True)   # attention on a fused qkv projection, in place
    y = rt.transformer_block(x, *block_params, heads)  # a whole pre-LayerNorm GPT block, one run each way
    y = rt.transformer_blocks(x, [block_params, ...], heads)  # a stack of them, still one run each way
    with rt.fp8_autocast(recipe=rt.fp8.DelayedScaling()):    # rt.fp8.Linear's GEMMs in FP8 in regend
        y = layer(x)
    fc, ln = rt.nn.Linear(2048, 8192), rt.nn.LayerNorm(2048)   # nn.Modules as te.Linear, te.LayerNorm, and
    layer = rt.nn.TransformerLayer(2048, 8192, 16)             # te.TransformerLayer; torch.autocast as torch's
    torch.distributed.init_process_group(backend="regen")   # collectives on regend's communicators

The operations are custom ops (torch.ops.regen.mm, linear, mlp, sdpa,
sdpa_packed, sdpa_backward) with fake implementations and autograd.  After a generation
change (regenctl restart, a fault) the runtime waits for the device to serve
again, imports again and retries; what cannot be retried raises
RecoveryFailed, WorkLost or (an update in place that a journal of marks
cannot put back) Torn.  docs/torch.md says it all; `import regen` never
imports torch, this module needs it.
"""

try:
    import torch as _torch
except ImportError as _e:  # pragma: no cover - exercised where torch is missing
    raise ImportError("regen.torch needs PyTorch (pip install torch); `import regen` works without it") from _e

import contextlib
import os
import threading
from typing import Any, Dict, Iterator, Mapping, Optional, Sequence

from ..pool import Pool
from ._runtime import ORDERINGS, NotSupported, PoolTooLate, RecoveryFailed, Runtime, Torn, WorkLost, host_empty
from ._ops import HAVE_CUSTOM_OP, attention_packed, linear, matmul, mlp, scaled_dot_product_attention
from ._block import BLOCK_PARAMETERS, transformer_block, transformer_blocks
from ._norm import layer_norm
from . import nn, optim
from . import fp8
from .fp8 import fp8_autocast
from ._keep import Kept, keep, last_put_back, last_restore_phases, restore
from ._on_import import when_imported as _when_imported

__all__ = ["configure", "runtime", "pool", "use_pool_for_process", "process_pool_enabled", "empty_cache", "enable",
           "matmul", "linear", "mlp", "attention_packed", "transformer_block", "transformer_blocks",
           "BLOCK_PARAMETERS", "explain", "optim", "nn", "layer_norm",
           "scaled_dot_product_attention", "stats", "sweep", "host_empty", "mps_mode", "Runtime",
           "RecoveryFailed", "WorkLost", "NotSupported", "PoolTooLate", "ORDERINGS", "HAVE_CUSTOM_OP"]
__all__ += ["keep", "restore", "Kept", "Torn", "last_put_back", "last_restore_phases", "fp8", "fp8_autocast", "ProcessGroupRegen"]

_lock = threading.Lock()
_runtime: Optional[Runtime] = None
_config: Dict[str, Any] = {}
_pools: Dict[int, Any] = {}
# The CUDAPluggableAllocator that is torch's current allocator, once
# use_pool_for_process() made it so (kept alive with the process).
_process_allocator: Any = None


def configure(socket: Optional[str] = None, ordering: Optional[str] = None, timeout: Optional[float] = None,
              recovery_timeout: Optional[float] = None, host_device: int = 0,
              device_map: Optional[Mapping[int, int]] = None, retry: bool = True) -> Runtime:
    """Set up the process's runtime (before the first operation, or again
    to replace it).  ``socket``: regend's main socket ($REGEN_SOCKET, else
    /run/regen/regend.sock).  ``ordering``: "wait" (default), "events",
    "sync" or "auto" ($REGEN_TORCH_ORDERING; docs/torch.md).  ``recovery_timeout``:
    seconds to wait for a device to serve again after a fault (default 120).
    ``host_device``: regend's device for CPU tensors (host backend).
    ``device_map``: {torch CUDA index: regend index}, overriding the match
    by UUID.  ``retry``: retry operations after a generation change."""
    global _runtime
    with _lock:
        _config.clear()
        _config.update(socket=socket, ordering=ordering, timeout=timeout, recovery_timeout=recovery_timeout,
                       host_device=host_device, device_map=device_map, retry=retry)
        old, _runtime = _runtime, Runtime(**_config)
    if old is not None:
        old.close()
    return _runtime


def runtime() -> Runtime:
    """The process's Runtime (made with configure()'s settings on first use)."""
    global _runtime
    rt = _runtime
    if rt is None:
        with _lock:
            if _runtime is None:
                _runtime = Runtime(**_config)
            rt = _runtime
    return rt


def _allocator():
    from torch.cuda.memory import CUDAPluggableAllocator
    rt = runtime()
    if rt.pool is None:
        raise NotSupported(parameters={"message": "libregen was not found (set REGEN_LIBREGEN to libregen.so.0)"})
    why = rt.pool.cuda_available()
    if why is not None:
        raise NotSupported(parameters={"message": f"regen.torch.pool(): {why}"})
    return CUDAPluggableAllocator(rt.pool.path, "regen_pool_alloc", "regen_pool_free")


def use_pool_for_process() -> None:
    """Allocate every CUDA tensor of this process from libregen's pool
    (memory regend maps once per chunk): torch's current allocator becomes
    a CUDAPluggableAllocator whose alloc and free are libregen's, for every
    thread and stream, autograd's backward threads too, so no operation
    needs a block import.  REGEN_TORCH_POOL=process does it when regen.torch
    is imported.

    It must come before the process's first CUDA allocation (torch swaps its
    allocator only before it sets the allocator up, at its CUDA
    initialisation): later it raises PoolTooLate and changes nothing.
    NotSupported when libregen, or its CUDA side, is not there.  Calling it
    again does nothing.

    What changes (docs/torch.md): torch's caching allocator is gone; the
    pool caches chunks itself and orders frees by stream (memory freed on a
    stream is taken again only by that stream until a synchronisation);
    Tensor.record_stream does not reach it; torch.cuda.memory_allocated()
    and the other statistics of torch's allocator, CUDA graph capture and
    CUDA IPC of tensors (torch.multiprocessing) are not available, and
    torch.cuda.empty_cache() does not give the pool's memory back:
    regen.torch.empty_cache() does.  regen.torch.pool() scopes then change
    nothing."""
    global _process_allocator
    with _lock:
        if _process_allocator is not None:
            return
        if _torch.cuda.is_initialized():
            raise PoolTooLate(parameters={"message": "torch has initialised CUDA (and its allocator) already: call "
                                                     "regen.torch.use_pool_for_process(), or set "
                                                     "REGEN_TORCH_POOL=process, before the first CUDA allocation"})
        pool_ = Pool.get()
        if pool_ is None:
            raise NotSupported(parameters={"message": "libregen was not found (set REGEN_LIBREGEN to libregen.so.0)"})
        if not pool_.process_allocator_available():
            raise NotSupported(parameters={"message": f"{pool_.path} cannot be the process allocator (too old)"})
        why = pool_.cuda_available()
        if why is not None:
            raise NotSupported(parameters={"message": f"regen.torch.use_pool_for_process(): {why}"})
        # Any: torch < 2.1's stubs have neither.
        memory: Any = _torch.cuda.memory
        CUDAPluggableAllocator, change_current_allocator = memory.CUDAPluggableAllocator, memory.change_current_allocator
        allocator = CUDAPluggableAllocator(pool_.path, "regen_pool_alloc", "regen_pool_free")
        pool_.set_process_allocator(True)
        try:
            change_current_allocator(allocator)
        except RuntimeError as e:
            pool_.set_process_allocator(False)
            raise PoolTooLate(parameters={"message": f"torch refused to swap its CUDA allocator ({e}): call "
                                                     "regen.torch.use_pool_for_process() before the first CUDA "
                                                     "allocation"}) from e
        _process_allocator = allocator


def process_pool_enabled() -> bool:
    """Whether every CUDA allocation of the process comes from libregen's
    pool (use_pool_for_process())."""
    return _process_allocator is not None


def empty_cache() -> None:
    """Give libregen's pool's empty CUDA chunks back to the driver (after
    synchronising the devices it has chunks on), as torch.cuda.empty_cache()
    does for torch's allocator; it is what frees cached memory once
    use_pool_for_process() made the pool the process's allocator."""
    pool_ = Pool.get()
    if pool_ is not None:
        pool_.trim()


@contextlib.contextmanager
def pool(device: Optional[int] = None) -> Iterator[Any]:
    """Allocate the CUDA tensors made inside the scope from memory regend
    maps once per chunk (a torch.cuda.MemPool over libregen's pool): the
    operations need no import for them.  The MemPool is one per device and
    lives as long as the process.  Allocations of other threads (autograd's
    backward threads) do not go to the pool: use
    torch.autograd.set_multithreading_enabled(False) to keep backward on
    this thread, or accept block imports for its tensors, or
    use_pool_for_process().  After use_pool_for_process() every allocation
    comes from the pool already: the scope changes nothing and yields None."""
    if _process_allocator is not None:
        yield None
        return
    if not hasattr(_torch.cuda, "MemPool"):
        raise NotSupported(parameters={"message": "regen.torch.pool() needs torch.cuda.MemPool (torch >= 2.5)"})
    dev = _torch.cuda.current_device() if device is None else _torch.device("cuda", device).index
    runtime().regend_device(_torch.device("cuda", dev))
    cuda: Any = _torch.cuda   # torch < 2.5's stubs have no MemPool
    with _lock:
        mp = _pools.get(dev)
        if mp is None:
            mp = _pools[dev] = cuda.MemPool(_allocator().allocator())
    with cuda.use_mem_pool(mp, device=dev):
        yield mp


@contextlib.contextmanager
def enable(devices: Sequence[str] = ("cuda",), ops: Sequence[str] = ("matmul", "linear", "sdpa")) -> Iterator[None]:
    """Inside the scope, torch.matmul (and ``@``), F.linear and
    F.scaled_dot_product_attention run in regend where regend can run them,
    in torch elsewhere (counted in stats()["fallbacks"]).  ``devices``: the
    torch device types to send ("cpu" too for regend's host backend)."""
    from ._routing import RegendMode
    with RegendMode(devices, ops):
        yield


def stats() -> Dict[str, Any]:
    """Counters of the runtime: calls, handoffs (rank -> regend -> rank; two
    context switches each when the rank has GPU work between them),
    idle_calls (calls that found the rank's stream idle: no hand-off), retries,
    recoveries, block imports (live and made), repins, fallbacks, and the
    pool's chunks and imports."""
    return runtime().stats()


def sweep(force: bool = True) -> None:
    """Close the block imports whose pinned storage is gone (all of them
    with force; the runtime also does it every few operations)."""
    runtime().sweep(force=force)


def _driver_mps(index):
    """Whether CUDA contexts this process makes on torch device ``index``
    are MPS clients, as the driver says (the attribute MPS_ENABLED, 133);
    None where it cannot be asked (CUDA not initialised, no libcuda)."""
    import ctypes
    if not _torch.cuda.is_initialized():
        return None
    try:
        cuda = ctypes.CDLL("libcuda.so.1")
        dev, value = ctypes.c_int(), ctypes.c_int()
        if cuda.cuDeviceGet(ctypes.byref(dev), ctypes.c_int(index)) != 0:
            return None
        if cuda.cuDeviceGetAttribute(ctypes.byref(value), ctypes.c_int(133), dev) != 0:
            return None
        return bool(value.value)
    except (OSError, AttributeError):
        return None


def mps_mode() -> Dict[str, Any]:
    """Whether this process and regend's workers run under CUDA MPS.

    ``rank``: this process's contexts are MPS clients; asked of the driver
    once torch initialised CUDA (``rank_source`` "driver"), else guessed
    from the control daemon's pipe directory ($CUDA_MPS_PIPE_DIRECTORY or
    /tmp/nvidia-mps; ``rank_source`` "pipe_directory").  ``regend``: some
    device of regend's reports ``sharing.mps`` in Status (None when regend
    cannot be asked or says nothing); ``regend_devices``: {regend index:
    bool}.  Under MPS a fatal fault in any client reaches every client on
    the GPU: regend's isolation is gone, and context switches are far
    cheaper (docs/torch.md, MPS)."""
    pipe = os.environ.get("CUDA_MPS_PIPE_DIRECTORY", "/tmp/nvidia-mps")
    rank = _driver_mps(_torch.cuda.current_device()) if _torch.cuda.is_initialized() else None
    source = "driver"
    if rank is None:
        rank, source = os.path.exists(os.path.join(pipe, "control")), "pipe_directory"
    regend, devices = None, {}
    try:
        rt_ = runtime()
        with rt_.lock:   # the client is one connection: not beside a call of another thread
            status = rt_.client.status()
        for d in status.get("devices", []):
            sharing = d.get("sharing")
            if isinstance(sharing, dict) and isinstance(sharing.get("mps"), bool):
                devices[d.get("index")] = sharing["mps"]
                regend = sharing["mps"] or bool(regend)
    except Exception:
        regend = None
    return {"rank": rank, "rank_source": source, "pipe_directory": pipe, "regend": regend,
            "regend_devices": devices, "isolated": not rank and not regend}


def _pool_from_environment():
    """REGEN_TORCH_POOL: "process" makes every CUDA allocation the pool's
    (use_pool_for_process()) as regen.torch is imported; "scoped" or unset:
    only regen.torch.pool() scopes."""
    mode = os.environ.get("REGEN_TORCH_POOL", "")
    if mode in ("", "scoped"):
        return
    if mode != "process":
        raise ValueError(f"REGEN_TORCH_POOL={mode!r}: 'process' (every CUDA allocation from libregen's pool) or "
                         "'scoped' (the default: regen.torch.pool() scopes only)")
    use_pool_for_process()


_pool_from_environment()


def _register_compile_backend():
    from ._compile import register
    register()


def _register_process_group():
    from ._dist import register
    register()


# torch.compile(model, backend="regen") (regen.torch._compile) and
# torch.distributed's backend "regen" (regen.torch._dist), registered when
# torch imports torch._dynamo (torch.compile does) and torch.distributed:
# importing torch._dynamo takes seconds on torch 2.x, which a rank that
# never compiles (one resuming from kept state) must not pay here.
_when_imported("torch._dynamo", _register_compile_backend)
_when_imported("torch.distributed", _register_process_group)


def __getattr__(name: str) -> Any:
    """explain and ProcessGroupRegen, imported on first use (they import
    torch.fx and torch.distributed)."""
    if name == "explain":
        from ._compile import explain
        return explain
    if name == "ProcessGroupRegen":
        from ._dist import ProcessGroupRegen
        return ProcessGroupRegen
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
