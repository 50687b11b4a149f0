#!/usr/bin/env python3
# SPDX-License-Identifier: Apache-2.0
"""LayerNorm through regend (CUDA backend: kernels/layernorm.cu) against
torch's own (F.layer_norm and aten.native_layer_norm_backward), forward and
backward, in the same process on the same tensors.

    python3 tests/bench/bench_layernorm.py [path/to/regend] [--socket PATH] [--iters 50]
                                           [--dtype bf16|f16|f32] [--json out.json]

Shapes: x [rows, n] with weight and bias [n]; the backward writes d_x,
d_weight and d_bias (with d_residual added to d_x, as
regen.torch.transformer_block calls it).

Timing: pipelined, --iters calls queued on one lane (Client.layer_norm and
layer_norm_backward with wait=False, then one wait) against --iters torch
launches and one synchronize; each the fastest of --repeat batches after
two untimed calls. Bandwidth: the bytes each pass must move (forward: x
read, y written; backward: d_y, x, d_residual read, d_x written), over the
time. The ratio is regend's time over torch's inverted: 1.0 = as fast.
Exit 77 without torch or a GPU.
"""

import argparse
import os
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from _harness import Daemon, markdown_table, regen, require_torch, write_json  # noqa: E402

SHAPES = [(2048, 2048), (8192, 2048), (8192, 4096), (16384, 1024), (4096, 8192)]


def batch_seconds(run, sync, iters, repeat):
    run()
    run()
    sync()
    best = float("inf")
    for _ in range(repeat):
        t = time.perf_counter()
        for _ in range(iters):
            run()
        sync()
        best = min(best, time.perf_counter() - t)
    return best / iters


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("regend", nargs="?")
    p.add_argument("--socket")
    p.add_argument("--iters", type=int, default=50)
    p.add_argument("--repeat", type=int, default=3)
    p.add_argument("--dtype", choices=("bf16", "f16", "f32"), default="bf16")
    p.add_argument("--json")
    args = p.parse_args()
    torch = require_torch()
    if not torch.cuda.is_available():
        print("SKIP: no CUDA device")
        return 77
    dt = {"bf16": torch.bfloat16, "f16": torch.float16, "f32": torch.float32}[args.dtype]
    F = torch.nn.functional
    daemon = Daemon(args.socket, args.regend, "cuda")
    rows_out, results = [], []
    try:
        c = regen.Client(daemon.socket, timeout=300)
        dev = torch.device("cuda", 0)
        for rows, n in SHAPES:
            g = torch.Generator(device=dev).manual_seed(rows * 131 + n)
            x = torch.randn(rows, n, device=dev, dtype=dt, generator=g)
            w = torch.randn(n, device=dev, dtype=dt, generator=g)
            b = torch.randn(n, device=dev, dtype=dt, generator=g)
            y, d_x = torch.empty_like(x), torch.empty_like(x)
            d_y, res = torch.randn(rows, n, device=dev, dtype=dt, generator=g), torch.randn_like(x)
            mean = torch.empty(rows, device=dev, dtype=torch.float32)
            rstd = torch.empty(rows, device=dev, dtype=torch.float32)
            d_w, d_b = torch.empty_like(w), torch.empty_like(b)
            tensors = {t: c.import_tensor(t) for t in (x, w, b, y, d_x, d_y, res, mean, rstd, d_w, d_b)}
            ops = {id(t): regen.Operand(buf.id, 0, {torch.bfloat16: "bf16", torch.float16: "f16",
                                                    torch.float32: "f32"}[t.dtype], list(t.shape))
                   for t, buf in tensors.items()}
            o = lambda t: ops[id(t)]  # noqa: E731
            torch.cuda.synchronize()

            # The results agree with torch's before anything is timed.
            c.layer_norm(o(x), o(w), o(y), bias=o(b), mean=o(mean), rstd=o(rstd))
            ref = F.layer_norm(x.float(), [n], w.float(), b.float())
            err = ((y.float() - ref).norm() / ref.norm()).item()
            c.layer_norm_backward(o(d_y), o(x), o(w), o(mean), o(rstd), o(d_x), d_weight=o(d_w), d_bias=o(d_b),
                                  d_residual=o(res))
            tm, trs = torch.ops.aten.native_layer_norm(x, [n], w, b, 1e-5)[1:]
            tdx, tdw, tdb = torch.ops.aten.native_layer_norm_backward(d_y, x, [n], tm, trs, w, b,
                                                                      [True, True, True])
            err = max(err, *(((got.float() - want.float()).norm() / want.float().norm()).item()
                             for got, want in ((d_x, tdx + res), (d_w, tdw), (d_b, tdb))))

            def regend_fwd():
                c.layer_norm(o(x), o(w), o(y), bias=o(b), mean=o(mean), rstd=o(rstd), wait=False)

            def regend_bwd():
                c.layer_norm_backward(o(d_y), o(x), o(w), o(mean), o(rstd), o(d_x), d_weight=o(d_w),
                                      d_bias=o(d_b), d_residual=o(res), wait=False)

            def torch_fwd():
                torch.ops.aten.native_layer_norm(x, [n], w, b, 1e-5)

            def torch_bwd():
                dx, _, _ = torch.ops.aten.native_layer_norm_backward(d_y, x, [n], tm, trs, w, b, [True, True, True])
                dx.add_(res)

            regend_sync = lambda: c.wait(0)  # noqa: E731
            times = {
                "regend forward": batch_seconds(regend_fwd, regend_sync, args.iters, args.repeat),
                "torch forward": batch_seconds(torch_fwd, torch.cuda.synchronize, args.iters, args.repeat),
                "regend backward": batch_seconds(regend_bwd, regend_sync, args.iters, args.repeat),
                "torch backward": batch_seconds(torch_bwd, torch.cuda.synchronize, args.iters, args.repeat),
            }
            size = x.element_size() * rows * n
            moved = {"forward": 2 * size, "backward": 4 * size}
            for pass_ in ("forward", "backward"):
                r, t = times[f"regend {pass_}"], times[f"torch {pass_}"]
                rows_out.append([f"{rows}x{n}", pass_, f"{r * 1e6:.1f}", f"{t * 1e6:.1f}",
                                 f"{moved[pass_] / r / 1e9:.0f}", f"{moved[pass_] / t / 1e9:.0f}", f"{t / r:.3f}",
                                 f"{err:.1e}"])
                results.append({"rows": rows, "n": n, "pass": pass_, "regend_s": r, "torch_s": t, "rel_err": err})
            for t in tensors:
                c.close_tensor(t)
        print(f"LayerNorm, {args.dtype}, {torch.cuda.get_device_name(0)}; pipelined batches of {args.iters}")
        print(markdown_table(["rows x n", "pass", "regend µs", "torch µs", "regend GB/s", "torch GB/s",
                              "regend / torch speed", "rel error vs torch"], rows_out))
        write_json(args.json, {"dtype": args.dtype, "results": results})
    finally:
        daemon.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
