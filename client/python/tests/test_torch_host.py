# SPDX-License-Identifier: Apache-2.0
"""regen.torch on CPU tensors against a real regend (host backend): the
operations and their gradients against torch's own, the custom ops under
FakeTensor (no call made), enable()'s routing and fallbacks, retries
through a restart, an injected device_lost and a worker crash, the named
errors when recovery is off or runs out of time, a training loop whose loss
curve matches the in-process model through faults, and a long loop with
fresh activations that keeps the pool and regend flat.

Skipped (as a whole) where torch is not importable; the CUDA side of the
same is tests/gpu/test_regen_torch.py."""

import contextlib
import math
import os
import signal
import sys
import time
import types
import unittest

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.dirname(HERE))
sys.path.insert(0, os.path.join(HERE, "..", "..", "..", "tests", "lib"))
import regen  # noqa: E402
from regend_fixture import Regend, find_regend  # noqa: E402

try:
    import torch
except ImportError:
    torch = None

daemon = None
rt = None


def setUpModule():
    global daemon, rt
    if torch is None:
        raise unittest.SkipTest("torch is not importable")
    if not find_regend():
        raise unittest.SkipTest("no regend (pass --regend or set REGEN_BUILD_ROOT)")
    import regen.torch as rtmod
    rt = rtmod
    from regen.pool import Pool
    if Pool.get() is None:
        raise unittest.SkipTest("libregen not found, or REGEN_LIBREGEN=none (a sanitized build)")
    daemon = Regend(devices=1)
    rt.configure(socket=daemon.socket, recovery_timeout=30)


def tearDownModule():
    if daemon is not None:
        daemon.stop()


def accel_expected():
    """Whether regen.torch's chained calls go through regen._accel here:
    where meson built it (REGEN_REQUIRE_ACCEL=1), not turned off, on the
    ring."""
    from regen import lane
    return (os.environ.get("REGEN_REQUIRE_ACCEL") == "1" and os.environ.get("REGEN_PY_ACCEL") != "none"
            and os.environ.get("REGEN_TRANSPORT", "auto") != "varlink" and lane.ring_supported())


def maxdiff(a, b):
    return (a.double() - b.double()).abs().max().item()


def reference_sdpa(q, k, v, causal, scale=None):
    rep = q.shape[1] // k.shape[1]
    k = k.repeat_interleave(rep, dim=1)
    v = v.repeat_interleave(rep, dim=1)
    scale = scale if scale is not None else 1.0 / math.sqrt(q.shape[-1])
    s = (q @ k.transpose(-1, -2)) * scale
    if causal:
        mask = torch.ones(q.shape[2], k.shape[2], dtype=torch.bool).tril()
        s = s.masked_fill(~mask, float("-inf"))
    return s.softmax(-1) @ v


class Ops(unittest.TestCase):
    def setUp(self):
        torch.manual_seed(hash(self.id()) & 0xFFFF)

    def test_registered_as_custom_ops(self):
        for name in ("mm", "linear", "sdpa", "sdpa_backward"):
            self.assertTrue(hasattr(torch.ops.regen, name), name)

    def test_matmul_and_gradients(self):
        for shape_a, shape_b in (([64, 32], [32, 16]), ([3, 5, 32], [32, 7]), ([32], [32, 9]), ([4, 32], [32])):
            with self.subTest(a=shape_a, b=shape_b):
                a = torch.randn(shape_a, requires_grad=True)
                b = torch.randn(shape_b, requires_grad=True)
                y = rt.matmul(a, b)
                ref = torch.matmul(a, b)
                self.assertEqual(y.shape, ref.shape)
                self.assertLess(maxdiff(y, ref), 1e-4)
                g = torch.randn_like(y)
                got = torch.autograd.grad(y, (a, b), g)
                want = torch.autograd.grad(ref, (a, b), g)
                for x, w in zip(got, want):
                    self.assertLess(maxdiff(x, w), 1e-4)

    def test_transposed_views_need_no_copy_in_regend(self):
        a = torch.randn(48, 32)
        b = torch.randn(16, 32)
        self.assertLess(maxdiff(rt.matmul(a.t().t(), b.t()), a @ b.t()), 1e-4)
        self.assertLess(maxdiff(rt.matmul(a.t()[:, :40].t(), b.t()), a[:40] @ b.t()), 1e-4)

    def test_batched_right_operand_is_not_supported(self):
        with self.assertRaises(rt.NotSupported):
            rt.matmul(torch.randn(2, 3, 4), torch.randn(2, 4, 5))

    def test_linear_bias_gelu_and_gradients(self):
        for act in (None, "gelu"):
            for with_bias in (True, False):
                with self.subTest(act=act, bias=with_bias):
                    x = torch.randn(5, 7, 32, requires_grad=True)
                    w = torch.randn(48, 32, requires_grad=True)
                    b = torch.randn(48, requires_grad=True) if with_bias else None
                    y = rt.linear(x, w, b, activation=act)
                    ref = torch.nn.functional.linear(x, w, b)
                    if act == "gelu":
                        ref = torch.nn.functional.gelu(ref, approximate="tanh")
                    self.assertLess(maxdiff(y, ref), 1e-4)
                    inputs = (x, w) + ((b,) if with_bias else ())
                    g = torch.randn_like(y)
                    calls = rt.stats()["calls"]
                    grads = torch.autograd.grad(y, inputs, g)
                    # gx, gw and (with a bias) its column sums, all in regend;
                    # with GELU one more: the pre-activation recomputed.
                    self.assertEqual(rt.stats()["calls"] - calls, 2 + with_bias + (act == "gelu"))
                    for got, want in zip(grads, torch.autograd.grad(ref, inputs, g)):
                        self.assertLess(maxdiff(got, want), 1e-3)

    def test_mlp_and_gradients_in_one_hand_off_each_way(self):
        F = torch.nn.functional
        for biases in ((True, True), (False, True), (True, False), (False, False)):
            with self.subTest(biases=biases):
                x = torch.randn(3, 5, 24, requires_grad=True)
                w1 = torch.randn(40, 24, requires_grad=True)
                w2 = torch.randn(16, 40, requires_grad=True)
                b1 = torch.randn(40, requires_grad=True) if biases[0] else None
                b2 = torch.randn(16, requires_grad=True) if biases[1] else None
                st = rt.stats()
                y = rt.mlp(x, w1, b1, w2, b2)
                after = rt.stats()
                self.assertEqual((after["calls"] - st["calls"], after["handoffs"] - st["handoffs"]), (2, 1))
                ref = F.linear(F.gelu(F.linear(x, w1, b1), approximate="tanh"), w2, b2)
                self.assertEqual(y.shape, (3, 5, 16))
                self.assertLess(maxdiff(y, ref), 1e-4)
                inputs = [t for t in (x, w1, b1, w2, b2) if t is not None]
                g = torch.randn_like(y)
                st = rt.stats()
                grads = torch.autograd.grad(y, inputs, g)
                after = rt.stats()
                # z recomputed, dz with GELU's gradient in its epilogue, the four
                # weight and input gradients, a column sum per bias: one run.
                self.assertEqual(after["calls"] - st["calls"], 5 + sum(biases))
                self.assertEqual(after["handoffs"] - st["handoffs"], 1)
                for got, want in zip(grads, torch.autograd.grad(ref, inputs, g)):
                    self.assertLess(maxdiff(got, want), 1e-3)

    B, S, W, HEADS, HIDDEN = 2, 9, 24, 3, 40

    def block_params(self, make):
        """One block's 12 parameters (BLOCK_PARAMETERS order), fresh random
        values, each through ``make`` (a leaf that requires grad)."""
        w, hidden = self.W, self.HIDDEN
        shapes = [[w], [w], [3 * w, w], [3 * w], [w, w], [w], [w], [w], [hidden, w], [hidden], [w, hidden], [w]]
        return [make(torch.randn(sh) / (sh[-1] ** 0.5 if len(sh) == 2 else 1)) for sh in shapes]

    def reference_blocks(self, x, stack):
        """The same blocks in torch: pre-LayerNorm, causal attention, GELU
        (tanh)."""
        F = torch.nn.functional
        b, s, w, heads = self.B, self.S, self.W, self.HEADS
        for ln1_w, ln1_b, qkv_w, qkv_b, proj_w, proj_b, ln2_w, ln2_b, up_w, up_b, down_w, down_b in stack:
            q, k, v = F.linear(F.layer_norm(x, [w], ln1_w, ln1_b), qkv_w, qkv_b) \
                .view(b, s, 3, heads, w // heads).permute(2, 0, 3, 1, 4)
            a = reference_sdpa(q, k, v, True).transpose(1, 2).reshape(b, s, w)
            h = x + F.linear(a, proj_w, proj_b)
            x = h + F.linear(F.gelu(F.linear(F.layer_norm(h, [w], ln2_w, ln2_b), up_w, up_b), approximate="tanh"),
                             down_w, down_b)
        return x

    def check_blocks_each_way(self, run, x, stack, flushes):
        """``run(x)`` against reference_blocks: the output and every
        gradient, forward and backward each one hand-off (and ``flushes``
        collections of queued answers, where given)."""
        flat = [p for params in stack for p in params]
        st = rt.stats()
        y = run(x)
        after = rt.stats()
        self.assertEqual(after["handoffs"] - st["handoffs"], 1)
        self.assertEqual(after["calls"] - st["calls"], 7 * len(stack))   # 2 LayerNorms, 4 GEMMs, attention a layer
        if flushes is not None:
            self.assertEqual(after["flushes"] - st["flushes"], flushes)
        ref = self.reference_blocks(x, stack)
        self.assertLess(maxdiff(y, ref), 1e-4)
        g = torch.randn_like(y)
        st = rt.stats()
        grads = torch.autograd.grad(y, [x] + flat, g)
        after = rt.stats()
        self.assertEqual(after["handoffs"] - st["handoffs"], 1)
        if flushes is not None:
            self.assertEqual(after["flushes"] - st["flushes"], flushes)
        for i, (got, want) in enumerate(zip(grads, torch.autograd.grad(ref, [x] + flat, g))):
            self.assertLess(maxdiff(got, want), 1e-3, "x" if i == 0 else f"layer {(i - 1) // 12} param {(i - 1) % 12}")

    def test_transformer_block_in_one_hand_off_each_way(self):
        """rt.transformer_block against the same block in torch (f32):
        output and all 13 gradients, forward and backward each one run of
        calls (LayerNorms in regend, residuals in the GEMMs and in
        LayerNormBackward)."""
        x = torch.randn(self.B, self.S, self.W, requires_grad=True)
        params = self.block_params(lambda t: t.requires_grad_())
        self.check_blocks_each_way(lambda x: rt.transformer_block(x, *params, self.HEADS), x, [params], None)
        with self.assertRaises(ValueError):
            rt.transformer_block(x, *params, 5)   # 24 is not a multiple of 5 heads

    def test_transformer_blocks_run_a_stack_each_way_at_once(self):
        """rt.transformer_blocks over three layers against the same blocks
        in torch (f32): output and every gradient, the stack's forward one
        run of 21 calls and its backward one run (one hand-off, one flush
        each way); host-pool tensors, so its calls are queued."""
        def pooled(t):
            p = rt.host_empty(list(t.shape), t.dtype)
            p.copy_(t)
            return p.requires_grad_()

        x = pooled(torch.randn(self.B, self.S, self.W))
        stack = [self.block_params(pooled) for _ in range(3)]
        self.check_blocks_each_way(lambda x: rt.transformer_blocks(x, stack, self.HEADS), x, stack, 1)
        self.assertIs(rt.transformer_blocks(x, [], self.HEADS), x)
        with self.assertRaises(ValueError):
            rt.transformer_blocks(x, [stack[0][:11]], self.HEADS)

    def test_attention_packed_reads_and_writes_qkv_in_place(self):
        for causal in (False, True):
            with self.subTest(causal=causal):
                b, s, h, d = 2, 7, 3, 8
                qkv = torch.randn(b, s, 3 * h * d, requires_grad=True)
                calls = rt.stats()["calls"]
                o = rt.attention_packed(qkv, h, is_causal=causal)
                self.assertEqual(rt.stats()["calls"] - calls, 1)
                self.assertEqual(o.shape, (b, s, h * d))
                q, k, v = qkv.view(b, s, 3, h, d).permute(2, 0, 3, 1, 4)
                ref = reference_sdpa(q, k, v, causal).transpose(1, 2).reshape(b, s, h * d)
                self.assertLess(maxdiff(o, ref), 1e-4)
                g = torch.randn_like(o)
                calls = rt.stats()["calls"]
                (got,) = torch.autograd.grad(o, (qkv,), g)
                self.assertEqual(rt.stats()["calls"] - calls, 1)
                self.assertTrue(got.is_contiguous())
                (want,) = torch.autograd.grad(ref, (qkv,), g)
                self.assertLess(maxdiff(got, want), 1e-4)
        with self.assertRaises(ValueError):
            rt.attention_packed(torch.randn(1, 4, 20), 3)   # 20 features are not 3 x 3 heads x D

    def test_attention_forward_backward(self):
        cases = [dict(h=4, hkv=4, sq=9, skv=9, d=16, dv=16, causal=False),
                 dict(h=4, hkv=2, sq=9, skv=11, d=16, dv=8, causal=True),
                 dict(h=2, hkv=1, sq=5, skv=5, d=8, dv=8, causal=True, scale=0.3)]
        for c in cases:
            with self.subTest(**c):
                q = torch.randn(2, c["h"], c["sq"], c["d"], requires_grad=True)
                k = torch.randn(2, c["hkv"], c["skv"], c["d"], requires_grad=True)
                v = torch.randn(2, c["hkv"], c["skv"], c["dv"], requires_grad=True)
                o = rt.scaled_dot_product_attention(q, k, v, is_causal=c["causal"], scale=c.get("scale"),
                                                    enable_gqa=c["h"] != c["hkv"])
                ref = reference_sdpa(q, k, v, c["causal"], c.get("scale"))
                self.assertLess(maxdiff(o, ref), 1e-4)
                # Laid out [B, Sq, H, Dv]: the output projection's input is a view.
                self.assertTrue(o.transpose(1, 2).is_contiguous())
                g = torch.randn_like(o)
                for got, want in zip(torch.autograd.grad(o, (q, k, v), g), torch.autograd.grad(ref, (q, k, v), g)):
                    self.assertLess(maxdiff(got, want), 1e-4)

    def test_attention_refusals_match_torch(self):
        q = torch.randn(1, 4, 3, 8)
        k = torch.randn(1, 2, 3, 8)
        with self.assertRaises(ValueError):
            rt.scaled_dot_product_attention(q, k, k)  # grouped heads without enable_gqa
        with self.assertRaises(rt.NotSupported):
            rt.scaled_dot_product_attention(q, q, q, attn_mask=torch.ones(3, 3, dtype=torch.bool))
        with self.assertRaises(rt.NotSupported):
            rt.scaled_dot_product_attention(q, q, q, dropout_p=0.1)

    def test_hostile_shapes_and_dtypes_change_nothing(self):
        calls = rt.stats()["calls"]
        with self.assertRaises(ValueError):
            torch.ops.regen.mm(torch.randn(3, 4), torch.randn(5, 6))
        with self.assertRaises(ValueError):
            torch.ops.regen.linear(torch.randn(3, 4), torch.randn(5, 6), None, "relu")
        with self.assertRaises(rt.NotSupported):
            rt.matmul(torch.ones(3, 4, dtype=torch.int32), torch.ones(4, 2, dtype=torch.int32))
        self.assertEqual(rt.stats()["calls"], calls)
        # Empty operands are answered without regend.
        self.assertEqual(rt.matmul(torch.randn(0, 4), torch.randn(4, 3)).shape, (0, 3))
        self.assertEqual(rt.matmul(torch.randn(2, 0), torch.randn(0, 3)).abs().sum().item(), 0)
        self.assertEqual(rt.stats()["calls"], calls)

    def test_fake_tensors_trace_without_calls(self):
        from torch._subclasses.fake_tensor import FakeTensorMode
        calls = rt.stats()["calls"]
        with FakeTensorMode():
            a, b = torch.empty(64, 32), torch.empty(32, 16)
            self.assertEqual(tuple(torch.ops.regen.mm(a, b).shape), (64, 16))
            x, w = torch.empty(10, 32), torch.empty(48, 32)
            self.assertEqual(tuple(torch.ops.regen.linear(x, w, None, "gelu").shape), (10, 48))
            q, k, v = torch.empty(2, 4, 9, 16), torch.empty(2, 2, 11, 16), torch.empty(2, 2, 11, 8)
            o, lse = torch.ops.regen.sdpa(q, k, v, True, None)
            self.assertEqual((tuple(o.shape), tuple(lse.shape), lse.dtype), ((2, 4, 9, 8), (2, 4, 9), torch.float32))
            dq, dk, dv = torch.ops.regen.sdpa_backward(o, q, k, v, o, lse, True, None)
            self.assertEqual([tuple(t.shape) for t in (dq, dk, dv)], [(2, 4, 9, 16), (2, 2, 11, 16), (2, 2, 11, 8)])
        self.assertEqual(rt.stats()["calls"], calls)


class AutoOrdering(unittest.TestCase):
    def test_probes_both_then_keeps_the_faster(self):
        from regen.torch._runtime import _AutoOrdering
        auto, kind, seen = _AutoOrdering(), ("gemm", 20), []
        for _ in range(300):
            mode = auto.choose(kind)
            seen.append(mode)
            auto.note(kind, mode, 0.001 if mode == "sync" else 0.002)
        self.assertEqual(set(seen[:8]), {"wait", "sync"})
        steady = seen[8:]
        self.assertGreater(steady.count("sync"), 0.95 * len(steady))
        self.assertIn("wait", steady, "the slower one is tried again now and then")
        self.assertEqual(set(auto.table()["gemm/2^20"]), {"wait", "sync"})

    def test_choices_without_times_keep_probing(self):
        # Calls that failed (or, before the fix, found the stream idle)
        # note no time: "auto" must still choose instead of taking the
        # fastest of nothing.
        from regen.torch._runtime import _AutoOrdering
        auto, kind = _AutoOrdering(), ("gemm", 20)
        modes = [auto.choose(kind) for _ in range(20)]
        self.assertEqual(set(modes), {"wait", "sync"})
        auto.note(kind, "wait", 0.001)
        self.assertEqual(auto.choose(kind), "sync", "the mode with no time yet is probed")

    def test_cpu_tensors_need_no_ordering(self):
        own = rt.Runtime(socket=daemon.socket, ordering="auto")
        saved, rt._runtime = rt._runtime, own
        try:
            a, b = torch.randn(8, 8), torch.randn(8, 8)
            self.assertLess(maxdiff(rt.matmul(a, b), a @ b), 1e-4)
            self.assertEqual(own.stats()["auto_us"], {})
        finally:
            rt._runtime = saved
            own.close()


class Routing(unittest.TestCase):
    def test_enable_routes_and_falls_back(self):
        torch.manual_seed(3)
        model = torch.nn.Sequential(torch.nn.Linear(32, 64), torch.nn.GELU(), torch.nn.Linear(64, 8))
        x = torch.randn(16, 32)
        want = model(x)
        before = rt.stats()
        with rt.enable(devices=("cpu",)):
            got = model(x)
            m = torch.matmul(x, torch.randn(32, 4))
            i = torch.ones(2, 3, dtype=torch.int64) @ torch.ones(3, 2, dtype=torch.int64)
        after = rt.stats()
        self.assertLess(maxdiff(got, want), 1e-4)
        self.assertEqual(m.shape, (16, 4))
        self.assertEqual(i.tolist(), [[3, 3], [3, 3]])
        self.assertEqual(after["calls"] - before["calls"], 3, "two linears and a matmul in regend")
        self.assertEqual(after["fallbacks"] - before["fallbacks"], 1, "the int64 matmul stayed in torch")
        # Outside the scope nothing goes to regend.
        model(x)
        self.assertEqual(rt.stats()["calls"], after["calls"])


    def test_linear_by_keyword_is_routed(self):
        """F.linear with its operands named (input=, weight=, bias=) goes
        to regend as positional ones do; it raised IndexError (args[0] of
        an empty tuple)."""
        import torch.nn.functional as F
        torch.manual_seed(4)
        x, w, b = torch.randn(16, 32), torch.randn(8, 32), torch.randn(8)
        before = rt.stats()
        with rt.enable(devices=("cpu",)):
            y1 = F.linear(input=x, weight=w, bias=b)
            y2 = F.linear(x, weight=w)
        self.assertLess(maxdiff(y1, x @ w.t() + b), 1e-4)
        self.assertLess(maxdiff(y2, x @ w.t()), 1e-4)
        self.assertEqual(rt.stats()["calls"] - before["calls"], 2)


class Batches(unittest.TestCase):
    """A batch's later calls (chained on regend's lane) go without waiting
    for their answers; the batch's end collects them.  Host-pool tensors
    throughout: a call with a copied CPU operand is answered at once."""

    def setUp(self):
        from regen.torch._ops import _empty, _gemm
        self.empty, self.gemm = _empty, _gemm
        torch.manual_seed(11)
        self.a = self.pooled(torch.randn(16, 16) / 4)
        self.b = self.pooled(torch.randn(16, 16) / 4)
        self.want = self.a @ self.b @ self.b @ self.b

    def pooled(self, t):
        p = rt.host_empty(list(t.shape), t.dtype)
        p.copy_(t)
        return p

    def chain(self, rtm, after_second=None):
        with rtm.batch():
            y1 = self.gemm(self.a, self.b, self.empty([16, 16], self.a.dtype, self.a))
            y2 = self.gemm(y1, self.b, self.empty([16, 16], self.a.dtype, self.a))
            if after_second is not None:
                after_second()
            return self.gemm(y2, self.b, self.empty([16, 16], self.a.dtype, self.a))

    def test_queued_calls_are_answered_at_the_batch_end(self):
        rtm = rt.runtime()
        st = rtm.stats()
        y = self.chain(rtm)
        after = rtm.stats()
        self.assertEqual(after["chained_calls"] - st["chained_calls"], 2)
        self.assertEqual(after["flushes"] - st["flushes"], 1)
        # Every operand in the host pool: where regen._accel is loaded and
        # the lane is on the ring, it encoded both chained calls.
        self.assertEqual(after["accel_calls"] - st["accel_calls"], 2 if accel_expected() else 0)
        self.assertLess(maxdiff(y, self.want), 1e-4)
        # The MLP's batches, every tensor in the host pool: values and
        # gradients against torch.
        F = torch.nn.functional
        x = self.pooled(torch.randn(6, 24)).requires_grad_()
        w1 = self.pooled(torch.randn(40, 24) / 5).requires_grad_()
        b1 = self.pooled(torch.randn(40)).requires_grad_()
        w2 = self.pooled(torch.randn(16, 40) / 6).requires_grad_()
        b2 = self.pooled(torch.randn(16)).requires_grad_()
        st = rtm.stats()
        y = rt.mlp(x, w1, b1, w2, b2)
        g = torch.randn_like(y)
        got = torch.autograd.grad(y, (x, w1, b1, w2, b2), g)
        after = rtm.stats()
        self.assertGreaterEqual(after["chained_calls"] - st["chained_calls"], 5)
        # The C encoder covers a call whose operands' chunks and buffers the
        # lane knows already; the first call naming a new one goes through
        # Python (libregen's lookup, a Bind).
        accel_calls = after["accel_calls"] - st["accel_calls"]
        if accel_expected():
            self.assertGreater(accel_calls, 0)
        else:
            self.assertEqual(accel_calls, 0)
        ref = F.linear(F.gelu(F.linear(x, w1, b1), approximate="tanh"), w2, b2)
        self.assertLess(maxdiff(y, ref), 1e-4)
        for p, q in zip(got, torch.autograd.grad(ref, (x, w1, b1, w2, b2), g)):
            self.assertLess(maxdiff(p, q), 1e-3)

    def test_an_error_among_queued_calls_is_raised_at_the_end(self):
        rtm = rt.runtime()
        returned = []
        with self.assertRaises(regen.InvalidOperand):
            with rtm.batch():
                y1 = self.gemm(self.a, self.b, self.empty([16, 16], self.a.dtype, self.a))
                self.gemm(y1, self.b, self.empty([16, 8], self.a.dtype, self.a))   # D's shape is wrong
                returned.append(True)
        self.assertEqual(returned, [True], "the queued call itself returned")
        self.assertLess(maxdiff(rt.matmul(self.a, self.b), self.a @ self.b), 1e-4)
        # A batch's first call is queued too: its error comes at the end.
        returned.clear()
        with self.assertRaises(regen.InvalidOperand):
            with rtm.batch():
                y1 = self.gemm(self.a, self.b, self.empty([16, 8], self.a.dtype, self.a))   # D's shape is wrong
                returned.append(True)
        self.assertEqual(returned, [True], "the batch's first call returned before its answer")
        self.assertLess(maxdiff(rt.matmul(self.a, self.b), self.a @ self.b), 1e-4)

    def restart_device(self):
        """regenctl restart of device 0, returned once its generation moved."""
        admin = regen.Client(daemon.socket, timeout=30)
        try:
            gen = admin.generation()["devices"][0]["generation"]
            admin.restart(0, reason="test_torch_host batch")
            deadline = time.monotonic() + 30
            while admin.generation()["devices"][0]["generation"] <= gen and time.monotonic() < deadline:
                time.sleep(0.02)
        finally:
            admin.close()

    def test_a_restart_mid_batch_runs_the_queued_calls_again(self):
        rtm = rt.runtime()
        st = rtm.stats()
        y = self.chain(rtm, self.restart_device)
        after = rtm.stats()
        self.assertGreaterEqual(after["recoveries"] - st["recoveries"], 1)
        self.assertLess(maxdiff(y, self.want), 1e-4)

    def crash_worker(self):
        """A crash injected into device 0's worker, returned once a new one
        serves."""
        admin = regen.Client(daemon.socket, timeout=30)
        try:
            gen = admin.generation()["devices"][0]["generation"]
            admin.inject_fault(0, "crash")
            deadline = time.monotonic() + 30
            while time.monotonic() < deadline:
                d = admin.generation()["devices"][0]
                if d["generation"] > gen and d["state"] == "ready":
                    break
                time.sleep(0.02)
        finally:
            admin.close()

    def test_a_crash_mid_batch_then_a_new_buffer_recovers(self):
        """The batch's first call queued, the worker crashes, and the
        batch's next call names memory the lane has not bound yet: its Bind
        meets the dead connection.  The lane goes with it and the batch runs
        again on a new one (the lane was kept, with its first call
        unanswered, and every retry went to the dead connection until
        RecoveryFailed)."""
        rtm = rt.runtime()
        st = rtm.stats()
        # Over half a host chunk: a chunk, and an import id, of its own.
        big = self.pooled(torch.randn(16, 129 << 14) / 4)
        with rtm.batch():
            y1 = self.gemm(self.a, self.b, self.empty([16, 16], self.a.dtype, self.a))
            self.crash_worker()
            y2 = self.gemm(y1, big, self.empty([16, big.shape[1]], self.a.dtype, self.a))
        self.assertGreaterEqual(rtm.stats()["recoveries"] - st["recoveries"], 1)
        self.assertLess(maxdiff(y2, (self.a @ self.b) @ big), 1e-3)

    def test_a_queued_operand_goes_with_its_own_strides(self):
        """A chained call's operands are encoded with their own strides, as
        an unchained call's: a GEMM operand whose rows are not contiguous
        (a transposed view given straight to the runtime) is regend's
        refusal, named, chained or a run's first; nothing is written, and
        the next operation works."""
        rtm = rt.runtime()
        for chained in (False, True):
            with self.subTest(chained=chained):
                st = rtm.stats()
                out = self.pooled(torch.full((16, 16), 7.0))
                with self.assertRaises(regen.InvalidOperand) as caught:
                    with rtm.batch():
                        y1 = self.gemm(self.a, self.b, self.empty([16, 16], self.a.dtype, self.a)) if chained \
                            else self.a
                        rtm.call("gemm", {"a": y1, "b": self.b.t(), "d": out}, {})
                self.assertIn("stride", str(caught.exception))
                self.assertEqual(rtm.stats()["chained_calls"] - st["chained_calls"], 1 if chained else 0)
                self.assertTrue(bool((out == 7.0).all()), "the refused call wrote nothing")
                self.assertLess(maxdiff(rt.matmul(self.a, self.b), self.a @ self.b), 1e-4)


class Lifecycle(unittest.TestCase):
    def setUp(self):
        self.admin = regen.Client(daemon.socket, timeout=30)
        torch.manual_seed(5)
        self.a, self.b = torch.randn(32, 24), torch.randn(24, 8)
        self.want = self.a @ self.b

    def tearDown(self):
        self.admin.close()

    def check_served(self):
        self.assertLess(maxdiff(rt.matmul(self.a, self.b), self.want), 1e-4)

    def wait_generation_after(self, gen):
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            try:
                d = self.admin.generation()["devices"][0]
                if d["generation"] > gen:
                    return
            except regen.Error:
                pass
            time.sleep(0.02)
        self.fail(f"the generation did not move past {gen}")

    def test_restart_between_operations(self):
        self.check_served()
        before = rt.stats()
        self.admin.restart(0, reason="test_torch_host")
        self.check_served()
        after = rt.stats()
        self.assertGreaterEqual(after["retries"] - before["retries"], 1)

    def test_device_lost_and_crash(self):
        for kind in ("device_lost", "crash"):
            with self.subTest(kind=kind):
                self.check_served()
                before = rt.stats()
                gen = self.admin.generation()["devices"][0]["generation"]
                self.admin.inject_fault(0, kind)
                # The operation comes after the fault took the generation:
                # what it names is stale, and it must recover.
                self.wait_generation_after(gen)
                self.check_served()
                self.assertGreaterEqual(rt.stats()["recoveries"] - before["recoveries"], 1)

    def test_regend_itself_restarts(self):
        """regend is killed and started again on its socket (a crash, an
        upgrade): it goes on past the generations the old one served, so
        the operation's recovery (wait for a later generation, import again)
        works as for a Restart.  A regend counting from 1 again left the
        runtime retrying the old ids until RecoveryFailed."""
        for _ in range(2):
            gen = self.admin.generation()["devices"][0]["generation"]
            self.admin.restart(0, reason="test_torch_host: a later generation")
            self.wait_generation_after(gen)
            self.check_served()
        seen = rt.runtime()._generation[0]
        before = rt.stats()
        daemon.kill()
        daemon.start()
        self.check_served()
        self.assertGreater(rt.runtime()._generation[0], seen)
        self.assertGreaterEqual(rt.stats()["retries"] - before["retries"], 1)

    def test_without_retry_the_error_is_named(self):
        own = rt.Runtime(socket=daemon.socket, retry=False)
        saved = rt._runtime
        rt._runtime = own
        try:
            self.check_served()
            self.admin.restart(0, reason="no retry")
            with self.assertRaises((regen.StaleGeneration, regen.ConnectionReset)):
                rt.matmul(self.a, self.b)
        finally:
            rt._runtime = saved
            own.client.close()

    def test_recovery_gives_up_with_recovery_failed(self):
        """A worker that stops answering (SIGSTOP) and, with a heartbeat
        longer than the test, is not replaced: each try times out, and after
        the recovery timeout the operation raises RecoveryFailed.  (With the
        default heartbeat regend respawns it and the operation goes on:
        test_stopped_worker_is_replaced.)"""
        d = Regend(devices=1, extra=["--heartbeat-ms", "600000"])
        own = rt.Runtime(socket=d.socket, timeout=0.5, recovery_timeout=2.0)
        saved = rt._runtime
        rt._runtime = own
        pid = None
        try:
            self.check_served()
            with regen.Client(d.socket) as c:
                pid = c.device_info(0)["worker_pid"]
            os.kill(pid, signal.SIGSTOP)
            start = time.monotonic()
            with self.assertRaises(rt.RecoveryFailed):
                rt.matmul(self.a, self.b)
            self.assertLess(time.monotonic() - start, 10)
        finally:
            if pid is not None:
                os.kill(pid, signal.SIGCONT)
            rt._runtime = saved
            own.client.close()
            d.stop()
        # The pool imports into the first regend again.
        rt.runtime().pool.configure(daemon.socket)
        self.check_served()

    def test_stopped_worker_is_replaced(self):
        pid = self.admin.device_info(0)["worker_pid"]
        self.check_served()
        before = rt.stats()
        os.kill(pid, signal.SIGSTOP)
        try:
            self.check_served()
        finally:
            try:
                os.kill(pid, signal.SIGCONT)
            except ProcessLookupError:
                pass
        self.assertGreaterEqual(rt.stats()["recoveries"] - before["recoveries"], 1)
        self.assertNotEqual(self.admin.device_info(0)["worker_pid"], pid)


class Optimizer(unittest.TestCase):
    """regen.torch.optim.AdamW: its step is one program Run over every
    parameter, the same update as torch.optim.AdamW's (two groups, a
    learning rate changed between steps as a scheduler does), and an update
    that a fault interrupts (device_lost, a restart, a worker crash, each
    right before a step) lands exactly once: the parameters stay equal to
    torch's step after step."""

    SHAPES = [(16, 8), (8,), (4, 4, 3)]

    def setUp(self):
        self.admin = regen.Client(daemon.socket, timeout=30)

    def tearDown(self):
        self.admin.close()

    def test_adamw_steps_equal_torchs_through_faults(self):
        import regen.torch.optim as ropt
        torch.manual_seed(21)
        init = [torch.randn(s) for s in self.SHAPES]
        ref = [torch.nn.Parameter(t.clone()) for t in init]
        mine = [torch.nn.Parameter(rt.host_empty(list(t.shape), t.dtype).copy_(t)) for t in init]
        groups = lambda ps: [{"params": ps[:2]}, {"params": ps[2:], "weight_decay": 0.0, "lr": 3e-2}]
        opt_ref = torch.optim.AdamW(groups(ref), lr=1e-2, betas=(0.8, 0.95), eps=1e-6, weight_decay=0.1)
        opt_mine = ropt.AdamW(groups(mine), lr=1e-2, betas=(0.8, 0.95), eps=1e-6, weight_decay=0.1)
        faults = {3: "device_lost", 6: "restart", 9: "crash"}
        before = rt.stats()
        for step in range(12):
            for r, m in zip(ref, mine):
                g = torch.randn(r.shape)
                r.grad = g.clone()
                m.grad = rt.host_empty(list(g.shape), g.dtype).copy_(g)
            if step == 7:
                for o in (opt_ref, opt_mine):
                    o.param_groups[0]["lr"] *= 0.5
            kind = faults.get(step)
            if kind == "restart":
                self.admin.restart(0, reason="test_torch_host optimizer")
            elif kind is not None:
                gen = self.admin.generation()["devices"][0]["generation"]
                self.admin.inject_fault(0, kind)
                deadline = time.monotonic() + 30
                while time.monotonic() < deadline:
                    try:
                        if self.admin.generation()["devices"][0]["generation"] > gen:
                            break
                    except regen.Error:
                        pass
                    time.sleep(0.02)
            opt_ref.step()
            opt_mine.step()
            for i, (r, m) in enumerate(zip(ref, mine)):
                self.assertLess(maxdiff(m, r), 1e-5, f"step {step}, parameter {i}")
                self.assertLess(maxdiff(opt_mine.state[m]["exp_avg_sq"], opt_ref.state[r]["exp_avg_sq"]), 1e-6)
        after = rt.stats()
        self.assertEqual(after["program_runs"] - before["program_runs"], 12)
        self.assertGreaterEqual(after["retries"] - before["retries"], 1)
        self.assertEqual(float(opt_mine.state[mine[0]]["step"]), 12.0)

    def test_a_dropped_optimizer_drops_its_program(self):
        import gc
        import regen.torch.optim as ropt

        def adamw_programs():
            return [p for p in rt.runtime().client.program_status(0) if p["name"] == "adamw"]
        had = len(adamw_programs())
        p = torch.nn.Parameter(rt.host_empty([5], torch.float32).fill_(1.0))
        opt = ropt.AdamW([p], lr=0.1)
        p.grad = rt.host_empty([5], torch.float32).fill_(0.5)
        opt.step()
        self.assertEqual(len(adamw_programs()), had + 1)
        del opt
        gc.collect()
        self.assertEqual(len(adamw_programs()), had)

    def test_state_dict_round_trip(self):
        import regen.torch.optim as ropt
        p = torch.nn.Parameter(rt.host_empty([6], torch.float32).copy_(torch.arange(6.0)))
        opt = ropt.AdamW([p], lr=0.1)
        p.grad = rt.host_empty([6], torch.float32).fill_(1.0)
        opt.step()
        sd = opt.state_dict()
        self.assertEqual(float(sd["state"][0]["step"]), 1.0)
        self.assertLess(maxdiff(sd["state"][0]["exp_avg"], torch.full([6], 0.1)), 1e-6)


class Training(unittest.TestCase):
    """A small transformer block trained in regend and in process from the
    same seed: the loss curves agree through a restart and a device_lost."""

    def make_model(self, attention):
        torch.manual_seed(11)
        width, heads = 32, 4

        class Block(torch.nn.Module):
            def __init__(self):
                super().__init__()
                self.qkv = torch.nn.Linear(width, 3 * width)
                self.proj = torch.nn.Linear(width, width)
                self.up = torch.nn.Linear(width, 4 * width)
                self.down = torch.nn.Linear(4 * width, width)

            def forward(self, x):
                b, s, _ = x.shape
                q, k, v = self.qkv(x).view(b, s, 3, heads, width // heads).permute(2, 0, 3, 1, 4)
                a = attention(q, k, v, is_causal=True)
                x = x + self.proj(a.transpose(1, 2).reshape(b, s, width))
                return x + self.down(torch.nn.functional.gelu(self.up(x), approximate="tanh"))

        return Block()

    def run_steps(self, through_regend, steps, faults=()):
        model = self.make_model(rt.scaled_dot_product_attention if through_regend else reference_sdpa_causal)
        opt = torch.optim.SGD(model.parameters(), lr=0.05)
        g = torch.Generator().manual_seed(7)
        losses = []
        admin = regen.Client(daemon.socket, timeout=30)
        try:
            for step in range(steps):
                x = torch.randn(4, 12, 32, generator=g)
                target = torch.randn(4, 12, 32, generator=g)
                if step in faults:
                    kind = faults[step]
                    if kind == "restart":
                        admin.restart(0, reason="training test")
                    else:
                        admin.inject_fault(0, kind)
                if through_regend:
                    with rt.enable(devices=("cpu",)):
                        loss = torch.nn.functional.mse_loss(model(x), target)
                        loss.backward()
                else:
                    loss = torch.nn.functional.mse_loss(model(x), target)
                    loss.backward()
                opt.step()
                opt.zero_grad()
                losses.append(loss.item())
        finally:
            admin.close()
        return losses

    def test_loss_curve_matches_in_process(self):
        steps = 12
        want = self.run_steps(False, steps)
        before = rt.stats()
        got = self.run_steps(True, steps, faults={4: "restart", 8: "device_lost"})
        after = rt.stats()
        self.assertEqual(len(got), steps, "no step lost")
        for i, (a, b) in enumerate(zip(got, want)):
            self.assertLess(abs(a - b), 1e-4 * max(1.0, abs(b)), f"step {i}: {a} vs {b}")
        self.assertLess(got[-1], got[0], "it trained")
        self.assertGreaterEqual(after["recoveries"] - before["recoveries"], 2)


def reference_sdpa_causal(q, k, v, is_causal=False):
    return reference_sdpa(q, k, v, is_causal)


class ProcessPool(unittest.TestCase):
    """The whole-process pool's refusals, where they can be seen without a
    GPU (the pool itself: tests/gpu/test_torch_process_pool.py)."""

    def run_child(self, env, code):
        import subprocess
        full = dict(os.environ, PYTHONPATH=os.path.dirname(HERE), **env)
        return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=full, timeout=120)

    def test_refusals_are_named_and_change_nothing(self):
        if torch.cuda.is_available():
            self.skipTest("a usable GPU here: tests/gpu/test_torch_process_pool.py")
        with self.assertRaises(rt.NotSupported) as cm:
            rt.use_pool_for_process()
        self.assertIn("use_pool_for_process", str(cm.exception))
        self.assertFalse(rt.process_pool_enabled())
        rt.empty_cache()
        # Nothing changed: operations go to regend as before.
        with rt.enable(devices=("cpu",)):
            x = torch.randn(8, 8)
            self.assertLess(maxdiff(torch.matmul(x, x), x @ x), 1e-4)

    def test_environment(self):
        r = self.run_child({"REGEN_TORCH_POOL": "bogus"}, "import regen.torch")
        self.assertNotEqual(r.returncode, 0)
        self.assertIn("ValueError: REGEN_TORCH_POOL='bogus'", r.stderr)
        r = self.run_child({"REGEN_TORCH_POOL": "scoped"},
                           "import regen.torch as rt; assert not rt.process_pool_enabled(); print('ok')")
        self.assertEqual((r.returncode, r.stdout.strip()), (0, "ok"), r.stderr)
        if not torch.cuda.is_available():
            # Asked for and not to be had: the import says so by name.
            r = self.run_child({"REGEN_TORCH_POOL": "process"}, "import regen.torch")
            self.assertNotEqual(r.returncode, 0)
            self.assertIn("NotSupported", r.stderr)


class ClientTensors(unittest.TestCase):
    """regen.Client takes torch tensors for operands on the torch it runs
    with: 1.13 (Debian's) has no untyped_storage(), which the client had
    asked a tensor for before it took it for one."""

    def test_tensors_are_taken_for_tensors(self):
        from regen.torch._tensors import _is_torch_tensor

        class Mine(torch.Tensor):
            pass

        x = torch.zeros(4, 4)
        for t in (x, torch.nn.Parameter(torch.zeros(2)), x.as_subclass(Mine)):
            self.assertTrue(_is_torch_tensor(t), type(t))
        for other in ([0.0], regen.Operand("b0.1.1", 0, "f32", [1]), object()):
            self.assertFalse(_is_torch_tensor(other), type(other))
        c = regen.Client(daemon.socket, timeout=30)
        try:
            # Taken for a tensor, and refused as a CPU one (it had been
            # refused as not a tensor at all).
            with self.assertRaisesRegex(TypeError, "needs a CUDA tensor"):
                c.gemm(x, x, x)
            self.assertFalse(c.close_tensor(x, device=0))
        finally:
            c.close()
        from regen.torch._tensors import untyped_storage
        self.assertEqual(untyped_storage(x[1:]).data_ptr(), x.data_ptr())


class BlockImports(unittest.TestCase):
    """A CUDA block's import (tensors outside the pool), with the worker
    connection replaced: what becomes of the pin when the import fails."""

    class Storage:
        def data_ptr(self):
            return 0x10000

        def _share_cuda_(self):
            # device, versioned handle, size, offset in the block, ref counter, its offset, event, sync
            return (0, b"\x02c" + bytes(64), 4096, 0, b"/torch_rc", 7, b"", False)

    def setUp(self):
        from regen.torch import _tensors as client_mod
        self.mod = client_mod
        self.saved = client_mod.release_ipc_counter
        self.released = []
        client_mod.release_ipc_counter = lambda h, o: self.released.append((h, o))
        self.c = regen.Client("/nonexistent.sock")
        self.c._note_generation(0, 1)

    def tearDown(self):
        self.mod.release_ipc_counter = self.saved

    def import_block(self, exc):
        def call(device, method, params, fds=()):
            raise exc
        self.c._worker_call = call
        from regen.torch._runtime import Runtime
        with self.assertRaises(type(exc)):
            Runtime._import_block(type("Rt", (), {"client": self.c})(), self.Storage(), 0, 0x10000, 4096)

    def test_a_refused_import_lets_the_pin_go(self):
        self.import_block(regen.errors.error_from_reply("io.regen.ImportFailed", {"kind": "cuda_ipc"}))
        self.assertEqual(self.released, [(b"/torch_rc", 7)])

    def test_an_import_whose_answer_was_lost_holds_the_pin_until_the_generation_changes(self):
        """The worker may map the block: torch must not reuse it (the pin
        had gone at once)."""
        self.import_block(regen.ConnectionReset(parameters={"message": "the worker went"}))
        self.assertEqual(self.released, [])
        self.c._note_generation(0, 2)
        self.assertEqual(self.released, [(b"/torch_rc", 7)])


class EventPairs(unittest.TestCase):
    """The IPC event pairs that "wait" and "events" ordering keep per
    (device, stream).  They are CUDA's (regend's host backend imports no
    event): torch.cuda.Event and the client's import_event and close_event
    are stand-ins here that count what would be imported and closed."""

    def setUp(self):
        from regen.torch._runtime import EVENT_PAIRS_MAX, Runtime
        self.max = EVENT_PAIRS_MAX
        self.rt = Runtime(socket=daemon.socket)
        self.imported, self.closed = [], []

        def import_event(device, handle):
            ev = types.SimpleNamespace(id=f"e{device}.1.{len(self.imported)}", generation=1, device=device)
            self.imported.append(ev.id)
            return ev
        self.rt.client.import_event = import_event
        self.rt.client.close_event = lambda ev: self.closed.append(ev.id)

        class Event:
            def __init__(self, interprocess=False):
                pass

            def ipc_handle(self):
                return bytes(64)
        self.saved = torch.cuda.Event, torch.cuda.device
        torch.cuda.Event, torch.cuda.device = Event, lambda index: contextlib.nullcontext()

    def tearDown(self):
        torch.cuda.Event, torch.cuda.device = self.saved
        self.rt.close()

    def pair(self, device, stream):
        return self.rt._events_for(device, types.SimpleNamespace(cuda_stream=stream), device)

    def live(self):
        return len(self.imported) - len(self.closed)

    def test_a_rank_using_stream_after_stream_holds_a_bounded_number(self):
        """Two imports per stream ever used had stayed in regend until the
        process's last connection closed, rt.close() too."""
        hot = self.pair(0, 1).ids
        for i in range(10 * self.max):
            self.pair(0, 1000 + i)
            self.assertIs(self.pair(0, 1).ids, hot, "the stream in use keeps its pair")
            self.assertLessEqual(self.live(), 2 * self.max)
        self.assertEqual(self.live(), 2 * self.max)
        self.assertNotIn(hot[0].id, self.closed)
        self.assertEqual(self.rt.counters["event_closes"], len(self.closed))
        # Each device is bounded on its own.
        for i in range(3):
            self.pair(1, 2000 + i)
        self.assertEqual(self.live(), 2 * (self.max + 3))
        self.rt.close()
        self.assertEqual(sorted(self.closed), sorted(self.imported), "rt.close() closes every pair")

    def test_no_close_while_a_batch_waits_for_its_answers(self):
        """A close drains the lane, whose answers flush() collects: a
        batch's queued calls hold back the trim until the next sweep."""
        self.rt._deferred = [("gemm", {}, {})]
        for i in range(self.max + 4):
            self.pair(0, 3000 + i)
        self.assertEqual(self.closed, [])
        self.rt._deferred = []
        self.rt.sweep()
        self.assertEqual(self.live(), 2 * self.max)


class Fork(unittest.TestCase):
    def test_a_forked_child_runs_its_own_calls_and_the_parent_goes_on(self):
        """A forked child (a DataLoader worker) that calls regend gets
        connections and imports of its own; the parent's lane, ring and
        imports are untouched and it goes on.  The child had written its
        records into the parent's ring and read the parent's sockets."""
        torch.manual_seed(8)
        a, b = torch.randn(24, 16), torch.randn(16, 8)
        self.assertLess(maxdiff(rt.matmul(a, b), a @ b), 1e-4)   # the parent's lane and ring are open
        pid = os.fork()
        if pid == 0:
            code = 1
            try:
                ok = all(maxdiff(rt.matmul(a, b), a @ b) < 1e-4 for _ in range(20))
                code = 0 if ok else 2
            finally:
                os._exit(code)
        for _ in range(20):
            self.assertLess(maxdiff(rt.matmul(b.t(), a.t()), (a @ b).t()), 1e-4)
        _, status = os.waitpid(pid, 0)
        self.assertEqual(os.waitstatus_to_exitcode(status), 0, "the child's calls failed or were wrong")
        for _ in range(20):
            self.assertLess(maxdiff(rt.matmul(a, b), a @ b), 1e-4)


class HostPoolAtExit(unittest.TestCase):
    def test_a_tensor_read_at_exit_still_has_its_memory(self):
        """A host-pool tensor that lives until the interpreter's exit keeps
        its memory through it: an atexit handler registered before it reads
        it.  weakref.finalize's default gave the memory back at exit first
        (the chunk unmapped): SIGSEGV."""
        import subprocess
        code = "\n".join([
            "import atexit, sys",
            "sys.path.insert(0, %r)" % os.path.dirname(HERE),
            "import torch",
            "from regen.torch import host_empty",
            "from regen.pool import Pool",
            "atexit.register(lambda: print('at exit:', t.sum().item(), flush=True))",
            "Pool.get().configure(chunk_bytes=4 << 20)",
            "t = host_empty([4 << 20], torch.float32)",
            "t.fill_(1.0)",
        ])
        r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
        self.assertEqual(r.returncode, 0, r.stderr[-2000:])
        self.assertIn("at exit: 4194304.0", r.stdout)


class Memory(unittest.TestCase):
    def test_fresh_activations_keep_imports_and_memory_flat(self):
        """2,000 steps, each allocating fresh inputs and outputs: the host
        pool's chunks and imports stay bounded, and regend's memory too."""
        admin = regen.Client(daemon.socket, timeout=30)
        w = torch.randn(64, 64)
        first = None
        for step in range(2000):
            x = torch.randn(32, 64)
            y = rt.matmul(x, w)
            y = rt.linear(y, w)
            if step == 100:
                first = (rt.stats()["pool"], admin.device_info(0)["memory_used"])
        last = (rt.stats()["pool"], admin.device_info(0)["memory_used"])
        admin.close()
        self.assertLessEqual(last[0]["chunks"], first[0]["chunks"] + 1)
        self.assertLessEqual(last[0]["imports"], max(first[0]["imports"], 1) + 1)
        self.assertLessEqual(last[0]["used_bytes"], first[0]["used_bytes"] + (1 << 20))
        self.assertLessEqual(last[1], first[1] + (4 << 20), f"regend's memory grew: {first[1]} -> {last[1]}")


if __name__ == "__main__":
    unittest.main()
