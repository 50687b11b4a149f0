#!/usr/bin/env python3
"""A GPT trained on synthetic data whose GEMMs and attention all run in
regend (regen.torch), or in process for comparison, through a restart and
an injected fault.

    # the model of issue 13: 8 layers, width 2048, 16 heads, sequence 2048, bf16
    python3 client/python/examples/train_gpt.py --mode regend --steps 50
    # a quick run, and the same model in process, losses side by side
    python3 client/python/examples/train_gpt.py --small --mode both --steps 30 \\
        --restart-at 10 --fault-at 20 --json /tmp/gpt.json
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
import json
import math
import os
import shutil
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


def train(cfg, mode, args):
    device = torch.device(args.device)
    dtype = DTYPES[args.dtype]
    through_regend = mode == "regend"
    rt = None
    scope = contextlib.ExitStack()
    if through_regend:
        import regen.torch as rt
        rt.configure(socket=args.socket, ordering=args.ordering)
        if device.type == "cuda":
            if hasattr(torch.autograd, "set_multithreading_enabled"):
                scope.enter_context(torch.autograd.set_multithreading_enabled(False))
            if not args.no_pool:
                scope.enter_context(rt.pool(device.index))
    with scope:
        torch.manual_seed(args.seed)
        model = GPT(**cfg).to(device=device, dtype=dtype)
        if through_regend:
            model.use_regend(rt, args.kernels)
        else:
            model.set_kernels(attention_in_torch, None)
        opt = torch.optim.AdamW(model.parameters(), lr=args.lr, weight_decay=0.0)
        data = batches(cfg, args.seed + 1, device)
        admin = regen.Client(args.socket) if through_regend else None
        rdev = rt.runtime().regend_device(device) if through_regend else None
        losses, times, mem_rank, mem_regend, calls, host_us, reply_us, flush_us = [], [], [], [], [], [], [], []
        started = []   # wall clock at each step's start, to line steps up with other records
        tokens = cfg["batch"] * cfg["seq"]
        for step in range(args.steps):
            x, y = next(data)
            if through_regend and step == args.restart_at:
                regenctl_restart(admin.socket_path, rdev)
            if through_regend and step == args.fault_at:
                admin.inject_fault(rdev, "device_lost")
            if device.type == "cuda":
                torch.cuda.synchronize(device)
            t0 = time.perf_counter()
            started.append(time.time())
            before = rt.stats() if through_regend else None
            with (rt.enable(devices=(device.type,)) if through_regend else contextlib.nullcontext()):
                logits = model(x)
                loss = F.cross_entropy(logits.float().view(-1, cfg["vocab"]), y.reshape(-1))
                loss.backward()
            opt.step()
            opt.zero_grad(set_to_none=True)
            value = loss.item()   # synchronises: the step's time includes its GPU work
            times.append(time.perf_counter() - t0)
            losses.append(value)
            if through_regend:
                after = rt.stats()
                calls.append(after["calls"] - before["calls"])
                host_us.append(after["host_us"] - before["host_us"])
                reply_us.append(after["reply_us"] - before["reply_us"])
                flush_us.append(after["flush_us"] - before["flush_us"])
            if device.type == "cuda":
                mem_rank.append(torch.cuda.memory_allocated(device))
            if admin is not None and (step % 5 == 0 or step == args.steps - 1):
                mem_regend.append(regend_memory(admin, rdev))
            if not args.quiet:
                print(f"{mode:6s} step {step:4d}  loss {value:.4f}  {tokens / times[-1]:10.0f} tok/s", flush=True)
        if admin is not None:
            admin.close()
    steady = times[min(len(times) - 1, 3):] or times
    out = {"mode": mode, "losses": losses, "step_s": times, "step_started_unix": started,
           "tokens_per_s": tokens * len(steady) / sum(steady), "tokens_per_step": tokens,
           "rank_memory": mem_rank, "regend_memory": mem_regend, "calls_per_step": calls}
    if through_regend:
        st = rt.stats()
        out["stats"] = st
        # The rank's host time per step inside regen.torch's calls, the
        # part of it waiting for the client call's reply, and collecting
        # queued answers at a run's end (steady steps).
        first = min(len(times) - 1, 3)
        out["regen_host_ms_per_step"] = sum(host_us[first:]) / 1e3 / max(len(host_us[first:]), 1)
        out["regen_reply_ms_per_step"] = sum(reply_us[first:]) / 1e3 / max(len(reply_us[first:]), 1)
        out["regen_flush_ms_per_step"] = sum(flush_us[first:]) / 1e3 / max(len(flush_us[first:]), 1)
        # Per step too, beside step_s: which part grows in a slow step.
        out["regen_host_us"], out["regen_reply_us"], out["regen_flush_us"] = host_us, reply_us, flush_us
        out["steps"] = len(losses)
    return out


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--mode", choices=("regend", "torch", "both"), default="regend")
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
    p.add_argument("--json", help="write the results here")
    p.add_argument("--quiet", action="store_true")
    args = p.parse_args(argv)
    cfg = dict(SMALL if args.small else FULL)
    for key in FULL:
        if getattr(args, key) is not None:
            cfg[key] = getattr(args, key)
    args.socket = args.socket or os.environ.get("REGEN_SOCKET") or regen.DEFAULT_SOCKET
    modes = ("torch", "regend") if args.mode == "both" else (args.mode,)
    results = {"config": cfg, "args": {k: v for k, v in vars(args).items()}, "runs": {}}
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
    if args.json:
        with open(args.json, "w") as f:
            json.dump(results, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
