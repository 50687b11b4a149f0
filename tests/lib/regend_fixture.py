# SPDX-License-Identifier: Apache-2.0
"""The one way a Python test starts regend, as tests/lib/daemon.c is for C.

Standard library only, so every test can use it wherever regend builds: the
operations tests (tests/ops), the Python client's tests (client/python/tests),
the GPU scripts (tests/gpu/*.py) and the benchmarks (tests/bench/*.py), under
meson or run by hand. A script puts this folder on sys.path:

    sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "lib"))
    from regend_fixture import Regend, check, find_regend

What it holds: regend in a fresh temp dir of its own (socket, worker sockets,
configuration file, log), in its own process group, ready only when every
device serves; a raw Varlink connection (NUL-framed JSON, fds as SCM_RIGHTS);
waits with deadlines; the test's exit codes (0 pass, 1 fail, 77 skipped).
Every timeout is multiplied by $REGEN_TEST_TIMEOUT_MULTIPLIER (default 1),
the variable the C tests read too.
"""
import array
import contextlib
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
import traceback

SKIP = 77
HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(os.path.dirname(HERE))


def _multiplier():
    text = os.environ.get("REGEN_TEST_TIMEOUT_MULTIPLIER", "") or "1"
    try:
        value = float(text)
    except ValueError:
        value = 0
    if not 1 <= value <= 1000:
        print("REGEN_TEST_TIMEOUT_MULTIPLIER=%s is not a number in [1, 1000]: using 1" % text, file=sys.stderr)
        value = 1.0
    return value


# Slow machines (sanitizers, valgrind, busy CI) scale every timeout by this.
TIME_SCALE = _multiplier()

# Set by a runner (client/python/tests/run.py --regend PATH) for every test.
REGEND = None


def _build_root_of_regend_argument():
    """The build tree of a regend named on the command line
    (BUILD/daemon/regend), so that regen's libregen and regen._accel come
    from the same build as the daemon the test starts: without it a copied
    build tree (the GPU machine's) left the Python lanes on Varlink and a
    forced ring refused.  $REGEN_BUILD_ROOT, where set, wins."""
    if os.environ.get("REGEN_BUILD_ROOT"):
        return
    for arg in sys.argv[1:]:
        path = os.path.abspath(arg)
        daemon_dir = os.path.dirname(path)
        if os.path.basename(path) == "regend" and os.path.basename(daemon_dir) == "daemon" and \
                os.access(path, os.X_OK):
            os.environ["REGEN_BUILD_ROOT"] = os.path.dirname(daemon_dir)
            return


# Before anything imports regen (regen.accel looks once, at import).
_build_root_of_regend_argument()


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


# The check that goes on, for scripts that run every case and report them
# all (the GPU scripts, bench_keep): record() prints one line per check,
# "PASS  <name> <detail>" or "FAIL  <name> <detail>", and summary() the last,
# "N passed, N failed", and gives the exit status. The GPU logs are read by
# those words (lines starting PASS or FAIL, the "passed" line).
_records = []           # (name, ok) in the order recorded
_name_width = 56


def record_width(columns):
    """Pads the names of later record() lines to `columns`, so that a
    script's details line up under its longest names."""
    global _name_width
    _name_width = columns


def record(name, ok, detail=""):
    """Records check `name` as passed or failed; returns ok as a bool, so
    that a script can stop a case whose later checks depend on this one."""
    ok = bool(ok)
    _records.append((name, ok))
    print(f"{'PASS' if ok else 'FAIL'}  {name:<{_name_width}} {detail}", flush=True)
    return ok


def failed_count():
    """How many record() calls failed so far (a script prints regend's log when any did)."""
    return sum(1 for _, ok in _records if not ok)


def guarded(name, fn, /, *args, **kwargs):
    """fn(*args, **kwargs), a case that records its own checks; an exception
    out of it is the failed check `name`, and the cases after it still run.
    An AssertionError is the case's own verdict: its message is the detail.
    Any other exception is a crash: its traceback is printed too."""
    try:
        fn(*args, **kwargs)
    except AssertionError as e:
        record(name, False, str(e))
    except Exception as e:
        record(name, False, f"{type(e).__name__}: {e}")
        traceback.print_exc()


def summary():
    """Prints "N passed, N failed"; returns the exit status: 0 when every
    check passed, 1 when one failed or none was recorded (a script that
    checked nothing has not passed)."""
    passed = len(_records) - failed_count()
    print(f"{passed} passed, {failed_count()} failed", flush=True)
    return 0 if _records and passed == len(_records) else 1


def rss_kib(pid):
    """Process pid's resident set in KiB (/proc), None where it has none
    (gone, or a zombie)."""
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1])
    return None


@contextlib.contextmanager
def cuda_regend(regend, **kwargs):
    """A GPU script's regend (one CUDA device): its log's tail printed at
    the end where a check failed, and stopped."""
    daemon = Regend(regend, devices=1, backend="cuda", ready_timeout=120, **kwargs)
    try:
        yield daemon
    finally:
        if failed_count():
            print("--- regend log (tail) ---")
            print(daemon.log_tail(40))
        daemon.stop()


def take_option(name, default):
    """The value after ``name`` on the command line, taken out of sys.argv
    (so that what is left is positional: the regend first), or default."""
    if name in sys.argv:
        i = sys.argv.index(name)
        value = sys.argv[i + 1]
        del sys.argv[i:i + 2]
        return value
    return default


def take_flag(name):
    """Whether ``name`` is on the command line, taken out of sys.argv as
    take_option takes an option."""
    if name in sys.argv:
        sys.argv.remove(name)
        return True
    return False


def find_regend(arg=None):
    """The regend to run: `arg` (a path given on the command line), else the
    runner's REGEND, else $REGEND, else daemon/regend under $REGEN_BUILD_ROOT,
    $REGEN_TEST_BUILD_ROOT (set by meson) or <repo>/build, whichever is built.
    None when there is none."""
    for given in (arg, REGEND, os.environ.get("REGEND")):
        if given:
            return os.path.abspath(given)
    for root in (os.environ.get("REGEN_BUILD_ROOT"), os.environ.get("REGEN_TEST_BUILD_ROOT"),
                 os.path.join(REPO, "build")):
        if root and os.access(os.path.join(root, "daemon", "regend"), os.X_OK):
            return os.path.join(root, "daemon", "regend")
    return None


def regend_path():
    """regend from argv[1] (meson passes it), skipping (77) when it is not built."""
    if len(sys.argv) < 2:
        fail("usage: %s REGEND [ARGS...]" % sys.argv[0])
    # meson passes targets relative to the build dir, the tests' cwd.
    path = os.path.abspath(sys.argv[1])
    if not os.access(path, os.X_OK):
        skip("regend is not built: %s" % path)
    return path


def gpu_script_args(default_steps):
    """What a GPU script's command line, `[REGEND] [--steps N]`, asks for:
    the regend (find_regend's, given the first argument) and the number of
    steps. Prints SKIP and exits 77 when there is no regend."""
    argv = sys.argv[1:]
    steps = default_steps
    if "--steps" in argv:
        i = argv.index("--steps")
        steps = int(argv[i + 1])
        del argv[i:i + 2]
    positional = [a for a in argv if not a.startswith("--")]
    regend = find_regend(positional[0] if positional else None)
    if regend is None:
        print("SKIP: no regend")
        sys.exit(SKIP)
    return regend, steps


def libregen_for(regend):
    """$REGEN_LIBREGEN, else the client/libregen.so of regend's build tree."""
    build = os.path.dirname(os.path.dirname(regend))
    return os.environ.get("REGEN_LIBREGEN", os.path.join(build, "client", "libregen.so"))


class VarlinkError(Exception):
    def __init__(self, name, params):
        super().__init__("%s %s" % (name, json.dumps(params)))
        self.name = name
        self.params = params


class Closed(Exception):
    """The peer closed the connection before a reply arrived."""


class Conn:
    """One raw Varlink connection. Replies come back in call order."""

    def __init__(self, path, timeout=10.0):
        self.path = path
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self.sock.settimeout(timeout * TIME_SCALE)
        try:
            self.sock.connect(path)
        except OSError:
            self.sock.close()
            raise
        self.buf = b""

    def close(self):
        self.sock.close()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

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
    with Conn(path, timeout) as c:
        return c.call(method, params)


def wait_for(pred, timeout, what, interval=0.02):
    """pred()'s first true value; fails the test after timeout (scaled)."""
    deadline = time.monotonic() + timeout * TIME_SCALE
    while True:
        r = pred()
        if r:
            return r
        if time.monotonic() >= deadline:
            fail("timed out after %.1f s waiting for %s" % (timeout * TIME_SCALE, what))
        time.sleep(interval)


def try_status(path):
    """io.regen.Device.Status's reply, or None when it cannot be had."""
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


def lose_device(admin, device=0, timeout=60):
    """Injects a device_lost on `device` through admin (a regen.Client)
    once the local GPU is idle, and returns when the device's generation
    moved past the one before (or after timeout s)."""
    import torch
    torch.cuda.synchronize()
    gen = admin.generation()["devices"][device]["generation"]
    admin.inject_fault(device, "device_lost")
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline and admin.generation()["devices"][device]["generation"] <= gen:
        time.sleep(0.01)


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
    fd = os.memfd_create("regen-test", os.MFD_CLOEXEC | os.MFD_ALLOW_SEALING)
    os.ftruncate(fd, size)
    fcntl.fcntl(fd, fcntl.F_ADD_SEALS, fcntl.F_SEAL_SHRINK)
    mm = mmap.mmap(fd, size)
    return fd, mm


def operand(buffer, offset, shape, dtype="f32"):
    return {"buffer": buffer, "offset": offset, "dtype": dtype, "shape": list(shape)}


# What a service manager hands a process: never to a regend under test
# unless the test says so.
_MANAGER_ENV = ("NOTIFY_SOCKET", "WATCHDOG_USEC", "WATCHDOG_PID", "LISTEN_FDS", "LISTEN_PID", "LISTEN_FDNAMES",
                "CACHE_DIRECTORY")


class Regend:
    """regend in a fresh temp dir: socket <dir>/regend.sock (device N's
    worker on <socket>.devN), an explicit configuration file (so the host's
    /etc/regen/regend.conf never leaks in), the log in <dir>/regend.log, its
    own process group. Started and ready (every device serving) when the
    constructor returns, unless start=False (then call start()).

        with Regend(devices=2) as d:
            regen.Client(d.socket) ...
    """

    def __init__(self, regend=None, devices=2, backend="host", fault_injection=True, extra=(), config="",
                 start=True, wait=True, ready_timeout=30.0, env=None, wrapper=(), pass_fds=()):
        self.path = regend or find_regend()
        if not self.path:
            raise RuntimeError("no regend: pass its path, or set REGEND or REGEN_BUILD_ROOT")
        self.devices = devices
        self.dir = tempfile.mkdtemp(prefix="regen-test-", dir="/tmp")
        # A test that drops to `nobody` must reach the sockets.
        os.chmod(self.dir, 0o755)
        self.socket = os.path.join(self.dir, "regend.sock")
        self.log_path = os.path.join(self.dir, "regend.log")
        self.config = os.path.join(self.dir, "regend.conf")
        with open(self.config, "w") as f:
            f.write(config)
        self.argv = [self.path, "--socket", self.socket, "--config", self.config, "--backend", backend,
                     "--devices", str(devices)]
        if fault_injection:
            self.argv.append("--enable-fault-injection")
        self.argv += list(extra)
        # As the shipped unit (CacheDirectory=regen regen/rtc): the kernels a
        # CUDA worker compiles for programs kept where a worker started after
        # a fault finds them.
        self.cache_env = {}
        if backend == "cuda":
            rtc = os.path.join(self.dir, "cache", "rtc")
            os.makedirs(rtc, mode=0o700)
            self.cache_env = {"CACHE_DIRECTORY": rtc}
        self.proc = None
        self.pid = None
        self._log = None
        if start:
            self.start(wait=wait, ready_timeout=ready_timeout, env=env, wrapper=wrapper, pass_fds=pass_fds)

    def start(self, wait=True, ready_timeout=30.0, env=None, wrapper=(), pass_fds=()):
        """Starts regend, behind `wrapper` (a command that execs the rest,
        e.g. systemd-socket-activate) with `env` added and `pass_fds` open
        in it; waits until every device is ready unless wait=False."""
        full_env = {k: v for k, v in os.environ.items() if k not in _MANAGER_ENV}
        full_env.update(self.cache_env)
        full_env.update(env or {})
        argv = list(wrapper) + self.argv
        self._log = open(self.log_path, "ab")
        log("starting:", " ".join(argv))
        self.proc = subprocess.Popen(argv, env=full_env, stdin=subprocess.DEVNULL, stdout=self._log,
                                     stderr=subprocess.STDOUT, start_new_session=True, pass_fds=tuple(pass_fds))
        self.pid = self.proc.pid
        if wait:
            try:
                self.wait_ready(ready_timeout)
            except BaseException:
                self.finish(dump=True)
                raise
        return self

    def worker_socket(self, device):
        return "%s.dev%d" % (self.socket, device)

    def wait_ready(self, timeout=30.0):
        """Status once every device is ready and its worker socket exists;
        RuntimeError (with the log's tail) if regend exits or after timeout."""
        deadline = time.monotonic() + timeout * TIME_SCALE
        last = None
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError("regend exited with %s:\n%s" % (self.proc.returncode, self.log_tail()))
            last = try_status(self.socket)
            if all_ready(last, self.devices) and all(os.path.exists(self.worker_socket(i))
                                                     for i in range(self.devices)):
                return last
            time.sleep(0.02)
        raise RuntimeError("regend not ready within %.0f s (last Status: %s):\n%s" %
                           (timeout * TIME_SCALE, last, self.log_tail()))

    def log_text(self):
        if self._log:
            self._log.flush()
        try:
            with open(self.log_path, "rb") as f:
                return f.read().decode(errors="replace")
        except OSError:
            return ""

    def log_tail(self, lines=60):
        return "\n".join(self.log_text().splitlines()[-lines:])

    def signal(self, signum):
        self.proc.send_signal(signum)

    def wait(self, timeout):
        """regend's exit status, or None if it is still running after timeout (scaled)."""
        try:
            return self.proc.wait(timeout * TIME_SCALE)
        except subprocess.TimeoutExpired:
            return None

    def kill(self):
        """SIGKILL to regend and its workers (its process group)."""
        if self.proc is not None and self.proc.poll() is None:
            try:
                os.killpg(self.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
            self.proc.wait(10)

    def stop(self):
        """SIGTERM, SIGKILL after 10 s; removes the temp dir."""
        if self.proc is not None and self.proc.poll() is None:
            self.proc.terminate()
            if self.wait(10) is None:
                log("regend ignored SIGTERM: SIGKILL")
        self.finish()

    def finish(self, dump=False):
        """Kills what is left, prints the log if asked, removes the temp dir."""
        self.kill()
        if self.pid is not None:
            # Workers a crashed supervisor left behind.
            try:
                os.killpg(self.pid, signal.SIGKILL)
            except (ProcessLookupError, PermissionError):
                pass
        if dump:
            sys.stderr.write("---- regend log (%s) ----\n%s\n---- end of regend log ----\n" %
                             (self.log_path, self.log_tail(200)))
        if self._log:
            self._log.close()
            self._log = None
        shutil.rmtree(self.dir, ignore_errors=True)

    def __enter__(self):
        return self

    def __exit__(self, exc_type, *exc):
        if exc_type is not None:
            self.finish(dump=True)
        else:
            self.stop()


def require_torch():
    """torch with a CUDA device, or exit 77 (skipped). Keeps CUDA IPC
    possible: memory from expandable segments cannot be shared."""
    conf = os.environ.get("PYTORCH_CUDA_ALLOC_CONF", "")
    if "expandable_segments:True" in conf:
        os.environ["PYTORCH_CUDA_ALLOC_CONF"] = conf.replace("expandable_segments:True",
                                                             "expandable_segments:False")
    try:
        import torch
    except ImportError:
        print("SKIP: torch is not importable")
        sys.exit(SKIP)
    if not torch.cuda.is_available():
        print("SKIP: torch sees no CUDA device")
        sys.exit(SKIP)
    return torch


def torch_rel_error(out, ref):
    """||out - ref|| / ||ref||, in float64, of two torch tensors."""
    return ((out.double() - ref).norm() / ref.norm()).item()
