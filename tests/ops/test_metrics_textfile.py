#!/usr/bin/env python3
# SPDX-License-Identifier: Apache-2.0
"""The metrics for node_exporter's textfile collector say when regend is down.

regen-metrics-textfile (run by regen-metrics.timer) writes `regenctl
metrics` into the collector's folder every time: with regend serving, the
node's series and `regen_up 1`; with regend stopped, `regen_up 0` (and
nothing stale of the last good run) and regenctl's exit status 5; with no
regenctl to run, `regen_up 0` too. The file is replaced by a rename, and no
temporary file is left where the collector reads. The recipe the docs gave
(`regenctl metrics > f.tmp && mv f.tmp f`) kept the last good file when
regend was down: the docs now name the script and the timer, and no
`&& mv` recipe is left in them.

Usage: test_metrics_textfile.py REGEND REGENCTL SCRIPT SOURCE_ROOT
"""
import os
import re
import subprocess
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "lib"))
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from regend_fixture import Regend, check, log, regend_path
from ctl import parse_metrics


def write(script, folder, regenctl, socket):
    env = dict(os.environ, REGENCTL=regenctl, REGEN_SOCKET=socket)
    env.pop("REGEN_METRICS_DIR", None)
    p = subprocess.run(["sh", script, folder], capture_output=True, text=True, env=env, timeout=60)
    names = sorted(os.listdir(folder))
    check(names == ["regen.prom"], "the folder holds %s, not regen.prom alone" % names)
    check(oct(os.stat(os.path.join(folder, "regen.prom")).st_mode & 0o777) == "0o644", "regen.prom's mode")
    with open(os.path.join(folder, "regen.prom")) as f:
        samples, _ = parse_metrics(f.read())
    return p.returncode, samples


def main():
    regend = regend_path()
    regenctl, script, source = (os.path.abspath(a) for a in sys.argv[2:5])
    with Regend(regend, devices=2) as d:
        folder = os.path.join(d.dir, "textfile")
        os.mkdir(folder)
        rc, s = write(script, folder, regenctl, d.socket)
        check(rc == 0 and s[("regen_up", frozenset())] == 1 and
              any(n == "regen_device_generation" for n, _ in s), "with regend: exit %d, %s" % (rc, sorted(s)))
        d.stop()
        rc, s = write(script, folder, regenctl, d.socket)
        check(rc == 5 and s == {("regen_up", frozenset()): 0}, "without regend: exit %d, %s" % (rc, s))
        log("regend down: regen_up 0 replaced the last good file; exit 5")
        rc, s = write(script, folder, os.path.join(d.dir, "no-regenctl"), d.socket)
        check(rc != 0 and s == {("regen_up", frozenset()): 0}, "without regenctl: exit %d, %s" % (rc, s))
        log("no regenctl: regen_up 0")
    for doc in ("operations.md", "regenctl.md"):
        text = open(os.path.join(source, "docs", doc)).read()
        check(not re.search(r"regenctl metrics[^\n]*&&\s*\\?\s*\n?\s*mv", text),
              "docs/%s still gives the recipe that keeps a stale file when regend is down" % doc)
    check("regen-metrics.timer" in open(os.path.join(source, "docs", "operations.md")).read(),
          "docs/operations.md does not name regen-metrics.timer")
    log("PASS")
    return 0


if __name__ == "__main__":
    sys.exit(main())
