#!/usr/bin/env python3
"""PyTorch and regend on one GPU: a torch process shares its CUDA tensors with
regend by CUDA IPC (regen.Client.import_tensor), runs GEMMs there and checks
them against torch float64 on the same fresh random inputs; then faults the
device (device_lost, restart, worker crash) and checks that the torch
process's own tensors and CUDA context come through untouched and that work
carries on after re-importing.

    python3 tests/gpu/test_torch_interop.py [path/to/regend]

regend defaults to $REGEND, then $REGEN_BUILD_ROOT/daemon/regend, then
build/daemon/regend.  Exit 0 = pass, 1 = fail, 77 = skipped (no torch or no
CUDA).  Prints one line per check and "N passed, N failed" last.
"""

import math
import os
import sys
import time
import traceback

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "..", "client", "python"))
sys.path.insert(0, os.path.join(HERE, "..", "lib"))
from regend_fixture import Regend, find_regend, require_torch, torch_rel_error as rel_err  # noqa: E402

# Skips (77) without torch or a CUDA device; keeps memory shareable by CUDA IPC.
torch = require_torch()

import regen  # noqa: E402

DEV = 0
# ||out - ref|| / ||ref|| allowed, ref = float64 on the inputs as stored.
TOL = {"f32": 1e-5, "tf32": 1e-3, "bf16": 1e-2, "f16": 1e-2}
TORCH_DTYPE = {"f32": torch.float32, "bf16": torch.bfloat16, "f16": torch.float16}

results = []


def record(name, ok, detail=""):
    results.append((name, ok))
    print(f"{'PASS' if ok else 'FAIL'}  {name:<52} {detail}", flush=True)
    return ok


def fresh_generator():
    seed = int.from_bytes(os.urandom(8), "little") & ((1 << 63) - 1)
    return torch.Generator(device=f"cuda:{DEV}").manual_seed(seed)


def randn(shape, dtype, g):
    return torch.randn(shape, device=f"cuda:{DEV}", generator=g, dtype=torch.float32).to(dtype)


def gelu_tanh(x):
    return 0.5 * x * (1.0 + torch.tanh(math.sqrt(2.0 / math.pi) * (x + 0.044715 * x ** 3)))


def gemm_case(c, m, n, k, dtype="f32", out_dtype=None, trans_a=False, trans_b=False, alpha=1.0, beta=0.0,
              with_c=False, epilogue=None, tf32=False, views=False, layout=None):
    """One GEMM through regend on fresh torch tensors, against float64.
    views: pass transposes as torch views (a.t()) rather than flags.
    layout: "offset" (a is a row slice of a bigger tensor) or "padded"
    (a's rows are K + 64 apart)."""
    out_dtype = out_dtype or dtype
    td, to = TORCH_DTYPE[dtype], TORCH_DTYPE[out_dtype]
    g = fresh_generator()
    a_store = randn([k, m] if trans_a else [m, k], td, g)
    if layout == "offset":
        big = randn([m + 37, k], td, g)
        a_store = big[37:]
    elif layout == "padded":
        big = randn([m, k + 64], td, g)
        a_store = big[:, :k]
    b_store = randn([n, k] if trans_b else [k, n], td, g)
    d = torch.full((m, n), float("nan"), device=f"cuda:{DEV}", dtype=to)
    c_t = randn([m, n], to, g) if with_c else None
    bias = randn([n], to, g) if epilogue in ("bias", "gelu_bias") else None

    a_op = a_store.t() if trans_a else a_store     # op(A) as a [m, k] view
    b_op = b_store.t() if trans_b else b_store     # op(B) as a [k, n] view
    if views:
        us = c.gemm(a_op, b_op, d, c=c_t, bias=bias, alpha=alpha, beta=beta, epilogue=epilogue, tf32=tf32)
    else:
        us = c.gemm(a_store, b_store, d, c=c_t, bias=bias, trans_a=trans_a, trans_b=trans_b, alpha=alpha,
                    beta=beta, epilogue=epilogue, tf32=tf32)
    ref = alpha * (a_op.double() @ b_op.double())
    if with_c:
        ref = ref + beta * c_t.double()
    if bias is not None:
        ref = ref + bias.double()
    if epilogue in ("gelu", "gelu_bias"):
        ref = gelu_tanh(ref)
    torch.cuda.synchronize()
    err = rel_err(d, ref)
    tol = TOL["tf32"] if tf32 else max(TOL[dtype], TOL[out_dtype])
    flags = ("T" if trans_a else "N") + ("T" if trans_b else "N")
    extras = []
    if out_dtype != dtype:
        extras.append(f"->{out_dtype}")
    if tf32:
        extras.append("tf32")
    if with_c:
        extras.append(f"a={alpha} b={beta} +C")
    if epilogue:
        extras.append(epilogue)
    if views:
        extras.append("views")
    if layout:
        extras.append(layout)
    name = f"gemm {dtype} {m}x{n}x{k} {flags} {' '.join(extras)}".strip()
    ok = math.isfinite(err) and err <= tol
    record(name, ok, f"rel {err:.2e} (tol {tol:.0e})  regend {us} us")


def run_gemms(c):
    cases = [
        dict(m=512, n=384, k=1024),
        dict(m=127, n=65, k=33),
        dict(m=256, n=192, k=320, trans_a=True),
        dict(m=256, n=192, k=320, trans_b=True),
        dict(m=256, n=192, k=320, trans_a=True, trans_b=True),
        dict(m=256, n=192, k=320, trans_a=True, trans_b=True, views=True),
        dict(m=512, n=384, k=1024, tf32=True),
        dict(m=256, n=192, k=320, alpha=0.5, beta=-1.5, with_c=True),
        dict(m=256, n=192, k=320, epilogue="bias"),
        dict(m=256, n=192, k=320, epilogue="gelu"),
        dict(m=256, n=192, k=320, epilogue="gelu_bias", alpha=2.0, beta=0.5, with_c=True),
        dict(m=200, n=128, k=256, layout="offset"),
        dict(m=200, n=128, k=256, layout="padded"),
    ]
    for dt in ("bf16", "f16"):
        cases += [
            dict(m=1024, n=768, k=2048, dtype=dt),
            dict(m=127, n=72, k=40, dtype=dt),
            dict(m=256, n=192, k=320, dtype=dt, trans_a=True),
            dict(m=256, n=192, k=320, dtype=dt, trans_b=True),
            dict(m=256, n=192, k=320, dtype=dt, trans_a=True, trans_b=True, views=True),
            dict(m=512, n=384, k=1024, dtype=dt, out_dtype="f32"),
            dict(m=256, n=192, k=320, dtype=dt, alpha=0.5, beta=-1.5, with_c=True),
            dict(m=256, n=192, k=320, dtype=dt, epilogue="bias"),
            dict(m=256, n=192, k=320, dtype=dt, epilogue="gelu_bias"),
        ]
    for case in cases:
        try:
            gemm_case(c, **case)
        except Exception as e:
            record(f"gemm {case}", False, f"{type(e).__name__}: {e}")


# -- lifecycle ------------------------------------------------------------------

def attention_reference(q, k, v, scale, causal):
    """float64 attention, its log-sum-exp, and a function giving the input
    gradients for an incoming d_o (autograd in float64)."""
    q64, k64, v64 = (t.double().detach().requires_grad_(True) for t in (q, k, v))
    s = (q64 @ k64.transpose(-1, -2)) * scale
    if causal:
        sq, skv = s.shape[-2], s.shape[-1]
        mask = torch.ones(sq, skv, dtype=torch.bool, device=s.device).triu(1)
        s = s.masked_fill(mask, float("-inf"))
    lse = torch.logsumexp(s, dim=-1)
    o = torch.softmax(s, dim=-1) @ v64

    def grads(d_o):
        return torch.autograd.grad(o, (q64, k64, v64), d_o.double(), retain_graph=True)
    return o.detach(), lse.detach(), grads


def attention_case(c, b, h, sq, skv, d, dv, dtype, causal):
    td = TORCH_DTYPE[dtype]
    g = fresh_generator()
    q, k, v = randn([b, h, sq, d], td, g), randn([b, h, skv, d], td, g), randn([b, h, skv, dv], td, g)
    o = torch.full([b, h, sq, dv], float("nan"), device=q.device, dtype=td)
    stats = torch.full([b, h, sq], float("nan"), device=q.device, dtype=torch.float32)
    scale = 1.0 / math.sqrt(d)
    ref_o, ref_lse, grads = attention_reference(q, k, v, scale, causal)
    name = f"attention {dtype} B{b} H{h} Sq{sq} Skv{skv} D{d} Dv{dv}{' causal' if causal else ''}"
    c.attention(q, k, v, o, stats=stats, causal=causal)
    torch.cuda.synchronize()
    tol = 2e-5 if dtype == "f32" else TOL[dtype]
    e_o, e_l = rel_err(o, ref_o), rel_err(stats, ref_lse)
    ok = bool(torch.isfinite(o).all()) and e_o < tol and e_l < tol
    record(name, ok, f"o {e_o:.2e}  lse {e_l:.2e}  (tol {tol:g})")
    d_o = randn([b, h, sq, dv], td, g)
    dq, dk, dvv = (torch.full_like(t, float("nan")) for t in (q, k, v))
    c.attention_backward(q, k, v, o, d_o, stats, dq, dk, dvv, causal=causal)
    torch.cuda.synchronize()
    ref_dq, ref_dk, ref_dv = grads(d_o)
    errs = [rel_err(x, r) for x, r in ((dq, ref_dq), (dk, ref_dk), (dvv, ref_dv))]
    # The backward pass starts from o as stored (rounded to dtype): allow a
    # little more than the forward.
    btol = 5e-5 if dtype == "f32" else 2 * TOL[dtype]
    ok = all(torch.isfinite(t).all() for t in (dq, dk, dvv)) and max(errs) < btol
    record(name + " backward", ok, f"dq {errs[0]:.2e} dk {errs[1]:.2e} dv {errs[2]:.2e} (tol {btol:g})")


def event_chain_case(c):
    """The rank produces A on its own stream and records an interprocess
    event; regend's GEMM waits on it and records the rank's second event;
    the rank's stream waits on that before reading D. No host
    synchronisation between producer and GEMM: if regend did not wait, it
    would read A's NaN poison."""
    g = fresh_generator()
    n = 1024
    a_real = randn([n, n], torch.float32, g)
    b = randn([n, n], torch.float32, g)
    a = torch.full([n, n], float("nan"), device=b.device)
    d = torch.full([n, n], float("nan"), device=b.device)
    ref = a_real.double() @ b.double()
    ev_in = torch.cuda.Event(interprocess=True)
    ev_out = torch.cuda.Event(interprocess=True)
    ev_in.record()
    ev_out.record()
    torch.cuda.synchronize()
    bufs = {name: c.import_tensor(t) for name, t in (("a", a), ("b", b), ("d", d))}
    e_in = c.import_event(DEV, ev_in.ipc_handle())
    e_out = c.import_event(DEV, ev_out.ipc_handle())
    ops = {name: regen.Operand(buf.id, 0, "f32", [n, n]) for name, buf in bufs.items()}
    torch.cuda._sleep(100_000_000)          # ~50 ms of GPU time before A exists
    a.copy_(a_real)
    ev_in.record()
    t0 = time.monotonic()
    c.gemm(ops["a"], ops["b"], ops["d"], wait_event=e_in, signal_event=e_out)
    torch.cuda.current_stream().wait_event(ev_out)
    out = d.clone()                          # ordered after regend's GEMM on the rank's stream
    torch.cuda.synchronize()
    err = rel_err(out, ref)
    record("wait/signal events chain a rank's stream and regend's GEMM", bool(torch.isfinite(out).all()) and err < 1e-5,
           f"rel {err:.2e}, call {1000 * (time.monotonic() - t0):.1f} ms")
    c.close_event(e_in)
    c.close_event(e_out)
    for t in (a, b, d):
        c.close_tensor(t)


def run_attention(c):
    for dtype in ("f32", "bf16", "f16"):
        for causal in (False, True):
            attention_case(c, 2, 3, 128, 128, 64, 64, dtype, causal)
    attention_case(c, 1, 2, 77, 200, 128, 96, "bf16", True)
    attention_case(c, 1, 1, 300, 64, 32, 48, "f32", True)


def snapshot(tensors):
    torch.cuda.synchronize()
    return {k: v.detach().to("cpu", copy=True) for k, v in tensors.items()}


def intact(tensors, snap):
    torch.cuda.synchronize()
    bad = [k for k, v in tensors.items() if not torch.equal(v.cpu(), snap[k])]
    return not bad, bad


def torch_healthy():
    """The torch process's own context still works: a matmul of its own."""
    g = fresh_generator()
    x = torch.randn(1024, 1024, device=f"cuda:{DEV}", generator=g)
    y = x @ x
    torch.cuda.synchronize()
    return rel_err(y, x.double() @ x.double())


def wait_new_generation(c, gen0, probe=None, timeout=60.0):
    """Poll Generation until the device serves a generation after gen0.  If
    nothing changed after a second, call ``probe`` once: a backend may only
    notice a lost context on the next call."""
    start = time.monotonic()
    probed = False
    while True:
        info = next(d for d in c.generation()["devices"] if d["index"] == DEV)
        if info["generation"] > gen0 and info["state"] == "ready":
            return info
        elapsed = time.monotonic() - start
        if probe is not None and not probed and elapsed > 1.0 and info["generation"] == gen0:
            probed = True
            try:
                probe()
            except regen.Error as e:
                print(f"      probe call: {type(e).__name__}")
        if elapsed > timeout:
            raise TimeoutError(f"device {DEV} still at {info} after {timeout} s")
        time.sleep(0.02)


def lifecycle_case(c, kind):
    g = fresh_generator()
    a = randn([512, 256], torch.bfloat16, g)
    b = randn([256, 384], torch.bfloat16, g)
    d = torch.zeros(512, 384, device=f"cuda:{DEV}", dtype=torch.bfloat16)
    weights = randn([1024, 1024], torch.float32, g)   # never shared
    optimizer_state = randn([4096], torch.float32, g)  # never shared
    ref = a.double() @ b.double()

    bufs = [c.import_tensor(t) for t in (a, b, d)]
    c.gemm(a, b, d)
    err = rel_err(d, ref)
    if not record(f"{kind}: gemm before", err <= TOL["bf16"], f"rel {err:.2e}"):
        return
    mine = {"a": a, "b": b, "d": d, "weights": weights, "optimizer_state": optimizer_state}
    snap = snapshot(mine)
    gen0 = bufs[0].generation

    t0 = time.monotonic()
    if kind == "device_lost":
        c.inject_fault(DEV, "device_lost")
    elif kind == "crash":
        c.inject_fault(DEV, "crash")
    elif kind == "restart":
        c.restart(DEV, reason="torch interop test")
    probe = lambda: c.gemm(regen.Operand(bufs[0], 0, "bf16", [512, 256]),  # noqa: E731
                           regen.Operand(bufs[1], 0, "bf16", [256, 384]),
                           regen.Operand(bufs[2], 0, "bf16", [512, 384]))
    info = wait_new_generation(c, gen0, probe)
    ms = (time.monotonic() - t0) * 1e3
    record(f"{kind}: new generation", info["generation"] > gen0,
           f"gen {gen0} -> {info['generation']} in {ms:.0f} ms ({info['reason']}), respawns {info['respawns']}")

    ok, bad = intact(mine, snap)
    record(f"{kind}: torch's own tensors intact", ok, "bitwise equal" if ok else f"changed: {bad}")
    err = torch_healthy()
    record(f"{kind}: torch's own context healthy", err <= 1e-3, f"own matmul rel {err:.2e}")

    old = regen.Operand(bufs[0], 0, "bf16", [512, 256])
    try:
        c.gemm(old, regen.Operand(bufs[1], 0, "bf16", [256, 384]), regen.Operand(bufs[2], 0, "bf16", [512, 384]))
        record(f"{kind}: old ids refused", False, "GEMM on old buffers succeeded")
    except regen.StaleGeneration as e:
        record(f"{kind}: old ids refused", e.generation == info["generation"],
               f"StaleGeneration (generation {e.generation})")
    except regen.Error as e:
        record(f"{kind}: old ids refused", False, f"expected StaleGeneration, got {type(e).__name__}: {e}")

    d.zero_()
    new = c.import_tensor(a)
    c.gemm(a, b, d)  # b and d are imported again on the way
    err = rel_err(d, ref)
    record(f"{kind}: re-import and gemm", new.generation == info["generation"] and err <= TOL["bf16"],
           f"{new.id}, rel {err:.2e}")
    ok, bad = intact({"weights": weights, "optimizer_state": optimizer_state},
                     {"weights": snap["weights"], "optimizer_state": snap["optimizer_state"]})
    record(f"{kind}: unshared tensors still intact", ok, "" if ok else f"changed: {bad}")


def main():
    regend = find_regend(sys.argv[1] if len(sys.argv) > 1 else None)
    if not regend or not os.access(regend, os.X_OK):
        print(f"FAIL: no regend at {regend} (pass its path as the first argument)")
        return 1
    print(f"torch {torch.__version__}, CUDA {torch.version.cuda}, {torch.cuda.get_device_name(DEV)}; regend {regend}")
    daemon = Regend(regend, devices=1, backend="cuda", ready_timeout=120)
    try:
        c = regen.Client(daemon.socket, timeout=120)
        st = c.status()
        info = st["devices"][DEV]
        print(f"regend: backend {info['backend']}, worker {info['worker_pid']}, generation {info['generation']}")
        if info["backend"] != "cuda":
            record("regend runs the cuda backend", False, f"backend is {info['backend']}")
        run_gemms(c)
        try:
            event_chain_case(c)
        except Exception as e:
            record("wait/signal events", False, f"{type(e).__name__}: {e}")
            traceback.print_exc()
        try:
            run_attention(c)
        except Exception as e:
            record("attention", False, f"{type(e).__name__}: {e}")
            traceback.print_exc()
        for kind in ("device_lost", "restart", "crash"):
            try:
                lifecycle_case(c, kind)
            except Exception as e:
                record(f"{kind}: lifecycle", False, f"{type(e).__name__}: {e}")
                traceback.print_exc()
        torch.cuda.synchronize()
        c.close()
    finally:
        failed = sum(1 for _, ok in results if not ok)
        if failed:
            print("--- regend log (tail) ---")
            print(daemon.log_tail(60))
        daemon.stop()
    passed = sum(1 for _, ok in results if ok)
    failed = len(results) - passed
    print(f"{passed} passed, {failed} failed")
    return 0 if failed == 0 and passed > 0 else 1


if __name__ == "__main__":
    sys.exit(main())
