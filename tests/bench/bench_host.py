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
    own elapsed_us for the compute part.
"""

import argparse
import os
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from _harness import Connection, Daemon, markdown_table, regen, summary, time_calls, write_json  # noqa: E402
from regen.host import HostTensor  # noqa: E402

SHAPES = [(16, 16, 16), (64, 64, 64), (128, 128, 128)]


def row(name, samples, extra=""):
    s = summary(samples)
    total = sum(samples)
    rate = len(samples) / total if total else float("inf")
    return s, [name, f"{rate:,.0f}", f"{s['p50_us']:.1f}", f"{s['p99_us']:.1f}", f"{s['min_us']:.1f}", extra]


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
    results = {"backend": "host", "iters": args.iters, "calls": {}, "gemm": []}
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
        c.close()
    finally:
        daemon.close()

    print(f"regend host backend, device {args.device}, {args.iters} calls per control-plane row "
          f"({max(50, args.iters // 4)} per GEMM row); wall time of one blocking call\n")
    print(markdown_table(["call", "calls/s", "p50 us", "p99 us", "min us", "note"], rows))
    write_json(args.json, results)
    return 0


if __name__ == "__main__":
    sys.exit(main())
