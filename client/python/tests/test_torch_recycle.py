# SPDX-License-Identifier: Apache-2.0
"""A compiled graph's kept outputs (options={"recycle": True},
regen.torch._compile): a segment's outputs are written again into a kept
set only once nothing but the graph holds any of it; two sets at most are
kept, the older let go; without recycle nothing is kept.  The storage use
count is torch's (torch 2.x's _storage_Use_Count, which Debian's 1.13 does
not have): here a count the test sets, for the choice alone."""

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
    def __init__(self, index):
        self.index = index


@unittest.skipIf(torch is None, "needs torch")
class RecycleTest(unittest.TestCase):
    def setUp(self):
        from regen.torch import _compile
        self.c = _compile
        self.counts = {}
        self.saved = (_compile._use_count, _compile._storage_ref)
        _compile._use_count = self.counts.__getitem__
        _compile._storage_ref = id
        self.g = _compile.CompiledGraph.__new__(_compile.CompiledGraph)
        self.g.kept_outputs = {}

    def tearDown(self):
        self.c._use_count, self.c._storage_ref = self.saved

    def keep(self, seg, n=2):
        roots = {f"s{i}": torch.zeros(3) for i in range(n)}
        self.g._keep_outputs(seg, roots)
        for t in roots.values():
            self.counts[id(t)] = 1
        return roots

    def test_a_set_is_used_again_once_nothing_else_holds_any_of_it(self):
        seg = _Segment(0)
        self.assertIsNone(self.g._kept_outputs_of(seg))
        roots = self.keep(seg)
        # One of its outputs still held (a gradient the optimizer has not let go).
        self.counts[id(roots["s1"])] = 2
        self.assertIsNone(self.g._kept_outputs_of(seg))
        self.counts[id(roots["s1"])] = 1
        self.assertIs(self.g._kept_outputs_of(seg), roots)
        # Another segment's sets are its own.
        self.assertIsNone(self.g._kept_outputs_of(_Segment(1)))

    def test_two_sets_at_most_the_older_let_go(self):
        seg = _Segment(0)
        first, second, third = self.keep(seg), self.keep(seg), self.keep(seg)
        self.assertEqual([r for r, _ in self.g.kept_outputs[0]], [second, third])
        for t in list(second.values()) + list(third.values()):
            self.counts[id(t)] = 2
        self.assertIsNone(self.g._kept_outputs_of(seg), "the first set was let go, not used again")
        self.counts[id(third["s0"])] = self.counts[id(third["s1"])] = 1
        self.assertIs(self.g._kept_outputs_of(seg), third)
        del first

    def test_without_recycle_nothing_is_kept(self):
        self.g.kept_outputs = None
        seg = _Segment(0)
        self.g._keep_outputs(seg, {"s0": torch.zeros(1)})
        self.assertIsNone(self.g._kept_outputs_of(seg))


if __name__ == "__main__":
    unittest.main()
