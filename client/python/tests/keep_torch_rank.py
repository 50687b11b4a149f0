#!/usr/bin/env python3
# SPDX-License-Identifier: Apache-2.0
"""A torch rank for test_torch_keep.py, on the CPU and regend's host
backend: a small MLP and Adam, its tensors in libregen's host pool,
regen.torch.restore() at its start and keep() + commit() as it trains.

    keep_torch_rank.py SOCKET JOB STEPS OUT [--die STEP WHERE]

--die: SIGKILL itself at STEP, WHERE "before_step" (after the forward and
backward, before opt.step()) or "after_commit".  OUT: the final state
(torch.save).  Prints "resume START ptrs_in_pool BOOL" first.
"""

import os
import signal
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.dirname(HERE))

import torch  # noqa: E402
import regen.torch as rt  # noqa: E402
from regen.pool import Pool  # noqa: E402


def into_pool(t):
    return rt.host_empty(t.shape, t.dtype).copy_(t)


def main():
    sock, job, steps, out = sys.argv[1], sys.argv[2], int(sys.argv[3]), sys.argv[4]
    die = (int(sys.argv[sys.argv.index("--die") + 1]), sys.argv[sys.argv.index("--die") + 2]) \
        if "--die" in sys.argv else (None, None)
    rt.configure(socket=sock, host_device=0)
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(32, 64), torch.nn.Tanh(), torch.nn.Linear(64, 8))
    model.register_buffer("seen", torch.zeros(4))
    for p in model.parameters():
        p.data = into_pool(p.data)
    model.seen = into_pool(model.seen)
    opt = torch.optim.Adam(model.parameters(), lr=1e-2)
    key = (job, 0)
    start = rt.restore(model, opt, key=key)
    pool = Pool.get()
    in_pool = all(pool.chunk_of(t.data_ptr()) is not None for t in list(model.parameters()) + [model.seen])
    kept = rt.keep(model, opt, key=key) if start is not None else None
    print(f"resume {start} ptrs_in_pool {in_pool}", flush=True)
    for step in range((start or 0) + 1, steps + 1):
        g = torch.Generator().manual_seed(step)
        x = torch.randn(16, 32, generator=g)
        loss = model(x).square().mean()
        loss.backward()
        if die == (step, "before_step"):
            os.kill(os.getpid(), signal.SIGKILL)
        opt.step()
        opt.zero_grad()
        model.seen += 1
        if kept is None:
            # Adam made its moments with torch's allocator: into the pool,
            # where keep() can hand them to regend.
            for state in opt.state.values():
                for k, v in state.items():
                    if torch.is_tensor(v) and v.dim() > 0:
                        state[k] = into_pool(v)
            kept = rt.keep(model, opt, key=key)
        kept.commit(step)
        if die == (step, "after_commit"):
            os.kill(os.getpid(), signal.SIGKILL)
    state = {f"p{i}": p.detach().clone() for i, p in enumerate(model.parameters())}
    state["seen"] = model.seen.clone()
    for i, p in enumerate(model.parameters()):
        for k, v in opt.state[p].items():
            state[f"s{i}.{k}"] = v.clone() if torch.is_tensor(v) else torch.tensor(v)
    torch.save(state, out)
    print("done", flush=True)


if __name__ == "__main__":
    main()
