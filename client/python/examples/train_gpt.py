#!/usr/bin/env python3
# SPDX-License-Identifier: Apache-2.0
"""A GPT trained on synthetic data whose GEMMs and attention all run in
regend (regen.torch), or in process for comparison, through a restart and
an injected fault.

    # the model of issue 13: 8 layers, width 2048, 16 heads, sequence 2048, bf16
    python3 client/python/examples/train_gpt.py --mode regend --steps 50
    # a quick run, and the same model in process, losses side by side
    python3 client/python/examples/train_gpt.py --small --mode both --steps 30 \\
        --restart-at 10 --fault-at 20 --json /tmp/gpt.json
    # both in one process, in turns of 5 steps (what bench_train --interleave runs)
    python3 client/python/examples/train_gpt.py --mode interleaved --turn 5 --steps 60
    # regend's host backend, on the CPU (no GPU needed)
    python3 client/python/examples/train_gpt.py --small --device cpu --dtype f32 --mode both

In "regend" mode the whole loop runs inside regen.torch.pool() (weights,
activations, gradients and optimizer state in memory regend maps once per
chunk: no import per tensor) and regen.torch.enable().  The transformer
blocks run as one operation, rt.transformer_blocks (each block's
LayerNorms, projections, attention, MLP and residual adds in regend, the
whole stack one run of calls each way); with --kernels block each block is
one operation (rt.transformer_block, one run a layer each way); with
--kernels parts its pieces go separately (rt.attention_packed, rt.mlp, the
projection; LayerNorms and residual adds on the rank).  The LM
head goes to regend through enable(); the embeddings, the last LayerNorm,
the loss and the optimizer stay in torch.  Backward runs on this thread
(torch.autograd.set_multithreading_enabled(False)) so that its allocations
are pool memory too.  --restart-at runs `regenctl restart --wait` for the
model's device; --fault-at injects a device_lost (regend
--enable-fault-injection); training goes on, and every step is counted.

Prints one line per step and a summary; --json writes the losses, the
tokens/s, regen.torch's counters, the rank's host time per step inside
regen.torch's calls (and waiting for their replies), and the memory seen in
the rank and in regend.
"""

import argparse
import contextlib
import gc
import json
import math
import os
import shutil
import statistics
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.dirname(HERE))

import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402

import regen  # noqa: E402

DTYPES = {"bf16": torch.bfloat16, "f16": torch.float16, "f32": torch.float32}
FULL = dict(layers=8, width=2048, heads=16, seq=2048, batch=1, vocab=8192)
SMALL = dict(layers=2, width=256, heads=4, seq=256, batch=2, vocab=1024)


class Block(torch.nn.Module):
    def __init__(self, width, heads):
        super().__init__()
        self.heads = heads
        self.ln1 = torch.nn.LayerNorm(width)
        self.qkv = torch.nn.Linear(width, 3 * width)
        self.proj = torch.nn.Linear(width, width)
        self.ln2 = torch.nn.LayerNorm(width)
        self.up = torch.nn.Linear(width, 4 * width)
        self.down = torch.nn.Linear(4 * width, width)
        self.attention = None      # set by GPT: F.scaled_dot_product_attention or a stand-in
        self.packed_attention = None  # regen.torch.attention_packed (reads qkv's output in place), or None
        self.fused_mlp = None      # regen.torch.mlp (up, GELU, down as one operation), or None
        self.fused_block = None    # regen.torch.transformer_block (the whole block as one operation), or None

    def block_parameters(self):
        """The 12 parameters in regen.torch.BLOCK_PARAMETERS' order."""
        return (self.ln1.weight, self.ln1.bias, self.qkv.weight, self.qkv.bias, self.proj.weight, self.proj.bias,
                self.ln2.weight, self.ln2.bias, self.up.weight, self.up.bias, self.down.weight, self.down.bias)

    def forward(self, x):
        if self.fused_block is not None:
            # LayerNorms, projections, attention, MLP and both residual adds
            # in regend, one run of calls each way.
            return self.fused_block(x, *self.block_parameters(), self.heads, self.ln1.eps)
        b, s, w = x.shape
        qkv = self.qkv(self.ln1(x))
        if self.packed_attention is not None:
            # q, k and v read in place, their gradients written in place:
            # no copy on the rank between the projections and attention.
            a = self.packed_attention(qkv, self.heads, is_causal=True)
        else:
            q, k, v = qkv.view(b, s, 3, self.heads, w // self.heads).permute(2, 0, 3, 1, 4)
            a = self.attention(q, k, v, is_causal=True).transpose(1, 2).reshape(b, s, w)
        x = x + self.proj(a)
        h = self.ln2(x)
        if self.fused_mlp is not None:
            # GELU and its gradient ride in GEMM epilogues, and the MLP's
            # GEMMs run back to back each way: one hand-off each way.
            return x + self.fused_mlp(h, self.up.weight, self.up.bias, self.down.weight, self.down.bias)
        return x + self.down(F.gelu(self.up(h), approximate="tanh"))


class GPT(torch.nn.Module):
    def __init__(self, layers, width, heads, seq, vocab, **_):
        super().__init__()
        self.tok = torch.nn.Embedding(vocab, width)
        self.pos = torch.nn.Embedding(seq, width)
        self.blocks = torch.nn.ModuleList(Block(width, heads) for _ in range(layers))
        self.ln = torch.nn.LayerNorm(width)
        self.head = torch.nn.Linear(width, vocab, bias=False)
        self.fused_stack = None    # regen.torch.transformer_blocks (all blocks as one operation), or None

    def set_kernels(self, attention, fused_mlp=None, packed_attention=None, fused_block=None, fused_stack=None):
        self.fused_stack = fused_stack
        for blk in self.blocks:
            blk.attention = attention
            blk.fused_mlp = fused_mlp
            blk.packed_attention = packed_attention
            blk.fused_block = fused_block

    def use_regend(self, rt, kernels):
        """regen.torch's operations for the model: "stack" (every block as
        one), "block" (each block as one) or "parts" (attention on the
        packed qkv, the MLP, the projections)."""
        self.set_kernels(rt.scaled_dot_product_attention, rt.mlp, rt.attention_packed,
                         rt.transformer_block if kernels == "block" else None,
                         rt.transformer_blocks if kernels == "stack" else None)

    def forward(self, idx):
        pos = torch.arange(idx.shape[1], device=idx.device)
        x = self.tok(idx) + self.pos(pos)
        if self.fused_stack is not None:
            # Every block in regend, the stack one run of calls each way.
            layers = [b.block_parameters() for b in self.blocks]
            x = self.fused_stack(x, layers, self.blocks[0].heads, self.blocks[0].ln1.eps)
        else:
            for blk in self.blocks:
                x = blk(x)
        return self.head(self.ln(x))


def attention_in_torch(q, k, v, is_causal=False):
    """F.scaled_dot_product_attention where torch has it, else the same math."""
    if hasattr(F, "scaled_dot_product_attention"):
        return F.scaled_dot_product_attention(q, k, v, is_causal=is_causal)
    s = (q @ k.transpose(-1, -2)) / math.sqrt(q.shape[-1])
    if is_causal:
        s = s.masked_fill(~torch.ones(q.shape[2], k.shape[2], dtype=torch.bool, device=q.device).tril(),
                          float("-inf"))
    return s.float().softmax(-1).to(q.dtype) @ v


def batches(cfg, seed, device):
    """Synthetic tokens with structure to learn: each next token is a fixed
    permutation of the last one, with noise."""
    g = torch.Generator(device="cpu").manual_seed(seed)
    perm = torch.randperm(cfg["vocab"], generator=g)
    while True:
        start = torch.randint(cfg["vocab"], (cfg["batch"], 1), generator=g)
        toks = [start]
        for _ in range(cfg["seq"]):
            nxt = perm[toks[-1]]
            noise = torch.rand(nxt.shape, generator=g) < 0.1
            toks.append(torch.where(noise, torch.randint(cfg["vocab"], nxt.shape, generator=g), nxt))
        seq = torch.cat(toks, dim=1)
        yield seq[:, :-1].to(device), seq[:, 1:].to(device)


def regenctl_restart(socket, device):
    exe = os.environ.get("REGENCTL") or shutil.which("regenctl")
    if exe is None:
        build = os.environ.get("REGEN_BUILD_ROOT")
        cand = os.path.join(build, "client", "regenctl") if build else None
        exe = cand if cand and os.access(cand, os.X_OK) else None
    if exe is None:
        raise SystemExit("regenctl not found (PATH, $REGENCTL or $REGEN_BUILD_ROOT/client/regenctl)")
    argv = [exe, "--socket", socket, "restart", "--device", str(device), "--reason", "train_gpt --restart-at",
            "--wait", "--timeout", "120"]
    subprocess.run(argv, check=True, stdout=subprocess.DEVNULL)


def regend_memory(client, device):
    try:
        return client.device_info(device)["memory_used"]
    except regen.Error:
        return None


class Trainer:
    """One model trained in one mode ("torch": in process; "regend": through
    regen.torch), a step at a time, inside scope(): the pool and
    single-threaded backward that the regend mode's allocations need. Two
    trainers can take turns in one process (--mode interleaved), each
    inside its own scope for its turn."""

    def __init__(self, cfg, mode, args):
        self.cfg, self.mode, self.args = cfg, mode, args
        self.device = torch.device(args.device)
        self.rt = None
        if mode == "regend":
            import regen.torch as rt
            rt.configure(socket=args.socket, ordering=args.ordering)
            self.rt = rt
        self.losses, self.times, self.started = [], [], []   # started: wall clock, to line steps up with other records
        self.mem_rank, self.mem_regend, self.calls = [], [], []
        self.host_us, self.reply_us, self.flush_us, self.doorbells = [], [], [], []
        self.gc_ms, self.gc_count = [], []   # per step, per generation
        self.tokens = cfg["batch"] * cfg["seq"]
        with self.scope():
            torch.manual_seed(args.seed)
            self.model = GPT(**cfg).to(device=self.device, dtype=DTYPES[args.dtype])
            if self.rt is not None:
                self.model.use_regend(self.rt, args.kernels)
            else:
                self.model.set_kernels(attention_in_torch, None)
            self.opt = torch.optim.AdamW(self.model.parameters(), lr=args.lr, weight_decay=0.0)
        self.data = batches(cfg, args.seed + 1, self.device)
        self.admin = regen.Client(args.socket) if self.rt is not None else None
        self.rdev = self.rt.runtime().regend_device(self.device) if self.rt is not None else None

    def scope(self):
        scope = contextlib.ExitStack()
        if self.rt is not None and self.device.type == "cuda":
            if hasattr(torch.autograd, "set_multithreading_enabled"):
                scope.enter_context(torch.autograd.set_multithreading_enabled(False))
            if not self.args.no_pool:
                scope.enter_context(self.rt.pool(self.device.index))
        return scope

    def step(self):
        rt, args, device, cfg = self.rt, self.args, self.device, self.cfg
        step = len(self.losses)
        x, y = next(self.data)
        if rt is not None and step == args.restart_at:
            regenctl_restart(self.admin.socket_path, self.rdev)
        if rt is not None and step == args.fault_at:
            self.admin.inject_fault(self.rdev, "device_lost")
        if device.type == "cuda":
            torch.cuda.synchronize(device)
        t0 = time.perf_counter()
        self.started.append(time.time())
        gc_before = GC_CLOCK.snapshot()
        before = rt.stats() if rt is not None else None
        with (rt.enable(devices=(device.type,)) if rt is not None else contextlib.nullcontext()):
            logits = self.model(x)
            loss = F.cross_entropy(logits.float().view(-1, cfg["vocab"]), y.reshape(-1))
            loss.backward()
        self.opt.step()
        self.opt.zero_grad(set_to_none=True)
        value = loss.item()   # synchronises: the step's time includes its GPU work
        self.times.append(time.perf_counter() - t0)
        self.losses.append(value)
        gc_after = GC_CLOCK.snapshot()
        self.gc_ms.append([a - b for a, b in zip(gc_after[0], gc_before[0])])
        self.gc_count.append([a - b for a, b in zip(gc_after[1], gc_before[1])])
        if rt is not None:
            after = rt.stats()
            self.calls.append(after["calls"] - before["calls"])
            self.host_us.append(after["host_us"] - before["host_us"])
            self.reply_us.append(after["reply_us"] - before["reply_us"])
            self.flush_us.append(after["flush_us"] - before["flush_us"])
            self.doorbells.append(after["doorbells"] - before["doorbells"])
        if device.type == "cuda":
            self.mem_rank.append(torch.cuda.memory_allocated(device))
        if self.admin is not None and (step % 5 == 0 or step == args.steps - 1):
            self.mem_regend.append(regend_memory(self.admin, self.rdev))
        if not args.quiet:
            print(f"{self.mode:6s} step {step:4d}  loss {value:.4f}  {self.tokens / self.times[-1]:10.0f} tok/s",
                  flush=True)

    def result(self):
        if self.admin is not None:
            self.admin.close()
            self.admin = None
        times = self.times
        first = min(len(times) - 1, 3)
        steady = times[first:] or times
        out = {"mode": self.mode, "losses": self.losses, "step_s": times, "step_started_unix": self.started,
               "tokens_per_s": self.tokens * len(steady) / sum(steady), "tokens_per_step": self.tokens,
               "rank_memory": self.mem_rank, "regend_memory": self.mem_regend, "calls_per_step": self.calls,
               "gc_ms": self.gc_ms, "gc_count": self.gc_count,
               "gc_ms_per_step": sum(map(sum, self.gc_ms[first:])) / max(len(self.gc_ms[first:]), 1)}
        if self.rt is not None:
            out["stats"] = self.rt.stats()
            # The rank's host time per step inside regen.torch's calls, the
            # part of it waiting for the client call's reply, and collecting
            # queued answers at a run's end (steady steps); per step too, to
            # tell which part grows in a slow step.
            for key, xs in (("host", self.host_us), ("reply", self.reply_us), ("flush", self.flush_us)):
                out[f"regen_{key}_ms_per_step"] = sum(xs[first:]) / 1e3 / max(len(xs[first:]), 1)
                out[f"regen_{key}_us"] = xs
            # Records that found regend's worker asleep, per step.
            out["doorbells"] = self.doorbells
            out["steps"] = len(self.losses)
        return out


class GcClock:
    """Time in Python's cyclic garbage collector, by generation (gc.callbacks):
    a step's Python work that allocates more collects more often, and a
    full collection walks every tracked object of the process."""

    def __init__(self):
        self.ms = [0.0, 0.0, 0.0]
        self.count = [0, 0, 0]
        self._started = None
        gc.callbacks.append(self._on)

    def _on(self, phase, info):
        if phase == "start":
            self._started = time.perf_counter()
        elif self._started is not None:
            g = info.get("generation", 2)
            self.ms[g] += (time.perf_counter() - self._started) * 1e3
            self.count[g] += 1
            self._started = None

    def snapshot(self):
        return list(self.ms), list(self.count)


GC_CLOCK = GcClock()


def frozen_if_asked(args):
    if args.gc_freeze:
        gc.collect()
        gc.freeze()


def train(cfg, mode, args):
    t = Trainer(cfg, mode, args)
    frozen_if_asked(args)
    with t.scope():
        for _ in range(args.steps):
            t.step()
    return t.result()


def train_interleaved(cfg, args):
    """Both modes in this process, taking turns of --turn steps: machine
    noise that lasts longer than a turn (a shared host's CPUs, clocks) falls
    on both, where runs in separate processes, one after the other, each
    meet their own. Returns both runs and, per pair of turns past the first
    (warm-up), the in-process turn's time over the regend turn's."""
    trainers = {mode: Trainer(cfg, mode, args) for mode in ("torch", "regend")}
    frozen_if_asked(args)
    turn_ratios = []
    while len(trainers["regend"].times) < args.steps:
        n = min(args.turn, args.steps - len(trainers["regend"].times))
        took = {}
        for mode, t in trainers.items():
            with t.scope():
                for _ in range(n):
                    t.step()
            took[mode] = sum(t.times[-n:])
        if len(trainers["regend"].times) > n or args.steps <= args.turn:
            turn_ratios.append(took["torch"] / took["regend"])
    runs = {mode: t.result() for mode, t in trainers.items()}
    return runs, turn_ratios


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--mode", choices=("regend", "torch", "both", "interleaved"), default="regend",
                   help="both: in process, then through regend; interleaved: the two in turns of --turn steps, in "
                        "one process")
    p.add_argument("--turn", type=int, default=5, help="--mode interleaved: steps in each turn (default 5)")
    p.add_argument("--small", action="store_true", help="a quick model: %s" % SMALL)
    for key in FULL:
        p.add_argument("--" + key, type=int, help="default %d (--small: %d)" % (FULL[key], SMALL[key]))
    p.add_argument("--steps", type=int, default=30)
    p.add_argument("--lr", type=float, default=3e-4)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--device", default="cuda:0")
    p.add_argument("--dtype", choices=sorted(DTYPES), default="bf16")
    p.add_argument("--socket", default=None, help="regend's socket (default $REGEN_SOCKET, then /run/regen/regend.sock)")
    p.add_argument("--ordering", choices=("wait", "events", "sync", "auto"), default=None)
    p.add_argument("--restart-at", type=int, default=-1, help="step before which `regenctl restart --wait` runs")
    p.add_argument("--fault-at", type=int, default=-1, help="step before which a device_lost is injected")
    p.add_argument("--no-pool", action="store_true", help="leave memory to torch's allocator (block imports)")
    p.add_argument("--kernels", choices=("stack", "block", "parts"), default="stack",
                   help="regend mode: all transformer blocks as one operation (rt.transformer_blocks), each block as "
                        "one (rt.transformer_block, LayerNorms in regend), or each as its parts (rt.attention_packed, "
                        "rt.mlp, linears; LayerNorms on the rank)")
    p.add_argument("--gc-freeze", action="store_true",
                   help="after the models are built, move every object then alive out of the garbage collector's "
                        "reach (gc.freeze()), as long training runs do: full collections then walk what the steps "
                        "make, not the whole process")
    p.add_argument("--json", help="write the results here")
    p.add_argument("--quiet", action="store_true")
    args = p.parse_args(argv)
    cfg = dict(SMALL if args.small else FULL)
    for key in FULL:
        if getattr(args, key) is not None:
            cfg[key] = getattr(args, key)
    args.socket = args.socket or os.environ.get("REGEN_SOCKET") or regen.DEFAULT_SOCKET
    modes = ("torch", "regend") if args.mode in ("both", "interleaved") else (args.mode,)
    results = {"config": cfg, "args": {k: v for k, v in vars(args).items()}, "runs": {}}
    if args.mode == "interleaved":
        results["runs"], results["turn_ratios"] = train_interleaved(cfg, args)
        results["turn_ratio_median"] = statistics.median(results["turn_ratios"])
    else:
        for mode in modes:
            results["runs"][mode] = train(cfg, mode, args)
    for mode, r in results["runs"].items():
        print(f"{mode}: {len(r['losses'])} steps, loss {r['losses'][0]:.4f} -> {r['losses'][-1]:.4f}, "
              f"{r['tokens_per_s']:.0f} tokens/s")
    if len(modes) == 2:
        a, b = results["runs"]["torch"], results["runs"]["regend"]
        worst = max(abs(x - y) for x, y in zip(a["losses"], b["losses"]))
        results["max_loss_difference"] = worst
        results["throughput_ratio"] = b["tokens_per_s"] / a["tokens_per_s"]
        print(f"largest loss difference {worst:.4g}; regend/torch throughput {results['throughput_ratio']:.3f}")
        if "turn_ratios" in results:
            print(f"in turns of {args.turn} steps: median of the turns' ratios {results['turn_ratio_median']:.3f} "
                  f"({len(results['turn_ratios'])} pairs of turns)")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(results, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
