# SPDX-License-Identifier: Apache-2.0
"""A compiled segment's outputs (regen.torch._compile._outputs_of): views of
one allocation, each where the segment's layout puts it, so that a program's
operands come back at the addresses its captured graph was made for.  Each
output has its dtype and shape, starts on the allocator's alignment, and
none overlaps another; writing one leaves the others as they were."""

import os
import sys
import unittest

try:
    import torch
except ImportError:
    torch = None

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.dirname(HERE))


class _Segment:
    def __init__(self, outputs):
        self.outputs = outputs


@unittest.skipIf(torch is None, "needs torch")
class OutputsTest(unittest.TestCase):
    def setUp(self):
        from regen.torch import _compile
        self.c = _compile

    def test_outputs_are_disjoint_aligned_views_of_one_allocation(self):
        g = torch.Generator().manual_seed(int.from_bytes(os.urandom(4), "little"))
        shapes = [tuple(int(d) for d in torch.randint(0, 40, (int(torch.randint(1, 4, (1,), generator=g)),),
                                                      generator=g)) for _ in range(12)]
        dtypes = ["bf16", "f32", "f16", "f32", "f64", "bf16"] * 2
        seg = _Segment([(f"o{i}", dt, shp, f"s{i}") for i, (dt, shp) in enumerate(zip(dtypes, shapes))])
        outs = self.c._outputs_of(seg, torch.device("cpu"))
        self.assertEqual(len(outs), len(shapes))
        base = outs[0].untyped_storage().data_ptr() if hasattr(outs[0], "untyped_storage") \
            else outs[0].storage().data_ptr()
        spans = []
        for t, (_, dt, shp, _) in zip(outs, seg.outputs):
            self.assertEqual(tuple(t.shape), shp)
            self.assertEqual(t.dtype, self.c.TORCH_DTYPES[dt])
            self.assertTrue(t.is_contiguous())
            start = t.data_ptr() - base
            self.assertEqual(start % self.c._OUTPUT_ALIGN, 0)
            spans.append((start, start + t.numel() * t.element_size()))
        spans.sort()
        for (a0, a1), (b0, b1) in zip(spans, spans[1:]):
            self.assertLessEqual(a1, b0, "two outputs overlap")
        # Each written with its own value: every other keeps its own.
        for i, t in enumerate(outs):
            t.fill_(i + 1)
        for i, t in enumerate(outs):
            if t.numel():
                self.assertTrue(bool((t == i + 1).all()), f"output {i} was written by another")

    def test_the_layout_is_kept_and_a_new_allocation_made_each_call(self):
        seg = _Segment([("a", "f32", (3, 5), "s0"), ("b", "bf16", (7,), "s1")])
        first = self.c._outputs_of(seg, torch.device("cpu"))
        layout = seg.output_layout
        second = self.c._outputs_of(seg, torch.device("cpu"))
        self.assertIs(seg.output_layout, layout)
        self.assertEqual(layout[0], 2 * self.c._OUTPUT_ALIGN)
        first[0].fill_(1.0)
        second[0].fill_(2.0)
        self.assertTrue(bool((first[0] == 1.0).all()), "two calls' outputs share memory")


if __name__ == "__main__":
    unittest.main()
