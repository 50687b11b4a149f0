#!/usr/bin/env python3
# SPDX-License-Identifier: Apache-2.0
"""Detach and attach: a device taken out of regend and brought back.

- regenctl detach --device N drains the device; its worker exits and regend
  holds no handle on it (no worker process for it); Status, Watch and
  metrics say `detached`; the generation goes up; nothing respawns it;
- calls to the detached device's worker socket get io.regen.Detached, and
  so do Restart and InjectFault of it; health says degraded (6); that
  socket, the supervisor's own then, counts connections per uid as every
  socket does (--max-connections 8: the 9th is refused by name; it had
  taken any number, the supervisor's fds with them);
- a detach whose drain times out (a hung call) kills the worker: detached
  all the same;
- regenctl attach --device N --wait brings it back in a new generation,
  and imports work again; attach of a device that is not detached changes
  nothing; detach/attach without a target are usage errors;
- the Slurm and Kubernetes maintenance examples detach, run the reset,
  attach.

Usage: test_detach.py REGEND REGENCTL SOURCE_ROOT
"""
import os
import re
import subprocess
import sys
import time

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "lib"))
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from regend_fixture import (Conn, Regend, TIME_SCALE, VarlinkError, call, check, host_buffer, log, operand, pid_alive,
                            regend_path, wait_for)
from ctl import dev, generations, parse_metrics, run


def workers(d):
    """Device index -> pid of regend's worker processes (children)."""
    out = {}
    for pid in os.listdir("/proc"):
        if not pid.isdigit():
            continue
        try:
            with open("/proc/%s/stat" % pid) as f:
                stat = f.read()
            with open("/proc/%s/cmdline" % pid, "rb") as f:
                argv = f.read().split(b"\0")
        except OSError:
            continue
        if int(stat.rsplit(")", 1)[1].split()[1]) != d.pid or stat.rsplit(")", 1)[1].split()[0] == "Z":
            continue
        for i, a in enumerate(argv):
            if a in (b"--worker-device", b"--worker") and i + 1 < len(argv):
                out[int(argv[i + 1])] = int(pid)
    return out


def import_buffer_error(d, i):
    """The error name ImportBuffer on device i's socket gets, or None."""
    try:
        import_buffer(d, i)
        return None
    except VarlinkError as e:
        return e.name


def state(d, i):
    return call(d.socket, "io.regen.Device.Status")["devices"][i]


def import_buffer(d, i):
    fd, mm = host_buffer(4096)
    with Conn(d.worker_socket(i)) as c:
        return c.call("io.regen.Memory.ImportBuffer", {"device": i, "kind": "host_fd", "size": 4096, "fd": 0},
                      fds=[fd])


def expect_error(name, fn, what):
    try:
        fn()
    except VarlinkError as e:
        check(e.name == name, "%s: %s, wanted %s" % (what, e.name, name))
        return e
    check(False, "%s succeeded" % what)


def main():
    regend = regend_path()
    regenctl, source = os.path.abspath(sys.argv[2]), os.path.abspath(sys.argv[3])
    with Regend(regend, devices=3, extra=["--max-connections", "8"]) as d:
        before = workers(d)
        check(sorted(before) == [0, 1, 2], "worker processes: %s" % before)
        for verb in ("detach", "attach"):
            rc, out, err = run(regenctl, d, verb)
            check(rc == 2, "%s without a target: exit %d" % (verb, rc))

        watch = Conn(d.socket)
        watch.send("io.regen.Device.Watch", more=True)
        for _ in range(3):
            watch.reply()
        gen = state(d, 1)["generation"]
        rc, out, err = run(regenctl, d, "detach", "--device", "1", "--reason", "nvidia-smi -r")
        check(rc == 0 and "device 1" in out and "detached" in out, "detach: exit %d %s" % (rc, out))
        s = state(d, 1)
        check(s["state"] == "detached" and s["generation"] == gen + 1 and "nvidia-smi -r" in s["reason"],
              "Status after detach: %s" % s)
        check(not pid_alive(before[1]), "device 1's worker %d still runs" % before[1])
        # No worker runs: Status names none, not the one that exited.
        check(s["worker_pid"] == 0, "Status after detach names worker %d, which exited" % s["worker_pid"])
        rc, out, err = run(regenctl, d, "status")
        row = [l.split() for l in out.splitlines() if l.split()[:1] == ["1"]]
        check(rc == 0 and row and row[0][4] == "-", "regenctl status shows a worker of the detached device: %s" % out)
        check(sorted(workers(d)) == [0, 2], "worker processes after detach: %s" % workers(d))
        seen = []
        while not seen or seen[-1] != ("detached", 1):
            ev = watch.reply()
            seen.append((ev["state"], ev["device"]))
        check(("draining", 1) in seen, "Watch saw %s" % seen)
        watch.close()
        time.sleep(1.5 * TIME_SCALE)
        check(state(d, 1)["state"] == "detached" and sorted(workers(d)) == [0, 2], "a detached device came back")
        log("detach: drained, worker gone, Status and Watch say detached, nothing respawns it")

        e = expect_error("io.regen.Detached", lambda: import_buffer(d, 1), "ImportBuffer on a detached device")
        check(e.params.get("device") == 1 and "attach" in e.params.get("message", ""), "Detached: %s" % e.params)
        expect_error("io.regen.Detached", lambda: call(d.socket, "io.regen.Device.Restart", {"device": 1}),
                     "Restart of a detached device")
        expect_error("io.regen.Detached", lambda: call(d.socket, "io.regen.Device.InjectFault",
                                                       {"device": 1, "kind": "crash"}), "InjectFault")
        rc, out, err = run(regenctl, d, "restart", "--device", "1")
        check(rc == 1 and "io.regen.Detached" in err, "restart of a detached device: %d %s" % (rc, err))
        rc, out, err = run(regenctl, d, "detach", "--device", "1")
        check(rc == 0 and state(d, 1)["generation"] == gen + 1, "detach of a detached device changed it")
        rc, out, err = run(regenctl, d, "health")
        check(rc == 6 and "device 1: degraded (detached" in out, "health: %d %s" % (rc, out))
        rc, out, err = run(regenctl, d, "metrics")
        check(dev(parse_metrics(out)[0], "regen_device_state", 1, state="detached") == 1,
              "metrics lack the detached state")
        check(generations(d)[0] == 1 and generations(d)[2] == 1, "detach of device 1 touched the others")
        log("calls, Restart, InjectFault of a detached device: io.regen.Detached; health 6; metrics")

        held = [Conn(d.worker_socket(1)) for _ in range(8)]
        for c in held:
            expect_error("io.regen.Detached", lambda: c.call("io.regen.Device.Generation"), "a held connection")
        # The refusal comes unasked, then the close: read it, send nothing.
        ninth = Conn(d.worker_socket(1))
        e = expect_error("io.regen.LimitExceeded", lambda: ninth.reply(), "a 9th connection of one uid")
        check(e.params.get("resource") == "connections", "LimitExceeded: %s" % e.params)
        ninth.close()
        for c in held:
            c.close()
        wait_for(lambda: import_buffer_error(d, 1) == "io.regen.Detached", 5, "a connection after the 8 closed")
        log("the detached socket: 8 connections of one uid held, the 9th LimitExceeded {connections}")

        gen = state(d, 1)["generation"]
        rc, out, err = run(regenctl, d, "attach", "--device", "1", "--wait", "--timeout", "30")
        check(rc == 0 and re.search(r"device 1: ready in generation %d" % (gen + 1), out), "attach: %d %s" % (rc, out))
        check(state(d, 1)["state"] == "ready" and sorted(workers(d)) == [0, 1, 2], "after attach")
        check("buffer" in import_buffer(d, 1), "import after attach")
        rc, out, err = run(regenctl, d, "attach", "--device", "0", "--wait", "--timeout", "10")
        check(rc == 0 and state(d, 0)["generation"] == 1, "attach of an attached device: %d" % rc)
        log("attach: a new worker in a new generation; imports work; attach of an attached device: no-op")

        # A hung call: the drain times out, the worker is killed, detached.
        fd, mm = host_buffer(3 * 32 * 32 * 4)
        c = Conn(d.worker_socket(2))
        buf = c.call("io.regen.Memory.ImportBuffer", {"device": 2, "kind": "host_fd", "size": 3 * 32 * 32 * 4,
                                                      "fd": 0}, fds=[fd])["buffer"]
        call(d.socket, "io.regen.Device.InjectFault", {"device": 2, "kind": "hang"})
        c.send("io.regen.Compute.Gemm", {"a": operand(buf, 0, (32, 32)), "b": operand(buf, 0, (32, 32)),
                                         "d": operand(buf, 2 * 32 * 32 * 4, (32, 32))})
        time.sleep(0.3)
        pid2 = workers(d)[2]
        rc, out, err = run(regenctl, d, "detach", "--device", "2", "--deadline-ms", "300")
        check(rc == 0 and state(d, 2)["state"] == "detached" and not pid_alive(pid2), "detach of a hung device")
        c.close()
        rc, out, err = run(regenctl, d, "attach", "--device", "2", "--wait", "--timeout", "30")
        check(rc == 0 and state(d, 2)["state"] == "ready", "attach of device 2")
        log("detach with a hung call: killed, detached; attached again")

        # The maintenance examples, with the scheduler's tools as shims.
        bindir = os.path.join(d.dir, "bin")
        os.mkdir(bindir)
        trace = os.path.join(d.dir, "trace")
        for tool in ("scontrol", "squeue", "logger", "nvidia-smi"):
            with open(os.path.join(bindir, tool), "w") as f:
                f.write("#!/bin/sh\necho %s \"$@\" >> %s\n" % (tool, trace))
                if tool == "nvidia-smi":
                    # The reset happens while the devices are detached.
                    f.write("%s --socket %s --json status >> %s\n" % (regenctl, d.socket, trace))
            os.chmod(os.path.join(bindir, tool), 0o755)
        shim = os.path.join(bindir, "regenctl")
        with open(shim, "w") as f:
            f.write("#!/bin/sh\nexec %s --socket %s \"$@\"\n" % (regenctl, d.socket))
        os.chmod(shim, 0o755)
        env = {"PATH": bindir + ":/usr/bin:/bin", "REGENCTL": shim, "NODE": "n1"}
        gens = generations(d)
        p = subprocess.run(["sh", os.path.join(source, "docs", "examples", "slurm", "gpu-maintenance.sh"), "0,2",
                            "nvidia-smi", "-r", "-i", "0,2"], env=env, capture_output=True, text=True, timeout=120)
        text = open(trace).read()
        check(p.returncode == 0, "gpu-maintenance.sh: exit %d %s%s" % (p.returncode, p.stdout, p.stderr))
        check("nvidia-smi -r -i 0,2" in text and text.count('"state":"detached"') == 2, "the reset ran while "
              "devices 0 and 2 were detached: %s" % text)
        check("state=drain" in text and "state=resume" in text, "the node was not drained and resumed: %s" % text)
        after = generations(d)
        check(after[0] >= gens[0] + 2 and after[2] >= gens[2] + 2 and after[1] == gens[1], "generations %s -> %s" %
              (gens, after))
        yaml = open(os.path.join(source, "docs", "examples", "kubernetes", "regen-gpu-maintenance.yaml")).read()
        script = re.search(r"- \|\n((?:              .*\n)+)", yaml).group(1)
        os.remove(trace)
        p = subprocess.run(["sh", "-c", script], env=dict(env, DEVICES="1"), capture_output=True, text=True,
                           timeout=120)
        text = open(trace).read()
        check(p.returncode == 0 and '"state":"detached"' in text and state(d, 1)["state"] == "ready",
              "the Kubernetes maintenance job: exit %d %s %s" % (p.returncode, p.stderr, text))
        log("the Slurm and Kubernetes maintenance examples detach, reset, attach")
    return 0


if __name__ == "__main__":
    sys.exit(main())
