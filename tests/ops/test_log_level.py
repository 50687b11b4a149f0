#!/usr/bin/env python3
# SPDX-License-Identifier: Apache-2.0
"""log_level reaches the workers, at start and on SIGHUP. It was a key of
the file alone, never handed on: every worker logged at info whatever
regend.conf said, and a reload changed only the supervisor's level.

With `log_level = warn` no process of regend writes an info line (the
worker's "serving on" was one); after SIGHUP with `log_level = debug` the
same worker writes its debug lines (a connection to its socket). REGEN_DEBUG
is not set here: it would win over both.

Usage: test_log_level.py REGEND
"""
import os
import re
import signal
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "lib"))
from regend_fixture import Conn, Regend, call, check, log, regend_path, skip, wait_for


def lines(d, role, level):
    return [l for l in d.log_text().splitlines() if re.match(r"%s\[\d+\] %s " % (role, level), l)]


def main():
    if os.environ.get("REGEN_DEBUG"):
        skip("REGEN_DEBUG is set: it wins over log_level")
    with Regend(regend_path(), devices=1, config="log_level = warn\n") as d:
        pid = call(d.socket, "io.regen.Device.Status")["devices"][0]["worker_pid"]
        for role in ("regend", "regend-worker"):
            info = lines(d, role, "I")
            check(not info, "log_level = warn, yet %s writes info lines: %r" % (role, info[:3]))
        log("log_level = warn: no info line from the supervisor or the worker")

        with open(d.config, "w") as f:
            f.write("log_level = debug\n")
        d.signal(signal.SIGHUP)
        wait_for(lambda: "SIGHUP: reloaded" in d.log_text(), 10, "the supervisor's reload")

        def worker_debugs():
            with Conn(d.worker_socket(0)) as c:
                c.call("io.regen.Device.Generation")
            return lines(d, "regend-worker", "D")
        debug = wait_for(worker_debugs, 5, "a debug line from the worker after SIGHUP with log_level = debug")
        check(call(d.socket, "io.regen.Device.Status")["devices"][0]["worker_pid"] == pid,
              "the worker was replaced")
        log("after SIGHUP, worker %d logs at debug: %s" % (pid, debug[0]))
    log("PASS")
    return 0


if __name__ == "__main__":
    sys.exit(main())
