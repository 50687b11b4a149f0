#!/usr/bin/env python3
# SPDX-License-Identifier: Apache-2.0
"""A worker that keeps crashing is respawned after a growing pause, however
long each one lived: one that crashes 2.5 s after it serves, five times in a
row, gets its first successor at once (one loss is not a loop, and a rank
waits for it), then waits 200, 400, 800, then 1600 ms. The crash streak
ended whenever a worker had lived 2 s, so a worker crash-looping every 2.5 s
(a client replaying the input that kills it) was respawned at once every
time, each a generation bump for every client of the device.

Usage: test_respawn_backoff.py REGEND
"""
import os
import sys
import time

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "lib"))
from regend_fixture import Regend, VarlinkError, Closed, call, check, log, regend_path, try_status, wait_for

CRASHES = 5
LIVES_S = 2.5


def main():
    with Regend(regend_path(), devices=1) as d:
        gaps = []
        for i in range(CRASHES):
            dev = wait_for(lambda: (lambda s: s and s["devices"][0]["state"] == "ready" and s["devices"][0])(
                try_status(d.socket)), 30, "device 0 ready")
            pid = dev["worker_pid"]
            # It served before we saw it ready: it lives at least this long.
            time.sleep(LIVES_S)
            t0 = time.monotonic()
            try:
                call(d.socket, "io.regen.Device.InjectFault", {"device": 0, "kind": "crash"})
            except (VarlinkError, Closed, OSError):
                pass

            def successor_serves():
                s = try_status(d.socket)
                return s and s["devices"][0]["worker_pid"] != pid and s["devices"][0]["state"] == "ready"
            wait_for(successor_serves, 30, "the successor of worker %d" % pid, interval=0.01)
            gaps.append(time.monotonic() - t0)
            log("crash %d of worker %d after %.1f s: the next serves %.2f s later" % (i + 1, pid, LIVES_S, gaps[-1]))
        check(gaps[-1] >= 1.2, "worker %d of a crash streak (each lived %.1f s) served %.2f s after the crash: no "
              "growing pause (gaps %s)" % (CRASHES, LIVES_S, gaps[-1], ["%.2f" % g for g in gaps]))
        check(all(b > a for a, b in zip(gaps, gaps[1:])), "the pauses do not grow: %s" % ["%.2f" % g for g in gaps])
        check("next worker in 1600 ms" in d.log_text(), "the log does not say the pause before the 5th successor")
        check(gaps[0] < 1.0 and "1 lost in a row" not in d.log_text(),
              "the first successor of a worker lost once waited (%.2f s): one loss is not a crash loop" % gaps[0])
    log("PASS")
    return 0


if __name__ == "__main__":
    sys.exit(main())
