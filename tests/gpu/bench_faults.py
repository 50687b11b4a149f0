#!/usr/bin/env python3
# SPDX-License-Identifier: Apache-2.0
"""Issue 10's time budgets on a GPU (a benchmark, not a timed test): regend
with the CUDA backend, a rank that holds its own tensors, and one Watch
subscription whose events are stamped as they arrive.

For each fault, REPEAT times: fault -> the first Watch event (budget
100 ms), the events in order, and fault -> the rank's first right GEMM
after re-importing (budget 1 s with an in-process reset, 3 s with a
respawn):
  device_lost   InjectFault device_lost with no call in flight: found by the
                health watch (faulted), then reset in process or respawned
  hang          a GEMM with deadline_ms 500 behind InjectFault hang:
                answered with Timeout, then faulted (hung) -> respawn
  crash         InjectFault crash: respawning -> ready
  stopped       SIGSTOP of the worker: unresponsive (heartbeat 2 s) ->
                respawn; Status's slowest answer meanwhile
  reset         a Reset of a healthy device (the in-process path)
Also prints what Status says of the GPU's health (NVML).

Usage: bench_faults.py REGEND [REPEAT]. Exit 0 (numbers printed; 1 only
when a fault was not recovered), 77 without GPU/torch."""
import json
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "client", "python"))

try:
    import torch
except ImportError:
    print("SKIP: torch is not importable")
    sys.exit(77)
if not torch.cuda.is_available():
    print("SKIP: no CUDA device")
    sys.exit(77)

import regen  # noqa: E402

events = []
events_lock = threading.Lock()


def watcher(sock):
    w = regen.Client(sock, timeout=600).watch()
    while True:
        try:
            ev = w.next(timeout=None)
        except Exception:
            return
        with events_lock:
            events.append((time.monotonic(), ev))


def events_since(t0):
    with events_lock:
        return [(t, e) for t, e in events if t >= t0 and e["device"] == 0 and e["reason"] != "subscribed"]


class Rank:
    def __init__(self, n=1024):
        self.a = torch.randn(n, n, device="cuda")
        self.b = torch.randn(n, n, device="cuda")
        self.d = torch.empty(n, n, device="cuda")
        self.ref = self.a.double() @ self.b.double()

    def gemm(self, c):
        self.d.fill_(float("nan"))
        c.gemm(self.a, self.b, self.d)
        torch.cuda.synchronize()
        return ((self.d.double() - self.ref).norm() / self.ref.norm()).item()

    def reimport(self, c):
        for t in (self.a, self.b, self.d):
            c.import_tensor(t)


def serve_again(c, rank, t0, limit=60):
    """Seconds from t0 to the first right GEMM, retrying as docs/lifecycle.md says."""
    while time.monotonic() - t0 < limit:
        try:
            if rank.gemm(c) < 1e-5:
                return time.monotonic() - t0
        except regen.StaleGeneration:
            rank.reimport(c)
        except (regen.DeviceLost, regen.Draining, regen.ConnectionReset, regen.Unavailable, regen.Timeout):
            time.sleep(0.002)
        except regen.Error as e:
            print(f"    waiting: {type(e).__name__}: {e}", flush=True)
            time.sleep(0.01)
    return None


def info(c):
    return c.status()["devices"][0]


def main():
    regend = sys.argv[1]
    repeat = int(sys.argv[2]) if len(sys.argv) > 2 else 3
    tmp = tempfile.mkdtemp(prefix="regen-gpu-faults-")
    sock = os.path.join(tmp, "regend.sock")
    log_path = os.path.join(tmp, "regend.log")
    log = open(log_path, "w")
    proc = subprocess.Popen([regend, "--socket", sock, "--backend", "cuda", "--devices", "1",
                             "--enable-fault-injection", "--drain-deadline-ms", "2000"], stderr=log)
    results = {}
    failed = False
    try:
        for _ in range(400):
            if os.path.exists(sock):
                break
            time.sleep(0.05)
        c = regen.Client(sock, timeout=120)
        for _ in range(400):
            if info(c)["state"] == "ready":
                break
            time.sleep(0.05)
        threading.Thread(target=watcher, args=(sock,), daemon=True).start()
        time.sleep(0.2)
        rank = Rank()
        rank.reimport(c)
        assert rank.gemm(c) < 1e-5
        time.sleep(1.5)
        print("health:", json.dumps(info(c).get("health")), flush=True)

        def run(kind, fault):
            g0 = info(c)["generation"]
            t0_wall = time.time()
            t0 = time.monotonic()
            extra = fault() or {}
            served = serve_again(c, rank, t0)
            # When regend's NVML watch heard the fault's XID (wall clock):
            # how it compares with the context check's first event.
            health = info(c).get("health") or {}
            xid_ms = health.get("last_xid_unix_ms", 0) - t0_wall * 1e3
            if xid_ms > 0:
                extra["XID"] = f"{health.get('last_xid')} at +{xid_ms:.1f} ms"
            time.sleep(0.1)
            evs = events_since(t0)
            seq = " -> ".join(f"{e['state']}@{e['generation']}+{(t - t0) * 1e3:.1f}ms" for t, e in evs)
            first = (evs[0][0] - t0) * 1e3 if evs else None
            st = info(c)
            print(f"  {kind}: first event {first if first is None else round(first, 1)} ms; served "
                  f"{served if served is None else round(served * 1e3, 1)} ms; gen {g0}->{st['generation']} "
                  f"respawns {st['respawns']}; {seq}; reason '{st['reason']}' {extra}", flush=True)
            results.setdefault(kind, []).append((first, served, seq))
            return served is not None

        def hang():
            c.inject_fault(0, "hang")
            t = time.monotonic()
            try:
                c.gemm(rank.a, rank.b, rank.d, deadline_ms=500)
                return {"hung call": "succeeded?"}
            except regen.Error as e:
                return {"hung call": f"{type(e).__name__} after {(time.monotonic() - t) * 1e3:.0f} ms"}

        def stopped():
            pid = info(c)["worker_pid"]
            os.kill(pid, signal.SIGSTOP)
            worst = 0.0
            t = time.monotonic()
            while time.monotonic() - t < 4:
                s = time.monotonic()
                d = info(c)
                worst = max(worst, time.monotonic() - s)
                if d["worker_pid"] != pid and d["state"] == "ready":
                    break
                time.sleep(0.02)
            return {"slowest Status": f"{worst * 1e3:.1f} ms"}

        for i in range(repeat):
            for kind, fault in (("device_lost", lambda: c.inject_fault(0, "device_lost")),
                                ("hang", hang),
                                ("crash", lambda: c.inject_fault(0, "crash")),
                                ("stopped", stopped),
                                ("reset", lambda: c.reset(0, reason="bench"))):
                if not run(kind, fault):
                    failed = True
                time.sleep(0.3)
        print("summary (median / max over %d):" % repeat)
        for kind, rows in results.items():
            firsts = [r[0] for r in rows if r[0] is not None]
            served = [r[1] * 1e3 for r in rows if r[1] is not None]
            print(f"  {kind:12s} fault->first event {statistics.median(firsts) if firsts else float('nan'):8.1f} / "
                  f"{max(firsts) if firsts else float('nan'):8.1f} ms   fault->served "
                  f"{statistics.median(served) if served else float('nan'):8.1f} / "
                  f"{max(served) if served else float('nan'):8.1f} ms")
    finally:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(20)
        except subprocess.TimeoutExpired:
            proc.kill()
        log.close()
        out = os.environ.get("OUT")
        if out:
            with open(log_path) as src, open(os.path.join(out, "bench_faults-regend.log"), "w") as dst:
                dst.write(src.read())
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
