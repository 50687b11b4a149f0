#!/usr/bin/env python3
# SPDX-License-Identifier: Apache-2.0
"""Training throughput of models written as their users write them
(tests/bench/models: a nanoGPT GPT, a Llama-style decoder,
torch.nn.TransformerEncoder), three ways in one process, same seed and
data, bf16, AdamW (fused) on the rank:

  eager     the model as it is
  inductor  torch.compile(model) (Inductor, torch's default backend)
  regen     torch.compile(model, backend="regen", dynamic=False): the
            forward and backward graphs as io.regen.Program segments in
            regend

Prints tokens/s per path, regen's against the best in-process path, the
hand-offs, program Runs and rank steps per training step, and the largest
difference between regen's losses and eager's over the timed steps.  Each
path trains in a process of its own (its memory its own); regen's takes
every CUDA allocation from libregen's pool (REGEN_TORCH_POOL=process;
--pool none keeps torch's allocator, whose blocks are imported).

    python3 tests/bench/bench_compile.py [REGEND] [--models gpt,llama,encoder] [--dims 1024,2048]
        [--seq 1024] [--batch 8] [--layers 4] [--vocab 50257] [--steps 20] [--warmup 3]
        [--paths eager,inductor,regen,regen+recycle,regen+adamw] [--ordering events] [--pool process|none] [--optimizer torch|regen]
        [--partition default|min_cut] [--recompute] [--recycle] [--mps] [--profile DIR] [--json OUT]

--partition: how regen's path splits forward from backward
(torch.compile's options={"partition": ...}): AOTAutograd's default, or
Inductor's min-cut rematerialisation. --recompute: options={"recompute":
True}, the backward makes again a loss's log-probabilities, f32 copies of
bf16 tensors and activations rather than the forward saving them.
--recycle: options={"recycle": True}, each segment's outputs written into
an earlier call's that nothing holds any more (its graph's operands stay
where they were). A path regen+recycle (regen+recompute,
regen+recycle+recompute) is regen's with those options beside the
flags', so that one run measures regen's path with them and without;
+adamw (regen+adamw, regen+recycle+adamw) trains that path with
regen.torch.optim.AdamW, its step a program Run in regend, in place of
torch's fused AdamW on the rank (as --optimizer regen does for every
path of regen's).

--profile DIR: where each path's GPU time goes, instead of how fast it
trains (the timings then mean little): eager's and Inductor's kernels
through torch.profiler over 3 more steps, each kernel's total a step, in
DIR/<model>-d<D>-<path>.txt; regen's programs step by step through the
worker's REGEN_PROGRAM_TRACE, in DIR/trace.*.

--mps: under a private CUDA MPS control daemon (started here, quit at the
end): every path, regend's worker included, an MPS client.
"""

import json
import os
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
from _harness import Daemon, markdown_table, require_torch  # noqa: E402
from regend_fixture import take_flag, take_option as opt  # noqa: E402

torch = require_torch()

import models  # noqa: E402
import regen.torch as rt  # noqa: E402


MODELS = opt("--models", "gpt,llama,encoder").split(",")
DIMS = [int(x) for x in opt("--dims", str(models.BENCH_D)).split(",")]
SEQ = int(opt("--seq", str(models.BENCH_SEQ)))
BATCH = int(opt("--batch", str(models.BENCH_BATCH)))
LAYERS = int(opt("--layers", str(models.BENCH_LAYERS)))
# nanoGPT's default: GPT-2's 50257 padded to a multiple of 64 "for
# efficiency" (an odd row length leaves every row of the logits misaligned
# for torch's kernels and cuBLAS; Inductor pads such strides itself).
VOCAB = int(opt("--vocab", str(models.BENCH_VOCAB)))
STEPS = int(opt("--steps", "20"))
WARMUP = int(opt("--warmup", "3"))
PATHS = opt("--paths", "eager,inductor,regen").split(",")
# The options regen's paths may name beside the flags: torch.compile's
# options, and "adamw" for regen.torch.optim.AdamW in place of torch's.
COMPILE_OPTIONS = ("recycle", "recompute")
PATH_OPTIONS = COMPILE_OPTIONS + ("adamw",)


def regen_options_of(path):
    """The options a path of regen's names ("regen": none, "regen+recycle":
    recycle, "regen+recycle+recompute"); None: not one of regen's."""
    base, *options = path.split("+")
    return set(options) if base == "regen" else None


REGEN_PATHS = [p for p in PATHS if regen_options_of(p) is not None]
for _p in PATHS:
    _named = regen_options_of(_p)
    if _p not in ("eager", "inductor") and (_named is None or not _named <= set(PATH_OPTIONS)):
        sys.exit(f"bench_compile: no path {_p!r} (eager, inductor, regen, regen+" + "+".join(PATH_OPTIONS) + ")")
ORDERING = opt("--ordering", "events")
JSON_OUT = opt("--json", None)
SOCKET = opt("--socket", None)
POOL = opt("--pool", "process")
# regen's path with torch's fused AdamW on the rank ("torch"), or with
# regen.torch.optim.AdamW, its step one program Run in regend ("regen").
OPTIMIZER = opt("--optimizer", "torch")
PARTITION = opt("--partition", "default")
RECOMPUTE = take_flag("--recompute")
RECYCLE = take_flag("--recycle")
MPS = take_flag("--mps")
PROFILE = opt("--profile", None)
if PROFILE:
    PROFILE = os.path.abspath(PROFILE)
ONE = opt("--one", None)          # model,d,path: this process trains that one path
RESULT = opt("--result", None)
REGEND = sys.argv[1] if len(sys.argv) > 1 else None


def train(name, D, path):
    heads = D // 64
    model = models.build(name, VOCAB, SEQ, D, LAYERS, heads, dtype=torch.bfloat16)
    named = regen_options_of(path)
    regen = named is not None
    if regen and (OPTIMIZER == "regen" or "adamw" in named):
        optimizer = rt.optim.AdamW(model.parameters(), lr=1e-4)
    else:
        optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4, fused=True)
    if path == "eager":
        fn = model
    elif path == "inductor":
        fn = torch.compile(model)
    else:
        options = {"partition": PARTITION} if PARTITION != "default" else {}
        flags = {"recompute": RECOMPUTE, "recycle": RECYCLE}
        for option in COMPILE_OPTIONS:
            if flags[option] or option in named:
                options[option] = True
        fn = torch.compile(model, backend="regen", dynamic=False, options=options or None)
    batches = [models.batch(VOCAB, BATCH, SEQ, s) for s in range(WARMUP + STEPS)]
    losses = []

    def step(i):
        idx, tgt = batches[i]
        optimizer.zero_grad(set_to_none=True)
        loss = fn(idx, tgt)
        loss.backward()
        optimizer.step()
        return loss.detach()

    t0 = time.perf_counter()
    for i in range(WARMUP):
        losses.append(step(i))
    torch.cuda.synchronize()
    warm_s = time.perf_counter() - t0
    used_warm = _device_used_gib()
    before = dict(rt.stats()) if regen else None
    status_before = rt.runtime().client.program_status(0) if regen else None
    t0 = time.perf_counter()
    for i in range(WARMUP, WARMUP + STEPS):
        losses.append(step(i))
    torch.cuda.synchronize()
    elapsed = time.perf_counter() - t0
    result = {"path": path, "tokens_per_s": BATCH * SEQ * STEPS / elapsed, "step_ms": elapsed / STEPS * 1e3,
              "warmup_s": warm_s, "losses": [x.float().item() for x in losses],
              "peak_gib": _peak_gib(), "device_used_gib": [used_warm, _device_used_gib()]}
    if PROFILE and not regen:
        _profile_kernels(step, f"{name}-d{D}-{path}")
    if before is not None:
        after = rt.stats()
        for k in ("program_runs", "handoffs", "rank_steps", "fallback_segments", "idle_calls"):
            result[k + "_per_step"] = (after[k] - before.get(k, 0)) / STEPS
        result["explain"] = rt.explain(show=False)
        # Each program's counters over the timed steps alone.
        then = {p["program"]: p for p in status_before}
        result["programs"] = []
        for p in rt.runtime().client.program_status(0):
            old = then.get(p["program"], {})
            result["programs"].append({k: (v - old.get(k, 0) if isinstance(v, (int, float)) and k not in ("nodes", "scratch_bytes") else v)
                                       for k, v in p.items()})
    del fn, model, optimizer, batches
    torch._dynamo.reset()
    return result


def _device_used_gib():
    free, total = torch.cuda.mem_get_info()
    return (total - free) / 2**30


def _profile_kernels(step, label, steps=3):
    """Each kernel's GPU time a step, over `steps` more steps."""
    from torch.profiler import ProfilerActivity, profile
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for _ in range(steps):
            step(0)
        torch.cuda.synchronize()
    rows = []
    for e in prof.key_averages():
        us = getattr(e, "device_time_total", None)
        if us is None:
            us = e.cuda_time_total
        if us:
            rows.append((us / steps, e.count // steps, e.key))
    rows.sort(reverse=True)
    with open(os.path.join(PROFILE, label + ".txt"), "w") as f:
        f.write(f"# {label}: GPU us a step {sum(r[0] for r in rows):.0f}\n# us_per_step calls_per_step kernel\n")
        for us, n, key in rows:
            f.write(f"{us:.1f} {n} {key[:160]}\n")


def _peak_gib():
    """torch's allocator's peak; with libregen's pool as the process's
    allocator torch keeps no statistics: the device's use then."""
    try:
        return torch.cuda.max_memory_allocated() / 2**30
    except RuntimeError:
        return _device_used_gib()


def one():
    name, D, path = ONE.split(",")
    if regen_options_of(path) is not None:
        rt.configure(socket=SOCKET, ordering=ORDERING)
    try:
        r = train(name, int(D), path)
    except Exception as e:   # reported, and the other paths still run
        import traceback
        traceback.print_exc()
        r = {"path": path, "error": f"{type(e).__name__}: {e}"[:400]}
    with open(RESULT, "w") as f:
        json.dump(r, f, default=str)


def run_path(name, D, path, socket):
    import subprocess
    import tempfile
    with tempfile.NamedTemporaryFile(suffix=".json") as res:
        env = dict(os.environ)
        if path in REGEN_PATHS and POOL == "process":
            env["REGEN_TORCH_POOL"] = "process"
        if env.get("REGEN_COMPILE_DUMP"):
            # Each model's graphs apart: every process numbers its own from 1.
            env["REGEN_COMPILE_DUMP"] = os.path.join(env["REGEN_COMPILE_DUMP"], f"{name}-d{D}-{path}")
        cmd = [sys.executable, os.path.abspath(__file__), REGEND or "", "--one", f"{name},{D},{path}",
               "--result", res.name, "--seq", str(SEQ), "--batch", str(BATCH), "--layers", str(LAYERS),
               "--vocab", str(VOCAB), "--steps", str(STEPS), "--warmup", str(WARMUP), "--ordering", ORDERING,
               "--optimizer", OPTIMIZER, "--partition", PARTITION]
        cmd += [flag for flag, on in (("--recompute", RECOMPUTE), ("--recycle", RECYCLE)) if on]
        if socket:
            cmd += ["--socket", socket]
        if PROFILE:
            cmd += ["--profile", PROFILE]
        rc = subprocess.call(cmd, env=env)
        if PROFILE and path in REGEN_PATHS:
            # The worker's traces of this model's programs, by model.
            import glob
            for f in glob.glob(os.path.join(PROFILE, "trace.*")):
                os.rename(f, os.path.join(PROFILE, f"{name}-d{D}-regen.{f.rsplit('.', 1)[-1]}.txt"))
        try:
            with open(res.name) as f:
                return json.load(f)
        except (OSError, ValueError):
            return {"path": path, "error": f"the process training it exited {rc} with no result"}


def start_mps():
    """A private MPS control daemon: its pipe and log folders in the
    environment every process started from here on inherits."""
    import subprocess
    import tempfile
    base = tempfile.mkdtemp(prefix="regen-mps-")
    os.environ["CUDA_MPS_PIPE_DIRECTORY"] = os.path.join(base, "pipe")
    os.environ["CUDA_MPS_LOG_DIRECTORY"] = os.path.join(base, "log")
    os.makedirs(os.environ["CUDA_MPS_PIPE_DIRECTORY"])
    os.makedirs(os.environ["CUDA_MPS_LOG_DIRECTORY"])
    subprocess.check_call(["nvidia-cuda-mps-control", "-d"])


def stop_mps():
    import subprocess
    subprocess.run(["nvidia-cuda-mps-control"], input=b"quit\n", check=False)


def main():
    if MPS:
        start_mps()
    try:
        _main()
    finally:
        if MPS:
            stop_mps()


def _main():
    if PROFILE:
        os.makedirs(PROFILE, exist_ok=True)
        os.environ["REGEN_PROGRAM_TRACE"] = os.path.join(os.path.abspath(PROFILE), "trace")
    daemon = Daemon(SOCKET, REGEND, "cuda") if REGEN_PATHS else None
    rows, out = [], {"card": torch.cuda.get_device_name(), "torch": torch.__version__, "seq": SEQ, "batch": BATCH,
                     "layers": LAYERS, "vocab": VOCAB, "steps": STEPS, "ordering": ORDERING, "pool": POOL,
                     "mps": MPS, "optimizer": OPTIMIZER, "runs": []}
    try:
        for name in MODELS:
            for D in DIMS:
                res = {}
                for path in PATHS:
                    res[path] = r = run_path(name, D, path, daemon.socket if daemon else None)
                    print(f"{name} d{D} {path}: " + (f"{r['tokens_per_s']:.0f} tokens/s, {r['step_ms']:.2f} ms a step, "
                                                       f"warm-up {r['warmup_s']:.1f} s, peak {r['peak_gib'] or 0:.1f} GiB, "
                                                       f"device use {r['device_used_gib'][0]:.1f} GiB after the "
                                                       f"warm-up, {r['device_used_gib'][1]:.1f} at the end"
                                                       if "error" not in r else r["error"]), flush=True)
                out["runs"].append({"model": name, "d": D, "results": res})
                best = max((res[p]["tokens_per_s"] for p in ("eager", "inductor") if p in res and
                            "tokens_per_s" in res[p]), default=None)
                e = res.get("eager", {})
                for path in REGEN_PATHS:
                    g = res[path]
                    diff = None
                    if "losses" in g and "losses" in e:
                        diff = max(abs(a - b) / abs(b) for a, b in zip(g["losses"], e["losses"]))
                    ran = "tokens_per_s" in g
                    rows.append([name, f"d{D}"] +
                                [f"{res[p]['tokens_per_s']:.0f}" if "tokens_per_s" in res.get(p, {}) else "-"
                                 for p in ("eager", "inductor")] +
                                [path, f"{g['tokens_per_s']:.0f}" if ran else "-",
                                 f"{g['tokens_per_s'] / best:.3f}" if best and ran else "-",
                                 f"{g.get('handoffs_per_step', 0):.1f}" if ran else "-",
                                 f"{g.get('program_runs_per_step', 0):.1f}" if ran else "-",
                                 f"{g.get('rank_steps_per_step', 0):.1f}" if ran else "-",
                                 f"{diff:.1e}" if diff is not None else "-"])
    finally:
        if daemon is not None:
            daemon.close()
    print(f"card: {out['card']}, torch {out['torch']}; B{BATCH} S{SEQ}, {LAYERS} layers, vocab {VOCAB}, bf16, "
          f"AdamW fused; {STEPS} timed steps after {WARMUP}; ordering {ORDERING}; regen's pool {POOL}"
          f"{'; under MPS' if MPS else ''}")
    print(markdown_table(["model", "d", "eager tok/s", "inductor tok/s", "regen's path", "its tok/s", "/ best in process",
                          "hand-offs a step", "Runs a step", "rank steps a step", "max loss diff vs eager"], rows))
    for run in out["runs"]:
        for path in REGEN_PATHS:
            _print_programs(f"{run['model']} d{run['d']} {path}", run["results"][path])
    if JSON_OUT:
        with open(JSON_OUT, "w") as f:
            json.dump(out, f, indent=1, default=str)


def _print_programs(label, g):
    """Where a regen path's graphs split, what stayed on the rank and how
    each program ran over the timed steps."""
    for rep in g.get("explain", []):
        kept = {}
        for x in rep["rank"]:
            kept[x["why"]] = kept.get(x["why"], 0) + 1
        print(f"{label} {rep['kind']}: {len(rep['segments'])} segment(s), "
              f"{rep['handoffs']} hand-off(s); on the rank: " +
              "; ".join(f"{n}x {w}" for w, n in sorted(kept.items(), key=lambda kv: -kv[1])
                        if not (w or "").startswith("a view of a tensor the rank holds")))
        if "recycled" in rep:
            r = rep["recycled"]
            print(f"  recycle: {r['reused']} outputs written into kept ones, {r['made']} made anew; kept ones "
                  f"found held, by use count: {r['held'] or '-'}")
    for p in g.get("programs", []):
        runs = max(p.get("runs", 0), 1)
        print(f"  program {p.get('name')} over the timed steps: {p.get('nodes')} nodes, {p.get('runs')} Runs, "
              f"{p.get('run_us', 0) / runs:.0f} us a Run from arrival to done, the worker's launch "
              f"{p.get('launch_us', 0) / runs:.0f} us a Run; graph {p.get('graph_captures')} captures "
              f"{p.get('graph_launches')} launches, {p.get('stream_runs')} on the stream, "
              f"{(p.get('scratch_bytes') or 0) / 2**20:.0f} MiB of scratch "
              f"({p.get('not_captured') or '-'})")


if __name__ == "__main__":
    one() if ONE else main()
