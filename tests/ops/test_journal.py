#!/usr/bin/env python3
# SPDX-License-Identifier: Apache-2.0
"""regend's log lines in the journal carry their priority.

systemd connects a service's stderr to journald and says so in
JOURNAL_STREAM=DEV:INO. Then every line regend (supervisor and workers)
writes starts with its syslog priority, "<4>" for a warning, "<6>" for
information, as sd-daemon(3) describes, so that `journalctl -u regend -p
warning` shows regend's warnings. Without JOURNAL_STREAM, or with one that
names another file (inherited from elsewhere), lines are plain.

Usage: test_journal.py REGEND
"""
import os
import re
import sys
import time

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "lib"))
from regend_fixture import Regend, call, check, log, regend_path, wait_for

LINE = re.compile(r"^(<[0-7]>)?(regend|regend-worker)\[\d+\] ([EWIDT]) ")
PRIORITY = {"E": "<3>", "W": "<4>", "I": "<6>", "D": "<7>", "T": "<7>"}


def run(regend, journal_stream):
    """Starts regend with its stderr in its log file and JOURNAL_STREAM set
    by journal_stream(stat of that file) (None: unset), crashes a worker so
    that warnings are written, and returns the log's lines."""
    d = Regend(regend, start=False, devices=1)
    open(d.log_path, "ab").close()
    st = os.stat(d.log_path)
    env = {}
    value = journal_stream(st)
    if value is not None:
        env["JOURNAL_STREAM"] = value
    try:
        d.start(env=env)
        before = call(d.socket, "io.regen.Device.Status")["devices"][0]["generation"]
        call(d.socket, "io.regen.Device.InjectFault", {"device": 0, "kind": "crash"})
        wait_for(lambda: call(d.socket, "io.regen.Device.Status")["devices"][0]["generation"] > before and
                 call(d.socket, "io.regen.Device.Status")["devices"][0]["state"] == "ready", 30, "respawn")
        time.sleep(0.1)
        return d.log_text().splitlines()
    finally:
        d.finish()


def main():
    regend = regend_path()
    lines = [l for l in run(regend, lambda st: "%d:%d" % (st.st_dev, st.st_ino)) if LINE.match(l)]
    check(lines, "regend logged nothing")
    levels = set()
    for l in lines:
        m = LINE.match(l)
        check(m.group(1) == PRIORITY[m.group(3)], "to the journal, a %s line starts %r: %s" % (m.group(3), m.group(1), l))
        levels.add(m.group(3))
    check("W" in levels and "I" in levels, "expected warnings and information from a worker crash, got %s" % levels)
    workers = [l for l in lines if "regend-worker[" in l]
    check(workers, "no worker line")
    log("journal: %d lines, each with its priority (%s), workers' too" % (len(lines), "".join(sorted(levels))))

    for name, stream in (("without JOURNAL_STREAM", lambda st: None),
                         ("with JOURNAL_STREAM naming another file", lambda st: "%d:%d" % (st.st_dev, st.st_ino + 1))):
        lines = [l for l in run(regend, stream) if LINE.match(l)]
        check(lines and all(LINE.match(l).group(1) is None for l in lines), "%s, a line has a priority prefix" % name)
        log("%s: %d plain lines" % (name, len(lines)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
