#!/usr/bin/env python3
# SPDX-License-Identifier: Apache-2.0
"""`regenctl restart --job` in a pod, whichever way the NVIDIA device plugin
hands the pod its GPUs.

- envvar: NVIDIA_VISIBLE_DEVICES lists UUIDs (or indices);
- volume-mounts: NVIDIA_VISIBLE_DEVICES=/var/run/nvidia-container-devices,
  a folder with one entry per GPU, named by its UUID: it was a usage error
  (exit 2);
- CDI (cdi-annotations, cdi-cri): NVIDIA_VISIBLE_DEVICES=void and the GPUs'
  device nodes /dev/nvidia<minor> in the container: it did nothing and
  exited 0; now the nodes' minor numbers name the GPUs (Status's
  health.minor_number), and void without a node is still no GPU;
- MIG: a MIG device's UUID (MIG-...) or GPU:MIG index names the GPU it is a
  part of (Status's health.mig_devices; the host backend simulates two
  per GPU with REGEN_HOST_MIG_DEVICES=2): it was "no device has the UUID"
  (exit 1). An unknown MIG device is still exit 1, with what to look at.

Each restarts exactly its GPUs. The pod example's init container runs the
same command. The container's /dev is a folder of the test's
(REGEN_DEV_DIR).

Usage: test_kubernetes_job.py REGEND REGENCTL SOURCE_ROOT
"""
import os
import re
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "lib"))
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from regend_fixture import Regend, call, check, log, regend_path
from ctl import generations, run

N = 4


def folder(parent, name, entries):
    path = os.path.join(parent, name)
    os.mkdir(path)
    for e in entries:
        open(os.path.join(path, e), "w").close()
    return path


def restarted(regenctl, d, argv, env):
    before = generations(d)
    rc, out, err = run(regenctl, d, *argv, env=env)
    after = generations(d)
    return rc, {i for i in range(N) if after[i] > before[i]}, err


def main():
    regend = regend_path()
    regenctl, source = os.path.abspath(sys.argv[2]), os.path.abspath(sys.argv[3])
    pod = open(os.path.join(source, "docs", "examples", "kubernetes", "regen-training-pod.yaml")).read()
    cmd = re.search(r"command:\n((?:\s+- .*\n)+)", pod)
    check(cmd, "the pod example has no command")
    argv = [re.sub(r'^\s+- "?|"?\s*$', "", l) for l in cmd.group(1).splitlines()]
    check(argv[:3] == ["regenctl", "restart", "--job"], "the pod's init container: %s" % argv)
    argv = argv[1:]

    with Regend(regend, devices=N, env={"REGEN_HOST_MIG_DEVICES": "2"}) as d:
        st = call(d.socket, "io.regen.Device.Status")["devices"]
        check([x["health"].get("minor_number") for x in st] == list(range(N)), "minor numbers: %s" % st)
        check(st[2]["health"].get("mig_devices") == ["MIG-HOST-2-0", "MIG-HOST-2-1"], "MIG devices: %s" % st[2])

        volume = folder(d.dir, "nvidia-container-devices", ["HOST-0", "HOST-3"])
        cdi = folder(d.dir, "dev-cdi", ["nvidia1", "nvidia2", "nvidiactl", "nvidia-uvm", "nvidia-uvm-tools"])
        bare = folder(d.dir, "dev-bare", ["null", "nvidiactl"])
        cases = [
            ("envvar", {"NVIDIA_VISIBLE_DEVICES": "HOST-1,HOST-2"}, {1, 2}),
            ("volume-mounts", {"NVIDIA_VISIBLE_DEVICES": volume}, {0, 3}),
            ("cdi", {"NVIDIA_VISIBLE_DEVICES": "void", "REGEN_DEV_DIR": cdi}, {1, 2}),
            ("cdi without GPUs", {"NVIDIA_VISIBLE_DEVICES": "void", "REGEN_DEV_DIR": bare}, set()),
            ("mig uuid", {"NVIDIA_VISIBLE_DEVICES": "MIG-HOST-2-1"}, {2}),
            ("mig uuids of two GPUs", {"NVIDIA_VISIBLE_DEVICES": "MIG-HOST-0-0,MIG-HOST-3-1"}, {0, 3}),
            ("mig index", {"NVIDIA_VISIBLE_DEVICES": "3:0"}, {3}),
        ]
        for name, env, want in cases:
            rc, got, err = restarted(regenctl, d, argv, env)
            check(rc == 0 and got == want, "%s: exit %d, restarted %s, wanted %s: %s" %
                  (name, rc, sorted(got), sorted(want), err))
            if want:
                check("the job's GPUs from NVIDIA_VISIBLE_DEVICES=" in err, "%s: not said where from: %s" % (name, err))
            else:
                check("no GPU" in err, "%s: not said that the job has no GPU: %s" % (name, err))
            log("%s: restarted %s" % (name, sorted(got)))
        rc, got, err = restarted(regenctl, d, argv, {"NVIDIA_VISIBLE_DEVICES": "MIG-HOST-9-0"})
        check(rc == 1 and not got and "MIG-HOST-9-0" in err, "an unknown MIG device: exit %d %s" % (rc, err))
        rc, got, err = restarted(regenctl, d, argv, {"NVIDIA_VISIBLE_DEVICES": os.path.join(d.dir, "nope")})
        check(rc == 1 and not got and "nope" in err, "a folder that is not there: exit %d %s" % (rc, err))
        stray = folder(d.dir, "dev-stray", ["nvidia7"])
        rc, got, err = restarted(regenctl, d, argv, {"NVIDIA_VISIBLE_DEVICES": "void", "REGEN_DEV_DIR": stray})
        check(rc == 1 and not got and "nvidia7" in err, "a device node regend does not serve: exit %d %s" % (rc, err))
        log("unknown MIG device, missing folder, stray device node: exit 1, named")
        rc, out, err = run(regenctl, d, "restart", "--device", "MIG-HOST-1-0", "--wait", "--timeout", "30")
        check(rc == 0 and "device 1: ready" in out, "--device MIG-HOST-1-0: exit %d %s" % (rc, err))
    log("PASS")
    return 0


if __name__ == "__main__":
    sys.exit(main())
