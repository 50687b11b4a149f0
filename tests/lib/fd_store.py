# SPDX-License-Identifier: Apache-2.0
"""systemd's file descriptor store, as a test stands in for it.

A service with FileDescriptorStoreMax= hands the manager fds with sd_notify
("FDSTORE=1", "FDNAME=name", the fds as SCM_RIGHTS on $NOTIFY_SOCKET); the
manager keeps a duplicate of each under its name, closes those a
"FDSTOREREMOVE=1" names, and passes every one back at the service's next
start: from fd 3 on, with LISTEN_FDS (their number), LISTEN_PID (the
service's pid) and LISTEN_FDNAMES (their names, colon-separated), and
$FDSTORE (the store's size, systemd 254 and later).  This class does the
same for a regend under test:

    store = FdStore(daemon.dir)
    daemon.start(**store.start_args())       # regend stores what it keeps
    ...                                      # kill regend, any way
    store.pump()                             # what it sent before it died
    daemon.start(**store.start_args())       # it gets the fds back

Standard library only (tests/lib/regend_fixture.py's rule).
"""
import array
import os
import select
import socket
import sys
import threading

class FdStore:
    def __init__(self, directory, max_fds=4096):
        self.path = os.path.join(directory, "notify-fdstore")
        self.max_fds = max_fds
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
        self.sock.bind(self.path)
        self.sock.setblocking(False)
        self.fds = []          # [(name, fd)] in the order they came
        self.messages = []     # every message, as {key: value}
        self.refused = 0       # FDSTOREs past max_fds
        # Read as systemd reads: at once, or regend's sd_notify blocks
        # on a full queue.
        self.lock = threading.Lock()
        self.stopped = False
        self.reader = threading.Thread(target=self._read, daemon=True)
        self.reader.start()

    def _read(self):
        while not self.stopped:
            select.select([self.sock], [], [], 0.05)
            self.pump()

    def close(self):
        self.stopped = True
        self.reader.join()
        for _, fd in self.fds:
            os.close(fd)
        self.fds = []
        self.sock.close()

    def pump(self):
        """Takes in every message sent so far."""
        with self.lock:
            self._pump()

    def _pump(self):
        while True:
            try:
                data, anc, _, _ = self.sock.recvmsg(4096, socket.CMSG_SPACE(64 * 4))
            except (BlockingIOError, InterruptedError):
                return
            fds = []
            for level, kind, payload in anc:
                if level == socket.SOL_SOCKET and kind == socket.SCM_RIGHTS:
                    a = array.array("i")
                    a.frombytes(payload[:len(payload) - len(payload) % a.itemsize])
                    fds += list(a)
            fields = {}
            for line in data.decode(errors="replace").split("\n"):
                if "=" in line:
                    k, v = line.split("=", 1)
                    fields[k] = v
            self.messages.append(fields)
            name = fields.get("FDNAME", "stored")
            if fields.get("FDSTORE") == "1":
                for fd in fds:
                    if len(self.fds) >= self.max_fds:
                        os.close(fd)
                        self.refused += 1
                    else:
                        os.set_inheritable(fd, False)
                        self.fds.append((name, fd))
                fds = []
            if fields.get("FDSTOREREMOVE") == "1":
                for n, fd in [(n, fd) for n, fd in self.fds if n == name]:
                    os.close(fd)
                self.fds = [(n, fd) for n, fd in self.fds if n != name]
            for fd in fds:
                os.close(fd)

    def names(self):
        with self.lock:
            self._pump()
            return [n for n, _ in self.fds]

    def fd(self, name):
        """The store's fd of that name (the store keeps it)."""
        with self.lock:
            self._pump()
            return [fd for n, fd in self.fds if n == name][0]

    def replace(self, name, fd):
        """Puts fd (the store's from now on) in place of name's."""
        with self.lock:
            self._pump()
            self.fds = [(n, fd if n == name else f) for n, f in self.fds]

    def start_args(self):
        """Regend.start()'s keywords: $NOTIFY_SOCKET and $FDSTORE, and the
        stored fds passed as systemd passes them."""
        with self.lock:
            self._pump()
            pairs = ",".join("%s=%d" % (n, fd) for n, fd in self.fds)
            fds = [fd for _, fd in self.fds]
        return {"env": {"NOTIFY_SOCKET": self.path, "FDSTORE": str(self.max_fds)},
                "wrapper": [sys.executable, os.path.abspath(__file__), pairs],
                "pass_fds": fds}


def _exec_with_fds():
    """The one process between the store and regend (so LISTEN_PID is
    regend's own): puts the fds named on its command line at 3, 4, ...,
    says so in LISTEN_*, and execs the rest of the command line."""
    import fcntl
    pairs = [p.split("=", 1) for p in sys.argv[1].split(",") if p]
    fds = [int(fd) for _, fd in pairs]
    # Out of the way of 3, 4, ... first.
    high = [fcntl.fcntl(fd, fcntl.F_DUPFD, 3 + len(fds) + max(fds + [0])) for fd in fds]
    for fd in fds:
        os.close(fd)
    for i, fd in enumerate(high):
        os.dup2(fd, 3 + i, inheritable=True)
        os.close(fd)
    if pairs:
        os.environ["LISTEN_FDS"] = str(len(pairs))
        os.environ["LISTEN_FDNAMES"] = ":".join(name for name, _ in pairs)
        os.environ["LISTEN_PID"] = str(os.getpid())
    os.execv(sys.argv[2], sys.argv[2:])


if __name__ == "__main__":
    _exec_with_fds()
