# SPDX-License-Identifier: Apache-2.0
"""Keep a model and its optimizer in regend (io.regen.Keep), so that a rank
whose process dies resumes from them in seconds instead of from a checkpoint.

    import regen.torch as rt
    rt.use_pool_for_process()                  # tensors in memory regend can keep
    model, opt = build()                       # freshly built, on CUDA
    key = (os.environ["SLURM_JOB_ID"], rank)
    start = rt.restore(model, opt, key=key) or 0   # None: nothing kept
    kept = rt.keep(model, opt, key=key)        # after the optimizer has its state
    for step in range(start + 1, steps + 1):
        ...; opt.step(); opt.zero_grad()
        kept.commit(step)

keep() hands regend the pool chunks that hold the parameters, buffers and
optimizer state (whole chunks: the tensors must come from libregen's pool,
rt.use_pool_for_process() or rt.pool()), and an index of where each tensor
is.  restore() takes them back, maps them at new addresses and makes the
parameters, buffers and state views of them: no copy.  commit() marks a
completed step (after synchronising the device), with the optimizer's CPU
scalars (Adam's step).  A kill inside opt.step() can leave an update half
applied, which no commit describes: docs/torch.md says how programs with a
journal avoid it.
"""

import ctypes
import json
import mmap
import os
import struct

from typing import Any, Dict, List, Optional, Tuple

import torch

from .. import errors

__all__ = ["keep", "restore", "Kept"]

_INDEX = "index"
# The index memfd: a header naming the live half (8 bytes), then two halves
# a commit writes in turn, so a kill mid-write leaves the other whole.
_INDEX_HALF = 1 << 20
# Chunks taken back in this process: their pool serial -> their kept name,
# so that keeping them again keeps them under the same names.
_adopted: Dict[int, str] = {}


def _split(key):
    job, rank = key
    return (None if job is None else str(job)), int(rank)


def _runtime():
    from . import runtime
    rt = runtime()
    if rt.pool is None or not rt.pool.keep_available():
        raise errors.Error(parameters={"message": "regen.torch.keep needs libregen with kept state "
                                                  "(set REGEN_LIBREGEN to libregen.so.0)"})
    return rt


def _optimizer_state(optimizer):
    """(entry, value) of the optimizer's state, entry "i.key" by the
    position of the parameter in param_groups, which a freshly built
    optimizer repeats."""
    if optimizer is None:
        return
    params = [p for g in optimizer.param_groups for p in g["params"]]
    for i, p in enumerate(params):
        for k, v in optimizer.state.get(p, {}).items():
            yield f"{i}.{k}", v


def _values(optimizer, memory):
    """The optimizer's state that is not kept as memory (Adam's step, a
    CPU scalar unless capturable): its values, which each commit writes
    into the index."""
    out = {}
    for entry, v in _optimizer_state(optimizer):
        if f"state:{entry}" in memory:
            continue
        if torch.is_tensor(v):
            out[entry] = {"value": v.tolist(), "dtype": str(v.dtype)[len("torch."):]}
        else:
            out[entry] = {"value": v}
    return out


class Kept:
    """What keep() kept: commit() marks each completed step."""

    def __init__(self, rt: Any, job: Optional[str], rank: int, optimizer: Optional[torch.optim.Optimizer],
                 index_fd: int) -> None:
        self._rt, self.job, self.rank = rt, job, rank
        self._optimizer = optimizer
        self._index = mmap.mmap(index_fd, 8 + 2 * _INDEX_HALF)
        os.close(index_fd)
        self._base = json.loads(_read_index(self._index))

    def commit(self, step: int) -> None:
        """Step `step` is done: once the device finished it, the optimizer's
        values go into the index with the step (what restore() returns), and
        regend records the step (Status, regenctl kept)."""
        if torch.cuda.is_initialized():
            torch.cuda.synchronize()
        self._base["values"] = _values(self._optimizer, self._base["tensors"])
        self._base["step"] = int(step)
        _write_index(self._index, json.dumps(self._base).encode())
        with self._rt.lock:
            self._rt.client.commit(self.rank, step, job=self.job)


def _read_index(m):
    (half,) = struct.unpack_from("<Q", m, 0)
    start = 8 + (half & 1) * _INDEX_HALF
    (length,) = struct.unpack_from("<Q", m, start)
    return bytes(m[start + 8:start + 8 + length])


def _write_index(m, data):
    if len(data) + 8 > _INDEX_HALF:
        raise ValueError(f"the index of kept tensors takes {len(data)} bytes, more than {_INDEX_HALF - 8}")
    (half,) = struct.unpack_from("<Q", m, 0)
    other = (half + 1) & 1
    start = 8 + other * _INDEX_HALF
    m[start + 8:start + 8 + len(data)] = data
    struct.pack_into("<Q", m, start, len(data))
    struct.pack_into("<Q", m, 0, other)


def keep(model: torch.nn.Module, optimizer: Optional[torch.optim.Optimizer] = None,
         key: Optional[Tuple[Optional[str], int]] = None, lease_ms: Optional[int] = None) -> Kept:
    """Has regend keep the model's parameters and buffers and the
    optimizer's state under ``key`` = (job, rank) (job None: the job that
    names the rank's connection).  Call it once the optimizer has its state
    (after a first step, or after restore()).  Returns a Kept."""
    rt = _runtime()
    job, rank = _split(key)
    entries, chunks = {}, {}
    candidates: List[Tuple[str, str, torch.Tensor]] = [("param", n, p) for n, p in model.named_parameters()]
    candidates += [("buffer", n, b) for n, b in model.named_buffers() if b is not None]
    candidates += [("state", e, v) for e, v in _optimizer_state(optimizer) if torch.is_tensor(v)]
    for kind, name, t in candidates:
        where = rt.pool.chunk_of(t.data_ptr()) if t.numel() else None
        if where is None:
            if kind == "state" and t.device.type == "cpu":
                continue   # a value, in the index
            raise errors.Error(parameters={
                "message": f"{kind} {name} is not in libregen's pool: build the model under regen.torch.pool() "
                           "or after regen.torch.use_pool_for_process()"})
        chunk = _adopted.get(where["chunk"], f"chunk-{where['chunk']}")
        if chunk not in chunks:
            rt.pool.keep(t.data_ptr(), rank, chunk, job=job, lease_ms=lease_ms or 0)
            chunks[chunk] = {"kind": where["kind"], "bytes": where["bytes"], "device": where["device"]}
        entries[f"{kind}:{name}"] = {"chunk": chunk, "offset": where["offset"],
                                     "dtype": str(t.dtype)[len("torch."):], "shape": list(t.shape),
                                     "stride": list(t.stride())}
    base = {"version": 1, "chunks": chunks, "tensors": entries, "values": _values(optimizer, entries), "step": 0}
    fd = os.memfd_create("regen-kept-index", os.MFD_CLOEXEC | os.MFD_ALLOW_SEALING)
    os.ftruncate(fd, 8 + 2 * _INDEX_HALF)
    with mmap.mmap(fd, 8 + 2 * _INDEX_HALF) as m:
        _write_index(m, json.dumps(base).encode())
    with rt.lock:
        job = rt.client.keep(rank, _INDEX, fd, job=job, lease_ms=lease_ms)["job"]
        # Names an earlier keep() made that this one no longer needs.
        for k in rt.client.kept(job=job, uid=os.getuid()):
            if k["rank"] == rank and k["name"] != _INDEX and k["name"] not in chunks:
                rt.client.drop(job, rank, k["name"])
    return Kept(rt, job, rank, optimizer, fd)


def _chunk_tensor(base, nbytes, device):
    """A uint8 tensor over kept memory, no copy."""
    if device < 0:
        return torch.frombuffer((ctypes.c_uint8 * nbytes).from_address(base), dtype=torch.uint8)

    class _Memory:
        __cuda_array_interface__ = {"shape": (nbytes,), "typestr": "|u1", "data": (base, False), "version": 3}
    return torch.as_tensor(_Memory(), device=f"cuda:{device}")


def restore(model: torch.nn.Module, optimizer: Optional[torch.optim.Optimizer] = None,
            key: Optional[Tuple[Optional[str], int]] = None) -> Optional[int]:
    """Takes back what keep() kept under ``key`` into a freshly built model
    and optimizer: parameters, buffers and optimizer state become views of
    the kept memory at its new addresses (no copy).  Returns the last
    committed step (0 before the first commit), or None when nothing is
    kept (the model is left as it was)."""
    rt = _runtime()
    job, rank = _split(key)
    try:
        with rt.lock:
            kept, fd = rt.client.take_back(rank, _INDEX, job=job)
    except errors.NoSuchObject:
        return None
    with mmap.mmap(fd, kept["size"]) as m:
        index = json.loads(_read_index(m))
    os.close(fd)
    memory = {}
    for name, c in index["chunks"].items():
        with rt.lock:
            k, cfd = rt.client.take_back(rank, name, job=job)
        addr = rt.pool.adopt(cfd, k["kind"], k["size"], c["device"])
        _adopted[rt.pool.chunk_of(addr)["chunk"]] = name
        memory[name] = _chunk_tensor(addr, k["size"], c["device"])

    def view(spec):
        flat = memory[spec["chunk"]][spec["offset"]:].view(getattr(torch, spec["dtype"]))
        return flat.as_strided(spec["shape"], spec["stride"])

    tensors = index["tensors"]
    for name, p in model.named_parameters():
        p.data = view(tensors[f"param:{name}"])
    for name, b in model.named_buffers():
        module_name, _, attr = name.rpartition(".")
        model.get_submodule(module_name)._buffers[attr] = view(tensors[f"buffer:{name}"])
    if optimizer is not None:
        params = [p for g in optimizer.param_groups for p in g["params"]]
        for entry, spec in tensors.items():
            if entry.startswith("state:"):
                i, k = entry[len("state:"):].split(".", 1)
                optimizer.state[params[int(i)]][k] = view(spec)
        for entry, v in index["values"].items():
            i, k = entry.split(".", 1)
            value = torch.tensor(v["value"], dtype=getattr(torch, v["dtype"])) if "dtype" in v else v["value"]
            optimizer.state[params[int(i)]][k] = value
    # The index's step: the one its values (Adam's step) are of.
    return int(index.get("step", 0))
