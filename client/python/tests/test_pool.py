# SPDX-License-Identifier: Apache-2.0
"""libregen's pool (client/pool.c) through regen.pool, against a real regend
(host backend): host chunks imported once each whatever the number of
allocations in them, GEMMs on pool memory by buffer id and offset, a chunk
closed in regend when its last allocation goes, imports made again after a
generation change, and hostile arguments refused.  The CUDA chunks need a
GPU: tests/gpu/test_regen_torch.py."""

import array
import errno
import ctypes
import os
import random
import socket
import sys
import threading
import unittest

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.dirname(HERE))
sys.path.insert(0, os.path.join(HERE, "..", "..", "..", "tests", "lib"))
import regen  # noqa: E402
from regen import reference  # noqa: E402
from regen.pool import Pool, PoolError  # noqa: E402
from regend_fixture import Regend, find_regend  # noqa: E402

MIB = 1 << 20
daemon = None
pool = None


def setUpModule():
    global daemon, pool
    if not find_regend():
        raise unittest.SkipTest("no regend (pass --regend or set REGEN_BUILD_ROOT)")
    pool = Pool.get()
    if pool is None:
        raise unittest.SkipTest("libregen not found, or REGEN_LIBREGEN=none (a sanitized build)")
    daemon = Regend(devices=1)
    pool.configure(daemon.socket, 4 * MIB)


def tearDownModule():
    if daemon is not None:
        daemon.stop()


def write_f32(ptr, values):
    data = array.array("f", values).tobytes()
    ctypes.memmove(ptr, data, len(data))


def read_f32(ptr, n):
    return array.array("f", ctypes.string_at(ptr, 4 * n)).tolist()


class PoolTest(unittest.TestCase):
    def setUp(self):
        self.c = regen.Client(daemon.socket, timeout=60)
        self.ptrs = []

    def tearDown(self):
        for p in self.ptrs:
            pool.free_host(p)
        self.c.close()

    def alloc(self, nbytes):
        p = pool.alloc_host(nbytes)
        self.ptrs.append(p)
        return p

    def free(self, p):
        self.ptrs.remove(p)
        pool.free_host(p)

    def operand(self, ptr, shape):
        ref = pool.lookup(ptr, host_device=0)
        return regen.Operand(ref.buffer, ref.offset, "f32", shape), ref

    def test_allocations_share_one_import_per_chunk(self):
        """Forty allocations in one 4 MiB chunk: one import, and GEMMs on
        all of them by offset are right."""
        before = pool.stats()
        n = 16
        rng = random.Random(1)
        ptrs = [self.alloc(n * n * 4) for _ in range(40)]
        refs = set()
        for p in ptrs:
            write_f32(p, [rng.uniform(-1, 1) for _ in range(n * n)])
        for i in range(0, 39, 3):
            (a, ra), (b, rb), (d, rd) = (self.operand(ptrs[i + j], [n, n]) for j in range(3))
            refs.update({ra.buffer, rb.buffer, rd.buffer})
            self.c.gemm(a, b, d)
            want = reference.gemm(read_f32(ptrs[i], n * n), read_f32(ptrs[i + 1], n * n), n, n, n)
            self.assertLessEqual(reference.rel_error(read_f32(ptrs[i + 2], n * n), want), 1e-5)
        after = pool.stats()
        self.assertEqual(len(refs), 1, f"one chunk, one buffer id: {refs}")
        self.assertEqual(after["imports"] - before["imports"], 1)
        self.assertEqual(after["import_calls"] - before["import_calls"], 1)
        self.assertEqual(after["chunks"] - before["chunks"], 1)

    def test_big_request_gets_its_own_chunk(self):
        small = self.alloc(1024)
        big = self.alloc(3 * MIB)
        rs, rb = pool.lookup(small, 0), pool.lookup(big, 0)
        self.assertNotEqual(rs.chunk, rb.chunk)
        self.assertEqual(rb.offset, 0)
        self.assertGreaterEqual(rb.chunk_size, 3 * MIB)
        self.assertLess(rb.chunk_size, 4 * MIB)

    def test_last_free_closes_the_chunk_in_regend(self):
        # One empty host chunk is kept: with a second one empty, the first
        # empty one goes.
        keep = self.alloc(MIB)
        self.free(keep)
        p = self.alloc(3 * MIB)   # a chunk of its own, never kept
        q = self.alloc(MIB)
        self.free(q)
        q = self.alloc(MIB)
        ref = pool.lookup(p, 0)
        pool.lookup(q, 0)
        imports = pool.stats()["imports"]
        epoch = pool.epoch()
        self.assertIsNotNone(epoch)
        self.free(q)
        self.assertEqual(pool.stats()["imports"], imports, "the empty host chunk stays")
        self.assertEqual(pool.epoch(), epoch, "no import closed: kept lookups still hold")
        self.free(p)
        self.assertEqual(pool.stats()["imports"], imports - 1, "the big chunk went")
        self.assertNotEqual(pool.epoch(), epoch, "an import closed: kept lookups must go")
        # regend has let the buffer go: closing it again is refused.
        with self.assertRaises(regen.NoSuchObject):
            self.c.close_buffer(ref.buffer)

    def test_freed_memory_is_reused(self):
        p = self.alloc(2 * MIB)
        self.free(p)
        used = pool.stats()["used_bytes"]
        for _ in range(200):
            x = self.alloc(MIB)
            self.free(x)
        s = pool.stats()
        self.assertEqual(s["used_bytes"], used)
        self.assertLessEqual(s["chunks"], 2)

    def test_new_generation_imports_again(self):
        p = self.alloc(64 * 64 * 4)
        write_f32(p, [1.0] * (64 * 64))
        old = pool.lookup(p, 0)
        reply = self.c.restart(0, reason="test_pool")
        gen = reply["devices"][0]["generation"]
        self.assertGreater(gen, old.generation)
        a = regen.Operand(old.buffer, old.offset, "f32", [64, 64])
        d = self.alloc(64 * 64 * 4)
        stale_d = regen.Operand(old.buffer, old.offset + 64 * 64 * 4, "f32", [64, 64])
        with self.assertRaises(regen.StaleGeneration) as cm:
            self.c.gemm(a, a, stale_d)
        epoch = pool.epoch()
        pool.note_generation(0, cm.exception.generation)
        self.assertNotEqual(pool.epoch(), epoch, "the old generation's imports are forgotten")
        new = pool.lookup(p, 0)
        self.assertNotEqual(new.buffer, old.buffer)
        self.assertEqual(new.generation, gen)
        a, _ = self.operand(p, [64, 64])
        dd, _ = self.operand(d, [64, 64])
        self.c.gemm(a, a, dd)
        self.assertEqual(set(read_f32(d, 64 * 64)), {64.0})

    def test_not_pool_memory(self):
        buf = ctypes.create_string_buffer(64)
        self.assertIsNone(pool.lookup(ctypes.addressof(buf), 0))
        pool.free_host(ctypes.addressof(buf))  # not ours: ignored
        pool.free_host(None)

    def test_hostile_arguments(self):
        p = self.alloc(4096)
        with self.assertRaises(PoolError):
            pool.lookup(p, host_device=-1)
        with self.assertRaises(PoolError):
            pool.configure(chunk_bytes=3)
        with self.assertRaises(PoolError):
            pool.map_device(-1, 0)
        with self.assertRaises(PoolError):
            pool.map_device(0, 100000)
        with self.assertRaises(PoolError) as cm:
            pool.lookup(self.alloc(MIB * 3), host_device=7)
        self.assertEqual(cm.exception.errno, errno.ENODEV)
        self.assertIsNotNone(pool.lookup(p, 0))
        with self.assertRaises(PoolError) as cm:
            pool.lookup(p, host_device=1)
        self.assertIn("imported into device 0", str(cm.exception))

    def break_the_pools_next_call(self):
        """Puts a socket of the test's own in place of the pool's connection
        to device 0's worker (dup2 onto its fd: libregen's client cannot tell)
        that takes the pool's next call and closes without an answer, as a
        connection that breaks with a call in flight. The real connection
        closes; this process keeps another one to the worker (self.c), so
        what it imported stays in regend. Returns the thread to join."""
        worker = self.c.device_info(0)["worker_socket"]
        self.c.call("io.regen.Device.Generation", {}, device=0)   # self.c's own connection
        theirs = []
        for name in os.listdir("/proc/self/fd"):
            try:
                s = socket.socket(fileno=os.dup(int(name)))
            except OSError:
                continue
            with s:
                try:
                    if s.family == socket.AF_UNIX and s.getpeername() == worker:
                        theirs.append(int(name))
                except OSError:
                    pass
        own = {self.c._workers[0].fileno()}
        pools = [fd for fd in theirs if fd not in own]
        self.assertEqual(len(pools), 1, f"the pool's connection among {theirs} (self.c's: {own})")
        ours, fake = socket.socketpair()
        os.dup2(ours.fileno(), pools[0])
        ours.close()

        def take_one_call_and_close():
            with fake:
                fake.settimeout(30)
                fake.recv(65536)
        t = threading.Thread(target=take_one_call_and_close)
        t.start()
        return t

    def test_a_close_that_got_no_answer_is_made_again(self):
        """A chunk freed while the pool's connection breaks with its close in
        flight: the import is held as unclosed (stats) and closed at the
        pool's next call to regend. It had been forgotten, and regend
        mapped it until this process's last connection to the worker
        closed."""
        p = self.alloc(3 * MIB)   # a chunk of its own: closed when freed
        ref = pool.lookup(p, 0)
        before = pool.stats()
        t = self.break_the_pools_next_call()
        self.free(p)
        t.join()
        self.assertEqual(pool.stats()["unclosed"], before["unclosed"] + 1, "the close got no answer")
        self.assertEqual(pool.stats()["imports"], before["imports"] - 1)
        q = self.alloc(3 * MIB)
        pool.lookup(q, 0)         # the pool's next call: the close is made again first
        self.assertEqual(pool.stats()["unclosed"], 0)
        with self.assertRaises(regen.NoSuchObject):
            self.c.close_buffer(ref.buffer)

    def test_an_import_that_got_no_answer_is_counted(self):
        """An import whose connection breaks before the answer may have been
        made under an id the pool never learns: counted (imports_unanswered),
        and the next lookup imports again."""
        pool.lookup(self.alloc(3 * MIB), 0)   # the pool's connection is up
        p = self.alloc(3 * MIB)
        before = pool.stats()
        t = self.break_the_pools_next_call()
        with self.assertRaises(regen.ConnectionReset):
            pool.lookup(p, 0)
        t.join()
        after = pool.stats()
        self.assertEqual(after["imports_unanswered"], before["imports_unanswered"] + 1)
        self.assertEqual(after["imports"], before["imports"])
        self.assertIsNotNone(pool.lookup(p, 0))
        self.assertEqual(pool.stats()["imports"], before["imports"] + 1)

    def test_no_cuda_here_says_why(self):
        why = pool.cuda_available()
        if why is None:
            self.skipTest("this machine has a usable CUDA driver")
        self.assertTrue(why)
        with self.assertRaises(PoolError) as cm:
            pool.alloc(MIB, 0)
        self.assertTrue(str(cm.exception))
        with self.assertRaises(PoolError):
            pool.address_range(0x1000)


    def test_process_allocator_bindings(self):
        """regen.pool's process allocator and trim, in a process of its own
        whose CUDA chunks are memfds ($REGEN_POOL_FAKE_CUDA, tests only):
        empty chunks are kept until a trim, and switching off trims."""
        import subprocess
        code = ("import sys; sys.path.insert(0, %r)\n"
                "from regen.pool import Pool\n"
                "p = Pool(%r)\n"
                "assert p.process_allocator_available() and not p.process_allocator\n"
                "p.configure(chunk_bytes=4 << 20)\n"
                "p.set_process_allocator(True)\n"
                "a = p.alloc(4096, 0); p.free(a)\n"
                "assert p.stats()['chunks'] == 1, p.stats()\n"
                "assert p.alloc(4096, 0) == a\n"
                "p.free(a); p.trim()\n"
                "assert p.stats()['chunks'] == 0, p.stats()\n"
                "b = p.alloc(4096, 1); p.free(b)\n"
                "p.set_process_allocator(False)\n"
                "assert p.stats()['chunks'] == 0 and not p.process_allocator, p.stats()\n"
                "print('ok')\n") % (os.path.dirname(HERE), pool.path)
        r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60,
                           env=dict(os.environ, REGEN_POOL_FAKE_CUDA="1"))
        self.assertEqual((r.returncode, r.stdout.strip()), (0, "ok"), r.stderr)


if __name__ == "__main__":
    unittest.main()
