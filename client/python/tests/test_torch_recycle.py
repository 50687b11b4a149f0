# SPDX-License-Identifier: Apache-2.0
"""A compiled graph's kept outputs (options={"recycle": True},
regen.torch._compile): each of a segment's outputs is written again into
a tensor the graph made before once nothing but the graph holds it, one
still held is made anew and the others still come back; two tensors of
each output at most are kept, the older let go; without recycle nothing
is kept.  The storage use count is torch's (torch 2.x's
_storage_Use_Count, which Debian's 1.13 does not have): here a count the
test sets, for the choice alone."""

import os
import sys
import unittest

try:
    import torch
except ImportError:
    torch = None

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.dirname(HERE))
CPU = torch.device("cpu") if torch is not None else None


class _Segment:
    def __init__(self, index, storages=("s0", "s1")):
        self.index = index
        self.outputs = [(f"out_{s}", "f32", (3,), s) for s in storages]


@unittest.skipIf(torch is None, "needs torch")
class RecycleTest(unittest.TestCase):
    def setUp(self):
        from regen.torch import _compile
        self.c = _compile
        self.counts = {}
        self.saved = (_compile._use_count, _compile._storage_ref)
        # A tensor the test has not let go is held by the caller too.
        _compile._use_count = lambda ref: self.counts.get(ref, 2)
        _compile._storage_ref = id
        self.g = _compile.CompiledGraph.__new__(_compile.CompiledGraph)
        self.g.kept_outputs = {}
        self.g.recycled = _compile._recycle_counts()

    def tearDown(self):
        self.c._use_count, self.c._storage_ref = self.saved

    def call(self, seg):
        return self.g._outputs_of(seg, CPU)

    def free(self, *tensors):
        for t in tensors:
            self.counts[id(t)] = 1

    def test_an_output_is_used_again_once_nothing_else_holds_it(self):
        seg = _Segment(0)
        first = self.call(seg)
        self.assertEqual(set(first), {"s0", "s1"})
        self.assertIsNot(first["s0"], first["s1"])
        # Both still held (the step that reads them is not over): new ones.
        second = self.call(seg)
        self.assertIsNot(second["s0"], first["s0"])
        self.assertIsNot(second["s1"], first["s1"])
        # s0 let go, s1 still held (a loss the caller keeps): s0 comes back alone.
        self.free(first["s0"])
        third = self.call(seg)
        self.assertIs(third["s0"], first["s0"])
        self.assertIsNot(third["s1"], first["s1"])
        self.assertIsNot(third["s1"], second["s1"])
        self.assertEqual(third["s1"].shape, (3,))
        # What report() says of it: one written again, five made, and the
        # kept ones found held, by their use count (the test's 2).
        self.assertEqual(self.g.recycled["reused"], 1)
        self.assertEqual(self.g.recycled["made"], 5)
        self.assertEqual(self.g.recycled["held"], {2: 4})
        # Another segment's outputs are its own.
        self.free(*second.values())
        other = self.call(_Segment(1))
        self.assertNotIn(id(other["s0"]), {id(t) for t in (first["s0"], second["s0"])})

    def test_two_of_each_output_at_most_the_older_let_go(self):
        seg = _Segment(0, ("s0",))
        first, second, third = (self.call(seg)["s0"] for _ in range(3))
        self.assertEqual([t for t, _ in self.g.kept_outputs[(0, "s0")]], [second, third])
        self.free(first)
        again = self.call(seg)["s0"]
        self.assertIsNot(again, first, "the first was let go, not used again")
        self.free(third)
        self.assertIs(self.call(seg)["s0"], third)

    def test_outputs_sharing_a_storage_are_one_tensor(self):
        seg = _Segment(0, ("s0",))
        seg.outputs.append(("out_view", "f32", (3,), "s0"))
        roots = self.call(seg)
        self.assertEqual(list(roots), ["s0"])

    def test_without_recycle_nothing_is_kept(self):
        self.g.kept_outputs = None
        seg = _Segment(0)
        first = self.call(seg)
        self.free(*first.values())
        second = self.call(seg)
        self.assertIsNot(second["s0"], first["s0"])
        self.assertIsNone(self.g.kept_outputs)


if __name__ == "__main__":
    unittest.main()
