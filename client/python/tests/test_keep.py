# SPDX-License-Identifier: Apache-2.0
"""Kept state (io.regen.Keep) against a real regend (host backend): a rank
SIGKILLed at random points resumes from the memory regend kept and ends
bit-identical to a rank never killed; a Run submitted just before the kill
is applied whole; another uid cannot take the memory; the lease frees it;
a worker's respawn and release lose nothing; the limits hold.  The rank is
keep_trainer.py, a real second process, on $REGEN_TRANSPORT's transport."""

import ctypes
import fcntl
import mmap
import os
import random
import signal
import subprocess
import sys
import time
import unittest

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.dirname(HERE))
sys.path.insert(0, os.path.join(HERE, "..", "..", "..", "tests", "lib"))

import regen  # noqa: E402
from regen.keep import JOURNAL_HEADER_BYTES, journal_header  # noqa: E402
from regen.pool import Pool  # noqa: E402
from regend_fixture import TIME_SCALE, Regend, find_regend  # noqa: E402

import keep_trainer  # noqa: E402

daemon = None
MAX_KEPT = 40
# SIGKILLs of the rank in test_a_kill_at_any_point_resumes_bit_identical.
KILLS = 30
LEASE_MAX_MS = 60000


def setUpModule():
    global daemon
    if not find_regend():
        raise unittest.SkipTest("no regend (pass --regend or set REGEN_BUILD_ROOT)")
    daemon = Regend(devices=1, extra=["--socket-mode", "0666", "--keep-lease-ms", str(LEASE_MAX_MS),
                                      "--max-kept", str(MAX_KEPT), "--max-kept-gib", "1"])


def tearDownModule():
    if daemon is not None:
        daemon.stop()


def trainer(job, steps, *extra):
    return subprocess.Popen([sys.executable, os.path.join(HERE, "keep_trainer.py"), daemon.socket, job, str(steps)]
                            + list(extra), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def finish(proc, timeout=120):
    out, err = proc.communicate(timeout=timeout * TIME_SCALE)
    return proc.returncode, out, err


def memfd(size, data=b""):
    fd = os.memfd_create("kept", os.MFD_CLOEXEC | os.MFD_ALLOW_SEALING)
    os.ftruncate(fd, size)
    if data:
        os.pwrite(fd, data, 0)
    return fd


def supervisor_fds():
    return len(os.listdir(f"/proc/{daemon.pid}/fd"))


def wait_until(pred, timeout, what):
    until = time.monotonic() + timeout * TIME_SCALE
    while not pred():
        if time.monotonic() > until:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(0.02)


class KeepTest(unittest.TestCase):
    def setUp(self):
        self.c = regen.Client(daemon.socket, timeout=30)
        self.job = f"t{os.getpid()}-{self._testMethodName[-20:]}-{random.randrange(1 << 30)}"

    def tearDown(self):
        for job in {k["job"] for k in self.c.kept(uid=os.getuid())}:
            self.c.drop(job)
        self.c.close()

    def state(self, job):
        """The trainer's kept tensors, taken back: {name: bytes}, and the
        journal's header and the committed step."""
        out, step = {}, None
        for name in keep_trainer.tensor_names() + ["journal"]:
            kept, fd = self.c.take_back(keep_trainer.RANK, name, job=job)
            try:
                out[name] = os.pread(fd, kept["size"], 0)
            finally:
                os.close(fd)
            step = kept.get("step")
        return out, journal_header(out.pop("journal")[:JOURNAL_HEADER_BYTES]), step

    def assertSameState(self, a, b, what):
        for name in keep_trainer.tensor_names():
            if name.startswith("g"):
                continue   # the gradients of the last step, not state
            differ = sum(1 for i in range(0, len(a[name]), 4) if a[name][i:i + 4] != b[name][i:i + 4])
            self.assertEqual(differ, 0, f"{what}: {name}: {differ} elements differ")

    def test_a_kill_at_any_point_resumes_bit_identical(self):
        steps = 1500
        t0 = time.monotonic()
        proc = trainer(self.job + "-ref", steps)
        proc.stdout.readline()
        start_s = time.monotonic() - t0
        code, out, err = finish(proc)
        train_s = time.monotonic() - t0 - start_s
        self.assertEqual(code, 0, err)
        reference, header, committed = self.state(self.job + "-ref")
        self.assertEqual(header, ("done", steps))
        self.assertEqual(committed, steps)

        # A third of the kills come while the rank starts (connects, takes
        # back or makes its state), the rest at a random time within what
        # is left of a clean run's training (by the step committed last),
        # so in any part of a step. After KILLS of them, it runs to the end.
        rng = random.Random(self.job)
        kills, resumed_mid_training, ahead_of_commit = 0, 0, 0
        for attempt in range(KILLS + 20):
            done = max([k.get("step", 0) for k in self.c.kept(job=self.job)] or [0])
            proc = trainer(self.job, steps)
            first = ""
            if attempt < KILLS and attempt % 3 == 0:
                time.sleep(rng.uniform(0, start_s))
                proc.send_signal(signal.SIGKILL)
            elif attempt < KILLS:
                first = proc.stdout.readline()
                time.sleep(rng.uniform(0, 0.5 * train_s * (steps - done) / steps))
                proc.send_signal(signal.SIGKILL)
            code, out, err = finish(proc)
            words = (first or out).split("\n", 1)[0].split()
            if words and words[0] == "resume":
                start, committed = int(words[1]), words[3]
                if start > 1:
                    resumed_mid_training += 1
                # The step the journal says is done is past the last commit:
                # the Run was applied after (or just as) the rank died.
                if committed != "None" and start - 1 > int(committed):
                    ahead_of_commit += 1
            if code == 0:
                self.assertTrue(out.rstrip().endswith("done"), f"out {out!r}, err {err!r}")
                break
            self.assertEqual(code, -signal.SIGKILL, f"the trainer failed on its own: {err}")
            kills += 1
        else:
            self.fail(f"the trainer never finished in {KILLS + 20} starts ({kills} kills)")
        what = (f"{kills} kills, {resumed_mid_training} resumed mid-training, {ahead_of_commit} with the journal "
                f"ahead of the commit; a clean run starts in {start_s:.2f} s, trains in {train_s:.2f} s")
        print(f"\n{what}", file=sys.stderr)
        self.assertGreaterEqual(kills, 5, what)
        self.assertGreaterEqual(resumed_mid_training, 3, what)
        killed, header, committed = self.state(self.job)
        self.assertEqual(header, ("done", steps))
        self.assertEqual(committed, steps)
        self.assertSameState(reference, killed, what)

    def test_a_run_submitted_before_the_kill_is_applied_whole(self):
        """The rank queues step 7's Run and is SIGKILLed at once: regend
        applies the Run anyway (a Varlink call sent, or a ring record
        published, before the connection closed), so the journal says 7
        is done while the commit still says 6; the state is step 7's."""
        code, _, err = finish(trainer(self.job + "-ref", 7))
        self.assertEqual(code, 0, err)
        reference, _, _ = self.state(self.job + "-ref")
        code, out, err = finish(trainer(self.job, 20, "--die-after-submit", "7"))
        self.assertEqual(code, -signal.SIGKILL, err)
        # The lease keeps it; the Run finishes after the rank is gone.
        wait_until(lambda: self.state(self.job)[1] == ("done", 7), 10, "step 7's Run to be applied")
        killed, header, committed = self.state(self.job)
        self.assertEqual(committed, 6, "the commit after step 7 cannot have run")
        self.assertSameState(reference, killed, "step 7 submitted, then SIGKILL")
        # And the next start resumes at 8.
        proc = trainer(self.job, 8)
        code, out, err = finish(proc)
        self.assertEqual(code, 0, err)
        self.assertTrue(out.startswith("resume 8 committed 6 journal done 7"), f"out {out!r}, err {err!r}")

    def test_kept_memory_survives_a_worker_respawn_and_a_release(self):
        data = os.urandom(1 << 16)
        fd = memfd(len(data), data)
        self.c.keep(3, "weights", fd, job=self.job)
        os.close(fd)
        before = self.c.device_info(0)
        self.c.inject_fault(0, "crash")
        wait_until(lambda: self.c.device_info(0)["state"] == "ready" and
                   self.c.device_info(0)["worker_pid"] not in (0, before["worker_pid"]), 30, "the respawn")
        self.c.release(0, reason="test_keep")
        kept, fd = self.c.take_back(3, "weights", job=self.job)
        try:
            self.assertEqual(kept["size"], len(data))
            self.assertEqual(os.pread(fd, len(data), 0), data)
        finally:
            os.close(fd)

    def test_the_lease_frees_it(self):
        self.c.kept()   # the client's connection is open before the count
        base = supervisor_fds()
        pid = os.fork()
        if pid == 0:
            try:
                c = regen.Client(daemon.socket, timeout=10)
                c.keep(0, "short", memfd(4096, b"x"), job=self.job, lease_ms=400)
                c.keep(0, "other", memfd(4096, b"y"), job=self.job)
            finally:
                os._exit(0)
        os.waitpid(pid, 0)
        # The process is gone: its set waits, not held, until the lease ends.
        wait_until(lambda: all(not k["held"] for k in self.c.kept(job=self.job)), 5, "the holder to be seen gone")
        kept = self.c.kept(job=self.job)
        self.assertEqual(sorted(k["name"] for k in kept), ["other", "short"])
        self.assertTrue(all("expires_unix_ms" in k and k["lease_ms"] == LEASE_MAX_MS for k in kept),
                        "the set's lease is the last Keep's")
        # A take back during the lease holds it again, for this process.
        _, fd = self.c.take_back(0, "short", job=self.job)
        os.close(fd)
        kept = self.c.kept(job=self.job)
        self.assertTrue(all(k["held"] and k["holder_pid"] == os.getpid() for k in kept), kept)
        # Now a set whose lease is short, whose holder goes.
        pid = os.fork()
        if pid == 0:
            try:
                c = regen.Client(daemon.socket, timeout=10)
                c.keep(1, "short", memfd(4096, b"z"), job=self.job, lease_ms=300)
            finally:
                os._exit(0)
        os.waitpid(pid, 0)
        wait_until(lambda: any(k["rank"] == 1 for k in self.c.kept(job=self.job)), 5, "rank 1's set")
        t0 = time.monotonic()
        wait_until(lambda: not any(k["rank"] == 1 for k in self.c.kept(job=self.job)), 5, "the lease to end")
        self.assertGreater(time.monotonic() - t0, 0.1, "dropped before its lease ended")
        with self.assertRaises(regen.NoSuchObject):
            self.c.take_back(1, "short", job=self.job)
        self.c.drop(self.job)
        # Every fd regend held for them is closed: the memory is free.
        wait_until(lambda: supervisor_fds() <= base, 5, f"regend's fds back to {base}")

    def test_another_uid_cannot_take_it(self):
        if os.getuid() != 0:
            self.skipTest("needs root, to be uid nobody in a child")
        fd = memfd(4096, b"root's")
        self.c.keep(0, "w", fd, job=self.job)
        os.close(fd)
        r, w = os.pipe()
        pid = os.fork()
        if pid == 0:
            out = []
            try:
                os.close(r)
                os.setgid(65534)
                os.setgroups([])
                os.setuid(65534)
                c = regen.Client(daemon.socket, timeout=10)
                out.append(str(any(k["job"] == self.job and k["uid"] == 0 for k in c.kept())))   # visible
                for what, call in (("take_back", lambda: c.take_back(0, "w", job=self.job)),
                                   ("take_back uid 0", lambda: c.take_back(0, "w", job=self.job, uid=0)),
                                   ("drop uid 0", lambda: c.drop(self.job, uid=0)),
                                   ("commit", lambda: c.commit(0, 5, job=self.job))):
                    try:
                        call()
                        out.append(f"{what}: succeeded")
                    except regen.Error as e:
                        out.append(f"{what}: {type(e).__name__}")
                # Its own set under the same key is its own, beside root's.
                c.keep(0, "w", memfd(4096, b"nobody's"), job=self.job)
                kept, fd2 = c.take_back(0, "w", job=self.job)
                out.append(os.pread(fd2, 8, 0).rstrip(b"\0").decode())
                out.append(str(c.drop(self.job)["names"]))
            except Exception as e:  # noqa: BLE001 - reported to the parent
                out.append(f"error {e!r}")
            finally:
                os.write(w, "\n".join(out).encode())
                os._exit(0)
        os.close(w)
        got = b""
        while True:
            chunk = os.read(r, 4096)
            if not chunk:
                break
            got += chunk
        os.close(r)
        os.waitpid(pid, 0)
        self.assertEqual(got.decode().split("\n"), [
            "True", "take_back: NoSuchObject", "take_back uid 0: NotPermitted", "drop uid 0: NotPermitted",
            "commit: NoSuchObject", "nobody's", "1"])
        kept, fd = self.c.take_back(0, "w", job=self.job)
        self.assertEqual(os.pread(fd, 6, 0), b"root's")
        self.assertEqual(kept["uid"], 0)
        os.close(fd)
        # An admin (root) names another uid's set with `uid`: nobody
        # dropped its own, so there is none.
        with self.assertRaises(regen.NoSuchObject):
            self.c.take_back(0, "w", job=self.job, uid=65534)

    def test_limits_and_refusals_are_named(self):
        fd = memfd(4096)
        with self.assertRaises(regen.LimitExceeded) as e:
            self.c.keep(0, "w", fd, job=self.job, lease_ms=LEASE_MAX_MS + 1)
        self.assertEqual(e.exception.parameters["resource"], "lease_ms")
        with self.assertRaises(regen.ImportFailed) as e:
            self.c.keep(0, "w", fd, size=8192, job=self.job)
        self.assertIn("4096", e.exception.parameters["message"])
        rp, wp = os.pipe()
        with self.assertRaises(regen.ImportFailed):
            self.c.keep(0, "w", rp, size=4096, job=self.job)
        os.close(rp)
        os.close(wp)
        sealed = os.memfd_create("sealed", os.MFD_CLOEXEC | os.MFD_ALLOW_SEALING)
        os.ftruncate(sealed, 4096)
        fcntl.fcntl(sealed, fcntl.F_ADD_SEALS, fcntl.F_SEAL_SEAL)
        with self.assertRaises(regen.ImportFailed):
            self.c.keep(0, "w", sealed, job=self.job)
        os.close(sealed)
        with self.assertRaises(regen.ImportFailed) as e:
            self.c.keep(0, "w", fd, size=4096, kind="cuda_fd", device=0, job=self.job)
        self.assertIn("host backend", e.exception.parameters["message"])
        with self.assertRaises(regen.InvalidParameter):
            self.c.keep(0, "bad name!", fd, job=self.job)
        with self.assertRaises(regen.InvalidJob):
            self.c.keep(0, "w", fd)   # no job names this connection
        # max_kept_gib (1): a sparse memfd of 1 GiB holds nothing yet, and
        # counts whole.
        big = memfd(1 << 30)
        self.c.keep(0, "big", big, job=self.job)
        with self.assertRaises(regen.LimitExceeded) as e:
            self.c.keep(0, "w", fd, job=self.job)
        self.assertEqual(e.exception.parameters["resource"], "kept bytes")
        # Replacing a name counts it once.
        self.c.keep(0, "big", big, job=self.job)
        self.assertEqual(self.c.drop(self.job, 0, "big"), {"names": 1, "bytes": 1 << 30})
        os.close(big)
        for n in range(MAX_KEPT):
            self.c.keep(1, f"n{n}", fd, job=self.job)
        with self.assertRaises(regen.LimitExceeded) as e:
            self.c.keep(1, "one-more", fd, job=self.job)
        self.assertEqual(e.exception.parameters["resource"], "kept names")
        self.assertEqual(self.c.drop(self.job, 1)["names"], MAX_KEPT)
        os.close(fd)

    def test_status_lists_what_is_kept(self):
        fd = memfd(8192)
        self.c.keep(2, "w", fd, job=self.job)
        self.c.commit(2, 41, job=self.job)
        os.close(fd)
        mine = [k for k in self.c.status()["kept"] if k["job"] == self.job]
        self.assertEqual(len(mine), 1)
        self.assertEqual({k: mine[0][k] for k in ("rank", "name", "size", "step", "held", "kind", "uid")},
                         {"rank": 2, "name": "w", "size": 8192, "step": 41, "held": True, "kind": "host_fd",
                          "uid": os.getuid()})
        with self.assertRaises(regen.NoSuchObject):
            self.c.commit(3, 1, job=self.job)

    def test_pool_chunks_are_kept_and_adopted(self):
        pool = Pool.get()
        if pool is None or not pool.keep_available():
            self.skipTest("no libregen with kept state")
        r, w = os.pipe()
        pid = os.fork()
        if pid == 0:
            code = b"?"
            try:
                os.close(r)
                p = Pool.get()
                p.configure(daemon.socket)
                ptr = p.alloc_host(1000)
                ctypes.memmove(ptr, b"pool bytes", 10)
                where = p.chunk_of(ptr)
                p.keep(ptr, 4, "chunk", job=self.job)
                code = f"{where['offset']}".encode()
            finally:
                os.write(w, code)
                os.kill(os.getpid(), signal.SIGKILL)
        os.close(w)
        offset = int(os.read(r, 64))
        os.close(r)
        os.waitpid(pid, 0)
        kept, fd = self.c.take_back(4, "chunk", job=self.job)
        pool.configure(daemon.socket)
        base = pool.adopt(fd, kept["kind"], kept["size"])
        self.assertEqual(ctypes.string_at(base + offset, 10), b"pool bytes")
        self.assertEqual(pool.chunk_of(base + offset)["offset"], offset)
        ref = pool.lookup(base + offset, host_device=0)
        self.assertEqual(ref.offset, offset)


if __name__ == "__main__":
    unittest.main()
