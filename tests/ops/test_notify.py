#!/usr/bin/env python3
# SPDX-License-Identifier: Apache-2.0
"""regend's sd_notify protocol, as systemd's Type=notify service sees it.

A datagram socket stands in for systemd's NOTIFY_SOCKET. On a start where
every worker comes up, regend must send READY=1 once every device is ready
(so the main socket answers Status with every device ready by then), STATUS= lines, WATCHDOG=1 about every
WATCHDOG_USEC/2 when WATCHDOG_PID is its own pid, and STOPPING=1 on SIGTERM,
then exit 0. Every notification must come from the supervisor itself: with
NotifyAccess=main systemd ignores the workers, so they must not rely on it.

A device whose worker cannot start (here: its socket path is taken by a
file) must not hold READY=1 back: systemd would kill regend at its start
timeout and restart it in a loop, the devices that serve with it. READY=1
comes once every device either serves or has had a worker fail to start;
Status then shows that device respawning and why, STATUS= names it, and it
serves once the cause is gone. (READY=1 waited for every device to be
ready, and never came.) The same for a worker that hangs in its start:
worker_start_timeout_ms ends it.

Usage: test_notify.py REGEND [--no-systemd]

WATCHDOG_PID must be regend's pid, known only after the fork: a shell sets
it to its own pid ($$) and execs regend, which keeps that pid.
"""
import os
import signal
import socket
import struct
import sys
import threading
import time

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "lib"))
from regend_fixture import Conn, Regend, all_ready, check, log, regend_path, skip, try_status, wait_for, TIME_SCALE

WATCHDOG_USEC = 400000      # regend should ping every 200 ms
DEVICES = 2


class Listener:
    def __init__(self, path):
        self.path = path
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
        self.sock.bind(path)
        # Ask the kernel for the sender's credentials with each datagram.
        self.sock.setsockopt(socket.SOL_SOCKET, socket.SO_PASSCRED, 1)
        self.messages = []     # (time, pid, {key: value})

    def poll(self, timeout):
        """Receives everything that arrives within `timeout` seconds."""
        deadline = time.monotonic() + timeout
        got = []
        while True:
            left = deadline - time.monotonic()
            if left <= 0:
                return got
            self.sock.settimeout(left)
            try:
                data, anc, _, _ = self.sock.recvmsg(4096, socket.CMSG_SPACE(12))
            except (socket.timeout, BlockingIOError):
                return got
            pid = None
            for level, kind, payload in anc:
                if level == socket.SOL_SOCKET and kind == socket.SCM_CREDENTIALS:
                    pid = struct.unpack("iII", payload[:12])[0]
            fields = {}
            for line in data.decode(errors="replace").split("\n"):
                if "=" in line:
                    k, v = line.split("=", 1)
                    fields[k] = v
            entry = (time.monotonic(), pid, fields)
            self.messages.append(entry)
            got.append(entry)

    def wait_key(self, key, value, timeout, since=0.0):
        deadline = time.monotonic() + timeout * TIME_SCALE
        while True:
            for t, pid, f in self.messages:
                if t >= since and f.get(key) == value:
                    return t, pid, f
            left = deadline - time.monotonic()
            if left <= 0:
                return None
            self.poll(min(left, 0.05))


def start_notified(daemon, env=None):
    """Starts regend with a NOTIFY_SOCKET of our own (and `env`); the listener."""
    listener = Listener(os.path.join(daemon.dir, "notify"))
    daemon.start(wait=False, env={"NOTIFY_SOCKET": listener.path, "WATCHDOG_USEC": str(WATCHDOG_USEC), **(env or {})},
                 wrapper=["/bin/sh", "-c", 'WATCHDOG_PID=$$; export WATCHDOG_PID; exec "$0" "$@"'])
    return listener


def one_device_cannot_start(regend):
    with Regend(regend, devices=DEVICES, fault_injection=False, start=False) as daemon:
        blocker = daemon.worker_socket(1)
        with open(blocker, "w") as f:
            f.write("not a socket\n")
        listener = start_notified(daemon)
        ready = listener.wait_key("READY", "1", 20)
        check(ready is not None, "no READY=1 within 20 s while device 1's worker cannot start")
        check(ready[1] == daemon.pid, "READY=1 came from pid %s, not regend %d" % (ready[1], daemon.pid))
        devs = try_status(daemon.socket)["devices"]
        log("READY=1 with device 1 unable to start; Status: %r" % [(d["state"], d["reason"]) for d in devs])
        check(devs[0]["state"] == "ready", "device 0 after READY=1: %r" % devs[0])
        check(devs[1]["state"] == "respawning" and "before it served" in devs[1]["reason"],
              "device 1 does not show why it does not serve: %r" % devs[1])
        status_lines = [f["STATUS"] for t, _, f in listener.messages if "STATUS" in f and t <= ready[0]]
        check(status_lines and "device 1" in status_lines[-1] and "1 of 2" in status_lines[-1],
              "STATUS= at READY=1 does not name device 1: %r" % status_lines)
        log("STATUS at READY=1: %s" % status_lines[-1])
        # The cause gone, the device serves: it is retried, not given up.
        os.unlink(blocker)
        wait_for(lambda: all_ready(try_status(daemon.socket), DEVICES), 15, "device 1 to serve once its socket path "
                 "is free")
        daemon.signal(signal.SIGTERM)
        check(daemon.wait(30) == 0, "regend exit status after SIGTERM")
        listener.poll(0.05)
        readies = [m for m in listener.messages if m[2].get("READY") == "1"]
        check(len(readies) == 1, "READY=1 sent %d times" % len(readies))
    log("one device unable to start: READY=1, the device shown, served later")


def one_device_hangs_at_start(regend):
    """A worker that never reports Ready (its open hangs, as a driver's init
    may) is killed at worker_start_timeout_ms: READY=1 comes, Status says
    why the device does not serve, and it serves once its open returns.
    Without the deadline, READY=1 never came and the device stayed
    respawning with no reason given."""
    with Regend(regend, devices=DEVICES, fault_injection=False, start=False,
                config="worker_start_timeout_ms = 1500\n") as daemon:
        hang = os.path.join(daemon.dir, "open-hangs")
        with open(hang + ".1", "w"):
            pass
        listener = start_notified(daemon, {"REGEN_HOST_OPEN_HANG_FILE": hang})
        ready = listener.wait_key("READY", "1", 20)
        check(ready is not None, "no READY=1 within 20 s while device 1's worker hangs in its start")
        devs = try_status(daemon.socket)["devices"]
        log("READY=1 with device 1 hanging at start; Status: %r" % [(d["state"], d["reason"]) for d in devs])
        check(devs[0]["state"] == "ready", "device 0 after READY=1: %r" % devs[0])
        check(devs[1]["state"] == "respawning" and "not ready within 1500 ms" in devs[1]["reason"],
              "device 1 does not say its worker was not ready in time: %r" % devs[1])
        # systemd reads what regend sends at once; so must this listener from
        # here on, or regend blocks in sd_notify once the kernel's queue of
        # datagrams (net.unix.max_dgram_qlen, 10 on some kernels) is full.
        stop = threading.Event()

        def drain_listener():
            while not stop.is_set():
                listener.poll(0.05)

        drain = threading.Thread(target=drain_listener, daemon=True)
        drain.start()
        # The next worker hangs too: a Watch hears why, though the state
        # stays respawning (it heard nothing of a worker lost before it served).
        watch = Conn(daemon.socket, timeout=15)
        watch.send("io.regen.Device.Watch", more=True)
        for _ in range(DEVICES):
            watch.reply()
        try:
            ev = watch.reply()
        except OSError as e:
            ev = {"error": repr(e)}
        check(ev.get("device") == 1 and ev.get("state") == "respawning" and
              "not ready within 1500 ms" in ev.get("reason", ""),
              "Watch after device 1's next worker hung: %r" % ev)
        watch.close()
        os.unlink(hang + ".1")
        wait_for(lambda: all_ready(try_status(daemon.socket), DEVICES), 15, "device 1 to serve once its open returns")
        daemon.signal(signal.SIGTERM)
        check(daemon.wait(30) == 0, "regend exit status after SIGTERM")
        stop.set()
        drain.join()
    log("one device hanging at start: killed at its deadline, READY=1, the device shown, served later")


def main():
    regend = regend_path()
    if "--no-systemd" in sys.argv[2:]:
        skip("regend was built without libsystemd: no sd_notify")
    one_device_cannot_start(regend)
    one_device_hangs_at_start(regend)
    with Regend(regend, devices=DEVICES, fault_injection=False, start=False) as daemon:
        notify_path = os.path.join(daemon.dir, "notify")
        listener = Listener(notify_path)
        sock = daemon.socket
        # No waiting for Status here: READY=1 is what says regend is ready.
        daemon.start(wait=False, env={"NOTIFY_SOCKET": notify_path, "WATCHDOG_USEC": str(WATCHDOG_USEC)},
                     wrapper=["/bin/sh", "-c", 'WATCHDOG_PID=$$; export WATCHDOG_PID; exec "$0" "$@"'])
        ready = listener.wait_key("READY", "1", 20)
        check(ready is not None, "no READY=1 within 20 s")
        t_ready, pid, _ = ready
        check(pid == daemon.pid, "READY=1 came from pid %s, not regend %d" % (pid, daemon.pid))
        # READY=1 promises the socket answers with every device ready.
        status = try_status(sock)
        check(all_ready(status, DEVICES), "after READY=1, Status is %r" % status)
        log("READY=1 from %d; Status: every device ready" % pid)

        status_lines = [f["STATUS"] for _, _, f in listener.messages if "STATUS" in f]
        check(status_lines, "no STATUS= before or with READY=1")
        log("STATUS lines: %r" % status_lines)

        # Watchdog: several pings in 1.5 s at WATCHDOG_USEC/2 = 200 ms.
        start = time.monotonic()
        listener.poll(1.5 * TIME_SCALE)
        pings = [t for t, p, f in listener.messages if f.get("WATCHDOG") == "1" and t >= start]
        log("%d WATCHDOG=1 in %.1f s" % (len(pings), time.monotonic() - start))
        check(len(pings) >= 3, "only %d WATCHDOG=1 in 1.5 s with WATCHDOG_USEC=%d" %
              (len(pings), WATCHDOG_USEC))
        gaps = [b - a for a, b in zip(pings, pings[1:])]
        check(max(gaps) < WATCHDOG_USEC / 1e6 * TIME_SCALE,
              "WATCHDOG=1 gaps %r: longer than WATCHDOG_USEC" % gaps)

        before_term = time.monotonic()
        daemon.signal(signal.SIGTERM)
        stopping = listener.wait_key("STOPPING", "1", 10, since=before_term)
        check(stopping is not None, "no STOPPING=1 after SIGTERM")
        rc = daemon.wait(30)
        check(rc == 0, "regend exit status %r after SIGTERM (want 0)" % rc)
        listener.poll(0.05)

        senders = {p for _, p, _ in listener.messages}
        check(senders == {daemon.pid}, "notifications from %r; only regend (%d) may send them" %
              (senders, daemon.pid))
        after_stop = [f for t, _, f in listener.messages if t > stopping[0] and f.get("READY") == "1"]
        check(not after_stop, "READY=1 after STOPPING=1")
    log("ok")


if __name__ == "__main__":
    main()
