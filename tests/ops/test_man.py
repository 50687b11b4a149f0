#!/usr/bin/env python3
# SPDX-License-Identifier: Apache-2.0
"""The man pages say what the programs do: every option `regend --help`
lists is in regend(8), and every environment variable it names (the
tuning options', the log's, the test knobs), every key the shipped regend.conf documents is in
regend.conf(5), every command `regenctl --help` lists is in regenctl(1);
the pages were built (scdoc) and `meson install` installs them.

Usage: test_man.py REGEND REGENCTL SOURCE_DIR BUILD_DIR
"""
import os
import re
import subprocess
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "lib"))
from regend_fixture import check, log, skip


def read(path):
    with open(path) as f:
        return f.read()


def main():
    regend, regenctl, source, build = (os.path.abspath(a) for a in sys.argv[1:5])
    man = os.path.join(build, "docs", "man")
    if not os.path.isdir(man):
        skip("man pages not built (no scdoc)")
    pages = {p: read(os.path.join(man, p)) for p in ("regend.8", "regend.conf.5", "regenctl.1")}
    for p, text in pages.items():
        check(text.startswith(".\\\"") or ".TH" in text, "%s is not a man page" % p)

    help_text = subprocess.run([regend, "--help"], capture_output=True, text=True).stdout
    options = sorted(set(re.findall(r"^\s+(--[a-z][a-z-]+)", help_text, re.M)))
    check(options, "regend --help lists no option")
    src8 = read(os.path.join(source, "docs", "man", "regend.8.scd"))
    missing = [o for o in options if "*%s*" % o not in src8]
    check(not missing, "regend(8) lacks %s" % missing)
    variables = sorted(set(re.findall(r"\b(REGEN_[A-Z_]+[A-Z])\b", help_text)))
    check(len(variables) >= 10, "regend --help names %d environment variables: %r" % (len(variables), variables))
    missing = [v for v in variables if "*%s*" % v not in src8]
    check(not missing, "regend(8) lacks %s" % missing)

    conf = read(os.path.join(source, "systemd", "regend.conf"))
    keys = sorted(set(re.findall(r"^#?([a-z_]+) =", conf, re.M)))
    src5 = read(os.path.join(source, "docs", "man", "regend.conf.5.scd"))
    missing = [k for k in keys if "*%s*" % k not in src5]
    check(not missing, "regend.conf(5) lacks %s" % missing)

    ctl_help = subprocess.run([regenctl, "--help"], capture_output=True, text=True).stdout
    commands = sorted(set(re.findall(r"^  ([a-z][a-z-]+)\b", ctl_help.split("Options:")[0], re.M)))
    src1 = read(os.path.join(source, "docs", "man", "regenctl.1.scd"))
    missing = [c for c in commands if "*%s*" % c not in src1]
    check(not missing, "regenctl(1) lacks %s" % missing)
    log("man pages: %d regend options, %d environment variables, %d regend.conf keys, %d regenctl commands "
        "documented" % (len(options), len(variables), len(keys), len(commands)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
