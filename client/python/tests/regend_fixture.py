"""Start a real regend on a temporary socket for a test, and stop it."""

import os
import shutil
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.dirname(HERE))
import regen  # noqa: E402

# Set by run.py --regend PATH; otherwise from the environment.
REGEND = None


def find_regend():
    """$REGEND, else <build root>/daemon/regend with the build root from
    $REGEN_BUILD_ROOT or meson's $REGEN_TEST_BUILD_ROOT."""
    if REGEND:
        return REGEND
    if os.environ.get("REGEND"):
        return os.environ["REGEND"]
    for var in ("REGEN_BUILD_ROOT", "REGEN_TEST_BUILD_ROOT"):
        root = os.environ.get(var)
        if root and os.access(os.path.join(root, "daemon", "regend"), os.X_OK):
            return os.path.join(root, "daemon", "regend")
    return None


class Regend:
    """``regend --backend host`` (by default) with fault injection on a
    socket in a fresh temporary directory; ready when __init__ returns."""

    def __init__(self, path=None, devices=2, backend="host", extra=(), ready_timeout=30.0):
        self.path = path or find_regend()
        if not self.path:
            raise RuntimeError("no regend: pass --regend PATH or set REGEN_BUILD_ROOT")
        self.dir = tempfile.mkdtemp(prefix="regen-py-")
        self.socket = os.path.join(self.dir, "regend.sock")
        self.log_path = os.path.join(self.dir, "regend.log")
        self._log = open(self.log_path, "w+b")
        argv = [self.path, "--socket", self.socket, "--backend", backend, "--devices", str(devices),
                "--enable-fault-injection", *extra]
        self.proc = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=self._log, stderr=self._log)
        self.devices = devices
        try:
            self.wait_ready(ready_timeout)
        except Exception:
            self.stop()
            raise

    def wait_ready(self, timeout=30.0):
        deadline = time.monotonic() + timeout
        last = None
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"regend exited with {self.proc.returncode}:\n{self.log_tail()}")
            try:
                with regen.Client(self.socket, timeout=5) as c:
                    st = c.status()
                if len(st["devices"]) == self.devices and all(d["state"] == "ready" for d in st["devices"]):
                    return st
                last = st
            except regen.Error as e:
                last = e
            time.sleep(0.02)
        raise RuntimeError(f"regend not ready within {timeout} s (last: {last}):\n{self.log_tail()}")

    def log_tail(self, lines=40):
        try:
            with open(self.log_path, "rb") as f:
                return b"\n".join(f.read().splitlines()[-lines:]).decode(errors="replace")
        except OSError:
            return ""

    def stop(self):
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self._log.close()
        shutil.rmtree(self.dir, ignore_errors=True)

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.stop()
