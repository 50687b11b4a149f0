#!/usr/bin/env python3
# SPDX-License-Identifier: Apache-2.0
"""Train a small GPT with torch.compile(model, backend="regen"): the model
is plain PyTorch (nanoGPT's), the only regen line is the backend's name.
regend must be running (REGEN_SOCKET, default /run/regen/regend.sock).

    REGEN_TORCH_POOL=process REGEN_TORCH_ORDERING=events \\
        python3 client/python/examples/train_compile.py [--steps 50] [--dim 512]

Prints the loss per step, then what ran in regend and what stayed on the
rank (rt.explain()) and the runtime's counters (hand-offs, program Runs).
"""

import argparse
import math
import time

import torch
import torch.nn as nn
import torch.nn.functional as F

import regen.torch as rt


class Block(nn.Module):
    def __init__(self, d, heads):
        super().__init__()
        self.ln_1, self.ln_2 = nn.LayerNorm(d), nn.LayerNorm(d)
        self.c_attn, self.c_proj = nn.Linear(d, 3 * d), nn.Linear(d, d)
        self.c_fc, self.c_out = nn.Linear(d, 4 * d), nn.Linear(4 * d, d)
        self.heads = heads

    def forward(self, x):
        B, T, C = x.shape
        q, k, v = self.c_attn(self.ln_1(x)).split(C, dim=2)
        q, k, v = (t.view(B, T, self.heads, C // self.heads).transpose(1, 2) for t in (q, k, v))
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        x = x + self.c_proj(y.transpose(1, 2).contiguous().view(B, T, C))
        return x + self.c_out(F.gelu(self.c_fc(self.ln_2(x)), approximate="tanh"))


class GPT(nn.Module):
    def __init__(self, vocab, seq, d, layers, heads):
        super().__init__()
        self.wte, self.wpe = nn.Embedding(vocab, d), nn.Embedding(seq, d)
        self.blocks = nn.ModuleList(Block(d, heads) for _ in range(layers))
        self.ln_f = nn.LayerNorm(d)
        self.lm_head = nn.Linear(d, vocab, bias=False)
        self.wte.weight = self.lm_head.weight
        for p in self.parameters():
            if p.dim() == 2:
                nn.init.normal_(p, std=0.02 / math.sqrt(2 * layers))

    def forward(self, idx, targets):
        pos = torch.arange(idx.shape[1], device=idx.device)
        x = self.wte(idx) + self.wpe(pos)
        for block in self.blocks:
            x = block(x)
        logits = self.lm_head(self.ln_f(x))
        return F.cross_entropy(logits.view(-1, logits.size(-1)), targets.view(-1))


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--steps", type=int, default=50)
    ap.add_argument("--dim", type=int, default=512)
    ap.add_argument("--layers", type=int, default=4)
    ap.add_argument("--seq", type=int, default=512)
    ap.add_argument("--batch", type=int, default=8)
    ap.add_argument("--vocab", type=int, default=50304)
    args = ap.parse_args()
    torch.manual_seed(0)
    model = GPT(args.vocab, args.seq, args.dim, args.layers, args.dim // 64).cuda().to(torch.bfloat16)
    optimizer = torch.optim.AdamW(model.parameters(), lr=3e-4, fused=True)
    compiled = torch.compile(model, backend="regen", dynamic=False)
    # A fixed little corpus: the loss must fall.
    data = torch.randint(0, args.vocab, (args.batch * 4, args.seq + 1), device="cuda")
    t0 = time.perf_counter()
    for step in range(args.steps):
        chunk = data[(step % 4) * args.batch:(step % 4 + 1) * args.batch]
        optimizer.zero_grad(set_to_none=True)
        loss = compiled(chunk[:, :-1], chunk[:, 1:])
        loss.backward()
        optimizer.step()
        if step % 10 == 0 or step == args.steps - 1:
            print(f"step {step}: loss {loss.item():.4f}")
    torch.cuda.synchronize()
    dt = time.perf_counter() - t0
    print(f"{args.steps * args.batch * args.seq / dt:.0f} tokens/s (compile included)")
    rt.explain()
    s = rt.stats()
    print({k: s[k] for k in ("program_runs", "program_defines", "handoffs", "rank_steps", "fallback_segments",
                             "retries")})


if __name__ == "__main__":
    main()
