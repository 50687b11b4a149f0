# SPDX-License-Identifier: Apache-2.0
"""A client that reaches regend's sockets at another path than regend's own
(a pod that mounts /run/regen elsewhere): Status names the worker socket
as regend sees it, and the client finds it beside the main socket it used.
Here the socket directory is renamed after regend started, so the path
Status names is gone and only the relative one works."""

import os
import random
import sys
import unittest

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.dirname(HERE))
sys.path.insert(0, os.path.join(HERE, "..", "..", "..", "tests", "lib"))
import regen  # noqa: E402
from regen import reference  # noqa: E402
from regen.host import HostTensor  # noqa: E402
from regend_fixture import Regend, find_regend  # noqa: E402


class Relocated(unittest.TestCase):
    def test_worker_socket_beside_the_main_socket_used(self):
        if not find_regend():
            raise unittest.SkipTest("no regend")
        d = Regend(devices=1)
        moved = d.dir + "-elsewhere"
        os.rename(d.dir, moved)
        try:
            c = regen.Client(os.path.join(moved, "regend.sock"), timeout=30)
            reported = c.status()["devices"][0]["worker_socket"]
            self.assertFalse(os.path.exists(reported), "the reported path should be gone: %s" % reported)
            rng = random.Random(7)
            a, b = HostTensor.random([8, 8], "f32", rng), HostTensor.random([8, 8], "f32", rng)
            out = HostTensor([8, 8], "f32")
            for t in (a, b, out):
                t.import_into(c, 0)
            c.gemm(a.op, b.op, out.op)
            self.assertLessEqual(reference.rel_error(out.read(), reference.gemm(a.read(), b.read(), 8, 8, 8)), 1e-5)
            c.close()
            for t in (a, b, out):
                t.close()
        finally:
            os.rename(moved, d.dir)
            d.stop()


if __name__ == "__main__":
    unittest.main()
