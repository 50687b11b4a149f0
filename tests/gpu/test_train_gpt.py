#!/usr/bin/env python3
# SPDX-License-Identifier: Apache-2.0
"""Issue 13, item 6, on a GPU: client/python/examples/train_gpt.py trained
through regend (regen.torch) and in process from the same seed, with
`regenctl restart --wait` before one step and an injected device_lost
before another.  Asserts:

  - every step ran (no step lost) and the loss went down;
  - the loss curves agree within bf16 tolerance: |a - b| <= TOL * max(1, |b|)
    at every step (TOL 0.03 by default: cuBLASLt/cuDNN kernels in regend and
    torch's own in process round differently in bf16);
  - memory is flat: the rank's allocated memory and regend's memory_used at
    the end are within a margin of what they were after the first steps;
  - the restart and the fault were recovered (regen.torch counted them).

    python3 tests/gpu/test_train_gpt.py [REGEND] [--full] [--steps N] [--tol X]

--full trains the issue's model (8 layers, width 2048, 16 heads, sequence
2048) instead of --small.  Exit 0 pass, 1 fail, 77 skipped (no torch, no
CUDA, no regend).  Prints "N passed, N failed" last.
"""

import json
import os
import subprocess
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(os.path.dirname(HERE))
sys.path.insert(0, os.path.join(REPO, "tests", "lib"))
from regend_fixture import Regend, find_regend, record, record_width, require_torch, summary  # noqa: E402

require_torch()
record_width(44)


def opt(name, default, cast=str):
    return cast(sys.argv[sys.argv.index(name) + 1]) if name in sys.argv else default


def main():
    positional = [a for i, a in enumerate(sys.argv[1:], 1)
                  if not a.startswith("--") and sys.argv[i - 1] not in ("--steps", "--tol")]
    regend = find_regend(positional[0] if positional else None)
    if regend is None:
        print("SKIP: no regend")
        return 77
    build = os.path.dirname(os.path.dirname(regend))
    steps = opt("--steps", 40, int)
    tol = opt("--tol", 0.03, float)
    restart_at, fault_at = steps // 4, steps // 2
    env = dict(os.environ, REGEN_BUILD_ROOT=build,
               REGEN_LIBREGEN=os.environ.get("REGEN_LIBREGEN", os.path.join(build, "client", "libregen.so")))
    with Regend(regend, devices=1, backend="cuda", ready_timeout=120) as d, \
            tempfile.NamedTemporaryFile(suffix=".json") as out:
        argv = [sys.executable, os.path.join(REPO, "client", "python", "examples", "train_gpt.py"),
                "--mode", "both", "--steps", str(steps), "--socket", d.socket, "--json", out.name,
                "--restart-at", str(restart_at), "--fault-at", str(fault_at), "--quiet"]
        if "--full" not in sys.argv:
            argv.append("--small")
        r = subprocess.run(argv, env=env, capture_output=True, text=True, timeout=3600)
        print(r.stdout[-3000:])
        if r.returncode != 0:
            print(r.stderr[-5000:])
            record("train_gpt.py ran", False, f"exit {r.returncode}")
            return summary()
        res = json.load(open(out.name))
    torch_run, regend_run = res["runs"]["torch"], res["runs"]["regend"]
    a, b = regend_run["losses"], torch_run["losses"]
    record("every step ran", len(a) == len(b) == steps, f"{len(a)} and {len(b)} of {steps}")
    record("it trained", a[-1] < a[0] - 0.1, f"{a[0]:.3f} -> {a[-1]:.3f}")
    worst = max(abs(x - y) / max(1.0, abs(y)) for x, y in zip(a, b))
    record("loss curve matches in process", worst <= tol, f"worst relative difference {worst:.4f} (tol {tol})")
    st = regend_run["stats"]
    record("restart and fault recovered", st["recoveries"] >= 2, f"{st['recoveries']} recoveries, {st['retries']} retries")
    rank = regend_run["rank_memory"]
    warm = min(5, len(rank) - 1)
    record("rank memory flat", rank[-1] <= rank[warm] + (64 << 20),
           f"{rank[warm] >> 20} -> {rank[-1] >> 20} MiB allocated")
    reg = [m for m in regend_run["regend_memory"] if m is not None]
    record("regend memory flat", len(reg) >= 2 and reg[-1] <= reg[1] + (256 << 20),
           f"{[m >> 20 for m in reg]} MiB")
    calls = regend_run["calls_per_step"]
    print(f"throughput regend/torch {res['throughput_ratio']:.3f}; calls per step {calls[-1]}; "
          f"handoffs {st['handoffs']} in {steps} steps; pool {st.get('pool')}")
    return summary()


if __name__ == "__main__":
    sys.exit(main())
