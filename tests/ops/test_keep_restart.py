#!/usr/bin/env python3
# SPDX-License-Identifier: Apache-2.0
"""Kept state outlives a restart of regend through the service manager's fd
store (FileDescriptorStoreMax=, sd_notify FDSTORE=1), as systemd keeps it
across `systemctl restart regend`; tests/lib/fd_store.py stands in for
systemd, passing the fds back as it does (LISTEN_FDS, LISTEN_PID,
LISTEN_FDNAMES).

Checks:
- regend SIGKILLed, and regend stopped with SIGTERM, then started again:
  every kept name comes back with its key, uid, size, committed step and
  its bytes as they were (TakeBack, compared byte for byte); a set that
  was held starts its lease at the restart, a leased one keeps its end;
  a dropped name is not there, and its fd left the store.
- The index is regend's own memfd, and what it says is checked on the way
  back in: a record whose size is not its memfd's, one whose job is not
  text, one whose both copies are damaged, two records that name one fd,
  a kept memfd swapped for one not sealed, are each refused (and their
  fds leave the store) while the rest comes back; an index that is not
  sealed is refused whole; a torn write of the newest copy falls back to
  the copy before it.
- Without a service manager (a plain regend), a restart frees what was
  kept.

Usage: test_keep_restart.py REGEND [--no-systemd]
Exit 77 (skipped) when regend was built without libsystemd.
"""
import hashlib
import os
import signal
import struct
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(os.path.dirname(HERE))
sys.path.insert(0, os.path.join(REPO, "tests", "lib"))
sys.path.insert(0, os.path.join(REPO, "client", "python"))
from fd_store import FdStore  # noqa: E402
from regend_fixture import Regend, check, log, regend_path, skip  # noqa: E402

import regen  # noqa: E402

LEASE_MS = 60000
# daemon/supervisor/keep_store.h: the index's header and records.
HEADER = struct.Struct("<QIIIIQQ24s")
RECORD = struct.Struct("<QQIIIIiIQQQQQIi72s72s24s")
RECORD_FIELDS = ("check", "version", "type", "uid", "rank", "kind", "device", "lease_ms", "size", "serial",
                 "kept_unix_ms", "step", "expires_unix_ms", "flags", "holder_pid", "job", "name", "reserved")
SET, NAME = 1, 2


def fnv1a(data):
    h = 0xcbf29ce484222325
    for b in data:
        h ^= b
        h = (h * 0x100000001b3) & 0xFFFFFFFFFFFFFFFF
    return h


class Index:
    """The store's index memfd, read and written as the layout says."""

    def __init__(self, fd):
        self.fd = fd
        h = HEADER.unpack(os.pread(fd, HEADER.size, 0))
        self.nslots = h[3]

    def at(self, slot, copy):
        return HEADER.size + (slot * 2 + copy) * RECORD.size

    def copy(self, slot, copy):
        raw = os.pread(self.fd, RECORD.size, self.at(slot, copy))
        r = dict(zip(RECORD_FIELDS, RECORD.unpack(raw)))
        r["whole"] = r["check"] == fnv1a(raw[8:])
        return r

    def newest(self, slot):
        copies = [c for c in (self.copy(slot, 0), self.copy(slot, 1)) if c["whole"]]
        return max(copies, key=lambda c: c["version"]) if copies else None

    def records(self):
        """{slot: newest whole record} of sets and names."""
        out = {}
        for s in range(self.nslots):
            r = self.newest(s)
            if r and r["type"] in (SET, NAME):
                out[s] = r
        return out

    def find(self, type_, job, name=None):
        for s, r in self.records().items():
            if r["type"] == type_ and r["job"].rstrip(b"\0").decode() == job and \
                    (name is None or r["name"].rstrip(b"\0").decode() == name):
                return s, r
        raise AssertionError("no record of %s %s in the index" % (job, name))

    def write(self, slot, r, copy=None, version=None):
        """r into the slot's older copy (or `copy`), checksummed, as regend
        writes it."""
        if copy is None:
            a, b = self.copy(slot, 0), self.copy(slot, 1)
            copy = 0 if (not a["whole"] or (b["whole"] and a["version"] < b["version"])) else 1
            version = max(a["version"], b["version"]) + 1
        fields = dict(r)
        fields["version"] = version if version is not None else r["version"] + 1
        raw = RECORD.pack(*[fields[k] for k in RECORD_FIELDS])
        raw = struct.pack("<Q", fnv1a(raw[8:])) + raw[8:]
        os.pwrite(self.fd, raw, self.at(slot, copy))

    def free_slot(self):
        for s in range(self.nslots):
            if self.newest(s) is None or self.newest(s)["type"] == 0:
                return s
        raise AssertionError("the index is full")


def memfd(data):
    fd = os.memfd_create("kept", os.MFD_CLOEXEC | os.MFD_ALLOW_SEALING)
    os.write(fd, data)
    return fd


def digest(fd, size):
    return hashlib.sha256(os.pread(fd, size, 0)).hexdigest()


def keep_in_child(sock, job, rank, name, data, step, lease_ms):
    """Keeps data under the key from another process, which commits step
    and exits: the set is leased from then on."""
    code = ("import os, sys; sys.path.insert(0, %r); import regen\n"
            "c = regen.Client(%r)\n"
            "fd = os.memfd_create('kept', os.MFD_ALLOW_SEALING); os.write(fd, sys.stdin.buffer.read())\n"
            "c.keep(%d, %r, fd, job=%r, lease_ms=%d); c.commit(%d, %d, job=%r)\n"
            % (os.path.join(REPO, "client", "python"), sock, rank, name, job, lease_ms, rank, step, job))
    subprocess.run([sys.executable, "-c", code], input=data, check=True, timeout=60)


def listing(c):
    return {(k["job"], k["rank"], k["name"]): k for k in c.kept(uid=os.getuid())}


def restart(daemon, store, how):
    if how == "kill":
        daemon.kill()
    elif how == "term":
        daemon.signal(signal.SIGTERM)
        check(daemon.wait(30) == 0, "regend's exit status after SIGTERM")
    store.pump()
    daemon.start(**store.start_args())
    return regen.Client(daemon.socket, timeout=30)


def kept_fd_names(store):
    return sorted(n for n in store.names() if n.startswith("regen-kept."))


def survives_restarts(regend):
    with Regend(regend, devices=1, start=False, extra=["--keep-lease-ms", str(LEASE_MS)]) as daemon:
        store = FdStore(daemon.dir)
        daemon.start(**store.start_args())
        c = regen.Client(daemon.socket, timeout=30)
        data = {("A", 0, "w"): os.urandom(3 << 20), ("A", 0, "m"): os.urandom((1 << 20) + 3),
                ("B", 1, "w"): os.urandom(2 << 20), ("C", 0, "x"): os.urandom(4096)}
        for (job, rank, name), d in data.items():
            if job != "B":
                c.keep(rank, name, memfd(d), job=job)
        c.commit(0, 41, job="A")
        keep_in_child(daemon.socket, "B", 1, "w", data[("B", 1, "w")], 7, 20000)
        c.drop("C")
        del data[("C", 0, "x")]
        before = listing(c)
        check(sorted(before) == sorted(data), "kept before the restart: %r" % sorted(before))
        check(before[("A", 0, "w")]["held"] and not before[("B", 1, "w")]["held"], "A held, B leased: %r" % before)
        store.pump()
        check(len(kept_fd_names(store)) == 3, "the store holds the three kept fds (C's went with its Drop): %r"
              % store.names())
        check([n for n in store.names() if n.startswith("regen-keep-index.")] == ["regen-keep-index.1"],
              "the store holds regend's index: %r" % store.names())

        for how in ("kill", "term"):
            t = time.time()
            old, c = c, restart(daemon, store, how)
            old.close()
            after = listing(c)
            check(sorted(after) == sorted(data), "after %s: kept %r" % (how, sorted(after)))
            for key, k in after.items():
                b = before[key]
                for field in ("uid", "kind", "size", "step", "lease_ms", "kept_unix_ms"):
                    check(k.get(field) == b.get(field), "%s after %s: %s %r, was %r" % (key, how, field,
                                                                                     k.get(field), b.get(field)))
                check(not k["held"], "%s is held by nobody after the restart" % (key,))
            # A held set's lease starts at the restart; a leased one's end
            # stays where it was.
            a_end = after[("A", 0, "w")]["expires_unix_ms"]
            check(abs(a_end - (t * 1000 + LEASE_MS)) < 15000, "A's lease ends %d ms after the restart, not %d"
                  % (a_end - t * 1000, LEASE_MS))
            if how == "kill":
                b_end = after[("B", 1, "w")]["expires_unix_ms"]
                check(abs(b_end - before[("B", 1, "w")]["expires_unix_ms"]) < 50,
                      "B's lease end moved across the restart: %d -> %d" % (before[("B", 1, "w")]["expires_unix_ms"],
                                                                            b_end))
            for (job, rank, name), d in data.items():
                k, fd = c.take_back(rank, name, job=job)
                check(k["size"] == len(d) and digest(fd, len(d)) == hashlib.sha256(d).hexdigest(),
                      "%s/%d/%s after %s: not the bytes kept" % (job, rank, name, how))
                os.close(fd)
            indexes = [n for n in store.names() if n.startswith("regen-keep-index.")]
            check(len(indexes) == 1 and len(kept_fd_names(store)) == 3, "after %s the store holds one index and the three fds: %r"
                  % (how, store.names()))
            log("after %s: %d names back, bytes identical, leases right; store %r" % (how, len(after), indexes))
            # Taken back: held now; a commit in the restarted regend is kept
            # across the next restart too.
            c.commit(0, 42, job="A")
            before = listing(c)
            check(before[("A", 0, "w")]["step"] == 42, "A's commit after the restart: %r" % before[("A", 0, "w")])
            for key in before:
                before[key]["held"] = False
        c.close()
        store.close()


def checks_what_comes_back(regend):
    with Regend(regend, devices=1, start=False, extra=["--keep-lease-ms", str(LEASE_MS)]) as daemon:
        store = FdStore(daemon.dir)
        daemon.start(**store.start_args())
        c = regen.Client(daemon.socket, timeout=30)
        jobs = ["size", "text", "torn", "both", "twice1", "twice2", "unsealed", "good"]
        data = {job: os.urandom(8192 + i) for i, job in enumerate(jobs)}
        for job in jobs:
            c.keep(0, "w", memfd(data[job]), job=job)
        c.commit(0, 5, job="torn")
        c.commit(0, 6, job="torn")
        daemon.kill()
        c.close()
        store.pump()
        index = Index(store.fd([n for n in store.names() if n.startswith("regen-keep-index.")][0]))

        s, r = index.find(NAME, "size")
        r["size"] += 4096
        index.write(s, r)
        s, r = index.find(SET, "text")
        r["job"] = b"te\x01xt"
        index.write(s, r)
        # A write torn in the newest copy of torn's set (step 6): the copy
        # before it (step 5) is what comes back.
        s, r = index.find(SET, "torn")
        check(r["step"] == 6, "torn's set record says step %d" % r["step"])
        newer = 0 if index.copy(s, 0)["version"] == r["version"] else 1
        os.pwrite(index.fd, b"\xff" * 40, index.at(s, newer) + 100)
        # Both copies of a name's slot damaged.
        s, r = index.find(NAME, "both")
        for copy in (0, 1):
            os.pwrite(index.fd, b"\x00" * 16, index.at(s, copy) + 40)
        # A second record naming twice1's fd (as twice2's would).
        s1, r1 = index.find(NAME, "twice1")
        s2, r2 = index.find(NAME, "twice2")
        r2["serial"] = r1["serial"]
        index.write(s2, r2)
        # unsealed's memfd swapped for one of the same bytes, not sealed.
        _, ru = index.find(NAME, "unsealed")
        store.replace("regen-kept.%d" % ru["serial"], memfd(data["unsealed"]))

        c = restart(daemon, store, "none")
        after = listing(c)
        back = sorted({job for job, _, _ in after})
        check(back == ["good", "torn"], "what came back: %r (the rest refused)" % back)
        check(after[("torn", 0, "w")]["step"] == 5, "torn's step after its torn record: %r" % after[("torn", 0, "w")])
        for job in back:
            k, fd = c.take_back(0, "w", job=job)
            check(digest(fd, k["size"]) == hashlib.sha256(data[job]).hexdigest(), "%s: not the bytes kept" % job)
            os.close(fd)
        check(len(kept_fd_names(store)) == 2, "the refused fds left the store: %r" % store.names())
        text = daemon.log_text()
        for what in ("its memfd's size is not the record's", "its job is not 1 to 64 printable bytes",
                     "that another record names too", "not a memfd sealed against shrinking and growing"):
            check(what in text, "regend's log does not say %r" % what)
        log("refused: a wrong size, a job that is not text, two copies damaged, one fd named twice, an unsealed "
            "memfd; a torn newest copy fell back to step 5")

        # An index that is not sealed is not read at all.
        daemon.kill()
        c.close()
        store.pump()
        name = [n for n in store.names() if n.startswith("regen-keep-index.")][0]
        old = store.fd(name)
        size = os.fstat(old).st_size
        unsealed = os.memfd_create("index", os.MFD_CLOEXEC)
        os.write(unsealed, os.pread(old, size, 0))
        store.replace(name, unsealed)
        c = restart(daemon, store, "none")
        check(listing(c) == {}, "kept after an unsealed index: %r" % listing(c))
        check(kept_fd_names(store) == [], "the store still holds %r" % store.names())
        check("is not sealed against shrinking and growing" in daemon.log_text(), "the log does not say why")
        log("an unsealed index refused whole; its fds freed")
        c.close()
        store.close()


def plain_regend_frees_on_restart(regend):
    with Regend(regend, devices=1) as daemon:
        c = regen.Client(daemon.socket, timeout=30)
        c.keep(0, "w", memfd(b"x" * 4096), job="plain")
        c.close()
        daemon.kill()
        daemon.start()
        c = regen.Client(daemon.socket, timeout=30)
        check(listing(c) == {}, "a plain regend kept across its restart: %r" % listing(c))
        c.close()
    log("without a service manager's fd store, a restart frees what was kept")


def main():
    regend = regend_path()
    if "--no-systemd" in sys.argv[2:]:
        skip("regend was built without libsystemd: no fd store")
    survives_restarts(regend)
    checks_what_comes_back(regend)
    plain_regend_frees_on_restart(regend)
    log("PASS")


if __name__ == "__main__":
    main()
