#!/usr/bin/env python3
# SPDX-License-Identifier: Apache-2.0
"""How the worker's context shares its GPU (io.regen.Device.Sharing), on the
host backend, where nothing is shared:

- Status has `sharing` for every device once its worker is up, with
  `mps` false and a reason that says why; the IDL's field types hold;
- the MPS environment of regend (CUDA_MPS_PIPE_DIRECTORY,
  CUDA_MPS_LOG_DIRECTORY) reaches every worker, a respawned one too (read
  from the worker's /proc/PID/environ and from Status's
  `mps_pipe_directory`); without it `mps_pipe_directory` is "";
- `regenctl status` shows the SHARING column (`isolated`), `regenctl
  metrics` the gauge regen_device_mps (0), `regenctl --json status` the
  object as regend sent it;
- no MPS warning in the log of a host-backend regend, even with a pipe
  directory named (MPS does not apply to it).

The CUDA side (a worker that is an MPS client reports `mps` true, and what a
rank sees when regend's worker faults under MPS) is tests/gpu/test_mps.py.

Usage: test_sharing.py REGEND REGENCTL
"""
import os
import sys
import tempfile

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "lib"))
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from regend_fixture import Regend, call, check, log, regend_path, wait_for
from ctl import dev as sample_of, parse_metrics, run


def environ(pid):
    with open("/proc/%d/environ" % pid, "rb") as f:
        pairs = [x.split(b"=", 1) for x in f.read().split(b"\0") if b"=" in x]
    return {k.decode(): v.decode(errors="replace") for k, v in pairs}


def sharing_of(dev):
    s = dev.get("sharing")
    check(isinstance(s, dict), "device %s has no sharing: %s" % (dev.get("index"), dev))
    check(isinstance(s.get("mps"), bool) and isinstance(s.get("mps_pipe_directory"), str) and
          isinstance(s.get("reason"), str), "sharing's fields are not of the IDL's types: %s" % s)
    check("compute_mode" not in s or isinstance(s["compute_mode"], str), "compute_mode: %s" % s)
    check("mps_clients" not in s or (isinstance(s["mps_clients"], int) and s["mps_clients"] >= 0),
          "mps_clients: %s" % s)
    return s


def main():
    regend = regend_path()
    regenctl = os.path.abspath(sys.argv[2])
    pipe = tempfile.mkdtemp(prefix="regen-test-mps-pipe-")
    logs = tempfile.mkdtemp(prefix="regen-test-mps-log-")
    env = {"CUDA_MPS_PIPE_DIRECTORY": pipe, "CUDA_MPS_LOG_DIRECTORY": logs}
    with Regend(regend, devices=2, env=env) as d:
        devices = call(d.socket, "io.regen.Device.Status")["devices"]
        for dev in devices:
            s = sharing_of(dev)
            check(s["mps"] is False, "the host backend says MPS: %s" % s)
            check("host backend" in s["reason"] and "MPS does not apply" in s["reason"],
                  "the reason does not say why: %r" % s["reason"])
            check(s["mps_pipe_directory"] == pipe, "Status's pipe directory %r, regend's %r" %
                  (s["mps_pipe_directory"], pipe))
            e = environ(dev["worker_pid"])
            check(e.get("CUDA_MPS_PIPE_DIRECTORY") == pipe and e.get("CUDA_MPS_LOG_DIRECTORY") == logs,
                  "worker %d's MPS environment: %s" % (dev["worker_pid"],
                                                      {k: v for k, v in e.items() if k.startswith("CUDA_MPS")}))
        # A respawned worker gets it too.
        old = devices[1]["worker_pid"]
        call(d.socket, "io.regen.Device.InjectFault", {"device": 1, "kind": "crash"})
        dev = wait_for(lambda: next((x for x in call(d.socket, "io.regen.Device.Status")["devices"]
                                     if x["index"] == 1 and x["state"] == "ready" and x["worker_pid"] != old), None),
                       30, "device 1 served by a new worker")
        check(environ(dev["worker_pid"]).get("CUDA_MPS_PIPE_DIRECTORY") == pipe,
              "the respawned worker lacks CUDA_MPS_PIPE_DIRECTORY")
        check(sharing_of(dev)["mps_pipe_directory"] == pipe, "Status after the respawn: %s" % dev["sharing"])
        log("the MPS environment reaches every worker, a respawned one too; Status says sharing.mps false")

        rc, out, err = run(regenctl, d, "status")
        lines = out.splitlines()
        check(rc == 0 and lines and lines[0].split()[-1] == "SHARING", "status has no SHARING column: %s" % out)
        check(all(line.split()[-1] == "isolated" for line in lines[1:]) and len(lines) == 3,
              "SHARING is not `isolated` on every device: %s" % out)
        rc, out, err = run(regenctl, d, "metrics")
        samples, types = parse_metrics(out)
        check(rc == 0 and sample_of(samples, "regen_device_mps", 0) == 0 and
              sample_of(samples, "regen_device_mps", 1) == 0
              and types.get("regen_device_mps") == "gauge", "metrics lack regen_device_mps 0: %s" % out)
        rc, out, err = run(regenctl, d, "--json", "status")
        check(rc == 0 and '"sharing":{"mps":false' in out, "--json status lacks sharing: %s" % out)
        check("MPS client" not in d.log_text(),
              "a host-backend regend warned about MPS:\n%s" % d.log_tail())

    # Without the environment: nothing named.
    saved = {k: os.environ.pop(k) for k in list(os.environ) if k.startswith("CUDA_MPS_")}
    try:
        with Regend(regend, devices=1) as d:
            s = sharing_of(call(d.socket, "io.regen.Device.Status")["devices"][0])
            check(s["mps"] is False and s["mps_pipe_directory"] == "", "without MPS variables: %s" % s)
    finally:
        os.environ.update(saved)
    os.rmdir(pipe)
    os.rmdir(logs)
    log("without the MPS variables, sharing names no pipe directory")
    return 0


if __name__ == "__main__":
    sys.exit(main())
