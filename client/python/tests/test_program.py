# SPDX-License-Identifier: Apache-2.0
"""io.regen.Program against a real regend (host backend): a program defined
once and run per step, its numbers against float64, what Define and Run
refuse and how they name it, that a program is its process's alone, that
its definition outlives a generation change, its limits; a Run over the
lane's ring against the same over Varlink; and 100 AdamW steps with
device_lost faults injected at random points ending bit-identical to the
same steps without faults, on either transport."""

import math
import os
import random
import struct
import sys
import threading
import time
import unittest

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.dirname(HERE))
sys.path.insert(0, os.path.join(HERE, "..", "..", "..", "tests", "lib"))
import regen  # noqa: E402
from regen import lane  # noqa: E402
from regen.host import HostTensor  # noqa: E402
from regen.keep import journal_header  # noqa: E402
from regen.program import JOURNAL_MARKS_BYTES, run_exactly_once  # noqa: E402
from regend_fixture import Regend, find_regend  # noqa: E402

daemon = None
# proto/program_journal.h's header: {magic, seq, state, 0}.
JOURNAL_MAGIC = 0x6c6e72756f6a6772


def setUpModule():
    global daemon
    if not find_regend():
        raise unittest.SkipTest("no regend (pass --regend or set REGEN_BUILD_ROOT)")
    daemon = Regend(devices=1, extra=["--max-programs", "4"])


def tearDownModule():
    if daemon is not None:
        daemon.stop()


def gelu_tanh(x):
    return 0.5 * x * (1.0 + math.tanh(math.sqrt(2.0 / math.pi) * (x + 0.044715 * x ** 3)))


def mlp_definition(M, K, N):
    """y = gelu_tanh(x w1^T + b1) w2^T, and the sum of y's rows."""
    p = regen.ProgramBuilder("mlp")
    x, w1, b1, w2 = p.input("x", "f32", (M, K)), p.input("w1", "f32", (N, K)), p.input("b1", "f32", (N,)), \
        p.input("w2", "f32", (K, N))
    h, a = p.intermediate("h", "f32", (M, N)), p.intermediate("a", "f32", (M, N))
    y, s = p.output("y", "f32", (M, K)), p.output("s", "f32", (K,))
    p.node("gemm", {"a": x, "b": w1, "bias": b1, "d": h}, name="fc1", trans_b=True, epilogue="bias")
    p.node("gelu_tanh", [h], [a], name="act")
    p.node("gemm", {"a": a, "b": w2, "d": y}, name="fc2", trans_b=True)
    p.node("sum", [y], [s], name="colsum", axis="leading")
    return p.definition()


class ProgramTest(unittest.TestCase):
    def setUp(self):
        self.c = regen.Client(daemon.socket, timeout=60)
        self.rng = random.Random(self.id() + str(os.getpid()))
        self.tensors = []

    def tearDown(self):
        self.c.close()
        for t in self.tensors:
            t.close()

    def tensor(self, shape, fill=True, dtype="f32"):
        t = HostTensor.random(shape, dtype, self.rng) if fill else HostTensor(shape, dtype)
        t.import_into(self.c, 0)
        self.tensors.append(t)
        return t

    def test_mlp_against_float64(self):
        M, K, N = 7, 12, 9
        t = {n: self.tensor(s) for n, s in (("x", (M, K)), ("w1", (N, K)), ("b1", (N,)), ("w2", (K, N)))}
        t["y"], t["s"] = self.tensor((M, K), False), self.tensor((K,), False)
        prog = self.c.define_program(0, mlp_definition(M, K, N))
        self.assertEqual(prog.bound, ["x", "w1", "b1", "w2", "y", "s"])
        for run in range(3):
            t["x"].write([self.rng.uniform(-1, 1) for _ in range(M * K)])
            self.c.run_program(prog, {n: v.op for n, v in t.items()})
            x, w1, b1, w2 = (t[n].read() for n in ("x", "w1", "b1", "w2"))
            ref = []
            for i in range(M):
                a = [gelu_tanh(sum(x[i * K + k] * w1[j * K + k] for k in range(K)) + b1[j]) for j in range(N)]
                ref.append([sum(a[j] * w2[o * N + j] for j in range(N)) for o in range(K)])
            y, s = t["y"].read(), t["s"].read()
            for i in range(M):
                for o in range(K):
                    self.assertAlmostEqual(y[i * K + o], ref[i][o], delta=1e-5 * (1 + abs(ref[i][o])))
            for o in range(K):
                want = sum(ref[i][o] for i in range(M))
                self.assertAlmostEqual(s[o], want, delta=1e-5 * (1 + abs(want)))
        st = self.c.program_status(0, prog)[0]
        self.assertEqual((st["runs"], st["nodes"], st["name"]), (3, 4, "mlp"))
        self.c.drop_program(prog)

    def test_define_names_the_node_and_why(self):
        p = regen.ProgramBuilder("bad")
        x, y = p.input("x", "f32", (4, 8)), p.output("y", "f32", (4, 9))
        p.node("relu", [x], [y], name="act")
        with self.assertRaises(regen.InvalidProgram) as e:
            self.c.define_program(0, p.definition())
        self.assertIn("act", e.exception.parameters["node"])
        # Read before anything wrote it.
        p = regen.ProgramBuilder("bad2")
        x, t, y = p.input("x", "f32", (4,)), p.intermediate("t", "f32", (4,)), p.output("y", "f32", (4,))
        p.node("add", [x, t], [y], name="early")
        p.node("exp", [x], [t], name="late")
        with self.assertRaises(regen.InvalidProgram) as e:
            self.c.define_program(0, p.definition())
        self.assertIn("early", e.exception.parameters["node"])
        with self.assertRaises(regen.InvalidParameter):
            self.c.define_program(0, {"tensors": [], "nodes": [{"op": "frobnicate"}], "extra": 1})

    def test_run_checks_every_binding(self):
        x, y, small = self.tensor((16,)), self.tensor((16,), False), self.tensor((15,), False)
        p = regen.ProgramBuilder("neg")
        p.input("x", "f32", (16,))
        p.output("y", "f32", (16,))
        p.node("neg", ["x"], ["y"])
        prog = self.c.define_program(0, p.definition())
        before = y.read()
        with self.assertRaises(regen.InvalidParameter):
            self.c.run_program(prog, {"x": x.op})                      # y not bound
        with self.assertRaises(regen.InvalidParameter):
            self.c.run_program(prog, {"x": x.op, "y": y.op, "z": y.op})   # no tensor z
        with self.assertRaises(regen.InvalidOperand):
            self.c.run_program(prog, {"x": x.op, "y": small.op})      # 60 bytes for 64
        with self.assertRaises(regen.InvalidOperand):
            self.c.run_program(prog, {"x": x.op, "y": (y.buffer, 4)})   # past the end
        self.assertEqual(y.read(), before, "a refused Run wrote something")
        self.c.run_program(prog, {"x": x.op, "y": y.op})
        self.assertEqual(y.read(), [-v for v in x.read()])
        self.c.drop_program(prog)
        with self.assertRaises(regen.NoSuchObject):
            self.c.run_program(prog, {"x": x.op, "y": y.op})

    def test_a_program_is_its_process_alone(self):
        p = regen.ProgramBuilder("mine")
        p.input("x", "f32", (4,))
        p.output("y", "f32", (4,))
        p.node("exp", ["x"], ["y"])
        prog = self.c.define_program(0, p.definition())
        r, w = os.pipe()
        pid = os.fork()
        if pid == 0:
            code = 1
            try:
                other = regen.Client(daemon.socket, timeout=30)
                try:
                    other.drop_program(prog)
                except regen.NoSuchObject:
                    try:
                        other.program_status(0, prog)
                    except regen.NoSuchObject:
                        code = 0 if other.program_status(0) == [] else 2
            finally:
                os.write(w, bytes([code]))
                os._exit(0)
        os.waitpid(pid, 0)
        self.assertEqual(os.read(r, 1), b"\0", "another process named this process's program")
        os.close(r)
        os.close(w)
        self.assertEqual(len(self.c.program_status(0, prog)), 1)
        self.c.drop_program(prog)

    def test_a_definition_outlives_a_generation(self):
        p = regen.ProgramBuilder("keep")
        p.input("x", "f32", (8,))
        p.output("y", "f32", (8,))
        p.node("mul", ["x"], ["y"], scalar=3.0)
        prog = self.c.define_program(0, p.definition())
        x, y = self.tensor((8,)), self.tensor((8,), False)
        self.c.run_program(prog, {"x": x.op, "y": y.op})
        self.c.release(0, reason="test_program")
        # Old buffer ids are stale; the program id is not.
        with self.assertRaises(regen.StaleGeneration):
            self.c.run_program(prog, {"x": x.op, "y": y.op})
        x.import_into(self.c, 0)
        y.import_into(self.c, 0)
        y.write([0.0] * 8)
        self.c.run_program(prog, {"x": x.op, "y": y.op})
        self.assertEqual(y.read(), [struct.unpack("f", struct.pack("f", 3.0 * v))[0] for v in x.read()])
        self.c.drop_program(prog)

    def test_max_programs(self):
        p = regen.ProgramBuilder("n")
        p.input("x", "f32", (2,))
        p.output("y", "f32", (2,))
        p.node("neg", ["x"], ["y"])
        progs = [self.c.define_program(0, p.definition()) for _ in range(4)]
        with self.assertRaises(regen.LimitExceeded) as e:
            self.c.define_program(0, p.definition())
        self.assertEqual(e.exception.parameters.get("resource"), "programs")
        self.c.drop_program(progs[0])
        progs[0] = self.c.define_program(0, p.definition())
        for q in progs:
            self.c.drop_program(q)


def philox4x32_10(counter, key):
    """Philox4x32-10 from its paper (Salmon et al., SC11), written here apart
    from regend's own (proto/philox.c): the reference dropout_mask's masks
    are held to."""
    m = 0xFFFFFFFF
    c0, c1, c2, c3 = counter
    k0, k1 = key
    for r in range(10):
        if r:
            k0, k1 = (k0 + 0x9E3779B9) & m, (k1 + 0xBB67AE85) & m
        p0, p1 = 0xD2511F53 * c0, 0xCD9E8D57 * c2
        c0, c1, c2, c3 = ((p1 >> 32) ^ c1 ^ k0) & m, p1 & m, ((p0 >> 32) ^ c3 ^ k1) & m, p0 & m
    return c0, c1, c2, c3


def dropout_mask(seed, stream, p, n):
    """docs/protocol.md's rule: element i is kept where (w >> 8) 2^-24 >= p,
    w the first word at counter (i, i >> 32, stream, 0) under the seed."""
    key = (seed & 0xFFFFFFFF, seed >> 32)
    return [1.0 if (philox4x32_10((i & 0xFFFFFFFF, i >> 32, stream, 0), key)[0] >> 8) * 2.0 ** -24 >= p else 0.0
            for i in range(n)]


class DropoutTest(unittest.TestCase):
    """dropout_mask over the wire, on the Run's transport: the masks are
    the documented draw (an independent Philox here, itself held to
    Random123's known answer), the same for the same seed at every Run, and
    a seed that is not an integer in [0, 2^53) is refused by name."""

    N = 3000

    def setUp(self):
        self.c = regen.Client(daemon.socket, timeout=60)
        self.rng = random.Random(self.id() + str(os.getpid()) + str(time.time()))
        self.tensors = []

    def tearDown(self):
        self.c.close()
        for t in self.tensors:
            t.close()

    def test_the_reference_is_philox(self):
        self.assertEqual(philox4x32_10((0, 0, 0, 0), (0, 0)), (0x6627e8d5, 0xe169c58d, 0xbc57ac4c, 0x9b00dbd8))
        self.assertEqual(philox4x32_10((0x243f6a88, 0x85a308d3, 0x13198a2e, 0x03707344), (0xa4093822, 0x299f31d0)),
                         (0xd16cfe09, 0x94fdcceb, 0x5001e420, 0x24126ea1))

    def test_masks_are_the_documented_draw(self):
        p = regen.ProgramBuilder("dropout")
        seed = p.scalar("seed")
        x = p.input("x", "f32", (3, self.N // 3))
        k = p.intermediate("k", "f32", (3, self.N // 3))
        m, y = p.output("m", "u8", (3, self.N // 3)), p.output("y", "f32", (3, self.N // 3))
        p.node("dropout_mask", [seed], [m], p=0.3, stream=5)
        p.node("dropout_mask", [seed], [k], p=0.1)
        p.node("mul", [x, k], [y], name="drop")
        prog = self.c.define_program(0, p.definition())
        xt, yt = self.tensor_of(True), self.tensor_of(False)
        mt = self.mask_tensor()
        bind = {"x": xt.op, "m": (mt.buffer, 0), "y": yt.op}
        for s in (0, self.rng.randrange(1 << 53), (1 << 53) - 1):
            self.c.run_program(prog, bind, {"seed": s})
            self.assertEqual(self.bytes_of(mt), dropout_mask(s, 5, 0.3, self.N), f"seed {s}")
            keep = dropout_mask(s, 0, 0.1, self.N)
            self.assertEqual(yt.read(), [v * k for v, k in zip(xt.read(), keep)], f"seed {s}")
        before = self.bytes_of(mt)
        for bad in (0.5, -1, float(1 << 53)):
            with self.assertRaises(regen.InvalidParameter) as e:
                self.c.run_program(prog, bind, {"seed": bad})
            self.assertEqual(e.exception.parameters["parameter"], "scalars.seed")
        self.assertEqual(self.bytes_of(mt), before, "a refused Run wrote a mask")
        self.c.drop_program(prog)

    def test_define_names_a_bad_seed_and_p(self):
        p = regen.ProgramBuilder("bad")
        x, m = p.input("x", "f64", ()), p.output("m", "u8", (4,))
        p.node("dropout_mask", [x], [m], name="drop", p=0.5)
        with self.assertRaises(regen.InvalidProgram) as e:
            self.c.define_program(0, p.definition())
        self.assertIn("drop", e.exception.parameters["node"])
        self.assertIn("seed x", e.exception.parameters["reason"])
        p = regen.ProgramBuilder("bad")
        s, m = p.scalar("s"), p.output("m", "u8", (4,))
        p.node("dropout_mask", [s], [m], p=1.0)
        with self.assertRaises(regen.InvalidParameter) as e:
            self.c.define_program(0, p.definition())
        self.assertEqual(e.exception.parameters["parameter"], "nodes[0].attrs.p")

    def tensor_of(self, fill):
        t = HostTensor((3, self.N // 3))
        if fill:
            t.write([self.rng.uniform(-2, 2) for _ in range(self.N)])
        t.import_into(self.c, 0)
        self.tensors.append(t)
        return t

    def mask_tensor(self):
        """N bytes for a u8 mask (HostTensor holds floats and i32)."""
        t = HostTensor((self.N // 4,), "i32")
        t.import_into(self.c, 0)
        self.tensors.append(t)
        return t

    @staticmethod
    def bytes_of(t):
        return [float(b) for b in os.pread(t.fd, t.nbytes, 0)]


def wide_definition(pairs):
    """y<i> = x<i> * a + tanh(x<i>) * b for each pair (f32 [16]): 2 * pairs
    + 2 bound tensors, more than one ring record's worth."""
    p = regen.ProgramBuilder("wide")
    a, b = p.scalar("a"), p.scalar("b")
    for i in range(pairs):
        x, y = p.input(f"x{i}", "f32", (16,)), p.output(f"y{i}", "f32", (16,))
        u, t, v = (p.intermediate(f"{n}{i}", "f32", (16,)) for n in "utv")
        p.node("mul", [x, a], [u])
        p.node("tanh", [x], [t])
        p.node("mul", [t, b], [v])
        p.node("add", [u, v], [y])
    return p.definition()


@unittest.skipUnless(lane.ring_supported(), "no ring in this process (regen._accel and libregen)")
class RingRunTest(unittest.TestCase):
    """A Run over the lane's ring against the same Run over Varlink: a
    program of 142 bound tensors (a record and two continuations) gives the
    same bits both ways and float64's numbers within f32's rounding; both
    refuse alike; queued Runs; a Run naming more ids than the id table; and
    another process cannot name the program through its own id table."""

    PAIRS = 70
    N = 16

    def setUp(self):
        self.rng = random.Random(self.id() + str(os.getpid()) + str(time.time()))
        self.clients = {t: regen.Client(daemon.socket, timeout=60, transport=t) for t in ("ring", "varlink")}
        self.tensors = []

    def tearDown(self):
        for c in self.clients.values():
            c.close()
        for t in self.tensors:
            t.close()

    def host(self, n, fill=True):
        t = HostTensor((n,))
        if fill:
            t.write([self.rng.uniform(-3, 3) for _ in range(n)])
        self.tensors.append(t)
        return t

    def bindings(self, c, xs, y):
        """x<i> in xs[i % 3] and y<i> in y, each 64 bytes past the last."""
        xb = [x.import_into(c, 0) for x in xs]
        yb = y.import_into(c, 0)
        bind = {}
        for i in range(self.PAIRS):
            bind[f"x{i}"] = (xb[i % 3], 64 * (i // 3))
            bind[f"y{i}"] = (yb, 64 * i)
        return bind

    def expect(self, xs, y, a, b):
        got = y.read()
        x = [xs[i % 3].read()[16 * (i // 3):16 * (i // 3 + 1)] for i in range(self.PAIRS)]
        for i in range(self.PAIRS):
            for e in range(self.N):
                want = x[i][e] * a + math.tanh(x[i][e]) * b
                self.assertAlmostEqual(got[16 * i + e], want, delta=1e-6 * (1 + abs(want)), msg=f"y{i}[{e}]")

    def test_many_bindings_alike_on_both_transports(self):
        definition = wide_definition(self.PAIRS)
        xs = [self.host(16 * ((self.PAIRS + 2) // 3)) for _ in range(3)]
        ys = {t: self.host(16 * self.PAIRS, False) for t in self.clients}
        a, b = self.rng.uniform(-2, 2), self.rng.uniform(-2, 2)
        results = {}
        for t, c in self.clients.items():
            prog = c.define_program(0, definition)
            self.assertEqual(len(prog.bound), 2 * self.PAIRS + 2)
            c.run_program(prog, self.bindings(c, xs, ys[t]), {"a": a, "b": b})
            self.assertEqual(c.lane_transport(0), t)
            self.assertEqual(c.program_status(0, prog)[0]["runs"], 1)
            results[t] = ys[t].read()
            self.expect(xs, ys[t], a, b)
        self.assertEqual(struct.pack(f"{len(results['ring'])}f", *results["ring"]),
                         struct.pack(f"{len(results['varlink'])}f", *results["varlink"]),
                         "the ring's Run and Varlink's differ")

    def test_refusals_alike_on_both_transports(self):
        definition = wide_definition(self.PAIRS)
        xs = [self.host(16 * ((self.PAIRS + 2) // 3)) for _ in range(3)]
        y = self.host(16 * self.PAIRS, False)
        seen = {}
        for t, c in self.clients.items():
            prog = c.define_program(0, definition)
            bind = self.bindings(c, xs, y)
            cases = [
                ({k: v for k, v in bind.items() if k != "y69"}, {"a": 1, "b": 1}, {}),     # y69 unbound
                (bind, {"a": 1}, {}),                                                       # b missing
                (dict(bind, y3=(bind["y3"][0], 2)), {"a": 1, "b": 1}, {}),                  # misaligned
                (dict(bind, y5=(bind["y5"][0], 1 << 20)), {"a": 1, "b": 1}, {}),            # past the end
                (bind, {"a": 1, "b": 1}, {"deadline_ms": 86400001}),                       # past a day
                (dict(bind, nope=bind["x0"]), {"a": 1, "b": 1}, {}),                        # no such tensor
                (bind, {"a": 1, "b": 1, "y0": 2}, {}),                                      # y0 is no scalar
                (bind, {"a": 1, "b": 1}, {"seq": 3}),                                      # a seq, no journal
            ]
            for n, (bd, sc, extra) in enumerate(cases):
                with self.assertRaises(regen.Error, msg=f"{t} case {n}") as e:
                    c.run_program(prog, bd, sc, **extra)
                params = dict(e.exception.parameters)
                params.pop("message", None)
                params.pop("reason", None)
                seen.setdefault(n, {})[t] = (type(e.exception).__name__, params)
        for n, by in seen.items():
            self.assertEqual(by["ring"], by["varlink"], f"case {n}")
        self.assertEqual(seen[0]["ring"], ("InvalidParameter", {"parameter": "bind.y69"}))
        self.assertEqual(seen[2]["ring"][0], "InvalidOperand")

    def test_status_counts_every_run_answered(self):
        """A Run over the ring is answered in its completion before the
        worker's loop counts it: Status, asked after the answer, counts it
        all the same (it did not, now and then, under load)."""
        c = self.clients["ring"]
        p = regen.ProgramBuilder("count")
        p.input("x", "f32", (4,))
        p.output("y", "f32", (4,))
        p.node("neg", ["x"], ["y"])
        prog = c.define_program(0, p.definition())
        x, y = self.host(4), self.host(4, False)
        bind = {"x": (x.import_into(c, 0), 0), "y": (y.import_into(c, 0), 0)}
        for n in range(1, 301):
            c.run_program(prog, bind)
            self.assertEqual(c.program_status(0, prog)[0]["runs"], n)

    def test_queued_runs_answer_in_order(self):
        c = self.clients["ring"]
        prog = c.define_program(0, wide_definition(self.PAIRS))
        xs = [self.host(16 * ((self.PAIRS + 2) // 3)) for _ in range(3)]
        y = self.host(16 * self.PAIRS, False)
        bind = self.bindings(c, xs, y)
        tickets = [c.run_program(prog, bind, {"a": k, "b": 0.5}, wait=False) for k in range(1, 9)]
        self.assertEqual(tickets, sorted(tickets))
        self.assertEqual(tickets[1] - tickets[0], 3, "a Run of three records takes three tickets")
        c.wait(0)
        self.expect(xs, y, 8, 0.5)
        # One refused among them: the wait names it; the rest ran.
        for k in range(1, 5):
            c.run_program(prog, bind if k != 2 else {n: v for n, v in bind.items() if n != "y0"}, {"a": k, "b": 1},
                          wait=False)
        with self.assertRaises(regen.InvalidParameter) as e:
            c.wait(0)
        self.assertEqual(e.exception.parameters["parameter"], "bind.y0")
        self.expect(xs, y, 4, 1)

    def test_a_run_past_the_id_table_goes_as_a_call(self):
        """A Run that names more ids than the lane's id table holds (256 in
        libregen: its program and 260 tensors, each in a buffer of its own)
        cannot go on the ring and goes as a Varlink call after what the
        ring holds; the lane stays on the ring."""
        c = self.clients["ring"]
        pairs = 130
        prog = c.define_program(0, wide_definition(pairs))
        xs = [self.host(16) for _ in range(pairs)]
        ys = [self.host(16, False) for _ in range(pairs)]
        bind = {}
        for i in range(pairs):
            bind[f"x{i}"] = (xs[i].import_into(c, 0), 0)
            bind[f"y{i}"] = (ys[i].import_into(c, 0), 0)
        c.run_program(prog, bind, {"a": 2, "b": 3})
        for i in range(pairs):
            for e, (x, got) in enumerate(zip(xs[i].read(), ys[i].read())):
                want = x * 2 + math.tanh(x) * 3
                self.assertAlmostEqual(got, want, delta=1e-6 * (1 + abs(want)), msg=f"y{i}[{e}]")
        self.assertEqual(c.lane_transport(0), "ring")
        small = self.bindings(c, [self.host(16 * ((self.PAIRS + 2) // 3)) for _ in range(3)],
                              self.host(16 * self.PAIRS, False))
        c.run_program(c.define_program(0, wide_definition(self.PAIRS)), small, {"a": 1, "b": 1})
        self.assertEqual(c.lane_transport(0), "ring")
        self.assertEqual(c.program_status(0, prog)[0]["runs"], 1)

    def test_another_process_cannot_name_the_program(self):
        c = self.clients["ring"]
        p = regen.ProgramBuilder("mine")
        p.input("x", "f32", (4,))
        p.output("y", "f32", (4,))
        p.node("exp", ["x"], ["y"])
        prog = c.define_program(0, p.definition())
        x, y = self.host(4), self.host(4, False)
        c.run_program(prog, {"x": (x.import_into(c, 0), 0), "y": (y.import_into(c, 0), 0)})
        r, w = os.pipe()
        pid = os.fork()
        if pid == 0:
            code = 1
            try:
                other = regen.Client(daemon.socket, timeout=30, transport="ring")
                bx, by = x.import_into(other, 0), y.import_into(other, 0)
                try:
                    other.run_program(prog, {"x": (bx, 0), "y": (by, 0)})
                except regen.NoSuchObject as e:
                    # The Bind of its id on this process's ring was refused.
                    if e.parameters.get("id") == prog.id and other.lane_transport(0) == "ring":
                        code = 0
            finally:
                os.write(w, bytes([code]))
                os._exit(0)
        os.waitpid(pid, 0)
        self.assertEqual(os.read(r, 1), b"\0", "another process named this process's program on its ring")
        os.close(r)
        os.close(w)
        c.run_program(prog, {"x": (x.import_into(c, 0), 0), "y": (y.import_into(c, 0), 0)})
        self.assertEqual(c.program_status(0, prog)[0]["runs"], 2)


def adamw_definition(shapes):
    p = regen.ProgramBuilder("adamw")
    step, lr = p.scalar("step"), p.scalar("lr")
    for i, s in enumerate(shapes):
        w, g = p.inout(f"w{i}", "f32", s), p.input(f"g{i}", "f32", s)
        m, v = p.inout(f"m{i}", "f32", s), p.inout(f"v{i}", "f32", s)
        p.node("adamw", [w, g, m, v], [], name=f"opt{i}", lr=lr, step=step, weight_decay=0.01)
    return p.definition()


class ExactlyOnce:
    """100 AdamW steps through one program with a journal, device_lost
    injected at random points of random steps, end bit-identical to the
    same 100 steps without a fault: over the lane's ring and over Varlink
    (TRANSPORT), with a journal of copies or of marks only (MODE).  With
    marks, a Run a fault cut after it began is refused (RunTorn) and the
    step is taken again from the test's own copy of the state before it
    (a checkpoint), under a new seq: a Run cut before it began is retried
    as with copies, and a retry never applies a Run twice."""

    TRANSPORT = None
    MODE = "copy"

    SHAPES = [(256, 256), (256,), (512, 128)]
    STEPS = 100
    # Gradients: a few blobs made once and taken in turn (the same in
    # both trainings), so that the device, not Python, takes the time and
    # the faults land inside Runs.
    BLOBS = 5

    def landed(self, c, prog, torn):
        """Whether a fault landed inside a Run: a marks journal's Run
        refused as torn, or a copy journal's retry that put the state back
        (what a retry that simply runs again would get wrong)."""
        if self.MODE == "marks":
            return torn > 0
        return c.program_status(0, prog)[0]["retries_restored"] > 0

    def train(self, faults, steps=None):
        """steps AdamW steps (STEPS by default); with faults, more until a
        fault landed inside a Run (at most 4 STEPS): how many faults land
        where depends on the machine's speed and load.  Returns the state,
        the Runs attempted, the faults injected, the program's status and
        the steps taken."""
        steps = steps or self.STEPS
        c = regen.Client(daemon.socket, timeout=60, transport=self.TRANSPORT)
        rng = random.Random(7)
        state = {}
        for i, s in enumerate(self.SHAPES):
            n = math.prod(s)
            state[f"w{i}"] = HostTensor(s)
            state[f"w{i}"].write([rng.uniform(-1, 1) for _ in range(n)])
            state[f"m{i}"], state[f"v{i}"], state[f"g{i}"] = HostTensor(s), HostTensor(s), HostTensor(s)
            for k in ("m", "v"):
                state[f"{k}{i}"].write([0.0] * n)
        prog = c.define_program(0, adamw_definition(self.SHAPES))
        self.assertGreater(prog.journal_bytes, 0)
        journal = HostTensor(((prog.journal_bytes if self.MODE == "copy" else JOURNAL_MARKS_BYTES) // 4,))
        gen = {"seen": None}

        def bind():
            # A fault made every import stale: import again once per
            # generation.
            now = c.generation()["devices"][0]["generation"]
            if gen["seen"] != now:
                for t in list(state.values()) + [journal]:
                    t.import_into(c, 0)
                gen["seen"] = now
            return {n: t.op for n, t in state.items()}

        from regen.host import pack
        blobs = []
        for b in range(self.BLOBS):
            grng = random.Random(1000 + b)
            blobs.append([pack("f32", [grng.gauss(0, 1) for _ in range(math.prod(s))]) for s in self.SHAPES])
        stop = threading.Event()
        injected = [0]

        def injector():
            r = random.Random(11)
            admin = regen.Client(daemon.socket, timeout=60)
            while not stop.is_set():
                time.sleep(r.uniform(0.01, 0.15))
                try:
                    admin.inject_fault(0, "device_lost")
                    injected[0] += 1
                except regen.Error:
                    pass
            admin.close()

        th = threading.Thread(target=injector) if faults else None
        if th:
            th.start()
        attempts, torn, seq = 0, 0, 0
        try:
            step = 0
            while True:
                step += 1
                if step > steps and (not faults or step > 4 * self.STEPS or self.landed(c, prog, torn)):
                    break
                for i in range(len(self.SHAPES)):
                    os.pwrite(state[f"g{i}"].fd, blobs[step % self.BLOBS][i], 0)
                before = {n: os.pread(t.fd, t.nbytes, 0) for n, t in state.items() if not n.startswith("g")}
                while True:
                    seq += 1
                    try:
                        attempts += run_exactly_once(c, prog, bind, lambda: journal.op, seq=seq,
                                                     scalars={"step": step, "lr": 1e-2}, journal_mode=self.MODE)
                        break
                    except regen.RunTorn as e:
                        self.assertEqual(self.MODE, "marks", "a copy journal's Run refused as torn")
                        self.assertEqual((e.parameters["program"], e.parameters["seq"]), (prog.id, seq))
                        self.assertEqual(journal_header(os.pread(journal.fd, 32, 0)), ("begun", seq))
                        torn += 1
                        attempts += 1
                        for n, data in before.items():
                            os.pwrite(state[n].fd, data, 0)
        finally:
            stop.set()
            if th:
                th.join()
        self.assertEqual(c.lane_transport(0), self.TRANSPORT, "the Runs' transport")
        out = {n: t.read() for n, t in state.items() if not n.startswith("g")}
        st = c.program_status(0, prog)[0]
        st["torn"] = torn
        c.close()
        for t in list(state.values()) + [journal]:
            t.close()
        return out, attempts, injected[0], st, step - 1

    def test_faults_change_no_bit(self):
        faulted, attempts, injected, st, steps = self.train(faults=True)
        clean, clean_attempts, _, _, _ = self.train(faults=False, steps=steps)
        self.assertEqual(clean_attempts, steps)
        self.assertGreater(injected, 3, "too few faults landed to mean anything")
        self.assertGreater(attempts, steps, "no Run was interrupted and retried")
        if self.MODE == "copy":
            # Some fault landed inside a Run, after it had saved the state:
            # its retry had to put the state back (what makes this test
            # fail where a retry simply runs again).
            self.assertGreater(st["retries_restored"], 0, f"no retry restored the journal ({st})")
        else:
            # Some fault landed inside a Run: its retry refused it as torn
            # (what makes this test fail where a retry simply runs again),
            # and nothing was put back from a journal that holds no copy.
            self.assertGreater(st["torn"], 0, f"no Run was refused as torn ({st})")
            self.assertEqual(st["retries_torn"], st["torn"])
            self.assertEqual(st["retries_restored"], 0)
        for name in clean:
            # Compared bit for bit, as bytes (a list diff of this size would
            # take unittest minutes to print).
            a, b = struct.pack(f"{len(clean[name])}f", *clean[name]), struct.pack(f"{len(faulted[name])}f", *faulted[name])
            differ = sum(1 for i in range(0, len(a), 4) if a[i:i + 4] != b[i:i + 4])
            self.assertEqual(differ, 0, f"{name}: {differ} elements differ after {injected} faults "
                                        f"({st['retries_restored']} retries restored the journal)")


@unittest.skipUnless(lane.ring_supported(), "no ring in this process (regen._accel and libregen)")
class ExactlyOnceRingTest(ExactlyOnce, unittest.TestCase):
    TRANSPORT = "ring"


class ExactlyOnceVarlinkTest(ExactlyOnce, unittest.TestCase):
    TRANSPORT = "varlink"


@unittest.skipUnless(lane.ring_supported(), "no ring in this process (regen._accel and libregen)")
class MarksExactlyOnceRingTest(ExactlyOnce, unittest.TestCase):
    TRANSPORT = "ring"
    MODE = "marks"


class MarksExactlyOnceVarlinkTest(ExactlyOnce, unittest.TestCase):
    TRANSPORT = "varlink"
    MODE = "marks"


class MarksJournal:
    """A journal of marks only (journal_mode="marks"), on either transport:
    what its retry does with each header it can find (written here, as a
    fault would leave it), a device_lost landing inside a Run, and what
    is refused, each by name and alike on both transports."""

    TRANSPORT = None
    # Intermediates within the host backend's kept scratch (64 MiB): a Run
    # (some 40 ms of nodes) takes no arena once warm.
    SHAPES = [(512, 512)] * 3

    def setUp(self):
        self.c = regen.Client(daemon.socket, timeout=60, transport=self.TRANSPORT)
        self.rng = random.Random(self.id() + str(os.getpid()))
        self.tensors = []
        self.prog = self.c.define_program(0, adamw_definition(self.SHAPES))
        self.state = {}
        for i, s in enumerate(self.SHAPES):
            for k in "wgmv":
                t = HostTensor(s)
                t.write([self.rng.uniform(0, 1) for _ in range(math.prod(s))])
                self.state[f"{k}{i}"] = t
        self.journal = HostTensor((JOURNAL_MARKS_BYTES // 4,))
        self.tensors = list(self.state.values()) + [self.journal]
        self.bind_all()

    def tearDown(self):
        self.c.close()
        for t in self.tensors:
            t.close()

    def bind_all(self):
        for t in self.tensors:
            t.import_into(self.c, 0)
        self.bind = {n: t.op for n, t in self.state.items()}

    def header(self, seq, state):
        os.pwrite(self.journal.fd, struct.pack("<4Q", JOURNAL_MAGIC, seq, state, 0), 0)

    def snapshot(self):
        return {n: os.pread(t.fd, t.nbytes, 0) for n, t in self.state.items()}

    def run_once(self, seq, retry=False, journal=None, mode="marks"):
        return self.c.run_program(self.prog, self.bind, {"step": 1, "lr": 1e-2},
                                  journal=self.journal.op if journal is None else journal, seq=seq, retry=retry,
                                  journal_mode=mode)

    def test_a_retry_reads_the_header(self):
        st0 = self.c.program_status(0, self.prog)[0]
        # DONE with the retried seq: applied whole, nothing runs again.
        before = self.snapshot()
        self.header(7, 2)
        self.run_once(7, retry=True)
        self.assertEqual(self.snapshot(), before, "a retry of a Run marked DONE ran it again")
        # BEGUN with the retried seq: torn, refused by name, nothing ran.
        self.header(8, 3)
        with self.assertRaises(regen.RunTorn) as e:
            self.run_once(8, retry=True)
        self.assertEqual(e.exception.parameters["program"], self.prog.id)
        self.assertEqual(e.exception.parameters["seq"], 8)
        self.assertIn("marks only", e.exception.parameters["message"])
        self.assertIn("checkpoint", e.exception.parameters["message"])
        self.assertEqual(self.snapshot(), before, "a torn Run's retry ran")
        self.assertEqual(journal_header(os.pread(self.journal.fd, 32, 0)), ("begun", 8))
        # SAVED with the retried seq (a copy journal's) given in mode marks:
        # its journal was bound for the header alone; refused by name.
        self.header(9, 1)
        with self.assertRaises(regen.InvalidParameter) as e:
            self.run_once(9, retry=True)
        self.assertEqual(e.exception.parameters["parameter"], "journal.mode")
        self.assertEqual(self.snapshot(), before)
        # The previous Run's DONE: the retried one never began; it runs, as
        # a first one, and marks the journal DONE.
        self.header(9, 2)
        self.run_once(10, retry=True)
        self.assertNotEqual(self.snapshot()["w0"], before["w0"], "a Run that never began was not run")
        self.assertEqual(journal_header(os.pread(self.journal.fd, 32, 0)), ("done", 10))
        st = self.c.program_status(0, self.prog)[0]
        self.assertEqual(st["retries_applied"] - st0["retries_applied"], 1)
        self.assertEqual(st["retries_torn"] - st0["retries_torn"], 1)
        self.assertEqual(st["retries_restored"] - st0["retries_restored"], 0)

    def test_a_fault_inside_a_run_is_torn(self):
        """A device_lost injected while a Run runs (its nodes take a while
        here: the host backend stops between two of them) cuts it after it
        began: the retry raises RunTorn, the header says BEGUN."""
        admin = regen.Client(daemon.socket, timeout=60)
        torn = None
        try:
            for attempt in range(16):
                self.run_once(attempt + 1)   # warm: the arena taken
                delay = (0.005, 0.01, 0.02, 0.03)[attempt % 4]
                timer = threading.Timer(delay, lambda: admin.inject_fault(0, "device_lost"))
                timer.start()
                try:
                    run_exactly_once(self.c, self.prog, lambda: (self.bind_all(), self.bind)[1],
                                     lambda: self.journal.op, seq=1000 + attempt, scalars={"step": 1, "lr": 1e-2},
                                     journal_mode="marks")
                except regen.RunTorn as e:
                    torn = e
                    break
                finally:
                    timer.join()
                    self.bind_all_when_serving(admin)
        finally:
            admin.close()
        self.assertIsNotNone(torn, "no device_lost landed inside a Run in 16 tries")
        seq = torn.parameters["seq"]
        self.assertEqual(journal_header(os.pread(self.journal.fd, 32, 0)), ("begun", seq))

    def bind_all_when_serving(self, admin):
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            d = admin.generation()["devices"][0]
            if d["state"] == "ready":
                break
            time.sleep(0.01)
        try:
            self.bind_all()
        except regen.Error:
            pass

    def test_refusals_by_name(self):
        seen = []
        short = HostTensor((4,))   # 16 bytes: less than the header
        self.tensors.append(short)
        cases = [
            ({"seq": 1, "journal_mode": "twice"}, "InvalidParameter", "journal.mode"),
            ({"journal_mode": "marks"}, "InvalidParameter", "journal.mode"),        # marks, no journal
            ({"seq": 1, "journal_mode": "marks"}, "InvalidParameter", "journal"),  # a seq, no journal
            ({"journal": (short.import_into(self.c, 0), 0), "seq": 1, "journal_mode": "marks"}, "InvalidOperand",
             "bind.journal"),
        ]
        before = self.snapshot()
        for kw, kind, what in cases:
            with self.assertRaises(regen.Error, msg=str(kw)) as e:
                self.c.run_program(self.prog, self.bind, {"step": 1, "lr": 1e-2}, **kw)
            self.assertEqual(type(e.exception).__name__, kind, str(kw))
            self.assertEqual(e.exception.parameters.get("parameter", e.exception.parameters.get("operand")), what)
            seen.append(e.exception.parameters.get("message", ""))
        self.assertIn("mode marks: the header", seen[3])
        self.assertEqual(self.snapshot(), before, "a refused Run wrote")
        # Exactly the header is enough.
        self.run_once(1)
        self.assertEqual(journal_header(os.pread(self.journal.fd, 32, 0)), ("done", 1))


@unittest.skipUnless(lane.ring_supported(), "no ring in this process (regen._accel and libregen)")
class MarksJournalRingTest(MarksJournal, unittest.TestCase):
    TRANSPORT = "ring"


class MarksJournalVarlinkTest(MarksJournal, unittest.TestCase):
    TRANSPORT = "varlink"


if __name__ == "__main__":
    unittest.main()
