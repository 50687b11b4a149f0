#!/usr/bin/env python3
# SPDX-License-Identifier: Apache-2.0
"""GEMM through regend (CUDA backend) against torch.matmul in the same
process, on the same bf16 tensors.

    python3 tests/bench/bench_gemm.py [path/to/regend] [--socket PATH] [--iters 20]
                                      [--warmup 5] [--json out.json]

Shapes are M×N×K: A is M×K, B is K×N, D = A @ B is M×N, all bf16 (f32
accumulation), row-major.

Timing, median of --iters timed iterations after --warmup untimed ones:
  regend wall     perf_counter around Client.gemm: the reply means the GEMM
                  finished, so this is submit -> completion as a rank sees it
                  (includes the Varlink round trip and the client's sync of
                  its own idle stream);
  regend server   regend's own elapsed_us from the reply;
  torch events    cuda events around torch.matmul(out=...) + event sync;
  torch wall      perf_counter around torch.matmul + torch.cuda.synchronize()
                  (the same semantics as "regend wall").
Ratios are regend/torch in TFLOP/s (1.0 = as fast as torch; higher = faster).
Also: the added latency of a small GEMM (regend wall vs torch launch+sync),
and round trips of io.regen.Device.Generation / GetInfo on the main socket
vs GetInfo on the worker socket (the supervisor hop data-plane calls avoid).

Each regend measurement runs on both transports of the client: the lane's
ring (io.regen.Lane, shared memory) and Varlink; the tables show both, the
ring first. Pipelined calls are queued with Client.gemm(..., wait=False)
and waited for with Client.wait.
"""

import argparse
import os
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from _harness import (Connection, Daemon, markdown_table, regen, require_torch, summary, time_calls,  # noqa: E402
                      write_json)

SHAPES = [
    ("8192^3", 8192, 8192, 8192),
    ("4096^3", 4096, 4096, 4096),
    ("8192x4096x128", 8192, 4096, 128),
    ("128x4096x16384", 128, 4096, 16384),
    ("256^3", 256, 256, 256),
]
SMALL = (64, 64, 64)


STAGES = (("call -> worker took the record (the client's encoding and the doorbell)", 0, 1),
          ("took -> work handed to the GPU (launch)", 1, 2),
          ("handed -> found finished (GPU and completion wait)", 2, 3),
          ("found finished -> completion published", 3, 4),
          ("published -> the call returned (wake-up and the client's decoding)", 4, 5))


def ring_stages(c, call, iters, device):
    """p50/p99 of each stage of a ring call, from the worker's stage times
    (Client.last_timing) and the client's own clock around the call."""
    samples = [[] for _ in STAGES]
    for _ in range(iters):
        t0 = time.monotonic_ns()
        call()
        t5 = time.monotonic_ns()
        t = c.last_timing(device)
        if not t or not all(t.values()):
            continue
        at = (t0, t["taken_ns"], t["launched_ns"], t["finished_ns"], t["published_ns"], t5)
        for i, (_, lo, hi) in enumerate(STAGES):
            samples[i].append((at[hi] - at[lo]) / 1e9)
    return {name: summary(xs) for (name, _, _), xs in zip(STAGES, samples) if xs}


def client_split(torch, c, a, b, d, iters):
    """p50/p99 of the parts of one small Client.gemm(a, b, d) on torch
    tensors, each timed alone: where the Python client's own cost goes."""
    from regen.torch import _tensors as cl
    tensors = cl.imports_of(c)
    ops = [tensors.operand(t, n) for t, n in ((a, "a"), (b, "b"), (d, "d"))]
    stream = torch.cuda.current_stream(a.device)
    parts = (
        ("the three operands from torch tensors (TensorImports.operand)",
         lambda: [tensors.operand(t, n) for t, n in ((a, "a"), (b, "b"), (d, "d"))]),
        ("torch.cuda.current_stream(device)", lambda: torch.cuda.current_stream(a.device)),
        ("Stream.synchronize() of the idle current stream", stream.synchronize),
        ("the client's torch sync (_sync_torch)", lambda: cl._sync_torch([a, b, d])),
        ("Client.gemm on ready Operands (encoding, ring, wait, decoding)", lambda: c.gemm(*ops)),
        ("Client.gemm on the torch tensors (all of it)", lambda: c.gemm(a, b, d)),
    )
    return {name: summary(time_calls(fn, iters, 50)) for name, fn in parts}


def main():
    ap = argparse.ArgumentParser(description="regend vs torch.matmul GEMM benchmark (needs a GPU)")
    ap.add_argument("regend", nargs="?", help="regend to start (default $REGEND, $REGEN_BUILD_ROOT/daemon/regend, build/daemon/regend)")
    ap.add_argument("--socket", help="use this running regend instead of starting one")
    ap.add_argument("--iters", type=int, default=20)
    ap.add_argument("--warmup", type=int, default=5)
    ap.add_argument("--small-iters", type=int, default=500)
    ap.add_argument("--rtt-iters", type=int, default=2000)
    ap.add_argument("--device", type=int, default=0)
    ap.add_argument("--shapes", default=",".join(label for label, *_ in SHAPES),
                    help="the large shapes to run, by label, comma-separated ('none': only the small GEMM and the "
                         "round trips)")
    ap.add_argument("--json", help="write the results here")
    args = ap.parse_args()
    wanted = set() if args.shapes == "none" else set(args.shapes.split(","))
    unknown = wanted - {label for label, *_ in SHAPES}
    if unknown:
        ap.error(f"--shapes: no shape {', '.join(sorted(unknown))}")

    # Skips (77) without torch or a CUDA device; keeps memory shareable by CUDA IPC.
    torch = require_torch()

    dev = f"cuda:{args.device}"
    torch.cuda.set_device(args.device)
    daemon = Daemon(args.socket, args.regend, "cuda")
    out = {"device": torch.cuda.get_device_name(args.device), "torch": torch.__version__,
           "cuda": torch.version.cuda, "iters": args.iters, "warmup": args.warmup, "dtype": "bf16",
           "shape_convention": "MxNxK: A MxK, B KxN, D MxN", "gemm": [], "small": {}, "rtt": {}}
    try:
        c = regen.Client(daemon.socket, timeout=300)
        info = c.device_info(args.device)
        out["regend_backend"] = info["backend"]
        g = torch.Generator(device=dev).manual_seed(int.from_bytes(os.urandom(4), "little"))

        def torch_events(a, b, d2, n):
            ts = []
            for _ in range(n):
                s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
                s.record()
                torch.matmul(a, b, out=d2)
                e.record()
                e.synchronize()
                ts.append(s.elapsed_time(e) * 1e-3)
            return ts

        def torch_wall(a, b, d2):
            torch.matmul(a, b, out=d2)
            torch.cuda.synchronize()

        transports = ("ring", "varlink")
        rows, prow = [], []
        for label, m, n, k in (s for s in SHAPES if s[0] in wanted):
            a = torch.randn(m, k, device=dev, generator=g).to(torch.bfloat16)
            b = torch.randn(k, n, device=dev, generator=g).to(torch.bfloat16)
            d = torch.empty(m, n, device=dev, dtype=torch.bfloat16)
            d2 = torch.empty(m, n, device=dev, dtype=torch.bfloat16)
            for t in (a, b, d):
                c.import_tensor(t)
            torch.cuda.synchronize()
            # Pipelined: --iters calls queued back to back on the lane, then
            # waited for; against --iters torch launches and one synchronize.
            # How a rank that does not wait for each result (it chains on
            # events) sees throughput.
            for _ in range(args.warmup):
                torch.matmul(a, b, out=d2)
            torch.cuda.synchronize()
            t0 = time.perf_counter()
            for _ in range(args.iters):
                torch.matmul(a, b, out=d2)
            torch.cuda.synchronize()
            tpipe_s = (time.perf_counter() - t0) / args.iters
            flops = 2.0 * m * n * k
            tw = time_calls(lambda: torch_wall(a, b, d2), args.iters, args.warmup)
            te = torch_events(a, b, d2, args.iters)
            s_te, s_tw = summary(te), summary(tw)
            entry = {"shape": label, "m": m, "n": n, "k": k, "torch_events": s_te, "torch_wall": s_tw,
                     "pipelined_us": {"torch": tpipe_s * 1e6}, "transports": {}}
            for tr in transports:
                c.set_transport(tr)
                for _ in range(args.warmup):
                    c.gemm(a, b, d, wait=False)
                c.wait(args.device)
                if c.lane_transport(args.device) != tr:
                    raise SystemExit(f"device {args.device}'s lane does not use {tr}")
                t0 = time.perf_counter()
                for _ in range(args.iters):
                    c.gemm(a, b, d, wait=False)
                c.wait(args.device)
                pipe_s = (time.perf_counter() - t0) / args.iters
                server = []
                regend_call = lambda: server.append(c.gemm(a, b, d))  # noqa: E731
                rw = time_calls(regend_call, args.iters, args.warmup)
                srv = [x * 1e-6 for x in server[args.warmup:]]
                s_rw, s_srv = summary(rw), summary(srv)
                tf = {name: flops / (s["median_us"] * 1e-6) / 1e12
                      for name, s in (("regend_wall", s_rw), ("regend_server", s_srv), ("torch_events", s_te),
                                      ("torch_wall", s_tw))}
                e = {"regend_wall": s_rw, "regend_server": s_srv, "tflops": tf,
                     "ratio_wall_vs_torch_wall": tf["regend_wall"] / tf["torch_wall"],
                     "ratio_wall_vs_torch_events": tf["regend_wall"] / tf["torch_events"],
                     "ratio_server_vs_torch_events": tf["regend_server"] / tf["torch_events"],
                     "pipelined_us": pipe_s * 1e6, "tflops_pipelined": flops / pipe_s / 1e12,
                     "ratio_pipelined": tpipe_s / pipe_s}
                entry["transports"][tr] = e
                prow.append([label, tr, f"{flops / pipe_s / 1e12:.1f}", f"{flops / tpipe_s / 1e12:.1f}",
                             f"{tpipe_s / pipe_s:.3f}", f"{pipe_s * 1e6:.0f} / {tpipe_s * 1e6:.0f}"])
                rows.append([label, tr, f"{tf['regend_wall']:.1f}", f"{tf['regend_server']:.1f}",
                             f"{tf['torch_events']:.1f}", f"{tf['torch_wall']:.1f}",
                             f"{e['ratio_wall_vs_torch_wall']:.3f}", f"{e['ratio_wall_vs_torch_events']:.3f}",
                             f"{e['ratio_server_vs_torch_events']:.3f}",
                             f"{s_rw['median_us']:.0f} / {s_tw['median_us']:.0f}"])
            # Same answer as torch (both bf16 out of f32 accumulation).
            torch.cuda.synchronize()
            entry["rel_diff_vs_torch"] = ((d.double() - d2.double()).norm() / d2.double().norm()).item()
            out["gemm"].append(entry)
            for t in (a, b, d):
                c.close_tensor(t)
            del a, b, d, d2
            torch.cuda.empty_cache()

        # Small GEMM: what going through regend adds to submit -> completion.
        m, n, k = SMALL
        a = torch.randn(m, k, device=dev, generator=g).to(torch.bfloat16)
        b = torch.randn(k, n, device=dev, generator=g).to(torch.bfloat16)
        d = torch.empty(m, n, device=dev, dtype=torch.bfloat16)
        d2 = torch.empty(m, n, device=dev, dtype=torch.bfloat16)
        tw = summary(time_calls(lambda: torch_wall(a, b, d2), args.small_iters, 50))
        out["small"] = {"shape": f"{m}x{n}x{k}", "torch_launch_sync": tw, "transports": {}}
        for tr in transports:
            c.set_transport(tr)
            rw = summary(time_calls(lambda: c.gemm(a, b, d), args.small_iters, 50))
            out["small"]["transports"][tr] = {"regend_wall": rw, "added_p50_us": rw["p50_us"] - tw["p50_us"],
                                              "added_p99_us": rw["p99_us"] - tw["p99_us"]}
            if tr == "ring":
                out["small"]["ring_stages"] = ring_stages(c, lambda: c.gemm(a, b, d), args.small_iters, args.device)
                out["small"]["client_split"] = client_split(torch, c, a, b, d, args.small_iters)

        # Round trips: main socket (supervisor) vs worker socket.
        worker = info["worker_socket"]
        for name, path, method in (("Generation (main)", daemon.socket, "io.regen.Device.Generation"),
                                   ("GetInfo (main)", daemon.socket, "org.varlink.service.GetInfo"),
                                   ("GetInfo (worker)", worker, "org.varlink.service.GetInfo")):
            conn = Connection(path)
            out["rtt"][name] = summary(time_calls(lambda: conn.call(method), args.rtt_iters, 100))
            conn.close()
        c.close()
    finally:
        daemon.close()

    print(f"{out['device']}, torch {out['torch']} (CUDA {out['cuda']}), regend backend {out.get('regend_backend')}; "
          f"bf16, M×N×K (A M×K, B K×N); median of {args.iters} after {args.warmup} warm-up\n")
    print(markdown_table(["shape", "transport", "regend wall TFLOP/s", "regend server TFLOP/s", "torch events TFLOP/s",
                          "torch wall TFLOP/s", "ratio wall/wall", "ratio wall/events", "ratio server/events",
                          "median us regend/torch (wall)"], rows))
    print(f"\npipelined: {args.iters} calls queued back to back, then waited for (regend) / all launches, then one "
          "synchronize (torch)\n")
    print(markdown_table(["shape", "transport", "regend TFLOP/s", "torch TFLOP/s", "ratio regend/torch",
                          "us per GEMM regend / torch"], prow))
    sm = out["small"]
    print(f"\nsmall GEMM {sm['shape']} bf16, {args.small_iters} calls: submit -> completion, Python client\n")
    srows = []
    for tr, v in sm["transports"].items():
        srows.append([f"regend, {tr} (Client.gemm, wall)", f"{v['regend_wall']['p50_us']:.1f}",
                      f"{v['regend_wall']['p99_us']:.1f}", f"{v['regend_wall']['min_us']:.1f}",
                      f"{v['added_p50_us']:.1f}", f"{v['added_p99_us']:.1f}"])
    srows.append(["torch in-process launch + synchronize", f"{sm['torch_launch_sync']['p50_us']:.1f}",
                  f"{sm['torch_launch_sync']['p99_us']:.1f}", f"{sm['torch_launch_sync']['min_us']:.1f}", "", ""])
    print(markdown_table(["path", "p50 us", "p99 us", "min us", "added p50 us", "added p99 us"], srows))
    if sm.get("ring_stages"):
        print("\nthe same call over the ring, by stage (the worker's times, Client.last_timing)\n")
        print(markdown_table(["stage", "p50 us", "p99 us", "min us"],
                             [[k, f"{v['p50_us']:.1f}", f"{v['p99_us']:.1f}", f"{v['min_us']:.1f}"]
                              for k, v in sm["ring_stages"].items()]))
    if sm.get("client_split"):
        print("\nthe Python client's parts of that call, each timed alone (ring)\n")
        print(markdown_table(["part", "p50 us", "p99 us", "min us"],
                             [[k, f"{v['p50_us']:.1f}", f"{v['p99_us']:.1f}", f"{v['min_us']:.1f}"]
                              for k, v in sm["client_split"].items()]))
    print(f"\nround trips, {args.rtt_iters} calls each on a raw Varlink connection\n")
    print(markdown_table(["call", "p50 us", "p99 us", "min us"],
                         [[k, f"{v['p50_us']:.1f}", f"{v['p99_us']:.1f}", f"{v['min_us']:.1f}"]
                          for k, v in out["rtt"].items()]))
    write_json(args.json, out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
