# SPDX-License-Identifier: Apache-2.0
"""The Python client on a lane's ring (io.regen.Lane) against a real regend
(host backend): it is picked where offered, answers and errors are the
Varlink path's, queued calls (wait=False) complete in order, and a restart's
StaleGeneration comes through the ring as through Varlink."""

import os
import random
import sys
import time
import unittest

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.dirname(HERE))
sys.path.insert(0, os.path.join(HERE, "..", "..", "..", "tests", "lib"))
import regen  # noqa: E402
from regen import lane, reference  # noqa: E402
from regen.host import HostTensor  # noqa: E402
from regend_fixture import Regend, find_regend  # noqa: E402

daemon = None


def setUpModule():
    global daemon
    if not find_regend():
        raise unittest.SkipTest("no regend (pass --regend or set REGEN_BUILD_ROOT)")
    if not lane.ring_supported():
        raise unittest.SkipTest("this machine does not use the ring")
    daemon = Regend(devices=1)


def tearDownModule():
    if daemon is not None:
        daemon.stop()


class RingTest(unittest.TestCase):
    def setUp(self):
        self.rng = random.Random(self.id())
        self.tensors = []
        self.clients = []

    def tearDown(self):
        for c in self.clients:
            c.close()
        for t in self.tensors:
            t.close()

    def client(self, transport):
        c = regen.Client(daemon.socket, timeout=30, transport=transport)
        self.clients.append(c)
        return c

    def tensor(self, c, shape, fill=True):
        t = HostTensor.random(shape, "f32", self.rng) if fill else HostTensor(shape, "f32")
        t.import_into(c, 0)
        self.tensors.append(t)
        return t

    def outcome(self, call, *args, **kwargs):
        try:
            call(*args, **kwargs)
            return None
        except regen.Error as e:
            return (type(e).__name__, {k: v for k, v in e.parameters.items()})
        except ValueError as e:
            return ("ValueError", str(e))

    def test_auto_picks_the_ring_and_computes_right(self):
        c = self.client("auto")
        a, b, d = self.tensor(c, [5, 7]), self.tensor(c, [7, 3]), self.tensor(c, [5, 3], fill=False)
        elapsed = c.gemm(a.op, b.op, d.op)
        self.assertEqual(c.lane_transport(0), "ring")
        self.assertIsInstance(elapsed, int)
        ref = reference.gemm(a.read(), b.read(), 5, 3, 7)
        self.assertLessEqual(reference.rel_error(d.read(), ref), 1e-5)

    def test_completions_carry_the_workers_stage_times(self):
        c = self.client("ring")
        a, b, d = self.tensor(c, [5, 7]), self.tensor(c, [7, 3]), self.tensor(c, [5, 3], fill=False)
        for _ in range(10):
            before = time.monotonic_ns()
            c.gemm(a.op, b.op, d.op)
            after = time.monotonic_ns()
            t = c.last_timing(0)
            stages = [before, t["taken_ns"], t["launched_ns"], t["finished_ns"], t["published_ns"], after]
            self.assertEqual(stages, sorted(stages), f"stages out of order: {stages}")
        self.assertIsNone(self.client("varlink").last_timing(0), "Varlink has no stage times")

    def test_blocking_calls_follow_a_switch_back_to_the_ring(self):
        """Blocking calls only, Varlink then the ring: the lane takes the ring
        again. A blocking call on a lane that had picked Varlink went on over
        Varlink after set_transport("ring"), so bench_gemm's small calls,
        timed as the ring's, were Varlink's."""
        c = self.client("auto")
        a, b, d = self.tensor(c, [5, 7]), self.tensor(c, [7, 3]), self.tensor(c, [5, 3], fill=False)
        c.set_transport("varlink")
        c.gemm(a.op, b.op, d.op, wait=False)   # the lane picks Varlink
        c.wait(0)
        self.assertEqual(c.lane_transport(0), "varlink")
        for transport in ("varlink", "ring", "varlink", "ring"):
            c.set_transport(transport)
            before = time.monotonic_ns()
            c.gemm(a.op, b.op, d.op)
            t = c.last_timing(0)
            over_ring = t is not None and t["taken_ns"] > before
            self.assertEqual(over_ring, transport == "ring", f"{transport}: the worker's stage times {t}")
        ref = reference.gemm(a.read(), b.read(), 5, 3, 7)
        self.assertLessEqual(reference.rel_error(d.read(), ref), 1e-5)

    def test_a_timed_out_record_says_its_work_was_launched(self):
        """A record answered io.regen.Timeout (its deadline_ms passed while
        its GEMM ran) reports when its work was launched, and no finish: it
        had reported launched_ns 0, as for a record that never ran."""
        c = self.client("ring")
        n = 768   # about 0.2 s on the host backend; the deadline is 50 ms
        a, b, d = self.tensor(c, [n, n]), self.tensor(c, [n, n]), self.tensor(c, [n, n], fill=False)
        before = time.monotonic_ns()
        with self.assertRaises(regen.Timeout):
            c.gemm(a.op, b.op, d.op, deadline_ms=50)
        after = time.monotonic_ns()
        t = c.last_timing(0)
        self.assertNotEqual(t["launched_ns"], 0, f"a launched record's timing: {t}")
        stages = [before, t["taken_ns"], t["launched_ns"], t["published_ns"], after]
        self.assertEqual(stages, sorted(stages), f"stages out of order: {stages}")
        self.assertEqual(t["finished_ns"], 0, f"answered before its work ended: {t}")
        c.gemm(a.op, b.op, d.op)   # the lane goes on, behind it

    def test_errors_are_the_same_on_both_transports(self):
        cv, cr = self.client("varlink"), self.client("ring")

        def cases(c):
            a, b, d = self.tensor(c, [4, 4]), self.tensor(c, [5, 4]), self.tensor(c, [4, 4], fill=False)
            small = self.tensor(c, [2, 2], fill=False)
            w = self.tensor(c, [4])
            return [
                lambda: c.gemm(a.op, b.op, d.op),                          # K disagrees
                lambda: c.gemm(a.op, a.op, small.op),                      # D of the wrong shape
                lambda: c.gemm(a.op, a.op, d.op, beta=0.5),                # beta without C
                lambda: c.gemm(a.op, a.op, d.op, epilogue="bias"),         # no bias
                lambda: c.gemm(a.op, a.op, regen.Operand(d.buffer, 8, "f32", [4, 4])),   # past the end
                lambda: c.gemm(a.op, a.op, regen.Operand(d.buffer, 2, "f32", [2, 2])),   # misaligned
                lambda: c.gemm(a.op, a.op, d.op, alpha=float("inf")),      # not JSON, not a number
                lambda: c.gemm(a.op, a.op, a.op),                          # D aliases A
                lambda: c.layer_norm(a.op, w.op, d.op, eps=0.0),           # eps 0
                lambda: c.layer_norm(a.op, w.op, d.op, eps=-1e-5),         # eps negative
                lambda: c.layer_norm(a.op, w.op, a.op),                    # y aliases x
                lambda: c.layer_norm(a.op, small.op, d.op),                # weight a matrix
                lambda: c.layer_norm_backward(a.op, a.op, w.op, w.op, w.op, d.op, d_residual=b.op),  # d_residual [5, 4]
                # What a ring record cannot hold: refused as regend refuses it.
                lambda: c.gemm(a.op, a.op, regen.Operand(d.buffer, 0, "f32", [4, 4], [4, 1, 1])),  # strides' rank
                lambda: c.gemm(a.op, a.op, regen.Operand(d.buffer, 0, "f32", [1, 1, 1, 4, 4])),   # rank 5
                lambda: c.gemm(a.op, a.op, regen.Operand(d.buffer, 0, "f32", [2**70, 4])),        # past 64 bits
                lambda: c.gemm(a.op, a.op, regen.Operand(d.buffer, -4, "f32", [4, 4])),           # offset < 0
                lambda: c.gemm(a.op, a.op, regen.Operand(d.buffer, 0, "f32", [4, 4], [-4, 1])),   # stride < 0
                lambda: c.gemm(a.op, a.op, regen.Operand(d.buffer, 0, "f32", [4, 4], [2**64, 1])),  # stride past 64 bits
            ]

        got = {}
        for c, name in ((cv, "varlink"), (cr, "ring")):
            start = len(self.tensors)
            outs = [self.outcome(f) for f in cases(c)]
            bufs = [t.buffer.id for t in self.tensors[start:]]
            got[name] = [str(o) for o in outs]
            for i, bid in enumerate(bufs):
                got[name] = [s.replace(bid, f"BUF{i}") for s in got[name]]
        self.assertEqual(cr.lane_transport(0), "ring")
        self.assertEqual(cv.lane_transport(0), None)   # blocking Varlink calls make no lane
        for v, r in zip(got["varlink"], got["ring"]):
            self.assertNotEqual(v, "None")
            self.assertEqual(r, v)

    def test_a_full_id_table_keeps_a_records_own_indexes(self):
        """The lane's id table full: a call whose A is bound at the index
        the client takes back next and whose B is not bound yet.  B's index
        must not be taken from A, or the record names B twice and D = B @ B
        comes back where A @ B was asked, with no error."""
        c = self.client("ring")
        nids = 256
        t = [self.tensor(c, [2, 2]) for _ in range(nids + 2)]
        # Binds t[0] .. t[255] to indexes 0 .. 255, in order.
        for i in range(nids - 1):
            c.gemm(t[i].op, t[i].op, t[i + 1].op)
        self.assertEqual(c.lane_transport(0), "ring")
        a, b, d = t[0], t[nids], t[nids + 1]
        a.write([self.rng.uniform(-1, 1) for _ in range(4)])
        b.write([self.rng.uniform(1, 2) for _ in range(4)])
        c.gemm(a.op, b.op, d.op)
        ref = reference.gemm(a.read(), b.read(), 2, 2, 2)
        self.assertLessEqual(reference.rel_error(d.read(), ref), 1e-5,
                             "D is not A @ B: the record named another buffer than A")

    def test_a_refused_bind_in_a_full_table_leaves_the_lane_working(self):
        """The id table full; a call names a buffer id regend does not know,
        so its Bind is refused with NoSuchObject, as the Varlink call would
        be.  The table must stay as it was: the next calls, on good buffers,
        work (the client had dropped the index it meant to take back before
        the Bind, and found no free one for good after)."""
        c = self.client("ring")
        nids = 256
        t = [self.tensor(c, [2, 2]) for _ in range(nids + 2)]
        for i in range(nids - 1):
            c.gemm(t[i].op, t[i].op, t[i + 1].op)
        ghost = regen.Operand(f"b0.{t[0].buffer.generation}.999999", 0, "f32", [2, 2])
        with self.assertRaises(regen.NoSuchObject):
            c.gemm(ghost, t[1].op, t[nids].op)
        a, b, d = t[0], t[nids], t[nids + 1]
        a.write([self.rng.uniform(-1, 1) for _ in range(4)])
        c.gemm(a.op, b.op, d.op)
        ref = reference.gemm(a.read(), b.read(), 2, 2, 2)
        self.assertLessEqual(reference.rel_error(d.read(), ref), 1e-5)

    def test_a_full_table_keeps_a_queued_error_for_wait(self):
        """A call queued with wait=False fails; 255 more fill the id table;
        the next call names a buffer not bound yet.  Taking an index back
        waits for the queued calls, but their error is theirs: the new call
        is queued, and wait() raises the first call's InvalidOperand."""
        c = self.client("ring")
        nids = 256
        t = [self.tensor(c, [2, 2]) for _ in range(nids + 1)]
        bad = regen.Operand(t[0].buffer, 8, "f32", [2, 2])       # past the end of a 16-byte buffer
        c.gemm(t[0].op, t[0].op, bad, wait=False)
        for i in range(1, nids):
            c.gemm(regen.Operand(t[i].buffer, 0, "f32", [1, 1]), regen.Operand(t[i].buffer, 4, "f32", [1, 1]),
                   regen.Operand(t[i].buffer, 8, "f32", [1, 1]), wait=False)
        self.assertEqual(c.lane_transport(0), "ring")
        submit_error = self.outcome(c.gemm, regen.Operand(t[nids].buffer, 0, "f32", [1, 1]),
                                    regen.Operand(t[nids].buffer, 4, "f32", [1, 1]),
                                    regen.Operand(t[nids].buffer, 8, "f32", [1, 1]), wait=False)
        self.assertIsNone(submit_error, "a good call's submit raised an earlier call's error")
        self.assertEqual(self.outcome(c.wait, 0)[0], "InvalidOperand",
                         "wait() said nothing of the queued call's InvalidOperand")

    def test_closing_a_buffer_runs_the_calls_queued_before(self):
        """A call queued with wait=False names a buffer, which is closed
        next: the call runs with it, as on Varlink (whose close reads the
        queued answers first), not NoSuchObject, and the buffer's index is
        not given to another before the call is taken."""
        c = self.client("ring")
        a, b, d = self.tensor(c, [16, 16]), self.tensor(c, [16, 16]), self.tensor(c, [16, 16], fill=False)
        want = reference.gemm(a.read(), b.read(), 16, 16, 16)
        for _ in range(20):
            c.gemm(a.op, b.op, d.op, wait=False)
        c.close_buffer(b.buffer)
        self.assertIsNone(self.outcome(c.wait, 0))
        self.assertLessEqual(reference.rel_error(d.read(), want), 1e-5)

    def test_queued_calls_complete_in_order(self):
        c = self.client("ring")
        a, b, d = self.tensor(c, [3, 3]), self.tensor(c, [3, 3]), self.tensor(c, [3, 3], fill=False)
        bad = regen.Operand(d.buffer, 32, "f32", [3, 3])
        tickets = [c.gemm(a.op, b.op, d.op, wait=False) for _ in range(600)]
        self.assertEqual(tickets, list(range(tickets[0], tickets[0] + 600)))
        c.wait(0)
        t = [c.gemm(a.op, b.op, bad if i == 3 else d.op, wait=False) for i in range(6)]
        with self.assertRaises(regen.InvalidOperand):
            c.wait(0, t[-1])
        c.gemm(a.op, b.op, d.op)
        ref = reference.gemm(a.read(), b.read(), 3, 3, 3)
        self.assertLessEqual(reference.rel_error(d.read(), ref), 1e-5)

    def test_queued_calls_on_varlink_too(self):
        c = self.client("varlink")
        a, b, d = self.tensor(c, [3, 3]), self.tensor(c, [3, 3]), self.tensor(c, [3, 3], fill=False)
        for _ in range(50):
            c.gemm(a.op, b.op, d.op, wait=False)
        self.assertEqual(c.lane_transport(0), "varlink")
        c.wait(0)
        # A blocking call after queued ones reads their answers first.
        c.gemm(a.op, b.op, regen.Operand(d.buffer, 32, "f32", [3, 3]), wait=False)
        c.import_memfd(0, self.tensor(c, [1]).fd, 4)
        with self.assertRaises(regen.InvalidOperand):
            c.wait(0)

    def test_switching_transports_keeps_the_connection(self):
        c = self.client("auto")
        a, b, d = self.tensor(c, [3, 3]), self.tensor(c, [3, 3]), self.tensor(c, [3, 3], fill=False)
        for t in ("ring", "varlink", "ring", "auto"):
            c.set_transport(t)
            c.gemm(a.op, b.op, d.op, wait=False)
            c.wait(0)
            self.assertEqual(c.lane_transport(0), "varlink" if t == "varlink" else "ring", t)
        ref = reference.gemm(a.read(), b.read(), 3, 3, 3)
        self.assertLessEqual(reference.rel_error(d.read(), ref), 1e-5)
        with self.assertRaises(ValueError):
            c.set_transport("pigeon")

    def test_a_switch_asked_with_calls_outstanding_applies_after_them(self):
        """set_transport while the lane has calls queued: they finish on
        the transport they went on, and the next call after them takes the
        new one (the lane had kept its transport for good)."""
        c = self.client("ring")
        a, b, d = self.tensor(c, [3, 3]), self.tensor(c, [3, 3]), self.tensor(c, [3, 3], fill=False)
        for want in ("varlink", "ring"):
            for _ in range(4):
                c.gemm(a.op, b.op, d.op, wait=False)
            c.set_transport(want)
            self.assertEqual(c.lane_transport(0), "ring" if want == "varlink" else "varlink",
                             "the calls outstanding keep theirs")
            c.wait(0)
            c.gemm(a.op, b.op, d.op, wait=False)
            c.wait(0)
            self.assertEqual(c.lane_transport(0), want)
        ref = reference.gemm(a.read(), b.read(), 3, 3, 3)
        self.assertLessEqual(reference.rel_error(d.read(), ref), 1e-5)

    def test_restart_makes_records_stale(self):
        c = self.client("ring")
        a, b, d = self.tensor(c, [2, 2]), self.tensor(c, [2, 2]), self.tensor(c, [2, 2], fill=False)
        c.gemm(a.op, b.op, d.op)
        gen = c.restart(0, reason="test_ring")["devices"][0]["generation"]
        with self.assertRaises(regen.StaleGeneration) as cm:
            c.gemm(a.op, b.op, d.op)
        self.assertEqual(cm.exception.parameters["generation"], gen)
        for t in (a, b, d):
            t.import_into(c, 0)
        c.gemm(a.op, b.op, d.op)
        self.assertEqual(c.lane_transport(0), "ring")


if __name__ == "__main__":
    unittest.main()
