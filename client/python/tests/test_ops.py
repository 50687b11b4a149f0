# SPDX-License-Identifier: Apache-2.0
"""regen/ops.py is proto's op tables as the C side defines them: printed by
tests/unit/op_table_json of the build, compared here field by field."""

import json
import os
import subprocess
import unittest

from regen import ops


def c_tables():
    root = os.environ.get("REGEN_BUILD_ROOT")
    exe = os.path.join(root, "tests", "unit", "op_table_json") if root else None
    if not exe or not os.access(exe, os.X_OK):
        raise unittest.SkipTest("no built tests/unit/op_table_json (set REGEN_BUILD_ROOT)")
    return json.loads(subprocess.run([exe], check=True, capture_output=True, text=True).stdout)


class OpTables(unittest.TestCase):
    def test_the_python_table_is_the_c_table(self):
        c = c_tables()
        self.assertEqual(sorted(c), sorted(ops.OPS))
        for name, op in ops.OPS.items():
            with self.subTest(op=name):
                self.assertEqual(op.method, c[name]["method"])
                self.assertEqual([tuple(o) for o in op.operands],
                                 [(o["name"], o["output"], o["required"], o["rank"], tuple(o["dtypes"]))
                                  for o in c[name]["operands"]])
                self.assertEqual(list(op.scalars), [(s["name"], s["type"]) for s in c[name]["scalars"]])

    def test_calls_are_checked_against_the_table(self):
        import regen
        client = regen.Client.__new__(regen.Client)
        with self.assertRaises(ValueError):
            client._compute("gemm", {"a": None, "b": None, "x": None}, {}, None, None)
        with self.assertRaises(ValueError):
            client._compute("attention", {"q": None, "k": None, "v": None}, {}, None, None)


if __name__ == "__main__":
    unittest.main()
