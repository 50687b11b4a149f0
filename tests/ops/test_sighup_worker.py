#!/usr/bin/env python3
# SPDX-License-Identifier: Apache-2.0
"""SIGHUP reaches the running workers: max_connections and
drain_deadline_ms, which a worker applies itself (its socket's connection
limit; how long it lets calls in flight finish when it stops), take their
reloaded values there too. The workers kept the values of their command
line: a lowered max_connections was not enforced on the worker sockets, and
after drain_deadline_ms was lowered the supervisor SIGKILLed a worker at its
new deadline while the worker still waited for its old one, so a call in
flight got a closed connection instead of io.regen.Draining.

Usage: test_sighup_worker.py REGEND
"""
import os
import signal
import socket
import sys
import time

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "lib"))
from regend_fixture import (Closed, Conn, Regend, VarlinkError, call, check, host_buffer, log, operand, regend_path,
                            wait_for, TIME_SCALE)

N = 64
LIMIT = 2
DRAIN_MS = 300


def connect_outcome(path):
    """A fresh connection to `path` and its first call: the open Conn when
    served, else the error that refused it."""
    c = Conn(path, timeout=5)
    try:
        c.call("io.regen.Device.Generation")
        return c
    except VarlinkError as e:
        c.close()
        return e
    except (Closed, OSError) as e:
        c.close()
        return e


def limited_to(path, limit):
    """Whether the worker socket serves `limit` connections and refuses the
    next with LimitExceeded {connections, limit}."""
    served = [connect_outcome(path) for _ in range(limit)]
    extra = connect_outcome(path)
    ok = all(isinstance(c, Conn) for c in served) and isinstance(extra, VarlinkError) and \
        extra.name == "io.regen.LimitExceeded" and extra.params.get("resource") == "connections" and \
        extra.params.get("limit") == limit
    for c in served + [extra]:
        if isinstance(c, Conn):
            c.close()
    return ok


def main():
    config = "max_connections = 64\ndrain_deadline_ms = 60000\ncall_deadline_ms = 600000\n"
    with Regend(regend_path(), devices=1, config=config) as d:
        worker = d.worker_socket(0)
        pid_before = d.wait_ready()["devices"][0]["worker_pid"]
        with open(d.config, "w") as f:
            f.write("max_connections = %d\ndrain_deadline_ms = %d\ncall_deadline_ms = 600000\n" % (LIMIT, DRAIN_MS))
        d.signal(signal.SIGHUP)
        wait_for(lambda: "SIGHUP: reloaded" in d.log_text(), 10, "the supervisor's reload")

        # The worker that ran before the reload enforces the new limit.
        wait_for(lambda: limited_to(worker, LIMIT), 5,
                 "the worker socket to refuse connection %d with LimitExceeded {connections, %d}" % (LIMIT + 1, LIMIT))
        status = call(d.socket, "io.regen.Device.Status")["devices"][0]
        check(status["worker_pid"] == pid_before, "the worker was replaced: %r" % status)
        log("worker %d: %d connections served, the next LimitExceeded {connections, %d}" % (pid_before, LIMIT, LIMIT))

        # A call that never finishes, then SIGTERM: the worker fails it with
        # Draining at its (reloaded) drain deadline, before the supervisor's
        # SIGKILL at the same deadline plus its grace.
        fd, mm = host_buffer(3 * N * N * 4)
        c = Conn(worker, timeout=30)
        buf = c.call("io.regen.Memory.ImportBuffer", {"device": 0, "kind": "host_fd", "size": 3 * N * N * 4, "fd": 0},
                     fds=[fd])["buffer"]
        call(d.socket, "io.regen.Device.InjectFault", {"device": 0, "kind": "hang"})
        c.send("io.regen.Compute.Gemm", {"a": operand(buf, 0, (N, N)), "b": operand(buf, 0, (N, N)),
                                         "d": operand(buf, 2 * N * N * 4, (N, N))})
        time.sleep(0.3)
        t0 = time.monotonic()
        d.signal(signal.SIGTERM)
        try:
            c.reply(30)
            outcome = "success"
        except VarlinkError as e:
            outcome = e.name
        except (Closed, OSError) as e:
            outcome = "closed (%s)" % e
        elapsed = time.monotonic() - t0
        log("the hung call after SIGTERM: %s in %.2f s" % (outcome, elapsed))
        check(outcome == "io.regen.Draining",
              "the call in flight got %s %.2f s after SIGTERM, not io.regen.Draining at the reloaded drain "
              "deadline (%d ms + 1 s)" % (outcome, elapsed, DRAIN_MS))
        check(elapsed < (DRAIN_MS / 1000 + 1 + 0.9) * TIME_SCALE, "Draining came %.2f s after SIGTERM" % elapsed)
        c.close()
        os.close(fd)
        check(d.wait(20) == 0, "regend did not exit 0 after SIGTERM")
    log("PASS")
    return 0


if __name__ == "__main__":
    sys.exit(main())
