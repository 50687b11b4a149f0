#!/usr/bin/env python3
# SPDX-License-Identifier: Apache-2.0
"""regen.torch.fp8 on a GPU (issue 34): an FP8 Linear in bf16 on CUDA,
its Runs on the CUDA backend (cuBLASLt's FP8 GEMM, kernels/fp8.cu's
quantizations and scale update, the program's own kernels):

- three steps against float64 of operands quantized by torch's own float8
  casts ((x * scale).clamp(-max, max).to(float8), round to nearest even),
  forward and backward, HYBRID and E4M3; the scales and the amax history
  bit for bit Transformer Engine's update (computed here in f32);
- shapes cuBLASLt's FP8 GEMMs cannot take refused by name, nothing run;
- training through restarts and device_losts (before a forward, between a
  forward and its backward): the state, weights and losses bit-identical
  to the same steps without faults;
- under torch.compile(backend="regen") the layer's custom ops are nodes
  of the compiled programs (a step 2 Runs, the eager layers 4): state and
  weights bit-identical to eager's through steps whose glue rounds as
  torch's does, losses and scales within bf16's rounding of eager's with
  LayerNorm and GELU between the layers, and through restarts and
  device_losts mid-training bit-identical to the same compiled steps
  without them (the state's update under the Runs' journal).

    python3 tests/gpu/test_torch_fp8.py [REGEND] [--steps N]

Each check prints PASS/FAIL; the last line is "N passed, N failed". Exit 0
pass, 1 fail, 77 skipped (no torch with float8, no FP8 GPU, no regend).
The host-backend side is client/python/tests/test_torch_fp8.py.
"""

import os
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(os.path.dirname(HERE))
sys.path.insert(0, os.path.join(REPO, "client", "python"))
sys.path.insert(0, os.path.join(REPO, "tests", "lib"))
from regend_fixture import SKIP, cuda_regend, gpu_script_args, guarded, lose_device, record, record_width, \
    require_torch, summary  # noqa: E402

torch = require_torch()
if not hasattr(torch, "float8_e4m3fn") or torch.cuda.get_device_capability(0) < (8, 9):
    print(f"SKIP: torch {torch.__version__} on {torch.cuda.get_device_name(0)}: no FP8")
    sys.exit(SKIP)

import regen  # noqa: E402
import regen.torch as rt  # noqa: E402

fp8 = rt.fp8
record_width(70)
DEV = torch.device("cuda", 0)
FP8 = {"e4m3": (torch.float8_e4m3fn, 448.0), "e5m2": (torch.float8_e5m2, 57344.0)}


def quantized(x, scale, fmt):
    """float64 of x quantized as torch casts: an f32 product, clamped,
    rounded to nearest even; dequantized by the scale's f32 inverse."""
    dt, top = FP8[fmt]
    q = (x.float() * scale.float()).clamp(-top, top).to(dt)
    return q.double()


class Recipe:
    """Transformer Engine's delayed scaling for one direction, in f32."""

    def __init__(self, recipe, n, fmt):
        self.recipe, self.fmt = recipe, fmt
        self.history = torch.zeros(recipe.amax_history_len, n, dtype=torch.float32, device=DEV)
        self.scale = torch.ones(n, dtype=torch.float32, device=DEV)

    def update(self):
        h = self.history
        amax = h[0].clone() if self.recipe.amax_compute_algo == "most_recent" else h.max(0).values
        top = torch.tensor(FP8[self.fmt][1], dtype=torch.float32, device=DEV) * \
            torch.tensor(2.0 ** -self.recipe.margin, dtype=torch.float32, device=DEV)
        fresh = torch.where(torch.isfinite(amax) & (amax > 0), top / amax, self.scale)
        self.scale = torch.where(torch.isinf(fresh), torch.full_like(fresh, torch.finfo(torch.float32).max), fresh)
        rolled = torch.cat([h[1:], h[:1]]) if h.shape[0] > 1 else h.clone()
        rolled[0] = 0
        self.history = rolled
        return 1.0 / self.scale


def same_bits(a, b):
    return a.shape == b.shape and torch.equal(a.contiguous().view(torch.int32), b.contiguous().view(torch.int32))


def check_numerics(recipe, bias):
    what = f"{recipe.fp8_format.name}, {recipe.amax_compute_algo}, bias {bias}"
    torch.manual_seed(5)
    n, k, shape = 128, 256, (4, 64, 256)
    layer = fp8.Linear(k, n, bias=bias, device=DEV, dtype=torch.bfloat16)
    fwd, bwd = Recipe(recipe, 2, recipe.fp8_format.forward), Recipe(recipe, 1, recipe.fp8_format.backward)
    worst = {"y": 0.0, "dx": 0.0, "dw": 0.0}
    state_ok = True
    for step in range(3):
        x = (torch.randn(*shape, device=DEV) * 4.0 ** -step).to(torch.bfloat16).requires_grad_(True)
        with rt.fp8_autocast(recipe=recipe):
            y = layer(x)
        grad = (torch.randn(*shape[:-1], n, device=DEV) * 10.0 ** (1 - step)).to(torch.bfloat16)
        y.backward(grad)
        inv = fwd.update()
        x2, w = x.detach().reshape(-1, k), layer.weight.detach()
        xq, wq = quantized(x2, fwd.scale[0], fwd.recipe.fp8_format.forward), \
            quantized(w, fwd.scale[1], fwd.recipe.fp8_format.forward)
        fwd.history[0, 0], fwd.history[0, 1] = x2.abs().max().float(), w.abs().max().float()
        want = (xq @ wq.t()) * (inv[0].double() * inv[1].double())
        if bias:
            want += layer.bias.detach().double()
        worst["y"] = max(worst["y"], ((y.detach().reshape(-1, n).double() - want).abs().max() /
                                      want.abs().max()).item())
        binv = bwd.update()
        dy = grad.reshape(-1, n)
        dyq = quantized(dy, bwd.scale[0], recipe.fp8_format.backward)
        bwd.history[0, 0] = dy.abs().max().float()
        want_dx = (dyq @ wq) * (binv[0].double() * inv[1].double())
        want_dw = (dyq.t() @ xq) * (binv[0].double() * inv[0].double())
        worst["dx"] = max(worst["dx"], ((x.grad.reshape(-1, k).double() - want_dx).abs().max() /
                                        want_dx.abs().max()).item())
        worst["dw"] = max(worst["dw"], ((layer.weight.grad.double() - want_dw).abs().max() /
                                        want_dw.abs().max()).item())
        for got, want_, _ in ((layer.fp8_amax_history_fwd, fwd.history, "forward history"),
                              (layer.fp8_scale_fwd, fwd.scale, "forward scales"),
                              (layer.fp8_amax_history_bwd, bwd.history, "backward history"),
                              (layer.fp8_scale_bwd, bwd.scale, "backward scale")):
            state_ok = state_ok and same_bits(got, want_)
        layer.zero_grad()
    # bf16 outputs: one rounding (2^-9 relative) of an f32-accumulated sum;
    # a byte or two that rounds the other way at a tie moves little more.
    record(f"{what}: y, dx, dw against f64 of the dequantized operands", max(worst.values()) <= 8e-3,
           ", ".join(f"{k} {v:.1e}" for k, v in worst.items()))
    record(f"{what}: scales and amax history bit for bit Transformer Engine's", state_ok)


def check_shapes():
    layer = fp8.Linear(100, 64, device=DEV, dtype=torch.bfloat16)
    before = rt.stats()["program_runs"]
    try:
        with rt.fp8_autocast():
            layer(torch.randn(32, 100, device=DEV, dtype=torch.bfloat16))
        record("in_features 100 refused by name", False, "it ran")
    except rt.NotSupported as e:
        record("in_features 100 refused by name", "in_features" in str(e) and
               rt.stats()["program_runs"] == before, str(e)[:120])


def train(steps, faults, admin):
    torch.manual_seed(7)
    model = torch.nn.Sequential(fp8.Linear(512, 1024, device=DEV, dtype=torch.bfloat16), torch.nn.GELU(),
                                fp8.Linear(1024, 512, device=DEV, dtype=torch.bfloat16))
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    recipe = fp8.DelayedScaling(amax_history_len=16)
    g = torch.Generator(device=DEV).manual_seed(9)
    losses = []
    for step in range(steps):
        x = torch.randn(256, 512, device=DEV, generator=g).to(torch.bfloat16)
        kind = faults.get(step)
        if kind == "restart":
            admin.restart(0, reason="test_torch_fp8")
        with rt.fp8_autocast(recipe=recipe):
            loss = model(x).float().pow(2).mean()
        if kind == "device_lost":
            lose_device(admin)
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
        losses.append(loss.item())
    state = {f"{i}.{name}": getattr(model[i], name).detach().clone() for i in (0, 2)
             for name in ("fp8_amax_history_fwd", "fp8_scale_fwd", "fp8_amax_history_bwd", "fp8_scale_bwd",
                          "weight", "bias")}
    return losses, state


def check_faults(steps, admin):
    faults = {s: ("restart" if s % 2 else "device_lost") for s in range(2, steps)}
    before = rt.stats()
    clean = train(steps, {}, admin)
    hit = train(steps, faults, admin)
    after = rt.stats()
    same = clean[0] == hit[0] and all(torch.equal(clean[1][k].view(torch.uint8), hit[1][k].view(torch.uint8))
                                      for k in clean[1])
    record(f"{len(faults)} restarts and device_losts mid-training: state, weights, losses bit-identical", same,
           f"{after['recoveries'] - before['recoveries']} recoveries, {after['retries'] - before['retries']} retries")


class Chain(torch.nn.Module):
    """Two FP8 Linears and glue whose rounding torch and regend's programs
    share (a cast, a product with a fixed tensor, a sum): the compiled
    layers see the bits the eager ones see, so their state must evolve to
    the same bits."""

    def __init__(self):
        super().__init__()
        self.up = fp8.Linear(256, 512, device=DEV, dtype=torch.bfloat16)
        self.down = fp8.Linear(512, 256, device=DEV, dtype=torch.bfloat16)

    def forward(self, x, g):
        return (self.down(self.up(x)).float() * g).sum()


STATE_NAMES = ("fp8_amax_history_fwd", "fp8_scale_fwd", "fp8_amax_history_bwd", "fp8_scale_bwd", "weight", "bias")


def _state_of(model):
    return {f"{name}.{what}": getattr(layer, what).detach().clone() for name, layer in model.named_children()
            if isinstance(layer, fp8.Linear) for what in STATE_NAMES}


def _train_chain(model, fn, steps, recipe, faults=None, admin=None):
    """SGD steps of model (fn: it, or it compiled) inside fp8_autocast;
    the program Runs of each step, and faults[step] ("restart" before the
    forward, "device_lost" between the forward and the backward)."""
    torch.manual_seed(13)
    opt = torch.optim.SGD(model.parameters(), lr=1e-3)
    gen = torch.Generator(device=DEV).manual_seed(21)
    runs, losses = [], []
    for step in range(steps):
        x = torch.randn(128, 256, device=DEV, generator=gen).to(torch.bfloat16)
        g = torch.randn(128, 256, device=DEV, generator=gen) * 4.0 ** (step % 3)
        kind = (faults or {}).get(step)
        if kind == "restart":
            admin.restart(0, reason="test_torch_fp8")
        before = rt.stats()["program_runs"]
        with rt.fp8_autocast(recipe=recipe):
            loss = fn(x, g)
        if kind == "device_lost":
            lose_device(admin)
        loss.backward()
        runs.append(rt.stats()["program_runs"] - before)
        opt.step()
        opt.zero_grad(set_to_none=True)
        losses.append(loss.item())
    return runs, losses


def check_compile_bits(steps):
    """torch.compile(backend="regen") takes the layers whole, the first
    call too (the state made as dynamo traces): the custom ops are nodes
    of the compiled forward and backward programs, a step two Runs; the
    state and the weights evolve to the bits of the eager layers'."""
    if not rt.fp8.graphs_take_fp8():
        record("compiled FP8 Linear: torch traces it", False,
               f"torch {torch.__version__}: no custom_op or no backward input mutation in AOTAutograd")
        return
    recipe = fp8.DelayedScaling(amax_history_len=4)
    torch.manual_seed(11)
    eager = Chain()
    mine = Chain()
    mine.load_state_dict(eager.state_dict())
    compiled = torch.compile(mine, backend="regen", dynamic=False)
    eager_runs, _ = _train_chain(eager, eager, steps, recipe)
    compiled_runs, _ = _train_chain(mine, compiled, steps, recipe)
    a, b = _state_of(eager), _state_of(mine)
    differ = [k for k in a if not torch.equal(a[k].view(torch.uint8), b[k].view(torch.uint8))]
    record(f"compiled FP8 Linears, {steps} SGD steps: state and weights bit-identical to eager", not differ,
           ", ".join(differ[:4]) or f"scales {b['up.fp8_scale_fwd'].tolist()}")
    reports = rt.explain(show=True)
    on_rank = [x["op"] for r in reports for x in r["rank"] if "fp8" in x["op"]]
    updates = [s.get("updates") for r in reports for s in r["segments"]]
    record("compiled: a step is 2 program Runs (eager: 4, one a pass)",
           compiled_runs == [2] * steps and eager_runs == [4] * steps and not on_rank and any(updates),
           f"compiled Runs per step {compiled_runs}, eager {eager_runs}, fp8 ops on the rank {on_rank}, "
           f"segments updating in place {updates}")
    torch._dynamo.reset()


def check_compile_model():
    """A model with LayerNorm and GELU between its FP8 Linears compiled:
    the same losses and scales as eager within bf16's rounding (the glue's
    kernels round otherwise than torch's, and the amaxes follow)."""
    torch.manual_seed(11)

    class Net(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.norm = torch.nn.LayerNorm(256, device=DEV, dtype=torch.bfloat16)
            self.up = fp8.Linear(256, 512, device=DEV, dtype=torch.bfloat16)
            self.down = fp8.Linear(512, 256, device=DEV, dtype=torch.bfloat16)

        def forward(self, x):
            h = torch.nn.functional.gelu(self.up(self.norm(x)), approximate="tanh")
            return self.down(h).float().pow(2).mean()

    eager, compiled_net = Net(), Net()
    compiled_net.load_state_dict(eager.state_dict())
    compiled = torch.compile(compiled_net, backend="regen", dynamic=False)
    recipe = fp8.DelayedScaling(amax_history_len=4)
    worst, worst_scale = 0.0, 0.0
    for step in range(4):
        x = torch.randn(128, 256, device=DEV, dtype=torch.bfloat16)
        with rt.fp8_autocast(recipe=recipe):
            a = eager(x)
            b = compiled(x)
        a.backward()
        b.backward()
        worst = max(worst, abs(a.item() - b.item()) / abs(a.item()))
        for name in ("up", "down"):
            for what in ("fp8_scale_fwd", "fp8_scale_bwd"):
                ea, cb = getattr(getattr(eager, name), what), getattr(getattr(compiled_net, name), what)
                worst_scale = max(worst_scale, ((ea - cb).abs() / ea.abs()).max().item())
    torch._dynamo.reset()
    record("compiled with LayerNorm and GELU: losses and scales as eager's", worst <= 1e-2 and worst_scale <= 2e-2,
           f"worst loss {worst:.1e}, worst scale {worst_scale:.1e}")


def check_compile_faults(steps, admin):
    """Compiled training through restarts (before a forward) and
    device_losts (between a forward and its backward): a compiled Run that
    updates the state runs with a journal, so state, weights and losses end
    bit-identical to the same compiled steps without faults."""
    if not rt.fp8.graphs_take_fp8():
        return
    recipe = fp8.DelayedScaling(amax_history_len=4)
    results = []
    before = rt.stats()
    for faults in ({}, {s: ("restart" if s % 2 else "device_lost") for s in range(3, steps)}):
        torch.manual_seed(11)
        model = Chain()
        compiled = torch.compile(model, backend="regen", dynamic=False)
        _, losses = _train_chain(model, compiled, steps, recipe, faults, admin)
        results.append((losses, _state_of(model)))
        torch._dynamo.reset()
    after = rt.stats()
    (la, sa), (lb, sb) = results
    same = la == lb and all(torch.equal(sa[k].view(torch.uint8), sb[k].view(torch.uint8)) for k in sa)
    record(f"compiled, {steps - 3} restarts and device_losts mid-training: state, weights, losses bit-identical",
           same, f"{after['recoveries'] - before['recoveries']} recoveries, "
           f"{after['retries'] - before['retries']} retries")


def main():
    regend, steps = gpu_script_args(12)
    with cuda_regend(regend) as daemon:
        rt.configure(socket=daemon.socket)
        checks = [lambda: check_numerics(fp8.DelayedScaling(amax_history_len=4), True),
                  lambda: check_numerics(fp8.DelayedScaling(fp8_format=fp8.Format.E4M3, margin=1,
                                                            amax_compute_algo="most_recent"), False),
                  check_shapes, lambda: check_compile_bits(6), check_compile_model]
        for check in checks:
            guarded(getattr(check, "__name__", "check"), check)
        admin = regen.Client(daemon.socket, timeout=120)
        try:
            for check in (check_faults, check_compile_faults):
                guarded(f"{check.__name__}: faults mid-training", check, steps, admin)
        finally:
            admin.close()
    return summary()


if __name__ == "__main__":
    sys.exit(main())
