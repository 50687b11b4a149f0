# SPDX-License-Identifier: Apache-2.0
"""regen.lowering (the torch.compile backend's splitting of ATen graphs into
io.regen.Program segments), without torch: graphs built by hand as
AOTAutograd would give them, split, and each segment defined and run on a
real regend (host backend) against float64 references with fresh random
inputs; and what stays on the rank, where, and why."""

import math
import os
import random
import struct
import sys
import unittest

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.dirname(HERE))
sys.path.insert(0, os.path.join(HERE, "..", "..", "..", "tests", "lib"))
import regen  # noqa: E402
from regen.host import HostTensor  # noqa: E402
from regen.lowering import HANDLERS, VIEW_OPS, Graph, Op, RankStep, Segment, Val, contiguous_strides, \
    partition  # noqa: E402
from regend_fixture import Regend, find_regend  # noqa: E402

daemon = None


def setUpModule():
    global daemon
    if find_regend():
        daemon = Regend(devices=1)


def tearDownModule():
    if daemon is not None:
        daemon.stop()


ITEMSIZE = {"f32": 4, "i32": 4, "u8": 1, "bf16": 2, "f16": 2, "e4m3": 1, "e5m2": 1}


def e4m3_value(code):
    """The real value of an E4M3 (fn) byte: sign, 4 exponent bits (bias 7),
    3 mantissa bits; exponent 0 subnormal; 0x7f and 0xff NaN."""
    sign = -1.0 if code & 0x80 else 1.0
    e, m = (code >> 3) & 0xF, code & 7
    if e == 0:
        return sign * m / 8 * 2.0 ** -6
    return sign * (1 + m / 8) * 2.0 ** (e - 7)


class Builder:
    """A graph as AOTAutograd hands it over: tensors with their memory."""

    def __init__(self):
        self.n = 0
        self.ops = []
        self.inputs = []

    def val(self, shape, dtype="f32", of=None, strides=None, offset=0):
        self.n += 1
        shape = tuple(shape)
        size = ITEMSIZE[dtype]
        if of is None:
            return Val(self.n, shape, strides or contiguous_strides(shape), dtype, size, ("mem", self.n),
                       math.prod(shape), offset)
        return Val(self.n, shape, strides or contiguous_strides(shape), dtype, size, of.storage, of.storage_numel,
                   offset)

    def input(self, shape, dtype="f32"):
        v = self.val(shape, dtype)
        self.inputs.append(v)
        return v

    def op(*args, **a):
        # (builder, target, outs): positional only, so that the ATen
        # argument "self" may be given by name.
        builder, target, outs = args
        builder.ops.append(Op(len(builder.ops), target, a, outs))
        return outs[0] if len(outs) == 1 else outs

    def graph(self, outputs):
        return Graph(self.inputs, self.ops, outputs)


class HostRunner:
    """Runs the steps as regen.torch does, with host memory: the rank's
    views by their offsets, each segment defined once and Run."""

    def __init__(self, client, steps, seed=12345):
        self.c, self.steps, self.seed = client, steps, seed
        self.env = {}        # Val id -> (HostTensor holding its memory, element offset)
        self.keep = []

    def tensor(self, numel, dtype):
        t = HostTensor([numel], dtype)
        t.import_into(self.c, 0)
        self.keep.append(t)
        return t

    def give(self, v, values):
        t = self.tensor(v.storage_numel, v.dtype)
        if v.dtype in ("e4m3", "e5m2"):
            os.pwrite(t.fd, bytes(values), 0)      # the bytes themselves
        else:
            t.write(values)
        self.env[v.id] = (t, v.offset)

    def run(self):
        for step in self.steps:
            if isinstance(step, RankStep):
                for op in step.ops:
                    assert op.target in VIEW_OPS, f"the rank would run {op.target}: {step.reasons[op.index]}"
                    src = op.a["self"]
                    for o in op.out_vals():
                        self.env[o.id] = (self.env[src.id][0], o.offset)
                continue
            prog = self.c.define_program(0, step.definition)
            bind, roots = {}, {}
            for name, v in step.inputs:
                t, off = self.env[v.id]
                bind[name] = (t.buffer, off * v.itemsize)
            for name, dtype, shape, storage in step.outputs:
                t = self.tensor(math.prod(shape), dtype)
                roots[storage] = t
                bind[name] = (t.buffer, 0)
            self.c.run_program(prog, bind, {name: float(self.seed) for name in step.scalars} or None)
            for v in step.exports:
                self.env[v.id] = (roots[v.storage], v.offset)
            self.c.drop_program(prog)

    def read(self, v):
        t, off = self.env[v.id]
        flat = t.read()
        out = []
        for idx in range(math.prod(v.shape)):
            at, rest = off, idx
            for d, s in zip(reversed(v.shape), reversed(v.strides)):
                at += (rest % d) * s
                rest //= d
            out.append(flat[at])
        return out

    def close(self):
        for t in self.keep:
            t.close()


def segments(steps):
    return [s for s in steps if isinstance(s, Segment)]


class PartitionTest(unittest.TestCase):
    """Where ops go, without a daemon."""

    def test_views_of_the_ranks_tensors_run_before_the_segment(self):
        g = Builder()
        x, w = g.input((4, 8)), g.input((6, 8))
        wt = g.op("aten.t.default", [g.val((8, 6), of=w, strides=(1, 8))], self=w)
        y = g.op("aten.mm.default", [g.val((4, 6))], self=x, mat2=wt)
        z = g.op("aten.relu.default", [g.val((4, 6))], self=y)
        steps = partition(g.graph([z]), HANDLERS)
        self.assertEqual([type(s).__name__ for s in steps], ["RankStep", "Segment"])
        self.assertIn("rank holds", steps[0].reasons[0])
        seg = steps[1]
        self.assertEqual([n["op"] for n in seg.definition["nodes"]], ["gemm", "relu"])
        kinds = {t["name"]: t["kind"] for t in seg.definition["tensors"]}
        # y is the program's own; z leaves it.
        self.assertEqual(sorted(kinds.values()), ["input", "input", "intermediate", "output", "view"])
        self.assertEqual([v.id for v in seg.exports], [z.id])

    def test_rank_work_reading_the_segment_splits_it_and_other_rank_work_moves_before(self):
        g = Builder()
        x, other = g.input((4, 4)), g.input((2, 4, 4))
        a = g.op("aten.exp.default", [g.val((4, 4))], self=x)
        unrelated = g.op("aten.cumsum.default", [g.val((2, 4, 4))], self=other, dim=1)
        b = g.op("aten.cumsum.default", [g.val((4, 4))], self=a, dim=0)   # reads the segment: a hand-off
        c = g.op("aten.neg.default", [g.val((4, 4))], self=b)
        steps = partition(g.graph([c, unrelated]), HANDLERS)
        shape = [(type(s).__name__, [o.target.split(".")[1] for o in s.ops]) for s in steps]
        self.assertEqual(shape, [("RankStep", ["cumsum"]), ("Segment", ["exp"]), ("RankStep", ["cumsum"]),
                                 ("Segment", ["neg"])])
        self.assertEqual(steps[2].reasons[2], "no program op for aten.cumsum.default")
        # a leaves the first segment for the rank's bmm: an output, not scratch.
        self.assertEqual([v.id for v in steps[1].exports], [a.id])

    def test_unsupported_forms_stay_on_the_rank_with_their_reason(self):
        g = Builder()
        x = g.input((4, 6, 8))
        s = g.op("aten.sum.dim_IntList", [g.val((4, 8))], self=x, dim=[1], keepdim=False)
        d = g.op("aten.div.Tensor_mode", [g.val((4, 6, 8))], self=x, other=x, rounding_mode="floor")
        steps = partition(g.graph([s, d]), HANDLERS)
        self.assertEqual(len(steps), 1)
        self.assertIn("over dims [1]", steps[0].reasons[0])
        self.assertIn("no program op", steps[0].reasons[1])

    def test_a_failed_handler_leaves_nothing_behind(self):
        g = Builder()
        x = g.input((4, 8))
        y = g.op("aten.exp.default", [g.val((4, 8))], self=x)
        bad = g.op("aten.gelu.default", [g.val((4, 8))], self=y, approximate="erfc")
        z = g.op("aten.neg.default", [g.val((4, 8))], self=y)
        steps = partition(g.graph([z, bad]), HANDLERS)
        seg = segments(steps)[0]
        self.assertEqual([n["op"] for n in seg.definition["nodes"]], ["exp"])
        names = [t["name"] for t in seg.definition["tensors"]]
        self.assertEqual(len(names), len(set(names)))


class _HostCase(unittest.TestCase):
    """A client of the test's regend (host backend) and fresh random
    inputs for each case."""

    def setUp(self):
        self.c = regen.Client(daemon.socket, timeout=60)
        self.rng = random.Random(self.id() + str(os.getpid()))

    def tearDown(self):
        self.c.close()

    def rand(self, n, lo=-1.0, hi=1.0):
        return [self.rng.uniform(lo, hi) for _ in range(n)]


@unittest.skipIf(not find_regend(), "no regend (pass --regend or set REGEN_BUILD_ROOT)")
class HostRunTest(_HostCase):
    """Segments run on regend's host backend against float64."""

    def close(self, got, want, tol, what):
        self.assertEqual(len(got), len(want), what)
        for i, (a, b) in enumerate(zip(got, want)):
            self.assertLessEqual(abs(a - b), tol * (1 + abs(b)), f"{what}[{i}]: {a} != {b}")

    def test_linear_gelu_loss_forward_in_one_segment(self):
        M, K, N = 6, 8, 5
        g = Builder()
        x, w, bias = g.input((M, K)), g.input((N, K)), g.input((N,))
        lw, lb, target = g.input((K,)), g.input((K,)), g.input((M,), "i32")
        y, mean, rstd = g.op("aten.native_layer_norm.default", [g.val((M, K)), g.val((M, 1)), g.val((M, 1))],
                             input=x, normalized_shape=[K], weight=lw, bias=lb, eps=1e-5)
        wt = g.op("aten.t.default", [g.val((K, N), of=w, strides=(1, K))], self=w)
        h = g.op("aten.addmm.default", [g.val((M, N))], self=bias, mat1=y, mat2=wt)
        a = g.op("aten.gelu.default", [g.val((M, N))], self=h, approximate="tanh")
        ls = g.op("aten._log_softmax.default", [g.val((M, N))], self=a, dim=1, half_to_float=False)
        loss, total = g.op("aten.nll_loss_forward.default", [g.val(()), g.val(())], self=ls, target=target,
                           weight=None, reduction=1, ignore_index=-100)
        colsum = g.op("aten.sum.dim_IntList", [g.val((N,))], self=a, dim=[0], keepdim=False)
        steps = partition(g.graph([loss, colsum, ls, mean, rstd]), HANDLERS)
        self.assertEqual(len(segments(steps)), 1, [s.reasons for s in steps if isinstance(s, RankStep)])
        r = HostRunner(self.c, steps)
        try:
            xs, ws, bs, lws, lbs = self.rand(M * K), self.rand(N * K), self.rand(N), self.rand(K, 0.5, 1.5), \
                self.rand(K)
            targets = [self.rng.randrange(N) for _ in range(M)]
            targets[2] = -100   # ignored
            for v, vals in ((x, xs), (w, ws), (bias, bs), (lw, lws), (lb, lbs), (target, targets)):
                r.give(v, vals)
            r.run()
            # float64 reference
            ref_ls, ref_a, ref_mean, ref_rstd = [], [], [], []
            for i in range(M):
                row = xs[i * K:(i + 1) * K]
                mu = sum(row) / K
                var = sum((v - mu) ** 2 for v in row) / K
                rs = 1 / math.sqrt(var + 1e-5)
                ref_mean.append(mu)
                ref_rstd.append(rs)
                yn = [(row[k] - mu) * rs * lws[k] + lbs[k] for k in range(K)]
                hh = [sum(yn[k] * ws[j * K + k] for k in range(K)) + bs[j] for j in range(N)]
                aa = [0.5 * v * (1 + math.tanh(math.sqrt(2 / math.pi) * (v + 0.044715 * v ** 3))) for v in hh]
                m = max(aa)
                lse = m + math.log(sum(math.exp(v - m) for v in aa))
                ref_a.append(aa)
                ref_ls.append([v - lse for v in aa])
            kept = [i for i in range(M) if targets[i] != -100]
            ref_loss = -sum(ref_ls[i][targets[i]] for i in kept) / len(kept)
            self.close(r.read(loss), [ref_loss], 1e-4, "loss")
            self.close(r.read(ls), [v for row in ref_ls for v in row], 1e-4, "log_softmax")
            self.close(r.read(colsum), [sum(ref_a[i][j] for i in range(M)) for j in range(N)], 1e-4, "sum")
            self.close(r.read(mean), ref_mean, 1e-4, "mean")
            self.close(r.read(rstd), ref_rstd, 1e-4, "rstd")
        finally:
            r.close()

    def test_nll_loss_target_outside_the_classes_is_refused_by_name(self):
        M, N = 4, 6
        g = Builder()
        ls, target = g.input((M, N)), g.input((M,), "i32")
        loss, total = g.op("aten.nll_loss_forward.default", [g.val(()), g.val(())], self=ls, target=target,
                           weight=None, reduction=1, ignore_index=-100)
        steps = partition(g.graph([loss, total]), HANDLERS)
        self.assertEqual(len(segments(steps)), 1, [s.reasons for s in steps if isinstance(s, RankStep)])
        # Each row's log-probability is read alone, not the whole row.
        ops = [n["op"] for n in segments(steps)[0].definition["nodes"]]
        self.assertIn("embedding", ops)
        self.assertNotIn("cross_entropy", ops)
        for bad in (N, -1):
            r = HostRunner(self.c, steps)
            try:
                r.give(ls, self.rand(M * N, -3, 0))
                r.give(target, [0, bad, 2, -100])
                with self.assertRaises(regen.errors.InvalidOperand) as cm:
                    r.run()
                self.assertIn("outside", str(cm.exception))
            finally:
                r.close()

    def test_a_cast_of_a_reshape_is_written_in_the_shape_it_was_made(self):
        M, N = 4, 6
        g = Builder()
        x = g.input((M, N))
        a = g.op("aten.mul.Tensor", [g.val((M, N))], self=x, other=3.0)
        flat = g.op("aten.view.default", [g.val((M * N,), of=a)], self=a, size=[M * N])
        y = g.op("aten._to_copy.default", [g.val((M * N,), "bf16")], self=flat, dtype="bf16")
        steps = partition(g.graph([y]), HANDLERS)
        self.assertEqual(len(segments(steps)), 1, [s.reasons for s in steps if isinstance(s, RankStep)])
        d = segments(steps)[0].definition
        tensors = {t["name"]: t for t in d["tensors"]}
        cast = [n for n in d["nodes"] if n["op"] == "cast"][0]
        # The cast runs over [M, N], as the mul that makes its input does.
        self.assertEqual(tensors[cast["outputs"][0]]["shape"], [M, N])
        r = HostRunner(self.c, steps)
        try:
            xs = self.rand(M * N)
            r.give(x, xs)
            r.run()
            self.close(r.read(y), [3 * v for v in xs], 1e-2, "cast")
        finally:
            r.close()

    def test_a_cast_read_by_a_softmax_alone_is_never_written(self):
        M, N = 4, 6
        g = Builder()
        x = g.input((2, M // 2, N), "bf16")
        wide = g.op("aten._to_copy.default", [g.val((2, M // 2, N))], self=x, dtype="f32")
        rows = g.op("aten.view.default", [g.val((M, N), of=wide)], self=wide, size=[M, N])
        ls = g.op("aten._log_softmax.default", [g.val((M, N))], self=rows, dim=1, half_to_float=False)
        steps = partition(g.graph([ls]), HANDLERS)
        self.assertEqual(len(segments(steps)), 1, [s.reasons for s in steps if isinstance(s, RankStep)])
        ops = [n["op"] for n in segments(steps)[0].definition["nodes"]]
        self.assertEqual(ops, ["log_softmax"])
        r = HostRunner(self.c, steps)
        try:
            # bf16 holds these exactly: the reference reads what the program reads.
            xs = [self.rng.randrange(-32, 32) / 8 for _ in range(M * N)]
            r.give(x, xs)
            r.run()
            ref = []
            for i in range(M):
                row = xs[i * N:(i + 1) * N]
                m = max(row)
                lse = m + math.log(sum(math.exp(v - m) for v in row))
                ref += [v - lse for v in row]
            self.close(r.read(ls), ref, 1e-5, "log_softmax")
        finally:
            r.close()

    def _log_probabilities(self, xs, M, N):
        out = []
        for i in range(M):
            row = xs[i * N:(i + 1) * N]
            m = max(row)
            lse = m + math.log(sum(math.exp(v - m) for v in row))
            out += [v - lse for v in row]
        return out

    def test_log_probabilities_only_the_loss_reads_are_never_written(self):
        """A model's cross_entropy(logits.float()) whose log-probabilities
        the forward does not return (regen.torch._partition recomputes them
        in the backward): the rows' logsumexp and each target's logit are
        read, the [N, V] f32 log-probabilities never written."""
        M, N = 6, 9
        g = Builder()
        x, target = g.input((2, M // 2, N), "bf16"), g.input((M,), "i32")
        wide = g.op("aten._to_copy.default", [g.val((2, M // 2, N))], self=x, dtype="f32")
        rows = g.op("aten.view.default", [g.val((M, N), of=wide)], self=wide, size=[M, N])
        ls = g.op("aten._log_softmax.default", [g.val((M, N))], self=rows, dim=1, half_to_float=False)
        loss, total = g.op("aten.nll_loss_forward.default", [g.val(()), g.val(())], self=ls, target=target,
                           weight=None, reduction=1, ignore_index=-100)
        steps = partition(g.graph([loss, total]), HANDLERS)
        self.assertEqual(len(segments(steps)), 1, [s.reasons for s in steps if isinstance(s, RankStep)])
        d = segments(steps)[0].definition
        ops = [n["op"] for n in d["nodes"]]
        self.assertIn("logsumexp", ops)
        self.assertNotIn("log_softmax", ops)
        self.assertFalse([t for t in d["tensors"] if t.get("shape") == [M, N] and t.get("dtype") == "f32"],
                         "an [M, N] f32 tensor in the program")
        for bad in (None, N):
            r = HostRunner(self.c, steps)
            try:
                xs = [self.rng.randrange(-40, 40) / 8 for _ in range(M * N)]   # exact in bf16
                targets = [self.rng.randrange(N) for _ in range(M)]
                targets[3] = -100
                if bad is not None:
                    targets[1] = bad
                r.give(x, xs)
                r.give(target, targets)
                if bad is not None:
                    with self.assertRaises(regen.errors.InvalidOperand) as cm:
                        r.run()
                    self.assertIn("outside", str(cm.exception))
                    continue
                r.run()
                lp = self._log_probabilities(xs, M, N)
                kept = [i for i in range(M) if targets[i] != -100]
                self.close(r.read(loss), [-sum(lp[i * N + targets[i]] for i in kept) / len(kept)], 1e-5, "loss")
                self.close(r.read(total), [float(len(kept))], 0, "total weight")
            finally:
                r.close()

    def test_loss_backward_from_the_logits(self):
        """The backward regen.torch._partition writes: the log-probabilities
        recomputed from the saved bf16 logits (read by the loss's backward
        directly and through detach), the gradient cast back to bf16: one
        logsumexp and one cross_entropy_backward over the logits."""
        M, N = 5, 11
        g = Builder()
        x, target, g0, total = g.input((M, N), "bf16"), g.input((M,), "i32"), g.input(()), g.input(())
        wide = g.op("aten._to_copy.default", [g.val((M, N))], self=x, dtype="f32")
        ls = g.op("aten._log_softmax.default", [g.val((M, N))], self=wide, dim=1, half_to_float=False)
        seen = g.op("aten.detach.default", [g.val((M, N), of=ls)], self=ls)
        gl = g.op("aten.nll_loss_backward.default", [g.val((M, N))], grad_output=g0, self=ls, target=target,
                  weight=None, reduction=1, ignore_index=-100, total_weight=total)
        dxf = g.op("aten._log_softmax_backward_data.default", [g.val((M, N))], grad_output=gl, output=seen, dim=1,
                   input_dtype="f32")
        dx = g.op("aten._to_copy.default", [g.val((M, N), "bf16")], self=dxf, dtype="bf16")
        steps = partition(g.graph([dx]), HANDLERS)
        self.assertEqual(len(segments(steps)), 1, [s.reasons for s in steps if isinstance(s, RankStep)])
        ops = [n["op"] for n in segments(steps)[0].definition["nodes"]]
        self.assertEqual(ops.count("logsumexp"), 1, ops)
        self.assertEqual(ops.count("cross_entropy_backward"), 1, ops)
        self.assertNotIn("log_softmax", ops)
        r = HostRunner(self.c, steps)
        try:
            xs = [self.rng.randrange(-40, 40) / 8 for _ in range(M * N)]
            targets = [self.rng.randrange(N) for _ in range(M)]
            targets[2] = -100
            kept = sum(1 for t in targets if t != -100)
            gv = self.rng.uniform(0.5, 2.0)
            for v, vals in ((x, xs), (target, targets), (g0, [gv]), (total, [float(kept)])):
                r.give(v, vals)
            r.run()
            lp = self._log_probabilities(xs, M, N)
            want = [0.0 if targets[i] == -100 else
                    (math.exp(lp[i * N + j]) - (1.0 if j == targets[i] else 0.0)) * gv / kept
                    for i in range(M) for j in range(N)]
            self.close(r.read(dx), want, 2 ** -8, "d logits (bf16)")
        finally:
            r.close()

    def test_loss_backward_pattern_cat_and_slice_backward(self):
        M, N = 5, 7
        g = Builder()
        ls, target, g0, total = g.input((M, N)), g.input((M,), "i32"), g.input(()), g.input(())
        gl = g.op("aten.nll_loss_backward.default", [g.val((M, N))], grad_output=g0, self=ls, target=target,
                  weight=None, reduction=1, ignore_index=-100, total_weight=total)
        dx = g.op("aten._log_softmax_backward_data.default", [g.val((M, N))], grad_output=gl, output=ls, dim=1,
                  input_dtype=None)
        half = g.op("aten.slice.Tensor", [g.val((M, 3), of=dx, strides=(N, 1))], self=dx, dim=1, start=0, end=3)
        back = g.op("aten.slice_backward.default", [g.val((M, N))], grad_output=half, input_sizes=[M, N], dim=1,
                    start=0, end=3, step=1)
        both = g.op("aten.cat.default", [g.val((M, 2 * N))], tensors=[dx, back], dim=1)
        row = g.op("aten.select_backward.default", [g.val((3, M, N))], grad_output=dx, input_sizes=[3, M, N],
                   dim=0, index=1)
        steps = partition(g.graph([both, row, dx]), HANDLERS)
        self.assertEqual(len(segments(steps)), 1, [s.reasons for s in steps if isinstance(s, RankStep)])
        self.assertNotIn("log_softmax_backward", [n["op"] for n in segments(steps)[0].definition["nodes"]])
        r = HostRunner(self.c, steps)
        try:
            logits = self.rand(M * N, -3, 3)
            lsv = []
            for i in range(M):
                rowv = logits[i * N:(i + 1) * N]
                lse = math.log(sum(math.exp(v) for v in rowv))
                lsv += [v - lse for v in rowv]
            targets = [self.rng.randrange(N) for _ in range(M)]
            targets[1] = -100
            kept = sum(1 for t in targets if t != -100)
            gv = self.rng.uniform(0.5, 2.0)
            for v, vals in ((ls, lsv), (target, targets), (g0, [gv]), (total, [float(kept)])):
                r.give(v, vals)
            r.run()
            want = []
            for i in range(M):
                for j in range(N):
                    if targets[i] == -100:
                        want.append(0.0)
                    else:
                        want.append((math.exp(lsv[i * N + j]) - (1.0 if j == targets[i] else 0.0)) * gv / kept)
            self.close(r.read(dx), want, 1e-5, "d logits")
            cat_want = []
            for i in range(M):
                d = want[i * N:(i + 1) * N]
                cat_want += d + [d[j] if j < 3 else 0.0 for j in range(N)]
            self.close(r.read(both), cat_want, 1e-5, "cat")
            self.close(r.read(row), [0.0] * (M * N) + want + [0.0] * (M * N), 1e-5, "select_backward")
        finally:
            r.close()

    def test_reductions_views_and_softmax(self):
        B, T, D = 3, 4, 5
        g = Builder()
        x = g.input((B, T, D))
        xt = g.op("aten.permute.default", [g.val((T, B, D), of=x, strides=(D, T * D, 1))], self=x, dims=[1, 0, 2])
        e = g.op("aten.exp.default", [g.val((T, B, D))], self=xt)         # a permuted view read in place
        m_lead = g.op("aten.mean.dim", [g.val((D,))], self=e, dim=[0, 1], keepdim=False)
        m_last = g.op("aten.amax.default", [g.val((T, B, 1))], self=e, dim=[-1], keepdim=True)
        m_first = g.op("aten.sum.dim_IntList", [g.val((B, D))], self=e, dim=[0], keepdim=False)
        sm = g.op("aten._softmax.default", [g.val((T, B, D))], self=e, dim=2, half_to_float=False)
        dy = g.input((T, B, D))
        dsm = g.op("aten._softmax_backward_data.default", [g.val((T, B, D))], grad_output=dy, output=sm, dim=2,
                   input_dtype=None)
        steps = partition(g.graph([m_lead, m_last, m_first, dsm]), HANDLERS)
        self.assertEqual(len(segments(steps)), 1, [s.reasons for s in steps if isinstance(s, RankStep)])
        r = HostRunner(self.c, steps)
        try:
            xs, dys = self.rand(B * T * D), self.rand(T * B * D)
            r.give(x, xs)
            r.give(dy, dys)
            r.run()
            ev = {(t, b, d): math.exp(xs[b * T * D + t * D + d]) for t in range(T) for b in range(B) for d in range(D)}
            self.close(r.read(m_lead), [sum(ev[t, b, d] for t in range(T) for b in range(B)) / (T * B)
                                        for d in range(D)], 1e-5, "mean over the leading dims")
            self.close(r.read(m_last), [max(ev[t, b, d] for d in range(D)) for t in range(T) for b in range(B)],
                       1e-5, "amax over the last dim")
            self.close(r.read(m_first), [sum(ev[t, b, d] for t in range(T)) for b in range(B) for d in range(D)],
                       1e-5, "sum over the first dim")
            want = []
            for t in range(T):
                for b in range(B):
                    row = [ev[t, b, d] for d in range(D)]
                    mx = max(row)
                    ex = [math.exp(v - mx) for v in row]
                    y = [v / sum(ex) for v in ex]
                    dyr = dys[(t * B + b) * D:(t * B + b + 1) * D]
                    dot = sum(a * c for a, c in zip(y, dyr))
                    want += [y[d] * (dyr[d] - dot) for d in range(D)]
            self.close(r.read(dsm), want, 1e-5, "softmax backward")
        finally:
            r.close()

    def test_attention_written_by_hand(self):
        """minGPT's attention: q @ k^T (a batched GEMM of a transposed view),
        scaled, masked with -inf, softmax, @ v: one segment."""
        BH, T, Dh = 3, 5, 4
        g = Builder()
        q, k, v, keep = g.input((BH, T, Dh)), g.input((BH, T, Dh)), g.input((BH, T, Dh)), g.input((T, T))
        kt = g.op("aten.transpose.int", [g.val((BH, Dh, T), of=k, strides=(T * Dh, 1, Dh))], self=k, dim0=1,
                  dim1=2)
        s_ = g.op("aten.bmm.default", [g.val((BH, T, T))], self=q, mat2=kt)
        s2 = g.op("aten.mul.Tensor", [g.val((BH, T, T))], self=s_, other=0.5)
        hidden = g.op("aten.eq.Scalar", [g.val((T, T), "u8")], self=keep, other=0.0)
        masked = g.op("aten.masked_fill.Scalar", [g.val((BH, T, T))], self=s2, mask=hidden, value=float("-inf"))
        p = g.op("aten._softmax.default", [g.val((BH, T, T))], self=masked, dim=-1, half_to_float=False)
        o = g.op("aten.bmm.default", [g.val((BH, T, Dh))], self=p, mat2=v)
        steps = partition(g.graph([o]), HANDLERS)
        self.assertEqual(len(segments(steps)), 1, [s.reasons for s in steps if isinstance(s, RankStep)])
        nodes = [n for n in segments(steps)[0].definition["nodes"]]
        self.assertEqual(sum(n["op"] == "gemm" for n in nodes), 2 * BH)
        self.assertIn("-inf", [n.get("attrs", {}).get("scalar") for n in nodes])
        r = HostRunner(self.c, steps)
        try:
            qs, ks, vs = self.rand(BH * T * Dh), self.rand(BH * T * Dh), self.rand(BH * T * Dh)
            keeps = [1.0 if j <= i else 0.0 for i in range(T) for j in range(T)]
            for val, vals in ((q, qs), (k, ks), (v, vs), (keep, keeps)):
                r.give(val, vals)
            r.run()
            want = []
            for h in range(BH):
                for i in range(T):
                    sc = [sum(qs[(h * T + i) * Dh + d] * ks[(h * T + j) * Dh + d] for d in range(Dh)) * 0.5
                          if j <= i else -math.inf for j in range(T)]
                    m = max(sc)
                    e = [math.exp(x - m) for x in sc]
                    pr = [x / sum(e) for x in e]
                    want += [sum(pr[j] * vs[(h * T + j) * Dh + d] for j in range(T)) for d in range(Dh)]
            self.close(r.read(o), want, 1e-5, "attention")
        finally:
            r.close()

    def test_layer_norm_without_a_weight_forward_and_backward(self):
        M, K = 4, 6
        g = Builder()
        x, dy = g.input((M, K)), g.input((M, K))
        y, mean, rstd = g.op("aten.native_layer_norm.default", [g.val((M, K)), g.val((M, 1)), g.val((M, 1))],
                             input=x, normalized_shape=[K], weight=None, bias=None, eps=1e-5)
        dx, _, _ = g.op("aten.native_layer_norm_backward.default", [g.val((M, K)), None, None], grad_out=dy,
                        input=x, normalized_shape=[K], mean=mean, rstd=rstd, weight=None, bias=None,
                        output_mask=[True, False, False])
        steps = partition(g.graph([y, dx]), HANDLERS)
        self.assertEqual(len(segments(steps)), 1, [s.reasons for s in steps if isinstance(s, RankStep)])
        r = HostRunner(self.c, steps)
        try:
            xs, dys = self.rand(M * K), self.rand(M * K)
            r.give(x, xs)
            r.give(dy, dys)
            r.run()
            wy, wdx = [], []
            for i in range(M):
                row, drow = xs[i * K:(i + 1) * K], dys[i * K:(i + 1) * K]
                mu = sum(row) / K
                rs = 1 / math.sqrt(sum((v - mu) ** 2 for v in row) / K + 1e-5)
                xh = [(v - mu) * rs for v in row]
                wy += xh
                md, mdx = sum(drow) / K, sum(a * b for a, b in zip(drow, xh)) / K
                wdx += [rs * (drow[k] - md - xh[k] * mdx) for k in range(K)]
            self.close(r.read(y), wy, 1e-5, "y")
            self.close(r.read(dx), wdx, 1e-4, "dx")
        finally:
            r.close()

    def test_layer_norm_backward_takes_the_residual_gradient(self):
        M, K = 4, 6
        g = Builder()
        x, dy, w, res = g.input((M, K)), g.input((M, K)), g.input((K,)), g.input((M, K))
        y, mean, rstd = g.op("aten.native_layer_norm.default", [g.val((M, K)), g.val((M, 1)), g.val((M, 1))],
                             input=x, normalized_shape=[K], weight=w, bias=None, eps=1e-5)
        dx, dw, _ = g.op("aten.native_layer_norm_backward.default", [g.val((M, K)), g.val((K,)), None],
                         grad_out=dy, input=x, normalized_shape=[K], mean=mean, rstd=rstd, weight=w, bias=None,
                         output_mask=[True, True, False])
        total = g.op("aten.add.Tensor", [g.val((M, K))], self=res, other=dx)
        steps = partition(g.graph([y, total, dw]), HANDLERS)
        self.assertEqual(len(segments(steps)), 1, [s.reasons for s in steps if isinstance(s, RankStep)])
        nodes = segments(steps)[0].definition["nodes"]
        # The add is LayerNormBackward's d_residual, not a node of its own.
        self.assertNotIn("add", [n["op"] for n in nodes])
        self.assertIn("d_residual", [n for n in nodes if n["op"] == "layer_norm_backward"][0]["inputs"])
        r = HostRunner(self.c, steps)
        try:
            xs, dys, ws, rs_ = self.rand(M * K), self.rand(M * K), self.rand(K, 0.5, 1.5), self.rand(M * K)
            for v, vals in ((x, xs), (dy, dys), (w, ws), (res, rs_)):
                r.give(v, vals)
            r.run()
            want, wdw = [], [0.0] * K
            for i in range(M):
                row, drow = xs[i * K:(i + 1) * K], dys[i * K:(i + 1) * K]
                mu = sum(row) / K
                rs = 1 / math.sqrt(sum((v - mu) ** 2 for v in row) / K + 1e-5)
                xh = [(v - mu) * rs for v in row]
                gw = [drow[k] * ws[k] for k in range(K)]
                mg, mgx = sum(gw) / K, sum(a * b for a, b in zip(gw, xh)) / K
                want += [rs * (gw[k] - mg - xh[k] * mgx) + rs_[i * K + k] for k in range(K)]
                for k in range(K):
                    wdw[k] += drow[k] * xh[k]
            self.close(r.read(total), want, 1e-4, "d_x + residual")
            self.close(r.read(dw), wdw, 1e-4, "d_weight")
        finally:
            r.close()

    def test_pointwise_over_three_dims_runs_in_the_rows_frame(self):
        B, S, H = 2, 3, 4
        g = Builder()
        x, w, rs = g.input((B, S, H)), g.input((H,)), g.input((B, S, 1))
        a = g.op("aten.mul.Tensor", [g.val((B, S, H))], self=x, other=rs)
        c = g.op("aten.mul.Tensor", [g.val((B, S, H))], self=a, other=w)
        d = g.op("aten.gelu.default", [g.val((B, S, H))], self=c, approximate="tanh")
        m = g.op("aten.sum.dim_IntList", [g.val((B, S))], self=d, dim=[2], keepdim=False)
        col = g.op("aten.sum.dim_IntList", [g.val((H,))], self=d, dim=[0, 1], keepdim=False)
        steps = partition(g.graph([d, m, col]), HANDLERS)
        self.assertEqual(len(segments(steps)), 1, [s.reasons for s in steps if isinstance(s, RankStep)])
        dfn = segments(steps)[0].definition
        tensors = {t["name"]: t for t in dfn["tensors"]}
        # Every pointwise node and both reductions see [B*S, H] (or H, or
        # [B*S, 1]): one shape the program's kernels group by.
        for n in dfn["nodes"]:
            shape = tensors[n["inputs"][0]]["shape"]
            self.assertIn(shape, ([B * S, H], [B * S, 1], [H]), n)
        r = HostRunner(self.c, steps)
        try:
            xs, ws, rss = self.rand(B * S * H), self.rand(H, 0.5, 1.5), self.rand(B * S, 0.5, 2)
            for v, vals in ((x, xs), (w, ws), (rs, rss)):
                r.give(v, vals)
            r.run()
            gl = lambda v: 0.5 * v * (1 + math.tanh(math.sqrt(2 / math.pi) * (v + 0.044715 * v ** 3)))  # noqa: E731
            want = [gl(xs[i * H + k] * rss[i] * ws[k]) for i in range(B * S) for k in range(H)]
            self.close(r.read(d), want, 1e-5, "gelu(x * rs * w)")
            self.close(r.read(m), [sum(want[i * H:(i + 1) * H]) for i in range(B * S)], 1e-5, "row sums")
            self.close(r.read(col), [sum(want[i * H + k] for i in range(B * S)) for k in range(H)], 1e-5, "col sums")
        finally:
            r.close()

    def test_the_rows_frame_skips_dims_of_one_element(self):
        # [B, 1, H] whose dim of one element has a stride of no meaning:
        # the rows step by the outer dim's.
        B, H = 3, 4
        g = Builder()
        x0 = g.input((B, H))
        x = g.op("aten.unsqueeze.default", [g.val((B, 1, H), of=x0, strides=(H, 7, 1))], self=x0, dim=1)
        y = g.op("aten.neg.default", [g.val((B, 1, H))], self=x)
        steps = partition(g.graph([y]), HANDLERS)
        r = HostRunner(self.c, steps)
        try:
            xs = self.rand(B * H)
            r.give(x0, xs)
            r.run()
            self.close(r.read(y), [-v for v in xs], 1e-6, "neg")
        finally:
            r.close()

    def test_scaled_mm_fp8(self):
        """torch._scaled_mm (FP8 e4m3, TN, per-tensor scales, a bias) as
        regend's FP8 GEMM: against float64 of the dequantized operands."""
        self.check_scaled_mm(use_fast_accum=False)

    def test_scaled_mm_fp8_fast_accum(self):
        """use_fast_accum=True: regend's GEMM with compute fp8_fast_accum
        (the host backend's sums are its exact ones either way)."""
        self.check_scaled_mm(use_fast_accum=True)

    def check_scaled_mm(self, use_fast_accum):
        M, K, N = 4, 16, 8
        g = Builder()
        a, bt, sa, sb, bias = g.input((M, K), "e4m3"), g.input((N, K), "e4m3"), g.input(()), g.input(()), \
            g.input((N,), "f32")
        b_ = g.op("aten.t.default", [g.val((K, N), "e4m3", of=bt, strides=(1, K))], self=bt)
        d = g.op("aten._scaled_mm.default", [g.val((M, N))], self=a, mat2=b_, scale_a=sa, scale_b=sb, bias=None,
                 scale_result=None, out_dtype=None, use_fast_accum=use_fast_accum)
        steps = partition(g.graph([d]), HANDLERS)
        self.assertEqual(len(segments(steps)), 1, [s.reasons for s in steps if isinstance(s, RankStep)])
        gemm = [n for n in segments(steps)[0].definition["nodes"] if n["op"] == "gemm"]
        self.assertEqual([n.get("attrs", {}).get("compute", "f32") for n in gemm],
                         ["fp8_fast_accum" if use_fast_accum else "f32"])
        r = HostRunner(self.c, steps)
        try:
            codes = [c for c in range(256) if c not in (0x7F, 0xFF)]
            ac = [self.rng.choice(codes) for _ in range(M * K)]
            bc = [self.rng.choice(codes) for _ in range(N * K)]
            s_a, s_b = self.rng.uniform(0.01, 0.1), self.rng.uniform(0.01, 0.1)
            for v, vals in ((a, ac), (bt, bc), (sa, [s_a]), (sb, [s_b]), (bias, self.rand(N))):
                r.give(v, vals)
            r.run()
            want = [sum(e4m3_value(ac[i * K + k]) * e4m3_value(bc[j * K + k]) for k in range(K)) * s_a * s_b
                    for i in range(M) for j in range(N)]
            self.close(r.read(d), want, 1e-5, "scaled_mm")
        finally:
            r.close()

    def test_dropout_forward_and_backward(self):
        """native_dropout's mask drawn in regend from the Run's seed (the
        same seed, the same mask), the kept values scaled, and its backward."""
        M, N, p = 64, 96, 0.3
        g = Builder()
        x, dy = g.input((M, N)), g.input((M, N))
        y, mask = g.op("aten.native_dropout.default", [g.val((M, N)), g.val((M, N), "u8")], input=x, p=p, train=True)
        dx = g.op("aten.native_dropout_backward.default", [g.val((M, N))], grad_output=dy, mask=mask,
                  scale=1 / (1 - p))
        steps = partition(g.graph([y, mask, dx]), HANDLERS)
        self.assertEqual(len(segments(steps)), 1, [s.reasons for s in steps if isinstance(s, RankStep)])
        self.assertEqual(segments(steps)[0].scalars, ["seed"])
        xs, dys = self.rand(M * N), self.rand(M * N)
        masks = []
        for seed in (7, 7, 8):
            r = HostRunner(self.c, steps, seed=seed)
            try:
                r.give(x, xs)
                r.give(dy, dys)
                r.run()
                ks = r.read(mask)
                masks.append(ks)
                self.assertTrue(all(k in (0, 1) for k in ks))
                self.close(r.read(y), [xv / (1 - p) if k else 0.0 for xv, k in zip(xs, ks)], 1e-6, "y")
                self.close(r.read(dx), [d / (1 - p) if k else 0.0 for d, k in zip(dys, ks)], 1e-6, "dx")
            finally:
                r.close()
        dropped = masks[0].count(0) / (M * N)
        sigma = math.sqrt(p * (1 - p) / (M * N))
        self.assertLess(abs(dropped - p), 5 * sigma, f"{dropped:.3f} of the values dropped, not {p}")
        self.assertEqual(masks[0], masks[1], "the same seed drew another mask")
        self.assertNotEqual(masks[0], masks[2], "another seed drew the same mask")



def _raw(r, v):
    """The bytes of contiguous Val ``v`` where HostRunner ``r`` holds it."""
    t, off = r.env[v.id]
    return os.pread(t.fd, v.numel * v.itemsize, off * v.itemsize)


def _f32(values):
    return struct.pack(f"<{len(values)}f", *values)


@unittest.skipIf(not find_regend(), "no regend (pass --regend or set REGEN_BUILD_ROOT)")
class Fp8LinearTest(_HostCase):
    """regen.torch.fp8.Linear's custom ops as a compiled graph holds them
    (regen::fp8_linear and its backward, then AOTAutograd's copy_ of each
    state update into the layer's buffers): one segment with the ops around
    them, the buffers bound as inouts and updated in place (a journal's
    program), and every byte as the layer's eager program (in place, the
    same nodes: regen.fp8_programs) writes it from the same inputs."""

    M, K, N, H = 8, 32, 16, 4
    SCALING = ("e4m3", "e5m2", "max", 1.0)

    def codes(self, n):
        return bytes(self.rng.choice([c for c in range(256) if c not in (0x7F, 0xFF)]) for _ in range(n))

    def eager(self, definition, given):
        """Runs a whole definition once with its bound tensors' bytes from
        ``given`` (name -> bytes; zeros otherwise): name -> bytes after."""
        from regen.ops import DTYPE_SIZES
        prog = self.c.define_program(0, definition)
        held, bind = {}, {}
        try:
            for t in definition["tensors"]:
                if t["kind"] not in ("input", "output", "inout"):
                    continue
                ht = HostTensor([math.prod(t["shape"])], t["dtype"])
                held[t["name"]] = ht
                ht.import_into(self.c, 0)
                os.pwrite(ht.fd, given.get(t["name"], bytes(ht.numel * DTYPE_SIZES[t["dtype"]])), 0)
                bind[t["name"]] = (ht.buffer, 0)
            self.c.run_program(prog, bind)
            return {name: os.pread(ht.fd, ht.nbytes, 0) for name, ht in held.items()}
        finally:
            for ht in held.values():
                ht.close()
            self.c.drop_program(prog)

    def fp8_linear(self, g, x, w, bias, hist, scale, hb, sb):
        M, K, N, H = self.M, self.K, self.N, self.H
        fwd, bwd, algo, margin = self.SCALING
        return g.op("regen.fp8_linear.default",
                    [g.val((M, N)), g.val((K, M), fwd), g.val((K, N), fwd), g.val((2,)), g.val((H, 2)), g.val((2,))],
                    input=x, weight=w, bias=bias, amax_history_fwd=hist, scale_fwd=scale, amax_history_bwd=hb,
                    scale_bwd=sb, forward_format=fwd, backward_format=bwd, amax_compute=algo, margin=margin)

    def test_forward_gemm_sums_fast_and_the_gradients_promoted(self):
        """Transformer Engine's choice: fast accumulation in the forward's
        GEMM, the gradients' GEMMs promoted to f32."""
        from regen import fp8_programs
        M, K, N, H = self.M, self.K, self.N, self.H
        fwd, bwd, algo, margin = self.SCALING
        forward = fp8_programs.forward_definition(M, N, K, "bf16", "bf16", "bf16", [K, 1], [K, 1],
                                                  fp8_programs.Scaling(fwd, algo, margin, H), True)
        backward = fp8_programs.backward_definition(M, N, K, "bf16", "bf16", "bf16", [N, 1],
                                                    fp8_programs.Scaling(bwd, algo, margin, H), fwd, True, True, True)
        for d, want in ((forward, ["fp8_fast_accum"]), (backward, ["f32", "f32"])):
            self.assertEqual([n.get("attrs", {}).get("compute", "f32") for n in d["nodes"] if n["op"] == "gemm"],
                             want)

    def test_forward_in_the_surrounding_segment_as_the_eager_program(self):
        self.check_forward(functionalized=False)

    def test_forward_with_functionalizations_copy_as_the_eager_program(self):
        """As torch 2.11's AOTAutograd gives the layer's buffer.copy_(new):
        aten.copy(buffer, new) where the layer wrote it, the copy_ of that
        into the buffer where the graph ends."""
        self.check_forward(functionalized=True)

    def check_forward(self, functionalized):
        from regen import fp8_programs
        M, K, N, H = self.M, self.K, self.N, self.H
        g = Builder()
        x, w, bias = g.input((M, K)), g.input((N, K)), g.input((N,))
        hist, scale, hb, sb = g.input((H, 2)), g.input((2,)), g.input((H, 1)), g.input((1,))
        y, xt, wt, inv, new_hist, new_scale = self.fp8_linear(g, x, w, bias, hist, scale, hb, sb)
        if functionalized:
            new_hist = g.op("aten.copy.default", [g.val((H, 2))], self=hist, src=new_hist)
            new_scale = g.op("aten.copy.default", [g.val((2,))], self=scale, src=new_scale)
        z = g.op("aten.relu.default", [g.val((M, N))], self=y)
        g.op("aten.copy_.default", [g.val((H, 2), of=hist)], self=hist, src=new_hist)
        g.op("aten.copy_.default", [g.val((2,), of=scale)], self=scale, src=new_scale)
        steps = partition(g.graph([z, xt, wt, inv, hb, sb]), HANDLERS)
        self.assertEqual([type(s).__name__ for s in steps], ["Segment"],
                         [s.reasons for s in steps if isinstance(s, RankStep)])
        seg = steps[0]
        self.assertTrue(seg.updates, "the segment updates inputs in place")
        kinds = {v.id: next(t["kind"] for t in seg.definition["tensors"] if t["name"] == name)
                 for name, v in seg.inputs}
        self.assertEqual(kinds, {x.id: "input", w.id: "input", bias.id: "input", hist.id: "inout",
                                 scale.id: "inout"}, "the backward state is not bound in the forward")
        self.assertEqual([n["op"] for n in seg.definition["nodes"]],
                         ["scale_update", "transpose_quantize", "transpose_quantize", "gemm", "add"] +
                         ["cast", "cast"] * functionalized + ["relu", "cast", "cast"])
        values = {x: self.rand(M * K, -4, 4), w: self.rand(N * K), bias: self.rand(N),
                  hist: self.rand(H * 2, 0.5, 8), scale: self.rand(2, 1, 4), hb: [0.0] * H, sb: [1.0]}
        r = HostRunner(self.c, steps)
        try:
            for v, vals in values.items():
                r.give(v, vals)
            r.run()
            scaling = fp8_programs.Scaling(self.SCALING[0], self.SCALING[2], self.SCALING[3], H)
            want = self.eager(fp8_programs.forward_definition(M, N, K, "f32", "f32", "f32", [K, 1], [K, 1], scaling,
                                                              True),
                              {"input": _f32(values[x]), "weight": _f32(values[w]), "bias": _f32(values[bias]),
                               "fwd.amax_history": _f32(values[hist]), "fwd.scale": _f32(values[scale])})
            for name, v in (("input.fp8_t", xt), ("weight.fp8_t", wt), ("fwd.scale_inv", inv),
                            ("fwd.amax_history", hist), ("fwd.scale", scale)):
                self.assertEqual(_raw(r, v), want[name], f"{name}: other bytes than the eager program's")
            y_eager = struct.unpack(f"<{M * N}f", want["output"])
            self.assertEqual(r.read(z), [max(0.0, v) for v in y_eager], "relu(y)")
            self.assertNotEqual(want["fwd.amax_history"], _f32(values[hist]), "the history moved")
        finally:
            r.close()

    def test_backward_as_the_eager_program(self):
        from regen import fp8_programs
        M, K, N, H = self.M, self.K, self.N, self.H
        fwd, bwd, algo, margin = self.SCALING
        g = Builder()
        dy, xt, wt, fwd_inv = g.input((M, N)), g.input((K, M), fwd), g.input((K, N), fwd), g.input((2,))
        hist, scale = g.input((H, 1)), g.input((1,))
        dx, dw, db, inv, new_hist, new_scale = g.op(
            "regen.fp8_linear_backward.default",
            [g.val((M, K)), g.val((N, K)), g.val((N,)), g.val((1,)), g.val((H, 1)), g.val((1,))],
            grad_output=dy, input_fp8_t=xt, weight_fp8_t=wt, fwd_scale_inv=fwd_inv, amax_history=hist, scale=scale,
            forward_format=fwd, backward_format=bwd, amax_compute=algo, margin=margin, weight_dtype="f32",
            bias_dtype="f32", need_input_grad=True, need_weight_grad=True)
        g.op("aten.copy_.default", [g.val((H, 1), of=hist)], self=hist, src=new_hist)
        g.op("aten.copy_.default", [g.val((1,), of=scale)], self=scale, src=new_scale)
        steps = partition(g.graph([dx, dw, db]), HANDLERS)
        self.assertEqual([type(s).__name__ for s in steps], ["Segment"],
                         [s.reasons for s in steps if isinstance(s, RankStep)])
        self.assertTrue(steps[0].updates)
        given = {dy: _f32(self.rand(M * N, -20, 20)), xt: self.codes(K * M), wt: self.codes(K * N),
                 fwd_inv: _f32(self.rand(2, 0.01, 0.1)), hist: _f32(self.rand(H, 0.5, 8)), scale: _f32([2.0])}
        r = HostRunner(self.c, steps)
        try:
            for v, raw in given.items():
                t = r.tensor(v.storage_numel, v.dtype)
                os.pwrite(t.fd, raw, 0)
                r.env[v.id] = (t, 0)
            r.run()
            scaling = fp8_programs.Scaling(bwd, algo, margin, H)
            want = self.eager(fp8_programs.backward_definition(M, N, K, "f32", "f32", "f32", [N, 1], scaling, fwd,
                                                               True, True, True),
                              {"grad_output": given[dy], "input.fp8_t": given[xt], "weight.fp8_t": given[wt],
                               "fwd.scale_inv": given[fwd_inv], "bwd.amax_history": given[hist],
                               "bwd.scale": given[scale]})
            for name, v in (("grad_input", dx), ("grad_weight", dw), ("grad_bias", db), ("bwd.amax_history", hist),
                            ("bwd.scale", scale)):
                self.assertEqual(_raw(r, v), want[name], f"{name}: other bytes than the eager program's")
            self.assertNotEqual(want["bwd.scale"], given[scale], "the scale moved")
        finally:
            r.close()

    def test_a_copy_into_an_input_read_after_it_stays_on_the_rank(self):
        g = Builder()
        buf, src = g.input((4,)), g.input((4,))
        e = g.op("aten.exp.default", [g.val((4,))], self=src)
        g.op("aten.copy_.default", [g.val((4,), of=buf)], self=buf, src=e)
        late = g.op("aten.neg.default", [g.val((4,))], self=buf)
        made = g.op("aten.copy_.default", [g.val((4,), of=e)], self=e, src=src)
        steps = partition(g.graph([late, made]), HANDLERS)
        reasons = {i: why for s in steps if isinstance(s, RankStep) for i, why in s.reasons.items()}
        self.assertIn("ops after it read", reasons[1])
        self.assertIn("not into an input", reasons[3])
        self.assertFalse(any(s.updates for s in segments(steps)))

if __name__ == "__main__":
    unittest.main()
