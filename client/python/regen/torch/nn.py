# SPDX-License-Identifier: Apache-2.0
"""nn.Module layers whose forward and backward run in regend, where users
of Transformer Engine look for them (te.Linear, te.LayerNorm,
te.TransformerLayer):

    import regen.torch as rt
    fc = rt.nn.Linear(2048, 8192, device="cuda", dtype=torch.bfloat16)
    norm = rt.nn.LayerNorm(2048, device="cuda", dtype=torch.bfloat16)
    block = rt.nn.TransformerLayer(2048, 8192, 16, device="cuda", params_dtype=torch.bfloat16)

Linear and LayerNorm are torch.nn.Linear and torch.nn.LayerNorm (their
parameters, initialisation, state_dict and repr), with forward through
regen.torch's linear and layer_norm: eager, one regend call each way (the
backward's gradients one run of calls).  TransformerLayer is a
pre-LayerNorm GPT block as te.TransformerLayer builds one by default
(causal self-attention, GELU with the tanh approximation, residuals around
both halves) on regen.torch.transformer_block: forward and backward each
one run of regend calls.  Inside torch.autocast they take their inputs in
the dtype torch's own layers would (regen/torch/_autocast.py).

What regend does not take raises regen.torch.NotSupported: float64, and
in TransformerLayer dropout, masks other than causal and activations other
than GELU.  A layer that needs another GEMM (FP8, regen.torch.fp8) is a
subclass that overrides ``forward``.
"""

from typing import Optional, Sequence, Union

import torch

from ._block import transformer_blocks
from ._norm import layer_norm
from ._ops import linear
from ._runtime import NotSupported

__all__ = ["Linear", "LayerNorm", "TransformerLayer"]


class Linear(torch.nn.Linear):
    """torch.nn.Linear (y = x @ weight.T + bias) computed in regend."""

    def forward(self, input: torch.Tensor) -> torch.Tensor:
        return linear(input, self.weight, self.bias)


class LayerNorm(torch.nn.LayerNorm):
    """torch.nn.LayerNorm over the last dimensions, computed in regend
    (statistics in float32)."""

    def forward(self, input: torch.Tensor) -> torch.Tensor:
        return layer_norm(input, self.normalized_shape, self.weight, self.bias, self.eps)


class TransformerLayer(torch.nn.Module):
    """A pre-LayerNorm transformer layer, te.TransformerLayer's defaults:

        h = x + proj(attention(qkv(ln1(x))))       causal, num_attention_heads heads
        y = h + down(gelu(up(ln2(h))))             GELU with the tanh approximation

    ``hidden_size`` (W) must be a multiple of ``num_attention_heads``;
    ``ffn_hidden_size`` is the MLP's width.  ``attn_input_format``: "sbhd"
    (te's default: x is [S, B, W]) or "bshd" ([B, S, W], no copy on the
    rank).  The parameters are the submodules ln1, qkv, proj, ln2, up and
    down (LayerNorm and Linear above; qkv's output is q, k and v side by
    side, each split into heads as torch.nn.MultiheadAttention's in_proj
    does), in ``params_dtype`` on ``device``.  Dropout must be 0 and the
    mask causal: regend's fused block has neither dropout nor other masks."""

    def __init__(self, hidden_size: int, ffn_hidden_size: int, num_attention_heads: int,
                 layernorm_epsilon: float = 1e-5, hidden_dropout: float = 0.0, attention_dropout: float = 0.0,
                 self_attn_mask_type: str = "causal", bias: bool = True, activation: str = "gelu",
                 attn_input_format: str = "sbhd", params_dtype: Optional[torch.dtype] = None,
                 device: Optional[Union[torch.device, str]] = None) -> None:
        super().__init__()
        if hidden_size % num_attention_heads:
            raise ValueError(f"TransformerLayer: hidden_size {hidden_size} is not a multiple of "
                             f"{num_attention_heads} heads")
        for name, value in (("hidden_dropout", hidden_dropout), ("attention_dropout", attention_dropout)):
            if value:
                raise NotSupported(parameters={"message": f"regen.torch.nn.TransformerLayer: {name} must be 0 "
                                                          "(regend's fused block has no dropout)"})
        if self_attn_mask_type != "causal":
            raise NotSupported(parameters={"message": "regen.torch.nn.TransformerLayer: self_attn_mask_type must "
                                                      f"be 'causal', not {self_attn_mask_type!r}"})
        if activation != "gelu":
            raise NotSupported(parameters={"message": "regen.torch.nn.TransformerLayer: activation must be 'gelu' "
                                                      f"(tanh approximation), not {activation!r}"})
        if not bias:
            raise NotSupported(parameters={"message": "regen.torch.nn.TransformerLayer: bias must be True "
                                                      "(regend's fused block adds every bias)"})
        if attn_input_format not in ("sbhd", "bshd"):
            raise ValueError(f"TransformerLayer: attn_input_format {attn_input_format!r} is not 'sbhd' or 'bshd'")
        self.hidden_size = hidden_size
        self.ffn_hidden_size = ffn_hidden_size
        self.num_attention_heads = num_attention_heads
        self.layernorm_epsilon = layernorm_epsilon
        self.attn_input_format = attn_input_format
        dev, dt = device, params_dtype
        self.ln1 = LayerNorm(hidden_size, eps=layernorm_epsilon, device=dev, dtype=dt)
        self.qkv = Linear(hidden_size, 3 * hidden_size, device=dev, dtype=dt)
        self.proj = Linear(hidden_size, hidden_size, device=dev, dtype=dt)
        self.ln2 = LayerNorm(hidden_size, eps=layernorm_epsilon, device=dev, dtype=dt)
        self.up = Linear(hidden_size, ffn_hidden_size, device=dev, dtype=dt)
        self.down = Linear(ffn_hidden_size, hidden_size, device=dev, dtype=dt)

    def parameters_in_order(self) -> Sequence[torch.Tensor]:
        """The 12 parameters in regen.torch.BLOCK_PARAMETERS order."""
        return (self.ln1.weight, self.ln1.bias, self.qkv.weight, self.qkv.bias, self.proj.weight, self.proj.bias,
                self.ln2.weight, self.ln2.bias, self.up.weight, self.up.bias, self.down.weight, self.down.bias)

    def forward(self, hidden_states: torch.Tensor) -> torch.Tensor:
        if hidden_states.dim() != 3:
            raise ValueError(f"TransformerLayer takes [S, B, W] ('sbhd') or [B, S, W] ('bshd'), got "
                             f"{list(hidden_states.shape)}")
        x = hidden_states.transpose(0, 1) if self.attn_input_format == "sbhd" else hidden_states
        y = transformer_blocks(x, [self.parameters_in_order()], self.num_attention_heads, self.layernorm_epsilon)
        return y.transpose(0, 1) if self.attn_input_format == "sbhd" else y

    def extra_repr(self) -> str:
        return (f"hidden_size={self.hidden_size}, ffn_hidden_size={self.ffn_hidden_size}, "
                f"num_attention_heads={self.num_attention_heads}, attn_input_format={self.attn_input_format!r}")
