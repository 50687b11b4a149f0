# SPDX-License-Identifier: Apache-2.0
"""Start a Python rank already past its imports.

A rank that resumes from what regend kept (``regen.torch.restore``) does
its own part in milliseconds, but a fresh Python process spends seconds
before it gets there: ``import torch``, and the ``torch._dynamo`` import
that torch's first optimizer makes (``Optimizer.__init__`` goes through
``torch._disable_dynamo``).  This launcher imports those once and forks
each start of the rank from there: every start is a new process (its own
pid, its own CUDA context, made by the rank as usual), begun at the fork.

    python3 -m regen.warm_start [--preload MOD,MOD...] [--restarts N] [--] SCRIPT [ARG...]

runs SCRIPT as ``python3 SCRIPT ARG...`` would, in a child forked after the
preloads (default: torch, torch._dynamo and regen.torch, those installed),
and starts it again, the same way, when it dies of a signal or exits non-zero
(at most N times, default 3; a SIGTERM, SIGINT or SIGHUP to the launcher is
passed on to the rank and ends it instead: the scheduler meant to stop the
job).  The rank dies with the launcher (PR_SET_PDEATHSIG).  Its exit status
is the last start's (a signal as 128 + its number, as a shell reports it).
Each start sees:

- ``REGEN_WARM_START_T0``: the launcher's clock (``time.time()``) at its
  fork, the process's start;
- ``REGEN_WARM_START_STARTS``: how many starts came before this one.

A preloaded module must not have initialised CUDA (a child of a process
that did cannot use it): the launcher refuses to go on where torch did,
and warns where the CUDA driver's library is loaded at all.
With ``REGEN_TORCH_POOL=process`` regen.torch is preloaded without it and
each start sets the pool up itself before the script runs.

``WarmStart`` is the same launcher as a server a program asks for starts,
with their stdout and stderr on pipes of its own, and no restarts
(tests/bench/bench_keep.py measures a resume from it beside a cold one).

Standard library only: the launcher imports nothing the rank does not.
"""

import io
import json
import os
import runpy
import selectors
import signal
import socket
import subprocess
import sys
import threading
import time
from typing import Dict, List, Optional, Tuple

__all__ = ["WarmStart", "Started", "main"]

DEFAULT_PRELOAD = ("torch", "torch._dynamo", "regen.torch")
_PR_SET_PDEATHSIG = 1
_STOPPING_SIGNALS = (signal.SIGTERM, signal.SIGINT, signal.SIGHUP)
_PASSED_SIGNALS = _STOPPING_SIGNALS + (signal.SIGUSR1, signal.SIGUSR2)
_MESSAGE_MAX = 1 << 16


class PreloadError(RuntimeError):
    pass


def preload(modules: List[str], strict: bool) -> List[str]:
    """Imports ``modules`` (a missing one skipped unless ``strict``) and
    returns those imported.  PreloadError where one initialised CUDA."""
    pool = os.environ.pop("REGEN_TORCH_POOL", None)
    done = []
    try:
        for name in modules:
            try:
                __import__(name)
            except ImportError:
                if strict:
                    raise
                continue
            done.append(name)
    finally:
        if pool is not None:
            os.environ["REGEN_TORCH_POOL"] = pool
    torch = sys.modules.get("torch")
    if torch is not None and torch.cuda.is_initialized():
        raise PreloadError("a preloaded module initialised CUDA: a forked rank could not use it")
    if _driver_loaded():
        print("regen.warm_start: a preloaded module loaded the CUDA driver; if it also initialised it, the "
              "ranks forked from here cannot use CUDA", file=sys.stderr, flush=True)
    return done


def _driver_loaded() -> bool:
    """Whether the CUDA driver's library is mapped (loading it is harmless;
    a child of a process that initialised it cannot initialise it again,
    and whether a library called cuInit cannot be asked without calling
    it)."""
    try:
        with open("/proc/self/maps") as f:
            return any("libcuda.so" in line for line in f)
    except OSError:
        return False


def _die_with_parent(parent: int) -> None:
    try:
        import ctypes
        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(_PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)
    except (OSError, AttributeError):
        pass
    if os.getppid() != parent:   # it died before the prctl took hold
        os._exit(128 + signal.SIGKILL)


def _in_child(parent: int, t0: float, starts: int) -> None:
    """What a start does right after the fork, before its script."""
    _die_with_parent(parent)
    for sig in _PASSED_SIGNALS:
        signal.signal(sig, signal.SIG_DFL)
    os.environ["REGEN_WARM_START_T0"] = repr(t0)
    os.environ["REGEN_WARM_START_STARTS"] = str(starts)


def _fork_start(t0: float, starts: int) -> int:
    """Forks a start (its pid; 0 in the start itself, set up by _in_child),
    what this process printed written out first so that no start repeats it."""
    sys.stdout.flush()
    sys.stderr.flush()
    parent = os.getpid()
    pid = os.fork()
    if pid == 0:
        _in_child(parent, t0, starts)
    return pid


def run_script(argv: List[str]) -> None:
    """Runs ``argv[0]`` as ``python3 argv...`` would: as __main__, its
    folder first on sys.path; its SystemExit or exception ends the process
    as the interpreter ends it."""
    if os.environ.get("REGEN_TORCH_POOL") == "process" and "regen.torch" in sys.modules:
        sys.modules["regen.torch"].use_pool_for_process()
    script = argv[0]
    sys.argv = list(argv)
    sys.path[0] = os.path.dirname(os.path.abspath(script))
    runpy.run_path(script, run_name="__main__")


def _exit_code(status: int) -> int:
    code = os.waitstatus_to_exitcode(status)
    return 128 - code if code < 0 else code


def launch(argv: List[str], restarts: int) -> Tuple[Optional[List[str]], int]:
    """The restart loop.  Returns ``(argv, 0)`` in a forked start (which
    then runs the script) and ``(None, status)`` in the launcher when it is
    done."""
    child = 0
    stopping = False

    def passed(sig, _frame):
        nonlocal stopping
        if sig in _STOPPING_SIGNALS:
            stopping = True
        if child:
            os.kill(child, sig)

    for sig in _PASSED_SIGNALS:
        signal.signal(sig, passed)
    starts, code = 0, 0
    while True:
        if stopping:
            return None, code
        child = _fork_start(time.time(), starts)
        if child == 0:
            return argv, 0
        _, status = os.waitpid(child, 0)
        child = 0
        code = _exit_code(status)
        starts += 1
        if code == 0 or stopping or starts > restarts:
            return None, code
        how = f"signal {-os.waitstatus_to_exitcode(status)}" if os.WIFSIGNALED(status) else f"exit {code}"
        print(f"regen.warm_start: {argv[0]} ended ({how}); starting it again ({starts} of {restarts})",
              file=sys.stderr, flush=True)


# ---- The server ----

def _send(sock: socket.socket, msg: Dict, fds: Tuple[int, ...] = ()) -> None:
    socket.send_fds(sock, [json.dumps(msg).encode()], list(fds))


def serve(sock: socket.socket) -> Optional[Tuple[List[str], Tuple[int, int]]]:
    """The server's loop on its SOCK_SEQPACKET ``sock``: each request is
    ``{"argv": [...], "t0": T}`` with the start's stdout and stderr as
    two fds; the answer ``{"pid": P}``, and ``{"exited": P, "returncode":
    R}`` (as Popen's) once it ended.  Returns (argv, fds) in a forked
    start, None in the server when its peer is gone."""
    sel = selectors.DefaultSelector()
    sel.register(sock, selectors.EVENT_READ, None)
    while True:
        for key, _ in sel.select():
            if key.data is not None:
                pid = key.data
                sel.unregister(key.fileobj)
                os.close(key.fd)
                _, status = os.waitpid(pid, 0)
                _send(sock, {"exited": pid, "returncode": os.waitstatus_to_exitcode(status)})
                continue
            try:
                data, fds, _, _ = socket.recv_fds(sock, _MESSAGE_MAX, 2)
            except ConnectionError:
                data, fds = b"", []
            if not data:
                return None
            req = json.loads(data)
            if len(fds) != 2:
                for f in fds:
                    os.close(f)
                _send(sock, {"error": "a start needs its stdout and stderr"})
                continue
            pid = _fork_start(float(req["t0"]), 0)
            if pid == 0:
                for k in list(sel.get_map().values()):
                    if k.data is not None:
                        os.close(k.fd)
                sel.close()
                sock.close()
                return list(req["argv"]), (fds[0], fds[1])
            for f in fds:
                os.close(f)
            sel.register(os.pidfd_open(pid), selectors.EVENT_READ, pid)
            _send(sock, {"pid": pid})


def _as_stdio(out: int, err: int) -> None:
    """A start's stdout and stderr become the pipes it was given, each
    buffered as the server's own was."""
    null = os.open(os.devnull, os.O_RDONLY)
    os.dup2(null, 0)
    os.close(null)
    for fd, target, name in ((out, 1, "stdout"), (err, 2, "stderr")):
        os.dup2(fd, target)
        os.close(fd)
        old = getattr(sys, name)
        setattr(sys, name, io.TextIOWrapper(io.BufferedWriter(io.FileIO(target, "w", closefd=False)),
                                            encoding=old.encoding, errors=old.errors,
                                            line_buffering=old.line_buffering,
                                            write_through=getattr(old, "write_through", False)))


class Started:
    """A start of the server's, as much of subprocess.Popen as a caller
    that reads its output, signals it and waits for it needs."""

    def __init__(self, server: "WarmStart", pid: int, stdout, stderr) -> None:
        self._server, self.pid, self.stdout, self.stderr = server, pid, stdout, stderr
        self.returncode: Optional[int] = None

    def send_signal(self, sig: int) -> None:
        if self.returncode is None:
            os.kill(self.pid, sig)

    def kill(self) -> None:
        self.send_signal(signal.SIGKILL)

    def wait(self, timeout: Optional[float] = None) -> int:
        if self.returncode is None:
            self.returncode = self._server._wait(self.pid, timeout)
        return self.returncode

    def communicate(self, timeout: Optional[float] = None) -> Tuple[str, str]:
        """Both pipes read to their ends together (a start that fills one
        while the other is read would wait forever), then its status."""
        err: List[str] = []
        reader = threading.Thread(target=lambda: err.append(self.stderr.read()), daemon=True)
        reader.start()
        out = self.stdout.read()
        reader.join()
        self.wait(timeout)
        self.stdout.close()
        self.stderr.close()
        return out, err[0] if err else ""


class WarmStart:
    """A launcher process that preloaded ``modules`` (default: those of
    DEFAULT_PRELOAD installed) and forks each ``start(argv)`` from there.
    ``env`` is the environment of the server, and so of every start."""

    def __init__(self, modules: Optional[List[str]] = None, env: Optional[Dict[str, str]] = None,
                 python: str = sys.executable, timeout: float = 300) -> None:
        self._sock, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        pkg = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
        env = dict(os.environ if env is None else env)
        env["PYTHONPATH"] = os.pathsep.join(p for p in (pkg, env.get("PYTHONPATH")) if p)
        # No modules: the default ones, those installed; else each must be.
        preload = [] if modules is None else ["--preload", ",".join(modules)]
        self._proc = subprocess.Popen([python, "-m", "regen.warm_start", "--serve", str(theirs.fileno())] + preload,
                                      env=env, pass_fds=[theirs.fileno()])
        theirs.close()
        self._exited: Dict[int, int] = {}
        self._sock.settimeout(timeout)
        try:
            hello = self._receive()
        except (ConnectionError, socket.timeout, ValueError):
            hello = None
        if hello is None or "preloaded" not in hello:
            self._proc.kill()
            self._proc.wait()
            self._sock.close()
            raise PreloadError(f"regen.warm_start's server did not start: {(hello or {}).get('error', 'it exited')}")
        self.preloaded: List[str] = hello["preloaded"]
        self.preload_s: float = hello["preload_s"]

    def _receive(self) -> Dict:
        """The server's next message; a start's end is also noted for
        its wait()."""
        data = self._sock.recv(_MESSAGE_MAX)
        if not data:
            raise ConnectionError("regen.warm_start's server is gone")
        msg = json.loads(data)
        if "exited" in msg:
            self._exited[msg["exited"]] = msg["returncode"]
        return msg

    def start(self, argv: List[str], t0: Optional[float] = None) -> Started:
        out_r, out_w = os.pipe()
        err_r, err_w = os.pipe()
        try:
            _send(self._sock, {"argv": list(argv), "t0": time.time() if t0 is None else t0}, (out_w, err_w))
        finally:
            os.close(out_w)
            os.close(err_w)
        msg = self._receive()
        while "exited" in msg:
            msg = self._receive()
        if "error" in msg:
            os.close(out_r)
            os.close(err_r)
            raise RuntimeError(msg["error"])
        return Started(self, msg["pid"], open(out_r, "r"), open(err_r, "r"))

    def _wait(self, pid: int, timeout: Optional[float]) -> int:
        self._sock.settimeout(timeout)
        while pid not in self._exited:
            self._receive()
        return self._exited.pop(pid)

    def close(self) -> None:
        """Ends the server, and with it every start still running."""
        self._sock.close()
        try:
            self._proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            self._proc.kill()
            self._proc.wait()

    def __enter__(self) -> "WarmStart":
        return self

    def __exit__(self, *exc) -> None:
        self.close()


# ---- The command ----

USAGE = "usage: python3 -m regen.warm_start [--preload MOD,MOD...] [--restarts N] [--] SCRIPT [ARG...]"


def main(args: List[str]) -> int:
    modules, strict, restarts, serve_fd = list(DEFAULT_PRELOAD), False, 3, None
    while args and args[0].startswith("--"):
        flag = args.pop(0)
        if flag == "--":
            break
        if not args:
            print(USAGE, file=sys.stderr)
            return 2
        value = args.pop(0)
        if flag == "--preload":
            modules, strict = [m for m in value.split(",") if m], True
        elif flag == "--restarts":
            restarts = int(value)
        elif flag == "--serve":
            serve_fd = int(value)
        else:
            print(USAGE, file=sys.stderr)
            return 2
    if serve_fd is None and not args:
        print(USAGE, file=sys.stderr)
        return 2
    t = time.perf_counter()
    try:
        done = preload(modules, strict)
    except (ImportError, PreloadError) as e:
        if serve_fd is not None:
            with socket.socket(fileno=serve_fd) as s:
                _send(s, {"error": f"preload: {e}"})
            return 1
        print(f"regen.warm_start: preload: {e}", file=sys.stderr)
        return 1
    preload_s = time.perf_counter() - t
    if serve_fd is not None:
        sock = socket.socket(fileno=serve_fd)
        _send(sock, {"preloaded": done, "preload_s": preload_s})
        started = serve(sock)
        if started is None:
            return 0
        served, (out, err) = started
        _as_stdio(out, err)
        run_script(served)
        return 0
    forked, status = launch(args, restarts)
    if forked is None:
        return status
    run_script(forked)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
