# SPDX-License-Identifier: Apache-2.0
"""io.regen.Comm on the host backend against a real regend: the control
plane of communicators (Init's rendezvous, deadlines, abort in flight,
Destroy, stale generations, re-attach by key, hostile input) and the
collectives' results against float64 references. The host backend's
communicators are connections to one worker; nothing here is evidence for
the GPU path (tests/gpu/test_nccl*.py are)."""

import os
import random
import sys
import threading
import time
import unittest

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.dirname(HERE))
sys.path.insert(0, os.path.join(HERE, "..", "..", "..", "tests", "lib"))
import regen  # noqa: E402
from regen.host import HostTensor  # noqa: E402
from regend_fixture import Regend, find_regend, TIME_SCALE  # noqa: E402

# Largest |out - ref| / max(1, |ref|) per element for each dtype, the
# reference being float64 on the inputs as stored.
TOL = {"f32": 1e-6, "f16": 1e-3, "bf16": 8e-3}

daemon = None


def setUpModule():
    global daemon
    if not find_regend():
        raise unittest.SkipTest("no regend (pass --regend or set REGEN_BUILD_ROOT)")
    daemon = Regend(devices=1)


def tearDownModule():
    if daemon is not None:
        daemon.stop()


def run_ranks(n, fn, timeout=30.0):
    """fn(rank, client) on n threads, one Client each; returns their results
    (or the exceptions they raised) by rank."""
    out = [None] * n
    clients = [regen.Client(daemon.socket) for _ in range(n)]

    def body(r):
        try:
            out[r] = fn(r, clients[r])
        except Exception as e:  # noqa: BLE001 - handed to the test
            out[r] = e

    threads = [threading.Thread(target=body, args=(r,)) for r in range(n)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout * TIME_SCALE)
        assert not t.is_alive(), "a rank hung"
    for c in clients:
        c.close()
    return out


def reduce_ref(values, op):
    if op == "max":
        return [max(col) for col in zip(*values)]
    s = [sum(col) for col in zip(*values)]
    return [x / len(values) for x in s] if op == "avg" else s


def assert_close(test, got, want, dtype, what):
    test.assertEqual(len(got), len(want), what)
    for i, (g, w) in enumerate(zip(got, want)):
        test.assertLessEqual(abs(g - w), TOL[dtype] * max(1.0, abs(w)), f"{what}[{i}]: {g} vs {w}")


def tensor(client, values, dtype="f32"):
    t = HostTensor([len(values)], dtype)
    t.write(values)
    t.import_into(client)
    return t


def generation(client):
    return client.generation()["devices"][0]["generation"]


def wait_past_generation(client, gen, tries, ready=False):
    """Polls every 50 ms, at most `tries` times, until device 0's generation
    is past gen (and, with `ready`, the device is ready again)."""
    for _ in range(tries):
        dev = client.generation()["devices"][0]
        if dev["generation"] > gen and (not ready or dev["state"] == "ready"):
            return
        time.sleep(0.05)


def init_pair(a, b, uid):
    """Rank 0 (on a, here) and rank 1 (on b, from a thread) of a two-rank
    communicator on uid: Init returns once both joined."""
    joined = {}
    t = threading.Thread(target=lambda: joined.setdefault("c", b.comm_init(uid, 1, 2)))
    t.start()
    c0 = a.comm_init(uid, 0, 2)
    t.join(10 * TIME_SCALE)
    return c0, joined["c"]


def in_flight(fn):
    """fn() on a thread, given 0.3 s to be waiting in regend. Returns the
    thread and its outcome: "r", "finished" or the regen.Error it raised;
    "t", when it returned."""
    outcome = {}

    def body():
        try:
            fn()
            outcome["r"] = "finished"
        except regen.Error as e:
            outcome["r"] = e
        outcome["t"] = time.monotonic()

    t = threading.Thread(target=body)
    t.start()
    time.sleep(0.3)
    return t, outcome


class CommTest(unittest.TestCase):
    def setUp(self):
        self.c = regen.Client(daemon.socket)
        self.rng = random.Random(1600 + hash(self.id()) % 1000)

    def tearDown(self):
        self.c.close()

    def test_one_rank_collectives_match_the_reference(self):
        uid = self.c.comm_unique_id()
        self.assertEqual(len(uid), 256)
        comm = self.c.comm_init(uid, 0, 1)
        self.assertEqual((comm.rank, comm.nranks), (0, 1))
        self.assertTrue(str(comm).startswith("c0."))
        for dtype in ("f32", "f16", "bf16"):
            x = tensor(self.c, [self.rng.uniform(-4, 4) for _ in range(33)], dtype)
            stored = x.read()
            for op in ("sum", "max", "avg"):
                y = tensor(self.c, [0.0] * 33, dtype)
                self.c.comm_all_reduce(comm, x.op, y.op, op=op)
                assert_close(self, y.read(), stored, dtype, f"all_reduce {op} {dtype}")
            y = tensor(self.c, [0.0] * 33, dtype)
            self.c.comm_broadcast(comm, x.op, y.op, root=0)
            self.assertEqual(y.read(), stored)
            self.c.comm_all_gather(comm, x.op, y.op)
            self.assertEqual(y.read(), stored)
        self.c.comm_destroy(comm)
        with self.assertRaises(regen.NoSuchObject):
            self.c.comm_all_reduce(comm, x.op, x.op)

    def test_three_ranks_collectives_match_the_reference(self):
        uid = self.c.comm_unique_id()
        n, m = 3, 20
        inputs = {(dt, r): [self.rng.uniform(-2, 2) for _ in range(n * m)] for dt in TOL for r in range(n)}

        def rank(r, cl):
            comm = cl.comm_init(uid, r, n, deadline_ms=20000)
            got = {}
            for dt in TOL:
                x = tensor(cl, inputs[dt, r], dt)
                stored = x.read()
                got[dt, "in"] = stored
                for op in ("sum", "max", "avg"):
                    y = tensor(cl, [0.0] * (n * m), dt)
                    cl.comm_all_reduce(comm, x.op, y.op, op=op)
                    got[dt, "ar", op] = y.read()
                    z = tensor(cl, [0.0] * m, dt)
                    cl.comm_reduce_scatter(comm, x.op, z.op, op=op)
                    got[dt, "rs", op] = z.read()
                part = tensor(cl, stored[:m], dt)
                g = tensor(cl, [0.0] * (n * m), dt)
                cl.comm_all_gather(comm, part.op, g.op)
                got[dt, "ag"] = g.read()
                b = tensor(cl, stored, dt)
                cl.comm_broadcast(comm, b.op, b.op, root=2)   # in place
                got[dt, "bc"] = b.read()
            cl.comm_destroy(comm)
            return got

        res = run_ranks(n, rank)
        for r in range(n):
            self.assertIsInstance(res[r], dict, f"rank {r}: {res[r]!r}")
        for dt in TOL:
            ins = [res[r][dt, "in"] for r in range(n)]
            for op in ("sum", "max", "avg"):
                want = reduce_ref(ins, op)
                for r in range(n):
                    assert_close(self, res[r][dt, "ar", op], want, dt, f"rank {r} all_reduce {op} {dt}")
                    assert_close(self, res[r][dt, "rs", op], want[r * m:(r + 1) * m], dt,
                                 f"rank {r} reduce_scatter {op} {dt}")
            gathered = sum((ins[r][:m] for r in range(n)), [])
            for r in range(n):
                self.assertEqual(res[r][dt, "ag"], gathered)
                self.assertEqual(res[r][dt, "bc"], ins[2])

    def test_init_waits_for_every_rank_and_times_out_without_them(self):
        gen = generation(self.c)
        t0 = time.monotonic()
        with self.assertRaises(regen.CommTimeout) as cm:
            self.c.comm_init(self.c.comm_unique_id(), 0, 2, deadline_ms=300)
        elapsed = time.monotonic() - t0
        self.assertGreaterEqual(elapsed, 0.29)
        self.assertLess(elapsed, 5 * TIME_SCALE)
        self.assertTrue(cm.exception.parameters["comm"].startswith("c0."))
        # A peer missing is not the device's fault.
        info = self.c.generation()["devices"][0]
        self.assertEqual((info["generation"], info["state"]), (gen, "ready"))

    def test_a_collective_past_its_deadline_aborts_the_communicator(self):
        uid = self.c.comm_unique_id()

        def rank(r, cl):
            comm = cl.comm_init(uid, r, 2)
            x = tensor(cl, [1.0] * 4)
            if r == 0:
                try:
                    cl.comm_all_reduce(comm, x.op, x.op, deadline_ms=300)
                except regen.Error as e:
                    return e
                return "finished"
            time.sleep(1.0)   # rank 1 comes too late
            try:
                cl.comm_all_reduce(comm, x.op, x.op)
            except regen.Error as e:
                return e
            return "finished"

        res = run_ranks(2, rank)
        self.assertIsInstance(res[0], regen.CommTimeout)
        # Its peer learns of it by name instead of waiting.
        self.assertIsInstance(res[1], regen.CommFailed)
        self.assertIn("rank 0", res[1].parameters["reason"])
        self.assertEqual(self.c.generation()["devices"][0]["state"], "ready")

    def test_abort_ends_a_call_in_flight_and_destroy_refuses_without_abort(self):
        uid = self.c.comm_unique_id()
        owner = regen.Client(daemon.socket)
        # Rank 1 joins from a thread and then never calls a collective.
        joined = threading.Event()

        def peer():
            cl = regen.Client(daemon.socket)
            cl.comm_init(uid, 1, 2)
            joined.set()
            time.sleep(3.0)
            cl.close()

        t = threading.Thread(target=peer)
        t.start()
        comm = owner.comm_init(uid, 0, 2)
        joined.wait(10)
        x = tensor(owner, [1.0] * 8)
        caller, outcome = in_flight(lambda: owner.comm_all_reduce(comm, x.op, x.op))
        # Another connection of the same process: the call is in flight.
        with self.assertRaises(regen.CommInFlight) as cm:
            self.c.comm_destroy(comm)
        self.assertEqual(cm.exception.parameters["in_flight"], 1)
        t0 = time.monotonic()
        self.c.comm_abort(comm)
        caller.join(5 * TIME_SCALE)
        self.assertFalse(caller.is_alive())
        self.assertLess(time.monotonic() - t0, 2 * TIME_SCALE)
        self.assertIsInstance(outcome["r"], regen.CommFailed)
        self.assertEqual(outcome["r"].parameters["reason"], "aborted")
        with self.assertRaises(regen.CommFailed):
            owner.comm_all_reduce(comm, x.op, x.op)
        self.c.comm_destroy(comm)
        with self.assertRaises(regen.NoSuchObject):
            self.c.comm_destroy(comm)
        owner.close()
        t.join()

    def test_destroy_with_abort_ends_the_calls_in_flight(self):
        uid = self.c.comm_unique_id()
        a, b = regen.Client(daemon.socket), regen.Client(daemon.socket)
        comm, peer = init_pair(a, b, uid)
        x = tensor(a, [1.0] * 8)
        caller, outcome = in_flight(lambda: a.comm_all_reduce(comm, x.op, x.op))
        self.c.comm_destroy(comm, abort=True)
        caller.join(5 * TIME_SCALE)
        self.assertIsInstance(outcome.get("r"), regen.CommFailed)
        # The peer's communicator knows.
        y = tensor(b, [1.0] * 8)
        with self.assertRaises(regen.CommFailed):
            b.comm_all_reduce(peer, y.op, y.op)
        b.comm_destroy(peer)
        a.close()
        b.close()

    def test_ranks_that_disagree_fail_together(self):
        uid = self.c.comm_unique_id()

        def rank(r, cl):
            comm = cl.comm_init(uid, r, 2)
            x = tensor(cl, [1.0] * (4 + r))
            try:
                cl.comm_all_reduce(comm, x.op, x.op)
            except regen.Error as e:
                return e

        res = run_ranks(2, rank)
        for e in res:
            self.assertIsInstance(e, regen.CommFailed)
            self.assertTrue(e.parameters["reason"].startswith("mismatch"), e.parameters["reason"])

    def test_bad_calls_are_refused_before_any_work(self):
        comm = self.c.comm_init(self.c.comm_unique_id(), 0, 1)
        x = tensor(self.c, [1.0] * 8)
        y = tensor(self.c, [5.0] * 8)
        # Past the end of its buffer.
        with self.assertRaises(regen.InvalidOperand) as cm:
            self.c.comm_all_reduce(comm, x.op, regen.Operand(y.buffer, 4, "f32", [8]))
        self.assertEqual(cm.exception.parameters["operand"], "recv")
        # AllGather's recv must be nranks times send.
        with self.assertRaises(regen.InvalidOperand):
            self.c.comm_all_gather(comm, regen.Operand(x.buffer, 0, "f32", [4]), y.op)
        with self.assertRaises(regen.InvalidParameter):
            self.c.comm_broadcast(comm, x.op, y.op, root=1)
        with self.assertRaises(regen.InvalidParameter):
            self.c.comm_all_reduce(comm, x.op, y.op, op="bxor")
        with self.assertRaises(regen.InvalidOperand):
            self.c.comm_all_reduce(comm, x.op, regen.Operand(y.buffer, 0, "f16", [8]))
        self.assertEqual(y.read(), [5.0] * 8)
        # Not a communicator; a made-up id; another kind of id.
        with self.assertRaises(regen.NoSuchObject):
            self.c.comm_abort(x.buffer.id)
        fake = "c0.%d.12345" % comm.generation
        with self.assertRaises(regen.NoSuchObject):
            self.c.comm_all_reduce(fake, x.op, y.op)
        for params in ({"unique_id": "00", "rank": 0, "nranks": 1}, {"unique_id": "0" * 256, "rank": 2, "nranks": 2},
                       {"unique_id": "0" * 256, "rank": 0, "nranks": 0},
                       {"unique_id": "0" * 256, "rank": 0, "nranks": 1, "key": "a b"}):
            with self.assertRaises(regen.InvalidParameter):
                self.c.call("io.regen.Comm.Init", params, device=0)
        # The communicator still works.
        self.c.comm_all_reduce(comm, x.op, y.op)
        self.assertEqual(y.read(), [1.0] * 8)
        self.c.comm_destroy(comm)

    def test_another_process_cannot_name_a_communicator(self):
        comm = self.c.comm_init(self.c.comm_unique_id(), 0, 1)
        r, w = os.pipe()
        pid = os.fork()
        if pid == 0:
            os.close(r)
            code = 1
            try:
                cl = regen.Client(daemon.socket)
                try:
                    cl.comm_abort(comm.id)
                except regen.NoSuchObject:
                    try:
                        cl.comm_destroy(comm.id, abort=True)
                    except regen.NoSuchObject:
                        code = 0
            finally:
                os.write(w, bytes([code]))
                os._exit(0)
        os.close(w)
        code = os.read(r, 1)
        os.close(r)
        os.waitpid(pid, 0)
        self.assertEqual(code, b"\x00")
        x = tensor(self.c, [2.0] * 4)
        self.c.comm_all_reduce(comm, x.op, x.op)   # untouched
        self.c.comm_destroy(comm)

    def test_a_key_is_reattached_by_a_later_process(self):
        key = "job%d/rank0" % os.getpid()
        r, w = os.pipe()
        pid = os.fork()
        if pid == 0:
            os.close(r)
            try:
                cl = regen.Client(daemon.socket)
                comm = cl.comm_init(cl.comm_unique_id(), 0, 1, key=key)
                x = tensor(cl, [1.0] * 4)
                for _ in range(3):
                    cl.comm_all_reduce(comm, x.op, x.op)
                os.write(w, comm.id.encode())
            finally:
                os._exit(0)   # the rank dies without Destroy
        os.close(w)
        made = os.read(r, 64).decode()
        os.close(r)
        os.waitpid(pid, 0)
        self.assertTrue(made.startswith("c0."))
        comm = None
        for _ in range(100):   # its connection's close reaches the worker
            try:
                comm = self.c.comm_attach(key)
                break
            except regen.NoSuchObject:
                time.sleep(0.05)
        self.assertIsNotNone(comm, "no detached communicator to attach")
        self.assertEqual((comm.id, comm.rank, comm.nranks, comm.collectives), (made, 0, 1, 3))
        x = tensor(self.c, [3.0] * 4)
        self.c.comm_all_reduce(comm, x.op, x.op)
        self.assertEqual(x.read(), [3.0] * 4)
        # Held by a live process: not to be taken again; the key is taken.
        with self.assertRaises(regen.NoSuchObject):
            self.c.comm_attach(key)
        with self.assertRaises(regen.InvalidParameter):
            self.c.comm_init(self.c.comm_unique_id(), 0, 1, key=key)
        self.c.comm_destroy(comm)
        with self.assertRaises(regen.NoSuchObject):
            self.c.comm_attach(key)

    def test_an_unkeyed_communicator_goes_with_its_process(self):
        uid = self.c.comm_unique_id()
        b = regen.Client(daemon.socket)
        joined = {}
        t = threading.Thread(target=lambda: joined.setdefault("c", b.comm_init(uid, 1, 2)))
        t.start()
        pid = os.fork()
        if pid == 0:
            try:
                cl = regen.Client(daemon.socket)
                cl.comm_init(uid, 0, 2)
            finally:
                os._exit(0)
        os.waitpid(pid, 0)
        t.join(10)
        comm = joined["c"]
        x = tensor(b, [1.0] * 4)
        with self.assertRaises((regen.CommFailed, regen.CommTimeout)):
            b.comm_all_reduce(comm, x.op, x.op, deadline_ms=5000)
        b.comm_destroy(comm)
        b.close()

    def test_a_restart_ends_communicators_and_init_works_again(self):
        b = regen.Client(daemon.socket)
        comm, peer = init_pair(self.c, b, self.c.comm_unique_id())
        x = tensor(self.c, [1.0] * 4)
        caller, outcome = in_flight(lambda: self.c.comm_all_reduce(comm, x.op, x.op))
        gen = generation(b)
        admin = regen.Client(daemon.socket)
        t0 = time.monotonic()
        admin.restart(0, reason="test: a rank failed")
        caller.join(10 * TIME_SCALE)
        self.assertFalse(caller.is_alive())
        # The drain aborted the call waiting for a peer; the restart did not
        # wait for the drain deadline.
        self.assertLess(time.monotonic() - t0, 5 * TIME_SCALE)
        self.assertIsInstance(outcome["r"], (regen.CommFailed, regen.Draining))
        wait_past_generation(b, gen, 100)
        self.assertGreater(generation(b), gen)
        y = tensor(b, [1.0] * 4)
        with self.assertRaises(regen.StaleGeneration):
            b.comm_all_reduce(peer, y.op, y.op)
        with self.assertRaises(regen.StaleGeneration):
            self.c.comm_destroy(comm)
        again = self.c.comm_init(self.c.comm_unique_id(), 0, 1)
        self.assertEqual(again.generation, generation(b))
        y = tensor(self.c, [2.0] * 4)
        self.c.comm_all_reduce(again, y.op, y.op)
        self.c.comm_destroy(again)
        admin.close()
        b.close()

    def test_a_device_fault_ends_a_collective_in_flight_by_name(self):
        # Rank 0 waits in an AllReduce for rank 1, which never calls; the
        # device loses its context. The call ends by name (the reset's
        # drain aborts the communicator), never hangs; the ids go stale,
        # and the ranks Init again in the new generation.
        b = regen.Client(daemon.socket)
        comm, peer = init_pair(self.c, b, self.c.comm_unique_id())
        x = tensor(self.c, [1.0] * 4)
        gen = generation(self.c)
        caller, outcome = in_flight(lambda: self.c.comm_all_reduce(comm, x.op, x.op, deadline_ms=60000))
        admin = regen.Client(daemon.socket)
        t0 = time.monotonic()
        admin.inject_fault(0, "device_lost")
        caller.join(10 * TIME_SCALE)
        self.assertFalse(caller.is_alive(), "the collective in flight hung through the fault")
        self.assertLess(time.monotonic() - t0, 10 * TIME_SCALE)
        self.assertIsInstance(outcome["r"], (regen.CommFailed, regen.DeviceLost, regen.Draining))
        wait_past_generation(admin, gen, 200, ready=True)
        self.assertGreater(generation(admin), gen)
        y = tensor(b, [1.0] * 4)
        with self.assertRaises(regen.StaleGeneration):
            b.comm_all_reduce(peer, y.op, y.op)
        a2, b2 = init_pair(self.c, b, self.c.comm_unique_id())
        z = tensor(self.c, [2.0] * 4)
        w = tensor(b, [3.0] * 4)
        t = threading.Thread(target=lambda: b.comm_all_reduce(b2, w.op, w.op))
        t.start()
        self.c.comm_all_reduce(a2, z.op, z.op)
        t.join(10 * TIME_SCALE)
        self.assertEqual((z.read(), w.read()), ([5.0] * 4, [5.0] * 4))
        self.c.comm_destroy(a2)
        b.comm_destroy(b2)
        admin.close()
        b.close()


# How long each abort's end takes on the daemon of SlowAbortTest, and what
# counts as "at once" beside it.
SLOW_ABORT_S = 2.0 * TIME_SCALE
PROMPT_S = 0.6 * TIME_SCALE


class SlowAbortTest(unittest.TestCase):
    """An abort whose end takes long (REGEN_HOST_COMM_ABORT_MS: as an
    ncclCommAbort whose peer is gone may) holds nobody else up: the call in
    flight, the peer, the Abort and Destroy calls, another communicator and
    the device answer at once; only a lifecycle change waits for it."""

    @classmethod
    def setUpClass(cls):
        cls.daemon = Regend(devices=1, env={"REGEN_HOST_COMM_ABORT_MS": str(int(SLOW_ABORT_S * 1000))})

    @classmethod
    def tearDownClass(cls):
        cls.daemon.stop()

    def pair(self):
        a, b = regen.Client(self.daemon.socket), regen.Client(self.daemon.socket)
        return (a, b) + init_pair(a, b, a.comm_unique_id())

    def test_nothing_waits_behind_an_abort(self):
        a, b, ca, cb = self.pair()
        other = regen.Client(self.daemon.socket)
        x = tensor(a, [1.0] * 8)
        caller, outcome = in_flight(lambda: a.comm_all_reduce(ca, x.op, x.op))
        t0 = time.monotonic()
        other.comm_abort(ca)
        self.assertLess(time.monotonic() - t0, PROMPT_S, "Abort waited for the abort's end")
        caller.join(10 * TIME_SCALE)
        self.assertIsInstance(outcome.get("r"), regen.CommFailed)
        self.assertEqual(outcome["r"].parameters["reason"], "aborted")
        self.assertLess(outcome["t"] - t0, PROMPT_S, "the call in flight waited for the abort's end")
        # The peer learns of it by name, at once.
        y = tensor(b, [1.0] * 8)
        t1 = time.monotonic()
        with self.assertRaises(regen.CommFailed) as cm:
            b.comm_all_reduce(cb, y.op, y.op)
        self.assertIn("rank 0 was aborted", cm.exception.parameters["reason"])
        # Another communicator, the device and the lifecycle's view: at once.
        solo = other.comm_init(other.comm_unique_id(), 0, 1)
        z = tensor(other, [2.0] * 8)
        other.comm_all_reduce(solo, z.op, z.op)
        self.assertEqual(z.read(), [2.0] * 8)
        self.assertEqual(other.status()["devices"][0]["state"], "ready")
        # Destroy frees the ids without waiting for the end either.
        a.comm_destroy(ca)
        b.comm_destroy(cb, abort=True)
        other.comm_destroy(solo)
        self.assertLess(time.monotonic() - t1, PROMPT_S, "a call waited for the abort's end")
        with self.assertRaises(regen.NoSuchObject):
            a.comm_abort(ca)
        for c in (a, b, other):
            c.close()

    def test_a_restart_waits_for_the_aborts_in_progress(self):
        a, b, ca, cb = self.pair()
        gen = generation(a)
        t0 = time.monotonic()
        a.comm_destroy(ca, abort=True)
        b.comm_destroy(cb, abort=True)
        self.assertLess(time.monotonic() - t0, PROMPT_S)
        admin = regen.Client(self.daemon.socket)
        admin.restart(0, reason="test: aborts in progress")
        # The release gave back what the aborts hold: it came after them.
        self.assertGreaterEqual(time.monotonic() - t0, SLOW_ABORT_S * 0.9)
        self.assertGreater(generation(admin), gen)
        again = admin.comm_init(admin.comm_unique_id(), 0, 1)
        admin.comm_destroy(again)
        for c in (a, b, admin):
            c.close()

    def test_a_release_finalizes_and_a_restart_aborts(self):
        # A healthy idle communicator: a Release finalizes it (no abort to
        # wait for); a Restart, asked for when a rank failed, aborts it.
        admin = regen.Client(self.daemon.socket)
        admin.comm_init(admin.comm_unique_id(), 0, 1)
        t0 = time.monotonic()
        admin.release(0, reason="test: finalize")
        self.assertLess(time.monotonic() - t0, PROMPT_S, "a Release aborted a healthy communicator")
        admin.comm_init(admin.comm_unique_id(), 0, 1)
        t0 = time.monotonic()
        admin.restart(0, reason="test: abort")
        self.assertGreaterEqual(time.monotonic() - t0, SLOW_ABORT_S * 0.9, "a Restart finalized its communicator")
        admin.close()


if __name__ == "__main__":
    unittest.main()
