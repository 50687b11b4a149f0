"""Client pieces that need no daemon: error classes against the IDL, handle
normalisation, host dtype conversions, operand wire form, the references."""

import os
import re
import sys
import unittest

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.dirname(HERE))
import regen  # noqa: E402
from regen import errors, host, reference  # noqa: E402

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

    def test_tensor_memfd(self):
        t = host.HostTensor([3, 5], "bf16")
        self.assertEqual(t.nbytes, 30)
        t.write([float(i) for i in range(15)])
        self.assertEqual(t.read(), [float(i) for i in range(15)])
        t.close()


class Operands(unittest.TestCase):
    def test_wire_form(self):
        op = regen.Operand("b1.4.2", 64, "bf16", [8, 16])
        self.assertEqual(op.to_wire(), {"buffer": "b1.4.2", "offset": 64, "dtype": "bf16", "shape": [8, 16]})
        self.assertEqual(op.device, 1)
        t = op.transposed()
        self.assertEqual((t.shape, t.strides), ([16, 8], [1, 16]))

    def test_bad_dtype(self):
        with self.assertRaises(ValueError):
            regen.Operand("b0.1.1", 0, "f64", [1])

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


if __name__ == "__main__":
    unittest.main()
