#!/usr/bin/env python3
# SPDX-License-Identifier: Apache-2.0
"""SIGHUP that lowers heartbeat_ms 4 times (2000 to 500): the workers stay
(same generations, same pids). The heartbeat timer kept its old interval
while the verdict took the new heartbeat_ms, so every healthy worker read as
silent too long and was killed by the reload.

Usage: test_sighup_heartbeat.py REGEND
"""
import os
import signal
import sys
import time

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "lib"))
from regend_fixture import Regend, check, log, regend_path, try_status


def main():
    with Regend(regend_path(), devices=2, config="") as d:
        before = try_status(d.socket)["devices"]
        with open(d.config, "w") as f:
            f.write("heartbeat_ms = 500\n")
        d.signal(signal.SIGHUP)
        time.sleep(3)
        after = try_status(d.socket)["devices"]
        log("before %r, after %r" % ([(x["generation"], x["worker_pid"]) for x in before],
                                     [(x["generation"], x["worker_pid"], x["state"]) for x in after]))
        check([(x["generation"], x["worker_pid"]) for x in after] ==
              [(x["generation"], x["worker_pid"]) for x in before], "a reload of heartbeat_ms replaced workers")
        check(all(x["state"] == "ready" for x in after), "devices after the reload: %r" % after)
        # The new heartbeat still finds a worker that stops answering.
        os.kill(after[1]["worker_pid"], signal.SIGSTOP)
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline and try_status(d.socket)["devices"][1]["worker_pid"] == after[1]["worker_pid"]:
            time.sleep(0.05)
        check(try_status(d.socket)["devices"][1]["worker_pid"] != after[1]["worker_pid"],
              "a stopped worker was not replaced under the reloaded heartbeat")
    log("PASS")
    return 0


if __name__ == "__main__":
    sys.exit(main())
