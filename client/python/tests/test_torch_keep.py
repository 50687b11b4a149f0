# SPDX-License-Identifier: Apache-2.0
"""regen.torch.keep() and restore() on the CPU and regend's host backend:
a rank SIGKILLed after a commit, or after its backward and before
opt.step(), resumes in a new process from what regend kept (parameters,
a buffer, Adam's moments and its step, no copy: the tensors are views of
the memory taken back) and ends bit-identical to a rank never killed.  The
rank is keep_torch_rank.py, a real second process.  Skips without torch
(meson's python-torch-keep runs it under a Python that has it)."""

import os
import signal
import subprocess
import sys
import tempfile
import unittest

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.dirname(HERE))
sys.path.insert(0, os.path.join(HERE, "..", "..", "..", "tests", "lib"))

from regend_fixture import TIME_SCALE, Regend, find_regend  # noqa: E402

try:
    import torch
except ImportError:
    torch = None

daemon = None


def setUpModule():
    global daemon
    if torch is None:
        raise unittest.SkipTest("no torch")
    from regen.pool import Pool
    pool = Pool.get()
    if pool is None or not pool.keep_available():
        raise unittest.SkipTest("no libregen with kept state")
    if not find_regend():
        raise unittest.SkipTest("no regend (pass --regend or set REGEN_BUILD_ROOT)")
    daemon = Regend(devices=1)


def tearDownModule():
    if daemon is not None:
        daemon.stop()


class TorchKeepTest(unittest.TestCase):
    STEPS = 12

    def rank(self, job, out, *extra):
        p = subprocess.run([sys.executable, os.path.join(HERE, "keep_torch_rank.py"), daemon.socket, job,
                            str(self.STEPS), out] + list(extra), capture_output=True, text=True,
                           timeout=120 * TIME_SCALE)
        return p.returncode, p.stdout, p.stderr

    def test_a_killed_rank_resumes_bit_identical(self):
        with tempfile.TemporaryDirectory() as tmp:
            ref, run = os.path.join(tmp, "ref.pt"), os.path.join(tmp, "run.pt")
            code, out, err = self.rank("torch-ref", ref)
            self.assertEqual(code, 0, err)
            self.assertTrue(out.startswith("resume None ptrs_in_pool True"), out)
            # Killed after the commit of step 4, then after step 8's
            # backward, before its opt.step(); then to the end.
            code, out, err = self.rank("torch-run", run, "--die", "4", "after_commit")
            self.assertEqual(code, -signal.SIGKILL, err)
            code, out, err = self.rank("torch-run", run, "--die", "8", "before_step")
            self.assertEqual(code, -signal.SIGKILL, err)
            self.assertTrue(out.startswith("resume 4 ptrs_in_pool True"), f"{out} {err}")
            code, out, err = self.rank("torch-run", run)
            self.assertEqual(code, 0, err)
            self.assertTrue(out.startswith("resume 7 ptrs_in_pool True"), f"{out} {err}")
            a, b = torch.load(ref), torch.load(run)
            self.assertEqual(sorted(a), sorted(b))
            self.assertIn("s0.exp_avg", a)
            for k in a:
                self.assertTrue(torch.equal(a[k], b[k]), f"{k}: {a[k]} != {b[k]}")

    def test_nothing_kept_leaves_the_model_as_built(self):
        import regen.torch as rt
        rt.configure(socket=daemon.socket, host_device=0)
        model = torch.nn.Linear(4, 4)
        before = model.weight.detach().clone()
        self.assertIsNone(rt.restore(model, None, key=("never-kept", 0)))
        self.assertTrue(torch.equal(model.weight.detach(), before))
        # A model outside the pool cannot be kept: said, not half done.
        with self.assertRaises(Exception) as e:
            rt.keep(model, None, key=("never-kept", 0))
        self.assertIn("not in libregen's pool", str(e.exception))


class ExampleTest(unittest.TestCase):
    def test_the_kill_and_resume_example_runs(self):
        """client/python/examples/train_keep.py --demo, as its docstring
        says to run it (here on the CPU and the host backend)."""
        example = os.path.join(HERE, "..", "examples", "train_keep.py")
        # This checkout's regen, not one installed on the machine.
        env = dict(os.environ, REGEN_SOCKET=daemon.socket, PYTHONPATH=os.path.dirname(HERE))
        p = subprocess.run([sys.executable, example, "--demo", "--device", "cpu"], capture_output=True, text=True,
                           env=env, timeout=300 * TIME_SCALE)
        self.assertEqual(p.returncode, 0, p.stdout + p.stderr)
        self.assertIn("resumed at step", p.stdout)
        self.assertIn("final weights bit-identical", p.stdout)


if __name__ == "__main__":
    unittest.main()
