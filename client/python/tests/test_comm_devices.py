# SPDX-License-Identifier: Apache-2.0
"""io.regen.Comm across the workers of one regend (host backend, four
devices): ranks in processes of their own, one per device as NCCL's (and
two per device), results of every collective, Send and Recv against float64
or exact integer references on fresh random inputs, messages that take
several steps through the shared staging, and the faults a multi-GPU job
meets: a peer's device lost (its generation alone bumps; the others'
collectives in flight end with CommFailed within a second, then the
communicator is rebuilt and its time measured), a peer's worker killed, and
a peer process gone with a keyed communicator that a new process attaches
while the other ranks wait. The host backend's communicators test the
control plane and the multi-worker paths, not NCCL (tests/gpu/test_nccl*.py
do)."""

import multiprocessing
import os
import random
import signal
import sys
import time
import traceback
import unittest

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.dirname(HERE))
sys.path.insert(0, os.path.join(HERE, "..", "..", "..", "tests", "lib"))
import regen  # noqa: E402
from regen.host import HostTensor  # noqa: E402
from regend_fixture import Regend, find_regend, TIME_SCALE  # noqa: E402

DEVICES = 4
# |out - ref| / max(1, |ref|) per element, the reference float64 over the
# inputs as stored (sums of up to four terms, rounded once).
TOL = {"f32": 1e-6, "f16": 1e-3, "bf16": 8e-3, "f64": 1e-12}
# A peer's loss must reach the others within this (the target).
NOTICE_S = 1.0
# Each rank's staging slot: 32 f64, 64 f32.
SLOT_BYTES = 256

daemon = None
_fork = multiprocessing.get_context("fork")


def setUpModule():
    global daemon
    if not find_regend():
        raise unittest.SkipTest("no regend (pass --regend or set REGEN_BUILD_ROOT)")
    # Small staging slots (test knob), so that every kind of call takes
    # several steps through the workers' shared memory, ReduceScatter and
    # AllToAll a few blocks at a time.
    daemon = Regend(devices=DEVICES, env={"REGEN_HOST_COMM_SLOT_BYTES": str(SLOT_BYTES)})


def tearDownModule():
    if daemon is not None:
        daemon.stop()


class RankError(Exception):
    """What a rank process raised, carried back: the regen error's name and
    parameters, or the traceback of anything else."""

    def __init__(self, name, parameters, text):
        super().__init__(f"{name}: {parameters or text}")
        self.name, self.parameters, self.text = name, parameters or {}, text


def _rank_body(fn, r, devices, args, queue):
    client = None
    try:
        client = regen.Client(daemon.socket, timeout=60)
        queue.put((r, "ok", fn(r, devices[r], client, *args)))
    except regen.Error as e:
        queue.put((r, "regen", (type(e).__name__, dict(e.parameters or {}))))
    except BaseException:  # noqa: BLE001 - carried to the test
        queue.put((r, "other", traceback.format_exc()))
    finally:
        if client is not None:
            client.close()


def run_ranks(devices, fn, *args, timeout=60.0):
    """fn(rank, device, client, *args) in one process per rank (rank r on
    devices[r]); returns their results by rank, a RankError for a rank that
    raised. A rank that does not answer in time fails the test."""
    queue = _fork.Queue()
    procs = [_fork.Process(target=_rank_body, args=(fn, r, devices, args, queue)) for r in range(len(devices))]
    for p in procs:
        p.start()
    out, deadline = {}, time.monotonic() + timeout * TIME_SCALE
    try:
        while len(out) < len(procs):
            left = deadline - time.monotonic()
            if left <= 0:
                raise AssertionError(f"ranks {sorted(set(range(len(procs))) - set(out))} hung")
            r, how, value = queue.get(timeout=left)
            out[r] = value if how == "ok" else RankError(value[0], value[1], "") if how == "regen" else \
                RankError("exception", None, value)
    finally:
        for p in procs:
            p.join(5)
            if p.is_alive():
                p.kill()
    return [out[r] for r in range(len(procs))]


def results(test, res):
    for r, v in enumerate(res):
        if isinstance(v, RankError):
            test.fail(f"rank {r}: {v.text or v}")
    return res


def host_tensor(client, device, dtype, values):
    t = HostTensor([len(values)], dtype)
    t.write(values)
    t.import_into(client, device)
    return t


def inputs(seed, nranks, n, dtype):
    """Every rank's input, the same in every process: floats that the dtype
    stores exactly enough for the tolerance; integers small enough that a
    product of four fits."""
    rng = random.Random(repr(seed))
    if dtype in ("i32", "i64"):
        return [[rng.randint(-50, 50) for _ in range(n)] for _ in range(nranks)]
    if dtype == "u8":
        return [[rng.randint(0, 60) for _ in range(n)] for _ in range(nranks)]
    return [[rng.uniform(-2.0, 2.0) for _ in range(n)] for _ in range(nranks)]


def stored(dtype, values):
    """values as the dtype stores them (what regend reads)."""
    t = HostTensor([len(values)], dtype)
    t.write(values)
    return t.read()


def reduced(values, op, dtype):
    cols = list(zip(*values))
    if op == "max":
        out = [max(c) for c in cols]
    elif op == "min":
        out = [min(c) for c in cols]
    elif op == "prod":
        out = []
        for c in cols:
            p = 1
            for x in c:
                p *= x
            out.append(p)
    else:
        out = [sum(c) for c in cols]
        if op == "avg":
            out = [x / len(values) for x in out]
    if dtype == "u8":
        out = [int(x) % 256 for x in out]
    return out


def assert_close(test, got, want, dtype, what):
    test.assertEqual(len(got), len(want), what)
    if dtype in ("i32", "i64", "u8"):
        test.assertEqual(got, want, what)
        return
    for i, (g, w) in enumerate(zip(got, want)):
        test.assertLessEqual(abs(g - w), TOL[dtype] * max(1.0, abs(w)), f"{what}[{i}]: {g} vs {w}")


def make_comm(client, rank, nranks, device, store, key=None, deadline_ms=20000):
    """A communicator of nranks: rank 0's unique id through a file (the
    job's store)."""
    if rank == 0:
        tmp = store + ".tmp"
        with open(tmp, "w") as f:
            f.write(client.comm_unique_id(device))
        os.rename(tmp, store)
    else:
        until = time.monotonic() + 20 * TIME_SCALE
        while not os.path.exists(store):
            if time.monotonic() > until:
                raise TimeoutError("no unique id from rank 0")
            time.sleep(0.01)
    with open(store) as f:
        uid = f.read()
    return client.comm_init(uid, rank, nranks, device=device, key=key, deadline_ms=deadline_ms)


_stores = [0]


def store_path():
    _stores[0] += 1
    return os.path.join(daemon.dir, f"uid-{os.getpid()}-{_stores[0]}-{random.getrandbits(32):08x}")


def group_files():
    return sorted(f for f in os.listdir(daemon.dir) if ".comm-" in f)


# ---- What the rank processes run ------------------------------------------------------


def every_collective(r, dev, c, nranks, store, seed, n):
    """Each collective on fresh inputs; returns what each produced."""
    comm = make_comm(c, r, nranks, dev, store)
    out = {}
    for dtype in ("f32", "bf16", "f64", "i64", "i32", "u8"):
        ops = ("sum", "max", "min", "prod") + (("avg",) if dtype in TOL else ())
        for op in ops:
            x = host_tensor(c, dev, dtype, inputs((seed, dtype, op), nranks, n, dtype)[r])
            y = host_tensor(c, dev, dtype, [0] * n)
            c.comm_all_reduce(comm, x.op, y.op, op=op)
            out[("all_reduce", dtype, op)] = y.read()
            rs = host_tensor(c, dev, dtype, inputs((seed, dtype, op, "rs"), nranks, nranks * n, dtype)[r])
            ry = host_tensor(c, dev, dtype, [0] * n)
            c.comm_reduce_scatter(comm, rs.op, ry.op, op=op)
            out[("reduce_scatter", dtype, op)] = ry.read()
        x = host_tensor(c, dev, dtype, inputs((seed, dtype, "ag"), nranks, n, dtype)[r])
        g = host_tensor(c, dev, dtype, [0] * (nranks * n))
        c.comm_all_gather(comm, x.op, g.op)
        out[("all_gather", dtype)] = g.read()
        a = host_tensor(c, dev, dtype, inputs((seed, dtype, "a2a"), nranks, nranks * n, dtype)[r])
        b = host_tensor(c, dev, dtype, [0] * (nranks * n))
        c.comm_all_to_all(comm, a.op, b.op)
        out[("all_to_all", dtype)] = b.read()
        # In place, from the last rank.
        z = host_tensor(c, dev, dtype, inputs((seed, dtype, "bc"), nranks, n, dtype)[r])
        c.comm_broadcast(comm, z.op, z.op, root=nranks - 1)
        out[("broadcast", dtype)] = z.read()
    # A ring of Send and Recv: each sends to the next, receives from the
    # previous (even ranks send first, odd ranks receive first).
    s = host_tensor(c, dev, "f32", inputs((seed, "ring"), nranks, n, "f32")[r])
    q = host_tensor(c, dev, "f32", [0] * n)
    nxt, prv = (r + 1) % nranks, (r - 1) % nranks
    if r % 2 == 0:
        c.comm_send(comm, s.op, nxt)
        c.comm_recv(comm, q.op, prv)
    else:
        c.comm_recv(comm, q.op, prv)
        c.comm_send(comm, s.op, nxt)
    out[("ring",)] = q.read()
    c.comm_destroy(comm)
    return out


def big_messages(r, dev, c, nranks, store, seed, n):
    """Messages of many staging steps: AllReduce, ReduceScatter, AllToAll
    and a Send of n elements; returns what each produced."""
    comm = make_comm(c, r, nranks, dev, store)
    x = host_tensor(c, dev, "f32", inputs((seed, "ar"), nranks, n, "f32")[r])
    y = host_tensor(c, dev, "f32", [0.0] * n)
    c.comm_all_reduce(comm, x.op, y.op)
    rs_in = host_tensor(c, dev, "f32", inputs((seed, "rs"), nranks, nranks * n, "f32")[r])
    rs_out = host_tensor(c, dev, "f32", [0.0] * n)
    c.comm_reduce_scatter(comm, rs_in.op, rs_out.op)
    a2a_in = host_tensor(c, dev, "i32", [r * 1000003 + i for i in range(nranks * n)])
    a2a_out = host_tensor(c, dev, "i32", [0] * (nranks * n))
    c.comm_all_to_all(comm, a2a_in.op, a2a_out.op)
    p = host_tensor(c, dev, "i64", [r * 7 + i for i in range(n)])
    if r == 0:
        c.comm_send(comm, p.op, 1)
    elif r == 1:
        c.comm_recv(comm, p.op, 0)
    c.comm_destroy(comm)
    return {"ar": y.read(), "rs": rs_out.read(), "a2a": a2a_out.read(), "p2p": p.read()}


def wait_in_all_reduce(r, dev, c, nranks, store, victim, notice):
    """Every rank but `victim` waits in an AllReduce; the victim joins,
    says it did (a file), then waits to be killed or to lose its device.
    Returns (the error's name, its reason, seconds from the loss to it)."""
    comm = make_comm(c, r, nranks, dev, store)
    if r == victim:
        with open(notice + ".joined", "w"):
            pass
        # Until its loss, and a moment after (its peers notice meanwhile).
        until = time.monotonic() + 30 * TIME_SCALE
        while not os.path.exists(notice) and time.monotonic() < until:
            time.sleep(0.01)
        time.sleep(1.5)
        return None
    x = host_tensor(c, dev, "f32", [1.0] * 64)
    try:
        c.comm_all_reduce(comm, x.op, x.op, deadline_ms=20000)
        return ("finished", "", 0.0)
    except regen.Error as e:
        ended = time.time()
        with open(notice) as f:
            lost = float(f.read())
        return (type(e).__name__, e.parameters.get("reason", ""), ended - lost)
    finally:
        c.comm_destroy(comm)


def rebuild_after_fault(r, dev, c, nranks, store):
    """A fresh communicator on every rank (the faulted device's in its new
    generation), its Init timed, then an AllReduce checked."""
    start = time.monotonic()
    comm = make_comm(c, r, nranks, dev, store)
    took = time.monotonic() - start
    x = host_tensor(c, dev, "f32", [float(r + 1)] * 8)
    c.comm_all_reduce(comm, x.op, x.op)
    got = x.read()
    c.comm_destroy(comm)
    return took, got, comm.generation


def keyed_then_gone(r, dev, c, nranks, store, key):
    """Rank `r`'s first life: Init with a key, one AllReduce, then exit
    without Destroy (rank 1), or stay and wait for rank 1's next life
    (rank 0)."""
    comm = make_comm(c, r, nranks, dev, store, key=key)
    x = host_tensor(c, dev, "f32", [float(r + 1)] * 4)
    c.comm_all_reduce(comm, x.op, x.op)
    if r == 1:
        return "gone"         # no Destroy: the process ends with its connections
    # Rank 0 keeps its communicator and its next AllReduce waits for the
    # restarted rank 1.
    y = host_tensor(c, dev, "f32", [10.0] * 4)
    c.comm_all_reduce(comm, y.op, y.op, deadline_ms=30000)
    got = y.read()
    c.comm_destroy(comm)
    return got


def attach_again(r, dev, c, key):
    comm = c.comm_attach(key, device=dev)
    y = host_tensor(c, dev, "f32", [5.0] * 4)
    c.comm_all_reduce(comm, y.op, y.op, deadline_ms=30000)
    got = y.read()
    c.comm_destroy(comm)
    return comm.collectives, got


# ---- The tests ---------------------------------------------------------------------


class CommAcrossDevices(unittest.TestCase):
    def check_every_collective(self, devices, seed):
        # 40 elements: one step of u8, several of the wider dtypes.
        nranks, n = len(devices), 40
        res = results(self, run_ranks(devices, every_collective, nranks, store_path(), seed, n))
        for r in range(nranks):
            out = res[r]
            for dtype in ("f32", "bf16", "f64", "i64", "i32", "u8"):
                for op in ("sum", "max", "min", "prod") + (("avg",) if dtype in TOL else ()):
                    vals = [stored(dtype, v) for v in inputs((seed, dtype, op), nranks, n, dtype)]
                    assert_close(self, out[("all_reduce", dtype, op)], reduced(vals, op, dtype), dtype,
                                 f"rank {r} all_reduce {dtype} {op}")
                    vals = [stored(dtype, v) for v in inputs((seed, dtype, op, "rs"), nranks, nranks * n, dtype)]
                    want = reduced([v[r * n:(r + 1) * n] for v in vals], op, dtype)
                    assert_close(self, out[("reduce_scatter", dtype, op)], want, dtype,
                                 f"rank {r} reduce_scatter {dtype} {op}")
                vals = [stored(dtype, v) for v in inputs((seed, dtype, "ag"), nranks, n, dtype)]
                self.assertEqual(out[("all_gather", dtype)], [x for v in vals for x in v], f"rank {r} all_gather")
                vals = [stored(dtype, v) for v in inputs((seed, dtype, "a2a"), nranks, nranks * n, dtype)]
                self.assertEqual(out[("all_to_all", dtype)], [x for k in range(nranks) for x in vals[k][r * n:(r + 1) * n]],
                                 f"rank {r} all_to_all {dtype}")
                vals = [stored(dtype, v) for v in inputs((seed, dtype, "bc"), nranks, n, dtype)]
                self.assertEqual(out[("broadcast", dtype)], vals[nranks - 1], f"rank {r} broadcast {dtype}")
            ring = [stored("f32", v) for v in inputs((seed, "ring"), nranks, n, "f32")]
            self.assertEqual(out[("ring",)], ring[(r - 1) % nranks], f"rank {r} ring")

    def test_one_rank_per_device(self):
        self.check_every_collective(list(range(DEVICES)), random.getrandbits(32))
        # Every rank destroyed its communicator: the group's file is gone.
        self.assertEqual(group_files(), [])

    def test_two_ranks_per_device(self):
        # Ranks 0 and 2 share device 0's worker (one mapping), 1 and 3
        # device 1's.
        self.check_every_collective([0, 1, 0, 1], random.getrandbits(32))

    def test_messages_of_many_steps(self):
        # 3000 f32 in slots of 64: 47 steps; ReduceScatter's and
        # AllToAll's blocks 16 at a time; the Send in 94 chunks.
        nranks, n, seed = 4, 3000, random.getrandbits(32)
        res = results(self, run_ranks(list(range(nranks)), big_messages, nranks, store_path(), seed, n))
        ar = [stored("f32", v) for v in inputs((seed, "ar"), nranks, n, "f32")]
        rs = [stored("f32", v) for v in inputs((seed, "rs"), nranks, nranks * n, "f32")]
        for r in range(nranks):
            out = res[r]
            assert_close(self, out["ar"], reduced(ar, "sum", "f32"), "f32", f"rank {r} all_reduce")
            assert_close(self, out["rs"], reduced([v[r * n:(r + 1) * n] for v in rs], "sum", "f32"), "f32",
                         f"rank {r} reduce_scatter")
            self.assertEqual(out["a2a"], [k * 1000003 + r * n + i for k in range(nranks) for i in range(n)],
                             f"rank {r} all_to_all")
        self.assertEqual(res[1]["p2p"], list(range(n)))

    def test_a_peer_device_lost_fails_the_others_within_a_second(self):
        nranks, victim = 4, 2
        c = regen.Client(daemon.socket)
        before = {d["index"]: d["generation"] for d in c.generation()["devices"]}
        store, notice = store_path(), store_path()
        queue_result = {}

        def lose_victim():
            # Once the victim joined and the others are waiting in their
            # AllReduce, its device loses its context.
            until = time.monotonic() + 30 * TIME_SCALE
            while not os.path.exists(notice + ".joined"):
                self.assertLess(time.monotonic(), until, "the victim never joined")
                time.sleep(0.01)
            time.sleep(0.3)
            with open(notice + ".tmp", "w") as f:
                f.write(repr(time.time()))
            os.rename(notice + ".tmp", notice)
            c.inject_fault(victim, "device_lost")
            queue_result["injected"] = True

        import threading
        t = threading.Thread(target=lose_victim)
        t.start()
        res = run_ranks(list(range(nranks)), wait_in_all_reduce, nranks, store, victim, notice)
        t.join(30)
        self.assertTrue(queue_result.get("injected"))
        for r in range(nranks):
            if r == victim:
                continue
            self.assertNotIsInstance(res[r], RankError, f"rank {r}: {res[r]}")
            name, reason, seconds = res[r]
            self.assertEqual(name, "CommFailed", f"rank {r}: {res[r]}")
            self.assertIn(f"rank {victim}", reason)
            self.assertLess(seconds, NOTICE_S, f"rank {r} noticed the loss after {seconds:.3f} s")
            print(f"rank {r}: CommFailed {seconds * 1000:.0f} ms after device {victim}'s loss ({reason})",
                  file=sys.stderr)
        # Only the victim's device went to a new generation.
        deadline = time.monotonic() + 30 * TIME_SCALE
        while True:
            now = {d["index"]: (d["generation"], d["state"]) for d in c.generation()["devices"]}
            if now[victim][0] > before[victim] and now[victim][1] == "ready":
                break
            self.assertLess(time.monotonic(), deadline, f"device {victim} never came back: {now}")
            time.sleep(0.05)
        for d in range(DEVICES):
            if d != victim:
                self.assertEqual(now[d][0], before[d], f"device {d}'s generation moved")
        # Rebuilt: a new unique id, Init on every rank, and the time it took
        # against the loss's notice.
        res = results(self, run_ranks(list(range(nranks)), rebuild_after_fault, nranks, store_path()))
        for r, (took, got, gen) in enumerate(res):
            self.assertEqual(got, [float(nranks * (nranks + 1) // 2)] * 8)
            if r == victim:
                self.assertEqual(gen, now[victim][0])
        took = max(x[0] for x in res)
        print(f"communicator rebuilt on {nranks} ranks in {took * 1000:.0f} ms after device {victim}'s reset",
              file=sys.stderr)
        self.assertLess(took, 2.0 * TIME_SCALE)
        c.close()

    def test_a_peer_worker_killed_fails_the_others_within_a_second(self):
        nranks, victim = 3, 1
        c = regen.Client(daemon.socket)
        store, notice = store_path(), store_path()
        info = {d["index"]: d for d in c.status()["devices"]}
        pid = info[victim]["worker_pid"]

        def kill_worker():
            until = time.monotonic() + 30 * TIME_SCALE
            while not os.path.exists(notice + ".joined"):
                assert time.monotonic() < until
                time.sleep(0.01)
            time.sleep(0.3)
            with open(notice + ".tmp", "w") as f:
                f.write(repr(time.time()))
            os.rename(notice + ".tmp", notice)
            os.kill(pid, signal.SIGKILL)

        import threading
        t = threading.Thread(target=kill_worker)
        t.start()
        res = run_ranks(list(range(nranks)), wait_in_all_reduce, nranks, store, victim, notice)
        t.join(30)
        for r in range(nranks):
            if r == victim:
                continue
            self.assertNotIsInstance(res[r], RankError, f"rank {r}: {res[r]}")
            name, reason, seconds = res[r]
            self.assertEqual(name, "CommFailed", f"rank {r}: {res[r]}")
            self.assertIn("is gone", reason)
            self.assertLess(seconds, NOTICE_S, f"rank {r} noticed after {seconds:.3f} s")
        # The device comes back with a new worker.
        deadline = time.monotonic() + 30 * TIME_SCALE
        while c.device_info(victim)["state"] != "ready" or c.device_info(victim)["worker_pid"] == pid:
            self.assertLess(time.monotonic(), deadline, "the device never came back")
            time.sleep(0.05)
        c.close()

    def test_a_restarted_rank_attaches_while_its_peer_waits(self):
        key = f"job{random.getrandbits(32):08x}/rank1"
        store = store_path()
        import threading
        box = {}

        def first_life():
            box["first"] = run_ranks([0, 1], keyed_then_gone, 2, store, key)

        t = threading.Thread(target=first_life)
        t.start()
        # Rank 1's process is gone: its communicator is detached; a new
        # process of the same user attaches it by its key.
        c = regen.Client(daemon.socket)
        deadline = time.monotonic() + 30 * TIME_SCALE
        while True:
            try:
                res = run_ranks([1], lambda r, dev, cl: attach_again(r, 1, cl, key))
            except AssertionError:
                raise
            if not isinstance(res[0], RankError) or res[0].name != "NoSuchObject":
                break
            self.assertLess(time.monotonic(), deadline, "rank 1's communicator was never detached")
            time.sleep(0.05)
        t.join(60)
        self.assertNotIsInstance(res[0], RankError, str(res[0]))
        collectives, got = res[0]
        self.assertEqual(collectives, 1)
        self.assertEqual(got, [15.0] * 4)
        self.assertEqual(box["first"], [[15.0] * 4, "gone"])
        c.close()

    def test_disagreeing_ranks_fail_together(self):
        def rank(r, dev, c, store):
            comm = make_comm(c, r, 2, dev, store)
            x = host_tensor(c, dev, "f32", [1.0] * (4 + r))
            try:
                c.comm_all_reduce(comm, x.op, x.op)
            except regen.CommFailed as e:
                return e.parameters["reason"]
            finally:
                c.comm_destroy(comm)

        res = results(self, run_ranks([0, 3], rank, store_path()))
        for reason in res:
            self.assertTrue(reason.startswith("mismatch"), reason)

    def test_send_recv_of_another_length_fails_both(self):
        def rank(r, dev, c, store):
            comm = make_comm(c, r, 2, dev, store)
            x = host_tensor(c, dev, "f32", [1.0] * (8 if r == 0 else 6))
            try:
                if r == 0:
                    c.comm_send(comm, x.op, 1)
                    # The send may go before the receiver looks: the next
                    # call shows the failure.
                    c.comm_all_reduce(comm, x.op, x.op, deadline_ms=10000)
                else:
                    c.comm_recv(comm, x.op, 0)
                return "finished"
            except regen.CommFailed as e:
                return e.parameters["reason"]
            finally:
                c.comm_destroy(comm, abort=True)

        res = results(self, run_ranks([2, 1], rank, store_path()))
        for reason in res:
            self.assertIn("mismatch", reason)


if __name__ == "__main__":
    unittest.main()
