# SPDX-License-Identifier: Apache-2.0
"""regen.torch.fp8 on CPU tensors against a real regend (host backend):

- the recipe and the autocast scope, their refusals by name;
- an FP8 Linear's forward and backward against float64 of the dequantized
  operands: the FP8 bytes are the tests' own codec (regen.reference) of
  the f32 products, the scales and the amax history bit for bit
  Transformer Engine's update as written here, step after step, for both
  formats, both amax algorithms and a margin;
- a bad scale (0, negative, infinite, NaN) refused by name with the state
  unchanged; wrong dtypes refused by name before any call;
- the FP8 history, the scales and the weights bit-identical to a run
  without faults after 100 restarts and device_losts in the middle of
  training (before a forward, between a forward and its backward);
- the state through state_dict() into a fresh layer.

torch 1.13 (Debian's) has no float8 dtypes: the layer's FP8 tensors are
uint8 there, as everywhere the codec here reads bytes. Skipped where torch
is not importable; the GPU side is tests/bench/bench_fp8.py."""

import math
import os
import struct
import sys
import time
import unittest

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.dirname(HERE))
sys.path.insert(0, os.path.join(HERE, "..", "..", "..", "tests", "lib"))
import regen  # noqa: E402
from regen import reference  # noqa: E402
from regend_fixture import Regend, find_regend  # noqa: E402

try:
    import torch
except ImportError:
    torch = None

daemon = None
rt = None
fp8 = None


def setUpModule():
    global daemon, rt, fp8
    if torch is None:
        raise unittest.SkipTest("torch is not importable")
    if not find_regend():
        raise unittest.SkipTest("no regend (pass --regend or set REGEN_BUILD_ROOT)")
    import regen.torch as rtmod
    rt, fp8 = rtmod, rtmod.fp8
    from regen.pool import Pool
    if Pool.get() is None:
        raise unittest.SkipTest("libregen not found, or REGEN_LIBREGEN=none (a sanitized build)")
    daemon = Regend(devices=1)
    rt.configure(socket=daemon.socket, recovery_timeout=30)


def tearDownModule():
    if daemon is not None:
        daemon.stop()


def f32(v):
    return struct.unpack("f", struct.pack("f", v))[0]


_TABLES = {}


def decode(dt, codes):
    """FP8 bytes (a uint8 tensor) as float64 values, by the tests' codec."""
    table = _TABLES.get(dt)
    if table is None:
        table = _TABLES[dt] = torch.tensor([reference.fp8_decode(dt, c) for c in range(256)], dtype=torch.float64)
    return table[codes.long()]


def encode(dt, values):
    """float64 values (already the f32 products) as FP8 bytes."""
    flat = [reference.fp8_encode(dt, float(v)) for v in values.reshape(-1).tolist()]
    return torch.tensor(flat, dtype=torch.uint8).reshape(values.shape)


def quantize(dt, x, scale):
    """x * scale as an f32 multiply, then the one rounding to FP8."""
    return encode(dt, (x.float() * torch.tensor(scale, dtype=torch.float32)).double())


class Recipe:
    """Transformer Engine's delayed scaling for one direction's state,
    in f32 as its kernel (common/recipe/delayed_scaling.cu) computes."""

    def __init__(self, recipe, n, fp8_dtype):
        self.recipe, self.fp8_dtype = recipe, fp8_dtype
        self.history = torch.zeros(recipe.amax_history_len, n, dtype=torch.float32)
        self.scale = torch.ones(n, dtype=torch.float32)

    def update(self):
        """The update a pass starts with: returns the scales' inverses."""
        h = self.history
        amax = h[0].clone() if self.recipe.amax_compute_algo == "most_recent" else h.max(0).values
        top = torch.tensor(reference.FP8_MAX[self.fp8_dtype], dtype=torch.float32) * \
            torch.tensor(2.0 ** -self.recipe.margin, dtype=torch.float32)
        fresh = torch.where(torch.isfinite(amax) & (amax > 0), top / amax, self.scale)
        self.scale = torch.where(torch.isinf(fresh), torch.tensor(torch.finfo(torch.float32).max), fresh)
        rolled = torch.cat([h[1:], h[:1]]) if h.shape[0] > 1 else h.clone()
        rolled[0] = 0
        self.history = rolled
        return torch.tensor(1.0, dtype=torch.float32) / self.scale


def same_bits(a, b):
    return a.dtype == b.dtype and a.shape == b.shape and \
        torch.equal(a.contiguous().view(torch.int32), b.contiguous().view(torch.int32))


class RecipeAndScope(unittest.TestCase):
    def test_refusals_name_what_is_wrong(self):
        for kwargs, name in (({"margin": math.nan}, "margin"), ({"margin": 200}, "margin"),
                             ({"amax_history_len": 0}, "amax_history_len"),
                             ({"amax_compute_algo": "mean"}, "amax_compute_algo"),
                             ({"fp8_format": "E5M2"}, "fp8_format")):
            with self.assertRaises(ValueError, msg=str(kwargs)) as cm:
                fp8.DelayedScaling(**kwargs)
            self.assertIn(name, str(cm.exception))
        with self.assertRaises(TypeError):
            with rt.fp8_autocast(recipe="HYBRID"):
                pass

    def test_scopes_nest_and_the_innermost_decides(self):
        outer, inner = fp8.DelayedScaling(amax_history_len=3), fp8.DelayedScaling(fp8_format="E4M3")
        self.assertFalse(fp8.is_fp8_enabled())
        with rt.fp8_autocast(recipe=outer):
            self.assertIs(fp8.get_fp8_recipe(), outer)
            with rt.fp8_autocast(enabled=False):
                self.assertIsNone(fp8.get_fp8_recipe())
            with rt.fp8_autocast(fp8_recipe=inner):
                self.assertIs(fp8.get_fp8_recipe(), inner)
            self.assertIs(fp8.get_fp8_recipe(), outer)
        self.assertFalse(fp8.is_fp8_enabled())
        self.assertEqual(fp8.DelayedScaling().fp8_format, fp8.Format.HYBRID)
        self.assertEqual((fp8.Format.HYBRID.forward, fp8.Format.HYBRID.backward), ("e4m3", "e5m2"))

    def test_outside_the_scope_the_layer_is_a_linear_in_its_dtype(self):
        torch.manual_seed(3)
        layer = fp8.Linear(16, 8)
        x = torch.randn(5, 16)
        y = layer(x)
        self.assertLess((y - torch.nn.functional.linear(x, layer.weight, layer.bias)).abs().max().item(), 1e-5)
        self.assertIsNone(layer.fp8_scale_fwd, "no FP8 state before an FP8 forward")


class Numerics(unittest.TestCase):
    """Three steps of a layer against the tests' own FP8: each step's update
    (so the scales leave 1 from the second step), the quantizations byte
    for byte (through the results), the GEMMs in float64 of the dequantized
    operands."""

    def check_steps(self, recipe, bias, shape=(4, 6, 32), n=24, steps=3):
        torch.manual_seed(hash((recipe.fp8_format, recipe.amax_compute_algo, bias)) % 1000)
        k = shape[-1]
        layer = fp8.Linear(k, n, bias=bias)
        fwd, bwd = Recipe(recipe, 2, recipe.fp8_format.forward), Recipe(recipe, 1, recipe.fp8_format.backward)
        for step in range(steps):
            # Magnitudes that move from step to step, so that the scales do
            # (down: an amax larger than the last steps' saturates, which
            # the reference would follow but FP8's error check would not).
            x = (torch.randn(*shape) * 4.0 ** -step).requires_grad_(True)
            with rt.fp8_autocast(recipe=recipe):
                y = layer(x)
            grad = torch.randn(*shape[:-1], n) * 10.0 ** (1 - step)
            y.backward(grad)
            what = f"{recipe}, bias {bias}, step {step}"

            inv = fwd.update()
            fmt = recipe.fp8_format.forward
            x2, w = x.detach().reshape(-1, k), layer.weight.detach()
            xq, wq = quantize(fmt, x2, fwd.scale[0].item()), quantize(fmt, w, fwd.scale[1].item())
            fwd.history[0, 0], fwd.history[0, 1] = x2.abs().max(), w.abs().max()
            self.assertTrue(same_bits(layer.fp8_scale_inv_fwd, inv), f"{what}: forward scale_inv")
            want = (decode(fmt, xq) @ decode(fmt, wq).t()) * (inv[0].double() * inv[1].double())
            if bias:
                want += layer.bias.detach().double()
            got = y.detach().reshape(-1, n).double()
            self.assertLessEqual((got - want).abs().max().item(), 4e-7 * want.abs().max().item() + 1e-30,
                                 f"{what}: y against float64 of the dequantized operands")

            binv = bwd.update()
            gfmt = recipe.fp8_format.backward
            dy = grad.reshape(-1, n)
            dyq = quantize(gfmt, dy, bwd.scale[0].item())
            bwd.history[0, 0] = dy.abs().max()
            self.assertTrue(same_bits(layer.fp8_scale_inv_bwd, binv), f"{what}: backward scale_inv")
            d = decode(gfmt, dyq)
            want_dx = (d @ decode(fmt, wq)) * (binv[0].double() * inv[1].double())
            want_dw = (d.t() @ decode(fmt, xq)) * (binv[0].double() * inv[0].double())
            for name, got_, want_ in (("dx", x.grad.reshape(-1, k), want_dx), ("dw", layer.weight.grad, want_dw)):
                self.assertLessEqual((got_.double() - want_).abs().max().item(),
                                     4e-7 * want_.abs().max().item() + 1e-30, f"{what}: {name}")
            if bias:
                want_db = dy.double().sum(0)
                self.assertLessEqual((layer.bias.grad.double() - want_db).abs().max().item(),
                                     1e-5 * want_db.abs().max().item(), f"{what}: db")

            # The state regend updated in place: Transformer Engine's, bit for bit.
            for got_, want_, name in ((layer.fp8_amax_history_fwd, fwd.history, "forward history"),
                                      (layer.fp8_scale_fwd, fwd.scale, "forward scales"),
                                      (layer.fp8_amax_history_bwd, bwd.history, "backward history"),
                                      (layer.fp8_scale_bwd, bwd.scale, "backward scale")):
                self.assertTrue(same_bits(got_, want_), f"{what}: {name} {got_.tolist()} != {want_.tolist()}")
            # And FP8 is FP8: near the exact product, not equal to it.
            exact = x2.double() @ w.double().t() + (layer.bias.detach().double() if bias else 0)
            err = ((got - exact).norm() / exact.norm()).item()
            self.assertLess(err, 0.1, f"{what}: FP8's own error")
            layer.zero_grad()

    def test_hybrid_max_with_bias(self):
        self.check_steps(fp8.DelayedScaling(amax_history_len=4), bias=True)

    def test_e4m3_most_recent_with_a_margin(self):
        self.check_steps(fp8.DelayedScaling(margin=1, fp8_format=fp8.Format.E4M3, amax_history_len=2,
                                            amax_compute_algo="most_recent"), bias=False, shape=(20, 16), n=8)

    def test_a_history_of_one(self):
        self.check_steps(fp8.DelayedScaling(amax_history_len=1), bias=True, shape=(3, 8), n=5)


class GraphForm(unittest.TestCase):
    """The layer as torch.compile traces it (fp8._graph_forward: the custom
    ops regen::fp8_linear and regen::fp8_linear_backward, functional, each
    pass's state update copied into the buffers after it), run eagerly here
    (torch 1.13 has no dynamo; the GPU test compiles it): one program Run a
    pass, and outputs, gradients and state bit-identical to the eager pass's
    (in place, one Run a pass), step after step."""

    def check(self, recipe, bias, shape, n, need_dx=True, steps=3):
        torch.manual_seed(hash((recipe.fp8_format, bias, need_dx)) % 1000)
        k = shape[-1]
        eager, graph = fp8.Linear(k, n, bias=bias), fp8.Linear(k, n, bias=bias)
        graph.load_state_dict(eager.state_dict())
        names = ("fp8_amax_history_fwd", "fp8_scale_fwd", "fp8_amax_history_bwd", "fp8_scale_bwd")
        for step in range(steps):
            what = f"{recipe}, bias {bias}, need_dx {need_dx}, step {step}"
            x = torch.randn(*shape) * 4.0 ** -step
            xa, xb = (x.clone().requires_grad_(need_dx) for _ in range(2))
            grad = torch.randn(*shape[:-1], n) * 10.0 ** (1 - step)
            runs = rt.stats()["program_runs"]
            with rt.fp8_autocast(recipe=recipe):
                ya = eager(xa)
                mid = rt.stats()["program_runs"]
                yb = fp8._graph_forward(graph, xb, recipe)
            after = rt.stats()["program_runs"]
            self.assertEqual((mid - runs, after - mid), (1, 1), f"{what}: a forward is one Run either way")
            self.assertTrue(same_bits(ya.detach(), yb.detach()), f"{what}: y")
            ya.backward(grad)
            mid = rt.stats()["program_runs"]
            yb.backward(grad)
            self.assertEqual(rt.stats()["program_runs"] - mid, 1, f"{what}: the backward is one Run")
            got = [("weight.grad", eager.weight.grad, graph.weight.grad)]
            if need_dx:
                got.append(("x.grad", xa.grad, xb.grad))
            else:
                self.assertIsNone(xb.grad, f"{what}: no input gradient asked for")
            if bias:
                got.append(("bias.grad", eager.bias.grad, graph.bias.grad))
            got += [(name, getattr(eager, name), getattr(graph, name)) for name in names]
            for name, a, b in got:
                self.assertTrue(same_bits(a, b), f"{what}: {name} {a.reshape(-1)[:4].tolist()} != "
                                                 f"{b.reshape(-1)[:4].tolist()}")
            eager.zero_grad()
            graph.zero_grad()

    def test_hybrid_max_with_bias(self):
        self.check(fp8.DelayedScaling(amax_history_len=4), bias=True, shape=(4, 6, 32), n=24)

    def test_e4m3_most_recent_without_an_input_gradient(self):
        self.check(fp8.DelayedScaling(margin=1, fp8_format=fp8.Format.E4M3, amax_history_len=2,
                                      amax_compute_algo="most_recent"), bias=False, shape=(20, 16), n=8,
                   need_dx=False)

    def test_the_state_is_made_for_the_layer_called_and_a_copy_is_its_own(self):
        import copy
        recipe = fp8.DelayedScaling(amax_history_len=3)
        layer = fp8.Linear(16, 8)
        twin = copy.deepcopy(layer)
        fp8._graph_forward(twin, torch.randn(4, 16), recipe)
        self.assertIsNone(layer.fp8_scale_fwd, "the original took no step")
        self.assertEqual(list(twin.fp8_amax_history_fwd.shape), [3, 2])
        self.assertEqual(list(twin.fp8_amax_history_bwd.shape), [3, 1])

    def test_a_bad_scale_is_refused_by_name_and_changes_nothing(self):
        recipe = fp8.DelayedScaling(amax_history_len=3)
        layer = fp8.Linear(16, 8)
        state = layer._fp8_state(recipe.amax_history_len, layer.weight.device)
        state["fp8_scale_fwd"][1] = 0.0
        before = {name: t.clone() for name, t in state.items()}
        with self.assertRaises(regen.InvalidOperand) as cm:
            fp8._graph_forward(layer, torch.randn(4, 16), recipe)
        self.assertEqual(cm.exception.parameters["operand"], "scale.weight")
        for name, t in before.items():
            self.assertTrue(same_bits(getattr(layer, name), t), f"{name} changed")


class Refusals(unittest.TestCase):
    def stepped_layer(self, recipe):
        torch.manual_seed(9)
        layer = fp8.Linear(16, 8)
        with rt.fp8_autocast(recipe=recipe):
            layer(torch.randn(4, 16)).sum().backward()
        return layer

    def snapshot(self, layer):
        return {n: getattr(layer, n).clone() for n in ("fp8_amax_history_fwd", "fp8_scale_fwd",
                                                        "fp8_amax_history_bwd", "fp8_scale_bwd")}

    def test_a_bad_scale_is_refused_by_name_and_changes_nothing(self):
        recipe = fp8.DelayedScaling(amax_history_len=3)
        layer = self.stepped_layer(recipe)
        for index, name in ((0, "scale.input"), (1, "scale.weight")):
            for bad in (0.0, -1.0, math.nan):
                # An empty history keeps the scale as it is: the bad one
                # reaches the quantization.
                layer.fp8_amax_history_fwd.zero_()
                layer.fp8_scale_fwd.fill_(1.0)
                layer.fp8_scale_fwd[index] = bad
                before = self.snapshot(layer)
                with self.assertRaises(regen.InvalidOperand, msg=f"{name} = {bad}") as cm:
                    with rt.fp8_autocast(recipe=recipe):
                        layer(torch.randn(4, 16))
                self.assertEqual(cm.exception.parameters["operand"], name)
                self.assertIn("finite and positive", cm.exception.parameters["reason"])
                for key, t in before.items():
                    self.assertTrue(same_bits(getattr(layer, key), t), f"{name} = {bad}: {key} changed")
        # An infinite scale the update makes FLT_MAX (Transformer Engine's
        # rule), which quantizes: no refusal.
        layer.fp8_amax_history_fwd.zero_()
        layer.fp8_scale_fwd.fill_(math.inf)
        with rt.fp8_autocast(recipe=recipe):
            layer(torch.randn(4, 16))
        self.assertEqual(layer.fp8_scale_fwd.tolist(), [torch.finfo(torch.float32).max] * 2)
        # The backward's own.
        layer.fp8_scale_fwd.fill_(1.0)
        layer.fp8_amax_history_bwd.zero_()
        layer.fp8_scale_bwd.fill_(math.nan)
        with rt.fp8_autocast(recipe=recipe):
            y = layer(torch.randn(4, 16))
        before = self.snapshot(layer)
        with self.assertRaises(regen.InvalidOperand) as cm:
            y.sum().backward()
        self.assertEqual(cm.exception.parameters["operand"], "scale.grad_output")
        for key, t in before.items():
            self.assertTrue(same_bits(getattr(layer, key), t), f"the backward's refusal changed {key}")

    def test_wrong_dtypes_are_refused_by_name(self):
        recipe = fp8.DelayedScaling(amax_history_len=2)
        with rt.fp8_autocast(recipe=recipe):
            with self.assertRaises(TypeError) as cm:
                fp8.Linear(8, 4, dtype=torch.float64)(torch.randn(2, 8))
            self.assertIn("weight is torch.float64", str(cm.exception))
            with self.assertRaises(TypeError) as cm:
                fp8.Linear(8, 4)(torch.ones(2, 8, dtype=torch.int32))
            self.assertIn("input is torch.int32", str(cm.exception))
        layer = self.stepped_layer(recipe)
        layer.fp8_amax_history_fwd = layer.fp8_amax_history_fwd.half()
        with rt.fp8_autocast(recipe=recipe):
            with self.assertRaises(TypeError) as cm:
                layer(torch.randn(4, 16))
        self.assertIn("fp8_amax_history_fwd is torch.float16", str(cm.exception))


class Model(torch.nn.Module if torch is not None else object):
    def __init__(self):
        super().__init__()
        self.up = fp8.Linear(32, 64)
        self.down = fp8.Linear(64, 16)

    def forward(self, x):
        return self.down(torch.nn.functional.gelu(self.up(x), approximate="tanh"))


class Faults(unittest.TestCase):
    """Training with FP8 Linears, the same steps with and without faults:
    100 of them, restarts and device_losts in turn, half before a forward
    and half between a forward and its backward (the forward's outputs and
    the state in the rank's memory, the next Run refused and run again in
    the new generation). The FP8 state, the weights and the losses of every
    step are bit-identical."""

    STEPS = 60
    FIRST_FAULTED = 10
    STATE = ("fp8_amax_history_fwd", "fp8_scale_fwd", "fp8_amax_history_bwd", "fp8_scale_bwd", "weight", "bias")

    def train(self, faults):
        torch.manual_seed(17)
        model = Model()
        opt = torch.optim.SGD(model.parameters(), lr=0.02)
        recipe = fp8.DelayedScaling(amax_history_len=8)
        g = torch.Generator().manual_seed(23)
        admin = regen.Client(daemon.socket, timeout=30)
        kinds = ("restart", "device_lost")
        done = 0
        trace = []
        before = rt.stats()
        try:
            for step in range(self.STEPS):
                x = torch.randn(16, 32, generator=g)
                target = torch.randn(16, 16, generator=g)
                faulted = faults and step >= self.FIRST_FAULTED
                if faulted:
                    self.fault(admin, kinds[done % 2])
                    done += 1
                with rt.fp8_autocast(recipe=recipe):
                    loss = torch.nn.functional.mse_loss(model(x), target)
                if faulted:
                    self.fault(admin, kinds[done % 2])
                    done += 1
                loss.backward()
                opt.step()
                opt.zero_grad()
                trace.append((loss.item(), {f"{layer}.{name}": getattr(getattr(model, layer), name).clone()
                                            for layer in ("up", "down") for name in self.STATE}))
        finally:
            admin.close()
        return trace, done, rt.stats()["recoveries"] - before["recoveries"]

    def fault(self, admin, kind):
        gen = admin.generation()["devices"][0]["generation"]
        if kind == "restart":
            admin.restart(0, reason="test_torch_fp8")
        else:
            admin.inject_fault(0, kind)
        # The fault has taken the generation before the next Run: what
        # the rank names is stale, and the Run must recover.
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            try:
                if admin.generation()["devices"][0]["generation"] > gen:
                    return
            except regen.Error:
                pass
            time.sleep(0.01)
        self.fail(f"{kind}: the generation did not move past {gen}")

    def test_state_bit_identical_through_100_faults(self):
        clean, none, _ = self.train(faults=False)
        self.assertEqual(none, 0)
        faulted, done, recoveries = self.train(faults=True)
        self.assertEqual(done, 100)
        self.assertGreaterEqual(recoveries, 100, "every fault met a Run that recovered")
        for step, ((loss_a, a), (loss_b, b)) in enumerate(zip(clean, faulted)):
            self.assertEqual(struct.pack("d", loss_a), struct.pack("d", loss_b), f"step {step}: loss")
            for name in a:
                self.assertTrue(same_bits(a[name], b[name]), f"step {step}: {name} differs")
        # It trained, and the scales moved off their first value.
        self.assertLess(clean[-1][0], clean[0][0])
        self.assertFalse(torch.equal(clean[-1][1]["up.fp8_scale_fwd"], torch.ones(2)))


class FaultsInsideRuns(unittest.TestCase):
    """device_losts at random moments from another thread while a wider
    layer trains (its GEMMs take the host backend tens of milliseconds, so
    faults land inside Runs, between their nodes): a Run cut after it saved
    the state is put back from its journal and run again, and the state
    ends bit-identical to training without faults."""

    STEPS = 40

    def train(self, faults):
        import random
        import threading
        torch.manual_seed(29)
        layer = fp8.Linear(256, 256)
        opt = torch.optim.SGD(layer.parameters(), lr=0.01)
        recipe = fp8.DelayedScaling(amax_history_len=4, amax_compute_algo="most_recent")
        g = torch.Generator().manual_seed(31)
        stop, injected = threading.Event(), [0]

        def injector():
            r = random.Random(13)
            admin = regen.Client(daemon.socket, timeout=30)
            try:
                while not stop.is_set():
                    time.sleep(r.uniform(0.02, 0.12))
                    try:
                        admin.inject_fault(0, "device_lost")
                        injected[0] += 1
                    except regen.Error:
                        pass
            finally:
                admin.close()

        th = threading.Thread(target=injector) if faults else None
        if th:
            th.start()
        try:
            for _ in range(self.STEPS):
                x = torch.randn(128, 256, generator=g)
                with rt.fp8_autocast(recipe=recipe):
                    loss = layer(x).pow(2).mean()
                loss.backward()
                opt.step()
                opt.zero_grad()
        finally:
            stop.set()
            if th:
                th.join()
        restored = sum(p.get("retries_restored", 0) for p in rt.runtime().client.program_status(0)
                       if p.get("name", "").startswith("fp8_linear"))
        return {n: getattr(layer, n).detach().clone() for n in Faults.STATE}, injected[0], restored

    def test_faults_inside_runs_change_no_bit(self):
        clean, _, restored_before = self.train(faults=False)
        faulted, injected, restored = self.train(faults=True)
        print(f"faults {injected}, restored {restored_before} -> {restored}", file=sys.stderr)
        self.assertGreater(injected, 3, "too few faults to mean anything")
        self.assertGreater(restored, restored_before, "no fault landed inside a Run after it saved the state")
        for name in clean:
            self.assertTrue(same_bits(clean[name], faulted[name]), f"{name} differs after {injected} faults")


class StateDict(unittest.TestCase):
    def test_the_state_goes_with_the_weights(self):
        torch.manual_seed(4)
        recipe = fp8.DelayedScaling(amax_history_len=5)
        a = fp8.Linear(16, 8)
        xs = [torch.randn(4, 16) for _ in range(4)]
        for x in xs[:2]:
            with rt.fp8_autocast(recipe=recipe):
                a(x).sum().backward()
        sd = a.state_dict()
        self.assertEqual(sorted(sd), ["bias", "fp8_amax_history_bwd", "fp8_amax_history_fwd", "fp8_scale_bwd",
                                      "fp8_scale_fwd", "weight"])
        b = fp8.Linear(16, 8)
        b.load_state_dict(sd)
        for x in xs[2:]:
            with rt.fp8_autocast(recipe=recipe):
                ya, yb = a(x), b(x)
            self.assertTrue(same_bits(ya.detach(), yb.detach()), "the same step from the loaded state")
            ya.sum().backward()
            yb.sum().backward()
        for name in sd:
            self.assertTrue(same_bits(getattr(a, name).detach(), getattr(b, name).detach()), name)
        # A recipe of another length keeps the newest amaxes.
        with rt.fp8_autocast(recipe=fp8.DelayedScaling(amax_history_len=2)):
            b(xs[0])
        self.assertEqual(list(b.fp8_amax_history_fwd.shape), [2, 2])


if __name__ == "__main__":
    unittest.main()
