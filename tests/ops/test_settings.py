#!/usr/bin/env python3
# SPDX-License-Identifier: Apache-2.0
"""Every setting is an option: the configuration file, the environment
(an option's REGEN_ variable) and the command line set it, in that order
of strength, by the same rule; Status reports the values in force; the
workers get them on their command line; a bad value in the environment
stops regend with words that name the variable.

1. regend.conf says cuda_spin_us = 7 and ring_spin_us = 20, the
   environment REGEN_RING_SPIN_US=33 and REGEN_MESSAGE_TIMEOUT_MS=9000,
   the command line --message-timeout-ms 4000: Status reports 7, 33 and
   4000, every other key at its default, and a worker's command line
   carries --ring-spin-us 33.
2. REGEN_ATTENTION_AUTOTUNE=lots: regend exits 2 saying
   "REGEN_ATTENTION_AUTOTUNE: expected 0..16".
3. A SIGHUP that changes a reloadable key (heartbeat_ms) shows in Status.
4. rtc_cache_dir set nowhere is systemd's $CACHE_DIRECTORY entry ending in
   /rtc (the shipped unit's CacheDirectory=regen regen/rtc); the file wins.

Usage: test_settings.py REGEND
"""
import os
import signal
import subprocess
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "lib"))
from regend_fixture import Regend, call, check, log, regend_path, wait_for

# The variables this test sets, which must not come in from outside.
OWN = ("REGEN_RING_SPIN_US", "REGEN_MESSAGE_TIMEOUT_MS", "REGEN_CUDA_SPIN_US", "REGEN_ATTENTION_AUTOTUNE")


def options(d):
    st = call(d.socket, "io.regen.Device.Status")
    check(isinstance(st.get("options"), dict), "Status has no options: %r" % sorted(st))
    return st


def main():
    regend = regend_path()
    for name in OWN:
        os.environ.pop(name, None)
    config = "cuda_spin_us = 7\nring_spin_us = 20\n"
    env = {"REGEN_RING_SPIN_US": "33", "REGEN_MESSAGE_TIMEOUT_MS": "9000"}
    with Regend(regend, devices=1, config=config, extra=["--message-timeout-ms", "4000"], env=env) as d:
        st = options(d)
        opts = st["options"]
        check(opts.get("cuda_spin_us") == "7", "the file's cuda_spin_us: %r" % opts.get("cuda_spin_us"))
        check(opts.get("ring_spin_us") == "33", "the environment over the file: %r" % opts.get("ring_spin_us"))
        check(opts.get("message_timeout_ms") == "4000",
              "the command line over the environment: %r" % opts.get("message_timeout_ms"))
        for key, default in (("nvml", "true"), ("cuda_wake", "spin"), ("attention_autotune", "0"),
                             ("reset_retry_ms", "auto"), ("max_buffers", "4096"), ("backend", "host")):
            check(opts.get(key) == default, "%s: %r, want %r" % (key, opts.get(key), default))
        check("worker" not in opts and "ctl_fd" not in opts, "internal options in Status: %r" % sorted(opts))
        log("Status reports %d options; file, environment and command line each where they should win" % len(opts))

        pid = st["devices"][0]["worker_pid"]
        with open("/proc/%d/cmdline" % pid, "rb") as f:
            argv = f.read().split(b"\0")
        check(b"--ring-spin-us" in argv and argv[argv.index(b"--ring-spin-us") + 1] == b"33",
              "the worker's command line lacks --ring-spin-us 33: %r" % argv)
        check(b"--message-timeout-ms" in argv and argv[argv.index(b"--message-timeout-ms") + 1] == b"4000",
              "the worker's command line lacks --message-timeout-ms 4000: %r" % argv)
        log("worker %d got them on its command line" % pid)

        with open(d.config, "a") as f:
            f.write("heartbeat_ms = 3000\n")
        d.signal(signal.SIGHUP)
        wait_for(lambda: options(d)["options"].get("heartbeat_ms") == "3000", 10, "heartbeat_ms 3000 in Status")
        log("a reloaded key shows in Status")

    # rtc_cache_dir set nowhere: the unit's cache directory for it
    # (CacheDirectory=regen regen/rtc); set in the file: the file's.
    cache = {"CACHE_DIRECTORY": "/var/cache/regen:/var/cache/regen/rtc"}
    with Regend(regend, devices=1, env=cache) as d:
        got = options(d)["options"].get("rtc_cache_dir")
        check(got == "/var/cache/regen/rtc", "rtc_cache_dir from systemd's CACHE_DIRECTORY: %r" % got)
    with Regend(regend, devices=1, config="rtc_cache_dir = /srv/rtc\n", env=cache) as d:
        got = options(d)["options"].get("rtc_cache_dir")
        check(got == "/srv/rtc", "rtc_cache_dir from the file, over systemd's: %r" % got)
    log("rtc_cache_dir: systemd's cache directory for it where nothing sets it")

    bad = dict(os.environ, REGEN_ATTENTION_AUTOTUNE="lots")
    r = subprocess.run([regend, "--backend", "host", "--config", "/dev/null", "--socket", "/tmp/regen-test-no.sock"],
                       env=bad, capture_output=True, text=True, timeout=30)
    check(r.returncode == 2, "regend with REGEN_ATTENTION_AUTOTUNE=lots exited %d: %s" % (r.returncode, r.stderr))
    check("REGEN_ATTENTION_AUTOTUNE: expected 0..16, got 'lots'" in r.stderr,
          "the refusal does not name the variable: %r" % r.stderr)
    log("a bad value in the environment: %s" % r.stderr.strip())
    log("PASS")
    return 0


if __name__ == "__main__":
    sys.exit(main())
