#!/usr/bin/env python3
# SPDX-License-Identifier: Apache-2.0
"""docs/protocol.md stays in step with the IDL (proto/idl/*.varlink, the
source of truth): every method, as `Interface.Method`, and every error, by
its full name, of every public interface appears in the document.
io.regen.Worker is internal (the supervisor's channel to its workers) and is
not documented for clients.

Usage: test_protocol_doc.py SOURCE_ROOT
"""
import glob
import os
import re
import sys

INTERNAL = {"io.regen.Worker"}


def parse_idl(path):
    """(interface, [methods], [errors]) of one .varlink file."""
    interface = None
    methods, errors = [], []
    with open(path) as f:
        for line in f:
            line = line.split("#", 1)[0].strip()
            m = re.match(r"interface\s+([A-Za-z0-9_.\-]+)$", line)
            if m:
                interface = m.group(1)
                continue
            m = re.match(r"(method|error)\s+([A-Z][A-Za-z0-9]*)\s*\(", line)
            if m:
                (methods if m.group(1) == "method" else errors).append(m.group(2))
    if interface is None:
        raise SystemExit("%s: no interface line" % path)
    return interface, methods, errors


def main():
    if len(sys.argv) != 2:
        raise SystemExit("usage: test_protocol_doc.py SOURCE_ROOT")
    root = sys.argv[1]
    idls = sorted(glob.glob(os.path.join(root, "proto", "idl", "*.varlink")))
    if not idls:
        print("FAIL: no IDL files under %s/proto/idl" % root)
        return 1
    with open(os.path.join(root, "docs", "protocol.md")) as f:
        doc = f.read()
    missing = []
    checked = 0
    for path in idls:
        interface, methods, errors = parse_idl(path)
        if interface in INTERNAL:
            continue
        if interface not in doc:
            missing.append("interface %s (%s)" % (interface, os.path.basename(path)))
        for kind, names in (("method", methods), ("error", errors)):
            for name in names:
                full = "%s.%s" % (interface, name)
                checked += 1
                # The full name, not as part of a longer one.
                if not re.search(re.escape(full) + r"(?![A-Za-z0-9])", doc):
                    missing.append("%s %s (%s)" % (kind, full, os.path.basename(path)))
    for m in missing:
        print("docs/protocol.md does not mention %s" % m)
    if missing:
        print("FAIL: %d of %d names missing; document them in docs/protocol.md" % (len(missing), checked))
        return 1
    print("ok: %d methods and errors of %d IDL files are documented" % (checked, len(idls)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
