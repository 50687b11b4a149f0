#!/usr/bin/env python3
# SPDX-License-Identifier: Apache-2.0
"""regenctl watch follows regend across a restart of regend.

`regenctl watch` runs while regend stops (SIGTERM: its Watch ends with
io.regen.Draining) and a new regend starts on the same socket: watch says
on stderr that regend went away and that it is back, subscribes again (the
new subscription's events say where every device stands), and prints the
new regend's transitions. It used to end with regend.

Usage: test_watch_restart.py REGEND REGENCTL
"""
import os
import subprocess
import sys
import threading
import time

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "lib"))
from regend_fixture import TIME_SCALE, Regend, call, check, fail, log, regend_path


class Lines:
    """A process's stdout, line by line, as it comes."""

    def __init__(self, proc):
        self.lines, self.cond = [], threading.Condition()
        threading.Thread(target=self.read, args=(proc.stdout,), daemon=True).start()

    def read(self, f):
        for line in f:
            with self.cond:
                self.lines.append(line.rstrip("\n"))
                self.cond.notify_all()

    def wait(self, pred, timeout, what):
        deadline = time.monotonic() + timeout * TIME_SCALE
        with self.cond:
            while not any(pred(l) for l in self.lines):
                left = deadline - time.monotonic()
                check(left > 0, "timed out waiting for %s; watch printed:\n%s" % (what, "\n".join(self.lines)))
                self.cond.wait(left)


def main():
    regend = regend_path()
    regenctl = os.path.abspath(sys.argv[2])
    first = Regend(regend, devices=1)
    sock = first.socket
    watch = subprocess.Popen([regenctl, "--socket", sock, "watch", "--timeout", str(60 * TIME_SCALE)],
                             stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    second = None
    try:
        out = Lines(watch)
        out.wait(lambda l: "reason subscribed" in l, 10, "the first subscription")
        call(sock, "io.regen.Device.Restart", {"device": 0, "reason": "before"})
        out.wait(lambda l: "state ready" in l and "before" in l, 10, "the first regend's restart")
        first.stop()
        time.sleep(0.5)
        if watch.poll() is not None:
            fail("watch ended with regend (exit %s): %s" % (watch.returncode, watch.stderr.read()))
        # A new regend on the same socket, in a folder of its own.
        second = Regend(regend, devices=1, start=False)
        second.argv[second.argv.index("--socket") + 1] = sock
        second.socket = sock
        time.sleep(0.3)
        # Counted before the start: watch may subscribe again before
        # start() returns (a slow, sanitized regend says it is ready late).
        nsub = len([l for l in out.lines if "reason subscribed" in l])
        second.start()
        out.wait(lambda l: len([x for x in out.lines if "reason subscribed" in x]) > nsub, 20,
                 "a second subscription to the new regend")
        call(sock, "io.regen.Device.Restart", {"device": 0, "reason": "after"})
        out.wait(lambda l: "state ready" in l and "after" in l, 10, "the new regend's restart")
        check(watch.poll() is None, "watch ended (exit %s)" % watch.returncode)
        watch.terminate()
        watch.wait(10 * TIME_SCALE)
        err = watch.stderr.read()
    finally:
        if watch.poll() is None:
            watch.kill()
            watch.wait()
        first.finish()
        if second:
            second.stop()
    log("watch printed:\n%s\n%s" % ("\n".join(out.lines), err))
    check("regend went away" in err and "watching again" in err and "regend is back" in err,
          "watch did not say that regend went away and came back: %r" % err)
    log("PASS: regenctl watch followed regend across its restart")
    return 0


if __name__ == "__main__":
    sys.exit(main())
