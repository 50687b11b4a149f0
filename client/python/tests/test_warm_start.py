# SPDX-License-Identifier: Apache-2.0
"""regen.warm_start: a rank forked from a launcher that imported its
modules once, started again when it dies, stopped with the launcher.
Real processes and signals; no daemon, no torch (a probe module stands
for torch: it records each process that imports it)."""

import os
import signal
import subprocess
import sys
import tempfile
import textwrap
import time
import unittest

HERE = os.path.dirname(os.path.abspath(__file__))
PACKAGE_ROOT = os.path.dirname(HERE)
sys.path.insert(0, PACKAGE_ROOT)
from regen.warm_start import PreloadError, WarmStart  # noqa: E402

PROBE = """
import os
with open(os.environ["WS_PROBE_LOG"], "a") as f:
    f.write(f"{os.getpid()}\\n")
"""

# The rank: prints what it sees, then does what its first argument says.
RANK = """
import os, signal, sys, time
starts = int(os.environ["REGEN_WARM_START_STARTS"])
since = time.time() - float(os.environ["REGEN_WARM_START_T0"])
print(f"start {starts} pid {os.getpid()} probe {'ws_probe' in sys.modules} name {__name__} "
      f"since {since:.3f} argv {' '.join(sys.argv[1:])}", flush=True)
what = sys.argv[1]
if what == "die-twice" and starts < 2:
    os.kill(os.getpid(), signal.SIGKILL)
elif what == "exit":
    sys.exit(int(sys.argv[2]))
elif what == "raise":
    raise ValueError("the rank's own error")
elif what == "sleep":
    time.sleep(60)
elif what == "loud":
    sys.stderr.write("x" * 200000)
    print("y" * 200000, flush=True)
print("done", file=sys.stderr, flush=True)
"""


class WarmStartTest(unittest.TestCase):
    def setUp(self):
        self.dir = tempfile.TemporaryDirectory()
        d = self.dir.name
        with open(os.path.join(d, "ws_probe.py"), "w") as f:
            f.write(PROBE)
        self.script = os.path.join(d, "rank.py")
        with open(self.script, "w") as f:
            f.write(textwrap.dedent(RANK))
        self.log = os.path.join(d, "probe.log")
        self.env = dict(os.environ, WS_PROBE_LOG=self.log,
                        PYTHONPATH=os.pathsep.join([d, PACKAGE_ROOT, os.environ.get("PYTHONPATH", "")]))

    def tearDown(self):
        self.dir.cleanup()

    def launch(self, *args, restarts=3, **kw):
        return subprocess.Popen([sys.executable, "-m", "regen.warm_start", "--preload", "ws_probe",
                                 "--restarts", str(restarts), "--", self.script, *args], env=self.env,
                                stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, **kw)

    def importers(self):
        with open(self.log) as f:
            return [int(x) for x in f.read().split()]

    @staticmethod
    def starts(out):
        return [dict(zip(line.split()[0::2], line.split()[1::2])) for line in out.splitlines()
                if line.startswith("start ")]

    def test_a_killed_rank_starts_again_from_the_imports(self):
        p = self.launch("die-twice")
        out, err = p.communicate(timeout=60)
        self.assertEqual(p.returncode, 0, err)
        starts = self.starts(out)
        self.assertEqual([s["start"] for s in starts], ["0", "1", "2"])
        pids = {int(s["pid"]) for s in starts}
        self.assertEqual(len(pids), 3, "each start is a new process")
        self.assertNotIn(p.pid, pids)
        self.assertEqual(self.importers(), [p.pid], "the probe was imported once, by the launcher")
        for s in starts:
            self.assertEqual(s["probe"], "True")
            self.assertEqual(s["name"], "__main__")
            self.assertGreaterEqual(float(s["since"]), 0.0)
            self.assertLess(float(s["since"]), 5.0)
        self.assertEqual(err.count("ended (signal 9); starting it again"), 2, err)
        self.assertIn("done", err)

    def test_restarts_are_bounded_and_the_last_status_is_the_launchers(self):
        p = self.launch("exit", "5", restarts=1)
        out, err = p.communicate(timeout=60)
        self.assertEqual(p.returncode, 5)
        self.assertEqual(len(self.starts(out)), 2)
        self.assertIn("argv exit 5", out)

    def test_an_exception_ends_the_rank_as_python_would(self):
        p = self.launch("raise", restarts=0)
        out, err = p.communicate(timeout=60)
        self.assertEqual(p.returncode, 1)
        self.assertIn("ValueError: the rank's own error", err)
        self.assertEqual(len(self.starts(out)), 1)

    def test_sigterm_is_passed_on_and_ends_the_job(self):
        p = self.launch("sleep")
        line = p.stdout.readline()
        self.assertTrue(line.startswith("start 0"), line)
        p.send_signal(signal.SIGTERM)
        out, err = p.communicate(timeout=30)
        self.assertEqual(p.returncode, 128 + signal.SIGTERM)
        self.assertNotIn("starting it again", err)
        self.assertEqual(self.starts(out), [])

    def test_the_rank_dies_with_the_launcher(self):
        p = self.launch("sleep")
        rank = int(self.starts(p.stdout.readline())[0]["pid"])
        p.kill()
        p.communicate(timeout=30)
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline and os.path.exists(f"/proc/{rank}"):
            with open(f"/proc/{rank}/stat") as f:
                if f.read().split(") ")[1].startswith("Z"):
                    break
            time.sleep(0.05)
        gone = not os.path.exists(f"/proc/{rank}")
        if not gone:
            with open(f"/proc/{rank}/stat") as f:
                gone = f.read().split(") ")[1].startswith("Z")
        self.assertTrue(gone, f"rank {rank} outlived its launcher")

    def test_a_named_preload_must_import(self):
        p = subprocess.run([sys.executable, "-m", "regen.warm_start", "--preload", "ws_no_such_module", "--",
                            self.script, "exit", "0"], env=self.env, capture_output=True, text=True, timeout=60)
        self.assertEqual(p.returncode, 1)
        self.assertIn("preload", p.stderr)
        self.assertNotIn("start 0", p.stdout)

    def test_the_server_starts_ranks_on_pipes(self):
        with WarmStart(["ws_probe"], env=self.env) as ws:
            self.assertEqual(ws.preloaded, ["ws_probe"])
            a = ws.start([self.script, "exit", "3"])
            out, err = a.communicate(timeout=30)
            self.assertEqual(a.returncode, 3)
            self.assertIn("probe True", out)
            b = ws.start([self.script, "sleep"])
            self.assertTrue(b.stdout.readline().startswith("start 0"))
            b.kill()
            b.communicate(timeout=30)
            self.assertEqual(b.returncode, -signal.SIGKILL)
            c = ws.start([self.script, "ok"])
            out, err = c.communicate(timeout=30)
            self.assertEqual((c.returncode, err), (0, "done\n"))
            self.assertEqual(self.importers(), [ws._proc.pid])
            left = ws.start([self.script, "sleep"])
            self.assertTrue(left.stdout.readline().startswith("start 0"))
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline and os.path.exists(f"/proc/{left.pid}"):
            time.sleep(0.05)
        self.assertFalse(os.path.exists(f"/proc/{left.pid}"), "a start outlived the closed server")
        left.stdout.close()
        left.stderr.close()

    def test_a_start_that_fills_both_pipes_is_read_to_its_end(self):
        with WarmStart(["ws_probe"], env=self.env) as ws:
            s = ws.start([self.script, "loud"])
            out, err = s.communicate(timeout=30)
            self.assertEqual(s.returncode, 0)
            self.assertIn("y" * 200000, out)
            self.assertEqual(err.count("x"), 200000)

    def test_the_server_says_why_it_did_not_start(self):
        with self.assertRaises(PreloadError) as e:
            WarmStart(["ws_no_such_module"], env=self.env)
        self.assertIn("ws_no_such_module", str(e.exception))


if __name__ == "__main__":
    unittest.main()
