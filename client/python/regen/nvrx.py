# SPDX-License-Identifier: Apache-2.0
"""regen-nvrx-health: regend's view of the node's GPUs as the node health
check NVRx asks for.

NVRx (NVIDIA's nvidia-resiliency-ext) asks a node-local service before its
ranks enter rendezvous, and again on its in-job restarts, whether the node
is healthy (ft_launcher --ft-node-health-check-endpoint PATH): one gRPC
call over a Unix socket, nvhcd.HealthCheckService/RunHealthCheck
(nvidia_resiliency_ext/shared_utils/proto/nvhcd.proto):

    message HealthCheckRequest  { repeated string args = 1; }
    message HealthCheckResponse { bool success = 1; int32 exit_code = 2;
                                  string output = 3; string error = 4; }

and counts the node healthy where ``success`` is true and ``output`` is
JSON whose ``fail_count`` is 0 (shared_utils/health_check.py,
NodeHealthCheck).  This service answers it from `regenctl --json health`
(the verdicts regenctl gives a Slurm or Kubernetes probe, stated once
there): a device passes when it is ``ready`` (a GPU waiting for a reset to
retire pages still serves); ``failed``, ``unsupported``, ``detached`` and a
regend that does not answer fail the node.  States regend leaves by itself
(draining, released, faulted, resetting, respawning, unresponsive: a
fault's recovery, a restart), and a regend that does not answer (systemd
restarting it), are waited out for up to ``--settle-ms`` first, so NVRx's
restart that meets regend's own recovery sees its end, not its middle.  The request's ``args`` (nvhcd's check groups) are
logged and otherwise ignored: the answer is always the GPUs'.

The messages are encoded here (protobuf's wire format, five fields), so
the service needs grpcio and nothing generated; `import regen.nvrx` needs
not even grpcio.  docs/operations.md, "NVRx", says how to run it.
"""

import argparse
import json
import os
import shutil
import signal
import stat
import subprocess
import sys
import threading
import time
from typing import Any, Dict, List, Optional, Sequence, Tuple

__all__ = ["SERVICE", "METHOD", "DEFAULT_SOCKET", "encode_request", "decode_request", "encode_response",
           "decode_response", "find_regenctl", "node_health", "serve", "main"]

SERVICE = "nvhcd.HealthCheckService"
METHOD = "RunHealthCheck"
DEFAULT_SOCKET = "/run/regen-nvrx/nvhcd.sock"
DEFAULT_SETTLE_MS = 30000
# States regend leaves by itself (docs/lifecycle.md): waited out.
SETTLING = frozenset(("draining", "released", "faulted", "resetting", "respawning", "unresponsive"))
# regenctl's exit status for a regend that does not answer.
EXIT_UNREACHABLE = 5


# ---- protobuf's wire format, for the two messages ----------------------------------

def _varint(n: int) -> bytes:
    n &= (1 << 64) - 1   # a negative int32 is its 64-bit two's complement, ten bytes
    out = bytearray()
    while True:
        byte, n = n & 0x7F, n >> 7
        if n:
            out.append(byte | 0x80)
        else:
            out.append(byte)
            return bytes(out)


def _read_varint(data: bytes, at: int) -> Tuple[int, int]:
    value, shift = 0, 0
    while True:
        if at >= len(data) or shift > 63:
            raise ValueError("a varint runs past the message")
        byte = data[at]
        at += 1
        value |= (byte & 0x7F) << shift
        shift += 7
        if not byte & 0x80:
            return value, at


def _fields(data: bytes) -> List[Tuple[int, int, Any]]:
    """(field number, wire type, value) of each field of a message, in
    order: an int for varints and fixed ones, bytes for length-delimited."""
    out = []
    at = 0
    while at < len(data):
        key, at = _read_varint(data, at)
        number, wire = key >> 3, key & 7
        value: Any
        if wire == 0:
            value, at = _read_varint(data, at)
        elif wire == 1:
            value, at = int.from_bytes(data[at:at + 8], "little"), at + 8
        elif wire == 2:
            length, at = _read_varint(data, at)
            value, at = bytes(data[at:at + length]), at + length
        elif wire == 5:
            value, at = int.from_bytes(data[at:at + 4], "little"), at + 4
        else:
            raise ValueError(f"wire type {wire} of field {number} is not one protobuf 3 writes")
        if at > len(data):
            raise ValueError(f"field {number} runs past the message")
        out.append((number, wire, value))
    return out


def _string(number: int, text: str) -> bytes:
    raw = text.encode("utf-8")
    return _varint(number << 3 | 2) + _varint(len(raw)) + raw


def encode_request(args: Sequence[str]) -> bytes:
    return b"".join(_string(1, a) for a in args)


def decode_request(data: bytes) -> List[str]:
    return [v.decode("utf-8", "replace") for n, w, v in _fields(data) if n == 1 and w == 2]


def encode_response(success: bool, exit_code: int, output: str, error: str) -> bytes:
    """Fields at their default (false, 0, "") are left out, as protobuf 3 does."""
    out = b""
    if success:
        out += _varint(1 << 3 | 0) + _varint(1)
    if exit_code:
        out += _varint(2 << 3 | 0) + _varint(exit_code)
    if output:
        out += _string(3, output)
    if error:
        out += _string(4, error)
    return out


def decode_response(data: bytes) -> Dict[str, Any]:
    r: Dict[str, Any] = {"success": False, "exit_code": 0, "output": "", "error": ""}
    for n, w, v in _fields(data):
        if n == 1 and w == 0:
            r["success"] = bool(v)
        elif n == 2 and w == 0:
            v &= 0xFFFFFFFF
            r["exit_code"] = v - (1 << 32) if v & 0x80000000 else v
        elif n in (3, 4) and w == 2:
            r["output" if n == 3 else "error"] = v.decode("utf-8", "replace")
    return r


# ---- the answer --------------------------------------------------------------------

def find_regenctl() -> Optional[str]:
    """regenctl where it is installed: $REGENCTL, PATH, /usr/bin,
    /usr/local/bin (the Slurm examples look the same way)."""
    for candidate in (os.environ.get("REGENCTL"), shutil.which("regenctl"), "/usr/bin/regenctl",
                      "/usr/local/bin/regenctl"):
        if candidate and os.access(candidate, os.X_OK):
            return candidate
    return None


def _ask(regenctl: str, regend_socket: Optional[str], timeout_s: float) -> Tuple[int, Optional[Dict[str, Any]], str]:
    argv = [regenctl] + (["--socket", regend_socket] if regend_socket else []) + ["--json", "health"]
    try:
        r = subprocess.run(argv, capture_output=True, text=True, timeout=timeout_s)
    except subprocess.TimeoutExpired:
        return EXIT_UNREACHABLE, None, f"{' '.join(argv)} did not answer in {timeout_s:.0f} s"
    except OSError as e:
        return 127, None, f"cannot run {regenctl}: {e.strerror}"
    try:
        report = json.loads(r.stdout)
    except ValueError:
        report = None
    return r.returncode, report, r.stderr.strip()


def node_health(regenctl: Optional[str], regend_socket: Optional[str] = None,
                settle_ms: int = DEFAULT_SETTLE_MS) -> Dict[str, Any]:
    """RunHealthCheck's answer: {"success", "exit_code", "output" (the
    JSON NVRx reads), "error"}."""
    if regenctl is None:
        error = ("regenctl was not found (set REGENCTL or --regenctl; it comes with regend: Debian's "
                 "package regen)")
        return {"success": False, "exit_code": 127, "error": error,
                "output": json.dumps({"fail_count": 1, "failed_checks": [error]})}
    started = time.monotonic()
    deadline = started + settle_ms / 1000.0
    while True:
        rc, report, stderr = _ask(regenctl, regend_socket, max(5.0, settle_ms / 1000.0))
        devices = report.get("devices", []) if isinstance(report, dict) else []
        # regend itself restarting (systemd's Restart=) is waited out too.
        settling = rc == EXIT_UNREACHABLE or any(d.get("state") in SETTLING for d in devices)
        if not settling or time.monotonic() >= deadline:
            break
        time.sleep(0.2)
    waited_ms = int((time.monotonic() - started) * 1000)
    if not isinstance(report, dict) or "devices" not in report:
        why = stderr or f"regenctl health exited {rc} with no report"
        error = f"regend does not answer: {why}" if rc == EXIT_UNREACHABLE else f"regenctl health failed: {why}"
        return {"success": False, "exit_code": rc or 1, "error": error,
                "output": json.dumps({"fail_count": 1, "failed_checks": [error], "health": "unreachable",
                                      "waited_ms": waited_ms})}
    failed = []
    for d in devices:
        if d.get("state") == "ready" and d.get("health") in ("ok", "degraded"):
            continue
        state, health = d.get("state"), d.get("health")
        reason = d.get("reason") or ""
        if reason.startswith(f"{state}: "):
            reason = reason[len(state) + 2:]
        words = [w for w in (state if state != health else "",
                             f"still after {waited_ms} ms" if state in SETTLING else "", reason) if w]
        failed.append(f"device {d.get('index')}: {health}" + (f" ({', '.join(words)})" if words else ""))
    output = {"fail_count": len(failed), "failed_checks": failed, "health": report.get("health"),
              "devices": devices, "waited_ms": waited_ms, "source": "regenctl health"}
    return {"success": not failed, "exit_code": 0 if not failed else (rc or 1), "error": "",
            "output": json.dumps(output)}


# ---- the service -------------------------------------------------------------------

def _log(*words: Any) -> None:
    print("regen-nvrx-health:", *words, file=sys.stderr, flush=True)


def serve(socket_path: str, regenctl: Optional[str], regend_socket: Optional[str] = None,
          settle_ms: int = DEFAULT_SETTLE_MS, socket_group: Optional[str] = None,
          socket_mode: int = 0o660, ready: Optional[threading.Event] = None,
          stop: Optional[threading.Event] = None) -> int:
    """Serves RunHealthCheck on ``socket_path`` until SIGTERM or SIGINT (or
    ``stop`` is set).  The socket gets ``socket_mode`` and, where given,
    ``socket_group`` (the ranks' group: regen's)."""
    try:
        import grpc
    except ImportError:
        _log("needs grpcio (Debian: python3-grpcio; pip install grpcio)")
        return 1
    from concurrent import futures

    def run_health_check(request: List[str], context: Any) -> Dict[str, Any]:
        answer = node_health(regenctl, regend_socket, settle_ms)
        _log(f"args {request}: success {answer['success']}, exit code {answer['exit_code']}"
             + (f", {answer['error']}" if answer["error"] else ""))
        return answer

    handler = grpc.method_handlers_generic_handler(SERVICE, {
        METHOD: grpc.unary_unary_rpc_method_handler(
            run_health_check, request_deserializer=decode_request,
            response_serializer=lambda a: encode_response(a["success"], a["exit_code"], a["output"], a["error"])),
    })
    try:
        if stat.S_ISSOCK(os.lstat(socket_path).st_mode):
            os.unlink(socket_path)   # a stale socket of an earlier run
    except FileNotFoundError:
        pass
    os.makedirs(os.path.dirname(os.path.abspath(socket_path)), exist_ok=True)
    server = grpc.server(futures.ThreadPoolExecutor(max_workers=4))
    server.add_generic_rpc_handlers((handler,))
    if not server.add_insecure_port("unix:" + os.path.abspath(socket_path)):
        _log(f"cannot listen on {socket_path}")
        return 1
    server.start()
    try:
        os.chmod(socket_path, socket_mode)
        if socket_group:
            import grp
            os.chown(socket_path, -1, grp.getgrnam(socket_group).gr_gid)
    except (OSError, KeyError) as e:
        _log(f"cannot give {socket_path} mode {socket_mode:o} and group {socket_group}: {e}")
        server.stop(None)
        return 1
    _log(f"answering {SERVICE}/{METHOD} on unix:{socket_path} from {regenctl or 'no regenctl'} health"
         f"{' --socket ' + regend_socket if regend_socket else ''}")
    done = stop or threading.Event()
    if threading.current_thread() is threading.main_thread():
        for signum in (signal.SIGTERM, signal.SIGINT):
            signal.signal(signum, lambda *_: done.set())
    if ready is not None:
        ready.set()
    done.wait()
    server.stop(1).wait()
    try:
        os.unlink(socket_path)
    except FileNotFoundError:
        pass
    return 0


def main(argv: Optional[Sequence[str]] = None) -> int:
    p = argparse.ArgumentParser(prog="regen-nvrx-health", description=(
        "Answers NVRx's node health check (nvhcd.HealthCheckService over gRPC on a Unix socket: "
        "ft_launcher --ft-node-health-check-endpoint) from regenctl health."))
    p.add_argument("--socket", default=DEFAULT_SOCKET, help=f"the Unix socket to listen on (default {DEFAULT_SOCKET})")
    p.add_argument("--regend-socket", default=None,
                   help="regend's socket (default: regenctl's, $REGEN_SOCKET or /run/regen/regend.sock)")
    p.add_argument("--regenctl", default=None, help="regenctl (default: $REGENCTL, PATH, /usr/bin, /usr/local/bin)")
    p.add_argument("--settle-ms", type=int, default=DEFAULT_SETTLE_MS,
                   help="how long to wait for devices regend is recovering before answering (default %(default)s; "
                        "NVRx waits 60 s for the answer)")
    p.add_argument("--socket-group", default=None, help="group to give the socket (the ranks': regen)")
    p.add_argument("--socket-mode", default="0660", help="the socket's mode (default %(default)s)")
    args = p.parse_args(argv)
    if args.settle_ms < 0:
        p.error("--settle-ms must be 0 or more")
    try:
        mode = int(args.socket_mode, 8)
    except ValueError:
        p.error(f"--socket-mode {args.socket_mode!r} is not an octal mode")
    regenctl = args.regenctl or find_regenctl()
    if regenctl is None:
        _log("regenctl was not found (--regenctl, $REGENCTL or PATH): every answer will say so")
    return serve(args.socket, regenctl, args.regend_socket, args.settle_ms, args.socket_group, mode)


if __name__ == "__main__":
    sys.exit(main())
