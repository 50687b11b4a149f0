"""Helpers for the operations tests: a raw Varlink client (NUL-framed JSON
over a Unix socket, fds as SCM_RIGHTS) and a regend started in a temp dir.

Standard library only, so the tests run wherever regend builds. Every wait
has a deadline: a test fails, it never hangs.
"""
import array
import fcntl
import json
import mmap
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time

SKIP = 77

# Slow machines (sanitizers, valgrind, busy CI) scale every timeout by this.
TIME_SCALE = float(os.environ.get("REGEN_TEST_TIME_SCALE", "1"))


def log(*args):
    print("[%.3f]" % (time.monotonic() % 1000), *args, file=sys.stderr, flush=True)


def fail(msg):
    log("FAIL:", msg)
    sys.exit(1)


def skip(msg):
    log("SKIP:", msg)
    sys.exit(SKIP)


def check(cond, msg):
    if not cond:
        fail(msg)


class VarlinkError(Exception):
    def __init__(self, name, params):
        super().__init__("%s %s" % (name, json.dumps(params)))
        self.name = name
        self.params = params


class Closed(Exception):
    """The peer closed the connection before a reply arrived."""


class Conn:
    """One Varlink connection. Replies come back in call order."""

    def __init__(self, path, timeout=10.0):
        self.path = path
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self.sock.settimeout(timeout * TIME_SCALE)
        self.sock.connect(path)
        self.buf = b""

    def close(self):
        self.sock.close()

    def send(self, method, params=None, fds=(), more=False, oneway=False):
        msg = {"method": method}
        if params is not None:
            msg["parameters"] = params
        if more:
            msg["more"] = True
        if oneway:
            msg["oneway"] = True
        data = json.dumps(msg).encode() + b"\0"
        if fds:
            # The fds travel with the message's first byte.
            anc = [(socket.SOL_SOCKET, socket.SCM_RIGHTS, array.array("i", fds))]
            n = self.sock.sendmsg([data[:1]], anc)
            data = data[n:]
        self.sock.sendall(data)

    def recv(self, timeout=None):
        """The next message as a dict. Raises Closed on EOF, socket.timeout."""
        if timeout is not None:
            self.sock.settimeout(timeout * TIME_SCALE)
        while b"\0" not in self.buf:
            chunk = self.sock.recv(1 << 16)
            if not chunk:
                raise Closed("connection closed by %s" % self.path)
            self.buf += chunk
        text, self.buf = self.buf.split(b"\0", 1)
        return json.loads(text)

    def reply(self, timeout=None):
        """The next reply's parameters, or VarlinkError."""
        msg = self.recv(timeout)
        if "error" in msg:
            raise VarlinkError(msg["error"], msg.get("parameters", {}))
        return msg.get("parameters", {})

    def call(self, method, params=None, fds=(), timeout=None):
        self.send(method, params, fds)
        return self.reply(timeout)


def call(path, method, params=None, timeout=10.0):
    c = Conn(path, timeout)
    try:
        return c.call(method, params)
    finally:
        c.close()


def wait_for(pred, timeout, what, interval=0.02):
    deadline = time.monotonic() + timeout * TIME_SCALE
    while True:
        r = pred()
        if r:
            return r
        if time.monotonic() >= deadline:
            fail("timed out after %.1f s waiting for %s" % (timeout * TIME_SCALE, what))
        time.sleep(interval)


def try_status(path):
    try:
        return call(path, "io.regen.Device.Status", timeout=2.0)
    except (OSError, Closed, VarlinkError, ValueError):
        return None


def all_ready(status, ndevices=None):
    if not status:
        return False
    devs = status.get("devices", [])
    if ndevices is not None and len(devs) != ndevices:
        return False
    return bool(devs) and all(d.get("state") == "ready" for d in devs)


def regend_path():
    if len(sys.argv) < 2:
        fail("usage: %s REGEND [ARGS...]" % sys.argv[0])
    # meson passes targets relative to the build dir, the tests' cwd.
    path = os.path.abspath(sys.argv[1])
    if not os.access(path, os.X_OK):
        skip("regend is not built: %s" % path)
    return path


class TempDir:
    """A short temp dir (socket paths are limited to 108 bytes)."""

    def __init__(self, prefix):
        self.path = tempfile.mkdtemp(prefix=prefix, dir="/tmp")

    def __enter__(self):
        return self.path

    def __exit__(self, *exc):
        shutil.rmtree(self.path, ignore_errors=True)


def write_config(dirpath, text=""):
    """An explicit config file, so the host's /etc/regen/regend.conf never
    leaks into a test."""
    path = os.path.join(dirpath, "regend.conf")
    with open(path, "w") as f:
        f.write(text)
    return path


class Regend:
    """regend in its own process group, stderr to a file for the log."""

    def __init__(self, argv, env=None, cwd=None):
        self.logpath = tempfile.mktemp(prefix="regend-log-", dir="/tmp")
        self.logfile = open(self.logpath, "w+")
        full_env = dict(os.environ)
        full_env.pop("NOTIFY_SOCKET", None)
        full_env.pop("WATCHDOG_USEC", None)
        full_env.pop("WATCHDOG_PID", None)
        full_env.pop("LISTEN_FDS", None)
        full_env.pop("LISTEN_PID", None)
        if env:
            full_env.update(env)
        log("starting:", " ".join(argv))
        self.proc = subprocess.Popen(argv, env=full_env, cwd=cwd, stdin=subprocess.DEVNULL,
                                     stdout=self.logfile, stderr=subprocess.STDOUT,
                                     start_new_session=True)
        self.pid = self.proc.pid

    def log_text(self):
        self.logfile.flush()
        with open(self.logpath) as f:
            return f.read()

    def signal(self, signum):
        self.proc.send_signal(signum)

    def wait(self, timeout):
        try:
            return self.proc.wait(timeout * TIME_SCALE)
        except subprocess.TimeoutExpired:
            return None

    def kill(self):
        if self.proc.poll() is None:
            try:
                os.killpg(self.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
            self.proc.wait(10)

    def finish(self, dump=False):
        self.kill()
        if dump:
            sys.stderr.write("---- regend log ----\n" + self.log_text() + "---- end ----\n")
        self.logfile.close()
        try:
            os.unlink(self.logpath)
        except OSError:
            pass


def pid_alive(pid):
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    # A zombie is not alive for our purposes.
    try:
        with open("/proc/%d/stat" % pid) as f:
            return f.read().split(") ", 1)[1][0] != "Z"
    except OSError:
        return False


def host_buffer(size):
    """A memfd of `size` bytes, sealed against shrinking as regend requires,
    and a writable map of it."""
    fd = os.memfd_create("regen-ops", os.MFD_CLOEXEC | os.MFD_ALLOW_SEALING)
    os.ftruncate(fd, size)
    fcntl.fcntl(fd, fcntl.F_ADD_SEALS, fcntl.F_SEAL_SHRINK)
    mm = mmap.mmap(fd, size)
    return fd, mm


def operand(buffer, offset, shape, dtype="f32"):
    return {"buffer": buffer, "offset": offset, "dtype": dtype, "shape": list(shape)}
