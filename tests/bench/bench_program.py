#!/usr/bin/env python3
# SPDX-License-Identifier: Apache-2.0
"""Programs (io.regen.Program) against the in-process alternatives, in one
run on one GPU:

1. A pre-LN GPT block's forward and backward (tests/bench/program_block.py),
   bf16, as one regend program per step, against the same block written as
   a torch module in this process: eager, captured as one CUDA graph
   (torch.cuda.graph over forward and backward: the same work launched in
   process as a graph), and torch.compile (Inductor). Target: the program
   within 3% of the in-process graph (ratio >= 0.97).
2. The CPU cost of a Run whatever the program's size: programs of 1, 64
   and 512 pointwise nodes on small tensors, the worker's launch time per
   Run (Status' launch_us / runs). Target: under 20 µs.
3. Fused pointwise bandwidth: a chain of pointwise ops on large tensors as
   one program, bytes moved / time. Target: 90% of the GPU's memory
   bandwidth, measured in the same run by torch's own device-to-device copy.

    python3 tests/bench/bench_program.py [REGEND] [--dims 1024,2048] [--batch 8] [--seq 1024]
        [--iters 50] [--rounds 3] [--socket PATH] [--json OUT] [--transport auto|ring|varlink]

--transport: how the client sends each Run (the lane's ring, a Varlink call,
or auto: the ring where the worker offers it). The host backend's per-Run
client cost on each is tests/bench/bench_host.py's.

Exit 77 without a GPU or torch.
"""

import os
import statistics
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
from _harness import Daemon, markdown_table, require_torch, write_json  # noqa: E402
import program_block  # noqa: E402
import regen  # noqa: E402

torch = require_torch()


def opt(name, default, cast=str):
    return cast(sys.argv[sys.argv.index(name) + 1]) if name in sys.argv else default


DIMS = [int(d) for d in opt("--dims", "1024,2048").split(",")]
BATCH = opt("--batch", 8, int)
SEQ = opt("--seq", 1024, int)
ITERS = opt("--iters", 50, int)
ROUNDS = opt("--rounds", 3, int)
REGEND = sys.argv[1] if len(sys.argv) > 1 and not sys.argv[1].startswith("--") else None
TRANSPORT = opt("--transport", "auto")


def timed(fn, iters):
    """Seconds per call of fn, the GPU's work included."""
    fn()
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    for _ in range(iters):
        fn()
    torch.cuda.synchronize()
    return (time.perf_counter() - t0) / iters


def timed_program(client, queue, iters):
    """Seconds per Run of Runs queued back to back (the rank goes on while
    they run, as it does with a graph's replay), the last one's end
    included."""
    queue()
    client.wait(0)
    t0 = time.perf_counter()
    for _ in range(iters):
        queue()
    client.wait(0)
    return (time.perf_counter() - t0) / iters


def block_case(client, D):
    B, S, H = BATCH, SEQ, D // 128
    torch.manual_seed(D)
    block = program_block.torch_block(torch, B, S, D, H).cuda().to(torch.bfloat16)
    params = program_block.block_parameters(block)
    names = list(params)
    x = torch.randn(B * S, D, device="cuda", dtype=torch.bfloat16, requires_grad=True)
    dy = torch.randn(B * S, D, device="cuda", dtype=torch.bfloat16) / 32

    def step():
        y = block(x)
        return torch.autograd.grad(y, [x] + [params[n] for n in names], dy)

    compiled = torch.compile(block)

    def step_compiled():
        y = compiled(x)
        return torch.autograd.grad(y, [x] + [params[n] for n in names], dy)

    # The same work captured in process as one CUDA graph.
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        for _ in range(3):
            step()
    torch.cuda.current_stream().wait_stream(s)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        graph_out = step()

    # The regend program, bound to the same tensors.
    prog = client.define_program(0, program_block.block_program(B, S, D, H))
    y = torch.empty(B * S, D, device="cuda", dtype=torch.bfloat16)
    dx = torch.empty_like(y)
    grads = {n: torch.empty_like(params[n]) for n in names}
    bind = {"x": x.detach(), "dy": dy, "y": y, "dx": dx}
    bind.update({n: params[n].detach() for n in names})
    bind.update({"d_" + n: grads[n] for n in names})
    torch.cuda.synchronize()

    def run():
        client.run_program(prog, bind)

    def run_queued():
        client.run_program(prog, bind, wait=False)

    for _ in range(4):   # eager Runs, then the capture
        run()
    # Numbers first: the program against the in-process graph's.
    graph.replay()
    torch.cuda.synchronize()
    ref = {"dx": graph_out[0]}
    ref.update({"d_" + n: graph_out[1 + i] for i, n in enumerate(names)})
    worst = 0.0
    for name, want in ref.items():
        got = dx if name == "dx" else grads[name[2:]]
        err = ((got.float() - want.float()).norm() / want.float().norm().clamp_min(1e-30)).item()
        worst = max(worst, err)

    rows = []
    for r in range(ROUNDS):
        t_eager = timed(step, ITERS)
        t_graph = timed(graph.replay, ITERS)
        t_compile = timed(step_compiled, ITERS)
        t_prog = timed_program(client, run_queued, ITERS)
        t_blocking = timed(run, ITERS)
        rows.append((t_eager, t_graph, t_compile, t_prog, t_blocking))
    st = client.program_status(0, prog)[0]
    client.drop_program(prog)
    return {"D": D, "B": B, "S": S, "H": H, "rows": rows, "worst_rel_err": worst, "status": st}


def chain_program(n, numel):
    p = regen.ProgramBuilder(f"chain{n}")
    cur = p.input("x", "f32", (numel,))
    for i in range(n):
        out = p.output("y", "f32", (numel,)) if i == n - 1 else p.intermediate(f"t{i}", "f32", (numel,))
        p.node(("mul", "add")[i % 2], [cur], [out], scalar=1.0001 if i % 2 == 0 else 0.5)
        cur = out
    return p.definition()


def launch_cost(client):
    x = torch.randn(256, device="cuda")
    y = torch.empty_like(x)
    out = []
    for n in (1, 64, 512):
        prog = client.define_program(0, chain_program(n, 256))
        for _ in range(200):
            client.run_program(prog, {"x": x, "y": y})
        before = client.program_status(0, prog)[0]
        for _ in range(500):
            client.run_program(prog, {"x": x, "y": y})
        after = client.program_status(0, prog)[0]
        runs = after["runs"] - before["runs"]
        # The client's CPU per queued Run (its Python and the ring record).
        c0 = time.process_time()
        for _ in range(500):
            client.run_program(prog, {"x": x, "y": y}, wait=False)
        client_us = (time.process_time() - c0) / 500 * 1e6
        client.wait(0)
        out.append({"nodes": n, "launch_us": (after["launch_us"] - before["launch_us"]) / runs,
                    "client_us": client_us, "kernels": after["kernels"], "graph_launches": after["graph_launches"]})
        client.drop_program(prog)
    return out


def bandwidth(client):
    numel = 1 << 28   # 1 GiB of f32 in, 1 GiB out
    x = torch.randn(numel, device="cuda")
    y = torch.empty_like(x)
    prog = client.define_program(0, chain_program(8, numel))
    for _ in range(4):
        client.run_program(prog, {"x": x, "y": y})
    torch.cuda.synchronize()
    t_prog = timed_program(client, lambda: client.run_program(prog, {"x": x, "y": y}, wait=False), 10)
    t_copy = timed(lambda: y.copy_(x), 10)
    st = client.program_status(0, prog)[0]
    client.drop_program(prog)
    gbps = 2 * numel * 4 / t_prog / 1e9
    return {"program_GBps": gbps, "copy_GBps": 2 * numel * 4 / t_copy / 1e9, "kernels": st["kernels"]}


def main():
    daemon = Daemon(opt("--socket", None), REGEND, "cuda")
    client = regen.Client(daemon.socket, timeout=600, transport=TRANSPORT)
    results = {"card": torch.cuda.get_device_name(), "transport": TRANSPORT, "blocks": [], "launch": None,
               "bandwidth": None}
    try:
        for D in DIMS:
            results["blocks"].append(block_case(client, D))
        results["launch"] = launch_cost(client)
        results["bandwidth"] = bandwidth(client)
        results["route"] = client.lane_transport(0)
    finally:
        client.close()
        daemon.close()
    print(f"card: {results['card']}; Runs went by {results.get('route')} (transport {TRANSPORT})")
    table = []
    for b in results["blocks"]:
        med = [statistics.median(r[i] for r in b["rows"]) * 1e3 for i in range(5)]
        ratios = [r[1] / r[3] for r in b["rows"]]
        table.append([f"d{b['D']} B{b['B']} S{b['S']}", f"{med[0]:.3f}", f"{med[1]:.3f}", f"{med[2]:.3f}",
                      f"{med[3]:.3f}", f"{med[4]:.3f}", " ".join(f"{x:.3f}" for x in ratios),
                      f"{b['worst_rel_err']:.2e}", f"{b['status']['graph_launches']}/{b['status']['runs']}"])
    print(markdown_table(["block fwd+bwd", "eager ms", "graph ms", "compile ms", "regend ms (queued)",
                          "regend ms (blocking)", "graph/regend per round", "max rel err", "graph Runs"], table))
    print(markdown_table(["nodes", "worker launch µs per Run", "client CPU µs per queued Run", "kernels",
                          "graph launches"],
                         [[x["nodes"], f"{x['launch_us']:.1f}", f"{x['client_us']:.1f}", x["kernels"],
                           x["graph_launches"]]
                          for x in results["launch"]]))
    bw = results["bandwidth"]
    print(f"fused chain of 8 pointwise ops, 1 GiB in and out: {bw['program_GBps']:.0f} GB/s; torch copy "
          f"{bw['copy_GBps']:.0f} GB/s; ratio {bw['program_GBps'] / bw['copy_GBps']:.3f} ({bw['kernels']} steps)")
    write_json(opt("--json", None), results)


if __name__ == "__main__":
    main()
