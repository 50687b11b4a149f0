#!/usr/bin/env python3
# SPDX-License-Identifier: Apache-2.0
"""The systemd units, tmpfiles/sysusers snippets and the shipped
regend.conf, as the build generated them.

1. What the docs promise is in the files (Type=notify, NotifyAccess=main,
   the socket's path, mode and group, /run/regen, group regen, ...).
2. The shipped regend.conf names every key of the option table (the keys
   Status reports), and regend accepts it, and with every key uncommented
   (each commented line shows a key's default).
3. io.regen.Comm has landed: the unit opens exactly what NCCL's bootstrap
   and transports need (AF_UNIX AF_INET AF_INET6 AF_NETLINK and no other
   family, no IPAddressDeny, the InfiniBand verbs devices and rdma_cm), the
   unit and the docs say so now (they said it "will need" it "when it
   lands"), and the drop-in they name for a node without communicators
   (docs/examples/systemd/regend-unix-only.conf) takes it back to AF_UNIX
   and IPAddressDeny=any.
4. `systemd-analyze verify` finds nothing to say about the units (with
   ExecStart pointed at the built regend, as the installed path does not
   exist here), with that drop-in too. Exit 77 (skipped) for this part
   where systemd-analyze is absent or cannot run in this container.

Usage: test_units.py REGEND BUILD_SYSTEMD_DIR DEFAULT_SOCKET [SYSTEMD_ANALYZE]
"""
import os
import re
import shutil
import subprocess
import sys
import tempfile

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "lib"))
from regend_fixture import Regend, call, check, fail, log, regend_path, skip


def read_unit(path):
    """{(section, key): [values]} of a unit file."""
    out = {}
    section = None
    with open(path) as f:
        for line in f:
            line = line.strip()
            if not line or line[0] in "#;":
                continue
            m = re.match(r"\[(\w+)\]$", line)
            if m:
                section = m.group(1)
                continue
            key, _, value = line.partition("=")
            out.setdefault((section, key.strip()), []).append(value.strip())
    return out


def want(unit, name, section, key, value):
    got = unit.get((section, key), [])
    check(value in got, "%s: [%s] %s=%s expected, found %r" % (name, section, key, value, got))


def static_checks(sysd, default_socket):
    service = read_unit(os.path.join(sysd, "regend.service"))
    socket_ = read_unit(os.path.join(sysd, "regend.socket"))
    for key, value in [("Type", "notify"), ("NotifyAccess", "main"), ("Restart", "on-failure"),
                       ("WatchdogSec", "30s"), ("KillMode", "mixed"), ("NoNewPrivileges", "yes"),
                       ("ProtectSystem", "strict"), ("ProtectHome", "yes"), ("PrivateTmp", "yes"),
                       ("DevicePolicy", "closed"),
                       ("SystemCallFilter", "@system-service"), ("SystemCallArchitectures", "native"),
                       ("LockPersonality", "yes"), ("MemoryDenyWriteExecute", "no"),
                       ("RuntimeDirectoryPreserve", "yes"), ("Group", "regen"),
                       ("CapabilityBoundingSet", "CAP_CHOWN"), ("PrivateMounts", "yes"),
                       ("MemoryMax", "64G"), ("TasksMax", "4096"), ("FileDescriptorStoreMax", "32769")]:
        want(service, "regend.service", "Service", key, value)
    for dev in ["/dev/nvidiactl rw", "/dev/nvidia-uvm rw", "char-nvidia-frontend rw", "char-nvidia-uvm rw"]:
        want(service, "regend.service", "Service", "DeviceAllow", dev)
    exec_start = service.get(("Service", "ExecStart"), [""])[0]
    check(exec_start.split()[0].endswith("/regend"), "ExecStart=%s does not run regend" % exec_start)
    check("@" not in exec_start, "ExecStart=%s: an unsubstituted @variable@" % exec_start)
    runtime = service.get(("Service", "RuntimeDirectory"), [""])[0]
    check(os.path.dirname(default_socket) == "/run/" + runtime,
          "RuntimeDirectory=%s but the socket is %s" % (runtime, default_socket))

    want(socket_, "regend.socket", "Socket", "ListenStream", default_socket)
    want(socket_, "regend.socket", "Socket", "SocketMode", "0660")
    want(socket_, "regend.socket", "Socket", "SocketGroup", "regen")
    want(socket_, "regend.socket", "Install", "WantedBy", "sockets.target")

    with open(os.path.join(sysd, "regen-tmpfiles.conf")) as f:
        tmpfiles = [l.split() for l in f if l.strip() and not l.startswith("#")]
    check(["d", os.path.dirname(default_socket), "0755", "root", "regen", "-"] in tmpfiles,
          "tmpfiles.d does not make %s: %r" % (os.path.dirname(default_socket), tmpfiles))
    src = os.path.join(sysd, "regen-sysusers.conf")
    with open(src) as f:
        sysusers = [l.split() for l in f if l.strip() and not l.startswith("#")]
    check(["g", "regen", "-"] in sysusers, "sysusers.d does not create group regen: %r" % sysusers)
    for text in [l for u in (service, socket_) for v in u.values() for l in v]:
        check("@" not in text or text.startswith("@system-service"), "unsubstituted variable in %r" % text)
    log("units say what the docs say")


UNIX_ONLY_DROPIN = os.path.join("docs", "examples", "systemd", "regend-unix-only.conf")
# What NCCL's bootstrap (TCP on the node's interface, the interfaces found
# over netlink) and its transports (TCP sockets, InfiniBand verbs) need.
NCCL_FAMILIES = ["AF_UNIX", "AF_INET", "AF_INET6", "AF_NETLINK"]
NCCL_DEVICES = ["char-infiniband_verbs rw", "/dev/infiniband/rdma_cm rw"]


def nccl_checks(sysd, source):
    """What the unit and the docs say of NCCL is what is so now."""
    future = re.compile(r"(NCCL|Comm)[^\n]{0,80}(will need|when it lands|when[^\n]{0,40}land)|"
                        r"(will need|when[^\n]{0,40}land)[^\n]{0,80}(NCCL|Comm)", re.I | re.S)
    for path in [os.path.join(sysd, "regend.service"), os.path.join(source, "README.md")] + \
            [os.path.join(source, "docs", f) for f in sorted(os.listdir(os.path.join(source, "docs")))
             if f.endswith(".md")]:
        text = re.sub(r"\s*\n\s*#?\s*", " ", open(path).read())
        m = future.search(text)
        check(not m, "%s still speaks of NCCL as to come: %r" % (path, m and m.group(0)))
    unit = read_unit(os.path.join(sysd, "regend.service"))
    families = unit.get(("Service", "RestrictAddressFamilies"), [])
    check(families == [" ".join(NCCL_FAMILIES)],
          "the unit's address families are %r, want exactly %r" % (families, NCCL_FAMILIES))
    check(("Service", "IPAddressDeny") not in unit, "the unit denies IP traffic, which NCCL's peers need")
    check(("Service", "PrivateNetwork") not in unit, "PrivateNetwork= would cut NCCL off from the node's network")
    for dev in NCCL_DEVICES:
        want(unit, "regend.service", "Service", "DeviceAllow", dev)
    service = open(os.path.join(sysd, "regend.service")).read()
    ops = open(os.path.join(source, "docs", "operations.md")).read()
    check("regend-unix-only.conf" in service, "the unit does not name the drop-in for nodes without communicators")
    check("regend-unix-only.conf" in ops, "docs/operations.md does not name the unix-only drop-in")
    for word in ("AF_NETLINK", "rdma_cm", "bootstrap"):
        check(word in ops, "docs/operations.md does not say why the unit opens %s" % word)
    dropin = read_unit(os.path.join(source, UNIX_ONLY_DROPIN))
    check(dropin.get(("Service", "RestrictAddressFamilies")) == ["", "AF_UNIX"],
          "the unix-only drop-in does not take the families back to AF_UNIX: %r"
          % dropin.get(("Service", "RestrictAddressFamilies")))
    check(dropin.get(("Service", "IPAddressDeny")) == ["any"], "the unix-only drop-in does not deny IP")
    check("" in dropin.get(("Service", "DeviceAllow"), []) and
          not any("infiniband" in d for d in dropin.get(("Service", "DeviceAllow"), [])),
          "the unix-only drop-in keeps /dev/infiniband")
    log("NCCL: the unit opens what it needs and no more; the docs say why; the drop-in closes it again")


def config_checks(regend, sysd, tmp):
    conf = os.path.join(sysd, "regend.conf")
    r = subprocess.run([regend, "--config", conf, "--version"], capture_output=True, text=True, timeout=30)
    check(r.returncode == 0, "regend refuses the shipped regend.conf: %s" % r.stderr)
    # Every `#key = value` line is a key with its default: all of them at once
    # must be accepted as well (the admin group made one that exists here).
    keys = []
    lines = []
    with open(conf) as f:
        for line in f:
            m = re.match(r"#(\w+) = (.*)$", line.rstrip("\n"))
            if m:
                key, value = m.groups()
                # The groups the shipped file names need not exist on a build machine.
                if key in ("admin_group", "socket_group"):
                    value = "root"
                keys.append(key)
                lines.append("%s = %s\n" % (key, value))
            else:
                lines.append(line)
    # Every key of the option table, as Status reports them: the shipped
    # file names each one, so a new option cannot be left out of it.
    with Regend(regend, devices=1) as d:
        expected = set(call(d.socket, "io.regen.Device.Status")["options"])
    check(set(keys) == expected, "regend.conf documents keys %r; the option table has %r" % (sorted(set(keys) - expected),
          sorted(expected - set(keys))))
    full = os.path.join(tmp, "regend-all-keys.conf")
    with open(full, "w") as f:
        f.writelines(lines)
    r = subprocess.run([regend, "--config", full, "--version"], capture_output=True, text=True, timeout=30)
    check(r.returncode == 0, "regend refuses regend.conf with every key uncommented: %s" % r.stderr)
    log("regend accepts regend.conf, and every key in it uncommented")


def analyze_checks(regend, sysd, source, analyze, tmp):
    if not analyze or not os.access(analyze, os.X_OK):
        skip("systemd-analyze not found: units not verified")
    # Can systemd-analyze verify anything here? A trivial unit tells.
    probe = os.path.join(tmp, "regen-probe.service")
    with open(probe, "w") as f:
        f.write("[Service]\nType=oneshot\nExecStart=/bin/true\n")
    try:
        r = subprocess.run([analyze, "verify", "--man=no", probe], capture_output=True, text=True, timeout=60)
    except (OSError, subprocess.TimeoutExpired) as e:
        skip("systemd-analyze cannot run here: %s" % e)
    if r.returncode != 0:
        skip("systemd-analyze verify does not work in this container: %s" % r.stderr.strip()[-400:])

    units = []
    # The metrics script, as the install makes it: executable.
    script = os.path.join(tmp, "regen-metrics-textfile")
    shutil.copy(os.path.join(sysd, "regen-metrics-textfile"), script)
    os.chmod(script, 0o755)
    for name in ("regend.service", "regend.socket", "regen-metrics.service", "regen-metrics.timer",
                 "regen-nvrx-health.service"):
        with open(os.path.join(sysd, name)) as f:
            text = f.read()
        # The installed paths do not exist in a build tree.
        exe = script if name.startswith(("regen-metrics", "regen-nvrx")) else regend
        text = re.sub(r"^ExecStart=(\S+)", "ExecStart=" + exe, text, flags=re.M)
        path = os.path.join(tmp, name)
        with open(path, "w") as f:
            f.write(text)
        units.append(path)
    # The unix-only drop-in, where systemd reads drop-ins of the unit's folder.
    os.makedirs(os.path.join(tmp, "regend.service.d"))
    shutil.copy(os.path.join(source, UNIX_ONLY_DROPIN), os.path.join(tmp, "regend.service.d", "unix-only.conf"))
    r = subprocess.run([analyze, "verify", "--man=no"] + units, capture_output=True, text=True, timeout=120,
                       cwd=tmp)
    complaints = [l for l in (r.stdout + r.stderr).splitlines() if tmp in l or "regend." in l]
    for l in complaints:
        log("systemd-analyze:", l)
    check(r.returncode == 0, "systemd-analyze verify exited %d: %s" % (r.returncode, r.stderr[-2000:]))
    check(not complaints, "systemd-analyze verify has complaints about the units")
    log("systemd-analyze verify: no complaints")


def main():
    regend = regend_path()
    if len(sys.argv) < 4:
        fail("usage: test_units.py REGEND BUILD_SYSTEMD_DIR DEFAULT_SOCKET [SYSTEMD_ANALYZE]")
    sysd, default_socket = sys.argv[2], sys.argv[3]
    analyze = sys.argv[4] if len(sys.argv) > 4 else ""
    source = os.environ.get("REGEN_TEST_SOURCE_ROOT") or os.path.join(os.path.dirname(os.path.abspath(__file__)),
                                                                        "..", "..")
    tmp = tempfile.mkdtemp(prefix="rg-units-")
    try:
        static_checks(sysd, default_socket)
        nccl_checks(sysd, source)
        config_checks(regend, sysd, tmp)
        analyze_checks(regend, sysd, source, analyze, tmp)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    log("ok")


if __name__ == "__main__":
    main()
