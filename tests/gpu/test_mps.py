#!/usr/bin/env python3
"""Under CUDA MPS (issue 13, item 3c): what a rank sees when regend's worker
takes a fatal fault.  docs/torch.md says MPS delivers a fatal fault in any
client to every client on the GPU, so the rank loses its context with the
worker; this test holds the docs to that.

A rank (a child process, as its context may die) runs regen.torch GEMMs,
then regend injects device_lost (an illegal-address fault on the CUDA
backend) and the rank tries its own torch work and a regen.torch operation.
Asserts that regen.torch.mps_mode() reports MPS, and that the rank's own
CUDA work fails after the fault (the isolation regend gives without MPS is
gone); prints what the regen.torch operation did.

Needs an MPS control daemon for this user (nvidia-cuda-mps-control -d)
before regend and the rank start; exit 77 without one, without a GPU or
torch.  Without MPS the same fault leaves the rank's context working:
tests/gpu/test_regen_torch.py (lifecycle).

    python3 tests/gpu/test_mps.py [REGEND]
"""

import json
import os
import subprocess
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(os.path.dirname(HERE))
sys.path.insert(0, os.path.join(REPO, "tests", "lib"))
from regend_fixture import Regend, find_regend, require_torch  # noqa: E402

require_torch()

RANK = r"""
import json, sys, time, torch
sys.path.insert(0, %(pkg)r)
import regen, regen.torch as rt
rt.configure(socket=%(sock)r, recovery_timeout=30)
out = {"mps": rt.mps_mode()}
a = torch.randn(256, 256, device="cuda", dtype=torch.bfloat16)
b = torch.randn(256, 256, device="cuda", dtype=torch.bfloat16)
rt.matmul(a, b); torch.cuda.synchronize()
admin = regen.Client(%(sock)r)
admin.inject_fault(rt.runtime().regend_device(a.device), "device_lost")
time.sleep(2.0)
try:
    (a.float() @ b.float()).sum().item(); torch.cuda.synchronize()
    out["rank_own_work"] = "ok"
except Exception as e:
    out["rank_own_work"] = "%%s: %%s" %% (type(e).__name__, str(e)[:200])
try:
    rt.matmul(a, b); torch.cuda.synchronize()
    out["regen_op"] = "ok"
except Exception as e:
    out["regen_op"] = "%%s: %%s" %% (type(e).__name__, str(e)[:200])
print("RESULT " + json.dumps(out))
"""


def main():
    pipe = os.environ.get("CUDA_MPS_PIPE_DIRECTORY", "/tmp/nvidia-mps")
    if not os.path.exists(os.path.join(pipe, "control")):
        print(f"SKIP: no MPS control daemon ({pipe}/control); start one with nvidia-cuda-mps-control -d")
        return 77
    regend = find_regend(sys.argv[1] if len(sys.argv) > 1 else None)
    if regend is None:
        print("SKIP: no regend")
        return 77
    build = os.path.dirname(os.path.dirname(regend))
    env = dict(os.environ, REGEN_LIBREGEN=os.path.join(build, "client", "libregen.so"))
    results = []
    with Regend(regend, devices=1, backend="cuda", ready_timeout=120) as d:
        code = RANK % {"pkg": os.path.join(REPO, "client", "python"), "sock": d.socket}
        r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=600)
        line = next((x for x in r.stdout.splitlines() if x.startswith("RESULT ")), None)
        if line is None:
            print(r.stdout[-2000:], r.stderr[-4000:])
            print("0 passed, 1 failed")
            return 1
        out = json.loads(line[len("RESULT "):])
        print(json.dumps(out, indent=1))
        results.append(("mps_mode() reports the rank under MPS", out["mps"]["rank"] and not out["mps"]["isolated"]))
        results.append(("the rank's own CUDA work fails after regend's fault (no isolation under MPS)",
                        out["rank_own_work"] != "ok"))
    for name, ok in results:
        print(f"{'PASS' if ok else 'FAIL'}  {name}")
    passed = sum(ok for _, ok in results)
    print(f"{passed} passed, {len(results) - passed} failed")
    return 0 if passed == len(results) else 1


if __name__ == "__main__":
    sys.exit(main())
