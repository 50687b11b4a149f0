# SPDX-License-Identifier: Apache-2.0
"""regen.torch.keep() and restore() on the CPU and regend's host backend:
a rank SIGKILLed at any instant (after a commit, before opt.step(), inside
torch's Adam with half its parameters updated, after a Run of regend's
AdamW and before its commit, inside the forward after a BatchNorm wrote
its statistics, and at random instants) resumes in a new process from what
regend kept (parameters, buffers, the optimizer's moments and its step, no
copy: the tensors are views of the memory taken back), put back from the
twin or the journal where it died inside a step, and ends bit-identical to
a rank never killed.  The rank is keep_torch_rank.py, a real second
process.  Skips without torch (meson's python-torch-keep runs it under a
Python that has it)."""

import os
import random
import signal
import subprocess
import sys
import tempfile
import time
import unittest

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.dirname(HERE))
sys.path.insert(0, os.path.join(HERE, "..", "..", "..", "tests", "lib"))

from regend_fixture import TIME_SCALE, Regend, find_regend  # noqa: E402

import regen  # noqa: E402

try:
    import torch
    import regen.torch as rt
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


def same_state(test, ref_path, run_path, what):
    a, b = torch.load(ref_path), torch.load(run_path)
    test.assertEqual(sorted(a), sorted(b), what)
    differ = [k for k in a if not torch.equal(a[k], b[k])]
    test.assertEqual(differ, [], f"{what}: these differ from the rank never killed")
    return a


class TorchKeepTest(unittest.TestCase):
    STEPS = 12

    def setUp(self):
        self.jobs = set()

    def tearDown(self):
        import regen
        c = regen.Client(daemon.socket, timeout=30)
        for job in self.jobs:
            c.drop(job)
        c.close()

    def job(self, what):
        job = f"{what}-{os.getpid()}-{random.randrange(1 << 30)}"
        self.jobs.add(job)
        return job

    def rank(self, job, out, *extra, steps=None, socket=None):
        p = subprocess.run([sys.executable, os.path.join(HERE, "keep_torch_rank.py"), socket or daemon.socket, job,
                            str(steps or self.STEPS), out] + list(extra), capture_output=True, text=True,
                           timeout=120 * TIME_SCALE)
        return p.returncode, p.stdout, p.stderr

    def reference(self, tmp, name, *extra, steps=None):
        ref = os.path.join(tmp, name + ".pt")
        code, out, err = self.rank(self.job(name), ref, *extra, steps=steps)
        self.assertEqual(code, 0, err)
        self.assertTrue(out.startswith("resume None put_back None ptrs_in_pool True"), out)
        return ref

    def test_a_killed_rank_resumes_bit_identical(self):
        with tempfile.TemporaryDirectory() as tmp:
            ref, run = self.reference(tmp, "torch-ref"), os.path.join(tmp, "run.pt")
            # Killed after the commit of step 4, then after step 8's
            # backward, before its opt.step(); then to the end.
            job = self.job("torch-run")
            code, out, err = self.rank(job, run, "--die", "4", "after_commit")
            self.assertEqual(code, -signal.SIGKILL, err)
            code, out, err = self.rank(job, run, "--die", "8", "before_step")
            self.assertEqual(code, -signal.SIGKILL, err)
            self.assertTrue(out.startswith("resume 4 put_back None ptrs_in_pool True"), f"{out} {err}")
            code, out, err = self.rank(job, run)
            self.assertEqual(code, 0, err)
            self.assertTrue(out.startswith("resume 7 put_back None ptrs_in_pool True"), f"{out} {err}")
            self.assertIn("restore_phases adopt,bind,index,put_back,take_back\n", out,
                          "rt.last_restore_phases: every phase, none negative")
            a = same_state(self, ref, run, "killed after a commit and before a step")
            self.assertIn("s0.exp_avg", a)

    def test_a_kill_inside_torchs_adam_is_put_back_from_the_twin(self):
        """torch's Adam cut after half its parameters: the kept memory holds
        half of step 5's update; restore() (into a model built on the meta
        device) puts step 4 back from the twin, and the rank ends as one
        never killed.  Without the twin
        (snapshot=False) the same kill is found and refused (Torn), never
        resumed from."""
        with tempfile.TemporaryDirectory() as tmp:
            ref, run = self.reference(tmp, "adam-ref"), os.path.join(tmp, "run.pt")
            job = self.job("mid")
            code, out, err = self.rank(job, run, "--die", "5", "mid_step")
            self.assertEqual(code, -signal.SIGKILL, err)
            # Restored into a model built on the meta device.
            code, out, err = self.rank(job, run, "--meta")
            self.assertEqual(code, 0, err)
            self.assertTrue(out.startswith("resume 4 put_back twin"), f"{out} {err}")
            same_state(self, ref, run, "killed inside torch's Adam")

            job = self.job("torn")
            code, out, err = self.rank(job, run, "--no-snapshot", "--die", "5", "mid_step")
            self.assertEqual(code, -signal.SIGKILL, err)
            code, out, err = self.rank(job, run, "--no-snapshot")
            self.assertEqual(code, 3, f"{out} {err}")
            self.assertIn("died inside opt.step() of step 5", out)

    def test_a_restart_of_regend_between_the_kill_and_the_resume(self):
        """Killed inside torch's Adam; then regend itself SIGKILLed and
        started again, its kept state coming back through the fd store
        (tests/lib/fd_store.py stands in for systemd's): the rank resumes
        from the twin as if regend had never stopped."""
        from fd_store import FdStore
        with tempfile.TemporaryDirectory() as tmp:
            ref, run = self.reference(tmp, "restart-ref"), os.path.join(tmp, "run.pt")
            with Regend(devices=1, start=False) as own:
                store = FdStore(own.dir)
                own.start(**store.start_args())
                job = f"restart-{os.getpid()}"
                code, out, err = self.rank(job, run, "--die", "5", "mid_step", socket=own.socket)
                self.assertEqual(code, -signal.SIGKILL, err)
                own.kill()
                own.start(**store.start_args())
                code, out, err = self.rank(job, run, socket=own.socket)
                self.assertEqual(code, 0, f"{err}\n{own.log_tail()}")
                self.assertTrue(out.startswith("resume 4 put_back twin"), f"{out} {err}")
                store.close()
            same_state(self, ref, run, "killed inside torch's Adam, regend restarted before the resume")

    def test_a_device_lost_between_the_kill_and_the_resume(self):
        """Killed inside torch's Adam; then a device_lost in regend (its
        worker's context reset): kept memory is the rank's, held by the
        supervisor, and the rank resumes from the twin."""
        import regen
        with tempfile.TemporaryDirectory() as tmp:
            ref, run = self.reference(tmp, "lost-ref"), os.path.join(tmp, "run.pt")
            job = self.job("lost")
            code, out, err = self.rank(job, run, "--die", "5", "mid_step")
            self.assertEqual(code, -signal.SIGKILL, err)
            admin = regen.Client(daemon.socket, timeout=30)
            gen = admin.generation()["devices"][0]["generation"]
            admin.inject_fault(0, "device_lost")
            deadline = time.monotonic() + 30 * TIME_SCALE
            while time.monotonic() < deadline:
                d = admin.generation()["devices"][0]
                if d["generation"] > gen and d["state"] == "ready":
                    break
                time.sleep(0.02)
            admin.close()
            self.assertGreater(d["generation"], gen, "the device_lost moved no generation")
            code, out, err = self.rank(job, run)
            self.assertEqual(code, 0, err)
            self.assertTrue(out.startswith("resume 4 put_back twin"), f"{out} {err}")
            same_state(self, ref, run, "killed inside torch's Adam, a device_lost before the resume")

    def test_a_kill_after_regends_adamw_is_put_back_from_the_journal(self):
        """regen.torch.optim.AdamW's Run of step 5 applied (its journal DONE)
        and the rank killed before its commit, twice (the second time in the
        process that put step 4 back): restore() reads the journal, puts
        step 4's parameters and moments back from it, and the rank ends as
        one never killed."""
        with tempfile.TemporaryDirectory() as tmp:
            ref, run = self.reference(tmp, "adamw-ref", "--opt", "adamw"), os.path.join(tmp, "run.pt")
            job = self.job("adamw")
            code, out, err = self.rank(job, run, "--opt", "adamw", "--die", "5", "after_step")
            self.assertEqual(code, -signal.SIGKILL, err)
            # Again, at the first Run of the process that put step 4 back
            # (a fresh optimizer, which restore() told where its Run saves).
            code, out, err = self.rank(job, run, "--opt", "adamw", "--die", "5", "after_step")
            self.assertEqual(code, -signal.SIGKILL, err)
            self.assertTrue(out.startswith("resume 4 put_back journal"), f"{out} {err}")
            code, out, err = self.rank(job, run, "--opt", "adamw", "--die", "8", "after_commit")
            self.assertEqual(code, -signal.SIGKILL, err)
            self.assertTrue(out.startswith("resume 4 put_back journal"), f"{out} {err}")
            code, out, err = self.rank(job, run, "--opt", "adamw", "--meta")
            self.assertEqual(code, 0, err)
            self.assertTrue(out.startswith("resume 8 put_back None"), f"{out} {err}")
            same_state(self, ref, run, "killed after a Run of regend's AdamW")

    def test_a_kill_after_regends_adamw_with_marks_resumes_after_it(self):
        """regen.torch.optim.AdamW(journal="marks"), whose journal holds no
        copy: its Run of step 5 completed (DONE) and the rank killed before
        the commit: restore() resumes from step 5, which the memory holds
        (rolled forward), twice (the second time at the first Run of the
        process that rolled forward); then killed after a commit; and the
        rank ends bit-identical to one never killed, and to one whose
        journal holds copies (marks change no bit of the update)."""
        marks = ("--opt", "adamw", "--journal", "marks")
        with tempfile.TemporaryDirectory() as tmp:
            ref, run = self.reference(tmp, "marks-ref", *marks), os.path.join(tmp, "run.pt")
            job = self.job("marks")
            code, out, err = self.rank(job, run, *marks, "--die", "5", "after_step")
            self.assertEqual(code, -signal.SIGKILL, err)
            code, out, err = self.rank(job, run, *marks, "--die", "6", "after_step")
            self.assertEqual(code, -signal.SIGKILL, err)
            self.assertTrue(out.startswith("resume 5 put_back rolled_forward"), f"{out} {err}")
            code, out, err = self.rank(job, run, *marks, "--die", "8", "after_commit")
            self.assertEqual(code, -signal.SIGKILL, err)
            self.assertTrue(out.startswith("resume 6 put_back rolled_forward"), f"{out} {err}")
            code, out, err = self.rank(job, run, *marks, "--meta")
            self.assertEqual(code, 0, err)
            self.assertTrue(out.startswith("resume 8 put_back None"), f"{out} {err}")
            same_state(self, ref, run, "killed after Runs of regend's AdamW with a journal of marks")
            copies = self.reference(tmp, "copy-ref", "--opt", "adamw")
            same_state(self, copies, ref, "AdamW with a journal of marks against one of copies")

    def test_async_commits_with_marks_resume_bit_identical(self):
        """keep(async_commit=True) with AdamW(journal="marks") and a model
        without buffers: commit() does not wait, and the next Run waits for
        its write, so a kill right after a commit (which may not be written
        yet) or after a Run resumes at most one update past the index,
        rolled forward; the rank ends as one never killed, and as one whose
        commits waited."""
        marks = ("--opt", "adamw", "--journal", "marks", "--no-buffers")
        with tempfile.TemporaryDirectory() as tmp:
            ref = self.reference(tmp, "amarks-ref", *marks, "--async-commit")
            run = os.path.join(tmp, "run.pt")
            job = self.job("amarks")
            code, out, err = self.rank(job, run, *marks, "--async-commit", "--die", "5", "after_step")
            self.assertEqual(code, -signal.SIGKILL, err)
            code, out, err = self.rank(job, run, *marks, "--async-commit", "--die", "8", "after_commit")
            self.assertEqual(code, -signal.SIGKILL, err)
            self.assertTrue(out.startswith("resume 5 put_back rolled_forward"), f"{out} {err}")
            code, out, err = self.rank(job, run, *marks, "--async-commit", "--meta")
            self.assertEqual(code, 0, err)
            self.assertRegex(out, r"^resume 8 put_back (None|rolled_forward) ", f"{out} {err}")
            self.assertIn("commits async\n", out, "the commits did not wait")
            client = regen.Client(daemon.socket)
            try:
                steps = {k["step"] for k in client.kept(job)}
            finally:
                client.close()
            self.assertEqual(steps, {self.STEPS}, "regend was not told the last asynchronous commit")
            same_state(self, ref, run, "killed after a Run and after an async commit")
            waited = self.reference(tmp, "smarks-ref", *marks)
            same_state(self, waited, ref, "async commits against commits that waited")

    def test_a_fault_inside_a_marks_run_is_torn(self):
        """AdamW(journal="marks") and a device_lost in regend landing inside
        its Run (the rank injects one a few ms into each opt.step() from
        step 3 on until one does): opt.step() raises rt.Torn, nothing
        retried; and restore() of the kept state raises Torn too: the
        journal says the Run began and never completed."""
        marks = ("--opt", "adamw", "--journal", "marks", "--width", "512", "--layers", "2")
        with tempfile.TemporaryDirectory() as tmp:
            run, job = os.path.join(tmp, "run.pt"), self.job("marks-torn")
            code, out, err = self.rank(job, run, *marks, "--lose-inside", "3", steps=40)
            self.assertEqual(code, 4, f"{out} {err}")
            self.assertIn("torn ", out)
            self.assertIn("journal holds marks only", out)
            code, out, err = self.rank(job, run, *marks)
            self.assertEqual(code, 3, f"{out} {err}")
            self.assertIn("began and did not complete", out)

    def test_a_kill_inside_the_forward_puts_the_buffers_back(self):
        """Killed after step 5's forward wrote the BatchNorm's statistics:
        they come back as step 4 left them (the buffers' copy at each
        commit)."""
        with tempfile.TemporaryDirectory() as tmp:
            ref, run = self.reference(tmp, "bn-ref"), os.path.join(tmp, "run.pt")
            job = self.job("bn")
            code, out, err = self.rank(job, run, "--die", "5", "mid_forward")
            self.assertEqual(code, -signal.SIGKILL, err)
            code, out, err = self.rank(job, run)
            self.assertEqual(code, 0, err)
            self.assertTrue(out.startswith("resume 4 put_back None"), f"{out} {err}")
            same_state(self, ref, run, "killed inside the forward")

    def popen(self, job, out, steps, *extra):
        return subprocess.Popen([sys.executable, os.path.join(HERE, "keep_torch_rank.py"), daemon.socket, job,
                                 str(steps), out] + list(extra), stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                text=True)

    def random_kills(self, kills, *extra):
        """A rank SIGKILLed at random instants, resumed each time, ends
        bit-identical to one never killed: a quarter of the kills while it
        starts (takes its state back, puts a step back), the rest within a
        random step of its training (after the line of a random step, a
        random time up to two steps' worth later, timed by the rank so that
        a loaded machine cannot let it finish first), so in any part of a
        step.  Returns the kills and what each resume put back."""
        steps = 200
        with tempfile.TemporaryDirectory() as tmp:
            ref = os.path.join(tmp, "ref.pt")
            t0 = time.monotonic()
            proc = self.popen(self.job("random-ref"), ref, steps, *extra)
            first = proc.stdout.readline()
            start_s = time.monotonic() - t0
            out, err = proc.communicate(timeout=300 * TIME_SCALE)
            self.assertEqual(proc.returncode, 0, first + err)
            run, job = os.path.join(tmp, "run.pt"), self.job("random")
            rng = random.Random(f"{job}{time.time()}")
            put_back, killed, done = [], 0, 0
            for attempt in range(kills + 1):
                # Each kill in training a random way into what is left (a
                # quarter of it at most, so that the kills spread over the
                # training), timed by the rank itself.
                in_training = attempt < kills and attempt % 4 != 0
                die_after = ["--die-after", str(rng.randrange(1, max(2, (steps - done) // 4))),
                             str(rng.uniform(0, 2))] if in_training else []
                proc = self.popen(job, run, steps, *extra, *die_after)
                if attempt < kills and attempt % 4 == 0:
                    time.sleep(rng.uniform(0, start_s))
                    proc.send_signal(signal.SIGKILL)
                first = proc.stdout.readline()
                if first.startswith("resume"):
                    put_back.append(first.split()[3])
                out, err = proc.communicate(timeout=300 * TIME_SCALE)
                done = max([done] + [int(line.split()[1]) for line in out.splitlines() if line.startswith("step ")])
                if proc.returncode in (-signal.SIGKILL, -signal.SIGALRM):
                    killed += 1
                else:
                    self.assertEqual(proc.returncode, 0, first + err)
            self.assertEqual(proc.returncode, 0, f"the rank never finished: {first} {err}")
            self.assertEqual(killed, kills)
            same_state(self, ref, run, f"after {killed} random kills, each resume putting back {put_back}")
        return killed, put_back

    def test_random_kills_with_torchs_adam_resume_bit_identical(self):
        killed, put_back = self.random_kills(12, "--width", "256", "--layers", "3")
        print(f"\ntorch's Adam, {killed} kills; each resume put back: {put_back}", file=sys.stderr)

    def test_random_kills_with_regends_adamw_resume_bit_identical(self):
        killed, put_back = self.random_kills(8, "--opt", "adamw", "--width", "128", "--layers", "2")
        print(f"\nregen's AdamW, {killed} kills; each resume put back: {put_back}", file=sys.stderr)

    def test_random_kills_with_regends_adamw_and_marks_resume_bit_identical(self):
        killed, put_back = self.random_kills(8, "--opt", "adamw", "--journal", "marks", "--width", "128",
                                             "--layers", "2")
        self.assertNotIn("journal", put_back, "a journal of marks put something back")
        print(f"\nregen's AdamW with marks, {killed} kills; each resume: {put_back}", file=sys.stderr)

    def test_journal_layout_is_where_a_run_saves(self):
        """regen.keep.journal_layout (how restore() finds each inout's saved
        bytes) against a real Run on the host backend: the journal holds,
        at each inout's place, its bytes from before the step, and the
        places end at the program's journal_bytes."""
        import regen.torch.optim as ropt
        rt.configure(socket=daemon.socket, host_device=0)
        torch.manual_seed(3)
        params = [torch.nn.Parameter(rt.host_empty(list(s), torch.float32).copy_(torch.randn(s)))
                  for s in [(7, 5), (3,), (2, 3, 4)]]
        opt = ropt.AdamW(params, lr=0.1)
        for step in range(2):
            for p in params:
                p.grad = rt.host_empty(list(p.shape), torch.float32).copy_(torch.randn(p.shape))
            before = {t.data_ptr(): bytes(t.detach().contiguous().view(torch.uint8).reshape(-1).tolist())
                      for p in params for t in [p] + [opt.state[p][k] for k in ("exp_avg", "exp_avg_sq")
                                                      if k in opt.state[p]]}
            opt.step()
        journal = bytes(opt._journal.tolist())
        self.assertEqual(len(opt.journal_layout), 3 * len(params))
        for t, offset, nbytes in opt.journal_layout:
            self.assertEqual(journal[offset:offset + nbytes], before[t.data_ptr()])
        last = max(offset + nbytes for _, offset, nbytes in opt.journal_layout)
        program = [p for p in rt.runtime()._programs.values() if p.journal_bytes][-1]
        self.assertEqual((last + 255) // 256 * 256, program.journal_bytes)
        from regen.keep import journal_header
        self.assertEqual(journal_header(journal[:32]), ("done", 2))

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


class CommitterTest(unittest.TestCase):
    def test_async_commits_are_written_by_one_thread(self):
        """keep(async_commit=True)'s commits: one thread writes them all,
        each done before wait() returns, and close() ends it."""
        import threading
        from regen.torch._keep import _Committer
        c, seen, before = _Committer(), [], threading.active_count()
        for i in range(50):
            c.submit(lambda i: (time.sleep(0.001 * (i % 3)), seen.append((i, threading.get_ident()))), i)
            c.wait()
            self.assertEqual(seen[-1][0], i, "wait() returned before the commit was written")
        self.assertEqual(len({t for _, t in seen}), 1, "the commits were written by several threads")
        self.assertNotEqual(seen[0][1], threading.get_ident())
        self.assertEqual(threading.active_count(), before + 1)
        c.stop()
        self.assertEqual(threading.active_count(), before, "stop() left the thread running")


class CommitValuesTest(unittest.TestCase):
    def test_a_commit_writes_the_state_as_it_is_now(self):
        """The values a commit writes (the optimizer's state not kept as
        memory) follow the state: updated in place, a tensor replaced, an
        entry added, a parameter group added."""
        from regen.torch._keep import _Values
        ps = [torch.nn.Parameter(torch.zeros(2)) for _ in range(3)]
        opt = torch.optim.Adam(ps)
        for p in ps:
            opt.state[p] = {"step": torch.tensor(1.0), "exp_avg": torch.zeros(2)}
        values = _Values({f"state:{i}.exp_avg" for i in range(3)})
        self.assertEqual(values(opt), {f"{i}.step": {"value": 1.0, "dtype": "float32"} for i in range(3)})
        for p in ps:
            opt.state[p]["step"] += 1
        self.assertEqual(values(opt)["2.step"]["value"], 2.0)
        opt.state[ps[1]]["step"] = torch.tensor(7, dtype=torch.int64)
        self.assertEqual(values(opt)["1.step"], {"value": 7, "dtype": "int64"})
        opt.state[ps[0]]["extra"] = 5
        self.assertEqual(values(opt)["0.extra"], {"value": 5})
        late = torch.nn.Parameter(torch.zeros(2))
        opt.add_param_group({"params": [late]})
        opt.state[late] = {"step": torch.tensor(3.0)}
        self.assertEqual(values(opt)["3.step"]["value"], 3.0)


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

    def test_the_example_under_the_warm_launcher(self):
        """The same with --warm: the killed rank started again by
        regen.warm_start (forked from its torch import, not a new Python),
        and the resumed weights still the never-killed run's."""
        example = os.path.join(HERE, "..", "examples", "train_keep.py")
        env = dict(os.environ, REGEN_SOCKET=daemon.socket, PYTHONPATH=os.path.dirname(HERE))
        p = subprocess.run([sys.executable, example, "--demo", "--device", "cpu", "--warm"], capture_output=True,
                           text=True, env=env, timeout=300 * TIME_SCALE)
        self.assertEqual(p.returncode, 0, p.stdout + p.stderr)
        self.assertIn("resumed at step", p.stdout)
        self.assertIn("regen.warm_start started it again", p.stdout)
        self.assertIn("ended (signal 9); starting it again (1 of 1)", p.stderr)
        self.assertIn("final weights bit-identical", p.stdout)


if __name__ == "__main__":
    unittest.main()
