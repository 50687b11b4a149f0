#!/usr/bin/env python3
# SPDX-License-Identifier: Apache-2.0
"""Attention through regend (CUDA backend: cuDNN's fused attention) against
torch's scaled_dot_product_attention with each of its backends (flash,
cuDNN, memory-efficient), forward and backward, in the same process on the
same bf16 tensors.

    python3 tests/bench/bench_attention.py [path/to/regend] [--socket PATH] [--iters 20]
                                           [--warmup 5] [--json out.json] [--shapes NAME,...]
                                           [--autotune N]

--autotune N starts regend with REGEN_ATTENTION_AUTOTUNE=N: each problem's
first call (a warm-up one) builds the first N engine configurations cuDNN
offers (its heuristics' ranking, then a sweep of the engines' knobs) and
runs each timed on the call's operands; the next call switches to the
fastest. regend's line for each problem ("attention autotune, ...: [i]
engine E knobs ... ms") is printed at the end. Without it regend runs the heuristics' first, as torch's cuDNN
backend does.

Shapes: q [B, H, S, D], k and v [B, Hkv, S, D], BHSD, Sq = Skv = S.

Timing: pipelined, as a rank that chains on events sees throughput, in
batches of at least --iters calls and at least --min-time seconds of work
(so that filling and draining the pipeline, one round trip, is a small part
of a short kernel's batch), after --warmup untimed calls (which also build
regend's plan):
  regend  the batch's calls on one worker connection (one lane), at most
          --window in flight: send that many, then one more per reply;
          seconds per call = first send to last reply / calls;
  torch   the batch's launches on the current stream, then one synchronize;
          the backward is torch.autograd.grad of one forward's output
          (retain_graph), the backward kernels alone.
--repeat rounds per shape, regend and torch taking turns; each keeps its
fastest batch.
FLOPs: forward 4 B H Sq Skv D (halved when causal), backward 2.5 times
that (five matmuls against two). The ratio is regend's TFLOP/s over the
best torch backend's for the same pass (1.0 = as fast).
"""

import argparse
import math
import os
import sys
import time
import warnings

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from _harness import Connection, Daemon, markdown_table, regen, write_json  # noqa: E402

# name, B, H, Hkv, S, D, causal
SHAPES = [
    ("B4 H32 S4096 D128 causal", 4, 32, 32, 4096, 128, True),
    ("B4 H32 S4096 D128", 4, 32, 32, 4096, 128, False),
    ("B16 H16 S1024 D64", 16, 16, 16, 1024, 64, False),
    ("B16 H16 S1024 D64 causal", 16, 16, 16, 1024, 64, True),
    ("B2 H32/KV8 S8192 D128 causal", 2, 32, 8, 8192, 128, True),
    ("B2 H32/KV8 S8192 D128", 2, 32, 8, 8192, 128, False),
]


def main():
    ap = argparse.ArgumentParser(description="regend (cuDNN) vs torch SDPA attention benchmark (needs a GPU)")
    ap.add_argument("regend", nargs="?",
                    help="regend to start (default $REGEND, $REGEN_BUILD_ROOT/daemon/regend, build/daemon/regend)")
    ap.add_argument("--socket", help="use this running regend instead of starting one")
    ap.add_argument("--iters", type=int, default=20)
    ap.add_argument("--warmup", type=int, default=5)
    ap.add_argument("--min-time", type=float, default=0.2, help="seconds of work a timed batch lasts at least")
    ap.add_argument("--window", type=int, default=64, help="regend calls in flight at most")
    ap.add_argument("--repeat", type=int, default=3, help="rounds per shape (the best of each kept)")
    ap.add_argument("--device", type=int, default=0)
    ap.add_argument("--shapes", help="comma-separated prefixes of shape names to run (default: all)")
    ap.add_argument("--json", help="write the results here")
    ap.add_argument("--autotune", type=int, default=0,
                    help="REGEN_ATTENTION_AUTOTUNE for the regend started here: engine configurations timed per "
                         "problem (0: the heuristics' first)")
    args = ap.parse_args()
    if args.autotune:
        if args.socket:
            print("--autotune needs the regend this script starts (the running one's environment is its own)")
            return 2
        os.environ["REGEN_ATTENTION_AUTOTUNE"] = str(args.autotune)

    conf = os.environ.get("PYTORCH_CUDA_ALLOC_CONF", "")
    if "expandable_segments:True" in conf:
        os.environ["PYTORCH_CUDA_ALLOC_CONF"] = conf.replace("expandable_segments:True", "expandable_segments:False")
    try:
        import torch
        from torch.nn.attention import SDPBackend, sdpa_kernel
    except ImportError:
        print("SKIP: torch (with torch.nn.attention) is not importable")
        return 77
    if not torch.cuda.is_available():
        print("SKIP: torch sees no CUDA device")
        return 77
    sdpa = torch.nn.functional.scaled_dot_product_attention
    # A backend refusing a shape (grouped-query heads, say) warns before it
    # raises; the refusal is recorded below.
    warnings.filterwarnings("ignore", category=UserWarning)
    backends = [("flash", SDPBackend.FLASH_ATTENTION), ("cudnn", SDPBackend.CUDNN_ATTENTION),
                ("efficient", SDPBackend.EFFICIENT_ATTENTION)]

    shapes = SHAPES
    if args.shapes:
        want = [w.strip() for w in args.shapes.split(",") if w.strip()]
        shapes = [s for s in SHAPES if any(s[0].startswith(w) for w in want)]

    dev = f"cuda:{args.device}"
    torch.cuda.set_device(args.device)
    daemon = Daemon(args.socket, args.regend, "cuda")
    out = {"device": torch.cuda.get_device_name(args.device), "torch": torch.__version__, "cuda": torch.version.cuda,
           "cudnn": torch.backends.cudnn.version(), "iters": args.iters, "warmup": args.warmup,
           "min_time_s": args.min_time, "window": args.window, "repeat": args.repeat, "dtype": "bf16",
           "layout": "BHSD", "autotune": args.autotune, "attention": []}
    rows = []
    try:
        c = regen.Client(daemon.socket, timeout=600)
        info = c.device_info(args.device)
        out["regend_backend"] = info["backend"]
        g = torch.Generator(device=dev).manual_seed(int.from_bytes(os.urandom(4), "little"))

        def randn(shape):
            return torch.randn(shape, device=dev, generator=g, dtype=torch.float32).to(torch.bfloat16)

        def keep(entry, key, sec, n):
            if key not in entry["seconds"] or sec < entry["seconds"][key]:
                entry["seconds"][key] = sec
                entry["calls"][key] = n

        def batch(seconds_per_call):
            return max(args.iters, math.ceil(args.min_time / seconds_per_call))

        def torch_batch(fn, n):
            torch.cuda.synchronize()
            t0 = time.perf_counter()
            for _ in range(n):
                fn()
            torch.cuda.synchronize()
            return (time.perf_counter() - t0) / n

        def pipelined_torch(fn):
            for _ in range(args.warmup):
                fn()
            est = torch_batch(fn, args.iters)
            n = batch(est)
            return (torch_batch(fn, n) if n > args.iters else est), n

        def regend_batch(conn, method, params, n):
            window = min(args.window, n)
            t0 = time.perf_counter()
            for _ in range(window):
                conn.send(method, params)
            sent = window
            for _ in range(n):
                conn.receive()
                if sent < n:
                    conn.send(method, params)
                    sent += 1
            return (time.perf_counter() - t0) / n

        def pipelined_regend(method, params):
            conn = Connection(info["worker_socket"])
            try:
                for _ in range(args.warmup):
                    conn.call(method, params)
                est = regend_batch(conn, method, params, args.iters)
                n = batch(est)
                return (regend_batch(conn, method, params, n) if n > args.iters else est), n
            finally:
                conn.close()

        for label, b, h, hkv, s, d, causal in shapes:
            q, k, v, d_o = randn([b, h, s, d]), randn([b, hkv, s, d]), randn([b, hkv, s, d]), randn([b, h, s, d])
            o = torch.empty_like(q)
            stats = torch.empty([b, h, s], device=dev, dtype=torch.float32)
            dq, dk, dv = torch.empty_like(q), torch.empty_like(k), torch.empty_like(v)
            ops = {}
            for name, t in (("q", q), ("k", k), ("v", v), ("o", o), ("stats", stats), ("d_o", d_o), ("d_q", dq),
                            ("d_k", dk), ("d_v", dv)):
                buf = c.import_tensor(t)
                dtype = "f32" if t.dtype == torch.float32 else "bf16"
                ops[name] = regen.Operand(buf.id, t.storage_offset() * t.element_size(), dtype, list(t.shape),
                                          list(t.stride())).to_wire()
            scalars = {"causal": causal}
            fwd = {n: ops[n] for n in ("q", "k", "v", "o", "stats")}
            fwd.update(scalars)
            bwd = {n: ops[n] for n in ("q", "k", "v", "o", "d_o", "stats", "d_q", "d_k", "d_v")}
            bwd.update(scalars)
            torch.cuda.synchronize()

            flops_f = 4.0 * b * h * s * s * d * (0.5 if causal else 1.0)
            flops_b = 2.5 * flops_f
            entry = {"shape": label, "b": b, "h": h, "h_kv": hkv, "s": s, "d": d, "causal": causal,
                     "flops_forward": flops_f, "flops_backward": flops_b, "seconds": {}, "tflops": {}, "errors": {},
                     "calls": {}}
            # --repeat rounds, regend and torch alternating; the best of each.
            for _ in range(args.repeat):
                try:
                    for pas, method, params in (("forward", "io.regen.Compute.Attention", fwd),
                                                ("backward", "io.regen.Compute.AttentionBackward", bwd)):
                        keep(entry, f"regend_{pas}", *pipelined_regend(method, params))
                except regen.Error as e:
                    entry["errors"]["regend"] = f"{type(e).__name__}: {e}"
                # The same answer as torch (cuDNN through torch).
                torch.cuda.synchronize()
                for bname, backend in backends:
                    # Grouped-query heads natively (enable_gqa) where the backend
                    # takes them, else k and v expanded to H heads, as a model
                    # would have to: the same FLOPs either way.
                    for gqa_native in ((True, False) if hkv != h else (False,)):
                        try:
                            kk, vv = (k, v) if gqa_native or hkv == h else (
                                k.repeat_interleave(h // hkv, dim=1), v.repeat_interleave(h // hkv, dim=1))
                            with sdpa_kernel(backend):
                                qr, kr, vr = (t.detach().requires_grad_(True) for t in (q, kk, vv))
                                ref = sdpa(qr, kr, vr, is_causal=causal, enable_gqa=gqa_native)
                                if bname == "cudnn":
                                    entry["rel_diff_vs_torch_cudnn"] = ((o.double() - ref.double()).norm()
                                                                        / ref.double().norm()).item()
                                keep(entry, f"{bname}_forward", *pipelined_torch(
                                    lambda: sdpa(q, kk, vv, is_causal=causal, enable_gqa=gqa_native)))
                                keep(entry, f"{bname}_backward", *pipelined_torch(
                                    lambda: torch.autograd.grad(ref, (qr, kr, vr), d_o, retain_graph=True)))
                                del ref, qr, kr, vr
                            how = "native" if gqa_native or hkv == h else "expanded"
                            entry.setdefault("torch_gqa", {})[bname] = how
                            entry["errors"].pop(bname, None)
                            break
                        except Exception as e:   # a backend that does not take the shape
                            entry["errors"][bname] = f"{type(e).__name__}: {str(e).splitlines()[0][:120]}"
                        finally:
                            kk = vv = None
            for key, sec in entry["seconds"].items():
                entry["tflops"][key] = (flops_b if key.endswith("backward") else flops_f) / sec / 1e12
            for pas in ("forward", "backward"):
                torch_best = max((entry["tflops"].get(f"{bn}_{pas}", 0.0) for bn, _ in backends), default=0.0)
                mine = entry["tflops"].get(f"regend_{pas}")
                entry[f"ratio_{pas}"] = mine / torch_best if mine and torch_best else None
                cells = [label, pas, f"{mine:.0f}" if mine else "n/a"]
                for bn, _ in backends:
                    tf = entry["tflops"].get(f"{bn}_{pas}")
                    cells.append(f"{tf:.0f}" if tf else "n/a")
                ratio = entry[f"ratio_{pas}"]
                cells.append(f"{ratio:.3f}" if ratio else "n/a")
                cells.append(f"{entry['seconds'].get(f'regend_{pas}', 0) * 1e3:.2f}")
                cells.append(str(entry["calls"].get(f"regend_{pas}", "")))
                rows.append(cells)
            out["attention"].append(entry)
            for t in (q, k, v, o, stats, d_o, dq, dk, dv):
                c.close_tensor(t)
            del q, k, v, o, stats, d_o, dq, dk, dv
            torch.cuda.empty_cache()
        c.close()
    finally:
        tuned = []
        if args.autotune and daemon.owned:
            with open(daemon.owned.log_path, errors="replace") as f:
                tuned = [line.rstrip() for line in f if "attention autotune" in line]
        daemon.close()
    out["autotune_log"] = tuned

    print(f"{out['device']}, torch {out['torch']} (CUDA {out['cuda']}, cuDNN {out['cudnn']}), regend backend "
          f"{out.get('regend_backend')}; bf16 BHSD; pipelined batches of >= {args.iters} calls and >= "
          f"{args.min_time} s after {args.warmup} warm-up, regend <= {args.window} in flight; best of "
          f"{args.repeat} rounds{f'; autotune {args.autotune}' if args.autotune else ''}\n")
    print(markdown_table(["shape", "pass", "regend TFLOP/s", "torch flash", "torch cudnn", "torch efficient",
                          "regend / best torch", "regend ms/call", "calls"], rows))
    for e in out["attention"]:
        for who, msg in e["errors"].items():
            print(f"  {e['shape']}: {who}: {msg}")
        expanded = [b for b, how in e.get("torch_gqa", {}).items() if how == "expanded"]
        if expanded:
            print(f"  {e['shape']}: torch {', '.join(expanded)} with k and v expanded to H heads "
                  f"(no native grouped-query heads for this input)")
        if "rel_diff_vs_torch_cudnn" in e:
            print(f"  {e['shape']}: o vs torch cudnn rel diff {e['rel_diff_vs_torch_cudnn']:.1e}")
    for line in tuned:
        print(f"  {line}")
    write_json(args.json, out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
