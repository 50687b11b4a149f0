#!/usr/bin/env python3
# SPDX-License-Identifier: Apache-2.0
"""Control-plane and small-GEMM latency through regend's host backend: what
the protocol, the sockets and the Python client cost, with no GPU at all.

    python3 tests/bench/bench_host.py [--regend build/daemon/regend | --socket PATH]
                                      [--iters N] [--json out.json]

Measures, each as calls/s and p50/p99 of the wall time of one blocking call:
  - io.regen.Device.Generation on the main socket (raw Varlink connection);
  - org.varlink.service.GetInfo on the main socket and on a worker socket
    (the same trivial method: the two sockets' bare round trips);
  - GEMMs (f32, M×N×K with A M×K, B K×N, D M×N) through regen.Client on
    each transport (the lane's ring, io.regen.Lane, and Varlink), and the
    same call on a raw connection (the client's own overhead), with regend's
    own elapsed_us for the compute part;
  - program Runs (io.regen.Program.Run) through regen.Client on each
    transport: a one-node program of 2 bindings and one of 142 bindings
    and scalars (a ring record and two continuations), each Run's wall
    time, the client's CPU time per blocking Run (its thread's, waits and
    spins included) and per Run queued without waiting (encoding and
    sending only).
"""

import argparse
import os
import statistics
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from _harness import Connection, Daemon, markdown_table, regen, summary, time_calls, write_json  # noqa: E402
from regen.host import HostTensor  # noqa: E402

SHAPES = [(16, 16, 16), (64, 64, 64), (128, 128, 128)]
# Pairs of the wide program: 2 * WIDE_PAIRS + 2 bound tensors.
WIDE_PAIRS = 70


def row(name, samples, extra=""):
    s = summary(samples)
    total = sum(samples)
    rate = len(samples) / total if total else float("inf")
    return s, [name, f"{rate:,.0f}", f"{s['p50_us']:.1f}", f"{s['p99_us']:.1f}", f"{s['min_us']:.1f}", extra]


def small_program():
    p = regen.ProgramBuilder("neg")
    p.input("x", "f32", (16,))
    p.output("y", "f32", (16,))
    p.node("neg", ["x"], ["y"])
    return p.definition()


def wide_program():
    p = regen.ProgramBuilder("wide")
    a, b = p.scalar("a"), p.scalar("b")
    for i in range(WIDE_PAIRS):
        x, y = p.input(f"x{i}", "f32", (16,)), p.output(f"y{i}", "f32", (16,))
        t = p.intermediate(f"t{i}", "f32", (16,))
        p.node("mul", [x, a], [t])
        p.node("add", [t, b], [y])
    return p.definition()


def program_runs(c, device, iters, warmup, rounds=5):
    """Per-Run costs on each transport: (rows, results). The transports take
    turns, round by round (a machine shared with other work moves between
    rounds more than between transports); each figure is the median of its
    rounds."""
    rows, out = [], []
    x, y = HostTensor.random([WIDE_PAIRS * 16]), HostTensor([WIDE_PAIRS * 16])
    xb, yb = x.import_into(c, device), y.import_into(c, device)
    cases = [("1 node, 2 bindings", small_program(), {"x": (xb, 0), "y": (yb, 0)}, None),
             (f"{2 * WIDE_PAIRS} nodes, {2 * WIDE_PAIRS + 2} bindings and scalars", wide_program(),
              dict([(f"x{i}", (xb, 64 * i)) for i in range(WIDE_PAIRS)] +
                   [(f"y{i}", (yb, 64 * i)) for i in range(WIDE_PAIRS)]), {"a": 1.5, "b": -0.5})]
    per_round = max(10, iters // rounds)
    for name, definition, bind, scalars in cases:
        prog = c.define_program(device, definition)
        got = {tr: {"wall": [], "cpu_blocking": [], "cpu_queued": [], "server": []} for tr in ("ring", "varlink")}
        # Queued without waiting: as many as fit the ring (its 256 records).
        batch = 64 if len(bind) < 60 else 16
        for r in range(rounds):
            for tr in ("ring", "varlink"):
                g = got[tr]
                c.set_transport(tr)
                for _ in range(warmup if r == 0 else 2):
                    c.run_program(prog, bind, scalars)
                assert c.lane_transport(device) == tr

                def run():
                    g["server"].append(c.run_program(prog, bind, scalars)["elapsed_us"])

                # The client's CPU per blocking Run: its thread's time, the
                # waits' spins included.
                cpu0 = time.thread_time()
                g["wall"] += time_calls(run, per_round, 0)
                g["cpu_blocking"].append((time.thread_time() - cpu0) / per_round)
                queued = 0.0
                for _ in range(max(1, per_round // batch)):
                    cpu0 = time.thread_time()
                    for _ in range(batch):
                        c.run_program(prog, bind, scalars, wait=False)
                    queued += time.thread_time() - cpu0
                    c.wait(device)
                g["cpu_queued"].append(queued / (max(1, per_round // batch) * batch))
        entry = {"program": name, "rounds": rounds, "runs_per_round": per_round}
        for tr, g in got.items():
            s, row_ = row(f"Run, {name} ({tr})", g["wall"])
            cpu_b = statistics.median(g["cpu_blocking"]) * 1e6
            cpu_q = statistics.median(g["cpu_queued"]) * 1e6
            srv = statistics.median(g["server"])
            row_[-1] = f"client CPU {cpu_b:.1f} us/Run blocking, {cpu_q:.1f} us/Run queued; regend {srv:.0f} us"
            rows.append(row_)
            entry[tr] = {"wall": s, "client_cpu_us_blocking": cpu_b, "client_cpu_us_queued": cpu_q,
                         "client_cpu_us_blocking_rounds": [v * 1e6 for v in g["cpu_blocking"]],
                         "client_cpu_us_queued_rounds": [v * 1e6 for v in g["cpu_queued"]],
                         "server_elapsed_us_median": srv}
        c.drop_program(prog)
        out.append(entry)
    c.close_buffer(xb)
    c.close_buffer(yb)
    x.close()
    y.close()
    return rows, out


def main():
    ap = argparse.ArgumentParser(description="regend host-backend latency benchmark")
    ap.add_argument("--regend", help="regend to start (default $REGEND, $REGEN_BUILD_ROOT/daemon/regend, build/daemon/regend)")
    ap.add_argument("--socket", help="use this running regend instead of starting one")
    ap.add_argument("--iters", type=int, default=2000)
    ap.add_argument("--warmup", type=int, default=100)
    ap.add_argument("--device", type=int, default=0)
    ap.add_argument("--json", help="write the results here")
    args = ap.parse_args()

    daemon = Daemon(args.socket, args.regend, "host")
    results = {"backend": "host", "iters": args.iters, "calls": {}, "gemm": [], "programs": []}
    rows = []
    try:
        c = regen.Client(daemon.socket, timeout=60)
        info = c.device_info(args.device)
        worker = info["worker_socket"]

        for name, path, method in (("Generation (main socket)", daemon.socket, "io.regen.Device.Generation"),
                                   ("GetInfo (main socket)", daemon.socket, "org.varlink.service.GetInfo"),
                                   ("GetInfo (worker socket)", worker, "org.varlink.service.GetInfo")):
            conn = Connection(path)
            samples = time_calls(lambda: conn.call(method), args.iters, args.warmup)
            conn.close()
            s, r = row(name, samples)
            results["calls"][name] = s
            rows.append(r)

        gemm_iters = max(50, args.iters // 4)
        for m, n, k in SHAPES:
            a, b, d = HostTensor.random([m, k]), HostTensor.random([k, n]), HostTensor([m, n])
            for t in (a, b, d):
                t.import_into(c, args.device)
            entry = {"m": m, "n": n, "k": k}
            for tr in ("ring", "varlink"):
                server = []
                c.set_transport(tr)

                def via_client():
                    server.append(c.gemm(a.op, b.op, d.op))

                samples = time_calls(via_client, gemm_iters, args.warmup // 4)
                srv = sorted(server[-gemm_iters:])[len(server[-gemm_iters:]) // 2]
                s, r = row(f"GEMM {m}x{n}x{k} f32 (Client, {tr})", samples, f"regend {srv} us")
                rows.append(r)
                entry[f"client_{tr}"] = s
                entry[f"server_elapsed_us_median_{tr}"] = srv

            conn = Connection(worker)
            params = {"a": a.op.to_wire(), "b": b.op.to_wire(), "d": d.op.to_wire()}
            samples = time_calls(lambda: conn.call("io.regen.Compute.Gemm", params), gemm_iters, args.warmup // 4)
            conn.close()
            s, r = row(f"GEMM {m}x{n}x{k} f32 (raw Varlink)", samples)
            rows.append(r)
            entry["raw"] = s
            results["gemm"].append(entry)
            for t in (a, b, d):
                c.close_buffer(t.buffer)
                t.close()
        program_rows, results["programs"] = program_runs(c, args.device, gemm_iters, args.warmup // 4)
        rows += program_rows
        c.close()
    finally:
        daemon.close()

    print(f"regend host backend, device {args.device}, {args.iters} calls per control-plane row "
          f"({max(50, args.iters // 4)} per GEMM and Run row); wall time of one blocking call\n")
    print(markdown_table(["call", "calls/s", "p50 us", "p99 us", "min us", "note"], rows))
    write_json(args.json, results)
    return 0


if __name__ == "__main__":
    sys.exit(main())
