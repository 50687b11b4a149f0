#!/usr/bin/env python3
# SPDX-License-Identifier: Apache-2.0
"""Restart scope: a lifecycle command names its devices.

- release, reset, restart without --device, --job or --all: usage error
  (exit 2), nothing sent, no generation changes;
- --device takes lists and ranges of indices, GPU UUIDs (HOST-N on the host
  backend) and PCI bus ids as Status reports them; only those restart;
- --job takes the job's GPUs from SLURM_STEP_GPUS, SLURM_JOB_GPUS,
  NVIDIA_VISIBLE_DEVICES, CUDA_VISIBLE_DEVICES (the first set); a job
  without GPUs does nothing and exits 0;
- io.regen.Device.Restart's `devices` list, and its refusals;
- the Slurm prolog and epilog and the Kubernetes pod restart only their own
  GPUs; the prolog and epilog state their job (REGEN_JOB), which the
  restart's reason shows.

Usage: test_scope.py REGEND REGENCTL SOURCE_ROOT
"""
import os
import re
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "lib"))
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from regend_fixture import Regend, VarlinkError, call, check, log, regend_path
from ctl import generations, run

N = 4


def bumped(before, after):
    return {i for i in range(N) if after[i] > before[i]}


def expect_restart(regenctl, d, args, want, env=None, verb="restart"):
    before = generations(d)
    rc, out, err = run(regenctl, d, verb, *args, "--wait", "--timeout", "30", env=env)
    check(rc == 0, "%s %s: exit %d: %s" % (verb, args, rc, err))
    after = generations(d)
    check(bumped(before, after) == set(want), "%s %s %s: devices %s restarted, wanted %s" %
          (verb, args, env or "", sorted(bumped(before, after)), sorted(want)))
    for i in want:
        check("device %d: ready in generation %d" % (i, after[i]) in out, "--wait did not report device %d: %s" % (i, out))
    return out, err


def main():
    regend = regend_path()
    regenctl, source = os.path.abspath(sys.argv[2]), os.path.abspath(sys.argv[3])
    with Regend(regend, devices=N) as d:
        # No target: a usage error, and nothing happens.
        before = generations(d)
        for verb in ("restart", "release", "reset"):
            rc, out, err = run(regenctl, d, verb, "--wait", "--timeout", "5")
            check(rc == 2 and "--device" in err and "--all" in err, "%s without a target: exit %d: %s" % (verb, rc, err))
        for bad in (["--device", "0,"], ["--device", ",1"], ["--device", "3-1"], ["--device", "0-64"],
                    ["--device", ""], ["--device", "0", "--job"], ["--all", "--job"]):
            rc, out, err = run(regenctl, d, "restart", *bad)
            check(rc == 2, "restart %s: exit %d, wanted 2" % (bad, rc))
        check(generations(d) == before, "a usage error changed a generation")
        log("no target, bad lists: exit 2, nothing restarted")

        # Lists, ranges, UUIDs, PCI bus ids.
        expect_restart(regenctl, d, ["--device", "0,2"], {0, 2})
        expect_restart(regenctl, d, ["--device", "1-2"], {1, 2})
        expect_restart(regenctl, d, ["--device", "HOST-3"], {3})
        status = call(d.socket, "io.regen.Device.Status")["devices"]
        pci1 = status[1]["health"]["pci_bus_id"]
        check(pci1, "the host backend reports no PCI bus id")
        expect_restart(regenctl, d, ["--device", pci1], {1})
        # The short spelling (no domain is domain 0) does not match the
        # host backend's domain 0xffff; the lower-case full one does.
        expect_restart(regenctl, d, ["--device", pci1.lower() + ",host-0"], {0, 1}, verb="release")
        rc, out, err = run(regenctl, d, "restart", "--device", "GPU-00000000-dead-beef")
        check(rc == 1 and "GPU-00000000-dead-beef" in err, "an unknown UUID: exit %d: %s" % (rc, err))
        rc, out, err = run(regenctl, d, "restart", "--device", "1,9")
        check(rc == 1 and "io.regen.NoSuchDevice" in err, "an index not served: exit %d: %s" % (rc, err))
        out, err = expect_restart(regenctl, d, ["--all"], set(range(N)), verb="reset")
        log("--device lists, ranges, UUIDs, PCI bus ids; --all")

        # --job, in its order of trust.
        expect_restart(regenctl, d, ["--job"], {1, 3}, env={"SLURM_JOB_GPUS": "1,3"})
        expect_restart(regenctl, d, ["--job"], {2}, env={"SLURM_STEP_GPUS": "2", "SLURM_JOB_GPUS": "1,3",
                                                          "CUDA_VISIBLE_DEVICES": "0"})
        expect_restart(regenctl, d, ["--job"], {0, 3}, env={"NVIDIA_VISIBLE_DEVICES": "HOST-0,HOST-3",
                                                             "CUDA_VISIBLE_DEVICES": "1"})
        out, err = expect_restart(regenctl, d, ["--job"], {1}, env={"CUDA_VISIBLE_DEVICES": "1"})
        check("CUDA_VISIBLE_DEVICES=1" in err, "--job does not say where the GPUs came from: %s" % err)
        expect_restart(regenctl, d, ["--job"], set(range(N)), env={"NVIDIA_VISIBLE_DEVICES": "all"})
        for env in ({}, {"NVIDIA_VISIBLE_DEVICES": "void"}, {"CUDA_VISIBLE_DEVICES": ""}):
            before = generations(d)
            rc, out, err = run(regenctl, d, "restart", "--job", "--wait", env=env)
            check(rc == 0 and "no GPU" in err and generations(d) == before,
                  "--job without GPUs (%s): exit %d, %s" % (env, rc, err))
        rc, out, err = run(regenctl, d, "restart", "--job", env={"NVIDIA_VISIBLE_DEVICES": "GPU-nope"})
        check(rc == 1, "--job with an unknown UUID: exit %d" % rc)
        log("--job: Slurm's variables first, then NVIDIA_VISIBLE_DEVICES, then CUDA_VISIBLE_DEVICES")

        # The wire: `devices`, and what is refused.
        before = generations(d)
        call(d.socket, "io.regen.Device.Restart", {"devices": [0, 3], "reason": "list"})
        check(bumped(before, generations(d)) == {0, 3}, "Restart {devices:[0,3]}")
        for params, name in (({"devices": []}, "org.varlink.service.InvalidParameter"),
                             ({"devices": [1, 1]}, "org.varlink.service.InvalidParameter"),
                             ({"devices": [1], "device": 1}, "org.varlink.service.InvalidParameter"),
                             ({"devices": ["1"]}, "org.varlink.service.InvalidParameter"),
                             ({"devices": [-1]}, "org.varlink.service.InvalidParameter"),
                             ({"devices": [0, 7]}, "io.regen.NoSuchDevice"),
                             ({"devices": 1}, "org.varlink.service.InvalidParameter")):
            before = generations(d)
            try:
                call(d.socket, "io.regen.Device.Release", params)
                check(False, "Release %s was accepted" % params)
            except VarlinkError as e:
                check(e.name == name, "Release %s: %s, wanted %s" % (params, e.name, name))
            check(generations(d) == before, "a refused Release %s changed a generation" % params)
        log("Restart/Release devices: [...] and its refusals")

        # The examples restart their own GPUs only.
        bindir = os.path.join(d.dir, "bin")
        os.mkdir(bindir)
        shim = os.path.join(bindir, "regenctl")
        with open(shim, "w") as f:
            f.write("#!/bin/sh\nexec %s --socket %s \"$@\"\n" % (regenctl, d.socket))
        os.chmod(shim, 0o755)
        for script in ("prolog.sh", "epilog.sh"):
            path = os.path.join(source, "docs", "examples", "slurm", script)
            text = open(path).read()
            check("--all" not in text, "%s still restarts every GPU" % script)
            before = generations(d)
            import subprocess
            p = subprocess.run(["sh", path], env={"PATH": bindir + ":/usr/bin:/bin", "REGENCTL": shim,
                                                  "SLURM_JOB_ID": "4242", "SLURM_JOB_GPUS": "2"},
                               capture_output=True, text=True, timeout=60)
            check(p.returncode == 0, "%s: exit %d: %s%s" % (script, p.returncode, p.stdout, p.stderr))
            check(bumped(before, generations(d)) == {2}, "%s restarted %s, wanted its job's GPU 2" %
                  (script, sorted(bumped(before, generations(d)))))
            reason = call(d.socket, "io.regen.Device.Status")["devices"][2]["reason"]
            check("(stated: slurm:4242)" in reason, "%s does not state its job: %r" % (script, reason))
        pod = open(os.path.join(source, "docs", "examples", "kubernetes", "regen-training-pod.yaml")).read()
        cmd = re.search(r"command:\n((?:\s+- .*\n)+)", pod)
        check(cmd, "the pod example has no command")
        argv = [re.sub(r'^\s+- "?|"?\s*$', "", l) for l in cmd.group(1).splitlines()]
        check(argv[:3] == ["regenctl", "restart", "--job"] and "--all" not in argv, "pod command: %s" % argv)
        before = generations(d)
        rc, out, err = run(regenctl, d, *argv[1:], env={"NVIDIA_VISIBLE_DEVICES": "HOST-1,HOST-2"})
        check(rc == 0 and bumped(before, generations(d)) == {1, 2}, "the pod's init container: exit %d" % rc)
        log("Slurm prolog/epilog and the Kubernetes pod restart their own GPUs only")
    return 0


if __name__ == "__main__":
    sys.exit(main())
