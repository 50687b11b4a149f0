#!/usr/bin/env python3
# SPDX-License-Identifier: Apache-2.0
"""torch.compile(model, backend="regen") on a GPU (issue 32): models written
as their users write them (tests/bench/models: a nanoGPT GPT, a Llama-style
decoder, torch.nn.TransformerEncoder), in bf16, trained a few steps with
AdamW three ways from the same initial weights and data: in float32 (the
reference), eager in bf16, and compiled with backend="regen" in bf16.  Each
loss and each gradient of the compiled model must be as close to float32's
as eager bf16's is (within 2x, or 1e-3), and explain() must show program
segments that regend ran.  Guards as torch's own backends have them: a new
batch size compiles new graphs and programs (dynamic=False), the first
size again reuses its own, each size's losses as eager's.  torch.autocast:
an f32 model compiled under autocast(bf16) trains as close to f32 as eager
under autocast does.  Then faults in the middle of compiled training
(a device_lost between the forward and backward Runs of a step, and a
`regenctl restart` before a step's forward): the faulted steps cost at
most a second more and every loss and parameter ends as in the same steps
without faults.  What each model's forward saves for its backward: no f32
tensor as large as an activation, and no program writes log-probabilities.
Each check prints PASS/FAIL; the last line is "N passed, N failed".

    python3 tests/gpu/test_compile.py [REGEND] [--steps N] [--models gpt,llama,encoder] [--dims D]

Exit 0 pass, 1 fail, 77 skipped (no torch, no CUDA, no regend).
"""

import os
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(os.path.dirname(HERE))
sys.path.insert(0, os.path.join(REPO, "client", "python"))
sys.path.insert(0, os.path.join(REPO, "tests", "lib"))
sys.path.insert(0, os.path.join(REPO, "tests", "bench"))
from regend_fixture import cuda_regend, gpu_script_args, guarded, lose_device, record, record_width, \
    require_torch, summary, take_option as opt  # noqa: E402

torch = require_torch()

import regen  # noqa: E402
import regen.torch as rt  # noqa: E402
import models  # noqa: E402

record_width(60)


MODELS = opt("--models", "gpt,llama,encoder").split(",")
D = int(opt("--dims", "256"))


def rel(x, ref):
    x, ref = x.double(), ref.double()
    return ((x - ref).norm() / ref.norm().clamp_min(1e-30)).item()


def against_f32(losses, ref, eager, mine):
    """How the compiled model's loss (losses[2]) and gradients compare with
    float32's (losses[0], ref) next to eager bf16's (losses[1], eager):
    (its loss's relative error, whether within 2x eager's or 1e-3, the
    gradients past 2x eager's error and 2e-2, the worst gradient error)."""
    e_loss = abs(losses[1] - losses[0]) / abs(losses[0])
    c_loss = abs(losses[2] - losses[0]) / abs(losses[0])
    bad, worst = [], 0.0
    for (pn, p32), pe, pc in zip(ref.named_parameters(), eager.parameters(), mine.parameters()):
        if p32.grad is None:
            continue
        ee, ce = rel(pe.grad, p32.grad), rel(pc.grad, p32.grad)
        worst = max(worst, ce)
        if ce > max(2 * ee, 1e-3) and ce > 2e-2:
            bad.append(f"{pn}: {ce:.2e} (eager {ee:.2e})")
    return c_loss, c_loss <= max(2 * e_loss, 1e-3), bad, worst


def check_model(name, steps):
    vocab, seq, layers, heads, batch = 512, 128, 2, max(2, D // 64), 4
    ref = models.build(name, vocab, seq, D, layers, heads, dtype=torch.float32)
    eager = models.build(name, vocab, seq, D, layers, heads, dtype=torch.bfloat16)
    mine = models.build(name, vocab, seq, D, layers, heads, dtype=torch.bfloat16)
    compiled = torch.compile(mine, backend="regen", dynamic=False)
    opts = [torch.optim.AdamW(m.parameters(), lr=1e-3) for m in (ref, eager, mine)]
    before = dict(rt.stats())
    worst_loss, worst_grad = 0.0, 0.0
    ok = True
    for step in range(steps):
        idx, tgt = models.batch(vocab, batch, seq, step)
        losses = []
        for m, o, fn in zip((ref, eager, mine), opts, (ref, eager, compiled)):
            o.zero_grad(set_to_none=True)
            loss = fn(idx, tgt)
            loss.backward()
            losses.append(loss.float().item())
        c_loss, step_ok, grads_bad, grad = against_f32(losses, ref, eager, mine)
        worst_loss, worst_grad = max(worst_loss, c_loss), max(worst_grad, grad)
        step_ok = step_ok and not grads_bad
        ok = ok and step_ok
        print(f"  {name} step {step}: loss f32 {losses[0]:.5f} eager {losses[1]:.5f} regen {losses[2]:.5f}"
              f"{'; ' + '; '.join(grads_bad[:4]) if grads_bad else ''}", flush=True)
        for o in opts:
            o.step()
    after = rt.stats()
    runs = after["program_runs"] - before.get("program_runs", 0)
    record(f"{name} d{D}: {steps} AdamW steps, losses and gradients as close to f32 as eager bf16's", ok,
           f"worst loss {worst_loss:.2e}, worst gradient {worst_grad:.2e}")
    record(f"{name} d{D}: regend ran program segments", runs > 0,
           f"{runs} Runs, {after['handoffs'] - before.get('handoffs', 0)} hand-offs, "
           f"{after['rank_steps'] - before.get('rank_steps', 0)} rank steps, "
           f"{after['fallback_segments'] - before.get('fallback_segments', 0)} refused segments")
    reports = rt.explain(show=True)
    torch._dynamo.reset()
    return reports


def _programs():
    return {p["program"] for p in rt.runtime().client.program_status(0)}


def _loss_gap(eager, mine, compiled, vocab, batch, seq, step):
    """One step of eager and of the compiled twin on the same batch: their
    losses' relative difference."""
    idx, tgt = models.batch(vocab, batch, seq, step)
    losses = []
    for m, fn in ((eager, eager), (mine, compiled)):
        m.zero_grad(set_to_none=True)
        loss = fn(idx, tgt)
        loss.backward()
        losses.append(loss.float().item())
    return abs(losses[1] - losses[0]) / abs(losses[0])


def check_saved(name):
    """With options={"recompute": True}, what the forward saves for the
    backward (regen.torch._partition): no f32 tensor as large as an
    activation, neither the loss's log-probabilities nor RMSNorm's
    x.float(); and neither pass's program writes log-probabilities (the
    rows' logsumexp instead)."""
    from regen.torch._compile import compiled_graphs
    from regen.lowering import Segment
    vocab, seq, layers, heads, batch = 512, 128, 2, max(2, D // 64), 4
    torch._dynamo.reset()
    compiled = torch.compile(models.build(name, vocab, seq, D, layers, heads, dtype=torch.bfloat16),
                             backend="regen", dynamic=False, options={"recompute": True})
    compiled(*models.batch(vocab, batch, seq, 0)).backward()
    graphs = {g.kind: g for g in compiled_graphs()}
    out = [n for n in graphs["forward"].gm.graph.nodes if n.op == "output"][0]
    saved = [x for x in torch.utils._pytree.tree_flatten(out.args)[0][1:] if isinstance(x, torch.fx.Node)]
    wide = [f"{x.name} {list(x.meta['val'].shape)}" for x in saved
            if isinstance(x.meta.get("val"), torch.Tensor) and x.meta["val"].dtype == torch.float32
            and x.meta["val"].numel() >= batch * seq * D]
    ops = [n["op"] for g in graphs.values() for s in g.steps or () if isinstance(s, Segment)
           for n in s.definition["nodes"]]
    record(f"{name}: the forward saves no f32 activation, no pass writes log-probabilities",
           not wide and "log_softmax" not in ops and ops.count("logsumexp") >= 2,
           f"{len(saved)} saved{', f32: ' + ', '.join(wide) if wide else ''}; "
           f"logsumexp {ops.count('logsumexp')}, log_softmax {ops.count('log_softmax')}")
    torch._dynamo.reset()


def check_recompile(name):
    vocab, seq, layers, heads = 512, 128, 2, max(2, D // 64)
    torch._dynamo.reset()
    eager = models.build(name, vocab, seq, D, layers, heads, dtype=torch.bfloat16)
    mine = models.build(name, vocab, seq, D, layers, heads, dtype=torch.bfloat16)
    compiled = torch.compile(mine, backend="regen", dynamic=False)
    start = _programs()
    seen, worst = [], 0.0
    for i, batch in enumerate((4, 2, 4, 2)):
        worst = max(worst, _loss_gap(eager, mine, compiled, vocab, batch, seq, i))
        seen.append(len(_programs() - start))
    # Batch 4 defines the forward's and backward's programs, batch 2 its
    # own pair, and neither size again defines any.
    record(f"{name}: a new batch size compiles anew, an old one reuses its programs (dynamic=False)",
           seen[0] >= 2 and seen[1] > seen[0] and seen[3] == seen[2] == seen[1] and worst <= 5e-3,
           f"new programs after each call {seen}, worst loss against eager {worst:.1e}")
    torch._dynamo.reset()


def check_autocast(name, steps=2):
    vocab, seq, layers, heads, batch = 512, 128, 2, max(2, D // 64), 4
    torch._dynamo.reset()
    ref, eager, mine = (models.build(name, vocab, seq, D, layers, heads, dtype=torch.float32) for _ in range(3))
    compiled = torch.compile(mine, backend="regen", dynamic=False)
    before = dict(rt.stats())
    ok, worst_loss, worst_grad, bad = True, 0.0, 0.0, []
    for step in range(steps):
        idx, tgt = models.batch(vocab, batch, seq, step)
        losses = []
        for m, fn, cast in ((ref, ref, False), (eager, eager, True), (mine, compiled, True)):
            m.zero_grad(set_to_none=True)
            with torch.autocast("cuda", dtype=torch.bfloat16, enabled=cast):
                loss = fn(idx, tgt)
            loss.backward()
            losses.append(loss.float().item())
        c_loss, loss_ok, grads_bad, grad = against_f32(losses, ref, eager, mine)
        worst_loss, worst_grad = max(worst_loss, c_loss), max(worst_grad, grad)
        ok, bad = ok and loss_ok, bad + grads_bad
    runs = rt.stats()["program_runs"] - before.get("program_runs", 0)
    record(f"{name}: an f32 model under torch.autocast(bf16), compiled, as close to f32 as eager autocast",
           ok and not bad and runs > 0,
           f"worst loss {worst_loss:.2e}, worst gradient {worst_grad:.2e}, {runs} Runs"
           f"{'; ' + '; '.join(bad[:3]) if bad else ''}")
    torch._dynamo.reset()


def check_partition(name, steps=2):
    """options={"partition": "min_cut"} trains as eager does; an unknown
    option is refused by name at the first call."""
    vocab, seq, layers, heads, batch = 512, 128, 2, max(2, D // 64), 4
    torch._dynamo.reset()
    eager = models.build(name, vocab, seq, D, layers, heads, dtype=torch.bfloat16)
    mine = models.build(name, vocab, seq, D, layers, heads, dtype=torch.bfloat16)
    compiled = torch.compile(mine, backend="regen", dynamic=False, options={"partition": "min_cut"})
    worst = max(_loss_gap(eager, mine, compiled, vocab, batch, seq, step) for step in range(steps))
    grads = max(rel(b.grad.float(), a.grad.float()) for a, b in zip(eager.parameters(), mine.parameters())
                if a.grad is not None)
    record(f"{name}: options={{'partition': 'min_cut'}} trains as eager does",
           worst <= 5e-3 and grads <= 5e-2, f"worst loss {worst:.1e}, worst gradient {grads:.1e}")
    torch._dynamo.reset()
    bad = torch.compile(models.build(name, vocab, seq, D, layers, heads, dtype=torch.bfloat16),
                        backend="regen", options={"partitioner": "min_cut"})
    try:
        bad(*models.batch(vocab, batch, seq, 0))
        record(f"{name}: an unknown backend option refused", False, "it compiled")
    except Exception as e:
        record(f"{name}: an unknown backend option refused", "partitioner" in str(e), str(e)[:200])
    torch._dynamo.reset()


def check_recycle(name, steps=10):
    """options={"recycle": True} trains as eager does, and its programs'
    operands stay where they were: each program is captured once or twice
    and replayed after (outputs allocated anew moved nearly every step: 4
    captures, then Runs on the stream)."""
    vocab, seq, layers, heads, batch = 512, 128, 2, max(2, D // 64), 4
    torch._dynamo.reset()
    eager = models.build(name, vocab, seq, D, layers, heads, dtype=torch.bfloat16)
    mine = models.build(name, vocab, seq, D, layers, heads, dtype=torch.bfloat16)
    compiled = torch.compile(mine, backend="regen", dynamic=False, options={"recycle": True})
    before = _programs()
    worst = max(_loss_gap(eager, mine, compiled, vocab, batch, seq, step) for step in range(steps))
    grads = max(rel(b.grad.float(), a.grad.float()) for a, b in zip(eager.parameters(), mine.parameters())
                if a.grad is not None)
    record(f"{name}: options={{'recycle': True}} trains as eager does",
           worst <= 5e-3 and grads <= 5e-2, f"worst loss {worst:.1e}, worst gradient {grads:.1e}")
    mine_now = [p for p in rt.runtime().client.program_status(0) if p["program"] not in before]
    seen = [(p["program"], p.get("graph_captures"), p.get("graph_launches"), p.get("stream_runs")) for p in mine_now]
    recycled = "; ".join(f"{r['kind']}: {r['recycled']['reused']} written into kept outputs, "
                         f"{r['recycled']['made']} made, kept ones held by use count {r['recycled']['held']}"
                         for r in rt.explain(show=False) if "recycled" in r)
    record(f"{name}: options={{'recycle': True}}: each program captured at most twice, replayed after",
           bool(mine_now) and all((c or 0) <= 2 and (s or 0) <= 2 for _, c, _, s in seen),
           "; ".join(f"{n}: {c} captures, {la} launches, {s} on the stream" for n, c, la, s in seen) +
           f" ({recycled})")
    torch._dynamo.reset()


def train_with_faults(name, steps, faults, admin):
    """(losses, parameters, slowest step's seconds, slowest faulted step's
    seconds) of ``steps`` compiled AdamW steps, with faults {step: kind}:
    "device_lost" is injected once the step's forward has run (between its
    two Runs), "restart" before the step."""
    import time
    vocab, seq, layers, heads, batch = 512, 128, 2, max(2, D // 64), 4
    model = models.build(name, vocab, seq, D, layers, heads, dtype=torch.bfloat16)
    compiled = torch.compile(model, backend="regen", dynamic=False)
    o = torch.optim.AdamW(model.parameters(), lr=1e-3)
    losses, plain, faulted = [], 0.0, 0.0
    for step in range(steps):
        idx, tgt = models.batch(vocab, batch, seq, step)
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        kind = faults.get(step)
        if kind == "restart":
            admin.restart(0, reason="test_compile")
        o.zero_grad(set_to_none=True)
        loss = compiled(idx, tgt)
        if kind == "device_lost":
            lose_device(admin)
        loss.backward()
        o.step()
        losses.append(loss.float().item())
        took = time.perf_counter() - t0
        if kind:
            faulted = max(faulted, took)
        elif step > 1:
            plain = max(plain, took)
    params = [p.detach().float().clone() for p in model.parameters()]
    torch._dynamo.reset()
    return losses, params, plain, faulted


def check_faults(name, admin):
    steps = 6
    before = rt.stats()
    base = train_with_faults(name, steps, {}, admin)
    hit = train_with_faults(name, steps, {2: "device_lost", 4: "restart"}, admin)
    after = rt.stats()
    worst_loss = max(abs(a - b) / abs(b) for a, b in zip(hit[0], base[0]))
    worst_param = max(rel(a, b) for a, b in zip(hit[1], base[1]))
    record(f"{name}: a device_lost between a step's Runs and a restart before one: same losses and weights",
           worst_loss <= 1e-3 and worst_param <= 1e-3,
           f"worst loss {worst_loss:.1e}, worst parameter {worst_param:.1e}, "
           f"{after['retries'] - before['retries']} retries, {after['recoveries'] - before['recoveries']} recoveries")
    record(f"{name}: a faulted step costs at most 1 s more", hit[3] - hit[2] <= 1.0,
           f"slowest faulted step {hit[3]:.2f} s, slowest plain step {hit[2]:.2f} s")


def main():
    regend, steps = gpu_script_args(3)
    with cuda_regend(regend) as daemon:
        rt.configure(socket=daemon.socket, ordering="events")
        for name in MODELS:
            guarded(f"{name}: compiled training", check_model, name, steps)
            torch._dynamo.reset()
            guarded(f"{name}: what the forward saves", check_saved, name)
            torch._dynamo.reset()
        for check in (check_recompile, check_autocast, check_partition, check_recycle):
            guarded(f"{MODELS[0]}: {check.__name__}", check, MODELS[0])
            torch._dynamo.reset()
        admin = regen.Client(daemon.socket, timeout=120)
        try:
            guarded(f"{MODELS[0]}: faults in compiled training", check_faults, MODELS[0], admin)
        finally:
            admin.close()
    return summary()


if __name__ == "__main__":
    sys.exit(main())
