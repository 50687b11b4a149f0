#!/usr/bin/env python3
# SPDX-License-Identifier: Apache-2.0
"""Run the Python client's tests against a real regend (host backend).

    python3 client/python/tests/run.py --regend build-py/daemon/regend [-v] [unittest args]

Without --regend, the daemon is what tests/lib/regend_fixture.py finds:
$REGEND, or daemon/regend under $REGEN_BUILD_ROOT or <repo>/build. Exit 77
(skipped) when no regend can be found, or when a module named by
--require MODULE does not import (meson's python-torch test runs
test_torch_host.py that way, under a Python that has torch)."""

import os
import sys
import unittest

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
sys.path.insert(0, os.path.dirname(HERE))
sys.path.insert(0, os.path.join(HERE, "..", "..", "..", "tests", "lib"))

import regend_fixture  # noqa: E402


def main():
    argv = sys.argv[1:]
    if "--regend" in argv:
        i = argv.index("--regend")
        regend_fixture.REGEND = os.path.abspath(argv[i + 1])
        del argv[i:i + 2]
    while "--require" in argv:
        i = argv.index("--require")
        module = argv[i + 1]
        del argv[i:i + 2]
        try:
            __import__(module)
        except ImportError as e:
            print(f"{module} does not import under {sys.executable} ({e}); skipping", file=sys.stderr)
            return 77
    if not regend_fixture.find_regend():
        print("no regend: pass --regend PATH or set REGEN_BUILD_ROOT; skipping", file=sys.stderr)
        return 77
    prog = unittest.main(module=None, argv=[sys.argv[0], "discover", "-s", HERE, "-t", HERE, "-p", "test_*.py"]
                         + argv, exit=False)
    return 0 if prog.result.wasSuccessful() else 1


if __name__ == "__main__":
    sys.exit(main())
