# SPDX-License-Identifier: Apache-2.0
"""Shared pieces of the Python benchmarks: timing statistics, a regend to
talk to, and markdown/JSON output."""

import json
import os
import statistics
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(os.path.dirname(HERE))
sys.path.insert(0, os.path.join(REPO, "client", "python"))
sys.path.insert(0, os.path.join(REPO, "tests", "lib"))

# regend_fixture first: it points regen at the build of the regend named on the command line.
from regend_fixture import Regend, find_regend, require_torch  # noqa: E402,F401
import regen  # noqa: E402
from regen.varlink import Connection  # noqa: E402


def percentile(xs, p):
    """Nearest-rank percentile of a non-empty list."""
    s = sorted(xs)
    k = max(0, min(len(s) - 1, int(round(p / 100.0 * len(s) + 0.5)) - 1))
    return s[k]


def summary(samples_s):
    """Seconds in, microseconds out: median, p50, p99, min, mean, n."""
    us = [x * 1e6 for x in samples_s]
    return {"median_us": statistics.median(us), "p50_us": percentile(us, 50), "p99_us": percentile(us, 99),
            "min_us": min(us), "mean_us": statistics.fmean(us), "n": len(us)}


def time_calls(fn, iters, warmup):
    for _ in range(warmup):
        fn()
    out = []
    for _ in range(iters):
        t0 = time.perf_counter()
        fn()
        out.append(time.perf_counter() - t0)
    return out


def round_trips(socket_path, method, iters, warmup, params=None):
    """Wall time of one Varlink call on a raw connection (no client logic)."""
    conn = Connection(socket_path)
    try:
        return time_calls(lambda: conn.call(method, params), iters, warmup)
    finally:
        conn.close()


def markdown_table(headers, rows):
    lines = ["| " + " | ".join(headers) + " |", "|" + "|".join("---" for _ in headers) + "|"]
    for r in rows:
        lines.append("| " + " | ".join(str(x) for x in r) + " |")
    return "\n".join(lines)


def write_json(path, data):
    if path:
        with open(path, "w") as f:
            json.dump(data, f, indent=2, sort_keys=True)
            f.write("\n")


class Daemon:
    """An existing regend (--socket) or a fresh one started for the run."""

    def __init__(self, socket_path, regend_path, backend, devices=1):
        self.owned = None
        if socket_path:
            self.socket = socket_path
        else:
            self.owned = Regend(find_regend(regend_path), devices=devices, backend=backend, ready_timeout=120)
            self.socket = self.owned.socket

    def close(self):
        if self.owned:
            self.owned.stop()
