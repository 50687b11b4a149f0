# SPDX-License-Identifier: Apache-2.0
"""Traced graphs (ATen ops) written as io.regen.Program segments, without
torch: regen.torch's compiler backend hands its graphs here."""

from .aten import HANDLERS, VIEW_OPS
from . import fp8 as _fp8  # noqa: F401  (regen.torch.fp8's custom ops, into HANDLERS)
from .graph import Const, Graph, Op, RankStep, Segment, Unsupported, Val, contiguous_strides, partition

__all__ = ["HANDLERS", "VIEW_OPS", "Const", "Graph", "Op", "RankStep", "Segment", "Unsupported", "Val",
           "contiguous_strides", "partition"]
