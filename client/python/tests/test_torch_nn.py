# SPDX-License-Identifier: Apache-2.0
"""regen.torch.nn's layers (Linear, LayerNorm, TransformerLayer), rt.layer_norm
and torch.autocast on CPU tensors against a real regend (host backend).

Each layer's output and the gradients of its input and every parameter are
held to the same computation in float64 from the same parameters (torch's
own layers for Linear and LayerNorm), with fresh random inputs; the calls
are counted, so a layer that fell back to torch fails.  Inside
torch.autocast a layer gives what torch's own layer gives there: the same
dtype for its output and its gradients, and values within that dtype's
rounding of float64.  regend's OutOfMemory reaches the caller as
torch.cuda.OutOfMemoryError.  Skipped as a whole where torch is not
importable."""

import math
import os
import sys
import unittest

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.dirname(HERE))
sys.path.insert(0, os.path.join(HERE, "..", "..", "..", "tests", "lib"))
import regen  # noqa: E402
from regend_fixture import Regend, find_regend, torch_rel_error  # noqa: E402

try:
    import torch
    import torch.nn.functional as F
except ImportError:
    torch = None

daemon = None
rt = None

# Relative error (2-norm) allowed against float64, by the dtype computed in:
# float32 accumulates in f32; bfloat16 keeps 8 bits of mantissa.
TOLERANCE = {}


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
    TOLERANCE.update({torch.float32: 1e-5, torch.bfloat16: 2e-2, torch.float16: 3e-3})
    daemon = Regend(devices=1)
    rt.configure(socket=daemon.socket, recovery_timeout=30)


def tearDownModule():
    if daemon is not None:
        daemon.stop()


def leaves(*tensors):
    return [t.detach().clone().requires_grad_() for t in tensors]


def causal_attention(q, k, v):
    s = (q @ k.transpose(-1, -2)) / math.sqrt(q.shape[-1])
    mask = torch.ones(q.shape[2], k.shape[2], dtype=torch.bool).tril()
    return s.masked_fill(~mask, float("-inf")).softmax(-1) @ v


class Case(unittest.TestCase):
    def setUp(self):
        torch.manual_seed(hash(self.id()) & 0xFFFF)

    def assertNear(self, got, want, dtype, what):
        self.assertEqual(got.shape, want.shape, what)
        err = torch_rel_error(got, want)
        self.assertLess(err, TOLERANCE[dtype], f"{what}: relative error {err:.2e} against float64")

    def counted(self, fn):
        """fn()'s result and the regend calls it made."""
        before = rt.stats()["calls"]
        out = fn()
        return out, rt.stats()["calls"] - before


class Layers(Case):
    def test_linear_is_torchs_layer_computed_in_regend(self):
        for dtype in (torch.float32, torch.bfloat16):
            for with_bias in (True, False):
                with self.subTest(dtype=dtype, bias=with_bias):
                    layer = rt.nn.Linear(48, 40, bias=with_bias, dtype=dtype)
                    self.assertIsInstance(layer, torch.nn.Linear)
                    theirs = torch.nn.Linear(48, 40, bias=with_bias, dtype=dtype)
                    layer.load_state_dict(theirs.state_dict())   # torch's state_dict, as is
                    x = torch.randn(3, 7, 48, dtype=dtype, requires_grad=True)
                    y, calls = self.counted(lambda: layer(x))
                    self.assertEqual((y.dtype, calls), (dtype, 1))
                    ref_params = [p.detach().double().requires_grad_() for p in layer.parameters()]
                    x64 = x.detach().double().requires_grad_()
                    ref = F.linear(x64, *ref_params)
                    self.assertNear(y, ref, dtype, "y")
                    g = torch.randn_like(y)
                    got = torch.autograd.grad(y, [x] + list(layer.parameters()), g)
                    want = torch.autograd.grad(ref, [x64] + ref_params, g.double())
                    for name, a, b in zip(["x", "weight", "bias"], got, want):
                        self.assertEqual(a.dtype, dtype, name)
                        self.assertNear(a, b, dtype, "d " + name)

    def test_layer_norm_over_one_and_two_dimensions(self):
        for dtype in (torch.float32, torch.bfloat16):
            for shape, affine in (((64,), True), ((4, 16), True), ((64,), False)):
                with self.subTest(dtype=dtype, shape=shape, affine=affine):
                    layer = rt.nn.LayerNorm(shape, elementwise_affine=affine, dtype=dtype)
                    self.assertIsInstance(layer, torch.nn.LayerNorm)
                    if affine:
                        with torch.no_grad():   # not ones and zeros: the gradients must see them
                            layer.weight.copy_(torch.randn(shape))
                            layer.bias.copy_(torch.randn(shape))
                    x = (torch.randn(5, 3, *shape) * 3 + 1).to(dtype).requires_grad_()
                    y, calls = self.counted(lambda: layer(x))
                    self.assertEqual((y.dtype, calls), (dtype, 1))
                    params = list(layer.parameters())
                    ref_params = [p.detach().double().requires_grad_() for p in params]
                    x64 = x.detach().double().requires_grad_()
                    ref = F.layer_norm(x64, shape, *(ref_params or [None, None]), eps=layer.eps)
                    self.assertNear(y, ref, dtype, "y")
                    g = torch.randn_like(y)
                    got, calls = self.counted(lambda: torch.autograd.grad(y, [x] + params, g))
                    self.assertEqual(calls, 1)
                    want = torch.autograd.grad(ref, [x64] + ref_params, g.double())
                    for name, a, b in zip(["x", "weight", "bias"], got, want):
                        self.assertEqual(a.dtype, dtype, name)
                        self.assertNear(a, b, dtype, "d " + name)

    def test_layer_norm_refusals(self):
        with self.assertRaises(rt.NotSupported):
            rt.layer_norm(torch.randn(4, 8, dtype=torch.float64), [8])
        with self.assertRaises(ValueError):
            rt.layer_norm(torch.randn(4, 8), [4])
        with self.assertRaises(ValueError):
            rt.layer_norm(torch.randn(4, 8), [8], torch.randn(4))

    def reference_layer(self, x64, params, heads, eps):
        """te.TransformerLayer's default computation in float64 ([B, S, W])."""
        ln1_w, ln1_b, qkv_w, qkv_b, proj_w, proj_b, ln2_w, ln2_b, up_w, up_b, down_w, down_b = params
        b, s, w = x64.shape
        q, k, v = F.linear(F.layer_norm(x64, [w], ln1_w, ln1_b, eps), qkv_w, qkv_b) \
            .view(b, s, 3, heads, w // heads).permute(2, 0, 3, 1, 4)
        h = x64 + F.linear(causal_attention(q, k, v).transpose(1, 2).reshape(b, s, w), proj_w, proj_b)
        return h + F.linear(F.gelu(F.linear(F.layer_norm(h, [w], ln2_w, ln2_b, eps), up_w, up_b),
                                   approximate="tanh"), down_w, down_b)

    def test_transformer_layer_in_both_input_formats(self):
        b, s, w, heads, hidden = 2, 9, 24, 3, 40
        for fmt in ("bshd", "sbhd"):
            with self.subTest(attn_input_format=fmt):
                layer = rt.nn.TransformerLayer(w, hidden, heads, attn_input_format=fmt)
                with torch.no_grad():
                    for p in (layer.ln1.weight, layer.ln1.bias, layer.ln2.weight, layer.ln2.bias):
                        p.copy_(torch.randn_like(p))
                x = torch.randn(b, s, w) if fmt == "bshd" else torch.randn(s, b, w)
                x.requires_grad_()
                y, calls = self.counted(lambda: layer(x))
                self.assertEqual((y.shape, calls), (x.shape, 7))   # 2 LayerNorms, 4 GEMMs, attention
                params = list(layer.parameters_in_order())
                ref_params = [p.detach().double().requires_grad_() for p in params]
                x64 = x.detach().double().requires_grad_()
                bshd = x64 if fmt == "bshd" else x64.transpose(0, 1)
                ref = self.reference_layer(bshd, ref_params, heads, layer.layernorm_epsilon)
                ref = ref if fmt == "bshd" else ref.transpose(0, 1)
                self.assertNear(y, ref, torch.float32, "y")
                g = torch.randn_like(y)
                got = torch.autograd.grad(y, [x] + params, g)
                want = torch.autograd.grad(ref, [x64] + ref_params, g.double())
                for i, (a, b_) in enumerate(zip(got, want)):
                    # The block's gradients pass through attention and two
                    # LayerNorms in f32.
                    err = torch_rel_error(a, b_)
                    self.assertLess(err, 1e-4, "x" if i == 0 else rt.BLOCK_PARAMETERS[i - 1])
                self.assertEqual(set(dict(layer.named_parameters())),
                                 {f"{m}.{p}" for m in ("ln1", "qkv", "proj", "ln2", "up", "down")
                                  for p in ("weight", "bias")})

    def test_transformer_layer_refuses_what_regend_does_not_run(self):
        for kwargs in ({"hidden_dropout": 0.1}, {"attention_dropout": 0.1}, {"self_attn_mask_type": "padding"},
                       {"activation": "swiglu"}, {"bias": False}):
            with self.subTest(**kwargs):
                with self.assertRaises(rt.NotSupported):
                    rt.nn.TransformerLayer(24, 40, 3, **kwargs)
        with self.assertRaises(ValueError):
            rt.nn.TransformerLayer(24, 40, 5)


class Autocast(Case):
    """torch.autocast("cpu", bfloat16) around a layer: what torch's own
    layer does there, ours does (dtype of the output and of each gradient,
    values within that dtype's rounding of float64).  Where torch's layer
    raises for a mix, the case is left out."""

    def compare(self, ours, theirs, x_dtype, shape):
        x = torch.randn(*shape).to(x_dtype)
        xa, xb = leaves(x, x)
        try:
            with torch.autocast("cpu", dtype=torch.bfloat16):
                want = theirs(xb)
        except RuntimeError:
            return None
        with torch.autocast("cpu", dtype=torch.bfloat16):
            got, calls = self.counted(lambda: ours(xa))
        self.assertGreaterEqual(calls, 1, "the layer did not run in regend")
        self.assertEqual(got.dtype, want.dtype)
        # Both are the autocast dtype's rounding of the same float64 value.
        self.assertNear(got, want.double(), want.dtype, "y")
        g = torch.randn(want.shape).to(want.dtype)
        got_grads = torch.autograd.grad(got, [xa] + list(ours.parameters()), g)
        want_grads = torch.autograd.grad(want, [xb] + list(theirs.parameters()), g)
        for a, b in zip(got_grads, want_grads):
            self.assertEqual(a.dtype, b.dtype)
            self.assertNear(a, b.double(), torch.bfloat16, "gradient")
        return got.dtype

    def test_linear_and_layer_norm_in_an_autocast_region(self):
        seen = set()
        for x_dtype in (torch.float32, torch.bfloat16):
            with self.subTest(layer="Linear", x=x_dtype):
                ours = rt.nn.Linear(64, 32)
                theirs = torch.nn.Linear(64, 32)
                theirs.load_state_dict(ours.state_dict())
                got = self.compare(ours, theirs, x_dtype, (6, 64))
                self.assertEqual(got, torch.bfloat16)   # linear is on every autocast's lower-precision list
                seen.add(("linear", x_dtype))
            with self.subTest(layer="LayerNorm", x=x_dtype):
                ours = rt.nn.LayerNorm(64)
                theirs = torch.nn.LayerNorm(64)
                if self.compare(ours, theirs, x_dtype, (6, 64)) is not None:
                    seen.add(("layer_norm", x_dtype))
        self.assertIn(("layer_norm", torch.float32), seen)

    def test_functional_ops_and_enable_in_an_autocast_region(self):
        x, w = torch.randn(8, 32), torch.randn(16, 32)
        with torch.autocast("cpu", dtype=torch.bfloat16):
            self.assertEqual(rt.linear(x, w).dtype, F.linear(x, w).dtype)
            self.assertEqual(rt.matmul(x, w.t()).dtype, torch.matmul(x, w.t()).dtype)
            # A bf16 activation times a float32 weight: one dtype for regend.
            before = rt.stats()
            with rt.enable(devices=("cpu",)):
                y = F.linear(x.bfloat16(), w)
            after = rt.stats()
        self.assertEqual((after["calls"] - before["calls"], after["fallbacks"] - before["fallbacks"]), (1, 0))
        self.assertEqual(y.dtype, torch.bfloat16)
        self.assertNear(y, F.linear(x.double(), w.double()), torch.bfloat16, "routed F.linear")
        # Outside the region nothing is cast.
        self.assertEqual(rt.linear(x, w).dtype, torch.float32)

    def test_transformer_layer_in_an_autocast_region(self):
        layer = rt.nn.TransformerLayer(32, 48, 4, attn_input_format="bshd")
        x = torch.randn(2, 8, 32, requires_grad=True)
        with torch.autocast("cpu", dtype=torch.bfloat16):
            y = layer(x)
        self.assertEqual(y.dtype, torch.bfloat16)
        ref = Layers.reference_layer(self, x.detach().double(), [p.detach().double() for p in
                                                                 layer.parameters_in_order()], 4, 1e-5)
        self.assertLess(torch_rel_error(y, ref), 3e-2)
        y.float().sum().backward()
        self.assertEqual(layer.qkv.weight.grad.dtype, torch.float32)   # back through the cast, as torch's
        self.assertEqual(x.grad.dtype, torch.float32)


class Errors(Case):
    def test_regends_out_of_memory_is_torchs(self):
        runtime = rt.runtime()
        real = runtime._call_once

        def refuse(op, tensors, scalars):
            raise regen.OutOfMemory(parameters={"device": 0, "message": "no host memory for 1 GiB of scratch"})
        runtime._call_once = refuse
        try:
            with self.assertRaises(torch.cuda.OutOfMemoryError) as caught:
                rt.nn.Linear(8, 4)(torch.randn(2, 8))
            self.assertIn("no host memory for 1 GiB of scratch", str(caught.exception))
            self.assertIsInstance(caught.exception.__cause__, regen.OutOfMemory)
        finally:
            runtime._call_once = real
        self.assertEqual(rt.nn.Linear(8, 4)(torch.randn(2, 8)).shape, (2, 4))


if __name__ == "__main__":
    unittest.main()
