#!/usr/bin/env python3
# SPDX-License-Identifier: Apache-2.0
"""The Python client's own cost per call, queued (wait=False) on the host
backend: this thread's CPU time per call, and with --callgrind the
instructions per call, counted by valgrind's callgrind over the calls alone.

    python3 tests/bench/bench_client_calls.py [--regend PATH] [--calls N] [--rounds R]
    valgrind --tool=callgrind --callgrind-out-file=DIR/cg.%p \\
        python3 tests/bench/bench_client_calls.py --callgrind DIR [--path P] [--calls N]

Paths (16³ f32 GEMMs, a one-node Run of 2 bindings), each on the transport
named after it:
  tensors      regen.torch's chained call, its tensors (stand-ins lying in
               imported buffers) read by regen._accel (ring only);
  encoded      the same with its operands resolved already (Client.queue_encoded;
               ring only);
  gemm         Client.gemm(..., wait=False) on Operands;
  run          Client.run_program(..., wait=False).
Calls are queued 64 at a time; before the wait that reads their answers the
thread sleeps until they are all in, so that no spin of the wait is counted.
The instructions are those of the loop less those of the same loop without
calls (callgrind_control zeroes and dumps around each), divided by the
calls. Instruction counts do not move with the machine's load, as times on a
shared machine do: docs/performance.md compares clients by them.
"""

import argparse
import glob
import importlib.util
import os
import subprocess
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from _harness import Daemon, markdown_table, regen  # noqa: E402
from regen.host import HostTensor  # noqa: E402

PATHS = {"tensors": ("ring",), "encoded": ("ring",), "gemm": ("ring", "varlink"), "run": ("ring", "varlink")}
BATCH = 64


class StandIn:
    """What regen._accel reads of a torch tensor."""

    def __init__(self, ptr, shape):
        self.ptr, self.shape, self.dtype, self._strides = ptr, tuple(shape), "f32", (shape[1], 1)

    def data_ptr(self):
        return self.ptr

    def get_device(self):
        return 0

    def stride(self):
        return self._strides


def tensor_queue(c):
    """queue_tensors of this client version: Client.queue_tensors (before
    issue 31) or regen.torch's (loaded on its own where torch is missing:
    it imports none itself)."""
    if hasattr(c, "queue_tensors"):
        return c.queue_tensors
    name = "regen.torch._tensors"
    glue = sys.modules.get(name)
    if glue is None:
        spec = importlib.util.spec_from_file_location(name, os.path.join(os.path.dirname(regen.__file__), "torch",
                                                                         "_tensors.py"))
        glue = importlib.util.module_from_spec(spec)
        sys.modules[name] = glue
        spec.loader.exec_module(glue)
    return lambda *args: glue.queue_tensors(c, *args)


def calls_of(c, path, tensors, prog, bind):
    a, b, d = tensors
    if path == "gemm":
        return lambda: c.gemm(a.op, b.op, d.op, wait=False)
    if path == "run":
        return lambda: c.run_program(prog, bind, wait=False)
    record = (0, 0, 0, 0, 1.0, 0.0, 0.0, 0)
    if path == "encoded":
        slots = [(t.buffer, 0, 0, [16, 16], [16, 1]) for t in (a, b)] + [None, (d.buffer, 0, 0, [16, 16], [16, 1])]
        return lambda: c.queue_encoded(0, "gemm", slots + [None] * 3, record)
    base = 1 << 40
    kept = [(base + i * 4096, base + i * 4096 + 1024, t.buffer) for i, t in enumerate((a, b, d))]
    named = {n: StandIn(base + i * 4096, [16, 16]) for i, n in enumerate("abd")}
    names = ("a", "b", "c", "d", "bias", "aux", "aux_out")
    queue = tensor_queue(c)
    return lambda: queue(0, "gemm", names, named, 0, kept, {"f32": 0}, record)


def loop(c, fn, calls):
    for _ in range(calls // BATCH):
        for _ in range(BATCH):
            fn()
        time.sleep(0.02)
        c.wait(0)


_dumps = 0   # callgrind numbers a process's dumps .1, .2, ...


def callgrind_count(c, fn, calls, out_dir):
    """Instructions per call: the loop's, less an empty loop's."""
    global _dumps
    pid = str(os.getpid())
    for n in (calls, 0):
        subprocess.run(["callgrind_control", "-z", pid], capture_output=True, check=True)
        loop(c, fn, n)
        subprocess.run(["callgrind_control", "-d", pid], capture_output=True, check=True)
    totals = []
    _dumps += 2
    for k in (_dumps - 1, _dumps):
        path = glob.glob(os.path.join(out_dir, f"*.{pid}.{k}")) or glob.glob(os.path.join(out_dir, f"*{pid}*.{k}"))
        with open(path[0]) as f:
            totals.append(next(int(line.split()[1]) for line in f if line.startswith(("summary:", "totals:"))))
    return (totals[0] - totals[1]) / calls


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--regend", help="regend to start (default $REGEND, $REGEN_BUILD_ROOT/daemon/regend, "
                                     "build/daemon/regend)")
    ap.add_argument("--path", choices=sorted(PATHS), action="append", help="paths to measure (default all)")
    ap.add_argument("--calls", type=int, default=640)
    ap.add_argument("--rounds", type=int, default=20, help="rounds of CPU time; the fastest counts")
    ap.add_argument("--callgrind", metavar="DIR", help="count instructions (under callgrind, its files in DIR)")
    args = ap.parse_args()
    daemon = Daemon(None, args.regend, "host")
    rows = []
    try:
        for path in args.path or sorted(PATHS):
            for transport in PATHS[path]:
                c = regen.Client(daemon.socket, timeout=60, transport=transport)
                tensors = [HostTensor.random([16, 16]), HostTensor.random([16, 16]), HostTensor([16, 16])]
                for t in tensors:
                    t.import_into(c, 0)
                p = regen.ProgramBuilder("neg")
                p.input("x", "f32", (16,))
                p.output("y", "f32", (16,))
                p.node("neg", ["x"], ["y"])
                prog = c.define_program(0, p.definition())
                bind = {"x": (tensors[0].buffer, 0), "y": (tensors[2].buffer, 0)}
                fn = calls_of(c, path, tensors, prog, bind)
                # Warm: the lane picked, the ids bound (a client before issue
                # 31 declined a call whose buffers its ring had not bound).
                c.gemm(*(t.op for t in tensors))
                if fn() is None:
                    raise SystemExit(f"{path}: the call was declined, nothing queued")
                loop(c, fn, BATCH)
                if c.lane_transport(0) != transport:
                    print(f"note: {path} ran on {c.lane_transport(0)}, not {transport}")
                if args.callgrind:
                    rows.append([path, transport, f"{callgrind_count(c, fn, args.calls, args.callgrind):,.0f}"])
                else:
                    best = float("inf")
                    for _ in range(args.rounds):
                        t0 = time.thread_time()
                        for _ in range(BATCH):
                            fn()
                        best = min(best, (time.thread_time() - t0) / BATCH)
                        c.wait(0)
                    rows.append([path, transport, f"{best * 1e6:.2f}"])
                c.close()
                for t in tensors:
                    t.close()
    finally:
        daemon.close()
    print(markdown_table(["path", "transport", "instructions per call" if args.callgrind else "CPU µs per call"],
                         rows))
    return 0


if __name__ == "__main__":
    sys.exit(main())
