#!/usr/bin/env python3
# SPDX-License-Identifier: Apache-2.0
"""Every environment variable of regen is named in one place.

1. regend's: each "REGEN_..." string in daemon/ is an option's variable or
   an entry of daemon/env.c's table, so `regend --help` lists it (and
   test_man.py holds regend(8) to that list); no file of daemon/ but env.c
   and options.c calls getenv on one.
2. The clients': each REGEN_ variable that libregen, regenctl or the Python
   package reads (getenv, os.environ) is a row of docs/torch.md's Settings
   table.

Usage: test_env_named.py REGEND SOURCE_ROOT
"""
import os
import re
import subprocess
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "lib"))
from regend_fixture import check, log

READS = re.compile(r"""(?:getenv\(\s*|environ\.get\(\s*|environ\[\s*)["'](REGEN_[A-Z0-9_]+)["']""")


def sources(root, folder, exts):
    for top, dirs, files in os.walk(os.path.join(root, folder)):
        dirs[:] = [d for d in dirs if d not in ("tests", "__pycache__")]
        for name in files:
            if name.endswith(exts):
                path = os.path.join(top, name)
                with open(path, encoding="utf-8") as f:
                    yield os.path.relpath(path, root), f.read()


def main():
    regend, root = sys.argv[1], sys.argv[2]
    help_text = subprocess.run([regend, "--help"], capture_output=True, text=True).stdout
    listed = set(re.findall(r"\b(REGEN_[A-Z0-9_]+[A-Z0-9])\b", help_text))

    named = set()
    for path, text in sources(root, "daemon", (".c", ".h", ".cu")):
        for name in re.findall(r'"(REGEN_[A-Z0-9_]+)"', text):
            named.add(name)
            check(name in listed, "%s names %s, which regend --help does not list: make it an option (options.c) "
                  "or a test knob (env.c)" % (path, name))
        if os.path.basename(path) not in ("env.c", "options.c"):
            check(not READS.search(text), "%s reads %s itself: read it through options.c or env.c"
                  % (path, READS.search(text).group(1) if READS.search(text) else ""))
    log("regend: %d variables, each an option's or env.c's, all in --help" % len(named))

    with open(os.path.join(root, "docs", "torch.md"), encoding="utf-8") as f:
        doc = f.read()
    table = doc[doc.index("## Settings"):]
    table = table[:table.index("\n## ")]
    rows = set(re.findall(r"`(REGEN_[A-Z0-9_]+)`", table))
    read = {}
    for folder, exts in (("client", (".c", ".h", ".py")),):
        for path, text in sources(root, folder, exts):
            for name in READS.findall(text):
                read.setdefault(name, path)
    for name, path in sorted(read.items()):
        check(name in rows, "%s reads %s, which docs/torch.md's Settings table does not name" % (path, name))
    log("clients: %d variables read, each a row of docs/torch.md's Settings" % len(read))
    log("PASS")
    return 0


if __name__ == "__main__":
    sys.exit(main())
