#!/usr/bin/env python3
# SPDX-License-Identifier: Apache-2.0
"""The Slurm examples find regenctl where it is installed and tell the
truth when they drain a node.

- prolog.sh and epilog.sh find regenctl on PATH (a source install's
  /usr/local/bin) with no REGENCTL set: they used /usr/bin/regenctl only,
  and every node of a source install was drained "see journalctl -u
  regend" although regend was fine;
- a REGENCTL that is not there, and no regenctl anywhere, drain the node
  with a reason that says so;
- when regend refuses the restart (a detached GPU), the drain reason
  carries regenctl's own words (the error's name), not a pointer to
  regend's journal;
- gpu-maintenance.sh detaches, runs its command, attaches and resumes the
  node, with regenctl found the same way;
- restart-job.sh, through `srun` (a stand-in that runs the command once,
  as on a one-node allocation), restarts the step's own GPUs and no other.

`scontrol` and `squeue` are stand-ins that record what they were asked.

Usage: test_slurm.py REGEND REGENCTL SOURCE_ROOT
"""
import os
import subprocess
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "lib"))
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from regend_fixture import Regend, call, check, log, regend_path
from ctl import generations, run

SYSTEM_PATH = "/usr/bin:/bin"


def stub(folder, name, body):
    path = os.path.join(folder, name)
    with open(path, "w") as f:
        f.write("#!/bin/sh\n" + body)
    os.chmod(path, 0o755)
    return path


def script(source, name, bindir, record, env, *args):
    """Runs an example; (exit code, stderr, what scontrol was asked)."""
    if os.path.exists(record):
        os.unlink(record)
    full = {"PATH": bindir + ":" + SYSTEM_PATH, "SLURM_JOB_ID": "4242", "NODE": "node-1"}
    full.update(env)
    p = subprocess.run(["sh", os.path.join(source, "docs", "examples", "slurm", name)] + list(args), env=full,
                       capture_output=True, text=True, timeout=120)
    asked = open(record).read() if os.path.exists(record) else ""
    log("%s %s -> %d\n%s%s" % (name, env, p.returncode, p.stderr, asked))
    return p.returncode, p.stderr, asked


def main():
    regend = regend_path()
    regenctl, source = os.path.abspath(sys.argv[2]), os.path.abspath(sys.argv[3])
    with Regend(regend, devices=4) as d:
        bindir = os.path.join(d.dir, "bin")
        bare = os.path.join(d.dir, "bare")
        os.mkdir(bindir)
        os.mkdir(bare)
        record = os.path.join(d.dir, "scontrol.log")
        # regenctl as a source install puts it on PATH, pointed at this regend.
        stub(bindir, "regenctl", 'exec %s --socket %s "$@"\n' % (regenctl, d.socket))
        for folder in (bindir, bare):
            stub(folder, "scontrol", 'echo "$@" >> %s\n' % record)
            stub(folder, "squeue", "exit 0\n")
        # srun on a one-node allocation: its options, then the command, once.
        stub(bindir, "srun", 'while [ "${1#--}" != "$1" ]; do shift; done\nexec "$@"\n')

        for name in ("prolog.sh", "epilog.sh"):
            before = generations(d)
            rc, err, asked = script(source, name, bindir, record, {"SLURM_JOB_GPUS": "2"})
            check(rc == 0 and not asked, "%s with regenctl on PATH: exit %d, drained %r" % (name, rc, asked))
            check(generations(d)[2] == before[2] + 1, "%s did not restart its job's GPU" % name)

            rc, err, asked = script(source, name, bare, record, {"SLURM_JOB_GPUS": "2",
                                                                 "REGENCTL": "/nonexistent/regenctl"})
            check(rc == 1 and "state=drain" in asked and "REGENCTL=/nonexistent/regenctl is not an executable" in asked,
                  "%s with a wrong REGENCTL: exit %d, %r" % (name, rc, asked))
            if not any(os.access(p, os.X_OK) for p in ("/usr/bin/regenctl", "/usr/local/bin/regenctl")):
                rc, err, asked = script(source, name, bare, record, {"SLURM_JOB_GPUS": "2"})
                check(rc == 1 and "regenctl not found" in asked and "journalctl" not in asked,
                      "%s without regenctl: exit %d, %r" % (name, rc, asked))
            else:
                log("regenctl is installed on this machine: the 'not found' case is not tried")
        log("prolog, epilog: regenctl found on PATH; a wrong or missing one named in the drain reason")

        call(d.socket, "io.regen.Device.Detach", {"device": 3, "reason": "test"})
        for name in ("prolog.sh", "epilog.sh"):
            rc, err, asked = script(source, name, bindir, record, {"SLURM_JOB_GPUS": "3"})
            check(rc == 1 and "io.regen.Detached" in asked and "journalctl" not in asked,
                  "%s on a detached GPU: exit %d, drain reason %r" % (name, rc, asked))
        log("prolog, epilog: regend's refusal is the drain reason, in regenctl's words")
        rc, out, err = run(regenctl, d, "attach", "--device", "3", "--wait")
        check(rc == 0, "attach: %d %s" % (rc, err))

        before = generations(d)
        rc, err, asked = script(source, "gpu-maintenance.sh", bindir, record, {}, "1", "true")
        check(rc == 0 and "state=resume" in asked and generations(d)[1] > before[1],
              "gpu-maintenance.sh: exit %d, scontrol %r, generations %s -> %s" % (rc, asked, before, generations(d)))
        log("gpu-maintenance.sh: detach, command, attach, resume")

        before = generations(d)
        rc, err, asked = script(source, "restart-job.sh", bindir, record, {"SLURM_STEP_GPUS": "0,2",
                                                                          "SLURM_JOB_NUM_NODES": "1"})
        after = generations(d)
        check(rc == 0 and after[0] > before[0] and after[2] > before[2] and after[1] == before[1] and
              after[3] == before[3], "restart-job.sh: exit %d, generations %s -> %s" % (rc, before, after))
        log("restart-job.sh: the step's GPUs restarted, the others untouched")
    return 0


if __name__ == "__main__":
    sys.exit(main())
