#!/usr/bin/env python3
# SPDX-License-Identifier: Apache-2.0
"""FP8 through regend against FP8 and bf16 in process, in the same run
(issue 34's targets, docs/performance.md):

    python3 tests/bench/bench_fp8.py [path/to/regend] [--socket PATH] [--part gemm|gpt|both]
                                     [--iters 20] [--repeat 3] [--steps 30] [--warmup 5]
                                     [--layers 8] [--width 2048] [--heads 16] [--seq 2048] [--batch 4]
                                     [--pool process|none] [--ordering events|wait] [--compile]
                                     [--modes bf16,bf16-inductor,fp8-inductor,bf16-regend,fp8] [--json out.json]

gemm: an 8192^3 FP8 GEMM, a e4m3 [M, K] times b e4m3 [N, K] (TN, per-tensor
scales, f32 accumulation without cuBLASLt's fast accumulation, d bf16),
through regend (Client.gemm with a_scale and b_scale on the same torch
tensors, --iters calls queued with wait=False and one wait) against
torch._scaled_mm(a, b.t(), scale_a, scale_b, out_dtype=bf16,
use_fast_accum=False) in process (--iters launches and one synchronize):
each the fastest of --repeat batches, their TFLOP/s and the ratio (target
>= 0.97). Both results are first checked against float64 of the
dequantized operands.

gpt: tests/bench/models' nanoGPT GPT (bf16, AdamW on the rank) three ways
on the same batches from the same seed: "bf16" in process (torch's
nn.Linear), "bf16-regend" (the blocks' Linears as regen.torch.fp8.Linear
outside fp8_autocast: regend's bf16 GEMMs), and "fp8" (the same inside
rt.fp8_autocast(recipe=DelayedScaling(HYBRID, --history, "max")): each
Linear's forward and backward one FP8 program Run in regend). The LM head
(tied to the embedding), attention, LayerNorms and the loss stay in torch
(eager; compiled, below, the lowering takes them into the programs too).
Tokens/s over the steps after --warmup; the losses side by side, and the
FP8 run's mean loss over the last 10 steps against bf16's (target: within
--loss-tolerance, relative) at >= 1.3x bf16's tokens/s.

--compile runs the regend modes through torch.compile(model,
backend="regen", dynamic=False) ("bf16-regend-compiled", "fp8-compiled":
the FP8 Linears' passes nodes of the step's two programs, docs/torch.md
"FP8"), and adds "bf16-inductor", the bf16 model under torch.compile's
default backend in process, whose ratio is printed beside bf16 eager's
(the verdict stays against bf16 eager, issue 34's target), and
"fp8-inductor": FP8 in process, the blocks' Linears as a Linear over
torch._scaled_mm with per-tensor scales from each step's own amax
(torchao's Float8Linear's default recipe, written here: neither it nor
Transformer Engine is on the GPU machine), under Inductor, the best FP8 a
user has without regen.  --modes runs a subset (bf16 always: every ratio
is against it).

--pool process (the default) makes every CUDA allocation libregen's pool
(REGEN_TORCH_POOL=process as regen.torch is imported, before torch
initialises CUDA: no block imports); --pool none leaves torch's allocator. --ordering (default "events": the rank's stream waits
for regend's Runs on the GPU, the host runs ahead) is regen.torch's. Exit 77 without torch, a GPU, or FP8 (sm_89 or later,
torch with float8_e4m3fn and _scaled_mm).
"""

import argparse
import os
import statistics
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from _harness import Daemon, markdown_table, regen, require_torch, write_json  # noqa: E402


def batch_seconds(run, sync, iters, repeat):
    """The fastest of `repeat` batches of `iters` runs, per run, after two
    untimed ones."""
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


def bench_gemm(torch, rt, c, args):
    m = n = k = 8192
    dev = torch.device("cuda", 0)
    g = torch.Generator(device=dev).manual_seed(34)
    e4m3 = torch.float8_e4m3fn
    # Values spread over the format's range, as a scaled tensor's are.
    a = (torch.randn(m, k, device=dev, generator=g) * 64).to(e4m3)
    b = (torch.randn(n, k, device=dev, generator=g) * 64).to(e4m3)
    sa = torch.full([1], 1 / 64, device=dev, dtype=torch.float32)
    sb = torch.full([1], 1 / 32, device=dev, dtype=torch.float32)
    d_regend = torch.empty(m, n, device=dev, dtype=torch.bfloat16)
    torch.cuda.synchronize()

    def scaled_mm(fast=False):
        return torch._scaled_mm(a, b.t(), scale_a=sa.reshape(()), scale_b=sb.reshape(()), out_dtype=torch.bfloat16,
                                use_fast_accum=fast)

    # regend's operands made once (the calls then cost the lane, not the
    # tensors' lookup), as bench_layernorm does: pool memory where the
    # process allocates from libregen's pool (its chunk's import), else
    # the tensor's block imported by CUDA IPC.
    ops, imported = {}, []
    for name, t, dt in (("a", a, "e4m3"), ("b", b, "e4m3"), ("d", d_regend, "bf16"), ("a_scale", sa, "f32"),
                        ("b_scale", sb, "f32")):
        ref = rt.runtime().pool.lookup(t.data_ptr()) if rt.process_pool_enabled() else None
        if ref is not None:
            ops[name] = regen.Operand(ref.buffer, ref.offset, dt, list(t.shape))
        else:
            buf = c.import_tensor(t)
            imported.append(t)
            ops[name] = regen.Operand(buf.id, t.storage_offset() * t.element_size(), dt, list(t.shape))

    def regend_gemm(wait=False, fast=False):
        c.gemm(ops["a"], ops["b"], ops["d"], trans_b=True, a_scale=ops["a_scale"], b_scale=ops["b_scale"],
               wait=wait, fp8_fast_accum=fast)

    # Each path once against one float64 reference, promoted and with fast
    # accumulation (Transformer Engine's and torchao's forward GEMMs, rows
    # beside the target's): regend's d is read before its next GEMM.
    ref = (a.double() * sa.double()) @ (b.double() * sb.double()).t()
    errs = {}
    for fast, tag in ((False, ""), (True, ", fast")):
        regend_gemm(wait=True, fast=fast)
        errs["regend" + tag] = ((d_regend.double() - ref).norm() / ref.norm()).item()
        d_torch = scaled_mm(fast=fast)
        torch.cuda.synchronize()
        errs["torch._scaled_mm" + tag] = ((d_torch.double() - ref).norm() / ref.norm()).item()
    del ref, d_torch
    t_regend = batch_seconds(regend_gemm, lambda: c.wait(0), args.iters, args.repeat)
    t_torch = batch_seconds(scaled_mm, torch.cuda.synchronize, args.iters, args.repeat)
    t_regend_fast = batch_seconds(lambda: regend_gemm(fast=True), lambda: c.wait(0), args.iters, args.repeat)
    t_torch_fast = batch_seconds(lambda: scaled_mm(fast=True), torch.cuda.synchronize, args.iters, args.repeat)
    flops = 2.0 * m * n * k
    ratio = t_torch / t_regend
    print(f"\nFP8 GEMM 8192^3, e4m3 x e4m3 -> bf16, per-tensor scales, no fast accumulation, "
          f"{torch.cuda.get_device_name(0)}; pipelined batches of {args.iters}, transport "
          f"{c.lane_transport(0)}")
    print(markdown_table(["path", "µs / GEMM", "TFLOP/s", "rel error vs f64 of the dequantized operands"],
                         [["regend (Client.gemm, wait=False)", f"{t_regend * 1e6:.1f}",
                           f"{flops / t_regend / 1e12:.0f}", f"{errs['regend']:.2e}"],
                          ["torch._scaled_mm in process", f"{t_torch * 1e6:.1f}", f"{flops / t_torch / 1e12:.0f}",
                           f"{errs['torch._scaled_mm']:.2e}"],
                          ["regend, compute fp8_fast_accum", f"{t_regend_fast * 1e6:.1f}",
                           f"{flops / t_regend_fast / 1e12:.0f}", f"{errs['regend, fast']:.2e}"],
                          ["torch._scaled_mm, use_fast_accum", f"{t_torch_fast * 1e6:.1f}",
                           f"{flops / t_torch_fast / 1e12:.0f}", f"{errs['torch._scaled_mm, fast']:.2e}"]]))
    verdict = "PASS" if ratio >= 0.97 else "FAIL"
    print(f"regend / in process: {ratio:.3f} (target >= 0.97: {verdict}); with fast accumulation "
          f"{t_torch_fast / t_regend_fast:.3f}, {t_regend / t_regend_fast:.2f}x regend's promoted GEMM")
    for t in imported:
        c.close_tensor(t)
    return {"regend_s": t_regend, "torch_s": t_torch, "ratio": ratio, "rel_err": errs, "verdict": verdict,
            "regend_fast_s": t_regend_fast, "torch_fast_s": t_torch_fast}


def torch_fp8_linear_class(torch):
    """An FP8 Linear in process, the best a user has without regen: the
    forward's input and weight cast to e4m3 and the backward's output
    gradient to e5m2 (HYBRID), each by its own amax of this step (dynamic,
    per-tensor: torchao's Float8Linear's "tensorwise" recipe), the GEMMs
    torch._scaled_mm (cuBLASLt, TN: each operand in the layout FP8 GEMMs
    take on Hopper, transposed copies made as torchao makes them), the
    bias fused in the forward's GEMM and summed in the backward; the
    forward's GEMM with fast accumulation, the gradients' without
    (torchao's default, as Transformer Engine's).  Under
    torch.compile(Inductor) the amaxes, casts and transposes are Triton
    kernels fused with what makes their inputs."""
    f8, f8g = torch.float8_e4m3fn, torch.float8_e5m2
    top, top_g = torch.finfo(f8).max, torch.finfo(f8g).max

    def cast(t, dtype, most):
        scale = most / t.abs().amax().float().clamp(min=1e-12)
        return (t.float() * scale).clamp(-most, most).to(dtype), scale.reciprocal()

    class Fn(torch.autograd.Function):
        @staticmethod
        def forward(ctx, x, w, b):
            x2 = x.reshape(-1, x.shape[-1])
            xq, x_inv = cast(x2, f8, top)
            wq, w_inv = cast(w, f8, top)
            y = torch._scaled_mm(xq, wq.t(), scale_a=x_inv, scale_b=w_inv, bias=b, out_dtype=x.dtype,
                                 use_fast_accum=True)
            ctx.save_for_backward(xq, wq, x_inv, w_inv)
            ctx.has_bias, ctx.shape = b is not None, x.shape
            return y.reshape(*x.shape[:-1], w.shape[0])

        @staticmethod
        def backward(ctx, dy):
            xq, wq, x_inv, w_inv = ctx.saved_tensors
            dy2 = dy.reshape(-1, dy.shape[-1])
            gq, g_inv = cast(dy2, f8g, top_g)
            # dx = dy @ w and dw = dy.T @ x: the second operand column major.
            dx = torch._scaled_mm(gq, wq.t().contiguous().t(), scale_a=g_inv, scale_b=w_inv, out_dtype=dy.dtype)
            dw = torch._scaled_mm(gq.t().contiguous(), xq.t().contiguous().t(), scale_a=g_inv, scale_b=x_inv,
                                  out_dtype=dy.dtype)
            db = dy2.sum(0) if ctx.has_bias else None
            return dx.reshape(ctx.shape), dw, db

    class Linear(torch.nn.Linear):
        def forward(self, x):
            return Fn.apply(x, self.weight, self.bias)

    return Linear


def fp8_linears(torch, rt, model, cls=None):
    """The blocks' nn.Linears as regen.torch.fp8.Linear (or cls) with the
    same weights (the LM head, tied to the embedding, stays)."""
    for block in model.transformer.h:
        for parent in (block.attn, block.mlp):
            for name, child in list(parent.named_children()):
                if isinstance(child, torch.nn.Linear):
                    new = (cls or rt.fp8.Linear)(child.in_features, child.out_features, bias=child.bias is not None,
                                                 device=child.weight.device, dtype=child.weight.dtype)
                    with torch.no_grad():
                        new.weight.copy_(child.weight)
                        if child.bias is not None:
                            new.bias.copy_(child.bias)
                    setattr(parent, name, new)
    return model


def train(torch, rt, models, mode, args):
    """One mode's training: "bf16" and "bf16-inductor" the model as built
    (the latter under torch.compile's Inductor), the others with
    rt.fp8.Linear (under torch.compile(backend="regen") where the mode ends
    in "-compiled"), "fp8..." inside rt.fp8_autocast."""
    model = models.build("gpt", args.vocab, args.seq, args.width, args.layers, args.heads, seed=0)
    fn = model
    if mode == "bf16-inductor":
        fn = torch.compile(model, dynamic=False)
    elif mode == "fp8-inductor":
        fp8_linears(torch, rt, model, torch_fp8_linear_class(torch))
        fn = torch.compile(model, dynamic=False)
    elif mode != "bf16":
        fp8_linears(torch, rt, model)
        if mode.endswith("-compiled"):
            fn = torch.compile(model, backend="regen", dynamic=False)
    opt = torch.optim.AdamW(model.parameters(), lr=3e-4, weight_decay=0.1, fused=True)
    recipe = rt.fp8.DelayedScaling(fp8_format=rt.fp8.Format.HYBRID, amax_history_len=args.history,
                                   amax_compute_algo="max")
    losses, times = [], []
    before = rt.stats()
    for step in range(args.steps):
        idx, targets = models.batch(args.vocab, args.batch, args.seq, step)
        torch.cuda.synchronize()
        t = time.perf_counter()
        if mode.startswith("fp8") and mode != "fp8-inductor":
            with rt.fp8_autocast(recipe=recipe):
                loss = fn(idx, targets)
        else:
            loss = fn(idx, targets)
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
        torch.cuda.synchronize()
        times.append(time.perf_counter() - t)
        losses.append(loss.item())
        print(f"  {mode:12s} step {step:3d} loss {losses[-1]:.4f} {times[-1] * 1e3:8.1f} ms", flush=True)
    after = rt.stats()
    timed = times[args.warmup:]
    tokens = args.batch * args.seq
    result = {"losses": losses, "step_s": timed, "tokens_per_s": tokens * len(timed) / sum(timed),
              "median_step_ms": statistics.median(timed) * 1e3,
              "program_runs": after.get("program_runs", 0) - before.get("program_runs", 0),
              "handoffs": after.get("handoffs", 0) - before.get("handoffs", 0)}
    if mode.endswith("-compiled"):
        result["explain"] = rt.explain(show=False)
        rank = sorted({x["op"] for r in result["explain"] for x in r["rank"]})
        print(f"  {mode}: ops on the rank: {', '.join(rank) or 'none'}", flush=True)
    del fn, model, opt
    if mode != "bf16":
        torch._dynamo.reset()
    return result


def bench_gpt(torch, rt, args):
    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    import models
    results = {}
    suffix = "-compiled" if args.compile else ""
    wanted = ["bf16"] + [m for m in args.modes.split(",") if m and m != "bf16"]
    modes = []
    for m in wanted:
        if m in ("bf16-inductor", "fp8-inductor") and not args.compile:
            continue
        modes.append(m + suffix if m in ("bf16-regend", "fp8") else m)
    for mode in modes:
        results[mode] = train(torch, rt, models, mode, args)
        if rt.process_pool_enabled():
            rt.empty_cache()
        else:
            torch.cuda.empty_cache()
    base = results["bf16"]
    tail = min(10, args.steps)
    rows = []
    for mode, r in results.items():
        mean_tail = statistics.fmean(r["losses"][-tail:])
        r["loss_tail"] = mean_tail
        rows.append([mode, f"{r['tokens_per_s']:.0f}", f"{r['tokens_per_s'] / base['tokens_per_s']:.3f}",
                     f"{r['median_step_ms']:.1f}", f"{mean_tail:.4f}", f"{r['losses'][-1]:.4f}",
                     str(r["program_runs"] // max(1, args.steps))])
    print(f"\nGPT {args.layers} layers, width {args.width}, {args.heads} heads, sequence {args.seq}, batch "
          f"{args.batch}, bf16, AdamW; {args.steps} steps, tokens/s over the last {args.steps - args.warmup}; "
          f"{torch.cuda.get_device_name(0)}")
    print(markdown_table(["mode", "tokens/s", "vs bf16", "median step ms", f"mean loss, last {tail}", "last loss",
                          "program Runs / step"], rows))
    fp8_mode = "fp8" + suffix
    if fp8_mode not in results:
        return {"results": results, "verdict": "PASS"}
    fast = results[fp8_mode]
    speed = fast["tokens_per_s"] / base["tokens_per_s"]
    drift = abs(fast["loss_tail"] - base["loss_tail"]) / abs(base["loss_tail"])
    verdict = "PASS" if speed >= 1.3 and drift <= args.loss_tolerance else "FAIL"
    print(f"{fp8_mode} through regend / bf16 in process: {speed:.3f}x tokens/s (target >= 1.3), mean loss of the "
          f"last {tail} steps {drift:.4f} apart, relative (tolerance {args.loss_tolerance}): {verdict}")
    out = {"results": results, "speed": speed, "loss_drift": drift, "verdict": verdict}
    if "bf16-inductor" in results:
        out["speed_vs_inductor"] = fast["tokens_per_s"] / results["bf16-inductor"]["tokens_per_s"]
        print(f"{fp8_mode} / bf16 under Inductor in process: {out['speed_vs_inductor']:.3f}x tokens/s")
    if "fp8-inductor" in results:
        out["speed_vs_fp8_inductor"] = fast["tokens_per_s"] / results["fp8-inductor"]["tokens_per_s"]
        print(f"{fp8_mode} / FP8 in process under Inductor (torch._scaled_mm, per-tensor scales of the step): "
              f"{out['speed_vs_fp8_inductor']:.3f}x tokens/s; that path / bf16 in process: "
              f"{results['fp8-inductor']['tokens_per_s'] / base['tokens_per_s']:.3f}x")
    return out


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("regend", nargs="?")
    p.add_argument("--socket")
    p.add_argument("--part", choices=("gemm", "gpt", "both"), default="both")
    p.add_argument("--pool", choices=("process", "none"), default="process")
    p.add_argument("--ordering", choices=("events", "wait", "sync", "auto"), default="events",
                   help="regen.torch's ordering with the rank's stream (docs/torch.md)")
    p.add_argument("--iters", type=int, default=20)
    p.add_argument("--repeat", type=int, default=3)
    p.add_argument("--steps", type=int, default=30)
    p.add_argument("--warmup", type=int, default=5)
    p.add_argument("--layers", type=int, default=8)
    p.add_argument("--width", type=int, default=2048)
    p.add_argument("--heads", type=int, default=16)
    p.add_argument("--seq", type=int, default=2048)
    p.add_argument("--batch", type=int, default=4)
    p.add_argument("--vocab", type=int, default=8192)
    p.add_argument("--history", type=int, default=1024, help="the recipe's amax_history_len")
    p.add_argument("--loss-tolerance", type=float, default=0.02)
    p.add_argument("--compile", action="store_true",
                   help='the regend modes through torch.compile(backend="regen"), and a bf16-inductor row')
    p.add_argument("--modes", default="bf16,bf16-inductor,fp8-inductor,bf16-regend,fp8",
                   help="which of bf16, bf16-inductor and fp8-inductor (with --compile), bf16-regend, fp8 to run "
                        "(bf16 always)")
    p.add_argument("--json")
    args = p.parse_args()
    if args.steps <= args.warmup:
        p.error("--steps must be more than --warmup")
    torch = require_torch()
    if not hasattr(torch, "float8_e4m3fn") or not hasattr(torch, "_scaled_mm"):
        print(f"SKIP: torch {torch.__version__} has no float8_e4m3fn or _scaled_mm")
        return 77
    # The pool is the process's allocator only if chosen before torch
    # initialises CUDA (the capability check below does): as regen.torch is
    # imported, as bench_compile.py has it.
    os.environ["REGEN_TORCH_POOL"] = "process" if args.pool == "process" else "scoped"
    import regen.torch as rt
    if torch.cuda.get_device_capability(0) < (8, 9):
        print(f"SKIP: {torch.cuda.get_device_name(0)} has no FP8 GEMMs (sm_89 or later)")
        return 77
    daemon = Daemon(args.socket, args.regend, "cuda")
    out = {"args": vars(args), "device": torch.cuda.get_device_name(0), "torch": torch.__version__}
    try:
        rt.configure(socket=daemon.socket, ordering=args.ordering)
        if args.part in ("gemm", "both"):
            c = regen.Client(daemon.socket, timeout=300)
            try:
                out["gemm"] = bench_gemm(torch, rt, c, args)
            finally:
                c.close()
        if args.part in ("gpt", "both"):
            out["gpt"] = bench_gpt(torch, rt, args)
        write_json(args.json, out)
    finally:
        daemon.close()
    verdicts = [out[k]["verdict"] for k in ("gemm", "gpt") if k in out]
    return 0 if all(v == "PASS" for v in verdicts) else 1


if __name__ == "__main__":
    sys.exit(main())
