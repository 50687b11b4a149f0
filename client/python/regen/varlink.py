# SPDX-License-Identifier: Apache-2.0
"""A blocking Varlink connection over a Unix socket, with fd passing.

Each message is one JSON object followed by a NUL byte.  File descriptors
ride as SCM_RIGHTS on the first byte of the message that names them, so a
message with fds goes out with one sendmsg() for its head; a reply's
(io.regen.Keep.TakeBack's) come the same way, and call_with_fds() hands
them over.
"""

import array
import json
import os
import select
import socket
import time

from . import errors

__all__ = ["Connection", "MAX_MESSAGE"]

# regend refuses messages over 1 MiB; replies are far smaller.
MAX_MESSAGE = 1 << 20
# The most fds one message carries (proto/frame.h's RP_FDS_MAX).
FDS_MAX = 16
_FDS_SPACE = socket.CMSG_SPACE(FDS_MAX * array.array("i").itemsize)


class Connection:
    """One Varlink connection.  Not thread-safe; calls are answered in order."""

    def __init__(self, path, timeout=None):
        self.path = path
        self._buf = bytearray()
        self._fds = []            # received with the bytes in _buf, not yet handed over
        self._sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM | socket.SOCK_CLOEXEC)
        try:
            self._sock.settimeout(timeout)
            self._sock.connect(path)
        except OSError as e:
            self._sock.close()
            self._sock = None
            raise errors.Unavailable(parameters={
                "message": f"cannot connect to {path}: {e.strerror or e} "
                           "(is regend running, and is this the right socket?)",
                "socket": path}) from e

    @property
    def closed(self):
        return self._sock is None

    def fileno(self):
        return self._sock.fileno() if self._sock else -1

    def close(self):
        self._close_fds()
        if self._sock is not None:
            try:
                self._sock.close()
            finally:
                self._sock = None
                self._buf.clear()

    def _close_fds(self):
        fds, self._fds = self._fds, []
        for fd in fds:
            os.close(fd)

    def alive(self):
        """False if the peer has closed the connection (or it broke) while
        no call was in flight: checked before reusing it, so a call is never
        sent down a connection already known dead."""
        if self._sock is None:
            return False
        try:
            # poll, not select: select refuses an fd of 1024 or more, which a
            # training process (loaders, NCCL) has open soon enough.
            p = select.poll()
            p.register(self._sock, select.POLLIN)
            if not p.poll(0):
                return True
            return self._sock.recv(1, socket.MSG_PEEK | socket.MSG_DONTWAIT) != b""
        except BlockingIOError:
            return True
        except OSError:
            return False

    def settimeout(self, timeout):
        if self._sock is not None:
            self._sock.settimeout(timeout)

    def _broken(self, what, exc=None):
        self.close()
        detail = f": {exc.strerror or exc}" if isinstance(exc, OSError) else ""
        return errors.ConnectionReset(parameters={
            "message": f"connection to {self.path} broke while {what}{detail}; "
                       "the call may or may not have run",
            "socket": self.path})

    def send(self, method, parameters=None, fds=(), more=False, oneway=False):
        """Send one call without waiting for its reply.  A send the socket's
        timeout ends closes the connection and raises ConnectionReset: a
        part of the message may have gone, which the peer would read as the
        start of the next call sent on it."""
        if self._sock is None:
            raise self._broken("sending (already closed)")
        msg = {"method": method}
        if parameters:
            msg["parameters"] = parameters
        if more:
            msg["more"] = True
        if oneway:
            msg["oneway"] = True
        data = memoryview(json.dumps(msg, separators=(",", ":"), allow_nan=False).encode() + b"\0")
        sock = self._sock
        timeout = sock.gettimeout()
        deadline = None if timeout is None else time.monotonic() + timeout
        sent = 0
        # Not sendall: after its timeout nothing tells how much of the
        # message went.
        try:
            while sent < len(data):
                if fds and sent == 0:
                    anc = [(socket.SOL_SOCKET, socket.SCM_RIGHTS, array.array("i", fds).tobytes())]
                    sent += sock.sendmsg([data], anc)
                else:
                    sent += sock.send(data[sent:])
                if deadline is not None and sent < len(data):
                    left = deadline - time.monotonic()
                    if left <= 0:
                        raise socket.timeout("timed out")
                    sock.settimeout(left)
        except socket.timeout as e:
            self.close()
            raise errors.ConnectionReset(parameters={
                "message": f"sending {method} to {self.path} timed out with {sent} of {len(data)} bytes sent "
                           "(the peer is not reading); connection closed: this call did not run, calls sent "
                           "before it may or may not have",
                "socket": self.path}) from e
        except OSError as e:
            raise self._broken(f"sending {method}", e) from e
        except BaseException:
            # A signal handler's exception (KeyboardInterrupt) between two
            # parts: what went would begin the next call's message.
            if sent:
                self.close()
            raise
        finally:
            if self._sock is not None:
                sock.settimeout(timeout)

    def receive(self):
        """The next reply: (parameters, continues).  Raises the mapped
        error for an error reply, ConnectionReset on EOF or a broken socket,
        TimeoutError if the socket's timeout passes (the connection stays
        usable then)."""
        while True:
            end = self._buf.find(b"\0")
            if end >= 0:
                raw = bytes(self._buf[:end])
                del self._buf[:end + 1]
                return self._decode(raw)
            if len(self._buf) > MAX_MESSAGE:
                self.close()
                raise errors.ProtocolError(parameters={
                    "message": f"reply from {self.path} exceeds {MAX_MESSAGE} bytes"})
            if self._sock is None:
                raise self._broken("waiting for a reply (already closed)")
            try:
                chunk, anc, _, _ = self._sock.recvmsg(65536, _FDS_SPACE, getattr(socket, "MSG_CMSG_CLOEXEC", 0))
            except socket.timeout:
                raise
            except OSError as e:
                raise self._broken("waiting for a reply", e) from e
            for level, kind, data in anc:
                if level == socket.SOL_SOCKET and kind == socket.SCM_RIGHTS:
                    fds = array.array("i")
                    fds.frombytes(data[:len(data) - len(data) % fds.itemsize])
                    self._fds.extend(fds)
            if not chunk:
                raise self._broken("waiting for a reply (the peer closed it)")
            self._buf += chunk

    def _decode(self, raw):
        try:
            reply = json.loads(raw)
        except ValueError as e:
            self.close()
            raise errors.ProtocolError(parameters={
                "message": f"reply from {self.path} is not JSON: {e}"}) from e
        if not isinstance(reply, dict):
            self.close()
            raise errors.ProtocolError(parameters={"message": f"reply from {self.path} is not an object"})
        if "error" in reply:
            raise errors.error_from_reply(reply["error"], reply.get("parameters") or {})
        return reply.get("parameters") or {}, bool(reply.get("continues"))

    def call(self, method, parameters=None, fds=(), abandon=None):
        """Send a call and return its reply's parameters.  A timeout closes
        the connection: a late reply must not answer the next call.
        ``abandon``: called instead of close() when something else (a
        signal handler's exception) ends the wait; it must close the
        connection.  fds that came with the reply are closed."""
        params, got = self.call_with_fds(method, parameters, fds, abandon)
        for fd in got:
            os.close(fd)
        return params

    def call_with_fds(self, method, parameters=None, fds=(), abandon=None):
        """As call(), and the fds that came with the reply, the caller's to
        close: (parameters, [fd, ...])."""
        self._close_fds()   # left by a reply that was not ours to take
        try:
            self.send(method, parameters, fds)
            params, _ = self.receive()
        except socket.timeout as e:
            self.close()
            raise errors.ConnectionReset(parameters={
                "message": f"no reply to {method} from {self.path} within the timeout; "
                           "connection closed, the call may or may not have run",
                "socket": self.path}) from e
        except errors.Error:
            raise   # a reply: the connection is in step
        except BaseException:
            # Anything else between the send and its reply (KeyboardInterrupt,
            # a signal handler's exception): the reply, still to come, would
            # answer the next call on this connection.  It goes with it.
            if abandon is None:
                self.close()
            else:
                abandon()
            raise
        got, self._fds = self._fds, []
        return params, got
