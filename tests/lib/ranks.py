# SPDX-License-Identifier: Apache-2.0
"""N ranks of one job as N processes, for the multi-rank GPU tests and
benchmarks (tests/gpu/test_nccl_multi.py, tests/bench/bench_allreduce.py).

Standard library only. A launcher (the script run by hand) starts regend,
then runs the same script once per rank with `--rank R` and the job's
settings; rank R uses GPU R (CUDA device index R in its process, regend's
device R: no CUDA_VISIBLE_DEVICES games, as torchrun does it). The ranks
meet through a FileStore in a directory of the launcher's: rank 0 asks
regend for the communicator's unique id and sets it there, the others get
it; torch.distributed uses a file:// store in the same directory. Each rank
prints JSON lines on stdout; the launcher reads them once every rank
exited, or kills every rank when one hangs past the timeout.

    store = FileStore(path)
    store.set("uid", uid)          # rank 0
    uid = store.get("uid", 60)     # the others
    store.barrier("phase-1", rank, nranks, 60)

    procs = spawn(__file__, nranks, ["--socket", sock, "--store", dir])
    outs = collect(procs, timeout=600)   # [(returncode, [json objects]), ...] by rank
"""

import json
import os
import subprocess
import sys
import tempfile
import time

from regend_fixture import TIME_SCALE


class StoreTimeout(Exception):
    pass


class FileStore:
    """Keys are files in one directory; a value appears at once and whole
    (written to a temporary name, then renamed)."""

    def __init__(self, path):
        self.path = path
        os.makedirs(path, exist_ok=True)

    def _file(self, key):
        if not key or "/" in key or key.startswith("."):
            raise ValueError(f"bad store key {key!r}")
        return os.path.join(self.path, "key-" + key)

    def set(self, key, value):
        fd, tmp = tempfile.mkstemp(dir=self.path, prefix=".tmp-")
        with os.fdopen(fd, "w") as f:
            f.write(value)
        os.rename(tmp, self._file(key))

    def get(self, key, timeout):
        """The value, once some rank set it; StoreTimeout after timeout
        seconds (scaled)."""
        deadline = time.monotonic() + timeout * TIME_SCALE
        while True:
            try:
                with open(self._file(key)) as f:
                    return f.read()
            except FileNotFoundError:
                pass
            if time.monotonic() > deadline:
                raise StoreTimeout(f"no rank set {key!r} in {self.path} within {timeout * TIME_SCALE:.0f} s")
            time.sleep(0.01)

    def barrier(self, name, rank, nranks, timeout):
        """Returns once every rank reached `name`."""
        self.set(f"{name}.{rank}", "")
        for r in range(nranks):
            self.get(f"{name}.{r}", timeout)


def gpu_count():
    """How many CUDA devices torch sees (0 without torch or CUDA)."""
    try:
        import torch
        return torch.cuda.device_count()
    except Exception:  # noqa: BLE001 - no torch, no driver: no GPU
        return 0


def enough_gpus(nranks, what):
    """True when there is a GPU per rank; else says so and returns False."""
    have = gpu_count()
    if have >= nranks:
        return True
    print(f"{what}: --nranks {nranks} needs {nranks} GPUs (one per rank), this machine has {have}",
          file=sys.stderr, flush=True)
    return False


def spawn(script, nranks, args, env=None):
    """Runs `python script --rank R --nranks N args...` for every rank, its
    stdout a pipe; the ranks share the launcher's stderr."""
    full_env = dict(os.environ)
    full_env.update(env or {})
    return [subprocess.Popen([sys.executable, os.path.abspath(script), "--rank", str(r), "--nranks", str(nranks)]
                             + list(args), stdout=subprocess.PIPE, text=True, env=full_env)
            for r in range(nranks)]


def collect(procs, timeout):
    """Waits for every rank (timeout seconds, scaled, for all of them); a
    rank still running then is killed, with the others, as a hang. Returns
    (returncode, [the JSON objects it printed]) by rank; a rank killed has
    returncode -9."""
    deadline = time.monotonic() + timeout * TIME_SCALE
    texts = [None] * len(procs)
    codes = [None] * len(procs)
    for r, p in enumerate(procs):
        try:
            texts[r], _ = p.communicate(timeout=max(0.1, deadline - time.monotonic()))
            codes[r] = p.returncode
        except subprocess.TimeoutExpired:
            print(f"rank {r} still running after {timeout * TIME_SCALE:.0f} s: killing every rank", file=sys.stderr)
            for q in procs:
                if q.poll() is None:
                    q.kill()
            for t, q in enumerate(procs):
                if texts[t] is None:
                    texts[t], _ = q.communicate()
                    codes[t] = q.returncode
            break
    out = []
    for code, text in zip(codes, texts):
        lines = []
        for line in (text or "").splitlines():
            if line.startswith("{"):
                try:
                    lines.append(json.loads(line))
                except ValueError:
                    pass
        out.append((code, lines))
    return out


def emit(obj):
    """A rank's line for the launcher."""
    print(json.dumps(obj), flush=True)
