#!/usr/bin/env python3
# SPDX-License-Identifier: Apache-2.0
"""Watches whose client never reads: regend stops reading such a peer, but
events go on coming with every lifecycle change, and any uid may hold 64
Watches. A watcher that leaves more than 256 KiB of events unread is dropped
(its connection closed, a warning logged), so the supervisor stays bounded:
with 32 unread Watches and Releases for 6 s (longer until a drop is
logged, where Releases are slow) it grows by less than 32 MiB (it had grown
without bound: 16 such Watches, 348 MB in 40 s); the bound is not checked
under AddressSanitizer, whose quarantine keeps freed memory. A
Watch that reads keeps its events.

Usage: test_watch_unread.py REGEND
"""
import os
import sys
import time

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "lib"))
from regend_fixture import Conn, Regend, call, check, log, regend_path, rss_kib


def sanitized(pid):
    """AddressSanitizer keeps freed memory in its quarantine: growth says
    nothing there, and the bound is checked only without it."""
    with open("/proc/%d/maps" % pid) as f:
        return "libasan" in f.read()


def main():
    if os.geteuid() != 0:
        log("SKIP: Release needs an admin; run as root")
        return 77
    with Regend(regend_path(), devices=1) as d:
        unread = []
        for _ in range(32):
            c = Conn(d.socket)
            c.sock.setsockopt(__import__("socket").SOL_SOCKET, __import__("socket").SO_RCVBUF, 4096)
            c.send("io.regen.Device.Watch", {}, more=True)
            unread.append(c)
        reader = Conn(d.socket, timeout=30)
        reader.send("io.regen.Device.Watch", {}, more=True)
        reader.reply()
        before = (rss_kib(d.pid) or 0)
        admin = Conn(d.socket, timeout=30)
        releases, seen, dropped = 0, 0, False
        t0 = time.monotonic()
        # 6 s of Releases, longer (up to 60 s) until a drop is logged: under
        # AddressSanitizer a Release is slow enough that 6 s made fewer
        # events than the 256 KiB (past the sockets' buffers) a drop takes.
        checked = t0
        while time.monotonic() - t0 < 6 or (time.monotonic() - t0 < 60 and not dropped):
            if time.monotonic() - checked >= 1:
                checked = time.monotonic()
                dropped = "dropping a Watch whose client left" in d.log_text()
            admin.call("io.regen.Device.Release", {"device": 0, "reason": "test_watch_unread"})
            releases += 1
            # The reading watcher keeps up: every transition's event comes.
            reader.sock.setblocking(False)
            try:
                while True:
                    reader.reply(0.001)
                    seen += 1
            except Exception:
                pass
            reader.sock.setblocking(True)
        grew = (rss_kib(d.pid) or 0) - before
        log("%d Releases with 32 unread Watches: supervisor grew %d kB; the reading Watch saw %d events" %
            (releases, grew, seen))
        if not sanitized(d.pid):
            check(grew < 32 * 1024, "the supervisor grew %d kB with unread Watches" % grew)
        check("dropping a Watch whose client left" in d.log_text(), "no unread Watch was dropped")
        check(seen > 0, "the reading Watch saw no event")
        st = call(d.socket, "io.regen.Device.Status")
        check(st["devices"][0]["state"] in ("ready", "draining", "released"), "Status: %r" % st)
        for c in unread:
            c.close()
    log("PASS")
    return 0


if __name__ == "__main__":
    sys.exit(main())
