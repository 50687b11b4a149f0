#!/usr/bin/env python3
# SPDX-License-Identifier: Apache-2.0
"""What `meson install` gives a fresh machine (the wheel's own test is
test_wheel.py).

- meson install (into a DESTDIR) puts regend, regenctl, libregen and its
  header, the pkg-config file, the units and the Python package `regen`
  where the installed Python finds it (and the CUDA backend's module, in a
  build with it).
- The installed regen.pc answers `pkg-config --cflags --libs regen` on a
  machine without libcjson-dev (only our .pc on the search path).
- The installed regend starts as README says on a machine without
  /run/regen: it makes the socket's directory and serves.
- meson install puts regen._accel beside the package where it is built,
  and the installed package loads it.

Usage: test_install.py BUILD_DIR SOURCE_DIR
"""
import glob
import os
import shutil
import subprocess
import sys
import tempfile

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "lib"))
from regend_fixture import Regend, call, check, log


def run(argv, **kw):
    r = subprocess.run(argv, capture_output=True, text=True, timeout=300, **kw)
    check(r.returncode == 0, "%s failed (%d): %s%s" % (" ".join(argv), r.returncode, r.stdout[-2000:], r.stderr[-2000:]))
    return r.stdout


def clean_env():
    """The environment without the test run's pointers into the build tree:
    what is installed must stand alone."""
    return {k: v for k, v in os.environ.items() if k not in ("REGEN_BUILD_ROOT", "REGEN_PY_ACCEL", "REGEN_LIBREGEN")}


def one(pattern, what):
    hits = glob.glob(pattern, recursive=True)
    check(hits, "meson install put no %s (%s)" % (what, pattern))
    return hits[0]


def main():
    build, source = os.path.abspath(sys.argv[1]), os.path.abspath(sys.argv[2])
    tmp = tempfile.mkdtemp(prefix="regen-install-")
    try:
        dest = os.path.join(tmp, "dest")
        run(["meson", "install", "-C", build, "--destdir", dest, "--no-rebuild", "--quiet"])
        for pattern, what in (("**/sbin/regend", "regend"), ("**/bin/regenctl", "regenctl"),
                              ("**/libregen.so.0*", "libregen"), ("**/include/regen.h", "regen.h"),
                              ("**/pkgconfig/regen.pc", "regen.pc"), ("**/systemd/system/regend.service", "unit"),
                              ("**/regen/__init__.py", "Python package"), ("**/regen/ops.py", "Python op table"),
                              ("**/regen/pool.py", "Python pool binding"),
                              ("**/regen/torch/__init__.py", "regen.torch"),
                              ("**/systemd/system/regen-metrics.timer", "the metrics timer"),
                              ("**/regen/regen-metrics-textfile", "the metrics script"),
                              ("**/bin/regen-nvrx-health", "regen-nvrx-health"),
                              ("**/systemd/system/regen-nvrx-health.service", "the NVRx health check's unit")) + (
                                  (("**/man8/regend.8", "regend(8)"), ("**/man5/regend.conf.5", "regend.conf(5)"),
                                   ("**/man1/regenctl.1", "regenctl(1)"))
                                  if os.path.isdir(os.path.join(build, "docs", "man")) else ()):
            one(os.path.join(dest, pattern), what)
        check(os.access(one(os.path.join(dest, "**/regen/regen-metrics-textfile"), "the metrics script"), os.X_OK),
              "the metrics script is installed without its x bit")
        if os.path.exists(os.path.join(build, "daemon", "backend", "cuda", "backend-cuda.so")):
            one(os.path.join(dest, "**/regen/backend-cuda.so"), "CUDA backend module")
        # Every module of the package, not a list kept by hand: meson
        # install had left out regen/torch/_block.py, and `import
        # regen.torch` failed in what it installed.
        package = os.path.join(source, "client", "python", "regen")
        installed_pkg = os.path.dirname(one(os.path.join(dest, "**/regen/__init__.py"), "Python package"))
        for root, _, names in os.walk(package):
            for name in names:
                if name.endswith(".py"):
                    rel = os.path.relpath(os.path.join(root, name), package)
                    check(os.path.exists(os.path.join(installed_pkg, rel)), "meson install left out regen/%s" % rel)
        check(os.path.exists(os.path.join(installed_pkg, "py.typed")), "meson install left out regen/py.typed")
        # regen._accel beside the package's modules, where the build has
        # it: the installed package loads it by itself.
        if os.path.exists(os.path.join(build, "client", "python", "_accel.abi3.so")):
            accel = one(os.path.join(dest, "**/regen/_accel.abi3.so"), "regen._accel")
            check(os.path.dirname(accel) == installed_pkg, "regen._accel is not beside the package: %s" % accel)
            out = run([sys.executable, "-c", "from regen import accel; print(accel.module.__name__)"],
                      env=dict(clean_env(), PYTHONPATH=os.path.dirname(installed_pkg)))
            check(out.strip() == "regen._accel", "the installed package did not load regen._accel: %r" % out)
        log("meson install: regend, regenctl, libregen, regen.h, regen.pc, units, Python package")

        installed = one(os.path.join(dest, "**/sbin/regend"), "regend")
        sock = os.path.join(tmp, "run", "regen", "regend.sock")
        with Regend(installed, devices=1, start=False) as d:
            d.argv[d.argv.index("--socket") + 1] = sock
            d.socket = sock
            d.start()
            st = call(sock, "io.regen.Device.Status")
            check(st["devices"][0]["state"] == "ready", "the installed regend: %r" % st)
            check(oct(os.stat(os.path.dirname(sock)).st_mode & 0o777) == "0o755", "socket directory mode")
        log("the installed regend made %s and served" % os.path.dirname(sock))

        pc = os.path.dirname(one(os.path.join(dest, "**/pkgconfig/regen.pc"), "regen.pc"))
        if shutil.which("pkg-config"):
            env = dict(os.environ, PKG_CONFIG_LIBDIR=pc, PKG_CONFIG_PATH="")
            flags = run(["pkg-config", "--cflags", "--libs", "regen"], env=env)
            check("-lregen" in flags, "pkg-config --libs regen: %r" % flags)
            log("pkg-config with only regen.pc on its path: %s" % flags.strip())
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
