#!/usr/bin/env python3
# SPDX-License-Identifier: Apache-2.0
"""Programs (io.regen.Program) on the CUDA backend, from a torch process:
every pointwise op, reduction and gather, fused chains, dropout masks
against a Philox reference bit for bit, and a GPT block's
forward and backward, each against torch float64 on the same fresh random
inputs; Runs launched as a CUDA graph, rebinding other buffers (the graph
replays, or is captured again when a library call's operand moved;
with program_gemm_slots, GEMMs' moved operands replay it too); a
Release and a device_lost in between, after which the same program (not
defined again) gives the same results; and the bounds on what compiling a
uid's programs may cost (max_uid_compile_ms, max_uid_module_mib).

    python3 tests/gpu/test_program.py [path/to/regend] [--only ops,gather,chains,dropout,block,gemm_slots,faults,compile_limits]

Exit 0 = pass, 1 = fail, 77 = skipped (no torch or no CUDA). Prints one
line per check and "N passed, N failed" last.
"""

import math
import os
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "..", "client", "python"))
sys.path.insert(0, os.path.join(HERE, "..", "lib"))
sys.path.insert(0, os.path.join(HERE, "..", "bench"))
from regend_fixture import Regend, find_regend, guarded, record, record_width, require_torch, summary, \
    torch_rel_error as rel_err  # noqa: E402

torch = require_torch()

import regen  # noqa: E402
import program_block  # noqa: E402

DEV = 0
TORCH = {"f32": torch.float32, "bf16": torch.bfloat16, "f16": torch.float16, "f64": torch.float64}
# ||out - ref|| / ||ref|| allowed, ref = float64 on the inputs as stored.
TOL = {"f32": 2e-6, "bf16": 1e-2, "f16": 2e-3}
record_width(52)


def generator():
    seed = int.from_bytes(os.urandom(8), "little") & ((1 << 63) - 1)
    print(f"seed {seed}")
    return torch.Generator(device=f"cuda:{DEV}").manual_seed(seed)


def gelu_tanh(x):
    return 0.5 * x * (1.0 + torch.tanh(math.sqrt(2.0 / math.pi) * (x + 0.044715 * x ** 3)))


def gelu_erf(x):
    return 0.5 * x * (1.0 + torch.erf(x / math.sqrt(2.0)))


# name: (inputs, float64 reference, input generator kind)
UNARY = {
    "neg": lambda x: -x, "exp": torch.exp, "log": torch.log, "tanh": torch.tanh, "erf": torch.erf,
    "sigmoid": torch.sigmoid, "silu": lambda x: x * torch.sigmoid(x), "gelu": gelu_erf, "gelu_tanh": gelu_tanh,
    "relu": torch.relu, "sqrt": torch.sqrt, "rsqrt": torch.rsqrt, "abs": torch.abs,
    "reciprocal": torch.reciprocal, "square": lambda x: x * x, "cast": lambda x: x,
}
POSITIVE = {"log", "sqrt", "rsqrt", "reciprocal"}
BINARY = {
    "add": torch.add, "sub": torch.sub, "mul": torch.mul, "div": torch.div, "maximum": torch.maximum,
    "minimum": torch.minimum, "pow": torch.pow,
    "eq": lambda a, b: (a == b).double(), "ne": lambda a, b: (a != b).double(), "lt": lambda a, b: (a < b).double(),
    "le": lambda a, b: (a <= b).double(), "gt": lambda a, b: (a > b).double(), "ge": lambda a, b: (a >= b).double(),
    "gelu_backward": lambda dy, x: dy * (0.5 * (1 + torch.erf(x / math.sqrt(2))) +
                                         x * torch.exp(-0.5 * x * x) / math.sqrt(2 * math.pi)),
    "silu_backward": lambda dy, x: dy * torch.sigmoid(x) * (1 + x * (1 - torch.sigmoid(x))),
    "sigmoid_backward": lambda dy, y: dy * y * (1 - y),
    "tanh_backward": lambda dy, y: dy * (1 - y * y),
    "relu_backward": lambda dy, x: torch.where(x > 0, dy, torch.zeros_like(dy)),
}


def one_op(c, g, op, dtype, nin, ref_fn, shape=(257, 1031), bshape=None):
    """Defines a one-node program, runs it, compares with ref_fn in f64."""
    td = TORCH[dtype]
    xs = []
    for i in range(nin):
        s = bshape if (bshape and i == 1) else shape
        x = torch.randn(s, device="cuda", generator=g, dtype=torch.float32)
        if op in POSITIVE:
            x = x.abs() + 0.1
        if op == "pow" and i == 0:
            x = x.abs() + 0.1
        xs.append(x.to(td))
    p = regen.ProgramBuilder(op)
    names = [p.input(f"x{i}", dtype, t.shape) for i, t in enumerate(xs)]
    y = p.output("y", dtype, shape)
    p.node(op, names, [y])
    prog = c.define_program(DEV, p.definition())
    out = torch.empty(shape, device="cuda", dtype=td)
    torch.cuda.synchronize()
    c.run_program(prog, dict({f"x{i}": t for i, t in enumerate(xs)}, y=out))
    ref = ref_fn(*[t.double() for t in xs])
    tol = TOL[dtype] * (4 if op in ("pow", "gelu_backward", "silu_backward") else 1)
    if op in ("eq", "ne", "lt", "le", "gt", "ge"):
        err = (out.double() != ref).sum().item()
        ok = err == 0
    else:
        err = rel_err(out, ref)
        ok = err <= tol
    c.drop_program(prog)
    return ok, err


def check_ops(c):
    g = generator()
    for dtype in ("f32", "bf16"):
        for op, fn in UNARY.items():
            ok, err = one_op(c, g, op, dtype, 1, fn)
            record(f"pointwise {op} {dtype}", ok, f"err {err:.2e}")
        for op, fn in BINARY.items():
            ok, err = one_op(c, g, op, dtype, 2, fn)
            record(f"pointwise {op} {dtype}", ok, f"err {err:.2e}")
    # Broadcasting: a row vector and a column.
    ok, err = one_op(c, g, "add", "f32", 2, torch.add, bshape=(1031,))
    record("broadcast [M,N] + [N]", ok, f"err {err:.2e}")
    ok, err = one_op(c, g, "mul", "f32", 2, torch.mul, bshape=(257, 1))
    record("broadcast [M,N] * [M,1]", ok, f"err {err:.2e}")
    # Reductions, both axes, with a pointwise prologue fused in.
    for axis in ("last", "leading"):
        for red, fn in (("sum", lambda t, d: t.sum(d)), ("mean", lambda t, d: t.mean(d)),
                        ("max", lambda t, d: t.amax(d)), ("min", lambda t, d: t.amin(d)),
                        ("amax", lambda t, d: t.abs().amax(d))):
            for dtype in ("f32", "bf16"):
                x = torch.randn(384, 4099, device="cuda", generator=g).to(TORCH[dtype])
                p = regen.ProgramBuilder(red)
                xi = p.input("x", dtype, x.shape)
                sq = p.intermediate("sq", "f32", x.shape)
                p.node("mul", [xi], [sq], scalar=1.5)
                shape = (384,) if axis == "last" else (4099,)
                y = p.output("y", "f32", shape)
                p.node(red, [sq], [y], axis=axis)
                prog = c.define_program(DEV, p.definition())
                out = torch.empty(shape, device="cuda")
                torch.cuda.synchronize()
                c.run_program(prog, {"x": x, "y": out})
                ref = fn(x.double() * 1.5, 1 if axis == "last" else 0)
                err = rel_err(out, ref)
                record(f"reduction {red} {axis} {dtype}", err <= 1e-5, f"err {err:.2e}")
                c.drop_program(prog)


def check_gather(c):
    """Embedding and its backward against torch in f64, with repeated
    indices; then an index outside the table: the Run fails with
    InvalidOperand naming the index tensor, its place and value (the host
    backend refuses the same Run before it runs), and the next Run with
    good indices is right again (the kernels' note is cleared)."""
    g = generator()
    V, D, B, S = 1000, 256, 4, 512
    p = regen.ProgramBuilder("embed")
    wte = p.input("wte", "bf16", (V, D))
    ids = p.input("ids", "i64", (B, S))
    e = p.output("e", "bf16", (B, S, D))
    de = p.input("de", "bf16", (B * S, D))
    dwte = p.output("dwte", "f32", (V, D))
    p.node("embedding", [wte, ids], [e])
    p.node("embedding_backward", [de, ids], [dwte])
    prog = c.define_program(DEV, p.definition())
    w = torch.randn(V, D, device="cuda", generator=g).to(torch.bfloat16)
    d_e = torch.randn(B * S, D, device="cuda", generator=g).to(torch.bfloat16)
    out_e = torch.empty(B, S, D, device="cuda", dtype=torch.bfloat16)
    out_dw = torch.empty(V, D, device="cuda")

    def run(index):
        torch.cuda.synchronize()
        c.run_program(prog, {"wte": w, "ids": index, "e": out_e, "de": d_e, "dwte": out_dw})

    def check(index, what):
        run(index)
        ref_e = w.double()[index]
        ref_dw = torch.zeros(V, D, dtype=torch.float64, device="cuda").index_add_(
            0, index.reshape(-1), d_e.double())
        ok_e = torch.equal(out_e, ref_e.to(torch.bfloat16))
        err = rel_err(out_dw, ref_dw)
        record(f"gather embedding, {what}", ok_e, "rows copied exactly" if ok_e else "rows differ")
        record(f"gather embedding_backward, {what}", err <= 1e-6, f"err {err:.2e}")

    index = torch.randint(0, V // 10, (B, S), device="cuda", generator=g)   # many repeats
    check(index, "repeated indices")
    bad = index.clone()
    where = (int(torch.randint(0, B, (1,), generator=g, device="cuda")), int(torch.randint(0, S, (1,), generator=g, device="cuda")))
    bad[where] = V + 3
    try:
        run(bad)
        record("gather: an index outside the table is refused", False, "the Run succeeded")
    except regen.InvalidOperand as x:
        text = str(x)
        ok = x.parameters.get("operand") == "ids" and f"[{where[0]}, {where[1]}]" in text and str(V + 3) in text
        record("gather: an index outside the table is refused", ok, text[:160])
    check(index, "after a bad index")
    c.drop_program(prog)


def check_chains(c):
    """A chain fused into one kernel: y = gelu_tanh(x * w + b) - x / 3, and a
    softmax cross-entropy lowered into reductions and pointwise nodes."""
    g = generator()
    M, N = 1000, 3000
    x = torch.randn(M, N, device="cuda", generator=g).bfloat16()
    w = torch.randn(N, device="cuda", generator=g).bfloat16()
    b = torch.randn(N, device="cuda", generator=g).bfloat16()
    p = regen.ProgramBuilder("chain")
    xi, wi, bi = p.input("x", "bf16", (M, N)), p.input("w", "bf16", (N,)), p.input("b", "bf16", (N,))
    t0, t1, t2, t3 = (p.intermediate(f"t{i}", "f32", (M, N)) for i in range(4))
    y = p.output("y", "bf16", (M, N))
    p.node("mul", [xi, wi], [t0])
    p.node("add", [t0, bi], [t1])
    p.node("gelu_tanh", [t1], [t2])
    p.node("div", [xi], [t3], scalar=3.0)
    p.node("sub", [t2, t3], [y])
    prog = c.define_program(DEV, p.definition())
    out = torch.empty(M, N, device="cuda", dtype=torch.bfloat16)
    torch.cuda.synchronize()
    c.run_program(prog, {"x": x, "w": w, "b": b, "y": out})
    xd = x.double()
    ref = gelu_tanh(xd * w.double() + b.double()) - xd / 3
    err = rel_err(out, ref)
    st = c.program_status(DEV, prog)[0]
    record("fused chain of 5 (one kernel)", err <= TOL["bf16"] and st["kernels"] == 1,
           f"err {err:.2e}, {st['kernels']} steps")
    c.drop_program(prog)

    V = 50257
    logits = torch.randn(512, V, device="cuda", generator=g) * 3
    target = torch.randint(0, V, (512,), device="cuda", generator=g, dtype=torch.int64)
    p = regen.ProgramBuilder("xent")
    li, ti = p.input("logits", "f32", (512, V)), p.input("target", "i64", (512,))
    loss = p.output("loss", "f32", (512,))
    dl = p.input("dloss", "f32", (512,))
    dlogits = p.output("dlogits", "f32", (512, V))
    lse = p.intermediate("lse", "f32", (512,))
    p.node("cross_entropy", [li, ti], [loss, lse])
    p.node("cross_entropy_backward", [dl, li, ti, lse], [dlogits])
    prog = c.define_program(DEV, p.definition())
    out_loss, out_d = torch.empty(512, device="cuda"), torch.empty(512, V, device="cuda")
    dloss = torch.rand(512, device="cuda", generator=g)
    torch.cuda.synchronize()
    c.run_program(prog, {"logits": logits, "target": target, "loss": out_loss, "dloss": dloss, "dlogits": out_d})
    ld = logits.double().requires_grad_()
    ref = torch.nn.functional.cross_entropy(ld, target, reduction="none")
    (ref_d,) = torch.autograd.grad(ref, ld, dloss.double())
    e1, e2 = rel_err(out_loss, ref.detach()), rel_err(out_d, ref_d)
    record("cross_entropy and its backward (V=50257)", e1 <= 1e-5 and e2 <= 1e-5, f"err {e1:.2e} {e2:.2e}")
    c.drop_program(prog)


def philox_word0(seed, stream, i):
    """Philox4x32-10's first word (Random123) at counters (i, i >> 32,
    stream, 0) under the key (seed, seed >> 32), for a tensor of indices i,
    in int64 arithmetic (a product's low 64 bits are the unsigned ones)."""
    m = 0xFFFFFFFF
    c0, c1 = i & m, (i >> 32) & m
    c2, c3 = torch.full_like(i, stream), torch.zeros_like(i)
    k0, k1 = seed & m, seed >> 32
    for r in range(10):
        if r:
            k0, k1 = (k0 + 0x9E3779B9) & m, (k1 + 0xBB67AE85) & m
        p0, p1 = c0 * 0xD2511F53, c2 * 0xCD9E8D57
        c0, c1, c2, c3 = ((p1 >> 32) & m) ^ c1 ^ k0, p1 & m, ((p0 >> 32) & m) ^ c3 ^ k1, p0 & m
    return c0


def dropout_reference(seed, stream, p, shape):
    """docs/protocol.md's mask: 1 where (w >> 8) 2^-24 >= p."""
    n = math.prod(shape)
    w = philox_word0(seed, stream, torch.arange(n, device="cuda", dtype=torch.int64))
    return ((w >> 8).double() * 2.0 ** -24 >= p).to(torch.uint8).reshape(shape)


def check_dropout(c):
    """dropout_mask on the CUDA backend: the stored mask is the documented
    Philox draw bit for bit (a reference in torch, itself checked against
    Random123's known answer); y = x * mask / (1 - p) and its backward,
    their masks drawn inline, are the same mask's; a new seed each Run,
    through the eager Runs and the graph's replays; the zeros a fraction p."""
    zero = philox_word0(0, 0, torch.zeros(1, device="cuda", dtype=torch.int64)).item()
    record("dropout: the torch reference is Philox4x32-10", zero == 0x6627e8d5, f"word 0 {zero:08x}")
    g = generator()
    M, N, P = 1024, 4099, 0.1
    scale = 1.0 / (1.0 - P)
    x = torch.randn(M, N, device="cuda", generator=g).bfloat16()
    dy = torch.randn(M, N, device="cuda", generator=g).bfloat16()
    p = regen.ProgramBuilder("dropout")
    seed = p.scalar("seed")
    xi, dyi = p.input("x", "bf16", (M, N)), p.input("dy", "bf16", (M, N))
    k, k2 = p.intermediate("k", "bf16", (M, N)), p.intermediate("k2", "bf16", (M, N))
    t, t2 = p.intermediate("t", "f32", (M, N)), p.intermediate("t2", "f32", (M, N))
    m, y, dx = p.output("m", "u8", (M, N)), p.output("y", "bf16", (M, N)), p.output("dx", "bf16", (M, N))
    p.node("dropout_mask", [seed], [m], p=P, stream=3)
    p.node("dropout_mask", [seed], [k], p=P, stream=3)
    p.node("mul", [xi, k], [t])
    p.node("mul", [t], [y], scalar=scale)
    p.node("dropout_mask", [seed], [k2], p=P, stream=3)
    p.node("mul", [dyi, k2], [t2])
    p.node("mul", [t2], [dx], scalar=scale)
    prog = c.define_program(DEV, p.definition())
    out_m = torch.empty(M, N, device="cuda", dtype=torch.uint8)
    out_y, out_dx = torch.empty_like(x), torch.empty_like(dy)
    bind = {"x": x, "dy": dy, "m": out_m, "y": out_y, "dx": out_dx}
    torch.cuda.synchronize()
    seeds = [0, (1 << 53) - 1] + [int.from_bytes(os.urandom(7), "little") & ((1 << 53) - 1) for _ in range(4)]
    for s in seeds:
        c.run_program(prog, bind, {"seed": s})
        torch.cuda.synchronize()
        ref = dropout_reference(s, 3, P, (M, N))
        wrong = (out_m != ref).sum().item()
        want_y = (x.float() * ref.float() * scale).bfloat16()
        want_dx = (dy.float() * ref.float() * scale).bfloat16()
        y_wrong = (out_y.view(torch.int16) != want_y.view(torch.int16)).sum().item()
        dx_wrong = (out_dx.view(torch.int16) != want_dx.view(torch.int16)).sum().item()
        zeros = (out_m == 0).sum().item()
        sd = math.sqrt(M * N * P * (1 - P))
        record(f"dropout seed {s}: mask, y, dx bit for bit", wrong == 0 and y_wrong == 0 and dx_wrong == 0 and
               abs(zeros - M * N * P) <= 5 * sd,
               f"{wrong} mask, {y_wrong} y, {dx_wrong} dx elements differ; {zeros} zeros of {M * N}")
    try:
        c.run_program(prog, bind, {"seed": 0.5})
        record("dropout: a fractional seed is refused", False, "accepted")
    except regen.InvalidParameter as e:
        record("dropout: a fractional seed is refused", e.parameters.get("parameter") == "scalars.seed",
               str(e.parameters))
    st = c.program_status(DEV, prog)[0]
    record("dropout: Runs past the eager ones replay a graph", st["graph_launches"] >= 1,
           f"kernels {st['kernels']}, captures {st['graph_captures']}, graph {st['graph_launches']}, "
           f"stream {st['stream_runs']}")
    c.drop_program(prog)


def check_compile_limits(c):
    """What compiling a uid's programs may cost on a device: with
    max_uid_compile_ms 1 the first Run that needs NVRTC is stopped and
    refused (LimitExceeded, compile time per uid) and so is the next (what
    it took is owed); with max_uid_module_mib 1 copies of one program each
    hold their own image until the uid's bytes would pass 1 MiB, that Run
    is refused (compiled module bytes per uid), and a Drop gives the bytes
    back. Each refused Run wrote nothing."""
    def chain(p):
        x = p.input("x", "f32", (256, 1024))
        t = [p.intermediate(f"t{i}", "f32", (256, 1024)) for i in range(6)]
        y = p.output("y", "f32", (256, 1024))
        for op, a, b in (("gelu", x, t[0]), ("tanh", t[0], t[1]), ("sigmoid", t[1], t[2]), ("exp", t[2], t[3]),
                         ("erf", t[3], t[4]), ("silu", t[4], t[5])):
            p.node(op, [a], [b])
        p.node("mul", [t[5], x], [y])

    def definition(name):
        p = regen.ProgramBuilder(name)
        chain(p)
        return p.definition()

    x = torch.randn(256, 1024, device="cuda")
    for extra, resource, what in ((("--max-uid-compile-ms", "1"), "compile time per uid", "compile time"),
                                  (("--max-uid-module-mib", "1"), "compiled module bytes per uid", "module bytes")):
        daemon = Regend(find_regend(c_regend[0]), devices=1, backend="cuda", ready_timeout=120, extra=extra)
        lc = regen.Client(daemon.socket, timeout=600)
        held, refused = [], None
        try:
            for k in range(400):
                prog = lc.define_program(DEV, definition(f"copy{k}"))
                y = torch.full((256, 1024), 7.0, device="cuda")
                torch.cuda.synchronize()
                try:
                    lc.run_program(prog, {"x": x, "y": y})
                except regen.LimitExceeded as e:
                    torch.cuda.synchronize()
                    refused = (e, prog, bool(torch.all(y == 7.0)))
                    break
                held.append(prog)
            if refused is None:
                record(f"compile limits: {what} refused", False, f"{len(held)} programs compiled, none refused")
                continue
            e, prog, untouched = refused
            ok = e.parameters.get("resource") == resource and untouched
            record(f"compile limits: {what} refused", ok,
                   f"after {len(held)} programs: {e.parameters.get('resource')}, limit {e.parameters.get('limit')}, "
                   f"output {'untouched' if untouched else 'WRITTEN'}")
            if resource == "compile time per uid":
                try:
                    lc.run_program(prog, {"x": x, "y": y})
                    record("compile limits: the owed compile time refuses the next Run", False, "it ran")
                except regen.LimitExceeded as e2:
                    record("compile limits: the owed compile time refuses the next Run",
                           e2.parameters.get("resource") == resource)
            else:
                st = lc.program_status(DEV, held[0])[0]
                lc.drop_program(held[0])
                lc.run_program(prog, {"x": x, "y": y})
                torch.cuda.synchronize()
                ref = x.double()
                for fn in (gelu_erf, torch.tanh, torch.sigmoid, torch.exp, torch.erf, lambda v: v * torch.sigmoid(v)):
                    ref = fn(ref)
                ref = ref * x.double()
                err = rel_err(y, ref)
                record("compile limits: a Drop gives module bytes back", err <= 1e-5,
                       f"a program held {st['module_bytes']} bytes, compiled in {st['compile_us']} us; err {err:.2e}")
        finally:
            lc.close()
            daemon.stop()


def block_setup(c, B=2, S=256, D=512, H=4):
    torch.manual_seed(1)
    block = program_block.torch_block(torch, B, S, D, H).cuda().to(torch.bfloat16)
    params = program_block.block_parameters(block)
    g = generator()
    x = torch.randn(B * S, D, device="cuda", generator=g).bfloat16()
    dy = (torch.randn(B * S, D, device="cuda", generator=g) / 16).bfloat16()
    prog = c.define_program(DEV, program_block.block_program(B, S, D, H))
    outs = {"y": torch.empty_like(x), "dx": torch.empty_like(x)}
    outs.update({"d_" + n: torch.empty_like(t) for n, t in params.items()})
    bind = dict(x=x, dy=dy, **{n: t.detach() for n, t in params.items()}, **outs)
    return block, params, x, dy, prog, outs, bind


def block_reference(block, params, x, dy):
    """The block in f32 on the bf16 values (the program accumulates in f32)."""
    ref = program_block.torch_block(torch, *block._dims).cuda().float()
    ref.load_state_dict({k: v.float() for k, v in block.state_dict().items()})
    xf = x.float().requires_grad_()
    y = ref(xf)
    names = list(params)
    grads = torch.autograd.grad(y, [xf] + [program_block.block_parameters(ref)[n] for n in names], dy.float())
    out = {"y": y.detach(), "dx": grads[0]}
    out.update({"d_" + n: grads[1 + i] for i, n in enumerate(names)})
    return out


def check_block(c):
    B, S, D, H = 2, 256, 512, 4
    block, params, x, dy, prog, outs, bind = block_setup(c, B, S, D, H)
    block._dims = (B, S, D, H)
    ref = block_reference(block, params, x, dy)
    for i in range(4):
        torch.cuda.synchronize()
        c.run_program(prog, bind)
        worst = max(rel_err(outs[k], ref[k]) for k in ref)
        record(f"GPT block fwd+bwd, Run {i + 1}", worst <= 2e-2, f"worst rel err {worst:.2e}")
    st = c.program_status(DEV, prog)[0]
    record("the block's Runs launch as one graph after the eager ones", st["graph_launches"] >= 1,
           f"captures {st['graph_captures']} graph {st['graph_launches']} stream {st['stream_runs']} "
           f"{st['not_captured']}")
    # Rebinding: the same program on other buffers, of which the library
    # calls' operands moved (a capture again) and the kernels' (a replay).
    x2 = (x.float() * 0.5).bfloat16()
    bind2 = dict(bind, x=x2)
    torch.cuda.synchronize()
    c.run_program(prog, bind2)
    ref2 = block_reference(block, params, x2, dy)
    worst = max(rel_err(outs[k], ref2[k]) for k in ref2)
    st2 = c.program_status(DEV, prog)[0]
    record("rebinding x: the right results", worst <= 2e-2,
           f"worst {worst:.2e}, captures {st['graph_captures']} -> {st2['graph_captures']}")
    # Lifecycle: Release (compiled forms dropped), then a fault; the program
    # is not defined again, its buffers are imported again.
    c.release(DEV, reason="test_program")
    bind3 = {k: v for k, v in bind.items()}
    torch.cuda.synchronize()
    c.run_program(prog, bind3)
    worst = max(rel_err(outs[k], ref[k]) for k in ref)
    record("after Release: same program, same results", worst <= 2e-2, f"worst {worst:.2e}")
    c.drop_program(prog)
    try:
        c.run_program(prog, bind)
        record("Run after Drop refused", False)
    except regen.NoSuchObject:
        record("Run after Drop refused", True)


def check_gemm_slots(c):
    """program_gemm_slots: the block's weight gradients (written by GEMMs
    alone) bound at new addresses each Run replay the graph captured
    before, writing where this Run's binding says and nothing where the
    last one's did; the same without the option captures again."""
    B, S, D, H = 2, 256, 512, 4
    for on in (True, False):
        what = "with program_gemm_slots" if on else "without"
        daemon = Regend(find_regend(c_regend[0]), devices=1, backend="cuda", ready_timeout=120,
                        extra=("--program-gemm-slots=true" if on else "--program-gemm-slots=false",))
        lc = regen.Client(daemon.socket, timeout=600)
        try:
            block, params, x, dy, prog, outs, bind = block_setup(lc, B, S, D, H)
            block._dims = (B, S, D, H)
            ref = block_reference(block, params, x, dy)
            wgrads = [k for k in outs if k.startswith("d_w")]
            for _ in range(4):     # past the eager Runs and the first capture
                torch.cuda.synchronize()
                lc.run_program(prog, bind)
            st = lc.program_status(DEV, prog)[0]
            worst_moved, stale, runs = 0.0, 0, 6
            held = []       # every Run's outputs alive: no address comes back
            for _ in range(runs):
                fresh = {k: torch.empty_like(outs[k]) for k in wgrads}
                held.append(fresh)
                for k in wgrads:            # last Run's: must stay as they are
                    bind[k].fill_(7.0)
                torch.cuda.synchronize()
                old = [bind[k] for k in wgrads]
                lc.run_program(prog, dict(bind, **fresh))
                torch.cuda.synchronize()
                worst_moved = max([worst_moved] + [rel_err(fresh[k], ref[k]) for k in wgrads])
                stale += sum(int(not torch.all(t == 7.0)) for t in old)
                bind.update(fresh)
            st2 = lc.program_status(DEV, prog)[0]
            captured = st2["graph_captures"] - st["graph_captures"]
            replayed = st2["graph_launches"] - st["graph_launches"]
            detail = (f"{', '.join(wgrads)} moved each of {runs} Runs: worst rel err {worst_moved:.2e}, captures "
                      f"{captured}, replays {replayed}, on the stream {st2['stream_runs'] - st['stream_runs']} "
                      f"{st2['not_captured']!r}")
            record(f"GEMM slots: moved outputs right, {what}", worst_moved <= 2e-2 and stale == 0,
                   f"{detail}; last Run's outputs written {stale} times")
            if on:
                record("GEMM slots: moved GEMM operands replay the graph", captured == 0 and replayed == runs, detail)
            else:
                record("GEMM slots off: moved GEMM operands are captured again or launched kernel by kernel",
                       captured + st2["stream_runs"] - st["stream_runs"] == runs, detail)
        finally:
            lc.close()
            daemon.stop()


def check_faults(c, mode="copy"):
    """100 AdamW steps through one program with a journal, device_lost
    injected at random points of random steps, bit-identical to the same
    steps without faults (the worker may respawn: its program comes back
    under its id, and the Run is retried by run_exactly_once). With a
    journal of marks only (mode "marks"), a Run cut after it began is
    refused (RunTorn) and the step taken again from a copy of the state
    made before it (the test's checkpoint), under a new seq."""
    import random
    import threading
    import time
    from regen.program import JOURNAL_MARKS_BYTES, run_exactly_once
    shapes = [(8192, 8192), (8192,), (16384, 4096)]

    def train(faults):
        g = torch.Generator(device="cuda").manual_seed(5)
        state = {}
        p = regen.ProgramBuilder("adamw")
        step, lr = p.scalar("step"), p.scalar("lr")
        for i, s in enumerate(shapes):
            state[f"w{i}"] = torch.randn(s, device="cuda", generator=g)
            state[f"g{i}"] = torch.empty(s, device="cuda")
            state[f"m{i}"], state[f"v{i}"] = torch.zeros(s, device="cuda"), torch.zeros(s, device="cuda")
            p.node("adamw", [p.inout(f"w{i}", "f32", s), p.input(f"g{i}", "f32", s), p.inout(f"m{i}", "f32", s),
                             p.inout(f"v{i}", "f32", s)], [], lr=lr, step=step, weight_decay=0.01)
        prog = c.define_program(DEV, p.definition())
        journal = torch.empty(prog.journal_bytes if mode == "copy" else JOURNAL_MARKS_BYTES, dtype=torch.uint8,
                              device="cuda")
        stop, injected = threading.Event(), [0]

        def injector():
            # FAULTS faults, each once the device serves again, a few
            # milliseconds into whatever Run is under way then: never a
            # fault on a device still recovering from the last.
            r = random.Random(3)
            admin = regen.Client(c_socket[0], timeout=60)
            while not stop.is_set() and injected[0] < FAULTS:
                d = admin.generation()["devices"][0]
                if d["state"] != "ready":
                    time.sleep(0.01)
                    continue
                time.sleep(r.uniform(0.0, 0.004))
                try:
                    admin.inject_fault(DEV, "device_lost")
                    injected[0] += 1
                except regen.Error:
                    continue
                while not stop.is_set():
                    d2 = admin.generation()["devices"][0]
                    if d2["generation"] > d["generation"] and d2["state"] == "ready":
                        break
                    time.sleep(0.01)
                time.sleep(r.uniform(0.0, 0.05))
            admin.close()

        th = threading.Thread(target=injector)
        if faults:
            th.start()
        attempts, seq, torn = 0, 0, 0
        try:
            for k in range(1, 101):
                gg = torch.Generator(device="cuda").manual_seed(1000 + k)
                for i, s in enumerate(shapes):
                    state[f"g{i}"].copy_(torch.randn(s, device="cuda", generator=gg))
                before = {n: t.clone() for n, t in state.items() if not n.startswith("g")} if mode == "marks" else {}
                torch.cuda.synchronize()
                while True:
                    seq += 1
                    try:
                        attempts += run_exactly_once(c, prog, state, journal, seq=seq,
                                                     scalars={"step": k, "lr": 1e-2}, timeout=300,
                                                     journal_mode=mode)
                        break
                    except regen.RunTorn:
                        torn += 1
                        attempts += 1
                        for n, t in before.items():
                            state[n].copy_(t)
                        torch.cuda.synchronize()
        finally:
            stop.set()
            if faults:
                th.join()
        st = c.program_status(DEV, prog)[0]
        st["torn"] = torn
        c.drop_program(prog)
        return {n: t.clone() for n, t in state.items() if not n.startswith("g")}, attempts, injected[0], st

    clean, a0, _, st0 = train(False)
    faulted, a1, injected, st1 = train(True)
    same = all(torch.equal(clean[n], faulted[n]) for n in clean)
    record(f"100 AdamW steps, a {mode} journal, device_lost at random points: bit-identical",
           same and injected == FAULTS and a1 > 100 and (mode == "copy" or st1["retries_restored"] == 0),
           f"{injected} faults, {a1} attempts, restored {st1['retries_restored']} applied {st1['retries_applied']} "
           f"torn {st1['retries_torn']} (steps taken again {st1['torn']}) (graph launches {st0['graph_launches']} "
           f"of {st0['runs']} without faults)")
    record(f"a {mode} journal's Runs captured as graphs", st0["graph_launches"] > 50,
           f"{st0['graph_launches']} of {st0['runs']}")


c_socket = [None]
c_regend = [None]
FAULTS = 6


def main():
    only = sys.argv[sys.argv.index("--only") + 1].split(",") if "--only" in sys.argv else None
    regend = next((a for a in sys.argv[1:] if not a.startswith("--") and os.path.exists(a)), None)
    daemon = Regend(find_regend(regend), devices=1, backend="cuda", ready_timeout=120)
    c = regen.Client(daemon.socket, timeout=600)
    c_socket[0] = daemon.socket
    c_regend[0] = regend
    try:
        for name, fn in (("ops", check_ops), ("gather", check_gather), ("chains", check_chains),
                         ("dropout", check_dropout), ("block", check_block), ("gemm_slots", check_gemm_slots),
                         ("faults", check_faults),
                         ("faults_marks", lambda c: check_faults(c, "marks")),
                         ("compile_limits", check_compile_limits)):
            if only is None or name in only:
                guarded(name, fn, c)
    finally:
        c.close()
        daemon.stop()
    sys.exit(summary())


if __name__ == "__main__":
    main()
