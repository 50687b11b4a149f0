#!/usr/bin/env python3
# SPDX-License-Identifier: Apache-2.0
"""regend under CUDA MPS (issue 13, item 3c), with an MPS control daemon of
the test's own (a private pipe and log directory; `nvidia-cuda-mps-control
-f`, stopped with `quit` at the end).  Each check prints PASS/FAIL; the last
line is "N passed, N failed".

  off        regend started with CUDA_MPS_PIPE_DIRECTORY naming a directory
             where no control daemon listens: Status's sharing says mps
             false, names the directory and says why (CUDA made a context
             of its own), and the log warns once; with no MPS variable at
             all (when /tmp/nvidia-mps has no daemon either): mps false, no
             pipe directory
  on         regend started with the private daemon's pipe directory:
             Status's sharing.mps is true, its reason states the trade-off,
             regenctl status says `mps`, metrics regen_device_mps 1, and the
             log warns once per device
  rank       a rank (a child process, as its context may die) under the same
             daemon: mps_mode() says the rank's context and regend's are MPS
             clients; a GEMM through regend works; then regend injects
             device_lost (an illegal-address fault in its worker) and the
             rank's own CUDA work fails: the fault reached the rank (the
             isolation regend gives without MPS is gone; without MPS the same
             fault leaves the rank working: test_regen_torch.py, lifecycle).
             What the rank's regen.torch operation did is printed.
  recover    once the rank has exited, regend serves again in a newer
             generation, still as an MPS client, with no second warning;
             the states it went through are printed (under MPS the server
             takes no new client on the GPU until every client of it, the
             rank too, has exited)

Exit 77 without torch, a GPU, regend or nvidia-cuda-mps-control.

    python3 tests/gpu/test_mps.py [REGEND]
"""

import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(os.path.dirname(HERE))
sys.path.insert(0, os.path.join(REPO, "tests", "lib"))
sys.path.insert(0, os.path.join(REPO, "tests", "ops"))
from regend_fixture import Conn, Regend, call, find_regend, record, record_width, require_torch, \
    summary  # noqa: E402
from ctl import dev as sample_of, parse_metrics  # noqa: E402

require_torch()

WARN_ON = "runs as an MPS client"
WARN_NAMED = "is not an MPS client although"

RANK = r"""
import json, sys, time, torch
sys.path.insert(0, %(pkg)r)
import regen, regen.torch as rt
rt.configure(socket=%(sock)r, recovery_timeout=20)
out = {}
a = torch.randn(256, 256, device="cuda", dtype=torch.bfloat16)
b = torch.randn(256, 256, device="cuda", dtype=torch.bfloat16)
out["mps"] = rt.mps_mode()
try:
    c = rt.matmul(a, b); torch.cuda.synchronize()
    out["gemm_before"] = float((c.float() - a.float() @ b.float()).abs().max())
except Exception as e:
    out["gemm_before"] = "%%s: %%s" %% (type(e).__name__, str(e)[:300])
admin = regen.Client(%(sock)r)
t0 = time.monotonic()
admin.inject_fault(rt.runtime().regend_device(a.device), "device_lost")
time.sleep(2.0)
try:
    (a.float() @ b.float()).sum().item(); torch.cuda.synchronize()
    out["rank_own_work"] = "ok"
except Exception as e:
    out["rank_own_work"] = "%%s: %%s" %% (type(e).__name__, str(e)[:300])
try:
    rt.matmul(a, b); torch.cuda.synchronize()
    out["regen_op"] = "ok"
except Exception as e:
    out["regen_op"] = "%%s: %%s" %% (type(e).__name__, str(e)[:300])
out["seconds_after_fault"] = time.monotonic() - t0
print("RESULT " + json.dumps(out), flush=True)
"""

record_width(70)


def sharing(d):
    return [dev.get("sharing") for dev in call(d.socket, "io.regen.Device.Status")["devices"]]


def regenctl(build, d, *args):
    p = subprocess.run([os.path.join(build, "client", "regenctl"), "--socket", d.socket] + list(args),
                       capture_output=True, text=True, timeout=60)
    return p.stdout


class MpsDaemon:
    """nvidia-cuda-mps-control in the foreground, on private directories."""

    def __init__(self, exe):
        self.dir = tempfile.mkdtemp(prefix="regen-mps-")
        self.env = {"CUDA_MPS_PIPE_DIRECTORY": os.path.join(self.dir, "pipe"),
                    "CUDA_MPS_LOG_DIRECTORY": os.path.join(self.dir, "log")}
        for p in self.env.values():
            os.mkdir(p)
        self.exe = exe
        self.proc = subprocess.Popen([exe, "-f"], env=dict(os.environ, **self.env), stdin=subprocess.DEVNULL,
                                     stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)
        deadline = time.monotonic() + 20
        while not os.path.exists(os.path.join(self.env["CUDA_MPS_PIPE_DIRECTORY"], "control")):
            if self.proc.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError("the MPS control daemon did not start (exit %s); its log:\n%s" %
                                   (self.proc.poll(), self.log()))
            time.sleep(0.05)

    def log(self):
        text = []
        for name in ("control.log", "server.log"):
            try:
                with open(os.path.join(self.env["CUDA_MPS_LOG_DIRECTORY"], name)) as f:
                    text.append("--- %s\n%s" % (name, f.read()[-3000:]))
            except OSError:
                pass
        return "\n".join(text)

    def stop(self):
        try:
            subprocess.run([self.exe], input="quit\n", text=True, env=dict(os.environ, **self.env), timeout=20,
                           capture_output=True)
            self.proc.wait(20)
        except (subprocess.TimeoutExpired, OSError):
            os.killpg(self.proc.pid, signal.SIGKILL)
            self.proc.wait(10)
        shutil.rmtree(self.dir, ignore_errors=True)


def without_mps_env():
    return {k: v for k, v in os.environ.items() if not k.startswith("CUDA_MPS_")}


def check_off(regend):
    empty = tempfile.mkdtemp(prefix="regen-mps-none-")
    saved = {k: os.environ.pop(k) for k in list(os.environ) if k.startswith("CUDA_MPS_")}
    try:
        with Regend(regend, devices=1, backend="cuda", ready_timeout=120,
                    env={"CUDA_MPS_PIPE_DIRECTORY": empty}) as d:
            s = sharing(d)[0]
            record("off: pipe directory with no daemon: sharing.mps false",
                   s is not None and s["mps"] is False and s["mps_pipe_directory"] == empty, json.dumps(s))
            record("off: the reason says the named directory had no daemon",
                   s is not None and empty in s["reason"] and "isolated" in s["reason"], s and s["reason"])
            record("off: the log warns once that MPS was named but not had", d.log_text().count(WARN_NAMED) == 1,
                   "%d warnings" % d.log_text().count(WARN_NAMED))
        if os.path.exists("/tmp/nvidia-mps/control"):
            print("note: an MPS control daemon listens in /tmp/nvidia-mps: the run without MPS variables is left out")
            return
        with Regend(regend, devices=1, backend="cuda", ready_timeout=120) as d:
            s = sharing(d)[0]
            record("off: no MPS variable: sharing.mps false, no pipe directory",
                   s is not None and s["mps"] is False and s["mps_pipe_directory"] == "" and
                   "isolated" in s["reason"], json.dumps(s))
            record("off: no MPS warning in the log", WARN_ON not in d.log_text() and WARN_NAMED not in d.log_text())
    finally:
        os.environ.update(saved)
        shutil.rmtree(empty, ignore_errors=True)


def wait_ready_after(d, generation, timeout):
    """Watches device 0 until it is ready in a generation above `generation`;
    returns (states seen, seconds, last Status entry)."""
    w = Conn(d.socket, timeout=timeout)
    w.send("io.regen.Device.Watch", more=True)
    seen, t0 = [], time.monotonic()
    try:
        while time.monotonic() - t0 < timeout:
            ev = w.reply(timeout=max(0.1, timeout - (time.monotonic() - t0)))
            if ev.get("device") != 0:
                continue
            seen.append("%s@%s" % (ev["state"], ev["generation"]))
            if ev["state"] == "ready" and ev["generation"] > generation:
                break
    except Exception as e:  # a timeout: say what was seen
        seen.append("(%s)" % type(e).__name__)
    finally:
        w.close()
    dev = call(d.socket, "io.regen.Device.Status")["devices"][0]
    return seen, time.monotonic() - t0, dev


def check_on(regend, build, mps):
    env = dict(mps.env)
    with Regend(regend, devices=1, backend="cuda", ready_timeout=120, env=env) as d:
        s = sharing(d)[0]
        if not record("on: sharing.mps true under the private MPS daemon", s is not None and s["mps"] is True,
                      json.dumps(s)):
            print(mps.log())
        record("on: sharing names the pipe directory", s is not None and
               s["mps_pipe_directory"] == env["CUDA_MPS_PIPE_DIRECTORY"])
        record("on: the reason states the trade-off", s is not None and "fatal fault" in s["reason"] and
               "every client" in s["reason"], s and s["reason"])
        print("NVML cross-check: compute_mode %s, mps_clients %s" % (s and s.get("compute_mode"),
                                                                    s and s.get("mps_clients")))
        rows = [line.split() for line in regenctl(build, d, "status").splitlines()]
        record("on: regenctl status says mps", len(rows) == 2 and rows[0][-1] == "SHARING" and rows[1][-1] == "mps",
               str(rows[-1:]))
        record("on: metrics regen_device_mps 1",
               sample_of(parse_metrics(regenctl(build, d, "metrics"))[0], "regen_device_mps", 0) == 1)
        record("on: the log warns once", d.log_text().count(WARN_ON) == 1, "%d warnings" % d.log_text().count(WARN_ON))

        generation = call(d.socket, "io.regen.Device.Status")["devices"][0]["generation"]
        code = RANK % {"pkg": os.path.join(REPO, "client", "python"), "sock": d.socket}
        t0 = time.monotonic()
        r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300,
                           env=dict(os.environ, **env))
        rank_exit = time.monotonic() - t0
        line = next((x for x in r.stdout.splitlines() if x.startswith("RESULT ")), None)
        if not record("rank: ran and reported", line is not None, "exit %d" % r.returncode):
            print(r.stdout[-2000:], r.stderr[-4000:])
            return
        out = json.loads(line[len("RESULT "):])
        print("rank:", json.dumps(out, indent=1))
        print("rank exited %d, %.1f s after it started" % (r.returncode, rank_exit))
        m = out["mps"]
        record("rank: mps_mode() says the rank's context is an MPS client (driver)",
               m["rank"] is True and m["rank_source"] == "driver", json.dumps(m))
        record("rank: mps_mode() says regend's worker is an MPS client", m["regend"] is True)
        record("rank: a GEMM through regend works under MPS",
               isinstance(out["gemm_before"], float) and out["gemm_before"] < 1.0, str(out["gemm_before"]))
        record("rank: its own CUDA work fails after regend's device_lost (no isolation)",
               out["rank_own_work"] != "ok", out["rank_own_work"])
        print("rank: its regen.torch operation after the fault:", out["regen_op"])

        seen, secs, dev = wait_ready_after(d, generation, 120)
        print("regend after the fault, device 0:", " -> ".join(seen), "(%.1f s after the rank exited)" % secs)
        print("regend's reason:", dev["reason"])
        record("recover: regend serves again in a newer generation once the rank has exited",
               dev["state"] == "ready" and dev["generation"] > generation,
               "%s, generation %s -> %s" % (dev["state"], generation, dev["generation"]))
        record("recover: still an MPS client", (dev.get("sharing") or {}).get("mps") is True)
        record("recover: the warning stays once per device", d.log_text().count(WARN_ON) == 1,
               "%d warnings" % d.log_text().count(WARN_ON))
        if dev["state"] != "ready":
            print(d.log_tail(80))
            print(mps.log())


def main():
    exe = shutil.which("nvidia-cuda-mps-control")
    if exe is None:
        print("SKIP: no nvidia-cuda-mps-control on PATH")
        return 77
    regend = find_regend(sys.argv[1] if len(sys.argv) > 1 else None)
    if regend is None:
        print("SKIP: no regend")
        return 77
    build = os.path.dirname(os.path.dirname(regend))
    os.environ.setdefault("REGEN_LIBREGEN", os.path.join(build, "client", "libregen.so"))
    check_off(regend)
    try:
        mps = MpsDaemon(exe)
    except RuntimeError as e:
        # This machine cannot run an MPS control daemon (a sandbox, the
        # driver's utilities missing their server): nothing to hold to it.
        print("SKIP (MPS part): %s" % e)
        return 77 if summary() == 0 else 1
    try:
        check_on(regend, build, mps)
    finally:
        mps.stop()
    return summary()


if __name__ == "__main__":
    sys.exit(main())
