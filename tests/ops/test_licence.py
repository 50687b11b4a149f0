#!/usr/bin/env python3
# SPDX-License-Identifier: Apache-2.0
"""regen's licence, stated where each kind of user looks for it.

- LICENSE is the Apache License 2.0's full text.
- meson's project(), the wheel's pyproject.toml and debian/copyright say
  Apache-2.0 (and the copy of cJSON in subprojects/ keeps its MIT licence,
  with its text beside it).
- Every source git tracks has its SPDX-License-Identifier line
  (`scripts/spdx --check`; `scripts/spdx` adds what a merge left out).
  Skipped where the tree is not a git checkout (a source tarball).

Usage: test_licence.py SOURCE_DIR
"""
import os
import re
import subprocess
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "lib"))
from regend_fixture import check, log, skip


def read(root, path):
    with open(os.path.join(root, path), encoding="utf-8") as f:
        return f.read()


def main():
    root = sys.argv[1]
    text = read(root, "LICENSE")
    check(re.search(r"Apache License\s+Version 2\.0, January 2004", text) and "END OF TERMS AND CONDITIONS" in text,
          "LICENSE is not the Apache License 2.0's full text")
    check(re.search(r"^\s*license\s*:\s*'Apache-2\.0'", read(root, "meson.build"), re.M),
          "meson.build's project() does not say license : 'Apache-2.0'")
    check(re.search(r'^license\s*=\s*\{\s*file\s*=\s*"LICENSE"\s*\}', read(root, "pyproject.toml"), re.M),
          "pyproject.toml's license is not the file LICENSE")
    copyright = read(root, "debian/copyright")
    check(re.search(r"^Files: \*\n(?:[^\n]+\n)*?License: Apache-2\.0$", copyright, re.M),
          "debian/copyright's Files: * is not Apache-2.0")
    check(re.search(r"^Files: subprojects/cjson/\*\n(?:[^\n]+\n)*?License: MIT$", copyright, re.M) and
          "Permission is hereby granted" in read(root, "subprojects/cjson/LICENSE"),
          "subprojects/cjson is not stated MIT with its licence text")
    log("LICENSE, meson.build, pyproject.toml and debian/copyright say Apache-2.0; cJSON keeps MIT")

    if subprocess.run(["git", "-C", root, "rev-parse", "--git-dir"], capture_output=True).returncode != 0:
        skip("%s is not a git checkout: scripts/spdx lists what git tracks" % root)
    spdx = subprocess.run([sys.executable, os.path.join(root, "scripts", "spdx"), "--check"],
                          capture_output=True, text=True)
    check(spdx.returncode == 0, "sources without their SPDX-License-Identifier line (run scripts/spdx):\n%s%s" %
          (spdx.stdout, spdx.stderr))
    check(not spdx.stderr.strip(), "scripts/spdx knows no comment style for: %s" % spdx.stderr)
    log("every tracked source has its SPDX-License-Identifier line")
    return 0


if __name__ == "__main__":
    sys.exit(main())
