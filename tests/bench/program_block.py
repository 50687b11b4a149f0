# SPDX-License-Identifier: Apache-2.0
"""A pre-LayerNorm GPT block's forward and backward as one io.regen.Program,
and the same block written in torch as a user writes it, for the program
benchmark (bench_program.py) and the GPU test that checks its numbers
(tests/gpu/test_program_block.py).

    h = x + W_o attn(LN1(x)) + b_o            attention causal, H heads
    y = h + W_2 gelu_tanh(W_1 LN2(h) + b_1) + b_2

The program takes x, dy and the parameters, and writes y, dx and every
parameter's gradient; everything else (LayerNorm statistics, qkv, the
attention's output and log-sum-exp, the MLP's pre-activation) lives in the
program's scratch.
"""

import regen

PARAMS = ("ln1_w", "ln1_b", "w_qkv", "b_qkv", "w_o", "b_o", "ln2_w", "ln2_b", "w1", "b1", "w2", "b2")


def shapes(D):
    F = 4 * D
    return {"ln1_w": (D,), "ln1_b": (D,), "w_qkv": (3 * D, D), "b_qkv": (3 * D,), "w_o": (D, D), "b_o": (D,),
            "ln2_w": (D,), "ln2_b": (D,), "w1": (F, D), "b1": (F,), "w2": (D, F), "b2": (D,)}


def block_program(B, S, D, H, dtype="bf16"):
    """The definition (a dict for Client.define_program)."""
    T, F, Dh = B * S, 4 * D, D // H
    p = regen.ProgramBuilder(f"gpt_block_d{D}")
    x = p.input("x", dtype, (T, D))
    dy = p.input("dy", dtype, (T, D))
    w = {n: p.input(n, dtype, s) for n, s in shapes(D).items()}
    y = p.output("y", dtype, (T, D))
    dx = p.output("dx", dtype, (T, D))
    g = {n: p.output("d_" + n, dtype, s) for n, s in shapes(D).items()}

    def t(name, shape, dt=dtype):
        return p.intermediate(name, dt, shape)

    # Forward.
    ln1y, mean1, rstd1 = t("ln1y", (T, D)), t("mean1", (T,), "f32"), t("rstd1", (T,), "f32")
    p.node("layer_norm", {"x": x, "weight": w["ln1_w"], "bias": w["ln1_b"], "y": ln1y, "mean": mean1,
                          "rstd": rstd1}, name="ln1")
    qkv = t("qkv", (T, 3 * D))
    p.node("gemm", {"a": ln1y, "b": w["w_qkv"], "bias": w["b_qkv"], "d": qkv}, name="qkv", trans_b=True,
           epilogue="bias")
    # q, k and v as [B, H, S, Dh] views of qkv's columns.
    qkv_strides = (S * 3 * D, Dh, 3 * D, 1)
    q = p.view("q", qkv, (B, H, S, Dh), qkv_strides, 0)
    k = p.view("k", qkv, (B, H, S, Dh), qkv_strides, D)
    v = p.view("v", qkv, (B, H, S, Dh), qkv_strides, 2 * D)
    att = t("att", (T, D))
    o = p.view("o", att, (B, H, S, Dh), (S * D, Dh, D, 1))
    stats = t("stats", (B, H, S), "f32")
    p.node("attention", {"q": q, "k": k, "v": v, "o": o, "stats": stats}, name="attn", causal=True)
    proj = t("proj", (T, D))
    p.node("gemm", {"a": att, "b": w["w_o"], "bias": w["b_o"], "d": proj}, name="proj", trans_b=True,
           epilogue="bias")
    h = t("h", (T, D))
    p.node("add", [x, proj], [h], name="res1")
    ln2y, mean2, rstd2 = t("ln2y", (T, D)), t("mean2", (T,), "f32"), t("rstd2", (T,), "f32")
    p.node("layer_norm", {"x": h, "weight": w["ln2_w"], "bias": w["ln2_b"], "y": ln2y, "mean": mean2,
                          "rstd": rstd2}, name="ln2")
    act, pre = t("act", (T, F)), t("pre", (T, F))
    p.node("gemm", {"a": ln2y, "b": w["w1"], "bias": w["b1"], "d": act, "aux_out": pre}, name="fc1",
           trans_b=True, epilogue="gelu_aux_bias")
    mlp = t("mlp", (T, D))
    p.node("gemm", {"a": act, "b": w["w2"], "bias": w["b2"], "d": mlp}, name="fc2", trans_b=True,
           epilogue="bias")
    p.node("add", [h, mlp], [y], name="res2")

    # Backward.
    dpre = t("dpre", (T, F))
    p.node("gemm", {"a": dy, "b": w["w2"], "aux": pre, "d": dpre}, name="fc2_dgrad", epilogue="dgelu")
    p.node("gemm", {"a": dy, "b": act, "d": g["w2"]}, name="fc2_wgrad", trans_a=True)
    p.node("sum", [dy], [g["b2"]], name="fc2_bgrad", axis="leading")
    p.node("gemm", {"a": dpre, "b": ln2y, "d": g["w1"]}, name="fc1_wgrad", trans_a=True)
    p.node("sum", [dpre], [g["b1"]], name="fc1_bgrad", axis="leading")
    dln2y = t("dln2y", (T, D))
    p.node("gemm", {"a": dpre, "b": w["w1"], "d": dln2y}, name="fc1_dgrad")
    dh = t("dh", (T, D))
    p.node("layer_norm_backward", {"d_y": dln2y, "x": h, "weight": w["ln2_w"], "mean": mean2, "rstd": rstd2,
                                   "d_x": dh, "d_weight": g["ln2_w"], "d_bias": g["ln2_b"], "d_residual": dy},
           name="ln2_bwd")
    datt = t("datt", (T, D))
    p.node("gemm", {"a": dh, "b": w["w_o"], "d": datt}, name="proj_dgrad")
    p.node("gemm", {"a": dh, "b": att, "d": g["w_o"]}, name="proj_wgrad", trans_a=True)
    p.node("sum", [dh], [g["b_o"]], name="proj_bgrad", axis="leading")
    dqkv = t("dqkv", (T, 3 * D))
    do = p.view("do", datt, (B, H, S, Dh), (S * D, Dh, D, 1))
    dq = p.view("dq", dqkv, (B, H, S, Dh), qkv_strides, 0)
    dk = p.view("dk", dqkv, (B, H, S, Dh), qkv_strides, D)
    dv = p.view("dv", dqkv, (B, H, S, Dh), qkv_strides, 2 * D)
    p.node("attention_backward", {"q": q, "k": k, "v": v, "o": o, "d_o": do, "stats": stats, "d_q": dq, "d_k": dk,
                                  "d_v": dv}, name="attn_bwd", causal=True)
    p.node("gemm", {"a": dqkv, "b": ln1y, "d": g["w_qkv"]}, name="qkv_wgrad", trans_a=True)
    p.node("sum", [dqkv], [g["b_qkv"]], name="qkv_bgrad", axis="leading")
    dln1y = t("dln1y", (T, D))
    p.node("gemm", {"a": dqkv, "b": w["w_qkv"], "d": dln1y}, name="qkv_dgrad")
    p.node("layer_norm_backward", {"d_y": dln1y, "x": x, "weight": w["ln1_w"], "mean": mean1, "rstd": rstd1,
                                   "d_x": dx, "d_weight": g["ln1_w"], "d_bias": g["ln1_b"], "d_residual": dh},
           name="ln1_bwd")
    return p.definition()


def torch_block(torch, B, S, D, H):
    """The same block as a user writes it in torch: a module, its forward;
    the backward is autograd's."""
    nn, F = torch.nn, torch.nn.functional

    class Block(nn.Module):
        def __init__(self):
            super().__init__()
            self.ln1 = nn.LayerNorm(D)
            self.qkv = nn.Linear(D, 3 * D)
            self.proj = nn.Linear(D, D)
            self.ln2 = nn.LayerNorm(D)
            self.fc1 = nn.Linear(D, 4 * D)
            self.fc2 = nn.Linear(4 * D, D)

        def forward(self, x):
            q, k, v = self.qkv(self.ln1(x)).view(B, S, 3, H, D // H).permute(2, 0, 3, 1, 4)
            a = F.scaled_dot_product_attention(q, k, v, is_causal=True)
            h = x + self.proj(a.transpose(1, 2).reshape(B * S, D))
            return h + self.fc2(F.gelu(self.fc1(self.ln2(h)), approximate="tanh"))

    return Block()


def block_parameters(block):
    """The torch module's parameters by the program's names."""
    return {"ln1_w": block.ln1.weight, "ln1_b": block.ln1.bias, "w_qkv": block.qkv.weight, "b_qkv": block.qkv.bias,
            "w_o": block.proj.weight, "b_o": block.proj.bias, "ln2_w": block.ln2.weight, "ln2_b": block.ln2.bias,
            "w1": block.fc1.weight, "b1": block.fc1.bias, "w2": block.fc2.weight, "b2": block.fc2.bias}
