#!/usr/bin/env python3
# SPDX-License-Identifier: Apache-2.0
"""torch.distributed's backend "regen" on N GPUs through one regend (CUDA
backend, NCCL in its workers): N rank processes, torchrun's way (RANK,
LOCAL_RANK, WORLD_SIZE, a TCPStore on 127.0.0.1), each with
CUDA_VISIBLE_DEVICES naming its own GPU alone (so each sees cuda:0, and
regen.torch finds regend's device by UUID), running
client/python/tests/torch_dist_rank.py with TEST_DEVICE=cuda:

1. every collective torch offers on CUDA tensors against exact or float64
   references, and DDP equal to torch's own NCCL group within fp tolerance,
   with init_process_group(backend="regen");
2. the same with backend "cuda:regen" where torch registers backends per
   device (torch >= 2.1);
3. a peer's device lost (InjectFault device_lost on the last GPU while the
   others wait in an all_reduce): the others' call fails by name within
   1 s, the next all_reduce builds the communicator again on every rank
   (its time printed: the issue's target is 2 s);
4. a whole-job restart: the second job re-attaches the communicators the
   first left (keyed by REGEN_JOB), faster than its init was.

    python3 tests/gpu/test_torch_dist_gpu.py [path/to/regend] [--nranks N]   (default: every GPU)

Exit 0 pass, 1 fail, 77 skipped (fewer than 2 GPUs, no torch with
torch.distributed, or a regend without NCCL). Keep NCCL_NVLS_ENABLE=0 where
the machine asks for it (it is passed on to the ranks and regend).
"""

import inspect
import json
import os
import socket
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.join(HERE, "..", "..")
sys.path.insert(0, os.path.join(REPO, "client", "python"))
sys.path.insert(0, os.path.join(REPO, "tests", "lib"))
from regend_fixture import SKIP, Regend, find_regend, log, record, summary, take_option  # noqa: E402

RANK_SCRIPT = os.path.join(REPO, "client", "python", "tests", "torch_dist_rank.py")


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def launch(daemon, n, mode, tmp, job, backend="regen"):
    port = free_port()
    seed = str(int.from_bytes(os.urandom(2), "little"))
    procs, outs = [], []
    for r in range(n):
        out = os.path.join(tmp, f"{mode}-{backend.replace(':', '_')}-{r}.json")
        env = dict(os.environ, MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), RANK=str(r), WORLD_SIZE=str(n),
                   LOCAL_RANK=str(r), CUDA_VISIBLE_DEVICES=str(r), REGEN_JOB=job, TEST_SEED=seed,
                   TEST_DEVICE="cuda", TEST_BACKEND=backend, TEST_TIMEOUT_S="300",
                   PYTHONPATH=os.path.join(REPO, "client", "python"))
        procs.append(subprocess.Popen([sys.executable, RANK_SCRIPT, daemon.socket, out, mode], env=env,
                                      stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True))
        outs.append(out)
    return procs, outs


def collect(procs, outs, what, timeout=900, failing=()):
    results = []
    for r, (p, out) in enumerate(zip(procs, outs)):
        try:
            text, _ = p.communicate(timeout=timeout)
        except subprocess.TimeoutExpired:
            for q in procs:
                q.kill()
            record(f"{what}: rank {r} finished in {timeout} s", False)
            return None
        want = 1 if r in failing else 0
        if not record(f"{what}: rank {r} exited {want} (got {p.returncode})", p.returncode == want):
            print(text[-3000:])
            return None
        with open(out) as f:
            results.append(json.load(f))
    for r, checks in enumerate(results):
        for c in checks:
            extra = {k: v for k, v in c.items() if k not in ("check", "ok")}
            record(f"{what}: rank {r}: {c['check']}" + (f" {extra}" if extra else ""), c["ok"])
    return results


def main():
    n_arg = take_option("--nranks", None)
    try:
        import torch
        import torch.distributed as dist
    except ImportError:
        log("SKIP: no torch")
        return SKIP
    if not dist.is_available():
        log("SKIP: torch without torch.distributed")
        return SKIP
    gpus = torch.cuda.device_count()
    n = int(n_arg) if n_arg else gpus
    if gpus < 2 or n < 2 or n > gpus:
        log(f"SKIP: {gpus} GPU(s); this needs 2 or more (--nranks {n_arg or 'all'})")
        return SKIP
    regend = find_regend(sys.argv[1] if len(sys.argv) > 1 else None)
    daemon = Regend(regend, devices=gpus, backend="cuda", ready_timeout=180)
    try:
        import regen
        c = regen.Client(daemon.socket, timeout=120)
        try:
            c.comm_unique_id(0)
        except regen.MethodNotImplemented:
            log("SKIP: regend's CUDA backend was built without NCCL")
            return SKIP
        with tempfile.TemporaryDirectory() as tmp:
            # 1. regen, every collective and DDP against torch's NCCL.
            collect(*launch(daemon, n, "collectives", tmp, "gpu-" + os.urandom(4).hex()), f"regen x{n}")
            # 2. cuda:regen, where torch maps backends per device.
            if "devices" in inspect.signature(dist.Backend.register_backend).parameters:
                collect(*launch(daemon, n, "collectives", tmp, "gpu-" + os.urandom(4).hex(), "cuda:regen"),
                        f"cuda:regen x{n}")
            else:
                log("torch registers no backend per device: cuda:regen not run")
            # 3. a peer's device lost.
            procs, outs = launch(daemon, n, "fault", tmp, "gpu-" + os.urandom(4).hex())
            until = time.monotonic() + 600
            while not all(os.path.exists(o + f".ready{r}") for r, o in enumerate(outs)):
                if time.monotonic() > until or any(p.poll() is not None for p in procs):
                    break
                time.sleep(0.02)
            time.sleep(0.5)
            for o in outs:
                with open(o + ".lost.tmp", "w") as f:
                    f.write(repr(time.time()))
            c.inject_fault(n - 1, "device_lost")
            for o in outs:
                os.rename(o + ".lost.tmp", o + ".lost")
            res = collect(procs, outs, f"device lost x{n}")
            for r, checks in enumerate(res or []):
                seen = {x["check"]: x for x in checks}
                if "noticed within 1 s" in seen and "rebuilt" in seen:
                    log(f"rank {r}: failed {seen['noticed within 1 s']['seconds'] * 1000:.0f} ms after the loss; "
                        f"communicator rebuilt in {seen['rebuilt']['seconds'] * 1000:.0f} ms")
                    record(f"rank {r}: rebuilt within 2 s", seen["rebuilt"]["seconds"] < 2.0)
            # 4. a restarted job re-attaches.
            job = "gpu-" + os.urandom(4).hex()
            collect(*launch(daemon, n, "reattach1", tmp, job), f"first job x{n}", failing=(0,))
            collect(*launch(daemon, n, "reattach2", tmp, job), f"restarted job x{n}")
        c.close()
    finally:
        daemon.stop()
    return summary()


if __name__ == "__main__":
    sys.exit(main())
