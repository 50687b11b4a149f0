# SPDX-License-Identifier: Apache-2.0
"""One rank of test_torch_dist.py: torch.distributed with backend "regen"
over CPU tensors (regend's host backend, this rank on device LOCAL_RANK),
beside a gloo group of the same ranks.

    torch_dist_rank.py SOCKET OUT MODE      (env: MASTER_ADDR, MASTER_PORT, RANK, WORLD_SIZE, LOCAL_RANK)

MODE "collectives": every collective torch offers, on fresh random inputs
(every rank makes every rank's from the shared seed), against float64 or
exact references; then DDP on a small model through "regen" and through
gloo, the parameters compared after every step. MODE "fault": every rank
waits in an all_reduce while the test makes the last rank's device lose its
context; the others' fail by name (their time to notice written out), the
next all_reduce builds the communicator again on every rank (timed). MODE
"reattach1": one all_reduce, then rank 0 ends with an exception and the
others without a word (the communicators detach); "reattach2", run again,
re-attaches them. Writes a JSON object of what it saw to OUT."""

import json
import os
import sys
import time
import traceback
from datetime import timedelta

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.dirname(HERE))

import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402

SOCKET, OUT, MODE = sys.argv[1], sys.argv[2], sys.argv[3]
os.environ["REGEN_SOCKET"] = SOCKET
import regen.torch  # noqa: E402,F401 - registers the backend

RANK, WORLD = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
SEED = int(os.environ.get("TEST_SEED", "1"))
# TEST_DEVICE=cuda: every tensor on the rank's GPU (cuda:LOCAL_RANK, or
# cuda:0 where CUDA_VISIBLE_DEVICES shows the rank its GPU alone), and the
# twin of DDP on NCCL instead of gloo (tests/gpu/test_torch_dist_gpu.py).
if os.environ.get("TEST_DEVICE", "cpu") == "cuda":
    local = int(os.environ.get("LOCAL_RANK", "0"))
    DEV = torch.device("cuda", local if torch.cuda.device_count() > local else 0)
    torch.cuda.set_device(DEV)
else:
    DEV = torch.device("cpu")
checks = []


def zeros(*shape, dtype=torch.float32):
    return torch.zeros(*shape, dtype=dtype, device=DEV)


def full(shape, value):
    return torch.full(shape, value, device=DEV)


def check(name, ok, **detail):
    checks.append({"check": name, "ok": bool(ok), **detail})


def close(a, b, tol):
    a, b = a.double(), b.double()
    return a.shape == b.shape and bool(((a - b).abs() <= tol * b.abs().clamp(min=1.0)).all())


def every_rank(shape, dtype, salt):
    """Every rank's input for one check, the same in every process."""
    g = torch.Generator().manual_seed(SEED * 1000 + salt)
    if dtype in (torch.int64, torch.int32):
        xs = [torch.randint(-20, 20, shape, generator=g, dtype=dtype) for _ in range(WORLD)]
    elif dtype == torch.bool:
        xs = [torch.rand(shape, generator=g) > 0.7 for _ in range(WORLD)]
    else:
        xs = [torch.randn(shape, generator=g, dtype=torch.float64).to(dtype) for _ in range(WORLD)]
    return [x.to(DEV) for x in xs]


def reference(xs, op):
    stack = torch.stack([x.double() if x.is_floating_point() else x.long() for x in xs])
    if op == dist.ReduceOp.SUM:
        return stack.sum(0)
    if op == dist.ReduceOp.MAX:
        return stack.max(0).values
    if op == dist.ReduceOp.MIN:
        return stack.min(0).values
    return stack.prod(0)


TOL = {torch.float32: 1e-6, torch.float64: 1e-12, torch.bfloat16: 8e-3, torch.float16: 1e-3}


def collectives():
    ops = {"sum": dist.ReduceOp.SUM, "max": dist.ReduceOp.MAX, "min": dist.ReduceOp.MIN,
           "prod": dist.ReduceOp.PRODUCT}
    salt = 0
    for dtype in (torch.float32, torch.float64, torch.bfloat16, torch.int64, torch.int32):
        for name, op in ops.items():
            salt += 1
            xs = every_rank((3, 5), dtype, salt)
            t = xs[RANK].clone()
            dist.all_reduce(t, op=op)
            want = reference(xs, op)
            ok = torch.equal(t.long(), want) if not dtype.is_floating_point else close(t, want, TOL[dtype])
            check(f"all_reduce {dtype} {name}", ok)
    salt += 1
    b = every_rank((7,), torch.bool, salt)
    t = b[RANK].clone()
    dist.all_reduce(t)
    check("all_reduce bool (or)", torch.equal(t, torch.stack(b).any(0)))
    # Async, then wait.
    xs = every_rank((1000,), torch.float32, 99)
    t = xs[RANK].clone()
    work = dist.all_reduce(t, async_op=True)
    work.wait()
    check("all_reduce async", close(t, reference(xs, dist.ReduceOp.SUM), 1e-6))
    # all_gather (a list) and into one tensor.
    xs = every_rank((4, 3), torch.float32, 100)
    outs = [zeros(4, 3) for _ in range(WORLD)]
    dist.all_gather(outs, xs[RANK])
    check("all_gather", all(torch.equal(o, x) for o, x in zip(outs, xs)))
    into = zeros(WORLD * 4, 3)
    gather_into = getattr(dist, "all_gather_into_tensor", None) or dist._all_gather_base
    gather_into(into, xs[RANK])
    check("all_gather_into_tensor", torch.equal(into, torch.cat(xs)))
    # reduce_scatter (a list) and from one tensor.
    xs = every_rank((WORLD * 6,), torch.float32, 101)
    out = zeros(6)
    dist.reduce_scatter(out, list(xs[RANK].chunk(WORLD)))
    want = reference(xs, dist.ReduceOp.SUM)[RANK * 6:(RANK + 1) * 6]
    check("reduce_scatter", close(out, want, 1e-6))
    out = zeros(6)
    scatter_from = getattr(dist, "reduce_scatter_tensor", None) or dist._reduce_scatter_base
    scatter_from(out, xs[RANK].clone())
    check("reduce_scatter_tensor", close(out, want, 1e-6))
    # broadcast from the last rank.
    xs = every_rank((9,), torch.float64, 102)
    t = xs[RANK].clone()
    dist.broadcast(t, src=WORLD - 1)
    check("broadcast", torch.equal(t, xs[WORLD - 1]))
    # reduce, gather and scatter to and from rank 0.
    xs = every_rank((5,), torch.float32, 103)
    t = xs[RANK].clone()
    dist.reduce(t, dst=0)
    check("reduce", RANK != 0 or close(t, reference(xs, dist.ReduceOp.SUM), 1e-6))
    g = [zeros(5) for _ in range(WORLD)] if RANK == 0 else None
    dist.gather(xs[RANK], g, dst=0)
    check("gather", RANK != 0 or all(torch.equal(a, b) for a, b in zip(g, xs)))
    t = zeros(5)
    dist.scatter(t, list(xs) if RANK == 0 else None, src=0)
    check("scatter", torch.equal(t, xs[RANK]))
    # all_to_all_single: even, then uneven splits (rank r sends k + r + 1
    # rows to rank k).
    xs = every_rank((WORLD * 2, 3), torch.float32, 104)
    out = zeros(WORLD * 2, 3)
    dist.all_to_all_single(out, xs[RANK])
    check("all_to_all_single", torch.equal(out, torch.cat([x[RANK * 2:RANK * 2 + 2] for x in xs])))
    sends = [[full((k + r + 1, 2), float(100 * r + k)) for k in range(WORLD)] for r in range(WORLD)]
    inp = torch.cat(sends[RANK])
    out = zeros(sum(RANK + r + 1 for r in range(WORLD)), 2)
    dist.all_to_all_single(out, inp, output_split_sizes=[RANK + r + 1 for r in range(WORLD)],
                           input_split_sizes=[k + RANK + 1 for k in range(WORLD)])
    check("all_to_all_single uneven", torch.equal(out, torch.cat([sends[r][RANK] for r in range(WORLD)])))
    outs = [zeros(RANK + r + 1, 2) for r in range(WORLD)]
    dist.all_to_all(outs, list(sends[RANK]))
    check("all_to_all", all(torch.equal(o, sends[r][RANK]) for r, o in enumerate(outs)))
    # send and recv around a ring (even ranks send first).
    xs = every_rank((11,), torch.int64, 105)
    t = zeros(11, dtype=torch.int64)
    nxt, prv = (RANK + 1) % WORLD, (RANK - 1) % WORLD
    if RANK % 2 == 0:
        dist.send(xs[RANK], nxt)
        dist.recv(t, prv)
    else:
        dist.recv(t, prv)
        dist.send(xs[RANK], nxt)
    check("send/recv ring", torch.equal(t, xs[prv]))
    dist.barrier()
    check("barrier", True)


def ddp(twin_group):
    """The same model trained through "regen" and through gloo (NCCL on
    GPUs): the parameters agree after every step."""
    torch.manual_seed(SEED)
    model = torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.GELU(), torch.nn.Linear(32, 4))
    twin = torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.GELU(), torch.nn.Linear(32, 4))
    twin.load_state_dict(model.state_dict())
    # Ranks start apart: DDP's first broadcast makes them rank 0's.
    with torch.no_grad():
        for p, q in zip(model.parameters(), twin.parameters()):
            p.add_(0.01 * RANK)
            q.add_(0.01 * RANK)
    model.to(DEV)
    twin.to(DEV)
    ids = [DEV.index] if DEV.type == "cuda" else None
    a = torch.nn.parallel.DistributedDataParallel(model, device_ids=ids, bucket_cap_mb=0.001)
    b = torch.nn.parallel.DistributedDataParallel(twin, device_ids=ids, process_group=twin_group, bucket_cap_mb=0.001)
    oa = torch.optim.SGD(a.parameters(), lr=0.05)
    ob = torch.optim.SGD(b.parameters(), lr=0.05)
    g = torch.Generator().manual_seed(SEED * 7 + RANK)
    worst = 0.0
    for step in range(6):
        x = torch.randn(8, 16, generator=g).to(DEV)
        y = torch.randn(8, 4, generator=g).to(DEV)
        for net, opt in ((a, oa), (b, ob)):
            opt.zero_grad()
            torch.nn.functional.mse_loss(net(x), y).backward()
            opt.step()
        for p, q in zip(model.parameters(), twin.parameters()):
            worst = max(worst, float((p - q).abs().max()))
    # fp32 sums of the same terms, in another order on NCCL's ring.
    check("ddp equals gloo", worst < (1e-5 if DEV.type == "cpu" else 1e-4), worst=worst)
    # Every rank holds the same parameters.
    flat = torch.cat([p.detach().reshape(-1) for p in model.parameters()])
    outs = [torch.zeros_like(flat) for _ in range(WORLD)]
    dist.all_gather(outs, flat)
    check("ddp ranks agree", all(torch.equal(o, flat) for o in outs))


def fault():
    t = torch.ones(64, device=DEV)
    dist.all_reduce(t)
    ready = OUT + f".ready{RANK}"
    open(ready, "w").close()
    victim = WORLD - 1
    if RANK == victim:
        # Until the test made this rank's device lose its context.
        while not os.path.exists(OUT + ".lost"):
            time.sleep(0.01)
    t = torch.ones(64, device=DEV)
    err = None
    try:
        dist.all_reduce(t)
    except Exception as e:  # noqa: BLE001 - torch 1.13 raises regend's error itself, 2.x may wrap it
        err = f"{type(e).__name__}: {e}"
    ended = time.time()
    with open(OUT + ".lost") as f:
        lost = float(f.read())
    check("the call in flight failed", err is not None, error=err)
    check("by name", err is not None and ("CommFailed" in err or "StaleGeneration" in err or "DeviceLost" in err
                                          or "Draining" in err), error=err)
    if RANK != victim:
        check("noticed within 1 s", ended - lost < 1.0, seconds=ended - lost)
    start = time.monotonic()
    t = full((64,), float(RANK + 1))
    dist.all_reduce(t)
    rebuilt = time.monotonic() - start
    check("rebuilt", torch.equal(t, full((64,), float(WORLD * (WORLD + 1) // 2))), seconds=rebuilt)
    pg = dist.distributed_c10d._get_default_group()
    check("built afresh", not any(pg.reattached.values()))


def reattach(second):
    pg = dist.distributed_c10d._get_default_group()
    t = full((4,), float(RANK + 1))
    dist.all_reduce(t)
    check("all_reduce", torch.equal(t, full((4,), float(WORLD * (WORLD + 1) // 2))))
    check("re-attached" if second else "made", all(pg.reattached.values()) == second, reattached=pg.reattached)


def main():
    # TEST_BACKEND: "regen", or torch 2.x's device-mapped "cuda:regen".
    dist.init_process_group(os.environ.get("TEST_BACKEND", "regen"), rank=RANK, world_size=WORLD,
                            timeout=timedelta(seconds=int(os.environ.get("TEST_TIMEOUT_S", "60"))))
    pg = dist.distributed_c10d._get_default_group()
    check("a regen group", type(pg).__name__ == "ProcessGroupRegen" and "regen" in str(dist.get_backend()),
          backend=str(dist.get_backend()))
    try:
        if MODE == "collectives":
            twin = dist.new_group(backend="gloo" if DEV.type == "cpu" else "nccl")
            collectives()
            ddp(twin)
        elif MODE == "fault":
            fault()
        elif MODE.startswith("reattach"):
            reattach(MODE == "reattach2")
    except Exception:  # noqa: BLE001 - reported
        check("no exception", False, error=traceback.format_exc())
    with open(OUT, "w") as f:
        json.dump(checks, f)
    if MODE == "reattach1":
        # The job fails: rank 0 with an exception (its group leaves its
        # communicators detached at exit), the others killed (os._exit:
        # nothing runs). Their next processes re-attach.
        if RANK == 0:
            raise RuntimeError("the job failed (as the test wants)")
        os._exit(0)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
