# SPDX-License-Identifier: Apache-2.0
"""What regen.torch rests on that needs no torch and no GPU: `import regen`
never imports torch (a poisoned torch on the path proves it), regen.torch
says it needs torch where torch is missing, and devices are matched by
UUID, then PCI bus id, so CUDA_VISIBLE_DEVICES may differ between a rank
and regend."""

import os
import subprocess
import sys
import tempfile
import unittest

HERE = os.path.dirname(os.path.abspath(__file__))
PKG = os.path.dirname(HERE)
sys.path.insert(0, PKG)
from regen import devmatch  # noqa: E402


def run_python(code, extra_path=()):
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(list(extra_path) + [PKG]))
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=60)


class ImportHygiene(unittest.TestCase):
    def test_import_regen_never_imports_torch(self):
        with tempfile.TemporaryDirectory() as tmp:
            os.mkdir(os.path.join(tmp, "torch"))
            with open(os.path.join(tmp, "torch", "__init__.py"), "w") as f:
                f.write("raise RuntimeError('torch was imported')\n")
            r = run_python("import sys, regen, regen.pool, regen.devmatch, regen.host, regen.reference\n"
                           "print('torch' in sys.modules)", [tmp])
            self.assertEqual(r.returncode, 0, r.stderr)
            self.assertEqual(r.stdout.strip(), "False")
            # regen.torch does import it: the poison fires.
            r = run_python("import regen.torch", [tmp])
            self.assertNotEqual(r.returncode, 0)
            self.assertIn("torch was imported", r.stderr)

    def test_regen_torch_without_torch_says_so(self):
        r = run_python("import sys\nsys.modules['torch'] = None\nimport regen.torch")
        self.assertNotEqual(r.returncode, 0)
        self.assertIn("ImportError", r.stderr)
        self.assertIn("regen.torch needs PyTorch", r.stderr)


UUID_A = "GPU-58a3b1d8-1c2e-4f5a-9b8c-0d1e2f3a4b5c"
UUID_B = "GPU-00112233-4455-6677-8899-aabbccddeeff"


def status_devices(*uuids_and_pcis):
    return [{"index": i, "health": {"uuid": u, "pci_bus_id": p}} for i, (u, p) in enumerate(uuids_and_pcis)]


class DeviceMatch(unittest.TestCase):
    def test_uuid_forms(self):
        want = "58a3b1d81c2e4f5a9b8c0d1e2f3a4b5c"
        for form in (UUID_A, UUID_A.upper(), UUID_A[4:], "{" + UUID_A[4:] + "}",
                     bytes.fromhex(want)):
            self.assertEqual(devmatch.normalize_uuid(form), want, form)

        class Props:   # torch's _CUuuid carries .bytes
            bytes = bytes.fromhex(want)
        self.assertEqual(devmatch.normalize_uuid(Props()), want)
        for bad in (None, "", "GPU-xyz", "HOST-0", b"short"):
            self.assertIsNone(devmatch.normalize_uuid(bad))

    def test_pci_forms(self):
        self.assertEqual(devmatch.normalize_pci("0000:1b:00.0"), (0, 0x1B, 0, 0))
        self.assertEqual(devmatch.normalize_pci("00000000:1B:00.0"), (0, 0x1B, 0, 0))
        self.assertEqual(devmatch.normalize_pci((0, 0x1B, 0)), (0, 0x1B, 0, 0))
        for bad in (None, "bus", "1b", (1, 2)):
            self.assertIsNone(devmatch.normalize_pci(bad))

    def test_by_uuid_when_indexes_differ(self):
        """The rank sees the GPU as its device 0 (CUDA_VISIBLE_DEVICES=1);
        regend serves it as device 1."""
        devices = status_devices((UUID_B, "0000:1b:00.0"), (UUID_A, "0000:2c:00.0"))
        self.assertEqual(devmatch.match(0, UUID_A[4:], (0, 0x2C, 0), devices), (1, "uuid"))

    def test_by_pci_without_uuid(self):
        devices = status_devices((UUID_B, "0000:1b:00.0"), (UUID_A, "0000:2c:00.0"))
        self.assertEqual(devmatch.match(0, None, (0, 0x2C, 0), devices), (1, "pci"))

    def test_same_index_when_regend_reports_nothing(self):
        devices = [{"index": 0}, {"index": 1}]
        self.assertEqual(devmatch.match(1, UUID_A, None, devices), (1, "index"))
        with self.assertRaises(LookupError):
            devmatch.match(3, UUID_A, None, devices)

    def test_no_match_is_an_error_not_a_guess(self):
        devices = status_devices((UUID_B, "0000:1b:00.0"))
        with self.assertRaises(LookupError):
            devmatch.match(0, UUID_A, (0, 0x2C, 0), devices)

    def test_host_backend_names_are_not_uuids(self):
        devices = [{"index": 0, "health": {"uuid": "HOST-0", "pci_bus_id": ""}}]
        self.assertEqual(devmatch.match(0, UUID_A, None, devices), (0, "index"))


if __name__ == "__main__":
    unittest.main()
