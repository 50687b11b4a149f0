#!/usr/bin/env python3
# SPDX-License-Identifier: Apache-2.0
"""Two "nodes" on one machine: two network namespaces joined by a veth
pair, a regend in each (host backend, one device each), and a rank of a
torch.distributed job in each, talking to its own namespace's regend.

The ranks rendezvous as a job across nodes does: torch's TCPStore on rank
0's veth address and gloo (the reference group) over TCP between the
namespaces, neither over loopback; the "regen" process group's communicator
spans both regends (the host backend's groups meet in the socket directory
the two share, its stand-in for the network). Checked: every collective
torch offers and DDP equal to gloo, as client/python/tests/torch_dist_rank.py
checks them, with each regend serving its own namespace's rank.

What this is not: NCCL over sockets between the namespaces (that is
tests/gpu/test_nccl_netns.py, two GPUs), nor regend under its systemd unit
(tests/ops/test_units.py holds the unit to what NCCL needs).

Usage: test_netns.py REGEND [PYTHON_WITH_TORCH]
Exit 77 (skipped): not root, `ip netns` or veth refused here, or no Python
with torch.
"""
import json
import os
import shutil
import subprocess
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "lib"))
from regend_fixture import TIME_SCALE, Regend, check, fail, log, skip  # noqa: E402

RANK_SCRIPT = os.path.join(HERE, "..", "..", "client", "python", "tests", "torch_dist_rank.py")
SUBNET = "10.231.%d" % (os.getpid() % 200 + 20)


def sh(*argv, ok=True):
    r = subprocess.run(list(argv), capture_output=True, text=True, timeout=30)
    if ok and r.returncode != 0:
        raise RuntimeError("%s: %s" % (" ".join(argv), r.stderr.strip()))
    return r


class Namespaces:
    """ns0 and ns1, veth0 (SUBNET.1) in ns0 and veth1 (SUBNET.2) in ns1,
    loopback up in each."""

    def __init__(self):
        tag = "%d" % os.getpid()
        self.ns = ["regen%sa" % tag, "regen%sb" % tag]
        self.veth = ["vrg%sa" % tag, "vrg%sb" % tag]
        self.addr = ["%s.1" % SUBNET, "%s.2" % SUBNET]
        self.made = []

    def __enter__(self):
        for ns in self.ns:
            sh("ip", "netns", "add", ns)
            self.made.append(ns)
        sh("ip", "link", "add", self.veth[0], "type", "veth", "peer", "name", self.veth[1])
        for ns, veth, addr in zip(self.ns, self.veth, self.addr):
            sh("ip", "link", "set", veth, "netns", ns)
            sh("ip", "-n", ns, "addr", "add", addr + "/24", "dev", veth)
            sh("ip", "-n", ns, "link", "set", veth, "up")
            sh("ip", "-n", ns, "link", "set", "lo", "up")
        return self

    def __exit__(self, *exc):
        for ns in self.made:
            sh("ip", "netns", "del", ns, ok=False)

    def exec_prefix(self, i):
        return ["ip", "netns", "exec", self.ns[i]]


def probe_netns():
    if os.geteuid() != 0:
        skip("not root: network namespaces need CAP_SYS_ADMIN")
    if not shutil.which("ip"):
        skip("no ip(8)")
    name = "regenprobe%d" % os.getpid()
    r = sh("ip", "netns", "add", name, ok=False)
    if r.returncode != 0:
        skip("ip netns add is refused here: %s" % r.stderr.strip())
    sh("ip", "netns", "del", name, ok=False)
    r = sh("ip", "link", "add", "vrgprobe%d" % os.getpid(), "type", "veth", "peer", "name", "vrgprobe%db" % os.getpid(),
           ok=False)
    if r.returncode != 0:
        skip("veth pairs are refused here: %s" % r.stderr.strip())
    sh("ip", "link", "del", "vrgprobe%d" % os.getpid(), ok=False)


def main():
    if len(sys.argv) < 2:
        fail("usage: test_netns.py REGEND [PYTHON_WITH_TORCH]")
    regend = sys.argv[1]
    python = sys.argv[2] if len(sys.argv) > 2 and sys.argv[2] else sys.executable
    if subprocess.run([python, "-c", "import torch.distributed as d; assert d.is_available()"],
                      capture_output=True).returncode != 0:
        skip("%s has no torch with torch.distributed" % python)
    probe_netns()
    with Namespaces() as nets:
        # Two regends, one per namespace, their sockets in one directory:
        # each its own, the host communicators' groups shared.
        daemons = []
        try:
            first = Regend(regend, devices=1, start=False)
            daemons.append(first)
            first.start(wrapper=nets.exec_prefix(0))
            second = Regend(regend, devices=1, start=False)
            daemons.append(second)
            shutil.rmtree(second.dir)
            second.dir = first.dir
            old = second.socket
            second.socket = os.path.join(first.dir, "regend-b.sock")
            second.log_path = os.path.join(first.dir, "regend-b.log")
            second.config = first.config
            second.argv = [second.socket if a == old else first.config if a.endswith("regend.conf") else a
                           for a in second.argv]
            second.start(wrapper=nets.exec_prefix(1))
            log("regend A in %s (%s), regend B in %s (%s)" % (nets.ns[0], first.socket, nets.ns[1], second.socket))
            with tempfile.TemporaryDirectory() as tmp:
                procs, outs = [], []
                seed = str(int.from_bytes(os.urandom(2), "little"))
                for r, d in enumerate((first, second)):
                    out = os.path.join(tmp, "rank%d.json" % r)
                    env = dict(os.environ, MASTER_ADDR=nets.addr[0], MASTER_PORT="29533", RANK=str(r),
                               WORLD_SIZE="2", LOCAL_RANK="0", REGEN_JOB="netns-" + seed, TEST_SEED=seed,
                               GLOO_SOCKET_IFNAME=nets.veth[r])
                    procs.append(subprocess.Popen(nets.exec_prefix(r) + [python, RANK_SCRIPT, d.socket, out,
                                                                         "collectives"],
                                                  env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                                  text=True))
                    outs.append(out)
                for r, p in enumerate(procs):
                    try:
                        text, _ = p.communicate(timeout=300 * TIME_SCALE)
                    except subprocess.TimeoutExpired:
                        for q in procs:
                            q.kill()
                        fail("rank %d did not finish; regend A: %s; regend B: %s" % (r, first.log_tail(),
                                                                                   second.log_tail()))
                    check(p.returncode == 0, "rank %d exited %d:\n%s" % (r, p.returncode, text))
                for r, out in enumerate(outs):
                    with open(out) as f:
                        checks = json.load(f)
                    bad = [c for c in checks if not c["ok"]]
                    check(not bad, "rank %d: %s" % (r, bad))
                    check(any(c["check"] == "ddp equals gloo" for c in checks), "rank %d ran no DDP" % r)
                    log("rank %d (namespace %s): %d checks passed" % (r, nets.ns[r], len(checks)))
            # Each regend served its own namespace's rank.
            for d in (first, second):
                text = d.log_text()
                check("joined: rank" in text, "%s logged no Init: %s" % (d.socket, d.log_tail()))
        finally:
            for d in reversed(daemons):
                if d.proc is not None:
                    d.stop()
    log("ok")


if __name__ == "__main__":
    main()
