# SPDX-License-Identifier: Apache-2.0
"""torch.nn.TransformerEncoder as a language model (pre-norm, GELU, causal):
no regen in it."""

import torch
import torch.nn as nn
import torch.nn.functional as F


class EncoderLM(nn.Module):
    def __init__(self, vocab, seq, d, layers, heads):
        super().__init__()
        self.embed = nn.Embedding(vocab, d)
        self.pos = nn.Embedding(seq, d)
        layer = nn.TransformerEncoderLayer(d, heads, dim_feedforward=4 * d, dropout=0.0, activation="gelu",
                                           batch_first=True, norm_first=True)
        self.encoder = nn.TransformerEncoder(layer, layers, enable_nested_tensor=False)
        self.norm = nn.LayerNorm(d)
        self.head = nn.Linear(d, vocab, bias=False)
        self.seq = seq

    def forward(self, idx, targets):
        T = idx.shape[1]
        pos = torch.arange(T, device=idx.device)
        x = self.embed(idx) + self.pos(pos)
        mask = nn.Transformer.generate_square_subsequent_mask(T, device=idx.device, dtype=x.dtype)
        x = self.encoder(x, mask=mask, is_causal=True)
        logits = self.head(self.norm(x))
        return F.cross_entropy(logits.view(-1, logits.size(-1)), targets.view(-1))
