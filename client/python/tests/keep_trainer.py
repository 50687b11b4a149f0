#!/usr/bin/env python3
# SPDX-License-Identifier: Apache-2.0
"""A rank for test_keep.py: AdamW over a few tensors, one step per
io.regen.Program Run with a journal, its whole state (weights, optimizer
moments, gradients, journal) in memfds that regend keeps.  Started afresh,
it keeps new state; started again after a kill, it takes the state back and
resumes from the step the journal says is complete.

    keep_trainer.py SOCKET JOB STEPS [--die-after-submit STEP]

Prints one line as it starts ("resume STEP committed C journal STATE SEQ")
and "done" at the end.  --die-after-submit: at STEP, queue the Run without
waiting and SIGKILL itself at once (the Run is regend's to finish).  The
transport is $REGEN_TRANSPORT's.  Deterministic: two ranks that end at the
same step hold the same bits, however often they were killed.
"""

import math
import os
import random
import signal
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.dirname(HERE))

import regen  # noqa: E402
from regen.host import pack  # noqa: E402
from regen.keep import JOURNAL_HEADER_BYTES, journal_header  # noqa: E402

SHAPES = [(32, 32), (64,), (16, 8)]
RANK = 0
LEASE_MS = 60000


def definition():
    p = regen.ProgramBuilder("adamw")
    step, lr = p.scalar("step"), p.scalar("lr")
    for i, s in enumerate(SHAPES):
        w, g = p.inout(f"w{i}", "f32", s), p.input(f"g{i}", "f32", s)
        m, v = p.inout(f"m{i}", "f32", s), p.inout(f"v{i}", "f32", s)
        p.node("adamw", [w, g, m, v], [], name=f"opt{i}", lr=lr, step=step, weight_decay=0.01)
    return p.definition()


def tensor_names():
    return [f"{k}{i}" for i in range(len(SHAPES)) for k in ("w", "m", "v", "g")]


def shape_of(name):
    return SHAPES[int(name[1:])]


def fresh(c, job, journal_bytes):
    """New state, written whole before it is kept: a kill in the middle
    leaves a set without its journal, which the next start drops."""
    c.drop(job, RANK)
    rng = random.Random(7)
    fds = {}
    for name in tensor_names():
        n = math.prod(shape_of(name))
        fd = os.memfd_create(name, os.MFD_CLOEXEC | os.MFD_ALLOW_SEALING)
        os.ftruncate(fd, 4 * n)
        values = [rng.uniform(-1, 1) for _ in range(n)] if name[0] == "w" else [0.0] * n
        os.pwrite(fd, pack("f32", values), 0)
        fds[name] = fd
    fd = os.memfd_create("journal", os.MFD_CLOEXEC | os.MFD_ALLOW_SEALING)
    os.ftruncate(fd, journal_bytes)
    fds["journal"] = fd
    for name, fd in fds.items():
        c.keep(RANK, name, fd, job=job, lease_ms=LEASE_MS)
    return fds, None


def taken_back(c, job):
    """The kept state, or None when it is not all there."""
    fds, committed = {}, None
    try:
        for name in tensor_names() + ["journal"]:
            kept, fds[name] = c.take_back(RANK, name, job=job)
            committed = kept.get("step")
    except regen.NoSuchObject:
        for fd in fds.values():
            os.close(fd)
        return None
    return fds, committed


def grads(step):
    rng = random.Random(1000 + step)
    return [pack("f32", [rng.gauss(0, 1) for _ in range(math.prod(s))]) for s in SHAPES]


def main():
    sock, job, steps = sys.argv[1], sys.argv[2], int(sys.argv[3])
    die_at = int(sys.argv[sys.argv.index("--die-after-submit") + 1]) if "--die-after-submit" in sys.argv else None
    c = regen.Client(sock, timeout=30)
    prog = c.define_program(0, definition())
    state = taken_back(c, job)
    fds, committed = state if state is not None else fresh(c, job, prog.journal_bytes)
    ops = {}
    for name, fd in fds.items():
        size = os.fstat(fd).st_size
        buf = c.import_memfd(0, fd, size)
        shape = shape_of(name) if name != "journal" else (size // 4,)
        ops[name] = regen.Operand(buf, 0, "f32", list(shape))
    bind = {n: op for n, op in ops.items() if n != "journal"}
    state_name, seq = journal_header(os.pread(fds["journal"], JOURNAL_HEADER_BYTES, 0))
    if state_name == "saved":
        # A fault of the worker cut Run seq after it saved the inouts: its
        # retry puts them back and runs it whole, from the kept gradients
        # (written before the Run was submitted).
        c.run_program(prog, bind, {"step": seq, "lr": 1e-2}, journal=ops["journal"], seq=seq, retry=True)
    start = (seq or 0) + 1
    print(f"resume {start} committed {committed} journal {state_name} {seq}", flush=True)
    if seq is not None and seq != committed:
        # The journal is what the memory holds: a Run applied after the
        # last commit (the rank died between them) is committed now.
        c.commit(RANK, seq, job=job)
    for step in range(start, steps + 1):
        for i, data in enumerate(grads(step)):
            os.pwrite(fds[f"g{i}"], data, 0)
        if step == die_at:
            c.run_program(prog, bind, {"step": step, "lr": 1e-2}, journal=ops["journal"], seq=step, wait=False)
            os.kill(os.getpid(), signal.SIGKILL)
        c.run_program(prog, bind, {"step": step, "lr": 1e-2}, journal=ops["journal"], seq=step)
        c.commit(RANK, step, job=job)
    print("done", flush=True)
    c.close()


if __name__ == "__main__":
    main()
