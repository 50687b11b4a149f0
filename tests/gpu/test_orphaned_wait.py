#!/usr/bin/env python3
# SPDX-License-Identifier: Apache-2.0
"""A rank SIGKILLed while regend's work waits on its unfinished GPU work
(daemon/worker/orphan.c), on a GPU.

The rank (this script with --rank) writes its input behind a spin of its
own stream, calls rt.matmul on it with "events" ordering (the call is
answered at launch; regend's lane waits on the rank's event on the GPU),
and is killed during the spin. Its context goes with the spin, the event
is never done, and nothing but the worker's end takes the wait back:

- alone on the device, the device is replaced within seconds of the kill,
  not at call_deadline_ms; the uid is not charged, and a new rank of the
  same uid computes right at once;
- killed after its own work was done (the calls it left still running in
  regend), nothing is replaced;
- killed with a second of regend's work queued on its lane ahead of the
  wedged call (GEMMs that wait on nothing), the device is replaced only
  once that work finished: a replacement must not cut a call that runs (a
  Run whose journal holds marks only would be torn);
- with a session of a second uid (nobody) open on the device, the
  replacement cost that user its objects: the uid is charged with the
  hang, and its next rank is refused with LimitExceeded.

With --client-wait host (regend's cuda_client_wait = host: the lane's
thread waits for the rank's event, no stream does), nothing is replaced in
any of these: the wedged call and those after it fail unlaunched (the log
says so), the generation stays, the uid is charged with nothing, and a new
rank of it computes at once.

    python3 tests/gpu/test_orphaned_wait.py [REGEND] [--client-wait stream|host]

Exit 0 pass, 1 fail, 77 skipped (no torch, no CUDA, no regend).
"""

import os
import signal
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(os.path.dirname(HERE))
sys.path.insert(0, os.path.join(REPO, "tests", "lib"))
sys.path.insert(0, os.path.join(REPO, "client", "python"))

DEADLINE_MS = 60000      # regend's call_deadline_ms: the wait it must not take
COOLDOWN_MS = 30000     # long enough that the charged uid's next rank (torch imported) comes within it
SPIN_S = 20.0            # longer than the test waits for anything
AHEAD_GEMMS = 100        # 16384^3 bf16 each: about a second of an H100
FAILED_LINE = "they fail unlaunched, the device serves on"


def opt(name, default, cast=str):
    return cast(sys.argv[sys.argv.index(name) + 1]) if name in sys.argv else default


def lifecycle_lines(log, last=40):
    """What regend said about the device's lifecycle and health, for a
    failed check's detail."""
    keep = [ln for ln in log.splitlines()
            if any(w in ln for w in (" health ", " lifecycle ", " E ", " W ", "client gone"))]
    return "\n".join(keep[-last:])


def rank_main():
    """--mode wedge: the call waits behind a spin, then the parent kills
    us. --mode ahead: as wedge, with a second of GEMMs queued on regend's
    lane ahead of the call. --mode done: our work done, calls left running
    in regend. --mode check: one call, its result against torch in
    float32."""
    import torch
    import regen.torch as rt
    rt.configure(socket=opt("--socket", None), ordering="events")
    mode = opt("--mode", "check")
    dev = "cuda:0"
    torch.manual_seed(int(time.time()))
    a = torch.randn(2048, 2048, device=dev, dtype=torch.bfloat16)
    b = torch.randn(2048, 2048, device=dev, dtype=torch.bfloat16)
    if mode == "check":
        try:
            y = rt.matmul(a, b)
            torch.cuda.synchronize()
        except Exception as e:   # the refusal is the result the parent looks for
            print(f"refused {type(e).__name__}: {e}", flush=True)
            return
        ref = a.float() @ b.float()
        err = ((y.float() - ref).norm() / ref.norm()).item()
        print(f"error {err:.3e}", flush=True)
        return
    if mode in ("wedge", "ahead"):
        src = torch.randn(2048, 2048, device=dev, dtype=torch.bfloat16)
        big = torch.randn(16384, 16384, device=dev, dtype=torch.bfloat16) if mode == "ahead" else None
        out = torch.empty_like(big) if mode == "ahead" else None
        # Each kernel once before the spin, as a rank's earlier steps would:
        # a kernel's first launch in the worker loads it (CUDA's lazy
        # loading), which waits for the whole context, the spin's wait
        # among it, and the call would be answered only after the spin.
        rt.matmul(a, b)
        if mode == "ahead":
            rt.runtime().client.gemm(big, big, out)
        torch.cuda.synchronize()
        torch.cuda._sleep(int(SPIN_S * 2.0e9))
        a.copy_(src)                       # regend must see this: its lane waits for it
        if mode == "ahead":
            # On the runtime's own connection (the lane of rt.matmul's call
            # to come), waiting on nothing: ~11 ms each on an H100.
            c = rt.runtime().client
            for _ in range(AHEAD_GEMMS):
                c.gemm(big, big, out, wait=False)
            print("queued", flush=True)
        rt.matmul(a, b)                    # answered at launch (in "ahead", after the GEMMs' answers)
        print("called", flush=True)
    else:
        big = torch.randn(8192, 8192, device=dev, dtype=torch.bfloat16)
        torch.cuda.synchronize()
        for _ in range(100):
            rt.matmul(big, big)            # ~1 ms each in regend, answered at launch
        print("called", flush=True)
    time.sleep(600)


def main():
    from regend_fixture import Regend, find_regend, record, require_torch, summary
    require_torch()
    import torch
    if not torch.cuda.is_available():
        print("SKIP: no CUDA device")
        return 77
    host_waits = opt("--client-wait", "stream") == "host"
    positional = [a for a in sys.argv[1:] if not a.startswith("--") and a not in ("stream", "host")]
    regend = find_regend(positional[0] if positional else None)
    if regend is None:
        print("SKIP: no regend")
        return 77
    import regen
    build = os.path.dirname(os.path.dirname(regend))
    env = dict(os.environ, REGEN_BUILD_ROOT=build,
               REGEN_LIBREGEN=os.environ.get("REGEN_LIBREGEN", os.path.join(build, "client", "libregen.so")),
               PYTHONPATH=os.path.join(REPO, "client", "python"))
    # The orphan watch's own lines (health at debug), for a failed check's detail.
    with Regend(regend, devices=1, backend="cuda", ready_timeout=120,
                env={"REGEN_DEBUG": "I,health:D,conn:D"},
                extra=["--call-deadline-ms", str(DEADLINE_MS), "--hang-cooldown-ms", str(COOLDOWN_MS),
                       "--cuda-client-wait", "host" if host_waits else "stream"]) as d:
        admin = regen.Client(d.socket, timeout=60)

        def device():
            return admin.generation()["devices"][0]

        def generation():
            return device()["generation"]

        def rank(mode):
            return subprocess.Popen([sys.executable, __file__, "--rank", "--socket", d.socket, "--mode", mode],
                                    env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)

        def killed_after_call(mode):
            p = rank(mode)
            line = p.stdout.readline().strip()
            if line != "called":
                p.kill()
                print(p.communicate()[1][-3000:])
                return None
            time.sleep(0.3)
            t = time.monotonic()
            p.send_signal(signal.SIGKILL)
            p.wait()
            return t

        def checked(what, expect_refused=False):
            p = rank("check")
            try:
                out, err = p.communicate(timeout=40)
            except subprocess.TimeoutExpired:
                p.kill()
                out, err = p.communicate()
                return record(f"{what}: answered within 40 s", False, err[-2000:] + "\n" + lifecycle_lines(d.log_text()))
            line = out.strip().splitlines()[-1] if out.strip() else ""
            if expect_refused:
                return record(f"{what}: refused with LimitExceeded", line.startswith("refused LimitExceeded"),
                              line or err[-2000:])
            ok = line.startswith("error ") and float(line.split()[1]) < 1e-2
            return record(f"{what}: computes right at once", ok, line or err[-2000:])

        failed_lines = [0]   # FAILED_LINEs seen by the last failed_within

        def failed_within(gen, seconds):
            """cuda_client_wait = host: the orphan's calls failed (one more
            FAILED_LINE in the log than last time) within `seconds`, the
            generation unchanged then and a second later."""
            t, before = time.monotonic(), failed_lines[0]
            while time.monotonic() - t < seconds and d.log_text().count(FAILED_LINE) <= before:
                time.sleep(0.05)
            time.sleep(1)
            failed_lines[0] = d.log_text().count(FAILED_LINE)
            return failed_lines[0] > before and generation() == gen

        def handled_within(gen, seconds):
            """The orphan handled as the mode says: the device replaced
            (stream), or the calls failed and nothing replaced (host)."""
            return failed_within(gen, seconds) if host_waits else replaced_within(gen, seconds)

        def replaced_within(gen, seconds):
            t = time.monotonic()
            while time.monotonic() - t < seconds:
                try:
                    now = device()
                    if now["generation"] > gen and now["state"] == "ready":
                        return True
                except Exception:
                    pass
                time.sleep(0.05)
            return False

        what = "its calls failed, nothing replaced," if host_waits else "the device replaced"
        # 1. Alone on the device.
        gen = generation()
        t = killed_after_call("wedge")
        if not record("alone: the rank's call was answered at launch, the rank killed", t is not None):
            return summary()
        handled = handled_within(gen, 10)
        took = time.monotonic() - t
        record(f"alone: {what} {took:.2f} s after the kill (call_deadline_ms is "
               f"{DEADLINE_MS / 1e3:.0f} s)", handled and took < 5, "\n" + lifecycle_lines(d.log_text()))
        log = d.log_text()
        named = FAILED_LINE in log if host_waits else "orphaned: pid" in log
        record("alone: the log names the orphaned wait, and the uid not charged",
               named and "not charged" in log and "charged with the hang" not in log,
               "" if named else "\n" + lifecycle_lines(log))
        checked("alone: a new rank of the same uid")

        # 1b. Work of regend's queued ahead of the wedged call finishes
        # before the device is replaced.
        gen = generation()
        p = rank("ahead")
        line = p.stdout.readline().strip()
        if record("ahead: GEMMs queued on the rank's lane, then the wedged call", line == "queued",
                  line or p.communicate()[1][-3000:]):
            # The wedged call sent (its answer comes at its launch, after
            # the GEMMs ahead of it: the lane holds so many in flight).
            time.sleep(0.3)
            t = time.monotonic()
            p.send_signal(signal.SIGKILL)
            p.wait()
            handled = handled_within(gen, 20)
            took = time.monotonic() - t
            import re
            m = re.findall(r"(\d+) call\(s\) ahead of them finished first", d.log_text())
            ok = handled and m and int(m[-1]) > 0 and 0.5 < took < 10
            record(f"ahead: {what} {took:.2f} s after the kill, once the {m[-1] if m else '?'} "
                   "call(s) ahead of the wedged one finished (not 0.25 s after it, cutting them)", ok,
                   "" if ok else "\n" + lifecycle_lines(d.log_text()))
        else:
            p.kill()

        # 2. Killed after its own work: nothing replaced.
        gen = generation()
        t = killed_after_call("done")
        time.sleep(3)
        record("done: the rank killed with its calls still running in regend, its own work done",
               t is not None)
        record("done: no replacement", generation() == gen, f"generation {gen} -> {generation()}")

        # 3. A second uid's session open on the device: charged (needs root
        # to be the second uid).
        if os.geteuid() != 0:
            print("SKIP shared: becoming uid 65534 needs root")
        else:
            other = subprocess.Popen(
                [sys.executable, "-c",
                 "import socket,sys,time\n"
                 "s=socket.socket(socket.AF_UNIX); s.connect(sys.argv[1])\n"
                 "s.sendall(b'{\"method\":\"io.regen.Device.Generation\"}\\0'); print(s.recv(4096)!=b'', flush=True)\n"
                 "time.sleep(600)\n", d.worker_socket(0)],
                stdout=subprocess.PIPE, text=True, preexec_fn=lambda: os.setuid(65534))
            ok = other.stdout.readline().strip() == "True"
            if record("shared: a session of uid 65534 open on the device's worker", ok):
                gen = generation()
                t = killed_after_call("wedge")
                handled = handled_within(gen, 10)
                took = time.monotonic() - t if t else 0
                record(f"shared: {what} {took:.2f} s after the kill", t is not None and handled and took < 5)
                if host_waits:
                    # Nobody else lost anything: nothing to charge.
                    record("shared: the uid not charged", "charged with the hang" not in d.log_text())
                    checked("shared: a new rank of the same uid")
                else:
                    record("shared: the uid charged with the hang", "charged with the hang" in d.log_text())
                    checked("shared: a new rank of the charged uid", expect_refused=True)
            other.kill()
            other.wait()
        admin.close()
    return summary()


if __name__ == "__main__":
    if "--rank" in sys.argv:
        rank_main()
    else:
        sys.exit(main())
