#!/usr/bin/env python3
"""Events carry the job: a lifecycle request from a process in a Slurm
job's cgroup (.../job_N/...) records "slurm:N" in its reason, which Status,
every Watch event of the change and the log show; a process outside any
job records none. regend reads /proc/PID/cgroup (any uid may), never the
client's environment or words.

Needs a cgroup hierarchy this test may create a group in (root; cgroup v1
pids or a writable v2): exit 77 otherwise.

Usage: test_job.py REGEND REGENCTL
"""
import os
import shutil
import subprocess
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "lib"))
from regend_fixture import Conn, Regend, call, check, log, regend_path, skip


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
        log("the job from the caller's cgroup is in Status, Watch events and the log")
    finally:
        os.rmdir(cg)
        os.rmdir(os.path.dirname(cg))
    return 0


if __name__ == "__main__":
    sys.exit(main())
