# SPDX-License-Identifier: Apache-2.0
"""Models written the way their users write them, for the compile
benchmark and tests: build(name, ...) -> (module, batch maker)."""

import torch

from .encoder import EncoderLM
from .gpt import GPT
from .llama import Llama

MODELS = {"gpt": GPT, "llama": Llama, "encoder": EncoderLM}

# The benchmark's shape (bench_compile.py's defaults, the soak's and the
# gradients' test's): width, layers, sequence, batch and nanoGPT's padded
# vocabulary.
BENCH_D, BENCH_LAYERS, BENCH_SEQ, BENCH_BATCH, BENCH_VOCAB = 1024, 4, 1024, 8, 50304


def build(name, vocab, seq, d, layers, heads, device="cuda", dtype=torch.bfloat16, seed=0):
    torch.manual_seed(seed)
    model = MODELS[name](vocab, seq, d, layers, heads)
    return model.to(device=device, dtype=dtype)


def batch(vocab, batch_size, seq, step, device="cuda"):
    """Fixed data per step: the same for every path compared."""
    g = torch.Generator(device="cpu").manual_seed(1000 + step)
    idx = torch.randint(0, vocab, (batch_size, seq + 1), generator=g)
    return idx[:, :-1].to(device), idx[:, 1:].contiguous().to(device)


# The data a model memorises (the soak's and the gradients' test's): this
# many fixed batches in turn, of the vocabulary's first MEMORISED_IDS ids,
# so that the loss falls from ln(vocab) to below ln(MEMORISED_IDS), then on.
MEMORISED_BATCHES, MEMORISED_IDS = 8, 1024


def memorised_batch(vocab, batch_size, seq, step, device="cuda"):
    idx, tgt = batch(vocab, batch_size, seq, step % MEMORISED_BATCHES, device)
    return idx % MEMORISED_IDS, tgt % MEMORISED_IDS
