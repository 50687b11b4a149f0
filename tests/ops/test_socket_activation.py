#!/usr/bin/env python3
# SPDX-License-Identifier: Apache-2.0
"""Socket activation, as regend.socket does it: systemd-socket-activate binds
the socket, starts regend on the first connection with the listening socket
as fd 3 (LISTEN_FDS=1, LISTEN_PID), and regend serves on it.

Checks: the connection that triggered the start is answered (Status, every
device ready); the worker sockets sit beside the activated socket, which is
not the path --socket names (a ListenStream= that differs from the
configuration used to make the workers crash in a loop); the
workers did not inherit LISTEN_FDS (they would take fd 3 for theirs); and on
SIGTERM regend exits 0 and leaves the socket file alone — it belongs to the
socket unit, which keeps listening across restarts of the service.

Usage: test_socket_activation.py REGEND SYSTEMD_SOCKET_ACTIVATE|'' [--no-systemd]
Exit 77 (skipped) without systemd-socket-activate or libsystemd.
"""
import os
import signal
import sys
import time

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "lib"))
from regend_fixture import (Conn, Regend, all_ready, call, check, fail, log, pid_alive, regend_path, skip,
                            wait_for)

DEVICES = 2


def environ_of(pid):
    try:
        with open("/proc/%d/environ" % pid, "rb") as f:
            return dict(kv.split(b"=", 1) for kv in f.read().split(b"\0") if b"=" in kv)
    except OSError:
        return None


def main():
    regend = regend_path()
    activate = sys.argv[2] if len(sys.argv) > 2 else ""
    if "--no-systemd" in sys.argv[3:]:
        skip("regend was built without libsystemd: no socket activation")
    if not activate or not os.access(activate, os.X_OK):
        skip("systemd-socket-activate not found")
    with Regend(regend, devices=DEVICES, fault_injection=False, start=False) as daemon:
        # The socket unit's ListenStream= need not be the configured path:
        # the workers must follow the activated socket, not the option.
        sock = os.path.join(daemon.dir, "activated.sock")
        # Nothing may connect before the test does: that would start regend.
        daemon.start(wait=False, wrapper=[activate, "-l", sock])
        wait_for(lambda: os.path.exists(sock) or daemon.proc.poll() is not None, 10,
                 "systemd-socket-activate to bind %s" % sock)
        if daemon.proc.poll() is not None:
            text = daemon.log_text()
            if "Operation not permitted" in text or "Permission denied" in text:
                skip("systemd-socket-activate cannot run here: %s" % text.strip())
            fail("systemd-socket-activate exited %r: %s" % (daemon.proc.returncode, text))
        # Nothing runs until the first connection.
        time.sleep(0.2)
        check("supervisor: listening on" not in daemon.log_text(), "regend started before anyone connected")

        # This connection starts regend; its call waits in the backlog.
        first = Conn(sock, timeout=30)
        first.send("io.regen.Device.Status")
        reply = first.reply(30)
        first.close()
        check(len(reply.get("devices", [])) == DEVICES, "Status via the activated socket: %r" % reply)
        log("first Status through the activated socket:", [(x["index"], x["state"]) for x in reply["devices"]])

        # systemd-socket-activate execs regend in place: daemon.pid is regend.
        status = wait_for(lambda: (lambda s: s if all_ready(s, DEVICES) else None)(
            call(sock, "io.regen.Device.Status")), 20, "every device ready")
        for dev in status["devices"]:
            ws = dev["worker_socket"]
            check(ws == "%s.dev%d" % (sock, dev["index"]), "worker socket %s is not beside %s" % (ws, sock))
            gen = call(ws, "io.regen.Device.Generation")
            check(gen["devices"][0]["generation"] == dev["generation"], "worker socket %s: %r" % (ws, gen))
            env = environ_of(dev["worker_pid"])
            check(env is not None and b"LISTEN_FDS" not in env and b"LISTEN_PID" not in env,
                  "worker %d inherited LISTEN_FDS/LISTEN_PID" % dev["worker_pid"])
        log("regend pid %d serves %d devices on the activated socket" % (daemon.pid, DEVICES))

        daemon.signal(signal.SIGTERM)
        rc = daemon.wait(30)
        check(rc == 0, "regend exited %r after SIGTERM (want 0)" % rc)
        check(os.path.exists(sock), "regend removed %s, which belongs to the socket unit" % sock)
        for dev in status["devices"]:
            check(not pid_alive(dev["worker_pid"]), "worker %d outlived regend" % dev["worker_pid"])
    log("ok")


if __name__ == "__main__":
    main()
