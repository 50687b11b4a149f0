# SPDX-License-Identifier: Apache-2.0
"""A Llama-style decoder as its users write it (RMSNorm, rotary embeddings
with rotate_half, SwiGLU, grouped-query attention): no regen in it."""

import torch
import torch.nn as nn
import torch.nn.functional as F


class RMSNorm(nn.Module):
    def __init__(self, d, eps=1e-6):
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(d))

    def forward(self, x):
        h = x.float()
        h = h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + self.eps)
        return h.type_as(x) * self.weight


def rotate_half(x):
    x1, x2 = x[..., : x.shape[-1] // 2], x[..., x.shape[-1] // 2:]
    return torch.cat((-x2, x1), dim=-1)


def rotary_tables(seq, head_dim, base=10000.0):
    inv = 1.0 / (base ** (torch.arange(0, head_dim, 2).float() / head_dim))
    freqs = torch.outer(torch.arange(seq).float(), inv)
    emb = torch.cat((freqs, freqs), dim=-1)
    return emb.cos(), emb.sin()


class Attention(nn.Module):
    def __init__(self, d, heads, kv_heads):
        super().__init__()
        self.heads, self.kv_heads, self.head_dim = heads, kv_heads, d // heads
        self.wq = nn.Linear(d, heads * self.head_dim, bias=False)
        self.wk = nn.Linear(d, kv_heads * self.head_dim, bias=False)
        self.wv = nn.Linear(d, kv_heads * self.head_dim, bias=False)
        self.wo = nn.Linear(heads * self.head_dim, d, bias=False)

    def forward(self, x, cos, sin):
        B, T, _ = x.shape
        q = self.wq(x).view(B, T, self.heads, self.head_dim).transpose(1, 2)
        k = self.wk(x).view(B, T, self.kv_heads, self.head_dim).transpose(1, 2)
        v = self.wv(x).view(B, T, self.kv_heads, self.head_dim).transpose(1, 2)
        q = q * cos + rotate_half(q) * sin
        k = k * cos + rotate_half(k) * sin
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=True)
        return self.wo(y.transpose(1, 2).reshape(B, T, -1))


class FeedForward(nn.Module):
    def __init__(self, d, hidden):
        super().__init__()
        self.w1 = nn.Linear(d, hidden, bias=False)
        self.w2 = nn.Linear(hidden, d, bias=False)
        self.w3 = nn.Linear(d, hidden, bias=False)

    def forward(self, x):
        return self.w2(F.silu(self.w1(x)) * self.w3(x))


class Layer(nn.Module):
    def __init__(self, d, heads, kv_heads, hidden):
        super().__init__()
        self.attention_norm = RMSNorm(d)
        self.attention = Attention(d, heads, kv_heads)
        self.ffn_norm = RMSNorm(d)
        self.feed_forward = FeedForward(d, hidden)

    def forward(self, x, cos, sin):
        h = x + self.attention(self.attention_norm(x), cos, sin)
        return h + self.feed_forward(self.ffn_norm(h))


class Llama(nn.Module):
    def __init__(self, vocab, seq, d, layers, heads, kv_heads=None):
        super().__init__()
        kv_heads = kv_heads or max(1, heads // 4)
        hidden = 256 * ((int(8 * d / 3) + 255) // 256)
        self.tok_embeddings = nn.Embedding(vocab, d)
        self.layers = nn.ModuleList([Layer(d, heads, kv_heads, hidden) for _ in range(layers)])
        self.norm = RMSNorm(d)
        self.output = nn.Linear(d, vocab, bias=False)
        cos, sin = rotary_tables(seq, d // heads)
        self.register_buffer("cos", cos, persistent=False)
        self.register_buffer("sin", sin, persistent=False)
        for p in self.parameters():
            if p.dim() == 2:
                nn.init.normal_(p, std=0.02)

    def forward(self, idx, targets):
        T = idx.shape[1]
        cos, sin = self.cos[:T].to(self.output.weight.dtype), self.sin[:T].to(self.output.weight.dtype)
        h = self.tok_embeddings(idx)
        for layer in self.layers:
            h = layer(h, cos, sin)
        logits = self.output(self.norm(h)).float()
        return F.cross_entropy(logits.view(-1, logits.size(-1)), targets.view(-1))
