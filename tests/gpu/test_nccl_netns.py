#!/usr/bin/env python3
# SPDX-License-Identifier: Apache-2.0
"""NCCL between two "nodes" on one machine: two network namespaces joined
by a veth pair, a regend (CUDA backend) in each serving one GPU (A: GPU 0,
B: GPU 1), and a communicator of two ranks, rank 0 on regend A, rank 1 on
regend B. NCCL is kept to what two nodes have between them: its socket
transport over the veth (NCCL_SOCKET_IFNAME, NCCL_NET=Socket), no shared
memory, no peer-to-peer, no InfiniBand, no NVLS. Checked: Init joins
across the namespaces (NCCL's TCP bootstrap from the unique id regend A
made in namespace A), AllReduce and AllGather right on both ranks, and a
peer's abort failing the other by name.

This is item 4 of issue 36 on a GPU machine; under systemd the shipped
unit would apply on top (tests/ops/test_units.py holds it to what NCCL
needs), which no GPU machine here has. tests/ops/test_netns.py is its CPU
stand-in (host backend, torch ranks).

    python3 tests/gpu/test_nccl_netns.py [path/to/regend]

Exit 0 pass, 1 fail, 77 skipped: fewer than 2 GPUs, not root, `ip netns` or
veth refused, no torch, or a regend without NCCL.
"""

import os
import shutil
import subprocess
import sys
import threading

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.join(HERE, "..", "..")
sys.path.insert(0, os.path.join(REPO, "client", "python"))
sys.path.insert(0, os.path.join(REPO, "tests", "lib"))
sys.path.insert(0, os.path.join(REPO, "tests", "ops"))
from regend_fixture import SKIP, Regend, find_regend, log, record, summary  # noqa: E402
from test_netns import Namespaces  # noqa: E402

# What two nodes share: a socket network, nothing else.
NCCL_ENV = {"NCCL_NET": "Socket", "NCCL_SHM_DISABLE": "1", "NCCL_P2P_DISABLE": "1", "NCCL_IB_DISABLE": "1",
            "NCCL_NVLS_ENABLE": "0", "NCCL_DEBUG": os.environ.get("NCCL_DEBUG", "WARN")}
N = 1 << 16


def can_netns():
    if os.geteuid() != 0 or not shutil.which("ip"):
        return False
    name = "regenprobe%d" % os.getpid()
    if subprocess.run(["ip", "netns", "add", name], capture_output=True).returncode != 0:
        return False
    subprocess.run(["ip", "netns", "del", name], capture_output=True)
    return True


def main():
    try:
        import torch
    except ImportError:
        log("SKIP: no torch")
        return SKIP
    if torch.cuda.device_count() < 2:
        log(f"SKIP: {torch.cuda.device_count()} GPU(s); this needs 2")
        return SKIP
    if not can_netns():
        log("SKIP: network namespaces are refused here (root and ip netns needed)")
        return SKIP
    import regen
    regend = find_regend(sys.argv[1] if len(sys.argv) > 1 else None)
    with Namespaces() as nets:
        daemons = []
        try:
            for i in range(2):
                env = dict(NCCL_ENV, CUDA_VISIBLE_DEVICES=str(i), NCCL_SOCKET_IFNAME=nets.veth[i])
                d = Regend(regend, devices=1, backend="cuda", start=False)
                daemons.append(d)
                d.start(wrapper=nets.exec_prefix(i), env=env, ready_timeout=180)
                log(f"regend {'AB'[i]} in {nets.ns[i]} with GPU {i}: {d.socket}")
            clients = [regen.Client(d.socket, timeout=300) for d in daemons]
            try:
                uid = clients[0].comm_unique_id(0)
            except regen.MethodNotImplemented:
                log("SKIP: regend's CUDA backend was built without NCCL")
                return SKIP
            comms, errors = [None, None], [None, None]

            def join(r):
                try:
                    comms[r] = clients[r].comm_init(uid, r, 2, device=0, deadline_ms=120000)
                except regen.Error as e:
                    errors[r] = e

            ts = [threading.Thread(target=join, args=(r,)) for r in range(2)]
            for t in ts:
                t.start()
            for t in ts:
                t.join(180)
            if not record(f"Init across the namespaces (errors: {errors})", all(comms)):
                return summary()
            xs, ys = [], []
            for r in range(2):
                torch.cuda.set_device(r)
                x = torch.full((N,), float(r + 1), device=f"cuda:{r}")
                y = torch.zeros(2 * N, device=f"cuda:{r}")
                torch.cuda.synchronize(r)
                xs.append(x)
                ys.append(y)
            done = [None, None]

            def reduce_and_gather(r):
                try:
                    c = clients[r]
                    bx, by = c.import_tensor(xs[r], device=0), c.import_tensor(ys[r], device=0)
                    c.comm_all_reduce(comms[r], regen.Operand(bx, 0, "f32", [N]), regen.Operand(bx, 0, "f32", [N]))
                    c.comm_all_gather(comms[r], regen.Operand(bx, 0, "f32", [N]), regen.Operand(by, 0, "f32", [2 * N]))
                    done[r] = True
                except regen.Error as e:
                    done[r] = e

            ts = [threading.Thread(target=reduce_and_gather, args=(r,)) for r in range(2)]
            for t in ts:
                t.start()
            for t in ts:
                t.join(180)
            for r in range(2):
                torch.cuda.synchronize(r)
                record(f"rank {r}: AllReduce and AllGather ran ({done[r]})", done[r] is True)
                record(f"rank {r}: AllReduce over the veth is right", bool((xs[r] == 3.0).all()))
                record(f"rank {r}: AllGather over the veth is right", bool((ys[r] == 3.0).all()))
            # A peer's abort: the other's next collective fails by name.
            clients[1].comm_abort(comms[1])
            try:
                clients[0].comm_all_reduce(comms[0], regen.Operand(clients[0].import_tensor(xs[0], device=0), 0,
                                                                   "f32", [N]),
                                           regen.Operand(clients[0].import_tensor(xs[0], device=0), 0, "f32", [N]),
                                           deadline_ms=20000)
                record("rank 0's AllReduce after rank 1's abort failed", False)
            except (regen.CommFailed, regen.CommTimeout) as e:
                record(f"rank 0's AllReduce after rank 1's abort failed by name ({type(e).__name__})", True)
            for r in range(2):
                clients[r].comm_destroy(comms[r], abort=True)
                clients[r].close()
        finally:
            for d in daemons:
                if d.proc is not None:
                    d.stop()
    return summary()


if __name__ == "__main__":
    sys.exit(main())
