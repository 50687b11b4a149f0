# SPDX-License-Identifier: Apache-2.0
"""regen._accel (regen/_accel.c), the binding that hands libregen the
Python client's calls in the ring record's terms, against a real regend
(host backend): GEMMs whose operands it reads from stand-in tensors lying
at random places in many spans of memory come out as float64 says; every
case it does not cover answers 0 with nothing queued; values a record
cannot hold answer -ERANGE; arguments of the wrong kind raise.  No torch:
tensors are stand-ins with the attributes the binding reads, over memfds
the host backend maps.  Skipped where the module was not built, unless
REGEN_REQUIRE_ACCEL=1 (meson sets it where it built the module)."""

import errno
import os
import random
import sys
import unittest

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.dirname(HERE))
sys.path.insert(0, os.path.join(HERE, "..", "..", "..", "tests", "lib"))
import regen  # noqa: E402
from regen import accel, ops, reference  # noqa: E402
from regen.compute import scalars_record  # noqa: E402
from regen.host import HostTensor  # noqa: E402
from regend_fixture import Regend, find_regend  # noqa: E402

DTYPES = {"f32": 0, "f16": 1, "bf16": 2, "i32": 3}
NAMES = ops.SLOT_NAMES["gemm"]
SPAN = 1 << 16          # bytes of each span (a HostTensor of 16384 f32)
SPANS = 37              # enough that finding one takes several bisection steps

daemon = None


def setUpModule():
    global daemon
    if accel.ring() is None and os.environ.get("REGEN_REQUIRE_ACCEL") != "1":
        raise unittest.SkipTest("regen._accel (or libregen) was not found")
    if not find_regend():
        raise unittest.SkipTest("no regend (pass --regend or set REGEN_BUILD_ROOT)")
    daemon = Regend(devices=1)


def tearDownModule():
    if daemon is not None:
        daemon.stop()


class FakeTensor:
    """What submit_tensors reads of a torch tensor."""

    def __init__(self, dtype, shape, strides, device, ptr):
        self.dtype, self.shape, self._strides, self._device, self._ptr = dtype, tuple(shape), tuple(strides), device, ptr

    def stride(self):
        return self._strides

    def get_device(self):
        return self._device

    def data_ptr(self):
        return self._ptr


class Broken(FakeTensor):
    def data_ptr(self):
        raise RuntimeError("data_ptr failed")


class AccelTest(unittest.TestCase):
    def setUp(self):
        self.assertIsNotNone(accel.ring(), "REGEN_REQUIRE_ACCEL=1 but regen._accel or libregen did not load")
        self.rng = random.Random(os.environ.get("REGEN_TEST_SEED", None) or self.id())
        self.c = regen.Client(daemon.socket, timeout=30)
        self.lib = accel.module.connect(daemon.socket, 30.0, None)
        # Spans of "address space", each a HostTensor imported into regend,
        # at made-up addresses far apart; a tensor at address p of span
        # (start, end, buffer) lies at byte p - start of the buffer.
        self.hosts, self.kept = [], []
        start = 1 << 40
        for i in range(SPANS):
            h = HostTensor([SPAN // 4])
            buf = h.import_into(self.c, 0)
            self.hosts.append(h)
            # Buffers as libregen's pool hands them (ids) and as Buffer
            # objects: both are taken.
            self.kept.append((start, start + SPAN, buf.id if i % 2 == 0 else buf))
            start += SPAN + self.rng.randrange(1, 1 << 20) * 256

    def tearDown(self):
        self.lib = None
        self.c.close()
        for h in self.hosts:
            h.close()

    def tickets(self):
        return accel.module.tickets(self.lib, 0)

    def place(self, nbytes, i):
        """A 16-byte aligned place in span i with room for nbytes: its
        address."""
        offset = self.rng.randrange(0, (SPAN - nbytes) // 16) * 16
        return self.kept[i][0] + offset

    def matrix(self, rows, cols, i):
        """A stand-in f32 tensor of [rows, cols], row-major, somewhere in
        span i, filled with random values; its values as a list."""
        ptr = self.place(4 * rows * cols, i)
        values = [self.rng.uniform(-1, 1) for _ in range(rows * cols)]
        host = self.hosts[i]
        offset = ptr - self.kept[i][0]
        whole = host.read()
        whole[offset // 4:offset // 4 + rows * cols] = values
        host.write(whole)
        return FakeTensor("f32", (rows, cols), (cols, 1), 0, ptr), values, (i, offset)

    def test_gemms_read_from_tensors_in_many_spans(self):
        record = scalars_record("gemm", {"alpha": 1.0, "beta": 0.0})
        for k in range(20):
            m, n, kk = self.rng.randint(1, 9), self.rng.randint(1, 9), self.rng.randint(1, 9)
            ia, ib, id_ = self.rng.sample(range(SPANS), 3)
            a, av, _ = self.matrix(m, kk, ia)
            b, bv, _ = self.matrix(kk, n, ib)
            d, _, (di, doff) = self.matrix(m, n, id_)
            ticket = accel.module.submit_tensors(self.lib, 0, ops.OP_IDS["gemm"], record, None, NAMES,
                                                 {"a": a, "b": b, "d": d}, 0, self.kept, {"f32": 0})
            self.assertGreater(ticket, 0, f"call {k}: queued")
            self.assertGreaterEqual(accel.module.wait(self.lib, 0, ticket), 0, accel.module.error(self.lib))
            got = self.hosts[di].read()[doff // 4:doff // 4 + m * n]
            want = reference.gemm(av, bv, m, n, kk)
            self.assertLessEqual(reference.rel_error(got, want), 1e-5, f"call {k}: D of [{m}, {kk}] @ [{kk}, {n}]")

    def test_a_dimension_of_one_takes_the_row_major_stride(self):
        """torch lets a dimension of size 1 have any stride; regend wants
        the row-major one there, which the binding puts in its place."""
        a, av, _ = self.matrix(1, 5, 0)
        a._strides = (12345, 1)
        b, bv, _ = self.matrix(5, 3, 1)
        d, _, (di, doff) = self.matrix(1, 3, 2)
        record = scalars_record("gemm", {})
        ticket = accel.module.submit_tensors(self.lib, 0, ops.OP_IDS["gemm"], record, None, NAMES,
                                             {"a": a, "b": b, "d": d}, 0, self.kept, {"f32": 0})
        self.assertGreaterEqual(accel.module.wait(self.lib, 0, ticket), 0, accel.module.error(self.lib))
        got = self.hosts[di].read()[doff // 4:doff // 4 + 3]
        self.assertLessEqual(reference.rel_error(got, reference.gemm(av, bv, 1, 3, 5)), 1e-5)

    def test_uncovered_calls_queue_nothing(self):
        record = scalars_record("gemm", {})
        t = FakeTensor("f32", (4, 4), (4, 1), 0, self.kept[5][0] + 64)

        def call_with(bad):
            before = self.tickets()
            r = accel.module.submit_tensors(self.lib, 0, ops.OP_IDS["gemm"], record, None, NAMES,
                                            {"a": t, "b": t, "d": bad}, 0, self.kept, {"f32": 0})
            self.assertEqual(self.tickets(), before, "nothing queued")
            return r

        cases = {
            "an unknown dtype": FakeTensor("f64", t.shape, t.stride(), 0, t.data_ptr()),
            "another device": FakeTensor(t.dtype, t.shape, t.stride(), 1, t.data_ptr()),
            "rank 5": FakeTensor(t.dtype, [2] * 5, [1] * 5, 0, t.data_ptr()),
            "rank 0": FakeTensor(t.dtype, [], [], 0, t.data_ptr()),
            "outside every span": FakeTensor(t.dtype, t.shape, t.stride(), 0, 4096),
            "past every span": FakeTensor(t.dtype, t.shape, t.stride(), 0, self.kept[-1][1] + 64),
            "at a span's end": FakeTensor(t.dtype, t.shape, t.stride(), 0, self.kept[3][1]),
            "between two spans": FakeTensor(t.dtype, t.shape, t.stride(), 0, self.kept[20][1] + 16),
            "strides of another rank": FakeTensor(t.dtype, [2, 2], [1], 0, t.data_ptr()),
            "a shape past 64 bits": FakeTensor(t.dtype, [1 << 64], [1], 0, t.data_ptr()),
        }
        for what, bad in cases.items():
            with self.subTest(what):
                self.assertEqual(call_with(bad), 0)
        with self.subTest("an error raised by the tensor"):
            with self.assertRaises(RuntimeError):
                call_with(Broken(t.dtype, t.shape, t.stride(), 0, t.data_ptr()))

    def test_what_a_record_cannot_hold_is_erange(self):
        record = scalars_record("gemm", {})
        buf = self.kept[1][2]
        good = (buf, DTYPES["f32"], 0, [4, 4], [4, 1])
        cases = {
            "rank 5": (buf, 0, 0, [1, 1, 1, 4, 4], None),
            "rank 0": (buf, 0, 0, [], None),
            "strides of another rank": (buf, 0, 0, [4, 4], [4, 1, 1]),
            "a negative offset": (buf, 0, -4, [4, 4], None),
            "an offset past 64 bits": (buf, 0, 1 << 64, [4, 4], None),
            "a dimension past 64 bits": (buf, 0, 0, [1 << 63, 4], None),
            "a stride past 64 bits": (buf, 0, 0, [4, 4], [1 << 64, 1]),
        }
        for what, bad in cases.items():
            with self.subTest(what):
                before = self.tickets()
                slots = [good, good, None, bad]
                self.assertEqual(accel.module.submit(self.lib, 0, ops.OP_IDS["gemm"], record, None, None, slots),
                                 -errno.ERANGE)
                self.assertEqual(self.tickets(), before, "nothing queued")

    def test_libregens_refusals_are_named(self):
        """What libregen refuses before anything is sent comes back as
        -EINVAL with regend's name for it (error())."""
        record = scalars_record("gemm", {})
        buf = self.kept[1][2]
        good = (buf, 0, 0, [4, 4], None)
        r = accel.module.submit(self.lib, 0, 99, record, None, None, [good, good, None, good])
        self.assertEqual(r, -errno.EINVAL)
        name, params, _, _ = accel.module.error(self.lib)
        self.assertEqual((name, '"op"' in params), ("org.varlink.service.InvalidParameter", True), params)
        r = accel.module.submit(self.lib, 0, 0, record, "b0.1.1", None, [good, good, None, good])
        self.assertEqual(r, -errno.EINVAL)
        self.assertIn("wait_event", accel.module.error(self.lib)[1])

    def test_bad_arguments_are_refused(self):
        record = scalars_record("gemm", {})
        with self.assertRaises(ValueError):   # more operands than a record holds
            accel.module.submit_tensors(self.lib, 0, 0, record, None, ("a",) * 12, {}, 0, self.kept, {"f32": 0})
        with self.assertRaises(ValueError):
            accel.module.submit(self.lib, 0, 0, record, None, None, [None] * 12)
        with self.assertRaises(TypeError):
            accel.module.submit_tensors(self.lib, 0, 0, record, None, list(NAMES), {}, 0, self.kept, {"f32": 0})
        with self.assertRaises(TypeError):
            accel.module.submit(self.lib, 0, 0, record, None, None, {"a": None})
        with self.assertRaises(TypeError):   # an id that is no text
            accel.module.submit(self.lib, 0, 0, record, None, None, [(7, 0, 0, [4, 4], None)])


if __name__ == "__main__":
    unittest.main()
