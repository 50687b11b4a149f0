# SPDX-License-Identifier: Apache-2.0
"""Client pieces that need no daemon: error classes against the IDL, handle
normalisation, host dtype conversions, operand wire form, the references."""

import errno
import math
import os
import re
import resource
import signal
import socket
import sys
import tempfile
import unittest

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.dirname(HERE))
import regen  # noqa: E402
from regen import errors, host, reference, varlink  # noqa: E402
import tensor_glue  # noqa: E402

IDL_DIR = os.path.join(HERE, "..", "..", "..", "proto", "idl")


class ErrorClasses(unittest.TestCase):
    def test_every_idl_error_has_its_class(self):
        """Each error declared in proto/idl maps to a class of that name."""
        found = 0
        for fname in sorted(os.listdir(IDL_DIR)):
            if not fname.endswith(".varlink"):
                continue
            with open(os.path.join(IDL_DIR, fname)) as f:
                text = f.read()
            iface = re.search(r"^interface\s+(\S+)", text, re.M).group(1)
            for name in re.findall(r"^error\s+(\w+)", text, re.M):
                with self.subTest(error=f"{iface}.{name}"):
                    e = errors.error_from_reply(f"{iface}.{name}", {"message": "m"})
                    self.assertEqual(type(e).__name__, name)
                    self.assertIsInstance(e, regen.Error)
                    self.assertEqual(e.name, f"{iface}.{name}")
                found += 1
        self.assertGreater(found, 15)

    def test_parameters_become_attributes(self):
        e = errors.error_from_reply("io.regen.StaleGeneration",
                                    {"device": 1, "generation": 7, "message": "import again"})
        self.assertIsInstance(e, regen.StaleGeneration)
        self.assertEqual((e.device, e.generation, e.message), (1, 7, "import again"))
        self.assertEqual(e.parameters["generation"], 7)
        self.assertIn("io.regen.StaleGeneration", str(e))

    def test_unknown_name_is_plain_error(self):
        e = errors.error_from_reply("com.example.Odd", {"x": 1})
        self.assertIs(type(e), regen.Error)
        self.assertEqual(e.name, "com.example.Odd")
        self.assertEqual(e.x, 1)

    def test_parameters_do_not_shadow(self):
        e = errors.error_from_reply("io.regen.InvalidOperand", {"name": "evil", "parameters": 3, "args": 1})
        self.assertEqual(e.name, "io.regen.InvalidOperand")
        self.assertEqual(e.parameters["name"], "evil")

    def test_names_agree_with_libregen(self):
        """The wire names are libregen's REGEN_ERROR_* (client/include/regen.h),
        both ways: the C and the Python client know the same errors."""
        with open(os.path.join(HERE, "..", "..", "include", "regen.h")) as f:
            defines = dict(re.findall(r'^#define (REGEN_ERROR_\w+)\s+"([^"]+)"', f.read(), re.M))
        self.assertGreater(len(defines), 15)
        for macro, name in defines.items():
            with self.subTest(error=name):
                self.assertIn(name, errors._by_name, f"{macro} has no class")
                self.assertEqual(errors._by_name[name].name, name)
        self.assertEqual(set(errors._by_name), set(defines.values()))

    def test_connection_errors_are_connection_errors(self):
        self.assertTrue(issubclass(regen.ConnectionReset, ConnectionError))
        self.assertTrue(issubclass(regen.Unavailable, ConnectionError))
        self.assertTrue(issubclass(regen.ConnectionReset, regen.Error))


class IpcHandles(unittest.TestCase):
    raw = bytes(range(64))

    def test_raw_64_bytes(self):
        self.assertEqual(regen.normalize_ipc_handle(self.raw), self.raw.hex())

    def test_torch_versioned_handle(self):
        for version in (2, 3):
            self.assertEqual(regen.normalize_ipc_handle(bytes([version]) + b"c" + self.raw), self.raw.hex())

    def test_hex_passes_through(self):
        self.assertEqual(regen.normalize_ipc_handle(self.raw.hex().upper()), self.raw.hex())

    def test_expandable_segment_refused_with_advice(self):
        with self.assertRaisesRegex(ValueError, "expandable_segments"):
            regen.normalize_ipc_handle(b"\x02e" + bytes(100))

    def test_bad_lengths(self):
        for bad in (b"", bytes(63), "ab" * 63):
            with self.subTest(n=len(bad)), self.assertRaises(ValueError):
                regen.normalize_ipc_handle(bad)


class HostTypes(unittest.TestCase):
    def test_exact_values_round_trip(self):
        vals = [0.0, 1.0, -2.5, 0.125, 1024.0, -0.0]
        for dt in ("f32", "f16", "bf16"):
            with self.subTest(dtype=dt):
                self.assertEqual(host.unpack(dt, host.pack(dt, vals)), vals)

    def test_rounding(self):
        # 1 + 2^-8 is a tie between bf16 neighbours 1 and 1 + 2^-7: even wins.
        self.assertEqual(host.unpack("bf16", host.pack("bf16", [1 + 2 ** -8])), [1.0])
        self.assertEqual(host.unpack("bf16", host.pack("bf16", [1 + 3 * 2 ** -8])), [1 + 2 ** -6])
        self.assertEqual(host.unpack("f16", host.pack("f16", [1 + 2 ** -11])), [1.0])

    def test_f16_overflow_is_an_infinity(self):
        """A value past f16's largest (65504; from 65520 on it rounds past
        it) packs as an infinity of its sign, as IEEE rounding and torch's
        .half() make it (struct raised OverflowError); bf16 and f32 did
        already."""
        inf = float("inf")
        got = host.unpack("f16", host.pack("f16", [1e6, -1e6, 65519.0, 65520.0, -65520.0, 1e300, inf, 2.5]))
        self.assertEqual(got, [inf, -inf, 65504.0, inf, -inf, inf, inf, 2.5])
        self.assertTrue(math.isnan(host.unpack("f16", host.pack("f16", [1e6, float("nan")]))[1]))
        for dt in ("bf16", "f32"):
            self.assertEqual(host.unpack(dt, host.pack(dt, [1e300, -1e300])), [inf, -inf], dt)

    def test_tensor_memfd(self):
        t = host.HostTensor([3, 5], "bf16")
        self.assertEqual(t.nbytes, 30)
        t.write([float(i) for i in range(15)])
        self.assertEqual(t.read(), [float(i) for i in range(15)])
        t.close()

    def test_short_reads_and_writes_go_on(self):
        """One read or write moves at most 2 GiB less a page on Linux: a
        tensor larger than that is read and written by as many as it takes
        (one had been taken for the whole: past 2 GiB, write() left the rest
        as it was and read() returned fewer values).  The kernel's limit
        is brought down to 4 KiB here."""
        t = host.HostTensor([5000], "f32")
        self.addCleanup(t.close)
        values = [float(i) for i in range(5000)]
        real_pwrite, real_preadv, real_pread = os.pwrite, os.preadv, os.pread
        os.pwrite = lambda fd, data, offset: real_pwrite(fd, memoryview(data)[:4096], offset)
        os.preadv = lambda fd, buffers, offset: real_preadv(fd, [memoryview(buffers[0])[:4096]], offset)
        os.pread = lambda fd, n, offset: real_pread(fd, min(n, 4096), offset)
        try:
            t.write(values)
            got = t.read()
        finally:
            os.pwrite, os.preadv, os.pread = real_pwrite, real_preadv, real_pread
        self.assertEqual(got, values)

    def test_a_write_cut_short_for_good_raises(self):
        """A write the kernel cuts short, here at RLIMIT_FSIZE, and the rest
        refused: the error comes out (the short write had been taken for
        the whole, the tensor's tail left as it was)."""
        t = host.HostTensor([4096], "f32")
        self.addCleanup(t.close)
        limit = resource.getrlimit(resource.RLIMIT_FSIZE)
        if limit[1] != resource.RLIM_INFINITY and limit[1] < 8192:
            self.skipTest(f"RLIMIT_FSIZE's hard limit is {limit[1]}")
        handler = signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
        try:
            resource.setrlimit(resource.RLIMIT_FSIZE, (8192, limit[1]))
            with self.assertRaises(OSError) as cm:
                t.write([1.0] * 4096)
        finally:
            resource.setrlimit(resource.RLIMIT_FSIZE, limit)
            signal.signal(signal.SIGXFSZ, handler)
        self.assertEqual(cm.exception.errno, errno.EFBIG)

    def test_a_read_cut_short_raises(self):
        """A memfd that ends before the tensor does (cut down after it was
        made): read() says so (it had returned fewer values)."""
        t = host.HostTensor([1000], "f32")
        self.addCleanup(t.close)
        os.ftruncate(t.fd, 2000)
        with self.assertRaisesRegex(EOFError, "ends at byte 2000, before the 4000 bytes"):
            t.read()


class VarlinkSends(unittest.TestCase):
    def test_a_send_the_timeout_cuts_short_closes_the_connection(self):
        """A peer that does not read, and a call larger than the socket
        holds: the timeout passes with part of it sent.  The connection is
        closed and ConnectionReset says how much went (the bare timeout came
        out with the connection left open, and the next call sent on it
        would have been read as the rest of this one)."""
        with tempfile.TemporaryDirectory() as d:
            path = os.path.join(d, "peer.sock")
            with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as srv:
                srv.bind(path)
                srv.listen(1)
                conn = varlink.Connection(path, timeout=0.2)
                peer, _ = srv.accept()
                with peer:
                    with self.assertRaises(regen.ConnectionReset) as cm:
                        conn.send("io.regen.Test.Big", {"text": "x" * (900 << 10)})
                    self.assertTrue(conn.closed)
                    self.assertRegex(str(cm.exception), r"timed out with [1-9][0-9]* of [0-9]+ bytes sent")
                    peer.settimeout(10)
                    got = bytearray()
                    while True:
                        chunk = peer.recv(1 << 16)
                        if not chunk:
                            break
                        got += chunk
                    self.assertGreater(len(got), 0)
                    self.assertNotIn(b"\0", got, "a message ended after the cut")


class Operands(unittest.TestCase):
    def test_wire_form(self):
        op = regen.Operand("b1.4.2", 64, "bf16", [8, 16])
        self.assertEqual(op.to_wire(), {"buffer": "b1.4.2", "offset": 64, "dtype": "bf16", "shape": [8, 16]})
        self.assertEqual(op.device, 1)
        t = op.transposed()
        self.assertEqual((t.shape, t.strides), ([16, 8], [1, 16]))

    def test_bad_dtype(self):
        # f64 is a communicator's dtype (and a program's); fp8's names are
        # compute calls'; a name no op takes is refused here.
        self.assertEqual(regen.Operand("b0.1.1", 0, "f64", [1]).dtype, "f64")
        with self.assertRaises(ValueError):
            regen.Operand("b0.1.1", 0, "c64", [1])

    def test_default_socket(self):
        old = os.environ.pop("REGEN_SOCKET", None)
        try:
            self.assertEqual(regen.Client().socket_path, "/run/regen/regend.sock")
            os.environ["REGEN_SOCKET"] = "/tmp/elsewhere.sock"
            self.assertEqual(regen.Client().socket_path, "/tmp/elsewhere.sock")
            self.assertEqual(regen.Client("/x.sock").socket_path, "/x.sock")
        finally:
            os.environ.pop("REGEN_SOCKET", None)
            if old is not None:
                os.environ["REGEN_SOCKET"] = old

    def test_unreachable_socket(self):
        with self.assertRaises(regen.Unavailable):
            regen.Client("/nonexistent/regend.sock").status()


class References(unittest.TestCase):
    def test_gemm_identity_and_transposes(self):
        a = [1.0, 2.0, 3.0, 4.0, 5.0, 6.0]          # [2, 3]
        eye = [1.0, 0, 0, 0, 1.0, 0, 0, 0, 1.0]
        self.assertEqual(reference.gemm(a, eye, 2, 3, 3), a)
        at = [1.0, 4.0, 2.0, 5.0, 3.0, 6.0]         # [3, 2] = a^T
        self.assertEqual(reference.gemm(at, eye, 2, 3, 3, trans_a=True), a)

    def test_attention_uniform(self):
        # Equal scores: o is the mean of v; lse = log(S).
        import math
        q = [0.0] * 4
        k = [1.0] * 8
        v = [0.0, 1.0, 2.0, 3.0, 4.0, 5.0, 6.0, 7.0]
        o, lse = reference.attention(q, k, v, 1, 1, 1, 4, 4, 2)
        self.assertEqual(o, [3.0, 4.0])
        self.assertAlmostEqual(lse[0], math.log(4))

    def test_layer_norm_known_row(self):
        # [1, 2, 3, 4]: mean 2.5, biased variance 1.25.
        import math
        y, mean, rstd = reference.layer_norm([1.0, 2.0, 3.0, 4.0], [2.0] * 4, 1, 4, bias=[1.0] * 4, eps=0.0)
        self.assertEqual(mean, [2.5])
        self.assertAlmostEqual(rstd[0], 1 / math.sqrt(1.25))
        for got, x in zip(y, [1.0, 2.0, 3.0, 4.0]):
            self.assertAlmostEqual(got, (x - 2.5) / math.sqrt(1.25) * 2.0 + 1.0)

    def test_layer_norm_backward_is_the_forwards_gradient(self):
        # Central differences of L = sum(y * d_y) in every x, weight and bias.
        import random
        rng = random.Random(3)
        rows, n, eps, h = 2, 5, 0.1, 1e-6
        x = [rng.uniform(-2, 3) for _ in range(rows * n)]
        w, b = [rng.uniform(-1, 1) for _ in range(n)], [rng.uniform(-1, 1) for _ in range(n)]
        d_y, res = [rng.uniform(-1, 1) for _ in range(rows * n)], [rng.uniform(-1, 1) for _ in range(rows * n)]

        def loss(x, w, b):
            return sum(a * g for a, g in zip(reference.layer_norm(x, w, rows, n, b, eps)[0], d_y))

        _, mean, rstd = reference.layer_norm(x, w, rows, n, b, eps)
        d_x, d_w, d_b = reference.layer_norm_backward(d_y, x, w, mean, rstd, rows, n, res)
        for which, vec, grad in (("x", x, d_x), ("weight", w, d_w), ("bias", b, d_b)):
            for i in range(len(vec)):
                plus, minus = list(vec), list(vec)
                plus[i] += h
                minus[i] -= h
                fp = loss(*[plus if a is vec else a for a in (x, w, b)])
                fm = loss(*[minus if a is vec else a for a in (x, w, b)])
                fd = (fp - fm) / (2 * h) + (res[i] if which == "x" else 0.0)
                self.assertAlmostEqual(grad[i], fd, delta=1e-6, msg=f"d_{which}[{i}]")



class _FakeStorage:
    def __init__(self, ptr, nbytes):
        self.ptr, self.nbytes = ptr, nbytes
        self.shares = 0

    def data_ptr(self):
        return self.ptr

    def _share_cuda_(self):
        self.shares += 1
        # device, versioned handle, size, offset in the block, ref counter, its offset, event, sync
        return (0, b"\x02c" + bytes([self.ptr % 256]) * 64, self.nbytes, 512, b"/torch_rc", self.shares,
                b"", False)


class _FakeDevice:
    def __init__(self, index):
        self.index = index


class _FakeTensor:
    """Just enough of a torch CUDA tensor for the client's mapping."""

    def __init__(self, storage, shape, strides, dtype="torch.float32", offset=0, elem=4):
        self._storage, self.shape, self._strides = storage, tuple(shape), tuple(strides)
        self.dtype, self._offset, self._elem = dtype, offset, elem
        self.is_cuda = True
        self.device = _FakeDevice(0)

    def untyped_storage(self):
        return self._storage

    def get_device(self):
        return self.device.index

    def stride(self, dim=None):
        return self._strides if dim is None else self._strides[dim]

    def dim(self):
        return len(self.shape)

    def t(self):
        return _FakeTensor(self._storage, self.shape[::-1], self._strides[::-1], self.dtype, self._offset, self._elem)

    def storage_offset(self):
        return self._offset

    def element_size(self):
        return self._elem

    def data_ptr(self):
        return self._storage.data_ptr() + self._offset * self._elem


class TensorMapping(unittest.TestCase):
    """import_tensor and tensor operands, with the sockets replaced by a log."""

    def setUp(self):
        client_mod = tensor_glue.load()
        self.mod = client_mod
        self.saved = (client_mod._sync_torch, client_mod.release_ipc_counter, client_mod._is_torch_tensor)
        self.released = []
        client_mod._sync_torch = lambda tensors: None
        client_mod._is_torch_tensor = lambda x: isinstance(x, _FakeTensor)
        client_mod.release_ipc_counter = lambda h, o: self.released.append((h, o))
        # What goes on the wire as Varlink calls (the ring's records are
        # test_ring.py's).
        self.c = regen.Client("/nonexistent.sock", transport="varlink")
        self.calls = []
        self.serial = 0
        self.gen = 1

        def worker_call(device, method, params, fds=()):
            self.calls.append((method, params))
            if method == "io.regen.Memory.ImportBuffer":
                self.serial += 1
                return {"buffer": f"b{device}.{self.gen}.{self.serial}", "generation": self.gen,
                        "size": params["size"]}
            if method == "io.regen.Memory.CloseBuffer":
                return {}
            return {"elapsed_us": 5}

        self.c._worker_call = worker_call

    def tearDown(self):
        self.mod._sync_torch, self.mod.release_ipc_counter, self.mod._is_torch_tensor = self.saved

    def test_import_tensor_once_per_storage(self):
        st = _FakeStorage(0x1000, 4096)
        x = _FakeTensor(st, [16, 16], [16, 1])
        buf = self.c.import_tensor(x)
        self.assertIs(self.c.import_tensor(_FakeTensor(st, [4, 4], [4, 1], offset=8)), buf)
        self.assertEqual(st.shares, 1)
        method, params = self.calls[0]
        self.assertEqual(params, {"device": 0, "kind": "cuda_ipc", "size": 4096, "offset": 512,
                                  "handle": "00" * 64})
        self.assertIs(buf.keepalive, x)

    def test_gemm_operands_from_tensors(self):
        st_a, st_b, st_d = _FakeStorage(0x1000, 4096), _FakeStorage(0x2000, 4096), _FakeStorage(0x3000, 4096)
        a = _FakeTensor(st_a, [8, 4], [4, 1], offset=16)      # view 16 elements in
        b_store = _FakeTensor(st_b, [6, 4], [4, 1])           # B^T stored row-major
        d = _FakeTensor(st_d, [8, 6], [6, 1])
        self.c.gemm(a, b_store.t(), d)                        # a @ (b_store^T)
        method, params = self.calls[-1]
        self.assertEqual(method, "io.regen.Compute.Gemm")
        self.assertEqual(params["a"]["offset"], 64)
        self.assertEqual(params["a"]["strides"], [4, 1])
        self.assertEqual(params["b"]["shape"], [6, 4])
        self.assertEqual(params["b"]["strides"], [4, 1])
        self.assertTrue(params["trans_b"])
        self.assertFalse(params["trans_a"])
        self.assertEqual(params["d"]["dtype"], "f32")

    def test_generation_change_drops_and_releases(self):
        st = _FakeStorage(0x1000, 4096)
        x = _FakeTensor(st, [16, 16], [16, 1])
        buf = self.c.import_tensor(x)
        self.c._note_generation(0, 2)
        self.assertIsNone(buf.keepalive)
        self.assertEqual(self.released, [(b"/torch_rc", 1)])
        self.gen = 2
        again = self.c.import_tensor(x)
        self.assertIsNot(again, buf)
        self.assertEqual(again.generation, 2)
        self.c.close_buffer(again)
        self.assertEqual(self.released, [(b"/torch_rc", 1), (b"/torch_rc", 2)])
        self.assertIsNone(again.keepalive)

    def test_a_failed_import_lets_its_counter_go_only_when_nothing_was_mapped(self):
        """Refused (ImportFailed), the import mapped nothing: torch's IPC
        counter goes at once, or the storage would wait in torch's limbo
        for ever.  Its answer lost (ConnectionReset), the worker may map the
        memory: the counter is held until the device's generation changes
        (it had gone at once, so torch could reuse memory the worker maps)."""
        x = _FakeTensor(_FakeStorage(0x1000, 4096), [16, 16], [16, 1])
        inner = self.c._worker_call

        def failing(exc):
            def call(device, method, params, fds=()):
                if method == "io.regen.Memory.ImportBuffer":
                    raise exc
                return inner(device, method, params, fds)
            return call

        self.c._note_generation(0, 1)
        self.c._worker_call = failing(errors.error_from_reply("io.regen.ImportFailed", {"kind": "cuda_ipc"}))
        with self.assertRaises(regen.ImportFailed):
            self.c.import_tensor(x)
        self.assertEqual(self.released, [(b"/torch_rc", 1)])
        self.c._worker_call = failing(regen.ConnectionReset(parameters={"message": "the worker went"}))
        with self.assertRaises(regen.ConnectionReset):
            self.c.import_tensor(x)
        self.c._note_generation(0, 1)
        self.assertEqual(self.released, [(b"/torch_rc", 1)], "let go while the worker may map the memory")
        self.c._note_generation(0, 2)
        self.assertEqual(self.released, [(b"/torch_rc", 1), (b"/torch_rc", 2)])

    def test_unsupported_dtype(self):
        x = _FakeTensor(_FakeStorage(0x1000, 64), [4, 4], [4, 1], dtype="torch.float64", elem=8)
        with self.assertRaises(TypeError):
            self.c.gemm(x, x, x)

    def test_auto_reimport_retries_once(self):
        self.c.auto_reimport = True
        st = _FakeStorage(0x1000, 4096)
        x = _FakeTensor(st, [8, 8], [8, 1])
        st2, st3 = _FakeStorage(0x2000, 4096), _FakeStorage(0x3000, 4096)
        y, z = _FakeTensor(st2, [8, 8], [8, 1]), _FakeTensor(st3, [8, 8], [8, 1])
        self.c.gemm(x, y, z)
        inner = self.c._worker_call
        failed = []

        def stale_once(device, method, params, fds=()):
            if method == "io.regen.Compute.Gemm" and not failed:
                failed.append(1)
                self.gen = 2
                self.c._note_generation(0, 2)
                raise regen.errors.error_from_reply("io.regen.StaleGeneration", {"device": 0, "generation": 2})
            return inner(device, method, params, fds)

        self.c._worker_call = stale_once
        self.assertEqual(self.c.gemm(x, y, z), 5)
        self.assertEqual(self.calls[-1][1]["a"]["buffer"].split(".")[1], "2")


class EventsAndFds(unittest.TestCase):
    """ImportEvent/CloseEvent, cuda_fd and wait/signal events on the wire,
    with the sockets replaced by a log."""

    def setUp(self):
        # What goes on the wire as Varlink calls (the ring's records are
        # test_ring.py's).
        self.c = regen.Client("/nonexistent.sock", transport="varlink")
        self.calls = []
        self.serial = 0

        def worker_call(device, method, params, fds=()):
            self.calls.append((device, method, params, list(fds)))
            self.serial += 1
            if method == "io.regen.Memory.ImportEvent":
                return {"event": f"e{device}.1.{self.serial}", "generation": 1}
            if method == "io.regen.Memory.ImportBuffer":
                return {"buffer": f"b{device}.1.{self.serial}", "generation": 1, "size": params["size"]}
            if method.startswith("io.regen.Memory.Close"):
                return {}
            return {"elapsed_us": 3}

        self.c._worker_call = worker_call

    def test_import_event_and_close(self):
        raw = bytes(range(64))
        ev = self.c.import_event(1, raw)
        self.assertIsInstance(ev, regen.Event)
        self.assertEqual((ev.id, ev.device, ev.generation, str(ev)), ("e1.1.1", 1, 1, "e1.1.1"))
        self.assertEqual(self.calls[-1][1:3], ("io.regen.Memory.ImportEvent", {"device": 1, "handle": raw.hex()}))
        # Hex in either case is taken as the same handle.
        self.c.import_event(1, raw.hex().upper())
        self.assertEqual(self.calls[-1][2]["handle"], raw.hex())
        self.c.close_event(ev)
        self.assertEqual(self.calls[-1][:3], (1, "io.regen.Memory.CloseEvent", {"event": "e1.1.1"}))
        self.assertTrue(ev.closed)
        # An id string works as well, and names its device.
        self.c.close_event("e0.1.9")
        self.assertEqual(self.calls[-1][:3], (0, "io.regen.Memory.CloseEvent", {"event": "e0.1.9"}))

    def test_bad_event_handles_are_refused_here(self):
        for bad in (bytes(63), bytes(65), "zz" * 64, "ab" * 63, "0x" + "ab" * 63):
            with self.subTest(handle=bad), self.assertRaisesRegex(ValueError, "cudaIpcEventHandle_t"):
                self.c.import_event(0, bad)
        self.assertEqual(self.calls, [])

    def test_generation_change_forgets_events(self):
        ev = self.c.import_event(0, bytes(64))
        self.c._note_generation(0, 2)
        self.assertNotIn(ev.id, self.c._events)

    def test_cuda_fd(self):
        fd = os.memfd_create("regen-test")
        try:
            buf = self.c.import_cuda_fd(0, fd, 8192, offset=4096)
        finally:
            os.close(fd)
        device, method, params, fds = self.calls[-1]
        self.assertEqual(method, "io.regen.Memory.ImportBuffer")
        self.assertEqual(params, {"device": 0, "kind": "cuda_fd", "size": 8192, "fd": 0, "offset": 4096})
        self.assertEqual(fds, [fd])
        self.assertEqual((buf.kind, buf.size), ("cuda_fd", 8192))

    def test_compute_calls_carry_events(self):
        wait, signal = self.c.import_event(0, bytes(64)), self.c.import_event(0, bytes([1]) * 64)
        op = regen.Operand("b0.1.7", 0, "f32", [4, 4])
        q = regen.Operand("b0.1.7", 0, "f32", [1, 1, 4, 4])
        self.c.gemm(op, op, op, wait_event=wait, signal_event=signal)
        self.assertEqual((self.calls[-1][2]["wait_event"], self.calls[-1][2]["signal_event"]), (wait.id, signal.id))
        self.c.attention(q, q, q, q, signal_event=signal.id)
        self.assertNotIn("wait_event", self.calls[-1][2])
        self.assertEqual(self.calls[-1][2]["signal_event"], signal.id)
        self.c.attention_backward(q, q, q, q, q, regen.Operand("b0.1.7", 0, "f32", [1, 1, 4]), q, q, q,
                                  wait_event=wait)
        self.assertEqual(self.calls[-1][1], "io.regen.Compute.AttentionBackward")
        self.assertEqual(self.calls[-1][2]["wait_event"], wait.id)
        self.assertNotIn("signal_event", self.calls[-1][2])
        vec = regen.Operand("b0.1.7", 0, "f32", [4])
        self.c.layer_norm(op, vec, op, rstd=vec, eps=0.01, signal_event=signal, deadline_ms=50)
        self.assertEqual(self.calls[-1][1], "io.regen.Compute.LayerNorm")
        self.assertEqual({k: v for k, v in self.calls[-1][2].items() if k not in ("x", "weight", "y", "rstd")},
                         {"eps": 0.01, "signal_event": signal.id, "deadline_ms": 50})
        self.c.layer_norm_backward(op, op, vec, vec, vec, op, d_residual=op, wait_event=wait)
        self.assertEqual(self.calls[-1][1], "io.regen.Compute.LayerNormBackward")
        self.assertEqual(sorted(self.calls[-1][2]),
                         ["d_residual", "d_x", "d_y", "mean", "rstd", "wait_event", "weight", "x"])
        with self.assertRaises(ValueError):
            self.c.layer_norm(op, vec, op, eps=float("nan"))
        # Scalars JSON cannot say are refused before either transport,
        # alike; nothing is sent.
        sent = len(self.calls)
        for bad in (float("nan"), float("inf"), float("-inf")):
            for call in (lambda: self.c.gemm(op, op, op, alpha=bad), lambda: self.c.gemm(op, op, op, beta=bad),
                         lambda: self.c.attention(q, q, q, q, scale=bad)):
                with self.assertRaises(ValueError):
                    call()
        self.assertEqual(len(self.calls), sent)


if __name__ == "__main__":
    unittest.main()
