#!/usr/bin/env python3
# SPDX-License-Identifier: Apache-2.0
"""The rank's host time per regen.torch call inside a run of calls (a
batch's later calls, queued on regend's lane without waiting), against the
host time of launching the same GEMM in process (F.linear with its bias).

    python3 tests/bench/bench_torch_calls.py [path/to/regend] [--socket PATH] [--device cuda|cpu]
                                             [--calls 99] [--repeat 200] [--json out.json]

A run is one `with runtime.batch():` of 1 + --calls linear-layer GEMMs
(x [64, 64] @ w.T + bias, bf16 on CUDA, f32 on the CPU) into fresh outputs
from regen.torch.pool() (CUDA) or libregen's host pool (CPU); the time is
that of the --calls chained ones, without the run's first call (ordered
after the rank's stream, answered) and its end (the answers collected).
Reported: the fastest run's time per call of each path, "encoded" (the
default where the lane is on the ring: each call handed to libregen's ring
straight from the tensors, which regen._accel reads, and again with its
operands resolved in Python, Client.queue_encoded) and "client" (the same
calls through the client's gemm method, as on Varlink), and on CUDA F.linear's launch time in the same process and
the ratio.  --device cpu runs regend's host backend: the Python costs are
real, the in-process comparison is left out (a CPU F.linear computes).
Exit 77 without torch, or on --device cuda without a GPU.
"""

import argparse
import os
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from _harness import Daemon, markdown_table, write_json  # noqa: E402


def best_per_call(run, calls, repeat):
    best = float("inf")
    for _ in range(repeat):
        best = min(best, run())
    return best / calls


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("regend", nargs="?")
    p.add_argument("--socket")
    p.add_argument("--device", choices=("cuda", "cpu"), default="cuda")
    p.add_argument("--calls", type=int, default=99)
    p.add_argument("--repeat", type=int, default=200)
    p.add_argument("--json")
    args = p.parse_args()
    try:
        import torch
    except ImportError:
        print("SKIP: torch is not importable")
        return 77
    if args.device == "cuda" and not torch.cuda.is_available():
        print("SKIP: no CUDA device")
        return 77
    import contextlib

    import regen.torch as rt
    from regen.torch._ops import _gemm
    from regen.torch._runtime import host_empty

    daemon = Daemon(args.socket, args.regend, "cuda" if args.device == "cuda" else "host")
    try:
        rt.configure(socket=daemon.socket, ordering="wait")
        runtime = rt.runtime()
        cuda = args.device == "cuda"
        dtype = torch.bfloat16 if cuda else torch.float32
        scope = rt.pool(0) if cuda else contextlib.nullcontext()
        with scope:
            def fresh(*shape):
                if cuda:
                    return torch.randn(*shape, device="cuda").to(dtype)
                t = host_empty(shape, dtype)
                t.copy_(torch.randn(*shape))
                return t
            x, w, bias = fresh(64, 64), fresh(64, 64), fresh(64)
            outs = [fresh(64, 64) for _ in range(args.calls + 1)]
            if cuda:
                torch.cuda.synchronize()

            def run_regend():
                with runtime.batch():
                    _gemm(x, w.t(), outs[0], "bias", bias)
                    t = time.perf_counter()
                    for out in outs[1:]:
                        _gemm(x, w.t(), out, "bias", bias)
                    elapsed = time.perf_counter() - t
                return elapsed

            from regen import accel
            # The module (regen.torch's attribute of that name is the runtime).
            runtime_module = sys.modules["regen.torch._runtime"]
            rows = []
            results = {}
            accel_before = runtime.counters["accel_calls"]
            encoded = best_per_call(run_regend, args.calls, args.repeat)
            accel_share = (runtime.counters["accel_calls"] - accel_before) / (args.calls * args.repeat)
            # The same calls with their operands resolved in Python
            # (Client.queue_encoded: what a call whose tensors regen._accel
            # does not cover takes).
            loaded = accel.ring()
            reads, runtime_module.queue_tensors = runtime_module.queue_tensors, lambda *a, **k: None
            encoded_py = best_per_call(run_regend, args.calls, args.repeat) if loaded is not None else encoded
            runtime_module.queue_tensors = reads
            before = runtime.counters["chained_calls"]
            # The client's path: the encoder declines every call.
            runtime._queue_chained = lambda op, tensors, scalars: False
            client = best_per_call(run_regend, args.calls, args.repeat)
            del runtime._queue_chained
            if runtime.client.lane_transport(runtime.regend_device(x.device)) != "ring":
                print("note: the lane is on Varlink; both paths are the client's")
            results["encoded_us"], results["client_us"] = encoded * 1e6, client * 1e6
            results["encoded_python_us"], results["accel_share"] = encoded_py * 1e6, accel_share
            rows.append(("regen.torch, onto the ring" + (" (regen._accel reads the tensors)" if loaded is not None
                                                          else ""), f"{encoded * 1e6:.1f}", ""))
            if loaded is not None:
                rows.append(("regen.torch, onto the ring (operands resolved in Python)", f"{encoded_py * 1e6:.1f}", ""))
            rows.append(("regen.torch, through the client's gemm", f"{client * 1e6:.1f}", ""))
            if cuda:
                import torch.nn.functional as F

                def run_torch():
                    t = time.perf_counter()
                    for _ in range(args.calls):
                        F.linear(x, w, bias)
                    elapsed = time.perf_counter() - t
                    torch.cuda.synchronize()
                    return elapsed
                local = best_per_call(run_torch, args.calls, args.repeat)
                results["in_process_us"] = local * 1e6
                results["ratio_encoded"] = local / encoded
                rows.append(("F.linear in process (launch)", f"{local * 1e6:.1f}", ""))
                for i, us in enumerate([encoded] + ([encoded_py] if loaded is not None else []) + [client]):
                    rows[i] = rows[i][:2] + (f"{local / us:.2f}",)
            print(markdown_table(["path", "host µs per call", "in process / it"], rows))
            print(f"chained calls counted: {runtime.counters['chained_calls'] - before} of "
                  f"{args.calls * args.repeat} in the client's runs; regen._accel "
                  f"{'read ' + format(accel_share, '.0%') + ' of the first runs' if loaded else 'not loaded'}")
            if args.json:
                write_json(args.json, {"device": args.device, "calls": args.calls, **results})
    finally:
        daemon.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
