#!/usr/bin/env python3
# SPDX-License-Identifier: Apache-2.0
"""A device the node's software cannot drive is `unsupported`, and says why.

1. The CUDA backend's module is not installed (REGEN_BACKEND_DIR names an
   empty folder, as a node without the regen-cuda package has none):
   Status says `unsupported` with a reason that names backend-cuda.so and
   the package to install, and carries a health object; `regenctl health`
   exits 9 (`unsupported`), `regenctl status` shows the state, the metrics'
   state gauge has it; the supervisor keeps serving and does not respawn
   the worker in a loop.
2. The module built here, where the driver cannot serve the CUDA runtime
   (CI: no NVIDIA driver at all; a node with a driver older than CUDA
   13.0's): `unsupported`, with a reason that names the driver. Where the
   GPU serves instead, that is checked and said.
3. The module under a driver older than the CUDA runtime (old_driver's
   libcuda.so.1, which says CUDA 12.4, first on LD_LIBRARY_PATH, on any
   machine): `unsupported`, the reason naming the driver's CUDA version,
   the runtime's, and the upgrade; not a GPU that fell off the bus.

Usage: test_unsupported.py REGEND REGENCTL MODULE|none [OLD_DRIVER]
"""
import json
import os
import sys
import time

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "lib"))
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from regend_fixture import Regend, check, log, pid_alive, regend_path, skip, try_status, wait_for
from ctl import parse_metrics, run


def settled(d):
    """Device 0 once its first start is over (not respawning any more)."""
    st = try_status(d.socket)
    if st and st["devices"][0]["state"] not in ("respawning",):
        return st["devices"][0]
    return None


def check_unsupported(regenctl, d, dev, words):
    check(dev["state"] == "unsupported", "state %r, wanted unsupported: %r" % (dev["state"], dev))
    for w in words:
        check(w in dev["reason"], "the reason does not say %r: %r" % (w, dev["reason"]))
    check("its log says why" not in dev["reason"], "the reason sends the reader to the log: %r" % dev["reason"])
    check(dev["worker_pid"] == 0, "Status names worker %d, which exited" % dev["worker_pid"])
    check(isinstance(dev.get("health"), dict) and dev["health"].get("source") == "unavailable",
          "Status has no health object for it: %r" % dev)
    rc, out, err = run(regenctl, d, "health")
    check(rc == 9 and out.splitlines()[-1] == "unsupported", "health: exit %d, %r" % (rc, out))
    rc, out, err = run(regenctl, d, "--json", "health")
    check(rc == 9 and json.loads(out)["devices"][0]["health"] == "unsupported", "--json health: %d %s" % (rc, out))
    rc, out, err = run(regenctl, d, "status")
    check(rc == 0 and " unsupported " in out, "status: %s" % out)
    samples, _ = parse_metrics(run(regenctl, d, "metrics")[1])
    state = [v for (n, l), v in samples.items() if n == "regen_device_state" and ("state", "unsupported") in l]
    check(state == [1.0], "regen_device_state{state=\"unsupported\"}: %r" % state)
    # Tried again only after failed_retry_ms (30 s here): no loop.
    respawns = dev["respawns"]
    time.sleep(1.0)
    again = try_status(d.socket)["devices"][0]
    check(again["state"] == "unsupported" and again["respawns"] == respawns,
          "the worker was respawned in a loop: %r" % again)
    check(pid_alive(d.pid), "the supervisor died")


def main():
    regend = regend_path()
    regenctl = os.path.abspath(sys.argv[2])
    module = sys.argv[3] if len(sys.argv) > 3 else "none"
    old_driver = os.path.abspath(sys.argv[4]) if len(sys.argv) > 4 else None
    # meson puts the stand-in's folder on LD_LIBRARY_PATH (it is a library
    # the test names): only case 3 may load it, the others the machine's.
    old_dir = os.path.dirname(old_driver) if old_driver else None
    os.environ["LD_LIBRARY_PATH"] = ":".join(p for p in os.environ.get("LD_LIBRARY_PATH", "").split(":")
                                             if p and os.path.abspath(p) != old_dir)
    if module == "none":
        skip("this build has no CUDA backend: --backend cuda is refused at start")

    with Regend(regend, devices=1, backend="cuda", fault_injection=False, start=False) as d:
        empty = os.path.join(d.dir, "modules")
        os.mkdir(empty)
        d.start(wait=False, env={"REGEN_BACKEND_DIR": empty})
        dev = wait_for(lambda: settled(d), 30, "device 0's first start to end")
        check_unsupported(regenctl, d, dev, ["backend-cuda.so", empty, "regen-cuda"])
        check("the CUDA backend is not installed" in d.log_text(), "the journal does not say why:\n%s" % d.log_tail())
        log("no CUDA module: unsupported, named, health exit 9, no respawn loop")

    with Regend(regend, devices=1, backend="cuda", fault_injection=False, start=False) as d:
        d.start(wait=False, env={"REGEN_BACKEND_DIR": os.path.dirname(os.path.abspath(module))})
        dev = wait_for(lambda: settled(d), 60, "device 0's first start to end")
        if dev["state"] == "ready":
            log("this machine's driver serves the CUDA runtime: device 0 is ready, nothing unsupported to see")
        else:
            check_unsupported(regenctl, d, dev, ["driver"])
            log("the driver cannot serve the CUDA runtime: unsupported: %s" % dev["reason"])

    if old_driver:
        with Regend(regend, devices=1, backend="cuda", fault_injection=False, start=False) as d:
            path = ":".join(filter(None, [old_dir, os.environ["LD_LIBRARY_PATH"]]))
            d.start(wait=False, env={"REGEN_BACKEND_DIR": os.path.dirname(os.path.abspath(module)),
                                     "LD_LIBRARY_PATH": path})
            dev = wait_for(lambda: settled(d), 60, "device 0's first start to end")
            check_unsupported(regenctl, d, dev, ["the NVIDIA driver supports CUDA 12.4, older than the CUDA ",
                                                 "upgrade the driver"])
            check("fell off the bus" not in dev["reason"], "a driver too old reads as a dead GPU: %r" % dev["reason"])
            log("a driver older than the runtime: unsupported: %s" % dev["reason"])
    log("PASS")
    return 0


if __name__ == "__main__":
    sys.exit(main())
