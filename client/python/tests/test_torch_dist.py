# SPDX-License-Identifier: Apache-2.0
"""torch.distributed's backend "regen" (regen.torch's ProcessGroupRegen)
over CPU tensors and regend's host backend: 2 to 4 rank processes
(torch_dist_rank.py) through one regend of four devices, each rank on its
own device's worker, rendezvous through torch's TCPStore. Every collective
torch offers against exact or float64 references, DDP on a small model
equal to gloo's within fp tolerance, a peer's device lost (the others'
calls fail within a second, the next call rebuilds the communicator, timed)
and a whole-job restart that re-attaches the communicators by key. Skips
without torch (meson's python-torch-dist runs it under a Python that has
it)."""

import json
import os
import socket
import subprocess
import sys
import tempfile
import time
import unittest

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.dirname(HERE))
sys.path.insert(0, os.path.join(HERE, "..", "..", "..", "tests", "lib"))

from regend_fixture import TIME_SCALE, Regend, find_regend  # noqa: E402

try:
    import torch
    import torch.distributed as torch_dist
except ImportError:
    torch = None

DEVICES = 4
daemon = None


def setUpModule():
    global daemon
    if torch is None or not torch_dist.is_available():
        raise unittest.SkipTest("no torch, or torch without torch.distributed")
    if not find_regend():
        raise unittest.SkipTest("no regend (pass --regend or set REGEN_BUILD_ROOT)")
    daemon = Regend(devices=DEVICES)


def tearDownModule():
    if daemon is not None:
        daemon.stop()


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class TorchDistTest(unittest.TestCase):
    def launch(self, world, mode, tmp, job=None, seed=None):
        # A job of its own (its communicators' keys): none of another
        # test's left detached is taken for its.
        job = job or "job-" + os.urandom(4).hex()
        port = free_port()
        seed = seed if seed is not None else int.from_bytes(os.urandom(2), "little")
        procs, outs = [], []
        for r in range(world):
            out = os.path.join(tmp, f"{mode}-{r}.json")
            env = dict(os.environ, MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), RANK=str(r),
                       WORLD_SIZE=str(world), LOCAL_RANK=str(r), REGEN_JOB=job,
                       TEST_SEED=str(seed),
                       PYTHONPATH=os.path.dirname(HERE))
            procs.append(subprocess.Popen([sys.executable, os.path.join(HERE, "torch_dist_rank.py"), daemon.socket,
                                           out, mode], env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                          text=True))
            outs.append(out)
        return procs, outs

    def collect(self, procs, outs, timeout=300, failing=()):
        results = []
        for r, (p, out) in enumerate(zip(procs, outs)):
            try:
                text, _ = p.communicate(timeout=timeout * TIME_SCALE)
            except subprocess.TimeoutExpired:
                for q in procs:
                    q.kill()
                self.fail(f"rank {r} did not finish: {daemon.log_tail()}")
            self.assertEqual(p.returncode, 1 if r in failing else 0, f"rank {r} exited {p.returncode}:\n{text}")
            with open(out) as f:
                results.append(json.load(f))
        return results

    def assert_all_ok(self, results):
        for r, checks in enumerate(results):
            bad = [c for c in checks if not c["ok"]]
            self.assertEqual(bad, [], f"rank {r}")
        return results

    def test_collectives_and_ddp_on_two_ranks(self):
        with tempfile.TemporaryDirectory() as tmp:
            self.assert_all_ok(self.collect(*self.launch(2, "collectives", tmp)))

    def test_collectives_and_ddp_on_four_ranks(self):
        with tempfile.TemporaryDirectory() as tmp:
            results = self.assert_all_ok(self.collect(*self.launch(4, "collectives", tmp)))
            names = {c["check"] for c in results[0]}
            for want in ("ddp equals gloo", "all_to_all_single uneven", "send/recv ring", "reduce_scatter_tensor"):
                self.assertIn(want, names)

    def test_a_peer_device_lost_then_the_group_rebuilds(self):
        world = 3
        c = None
        import regen
        with tempfile.TemporaryDirectory() as tmp:
            procs, outs = self.launch(world, "fault", tmp)
            until = time.monotonic() + 240 * TIME_SCALE
            while not all(os.path.exists(o + f".ready{r}") for r, o in enumerate(outs)):
                if time.monotonic() > until or any(p.poll() is not None for p in procs):
                    self.collect(procs, outs)
                    self.fail("the ranks never got ready")
                time.sleep(0.02)
            # The ranks but the last are in their all_reduce now.
            time.sleep(0.3)
            c = regen.Client(daemon.socket)
            victim = world - 1
            for o in outs:
                with open(o + ".lost.tmp", "w") as f:
                    f.write(repr(time.time()))
            c.inject_fault(victim, "device_lost")
            for o in outs:
                os.rename(o + ".lost.tmp", o + ".lost")
            results = self.assert_all_ok(self.collect(procs, outs))
            c.close()
        for r, checks in enumerate(results):
            seen = {x["check"]: x for x in checks}
            if "noticed within 1 s" in seen:
                print(f"rank {r}: failed {seen['noticed within 1 s']['seconds'] * 1000:.0f} ms after the loss; "
                      f"communicator rebuilt in {seen['rebuilt']['seconds'] * 1000:.0f} ms", file=sys.stderr)

    def test_a_restarted_job_reattaches_its_communicators(self):
        with tempfile.TemporaryDirectory() as tmp:
            job = "reattach-" + os.urandom(4).hex()
            # Rank 0 ends with an exception, rank 1 as if killed.
            first = self.assert_all_ok(self.collect(*self.launch(2, "reattach1", tmp, job=job), failing=(0,)))
            self.assertIn("made", {c["check"] for c in first[0]})
            second = self.assert_all_ok(self.collect(*self.launch(2, "reattach2", tmp, job=job)))
            self.assertIn("re-attached", {c["check"] for c in second[0]})


if __name__ == "__main__":
    unittest.main()
