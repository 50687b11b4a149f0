#!/usr/bin/env python3
# SPDX-License-Identifier: Apache-2.0
"""Each parameter's gradient through torch.compile(model, backend="regen"),
against float64, as close as Inductor's and eager's.

The soak test (test_compile_soak.py) compares losses over 200 steps: a
gap that grows says some gradient is off, not which.  Here each model of
tests/bench/models at the benchmark's shape (d1024, 4 layers, B8 S1024,
vocab 50304, bf16) takes one forward and backward along each path from the
same weights and data, at two points: its initial weights, and the weights
after --trained (50) eager AdamW steps on the soak test's data (where
training has moved them off their initialisation).  The reference is the
same model in float64.  For every parameter, the relative error of its
gradient, ||g - g64|| / ||g64||:

  regen's must be at most twice the larger of eager bf16's and Inductor's,
  plus 1e-3 (what bf16 tolerance means for that parameter of that model);
  the loss's likewise.

The parameters where regen's error is furthest above Inductor's are
printed, worst first: the op to look at.

    python3 tests/gpu/test_compile_grads.py [REGEND] [--models gpt,llama,encoder] [--trained 50]

Exit 0 pass, 1 fail, 77 skipped (no torch, no CUDA, no regend).
"""

import copy
import os
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(os.path.dirname(HERE))
sys.path.insert(0, os.path.join(REPO, "client", "python"))
sys.path.insert(0, os.path.join(REPO, "tests", "lib"))
sys.path.insert(0, os.path.join(REPO, "tests", "bench"))
from regend_fixture import cuda_regend, gpu_script_args, guarded, record, record_width, require_torch, \
    summary, take_option as opt, torch_rel_error as rel_err  # noqa: E402

torch = require_torch()

import regen.torch as rt  # noqa: E402
import models  # noqa: E402

record_width(72)

MODELS = opt("--models", "gpt,llama,encoder").split(",")
TRAINED = int(opt("--trained", "50"))
D, LAYERS, SEQ, BATCH, VOCAB = (models.BENCH_D, models.BENCH_LAYERS, models.BENCH_SEQ, models.BENCH_BATCH,
                                models.BENCH_VOCAB)
SHOWN = 8


def data(step):
    return models.memorised_batch(VOCAB, BATCH, SEQ, step)


def gradients(fn, model, idx, tgt):
    for p in model.parameters():
        p.grad = None
    loss = fn(idx, tgt)
    loss.backward()
    grads = {n: p.grad.detach().double().clone() for n, p in model.named_parameters() if p.grad is not None}
    return float(loss.detach().double()), grads


def compare(name, point, model, paths, idx, tgt):
    ref = copy.deepcopy(model).double()
    loss64, grads64 = gradients(ref, ref, idx, tgt)
    del ref
    results = {path: gradients(fn, model, idx, tgt) for path, fn in paths.items()}
    rows, bad = [], []
    for pname, g64 in grads64.items():
        errs = {path: rel_err(results[path][1][pname], g64) for path in paths if pname in results[path][1]}
        if "regen" not in errs:
            bad.append(f"{pname}: no gradient through regen")
            continue
        bound = 2 * max(errs.get("eager", 0.0), errs.get("inductor", 0.0)) + 1e-3
        rows.append((errs["regen"] / max(errs.get("inductor", 0.0), 1e-12), pname, errs, bound))
        if errs["regen"] > bound:
            bad.append(f"{pname} {errs['regen']:.2e} > {bound:.2e}")
    rows.sort(reverse=True)
    print(f"  {name} {point}: loss float64 {loss64:.5f}, " +
          ", ".join(f"{p} {results[p][0]:.5f}" for p in paths), flush=True)
    for ratio, pname, errs, bound in rows[:SHOWN]:
        print(f"    {pname:48s} regen {errs['regen']:.2e}  inductor {errs.get('inductor', 0):.2e}  "
              f"eager {errs.get('eager', 0):.2e}  ({ratio:.1f}x Inductor's)", flush=True)
    loss_errs = {p: abs(results[p][0] - loss64) / abs(loss64) for p in paths}
    loss_bound = 2 * max(loss_errs["eager"], loss_errs["inductor"]) + 1e-3
    record(f"{name} {point}: the loss through regen as close to float64's as eager's and Inductor's",
           loss_errs["regen"] <= loss_bound, f"{loss_errs['regen']:.2e}, bound {loss_bound:.2e}")
    record(f"{name} {point}: each of {len(grads64)} gradients through regen as close to float64's",
           not bad, "; ".join(bad[:6]) if bad else f"worst {rows[0][1]} at {rows[0][0]:.1f}x Inductor's")


def check_model(name):
    model = models.build(name, VOCAB, SEQ, D, LAYERS, D // 64, dtype=torch.bfloat16)
    paths = {"eager": model, "inductor": torch.compile(model),
             "regen": torch.compile(model, backend="regen", dynamic=False)}
    idx, tgt = data(0)
    compare(name, "at its initial weights", model, paths, idx, tgt)
    optimizer = torch.optim.AdamW(model.parameters(), lr=3e-4, fused=True)
    for step in range(TRAINED):
        optimizer.zero_grad(set_to_none=True)
        model(*data(step)).backward()
        optimizer.step()
    del optimizer
    compare(name, f"after {TRAINED} eager steps", model, paths, *data(TRAINED))
    torch._dynamo.reset()


def main():
    regend, _ = gpu_script_args(0)
    with cuda_regend(regend) as daemon:
        rt.configure(socket=daemon.socket, ordering="events")
        for name in MODELS:
            guarded(f"{name}: gradients against float64", check_model, name)
            torch._dynamo.reset()
    return summary()


if __name__ == "__main__":
    sys.exit(main())
