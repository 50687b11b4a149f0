#!/usr/bin/env python3
# SPDX-License-Identifier: Apache-2.0
"""Events carry the job: a lifecycle request from a process in a Slurm
job's cgroup (.../job_N/...) records "slurm:N" in its reason, which Status,
every Watch event of the change and the log show; a process outside any
job records none. regend reads /proc/PID/cgroup (any uid may), never the
client's environment. A job the client states (io.regen.SetJob) does not
override the cgroup's: the reason shows both ("slurm:N, stated: NAME"), and
Status and metrics count the client's work under the cgroup's job.

Needs a cgroup hierarchy this test may create a group in (root; cgroup v1
pids or a writable v2): exit 77 otherwise.

Usage: test_job.py REGEND REGENCTL
"""
import os
import shutil
import subprocess
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "lib"))
from regend_fixture import Conn, Regend, call, check, log, regend_path, skip, wait_for
from ctl import dev, parse_metrics

# Runs in the job's cgroup: a worker connection that states another job,
# held until stdin closes.
CHILD = """
import sys
sys.path.insert(0, sys.argv[1])
from regend_fixture import Conn
c = Conn(sys.argv[2])
print(c.call("io.regen.SetJob", {"job": "mine"})["source"], flush=True)
sys.stdin.read()
"""


def make_job_cgroup(job):
    """A cgroup .../regen-test-PID/job_N that a process can be moved into
    (tried with a throwaway child), or None."""
    for root in ("/sys/fs/cgroup/pids", "/sys/fs/cgroup/unified", "/sys/fs/cgroup"):
        top = os.path.join(root, "regen-test-%d" % os.getpid())
        path = os.path.join(top, "job_%d" % job)
        child = None
        try:
            os.makedirs(path)
            child = subprocess.Popen(["sleep", "30"])
            with open(os.path.join(path, "cgroup.procs"), "w") as f:
                f.write("%d\n" % child.pid)
            return path
        except OSError:
            pass
        finally:
            if child:
                child.kill()
                child.wait()
        for dead in (path, top):
            try:
                os.rmdir(dead)
            except OSError:
                pass
    return None


def main():
    regend = regend_path()
    regenctl = os.path.abspath(sys.argv[2])
    cg = make_job_cgroup(4242)
    if cg is None:
        skip("cannot create a cgroup to run a client in")
    try:
        with Regend(regend, devices=1) as d:
            watch = Conn(d.socket)
            watch.send("io.regen.Device.Watch", more=True)
            watch.reply()
            procs = os.path.join(cg, "cgroup.procs")
            p = subprocess.run(["sh", "-c", 'echo $$ > "$1" && exec "$2" --socket "$3" restart --device 0 --reason in-job',
                                "sh", procs, regenctl, d.socket], capture_output=True, text=True, timeout=60)
            check(p.returncode == 0, "regenctl in the job's cgroup: exit %d %s" % (p.returncode, p.stderr))
            reason = call(d.socket, "io.regen.Device.Status")["devices"][0]["reason"]
            check("(slurm:4242)" in reason and "in-job" in reason, "Status reason: %r" % reason)
            events = [watch.reply() for _ in range(3)]
            check(all("(slurm:4242)" in e["reason"] for e in events), "Watch events: %s" % events)
            check("(slurm:4242)" in d.log_text(), "the log does not name the job")
            subprocess.run([regenctl, "--socket", d.socket, "restart", "--device", "0"], check=True,
                           capture_output=True)
            reason = call(d.socket, "io.regen.Device.Status")["devices"][0]["reason"]
            check("slurm:" not in reason, "a client outside any job got a job: %r" % reason)
            watch.close()

            # Its own words beside the kernel's, never instead of them.
            p = subprocess.run(["sh", "-c", 'echo $$ > "$1" && exec "$2" --socket "$3" --as-job mine restart '
                                '--device 0 --reason both', "sh", procs, regenctl, d.socket],
                               capture_output=True, text=True, timeout=60)
            reason = call(d.socket, "io.regen.Device.Status")["devices"][0]["reason"]
            check(p.returncode == 0 and "(slurm:4242, stated: mine): both" in reason, "reason %r" % reason)
            check("(slurm:4242, stated: mine)" in d.log_text(), "the log does not show both")
            lib = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "lib")
            child = subprocess.Popen(["sh", "-c", 'echo $$ > "$1" && shift && exec "$@"', "sh", procs, sys.executable,
                                      "-c", CHILD, lib, d.worker_socket(0)],
                                     stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
            try:
                source = child.stdout.readline().strip()
                check(source == "cgroup", "SetJob in the job's cgroup answered source %r" % source)
                jobs = call(d.socket, "io.regen.Device.Status")["devices"][0]["jobs"]
                check([(j["job"], j["source"], j["sessions"]) for j in jobs] == [("slurm:4242", "cgroup", 1)],
                      "Status jobs: %s" % jobs)
                m = subprocess.run([regenctl, "--socket", d.socket, "metrics"], capture_output=True, text=True,
                                   timeout=60).stdout
                check(dev(parse_metrics(m)[0], "regen_job_sessions", 0, client_job="slurm:4242",
                          job_source="cgroup") == 1 and "mine" not in m, "metrics:\n%s" % m)
            finally:
                child.stdin.close()
                child.wait(timeout=30)
            wait_for(lambda: call(d.socket, "io.regen.Device.Status")["devices"][0]["jobs"] == [], 10,
                     "the job to go with its client")
        log("the job from the caller's cgroup is in Status, Watch events, the log and metrics; "
            "a stated one stands beside it")
    finally:
        os.rmdir(cg)
        os.rmdir(os.path.dirname(cg))
    return 0


if __name__ == "__main__":
    sys.exit(main())
