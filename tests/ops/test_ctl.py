#!/usr/bin/env python3
# SPDX-License-Identifier: Apache-2.0
"""regenctl for the people who run regend: --version, call, health,
metrics, restart --wait's progress and its --timeout.

- --version names the project's version;
- call METHOD [JSON] prints each reply, follows `more`, names errors, and
  exits as the other commands do;
- health's exit status alone says the node's state (0 ok, 6 degraded, 7
  faulted, 8 failed, 9 unsupported, 5 unreachable), for every state a regend can report
  (a scripted regend answers with each), and on a real regend: ready, a
  device draining, a GPU that fell off the bus;
- metrics prints Prometheus text exposition format, parsed here line by
  line by the format's grammar, with numbers that follow what happened:
  calls, their time, live imports, restarts, faults, the last XID (injected
  with `regenctl inject-fault xid 79`), and per
  job (the job a connection stated) its connections, imports and calls;
  a job string with a double quote, a backslash or a line feed (which no
  regend sends, but Status may come from anywhere) is escaped, not broken;
- restart --wait on a terminal shows each step and says whether the device
  was released in place or its worker killed and respawned; --timeout says
  that the restart goes on inside regend.

Usage: test_ctl.py REGEND REGENCTL SOURCE_ROOT
"""
import json
import os
import pty
import re
import socket
import subprocess
import sys
import threading
import time

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "lib"))
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from regend_fixture import Conn, Regend, TIME_SCALE, call, check, host_buffer, log, operand, regend_path, wait_for
from ctl import dev, parse_metrics, run

N = 32

class Scripted:
    """A regend that answers Generation and Status with the devices given:
    health's verdict for states a real one shows only for an instant."""

    def __init__(self, path, devices):
        self.path, self.devices = path, devices
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self.sock.bind(path)
        self.sock.listen(8)
        threading.Thread(target=self.serve, daemon=True).start()

    def serve(self):
        while True:
            try:
                c, _ = self.sock.accept()
            except OSError:
                return
            buf = b""
            while True:
                data = c.recv(65536)
                if not data:
                    break
                buf += data
                while b"\0" in buf:
                    msg, buf = buf.split(b"\0", 1)
                    method = json.loads(msg)["method"]
                    if method == "org.varlink.service.GetInfo":
                        reply = {"vendor": "test", "product": "regend", "version": "0", "url": "",
                                 "interfaces": ["io.regen", "io.regen.Device"]}
                    else:
                        reply = {"epoch": 1, "devices": self.devices}
                    c.sendall(json.dumps({"parameters": reply}).encode() + b"\0")
            c.close()

    def close(self):
        # shutdown wakes a thread blocked in accept; close alone does not.
        try:
            self.sock.shutdown(socket.SHUT_RDWR)
        except OSError:
            pass
        self.sock.close()


def device(index, state, health=None):
    d = {"index": index, "generation": 1, "state": state, "backend": "host", "worker_socket": "",
         "worker_pid": 0, "respawns": 0, "memory_used": 0, "memory_baseline": 0, "reason": "scripted"}
    if health:
        h = {"source": "nvml", "detail": "", "uuid": "GPU-1", "pci_bus_id": "0000:01:00.0", "last_xid": 0,
             "last_xid_unix_ms": 0, "last_xid_text": "", "retired_pages_pending": False, "remap_pending": False,
             "remap_failed": False}
        h.update(health)
        d["health"] = h
    return d


def test_version_and_call(regenctl, source, d):
    version = re.search(r"version\s*:\s*'([^']+)'", open(os.path.join(source, "meson.build")).read()).group(1)
    rc, out, err = run(regenctl, None, "--version")
    check(rc == 0 and out.strip() == "regenctl %s" % version, "--version: %r" % out)

    rc, out, err = run(regenctl, d, "call", "io.regen.Device.Generation")
    check(rc == 0 and json.loads(out)["devices"][0]["index"] == 0, "call Generation: %s" % out)
    rc, out, err = run(regenctl, d, "call", "io.regen.Device.Restart", '{"devices":[1],"reason":"call"}')
    check(rc == 0 and "call" in json.loads(out)["devices"][1]["reason"], "call Restart: %s" % out)
    rc, out, err = run(regenctl, d, "call", "io.regen.Device.Release", '{"device":9}')
    check(rc == 1 and "io.regen.NoSuchDevice" in err and '"device":9' in err, "call, error: %d %s" % (rc, err))
    rc, out, err = run(regenctl, d, "call", "io.regen.Device.Watch", "--more", "--timeout", "1")
    lines = [json.loads(l) for l in out.splitlines()]
    check(rc == 3 and len(lines) == 4 and all(l["reason"] == "subscribed" for l in lines),
          "call --more Watch: exit %d, %s" % (rc, out))
    rc, out, err = run(regenctl, d, "call", "io.regen.Device.Watch")
    check(rc == 1 and "ExpectedMore" in err, "call Watch without --more: %d %s" % (rc, err))
    for bad in (["call"], ["call", "Status"], ["call", "io.regen.Device.Status", "[1]"],
                ["call", "io.regen.Device.Status", "{", "x"], ["status", "--more"]):
        rc, out, err = run(regenctl, d, *bad)
        check(rc == 2, "%s: exit %d, wanted 2" % (bad, rc))
    rc, out, err = run(regenctl, None, "--socket", os.path.join(d.dir, "nope.sock"), "call", "io.regen.Device.Status")
    check(rc == 5, "call to no regend: exit %d" % rc)
    log("--version, call (replies, more, errors, usage, unreachable)")


def test_health_scripted(regenctl, d):
    path = os.path.join(d.dir, "scripted.sock")
    cases = [
        ([device(0, "ready"), device(1, "ready", {})], 0, "ok"),
        ([device(0, "ready"), device(1, "draining")], 6, "degraded"),
        ([device(0, "released"), device(1, "resetting")], 6, "degraded"),
        ([device(0, "respawning")], 6, "degraded"),
        ([device(0, "detached")], 6, "degraded"),
        ([device(0, "ready", {"remap_pending": True})], 6, "degraded"),
        ([device(0, "ready", {"retired_pages_pending": True})], 6, "degraded"),
        ([device(0, "faulted"), device(1, "draining")], 7, "faulted"),
        ([device(0, "unresponsive")], 7, "faulted"),
        ([device(0, "failed"), device(1, "faulted")], 8, "failed"),
        ([device(0, "ready", {"remap_failed": True})], 8, "failed"),
        ([device(0, "unsupported"), device(1, "failed")], 9, "unsupported"),
    ]
    for i, (devices, want, word) in enumerate(cases):
        # A path of its own per case: a listener of an earlier case, still
        # in its thread's accept, can never answer for this one (CI saw a
        # case answered with the first case's devices).
        path = os.path.join(d.dir, "scripted%d.sock" % i)
        s = Scripted(path, devices)
        try:
            rc, out, err = run(regenctl, None, "--socket", path, "health")
            check(rc == want and out.splitlines()[-1] == word, "health of %s: exit %d (%r), wanted %d %s" %
                  ([x["state"] for x in devices], rc, out, want, word))
            rc, out, err = run(regenctl, None, "--socket", path, "--json", "health")
            check(rc == want and json.loads(out)["health"] == word, "--json health: %s" % out)
        finally:
            s.close()
            os.unlink(path)
    rc, out, err = run(regenctl, None, "--socket", path, "health")
    check(rc == 5, "health without regend: exit %d" % rc)
    log("health: %d scripted cases and no regend: exit 0, 6, 7, 8, 9, 5" % len(cases))


def gemms(d, dev_index, count, job=None):
    size = 3 * N * N * 4
    fd, mm = host_buffer(size)
    conn = Conn(d.worker_socket(dev_index))
    if job:
        conn.call("io.regen.SetJob", {"job": job})
    buf = conn.call("io.regen.Memory.ImportBuffer", {"device": dev_index, "kind": "host_fd", "size": size, "fd": 0},
                    fds=[fd])["buffer"]
    conn.buffer = buf
    for _ in range(count):
        conn.call("io.regen.Compute.Gemm", {"a": operand(buf, 0, (N, N)), "b": operand(buf, 0, (N, N)),
                                            "d": operand(buf, 2 * N * N * 4, (N, N))})
    return conn, fd, mm


def test_metrics(regenctl, d):
    s0, _ = parse_metrics(run(regenctl, d, "metrics")[1])
    conn, fd, mm = gemms(d, 0, 5, job="train-7")
    # The next heartbeat carries the counts: Status asks the workers afresh.
    call(d.socket, "io.regen.Device.Restart", {"device": 1})
    # An XID as NVML would report it, from the command line (the IDL has
    # the kind; regenctl refused it as unknown).
    for bad in (["xid"], ["xid", "0"], ["xid", "65536"], ["xid", "79x"], ["crash", "79"]):
        rc, out, err = run(regenctl, d, "inject-fault", "--device", "2", *bad)
        check(rc == 2, "inject-fault %s: exit %d, wanted 2: %s" % (bad, rc, err))
    rc, out, err = run(regenctl, d, "inject-fault", "--device", "2", "xid", "79")
    check(rc == 0 and out.strip() == "device 2: injected XID 79", "inject-fault xid 79: exit %d %r %s" % (rc, out, err))
    wait_for(lambda: call(d.socket, "io.regen.Device.Status")["devices"][2]["state"] == "failed", 20, "failed")
    rc, out, err = run(regenctl, d, "metrics", env={"NODE_NAME": "gpu-node-17"})
    check(rc == 0, "metrics: exit %d" % rc)
    s, types = parse_metrics(out)
    check(s[("regen_up", frozenset())] == 1, "regen_up")
    # Every series of a device carries what dcgm-exporter labels the GPU
    # with, as Status says it: a query joins the two on UUID, gpu,
    # pci_bus_id or Hostname (NODE_NAME, as dcgm-exporter reads it).
    status = {x["index"]: x for x in call(d.socket, "io.regen.Device.Status")["devices"]}
    for (name, labels), _ in s.items():
        l = dict(labels)
        if "device" not in l:
            continue
        h = status[int(l["device"])]["health"]
        want = {"gpu": l["device"], "UUID": h["uuid"], "pci_bus_id": h["pci_bus_id"], "Hostname": "gpu-node-17"}
        check(all(l.get(k) == v for k, v in want.items()), "%s%s lacks dcgm-exporter's labels %s" % (name, l, want))
    check(types["regen_device_ecc_dbe_volatile_total"] == "counter" and
          types["regen_device_ecc_dbe_aggregate_total"] == "counter" and types["regen_device_faults_total"] == "counter",
          "ECC and fault counts are not typed counter: %s" % types)
    check(all(t == "counter" for n, t in types.items() if n.endswith("_total")), "a _total that is no counter: %s" % types)
    check(dev(s, "regen_device_calls_total", 0) == 5, "calls_total of device 0: %s" % dev(s, "regen_device_calls_total", 0))
    check(dev(s, "regen_device_call_seconds_count", 0) == 5 and dev(s, "regen_device_call_seconds_sum", 0) > 0,
          "call latency summary of device 0")
    check(types.get("regen_device_call_seconds") == "summary", "the latency is no summary: %s" % types)
    check(dev(s, "regen_device_calls_total", 1) == 0, "device 1 counted calls")
    check(dev(s, "regen_device_buffers", 0) == 1, "live imports of device 0: %s" % dev(s, "regen_device_buffers", 0))
    check(dev(s, "regen_device_restarts_total", 1) == dev(s0, "regen_device_restarts_total", 1) + 1 and
          dev(s, "regen_device_restarts_total", 0) == dev(s0, "regen_device_restarts_total", 0), "restarts")
    check(dev(s, "regen_device_generation", 1) == dev(s0, "regen_device_generation", 1) + 1, "generation of device 1")
    check(dev(s, "regen_device_respawns_total", 3) >= 2, "respawns of device 3 (two restarts killed its worker)")
    check(dev(s, "regen_device_last_xid", 2) == 79 and dev(s, "regen_device_faults_total", 2) >= 1,
          "XID 79 on device 2: last_xid %s faults %s" % (dev(s, "regen_device_last_xid", 2),
                                                        dev(s, "regen_device_faults_total", 2)))
    check(dev(s, "regen_device_last_xid_timestamp_seconds", 2) > time.time() - 600, "XID time")
    check(dev(s, "regen_device_state", 2, state="failed") == 1 and dev(s, "regen_device_state", 2, state="ready") == 0,
          "state of device 2")
    check(dev(s, "regen_device_memory_used_bytes", 0) is not None, "memory_used")
    check(dev(s, "regen_device_info", 3, UUID="HOST-3", backend="host") == 1, "device_info of device 3")
    check(types["regen_device_calls_total"] == "counter", "calls_total is no counter")
    job = {"client_job": "train-7", "job_source": "client"}
    check(dev(s, "regen_job_sessions", 0, **job) == 1 and dev(s, "regen_job_buffers", 0, **job) == 1 and
          dev(s, "regen_job_buffer_bytes", 0, **job) == 3 * N * N * 4 and
          dev(s, "regen_job_calls_total", 0, **job) == 5 and dev(s, "regen_job_call_errors_total", 0, **job) == 0 and
          dev(s, "regen_job_calls_in_flight", 0, **job) == 0,
          "the job's series on device 0: %s" % sorted((n, sorted(l), v) for (n, l), v in s.items()
                                                        if n.startswith("regen_job_")))
    check(not any(n.startswith("regen_job_") and ("device", "1") in l for (n, l) in s),
          "device 1 lists a job without a client")
    check(types["regen_job_calls_total"] == "counter" and types["regen_job_sessions"] == "gauge", "job types: %s" % types)
    conn.close()
    os.close(fd)
    nsamples = len(s)
    rc, out, err = run(regenctl, d, "health")
    check(rc == 8 and "device 2: failed" in out, "health with a GPU off the bus: exit %d %s" % (rc, out))
    # A worker that crashes counts as a fault; a restart does not.
    faults = {i: dev(s, "regen_device_faults_total", i) for i in (1, 3)}
    gen3 = call(d.socket, "io.regen.Device.Status")["devices"][3]["generation"]
    rc, out, err = run(regenctl, d, "inject-fault", "--device", "3", "crash")
    check(rc == 0, "inject-fault crash: exit %d %s" % (rc, err))
    wait_for(lambda: (lambda x: x["state"] == "ready" and x["generation"] > gen3)(
        call(d.socket, "io.regen.Device.Status")["devices"][3]), 20, "device 3 back after its worker crashed")
    call(d.socket, "io.regen.Device.Restart", {"device": 1})
    s, types = parse_metrics(run(regenctl, d, "metrics")[1])
    check(dev(s, "regen_device_faults_total", 3) == faults[3] + 1,
          "a crashed worker is no fault: faults_total of device 3 %s, was %s" % (dev(s, "regen_device_faults_total", 3),
                                                                               faults[3]))
    check(dev(s, "regen_device_faults_total", 1) == faults[1], "a restart counted as a fault")
    rc, out, err = run(regenctl, None, "--socket", os.path.join(d.dir, "nope.sock"), "metrics")
    s, types = parse_metrics(out)
    check(rc == 5 and s[("regen_up", frozenset())] == 0, "metrics without regend: exit %d, %s" % (rc, out))
    log("metrics: %d samples in the exposition format, with dcgm-exporter's labels, following calls, imports, "
        "restarts, an XID, a crash" % nsamples)


def test_metrics_escaping(regenctl, d):
    """Job strings regend never sends (its rule refuses them) but that a
    Status from elsewhere may hold: every sample stays one line of the
    format and every label reads back as it was."""
    hostile = ['say "hi"', "back\\slash\\", "two\nlines", '\\"\n', "} 1\nregen_up 0", ""]
    # What a terminal acts on reads back as the text escape's characters
    # (proto/text.h): the file is read by people too.
    terminal = {"\x1b[2J": "\\x1b[2J", "a\u009bb\x7f": "a\\u009bb\\x7f", "\u202eevil": "\\u202eevil"}
    devs = [device(0, "ready")]
    devs[0]["jobs"] = [{"job": j, "source": "client", "sessions": i + 1, "buffers": 0, "buffer_bytes": 0, "events": 0,
                        "in_flight": 0, "calls": 7, "call_errors": 0} for i, j in enumerate(hostile + list(terminal))]
    devs[0]["jobs"].append({"job": "", "source": 'no"ne\n', "sessions": 9, "buffers": 0, "buffer_bytes": 0,
                            "events": 0, "in_flight": 0, "calls": 0, "call_errors": 0})
    path = os.path.join(d.dir, "scripted-jobs.sock")
    srv = Scripted(path, devs)
    try:
        rc, out, err = run(regenctl, None, "--socket", path, "metrics")
    finally:
        srv.close()
        os.unlink(path)
    check(rc == 0, "metrics of a scripted regend: exit %d %s" % (rc, err))
    s, types = parse_metrics(out)
    for i, j in enumerate(hostile):
        check(dev(s, "regen_job_sessions", 0, client_job=j, job_source="client") == i + 1,
              "job %r does not read back: %s" % (j, out))
    check(dev(s, "regen_job_sessions", 0, client_job="", job_source='no"ne\n') == 9, "source does not read back")
    for i, (j, shown) in enumerate(terminal.items()):
        check(dev(s, "regen_job_sessions", 0, client_job=shown, job_source="client") == len(hostile) + i + 1,
              "job %r does not read back as %r: %s" % (j, shown, out))
    check(not any(c in out for c in "\x1b\x7f\u009b\u202e"), "raw terminal characters in the metrics: %r" % out)
    check(s[("regen_up", frozenset())] == 1 and sum(1 for n, _ in s if n == "regen_up") == 1,
          "a job string made a sample of its own: %s" % out)
    log("metrics: %d hostile job strings escaped as the format says" % len(hostile))


def run_on_pty(argv):
    """argv with stderr on a terminal; (exit code, stdout, what the terminal got)."""
    master, slave = pty.openpty()
    p = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=slave, text=True)
    os.close(slave)
    chunks = []
    while True:
        try:
            data = os.read(master, 4096)
        except OSError:
            break
        if not data:
            break
        chunks.append(data)
    out = p.stdout.read()
    p.wait(timeout=60 * TIME_SCALE)
    os.close(master)
    term = b"".join(chunks).decode(errors="replace").replace("\r\n", "\n")
    log("%s -> %d\nstdout:\n%sterminal:\n%s" % (" ".join(argv[3:]), p.returncode, out, term))
    return p.returncode, out, term


def test_wait_progress(regenctl, d):
    base = [regenctl, "--socket", d.socket]
    conn, fd, mm = gemms(d, 3, 1)
    rc, out, term = run_on_pty(base + ["restart", "--device", "3", "--wait", "--timeout", "30"])
    check(rc == 0, "restart --wait: exit %d" % rc)
    check(re.search(r"device 3: draining \d+ call\(s\) in flight", term), "no draining line: %s" % term)
    check("device 3: releasing in place" in term and re.search(r"device 3: ready in generation \d+", term),
          "no release/ready lines: %s" % term)
    check(re.search(r"device 3: ready in generation \d+ \(released in place\)", out), "which happened: %s" % out)

    # A call that never ends: the drain deadline passes, the worker is
    # killed and respawned, and regenctl says so.
    conn.close()
    conn, fd, mm = gemms(d, 3, 0)    # the release took the old buffer
    call(d.socket, "io.regen.Device.InjectFault", {"device": 3, "kind": "hang"})
    conn.send("io.regen.Compute.Gemm", {"a": operand_of(conn), "b": operand_of(conn), "d": operand_of(conn, 2)})
    time.sleep(0.3)
    rc, out, term = run_on_pty(base + ["restart", "--device", "3", "--deadline-ms", "300", "--wait", "--timeout",
                                       "30"])
    check(rc == 0, "restart of a hung device: exit %d" % rc)
    check("device 3: draining 1 call(s) in flight" in term, "draining line: %s" % term)
    check("worker killed, respawning" in term, "no respawn line: %s" % term)
    check(re.search(r"ready in generation \d+ \(worker killed and respawned: .+\)", out), "which happened: %s" % out)
    conn.close()

    # --timeout: a clean message, exit 3, and the restart goes on.
    conn, fd2, mm2 = gemms(d, 3, 0)
    call(d.socket, "io.regen.Device.InjectFault", {"device": 3, "kind": "hang"})
    conn.send("io.regen.Compute.Gemm", {"a": operand_of(conn), "b": operand_of(conn), "d": operand_of(conn, 2)})
    time.sleep(0.3)
    before = call(d.socket, "io.regen.Device.Status")["devices"][3]["generation"]
    rc, out, err = run(regenctl, d, "restart", "--device", "3", "--deadline-ms", "2000", "--wait", "--timeout", "0.5")
    check(rc == 3 and "goes on inside regend" in err and "Traceback" not in err and "timed out" not in err,
          "restart --timeout: exit %d, %s" % (rc, err))
    wait_for(lambda: call(d.socket, "io.regen.Device.Status")["devices"][3]["generation"] > before and
             call(d.socket, "io.regen.Device.Status")["devices"][3]["state"] == "ready", 30, "the restart to go on")
    conn.close()
    log("restart --wait: progress on a terminal, released or respawned, --timeout's message")


def operand_of(conn, slot=0):
    return operand(conn.buffer, slot * N * N * 4, (N, N))


def main():
    regend = regend_path()
    regenctl, source = os.path.abspath(sys.argv[2]), os.path.abspath(sys.argv[3])
    with Regend(regend, devices=4, config="failed_retry_ms = 600000\n") as d:
        test_version_and_call(regenctl, source, d)
        test_health_scripted(regenctl, d)
        rc, out, err = run(regenctl, d, "health")
        check(rc == 0 and out.splitlines()[-1] == "ok", "health of a ready regend: exit %d %s" % (rc, out))
        test_wait_progress(regenctl, d)
        test_metrics(regenctl, d)
        test_metrics_escaping(regenctl, d)
    return 0


if __name__ == "__main__":
    sys.exit(main())
