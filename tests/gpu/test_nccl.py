#!/usr/bin/env python3
# SPDX-License-Identifier: Apache-2.0
"""NCCL communicators in regend on one GPU (nranks = 1), driven by a torch
process whose CUDA tensors regend imports by CUDA IPC:

- results: AllReduce (sum, max, avg), AllGather, ReduceScatter, Broadcast
  in f32, f16 and bf16 on fresh random inputs, against torch on the same
  inputs (with one rank each is the identity, so the check is the data path:
  operands, offsets, dtypes, the lane's stream);
- events: an AllReduce ordered by a wait_event and a signal_event alone
  (no host synchronisation) reads the rank's input and is read after;
- a call in flight aborted: an AllReduce held behind a wait_event (the
  rank's stream sleeps before recording it) is aborted from another
  connection (the Abort answered at once: ncclCommAbort runs on a thread
  of its own) and ends with CommFailed, the device still ready; an Init of 2
  ranks whose peer never comes ends with CommTimeout at its deadline, and
  one ended by a restart's drain;
- restart then Init again: the old id is StaleGeneration, a new Init works;
  a Release finalizes and destroys a healthy idle communicator (no peer to
  wait for: well under its 2 s bound), a Restart aborts one;
- re-attach against a new init: a child process (no CUDA of its own) makes
  a keyed communicator and exits; the time to Attach it is printed against
  the time of a new Init (ncclCommInitRankConfig inside regend).

    python3 tests/gpu/test_nccl.py [path/to/regend]

Exit 0 pass, 1 fail, 77 skipped (no torch, no CUDA, or regend built
without NCCL). Prints one line per check and "N passed, N failed" last.
"""

import os
import subprocess
import sys
import threading
import time
import traceback

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "..", "client", "python"))
sys.path.insert(0, os.path.join(HERE, "..", "lib"))
from regend_fixture import Regend, SKIP, find_regend, record, require_torch, summary, \
    torch_rel_error as rel_err  # noqa: E402

torch = require_torch()

import regen  # noqa: E402

DEV = 0
TOL = {"f32": 1e-6, "f16": 1e-3, "bf16": 1e-2}
TORCH_DTYPE = {"f32": torch.float32, "f16": torch.float16, "bf16": torch.bfloat16}


def fresh(n, dtype):
    g = torch.Generator(device=f"cuda:{DEV}").manual_seed(int.from_bytes(os.urandom(8), "little") >> 1)
    return torch.randn(n, device=f"cuda:{DEV}", generator=g).to(TORCH_DTYPE[dtype])


def check_results(c):
    comm = c.comm_init(c.comm_unique_id(DEV), 0, 1, device=DEV)
    for dtype in ("f32", "f16", "bf16"):
        for n in (1, 4099, 1 << 20):
            x = fresh(n, dtype)
            ref = x.clone()
            for op in ("sum", "max", "avg"):
                y = torch.full_like(x, float("nan"))
                c.comm_all_reduce(comm, x, y, op=op)
                torch.cuda.synchronize()
                err = rel_err(y, ref)
                record(f"all_reduce {op} {dtype} n={n}", err <= TOL[dtype] and torch.equal(x, ref), f"rel err {err:.2e}")
            y = torch.full_like(x, float("nan"))
            c.comm_all_gather(comm, x, y)
            c.comm_broadcast(comm, x, x, root=0)   # in place
            torch.cuda.synchronize()
            record(f"all_gather + broadcast {dtype} n={n}", torch.equal(y, ref) and torch.equal(x, ref))
            z = torch.full_like(x, float("nan"))
            c.comm_reduce_scatter(comm, x, z, op="sum")
            torch.cuda.synchronize()
            record(f"reduce_scatter {dtype} n={n}", rel_err(z, ref) <= TOL[dtype])
    # An offset inside a larger allocation, and a recv past its end refused.
    big = fresh(3000, "f32")
    part, out = big[1000:2000], big[2000:3000]
    c.comm_all_reduce(comm, part, out)
    torch.cuda.synchronize()
    record("all_reduce at an offset", torch.equal(out, part))
    try:
        buf = c.import_tensor(big)
        c.comm_all_reduce(comm, regen.Operand(buf, 0, "f32", [1000]), regen.Operand(buf, 8004, "f32", [1000]))
        record("recv past the buffer refused", False, "accepted")
    except regen.InvalidOperand as e:
        record("recv past the buffer refused", e.parameters.get("operand") == "recv")
    c.comm_destroy(comm)


def check_event_chain(c):
    """The rank's stream makes x after about 50 ms of GPU time and records
    ev_in; regend's AllReduce waits on it and records ev_out; the rank's
    stream waits on ev_out before it copies y. Without the waits the
    collective would read x's NaN poison, or the copy y's."""
    comm = c.comm_init(c.comm_unique_id(DEV), 0, 1, device=DEV)
    n = 1 << 20
    real = fresh(n, "f32")
    x = torch.full_like(real, float("nan"))
    y = torch.full_like(real, float("nan"))
    ev_in = torch.cuda.Event(interprocess=True)
    ev_out = torch.cuda.Event(interprocess=True)
    ev_in.record()
    ev_out.record()
    torch.cuda.synchronize()
    e_in = c.import_event(DEV, ev_in.ipc_handle())
    e_out = c.import_event(DEV, ev_out.ipc_handle())
    bx, by = c.import_tensor(x), c.import_tensor(y)
    torch.cuda._sleep(100_000_000)
    x.copy_(real)
    ev_in.record()
    c.comm_all_reduce(comm, regen.Operand(bx, 0, "f32", [n]), regen.Operand(by, 0, "f32", [n]), wait_event=e_in,
                      signal_event=e_out)
    torch.cuda.current_stream().wait_event(ev_out)
    out = y.clone()
    torch.cuda.synchronize()
    record("wait/signal events order a collective with the rank's stream", torch.equal(out, real),
           f"{int(torch.isnan(out).sum())} NaN")
    c.close_event(e_in)
    c.close_event(e_out)
    c.comm_destroy(comm)


def check_abort_in_flight(c, socket):
    """A collective held in flight behind a wait_event (the rank's stream
    sleeps before recording it) is aborted from another connection of this
    process: it must end with CommFailed, the device must stay usable."""
    gen = c.generation()["devices"][DEV]["generation"]
    comm = c.comm_init(c.comm_unique_id(DEV), 0, 1, device=DEV)
    x = fresh(1 << 20, "f32")
    ev = torch.cuda.Event(interprocess=True)
    ev.record()
    torch.cuda.synchronize()
    e_in = c.import_event(DEV, ev.ipc_handle())
    torch.cuda._sleep(2_000_000_000)       # about a second of GPU time before the event
    ev.record()
    outcome = {}

    def call():
        cl = c   # the call's own connection is c's; the abort comes on another
        t0 = time.monotonic()
        try:
            cl.comm_all_reduce(comm, x, x, wait_event=e_in, deadline_ms=60000)
            outcome["r"] = "finished"
        except regen.Error as e:
            outcome["r"] = e
        outcome["s"] = time.monotonic() - t0

    t = threading.Thread(target=call)
    t.start()
    time.sleep(0.2)
    other = regen.Client(socket, timeout=120)
    try:
        other.comm_destroy(comm)
        record("Destroy with a call in flight refused", False, "accepted")
    except regen.CommInFlight:
        record("Destroy with a call in flight refused", True, "CommInFlight")
    except regen.NoSuchObject:
        record("Destroy with a call in flight refused", False, "another connection of this process cannot name it")
    t_abort = time.monotonic()
    try:
        other.comm_abort(comm)
        s = time.monotonic() - t_abort
        record("Abort from another connection answers at once", s < 0.5, f"{s * 1e3:.1f} ms")
    except regen.Error as e:
        record("Abort from another connection answers at once", False, repr(e))
    t.join(60)
    r = outcome.get("r")
    record("a collective in flight ends with CommFailed after Abort", isinstance(r, regen.CommFailed),
           f"{type(r).__name__}: {getattr(r, 'parameters', {}).get('reason', r)} after {outcome.get('s', -1):.2f} s")
    torch.cuda.synchronize()
    info = c.generation()["devices"][DEV]
    record("the device is not at fault after the abort", info["state"] == "ready" and info["generation"] == gen,
           f"{info['state']} generation {info['generation']} (was {gen})")
    c.comm_destroy(comm)
    c.close_event(e_in)
    other.close()
    # And an Init in flight (its peer never comes) ended by a restart's drain.
    uid = c.comm_unique_id(DEV)
    done = {}

    def lonely_init():
        cl = regen.Client(socket, timeout=120)
        try:
            done["comm"] = cl.comm_init(uid, 0, 2, device=DEV, deadline_ms=60000)
        except regen.Error as e:
            done["err"] = e
        cl.close()

    t = threading.Thread(target=lonely_init)
    t.start()
    time.sleep(1.0)
    record("Init waits for its peer", t.is_alive())
    admin = regen.Client(socket, timeout=120)
    t0 = time.monotonic()
    admin.restart(DEV, reason="test_nccl: end an Init in flight")
    t.join(30)
    record("a restart ends an Init in flight (the drain aborts it)", not t.is_alive() and "err" in done,
           f"{type(done.get('err')).__name__} after {time.monotonic() - t0:.2f} s")
    admin.close()


def check_init_deadline(c):
    gen = c.generation()["devices"][DEV]["generation"]
    t0 = time.monotonic()
    try:
        c.comm_init(c.comm_unique_id(DEV), 0, 2, device=DEV, deadline_ms=2000)
        record("init without its peer times out", False, "joined?")
    except regen.CommTimeout:
        s = time.monotonic() - t0
        record("init without its peer times out", 1.9 <= s <= 10, f"CommTimeout after {s:.2f} s")
    info = c.generation()["devices"][DEV]
    record("the device is not at fault", info["state"] == "ready" and info["generation"] == gen,
           f"{info['state']} generation {info['generation']} (was {gen})")


def check_abort_joined(c):
    comm = c.comm_init(c.comm_unique_id(DEV), 0, 1, device=DEV)
    x = fresh(1 << 16, "f32")
    c.comm_all_reduce(comm, x, x)
    c.comm_abort(comm)
    try:
        c.comm_all_reduce(comm, x, x)
        record("a call after Abort fails", False, "it ran")
    except regen.CommFailed as e:
        record("a call after Abort fails", e.parameters.get("reason") == "aborted", e.parameters.get("reason"))
    c.comm_destroy(comm)


def check_restart_then_init(c):
    comm = c.comm_init(c.comm_unique_id(DEV), 0, 1, device=DEV)
    x = fresh(4096, "bf16")
    c.comm_all_reduce(comm, x, x)
    gen = comm.generation
    c.restart(DEV, reason="test_nccl")
    for _ in range(200):
        if c.generation()["devices"][DEV]["generation"] > gen:
            break
        time.sleep(0.05)
    try:
        c.comm_all_reduce(comm, x, x)
        record("old communicator after a restart", False, "it ran")
    except regen.StaleGeneration:
        record("old communicator after a restart", True, "StaleGeneration")
    comm = c.comm_init(c.comm_unique_id(DEV), 0, 1, device=DEV)
    y = fresh(4096, "bf16")
    ref = y.clone()
    c.comm_all_reduce(comm, y, y, op="avg")
    torch.cuda.synchronize()
    record("Init and AllReduce after the restart", comm.generation > gen and torch.equal(y, ref))
    c.comm_destroy(comm)


def check_release_and_restart_end_idle(c):
    """A healthy idle communicator: a Release finalizes it
    (ncclCommFinalize, then ncclCommDestroy: one rank, nothing to wait
    for), a Restart aborts it; both leave the device ready for a new Init."""
    for verb in ("release", "restart"):
        comm = c.comm_init(c.comm_unique_id(DEV), 0, 1, device=DEV)
        x = fresh(4096, "f32")
        c.comm_all_reduce(comm, x, x)
        torch.cuda.synchronize()
        t0 = time.monotonic()
        getattr(c, verb)(DEV, reason=f"test_nccl: {verb} an idle communicator")
        s = time.monotonic() - t0
        info = c.generation()["devices"][DEV]
        record(f"{verb} with an idle healthy communicator", info["state"] == "ready" and s < 5,
               f"{s * 1e3:.0f} ms, {info['state']}")
        try:
            c.comm_all_reduce(comm, x, x)
            record(f"the communicator is stale after the {verb}", False, "it ran")
        except regen.StaleGeneration:
            record(f"the communicator is stale after the {verb}", True)
    again = c.comm_init(c.comm_unique_id(DEV), 0, 1, device=DEV)
    y = fresh(4096, "f32")
    ref = y.clone()
    c.comm_all_reduce(again, y, y)
    torch.cuda.synchronize()
    record("Init and AllReduce after a release and a restart", torch.equal(y, ref))
    c.comm_destroy(again)


CHILD = r"""
import sys
sys.path.insert(0, sys.argv[1])
import regen
c = regen.Client(sys.argv[2], timeout=120)
comm = c.comm_init(c.comm_unique_id(%d), 0, 1, device=%d, key=sys.argv[3])
print(comm.id, flush=True)
"""


def check_reattach(c, socket):
    key = f"test_nccl/{os.getpid()}/rank0"
    client_dir = os.path.join(HERE, "..", "..", "client", "python")
    out = subprocess.run([sys.executable, "-c", CHILD % (DEV, DEV), client_dir, socket, key], capture_output=True,
                         text=True, timeout=120)
    made = out.stdout.strip()
    if not record("a child makes a keyed communicator and exits", out.returncode == 0 and made.startswith("c"),
                  out.stderr[-300:]):
        return
    comm = None
    t0 = time.monotonic()
    while comm is None and time.monotonic() - t0 < 10:
        try:
            a0 = time.perf_counter()
            comm = c.comm_attach(key, device=DEV)
            attach_s = time.perf_counter() - a0
        except regen.NoSuchObject:
            time.sleep(0.02)
    if not record("attach by key", comm is not None and comm.id == made, made):
        return
    x = fresh(1 << 20, "f32")
    ref = x.clone()
    c.comm_all_reduce(comm, x, x)
    torch.cuda.synchronize()
    record("the re-attached communicator works", torch.equal(x, ref))
    i0 = time.perf_counter()
    fresh_comm = c.comm_init(c.comm_unique_id(DEV), 0, 1, device=DEV)
    init_s = time.perf_counter() - i0
    record("re-attach is cheaper than a new init", attach_s < init_s,
           f"attach {attach_s * 1e3:.2f} ms, new Init (ncclCommInitRankConfig) {init_s * 1e3:.1f} ms, "
           f"ratio {init_s / attach_s:.0f}x")
    c.comm_destroy(comm)
    c.comm_destroy(fresh_comm)


def main():
    regend = sys.argv[1] if len(sys.argv) > 1 else find_regend()
    daemon = Regend(regend, devices=1, backend="cuda", ready_timeout=120)
    try:
        c = regen.Client(daemon.socket, timeout=120)
        try:
            c.comm_unique_id(DEV)
        except regen.MethodNotImplemented:
            print("regend's CUDA backend was built without NCCL: skipping")
            return SKIP
        for check in (lambda: check_results(c), lambda: check_event_chain(c), lambda: check_init_deadline(c),
                      lambda: check_abort_joined(c),
                      lambda: check_abort_in_flight(c, daemon.socket), lambda: check_restart_then_init(c),
                      lambda: check_release_and_restart_end_idle(c),
                      lambda: check_reattach(c, daemon.socket)):
            try:
                check()
            except Exception:
                record("unexpected exception", False, traceback.format_exc()[-600:])
        c.close()
    finally:
        daemon.stop()
    return summary()


if __name__ == "__main__":
    sys.exit(main())
