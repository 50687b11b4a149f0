# SPDX-License-Identifier: Apache-2.0
"""regen/ops.py is proto's op tables as the C side defines them: generated
by the build (client/python/gen_ops.py from proto/ops.json, which
proto/op_table_json prints), the copy in the tree must be the build's, and
its fields are the C tables' field by field."""

import json
import os
import subprocess
import unittest

from regen import ops


def build_root():
    root = os.environ.get("REGEN_BUILD_ROOT")
    if not root or not os.path.isdir(root):
        raise unittest.SkipTest("no build tree (set REGEN_BUILD_ROOT)")
    return root


def c_tables():
    exe = os.path.join(build_root(), "proto", "op-table-json")
    if not os.access(exe, os.X_OK):
        raise unittest.SkipTest("no built proto/op-table-json")
    return json.loads(subprocess.run([exe], check=True, capture_output=True, text=True).stdout)


class OpTables(unittest.TestCase):
    def test_the_tree_holds_the_generated_file(self):
        generated = os.path.join(build_root(), "client", "python", "ops.py")
        if not os.path.exists(generated):
            raise unittest.SkipTest("the build did not generate client/python/ops.py")
        with open(generated, encoding="utf-8") as f:
            want = f.read()
        with open(ops.__file__, encoding="utf-8") as f:
            got = f.read()
        self.assertTrue(got == want, "%s is not what the build generated from the op tables (%s): run "
                        "`ninja -C <build> update-ops-py` and commit it" % (ops.__file__, generated))

    def test_the_python_table_is_the_c_table(self):
        c = c_tables()
        # The dtypes' codes ride beside the ops (a ring record's operand dtype).
        self.assertEqual(ops.DTYPE_CODES, c.pop("_dtypes"))
        self.assertEqual(ops.DTYPE_SIZES, c.pop("_dtype_sizes"))
        self.assertEqual(sorted(c), sorted(ops.OPS))
        for name, op in ops.OPS.items():
            with self.subTest(op=name):
                self.assertEqual(op.id, c[name]["id"])
                self.assertEqual(op.method, c[name]["method"])
                self.assertEqual([tuple(o) for o in op.operands],
                                 [(o["name"], o["output"], o["required"], o["rank"], tuple(o["dtypes"]))
                                  for o in c[name]["operands"]])
                self.assertEqual(list(op.scalars), [(s["name"], s["type"]) for s in c[name]["scalars"]])
                self.assertEqual(op.choices, {s["name"]: tuple(s["choices"]) for s in c[name]["scalars"]
                                              if "choices" in s})
                self.assertEqual([tuple(r) for r in op.ring],
                                 [(r["name"], r["field"], r["flag"]) for r in c[name]["ring"]])
        # Ring op ids are the table's positions: 0, 1, ... in order.
        self.assertEqual(sorted(op.id for op in ops.OPS.values()), list(range(len(ops.OPS))))

    def test_calls_are_checked_against_the_table(self):
        import regen
        client = regen.Client.__new__(regen.Client)
        with self.assertRaises(ValueError):
            client._compute("gemm", {"a": None, "b": None, "x": None}, {}, None, None)
        with self.assertRaises(ValueError):
            client._compute("attention", {"q": None, "k": None, "v": None}, {}, None, None)


if __name__ == "__main__":
    unittest.main()
