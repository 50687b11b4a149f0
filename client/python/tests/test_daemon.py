# SPDX-License-Identifier: Apache-2.0
"""The Python client against a real regend (host backend): numerics against
float64, every error class a client meets, Watch, and reconnects after the
worker dies."""

import json
import math
import os
import random
import resource
import signal
import socket
import struct
import sys
import threading
import time
import unittest

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.dirname(HERE))
sys.path.insert(0, os.path.join(HERE, "..", "..", "..", "tests", "lib"))
import regen  # noqa: E402
from regen import reference  # noqa: E402
import tensor_glue  # noqa: E402
from regen.host import HostTensor, random_values  # noqa: E402
from regend_fixture import Regend, find_regend  # noqa: E402

# Relative error ||out - ref|| / ||ref|| allowed for each output type, the
# reference being float64 on the inputs as stored (already rounded).
TOL = {"f32": 1e-5, "f16": 2e-3, "bf16": 1e-2}

daemon = None


def outcome_of(call, *args, **kwargs):
    """What call(...) gave: its result, or the regen.Error it raised."""
    try:
        return call(*args, **kwargs)
    except regen.Error as e:
        return e


def setUpModule():
    global daemon
    if not find_regend():
        raise unittest.SkipTest("no regend (pass --regend or set REGEN_BUILD_ROOT)")
    daemon = Regend(devices=2)


def tearDownModule():
    if daemon is not None:
        daemon.stop()


class DaemonTest(unittest.TestCase):
    device = 0

    def setUp(self):
        self.c = regen.Client(daemon.socket, timeout=60)
        self.rng = random.Random(self.id())
        self.tensors = []

    def tearDown(self):
        # Under REGEN_TRANSPORT=ring the suite's second run is on the ring
        # for real: every lane that made compute calls used it.
        want = os.environ.get("REGEN_TRANSPORT")
        for dev in list(self.c._lanes):
            if want in ("ring", "varlink"):
                self.assertEqual(self.c.lane_transport(dev), want, f"device {dev}'s lane")
        self.c.close()
        for t in self.tensors:
            t.close()

    def tensor(self, shape, dtype="f32", fill=True, device=None):
        t = HostTensor.random(shape, dtype, self.rng) if fill else HostTensor(shape, dtype)
        t.import_into(self.c, self.device if device is None else device)
        self.tensors.append(t)
        return t

    def assertClose(self, out, ref, dtype, what=""):
        err = reference.rel_error(out, ref)
        self.assertLessEqual(err, TOL[dtype], f"{what}: rel error {err:.3e} > {TOL[dtype]:.0e}")

    def square(self, n, device=None):
        """a, b (random) and d (to be written), each [n, n] f32."""
        return (self.tensor([n, n], device=device), self.tensor([n, n], device=device),
                self.tensor([n, n], fill=False, device=device))

    def assertServesAgain(self, a, b, d, device):
        """a, b, d imported again (their ids went stale) and d = a @ b right."""
        for t in (a, b, d):
            t.import_into(self.c, device)
        self.c.gemm(a.op, b.op, d.op)
        n = a.shape[0]
        self.assertClose(d.read(), reference.gemm(a.read(), b.read(), n, n, n), "f32")

    def generation_of(self, device):
        return next(d for d in self.c.generation()["devices"] if d["index"] == device)["generation"]


class Gemm(DaemonTest):
    def run_gemm(self, m, n, k, trans_a=False, trans_b=False, alpha=1.0, beta=0.0, with_c=False,
                 epilogue=None, in_dtype="f32", out_dtype="f32", tf32=False):
        a = self.tensor([k, m] if trans_a else [m, k], in_dtype)
        b = self.tensor([n, k] if trans_b else [k, n], in_dtype)
        d = self.tensor([m, n], out_dtype, fill=False)
        c = self.tensor([m, n], out_dtype) if with_c else None
        bias = self.tensor([n], out_dtype) if epilogue in ("bias", "gelu_bias", "gelu_aux_bias") else None
        aux = aux_out = None
        if epilogue == "dgelu":
            # The pre-activation across GELU's bend and into both tails.
            aux = self.tensor([m, n], out_dtype, fill=False)
            aux.write(random_values(m * n, self.rng, -4.0, 4.0))
        if epilogue in ("gelu_aux", "gelu_aux_bias"):
            aux_out = self.tensor([m, n], out_dtype, fill=False)
        aux_before = aux.read() if aux else None
        us = self.c.gemm(a.op, b.op, d.op, c=c.op if c else None, bias=bias.op if bias else None,
                         trans_a=trans_a, trans_b=trans_b, alpha=alpha, beta=beta, epilogue=epilogue, tf32=tf32,
                         aux=aux.op if aux else None, aux_out=aux_out.op if aux_out else None)
        self.assertIsInstance(us, int)
        pre = [0.0] * (m * n)
        ref = reference.gemm(a.read(), b.read(), m, n, k, trans_a, trans_b, alpha, beta,
                             c.read() if c else None, bias.read() if bias else None, epilogue,
                             aux=aux_before, pre=pre)
        if aux:
            self.assertEqual(aux.read(), aux_before, "aux is an input")
        tolerance = "f32" if tf32 is False and out_dtype == "f32" else out_dtype
        self.assertClose(d.read(), ref, tolerance, f"gemm {m}x{n}x{k}")
        if aux_out:
            self.assertClose(aux_out.read(), pre, tolerance, f"gemm {m}x{n}x{k}: aux_out, GELU's input")

    def test_f32(self):
        self.run_gemm(64, 48, 32)

    def test_transposes(self):
        for ta in (False, True):
            for tb in (False, True):
                with self.subTest(trans_a=ta, trans_b=tb):
                    self.run_gemm(24, 20, 16, trans_a=ta, trans_b=tb)

    def test_alpha_beta_c(self):
        self.run_gemm(24, 20, 16, alpha=0.5, beta=-2.0, with_c=True)

    def test_epilogues(self):
        for ep in ("bias", "gelu", "gelu_bias"):
            with self.subTest(epilogue=ep):
                self.run_gemm(24, 20, 16, epilogue=ep, alpha=1.5, beta=0.5, with_c=True)

    def test_dgelu(self):
        for in_dt, out_dt in (("f32", "f32"), ("bf16", "bf16"), ("f16", "f16"), ("bf16", "f32")):
            for with_c in (False, True):
                with self.subTest(inputs=in_dt, out=out_dt, c=with_c):
                    self.run_gemm(24, 20, 16, trans_b=with_c, epilogue="dgelu", alpha=1.5,
                                  beta=0.5 if with_c else 0.0, with_c=with_c, in_dtype=in_dt, out_dtype=out_dt)

    def test_gelu_aux(self):
        for epilogue in ("gelu_aux", "gelu_aux_bias"):
            for in_dt, out_dt in (("f32", "f32"), ("bf16", "bf16"), ("bf16", "f32")):
                with self.subTest(epilogue=epilogue, inputs=in_dt, out=out_dt):
                    self.run_gemm(24, 20, 16, trans_a=in_dt == "bf16", epilogue=epilogue, alpha=1.5, beta=0.5,
                                  with_c=True, in_dtype=in_dt, out_dtype=out_dt)

    def test_dgelu_reference(self):
        # The pure-Python reference's slope against a central difference of
        # its GELU, so that the references the tests use are right.
        for x in (-5.0, -2.0, -0.75, -0.1, 0.0, 0.3, 1.0, 1.5, 3.0, 6.0):
            h = 1e-6
            numeric = (reference.gelu_tanh(x + h) - reference.gelu_tanh(x - h)) / (2 * h)
            self.assertAlmostEqual(reference.dgelu_tanh(x), numeric, places=8, msg=f"x={x}")

    def test_half_inputs(self):
        for dt in ("bf16", "f16"):
            with self.subTest(inputs=dt, out="f32"):
                self.run_gemm(32, 24, 16, in_dtype=dt, out_dtype="f32")
            with self.subTest(inputs=dt, out=dt):
                self.run_gemm(32, 24, 16, in_dtype=dt, out_dtype=dt)

    def test_tf32_accepted(self):
        a, b, d = self.tensor([16, 8]), self.tensor([8, 12]), self.tensor([16, 12], fill=False)
        self.c.gemm(a.op, b.op, d.op, tf32=True)
        ref = reference.gemm(a.read(), b.read(), 16, 12, 8)
        self.assertLessEqual(reference.rel_error(d.read(), ref), 1e-3)

    def test_fp8_fast_accum_refused_for_f32_inputs(self):
        a, b, d = self.tensor([16, 8]), self.tensor([8, 12]), self.tensor([16, 12], fill=False)
        before = d.read()
        with self.assertRaises(regen.errors.InvalidParameter) as cm:
            self.c.gemm(a.op, b.op, d.op, fp8_fast_accum=True)
        self.assertEqual(cm.exception.parameters.get("parameter"), "compute")
        self.assertEqual(d.read(), before, "a refused call wrote d")
        with self.assertRaises(ValueError):
            self.c.gemm(a.op, b.op, d.op, tf32=True, fp8_fast_accum=True)

    def test_padded_rows_at_an_offset(self):
        # A [m, k] with rows padded to k+8 elements, starting 256 bytes into its buffer.
        m, n, k, ld, off = 20, 12, 16, 24, 256
        big = self.tensor([off // 4 + m * ld])
        vals = big.read()
        a_vals = [vals[off // 4 + i * ld + p] for i in range(m) for p in range(k)]
        b, d = self.tensor([k, n]), self.tensor([m, n], fill=False)
        a_op = regen.Operand(big.buffer, off, "f32", [m, k], [ld, 1])
        self.c.gemm(a_op, b.op, d.op)
        self.assertClose(d.read(), reference.gemm(a_vals, b.read(), m, n, k), "f32", "padded A")

    def test_second_device(self):
        a, b = self.tensor([8, 8], device=1), self.tensor([8, 8], device=1)
        d = self.tensor([8, 8], fill=False, device=1)
        self.assertEqual(a.buffer.device, 1)
        self.assertTrue(a.buffer.id.startswith("b1."))
        self.c.gemm(a.op, b.op, d.op)
        self.assertClose(d.read(), reference.gemm(a.read(), b.read(), 8, 8, 8), "f32")

    def test_concurrent_clients(self):
        """Two threads, a Client each, interleaving GEMMs on one device."""
        failures = []

        def work(seed):
            rng = random.Random(seed)
            with regen.Client(daemon.socket, timeout=60) as c:
                ts = [HostTensor.random(s, rng=rng) for s in ([16, 12], [12, 8])] + [HostTensor([16, 8])]
                for t in ts:
                    t.import_into(c, 0)
                ref = reference.gemm(ts[0].read(), ts[1].read(), 16, 8, 12)
                for _ in range(25):
                    c.gemm(ts[0].op, ts[1].op, ts[2].op)
                    if reference.rel_error(ts[2].read(), ref) > 1e-5:
                        failures.append(seed)
                for t in ts:
                    t.close()

        threads = [threading.Thread(target=work, args=(s,)) for s in (1, 2)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(60)
        self.assertEqual(failures, [])


class Attention(DaemonTest):
    def run_attention(self, b, h, sq, skv, d, dv, causal=False, scale=None):
        q, k, v = self.tensor([b, h, sq, d]), self.tensor([b, h, skv, d]), self.tensor([b, h, skv, dv])
        o, stats = self.tensor([b, h, sq, dv], fill=False), self.tensor([b, h, sq], fill=False)
        self.c.attention(q.op, k.op, v.op, o.op, stats=stats.op, causal=causal, scale=scale)
        ref_o, ref_lse = reference.attention(q.read(), k.read(), v.read(), b, h, sq, skv, d, dv, scale, causal)
        self.assertClose(o.read(), ref_o, "f32", "attention o")
        self.assertClose(stats.read(), ref_lse, "f32", "attention stats")
        return q, k, v, o, stats

    def test_forward(self):
        self.run_attention(1, 2, 16, 16, 8, 8)

    def test_forward_causal_rectangular(self):
        self.run_attention(2, 1, 8, 12, 8, 4, causal=True, scale=0.3)

    def test_forward_without_stats(self):
        q, k, v = self.tensor([1, 1, 4, 8]), self.tensor([1, 1, 4, 8]), self.tensor([1, 1, 4, 8])
        o = self.tensor([1, 1, 4, 8], fill=False)
        self.c.attention(q.op, k.op, v.op, o.op)
        ref, _ = reference.attention(q.read(), k.read(), v.read(), 1, 1, 4, 4, 8, 8)
        self.assertClose(o.read(), ref, "f32")

    def test_backward(self):
        for causal in (False, True):
            with self.subTest(causal=causal):
                b, h, s, d = 1, 2, 8, 8
                q, k, v, o, stats = self.run_attention(b, h, s, s, d, d, causal=causal)
                d_o = self.tensor([b, h, s, d])
                dq, dk, dv = (self.tensor([b, h, s, d], fill=False) for _ in range(3))
                self.c.attention_backward(q.op, k.op, v.op, o.op, d_o.op, stats.op, dq.op, dk.op, dv.op,
                                          causal=causal)
                ref = reference.attention_backward(q.read(), k.read(), v.read(), d_o.read(), b, h, s, s, d, d,
                                                   causal=causal)
                for name, out, r in zip(("d_q", "d_k", "d_v"), (dq, dk, dv), ref):
                    err = reference.rel_error(out.read(), r)
                    self.assertLessEqual(err, 1e-4, f"{name}: rel error {err:.3e}")


    def test_grouped_query_and_bottom_right(self):
        # 4 query heads over 2 k/v heads (and over 1: multi-query), with
        # the causal diagonal at the bottom right of a rectangular mask.
        for hkv, alignment in ((2, "bottom_right"), (1, "top_left"), (1, "bottom_right")):
            with self.subTest(hkv=hkv, alignment=alignment):
                b, h, sq, skv, d = 2, 4, 5, 9, 8
                q, k, v = self.tensor([b, h, sq, d]), self.tensor([b, hkv, skv, d]), self.tensor([b, hkv, skv, d])
                o, stats = self.tensor([b, h, sq, d], fill=False), self.tensor([b, h, sq], fill=False)
                self.c.attention(q.op, k.op, v.op, o.op, stats=stats.op, causal=True, causal_alignment=alignment)
                ref_o, ref_lse = reference.attention(q.read(), k.read(), v.read(), b, h, sq, skv, d, d, None, True,
                                                     hkv=hkv, alignment=alignment)
                self.assertClose(o.read(), ref_o, "f32", "o")
                self.assertClose(stats.read(), ref_lse, "f32", "stats")
                d_o = self.tensor([b, h, sq, d])
                dq = self.tensor([b, h, sq, d], fill=False)
                dk, dv = self.tensor([b, hkv, skv, d], fill=False), self.tensor([b, hkv, skv, d], fill=False)
                self.c.attention_backward(q.op, k.op, v.op, o.op, d_o.op, stats.op, dq.op, dk.op, dv.op,
                                          causal=True, causal_alignment=alignment)
                ref = reference.attention_backward(q.read(), k.read(), v.read(), d_o.read(), b, h, sq, skv, d, d,
                                                   causal=True, hkv=hkv, alignment=alignment)
                for name, out, r in zip(("d_q", "d_k", "d_v"), (dq, dk, dv), ref):
                    err = reference.rel_error(out.read(), r)
                    self.assertLessEqual(err, 1e-4, f"{name}: rel error {err:.3e}")

    def test_variable_sequence_lengths(self):
        # Each batch entry its own lengths (one with no queries at all),
        # padding rows of the inputs NaN: o 0 and stats -inf there,
        # gradients 0; both alignments, Sq > Skv bottom-right.
        rng = random.Random(5)
        for causal, alignment, sq, skv in ((False, None, 7, 9), (True, "top_left", 9, 6),
                                           (True, "bottom_right", 9, 6)):
            with self.subTest(causal=causal, alignment=alignment):
                b, h, hkv, d = 3, 2, 1, 8
                lkv = [skv, rng.randint(1, skv), rng.randint(1, skv)]
                lq = [0, min(rng.randint(1, sq), lkv[1]), min(sq, lkv[2])]
                seq_q, seq_kv = self.tensor([b], "i32", fill=False), self.tensor([b], "i32", fill=False)
                seq_q.write(lq)
                seq_kv.write(lkv)
                q, k, v = self.tensor([b, h, sq, d]), self.tensor([b, hkv, skv, d]), self.tensor([b, hkv, skv, d])
                d_o = self.tensor([b, h, sq, d])
                for t, lens, s in ((q, lq, sq), (k, lkv, skv), (v, lkv, skv), (d_o, lq, sq)):
                    heads = t.shape[1]
                    vals = t.read()
                    for n in range(b * heads):
                        for i in range(lens[n // heads], s):
                            vals[(n * s + i) * d:(n * s + i + 1) * d] = [math.nan] * d
                    t.write(vals)
                o, stats = self.tensor([b, h, sq, d], fill=False), self.tensor([b, h, sq], fill=False)
                scalars = dict(causal=causal, causal_alignment=alignment, seq_len_q=seq_q.op, seq_len_kv=seq_kv.op)
                self.c.attention(q.op, k.op, v.op, o.op, stats=stats.op, **scalars)
                ref_o, ref_lse = reference.attention(q.read(), k.read(), v.read(), b, h, sq, skv, d, d, None, causal,
                                                     hkv=hkv, alignment=alignment or "top_left", seq_len_q=lq,
                                                     seq_len_kv=lkv)
                self.assertClose(o.read(), ref_o, "f32", "o")
                got = stats.read()
                self.assertEqual([g for g, r in zip(got, ref_lse) if r == -math.inf],
                                 [r for r in ref_lse if r == -math.inf], "padding rows' stats are -inf")
                self.assertClose([g for g, r in zip(got, ref_lse) if r != -math.inf],
                                 [r for r in ref_lse if r != -math.inf], "f32", "stats")
                dq = self.tensor([b, h, sq, d], fill=False)
                dk, dv = self.tensor([b, hkv, skv, d], fill=False), self.tensor([b, hkv, skv, d], fill=False)
                self.c.attention_backward(q.op, k.op, v.op, o.op, d_o.op, stats.op, dq.op, dk.op, dv.op, **scalars)
                ref = reference.attention_backward(q.read(), k.read(), v.read(), d_o.read(), b, h, sq, skv, d, d,
                                                   causal=causal, hkv=hkv, alignment=alignment or "top_left",
                                                   seq_len_q=lq, seq_len_kv=lkv)
                for name, out, r in zip(("d_q", "d_k", "d_v"), (dq, dk, dv), ref):
                    got = out.read()
                    self.assertFalse(any(math.isnan(x) for x in got), f"{name}: NaN from the padding")
                    err = reference.rel_error(got, r)
                    self.assertLessEqual(err, 1e-4, f"{name}: rel error {err:.3e}")

    def test_a_length_past_the_sequence_is_refused(self):
        q, k, v = self.tensor([2, 1, 4, 8]), self.tensor([2, 1, 4, 8]), self.tensor([2, 1, 4, 8])
        o = self.tensor([2, 1, 4, 8], fill=False)
        o.write([7.0] * o.numel)
        seq_q, seq_kv = self.tensor([2], "i32", fill=False), self.tensor([2], "i32", fill=False)
        seq_q.write([4, 5])
        seq_kv.write([4, 4])
        with self.assertRaises(regen.InvalidOperand) as cm:
            self.c.attention(q.op, k.op, v.op, o.op, seq_len_q=seq_q.op, seq_len_kv=seq_kv.op)
        self.assertEqual(cm.exception.parameters["operand"], "seq_len_q")
        self.assertIn("seq_len_q[1] is 5", cm.exception.parameters["reason"])
        self.assertEqual(o.read(), [7.0] * o.numel, "a refused call wrote o")
        with self.assertRaises(regen.InvalidOperand) as cm:
            self.c.attention(q.op, k.op, v.op, o.op, seq_len_q=seq_q.op)
        self.assertEqual(cm.exception.parameters["operand"], "seq_len_kv")

    def test_bottom_right_with_more_queries_than_keys_is_refused(self):
        q, k, v = self.tensor([1, 1, 6, 8]), self.tensor([1, 1, 4, 8]), self.tensor([1, 1, 4, 8])
        o = self.tensor([1, 1, 6, 8], fill=False)
        with self.assertRaises(regen.InvalidOperand) as cm:
            self.c.attention(q.op, k.op, v.op, o.op, causal=True, causal_alignment="bottom_right")
        self.assertEqual(cm.exception.parameters["operand"], "q")


class LayerNorm(DaemonTest):
    """LayerNorm and its backward against float64 on the inputs as stored,
    every dtype, padded rows, d_residual (in place too), and each mistake
    refused by name with nothing written."""

    def forward(self, rows, n, dtype, bias=True, stats=True, eps=None, ld=None):
        ld = n if ld is None else ld
        x = self.tensor([rows, ld], dtype)
        w = self.tensor([n], dtype)
        b = self.tensor([n], dtype) if bias else None
        y = self.tensor([rows, ld], dtype)
        y_before = y.read()
        mean = self.tensor([rows]) if stats else None
        rstd = self.tensor([rows]) if stats else None
        strides = None if ld == n else [ld, 1]
        xo = regen.Operand(x.buffer, 0, dtype, [rows, n], strides)
        yo = regen.Operand(y.buffer, 0, dtype, [rows, n], strides)
        us = self.c.layer_norm(xo, w.op, yo, bias=b.op if b else None, mean=mean.op if stats else None,
                               rstd=rstd.op if stats else None, eps=eps)
        self.assertIsInstance(us, int)
        xs = [v for i, v in enumerate(x.read()) if i % ld < n]
        ref_y, ref_mean, ref_rstd = reference.layer_norm(xs, w.read(), rows, n, b.read() if b else None,
                                                         1e-5 if eps is None else eps)
        got = y.read()
        self.assertClose([v for i, v in enumerate(got) if i % ld < n], ref_y, dtype, f"y {rows}x{n} {dtype}")
        self.assertEqual([v for i, v in enumerate(got) if i % ld >= n],
                         [v for i, v in enumerate(y_before) if i % ld >= n], "y's row padding untouched")
        if stats:
            self.assertClose(mean.read(), ref_mean, "f32", "mean")
            self.assertClose(rstd.read(), ref_rstd, "f32", "rstd")
        return x, xs, w, mean, rstd

    def test_forward_every_dtype(self):
        for dtype in ("f32", "f16", "bf16"):
            with self.subTest(dtype=dtype):
                self.forward(self.rng.randint(1, 9), self.rng.randint(1, 70), dtype,
                             eps=self.rng.choice([None, 1e-3, 0.25]))

    def test_forward_without_bias_or_stats(self):
        self.forward(4, 33, "f32", bias=False, stats=False)

    def test_forward_padded_rows(self):
        self.forward(6, 24, "bf16", ld=31)

    def test_backward(self):
        for dtype in ("f32", "f16", "bf16"):
            for residual in (None, "apart", "in place"):
                with self.subTest(dtype=dtype, residual=residual):
                    rows, n = self.rng.randint(1, 12), self.rng.randint(1, 50)
                    x, xs, w, mean, rstd = self.forward(rows, n, dtype)
                    d_y = self.tensor([rows, n], dtype)
                    d_x = self.tensor([rows, n], dtype)
                    dw, db = self.tensor([n], dtype), self.tensor([n], dtype)
                    res = None
                    if residual == "apart":
                        res = self.tensor([rows, n], dtype)
                    elif residual == "in place":
                        res = d_x
                    res_before = res.read() if res else None
                    self.c.layer_norm_backward(d_y.op, x.op, w.op, mean.op, rstd.op, d_x.op, d_weight=dw.op,
                                               d_bias=db.op, d_residual=res.op if res else None)
                    ref = reference.layer_norm_backward(d_y.read(), xs, w.read(), mean.read(), rstd.read(), rows,
                                                        n, res_before)
                    self.assertClose(d_x.read(), ref[0], dtype, "d_x")
                    self.assertClose(dw.read(), ref[1], dtype, "d_weight")
                    self.assertClose(db.read(), ref[2], dtype, "d_bias")
                    if residual == "apart":
                        self.assertEqual(res.read(), res_before, "d_residual is an input")

    def test_backward_without_parameter_gradients(self):
        x, xs, w, mean, rstd = self.forward(3, 17, "f32")
        d_y, d_x = self.tensor([3, 17]), self.tensor([3, 17])
        self.c.layer_norm_backward(d_y.op, x.op, w.op, mean.op, rstd.op, d_x.op)
        ref = reference.layer_norm_backward(d_y.read(), xs, w.read(), mean.read(), rstd.read(), 3, 17)
        self.assertClose(d_x.read(), ref[0], "f32", "d_x")

    def test_refusals(self):
        """Each mistake is refused by name and writes nothing."""
        rows, n = 4, 8
        x, w, b = self.tensor([rows, n]), self.tensor([n]), self.tensor([n])
        y, stats = self.tensor([rows, n]), self.tensor([2 * rows])
        long_x = self.tensor([1, 65537])
        mean = regen.Operand(stats.buffer, 0, "f32", [rows])
        rstd = regen.Operand(stats.buffer, 4 * rows, "f32", [rows])
        fwd = dict(x=x.op, weight=w.op, y=y.op, bias=b.op, mean=mean, rstd=rstd)
        cases = [
            ("weight of another dtype", dict(fwd, weight=regen.Operand(w.buffer, 0, "bf16", [n])),
             regen.InvalidOperand, "weight"),
            ("weight of another length", dict(fwd, weight=regen.Operand(w.buffer, 0, "f32", [n - 1])),
             regen.InvalidOperand, "weight"),
            ("bias of another length", dict(fwd, bias=regen.Operand(b.buffer, 0, "f32", [n // 2])),
             regen.InvalidOperand, "bias"),
            ("mean in bf16", dict(fwd, mean=regen.Operand(stats.buffer, 0, "bf16", [rows])),
             regen.InvalidOperand, "mean"),
            ("rstd one row short", dict(fwd, rstd=regen.Operand(stats.buffer, 16, "f32", [rows - 1])),
             regen.InvalidOperand, "rstd"),
            ("y shaped unlike x", dict(fwd, y=regen.Operand(y.buffer, 0, "f32", [rows, n - 1])),
             regen.InvalidOperand, "y"),
            ("y over x", dict(fwd, y=regen.Operand(x.buffer, 0, "f32", [rows, n])), regen.InvalidOperand, "y"),
            ("rstd over mean", dict(fwd, rstd=regen.Operand(stats.buffer, 4, "f32", [rows])),
             regen.InvalidOperand, "rstd"),
            ("rows overlapping", dict(fwd, x=regen.Operand(x.buffer, 0, "f32", [rows, n], [n - 1, 1])),
             regen.InvalidOperand, "x"),
            ("x past its buffer", dict(fwd, x=regen.Operand(x.buffer, 4, "f32", [rows, n])),
             regen.InvalidOperand, "x"),
            ("a row longer than 65536", dict(fwd, x=long_x.op, y=regen.Operand(long_x.buffer, 0, "f32", [1, 1]),
                                             weight=regen.Operand(long_x.buffer, 0, "f32", [65537]), bias=None,
                                             mean=None, rstd=None),
             regen.InvalidOperand, "x"),
            ("eps 0", dict(fwd, eps=0.0), regen.InvalidParameter, "eps"),
            ("eps negative", dict(fwd, eps=-1e-5), regen.InvalidParameter, "eps"),
        ]
        for what, kwargs, error, name in cases:
            with self.subTest(what):
                before = [t.read() for t in (x, w, b, y, stats)]
                with self.assertRaises(error) as cm:
                    self.c.layer_norm(**kwargs)
                named = cm.exception.parameters.get("operand" if error is regen.InvalidOperand else "parameter")
                self.assertEqual(named, name, cm.exception)
                self.assertEqual([t.read() for t in (x, w, b, y, stats)], before, "nothing written")
        with self.assertRaises(ValueError):
            self.c.layer_norm(x.op, w.op, y.op, eps=float("inf"))
        # The backward's own: its outputs against its inputs, gradients' shapes.
        d_y, d_x, dw = self.tensor([rows, n]), self.tensor([rows, n]), self.tensor([n])
        bwd = dict(d_y=d_y.op, x=x.op, weight=w.op, mean=mean, rstd=rstd, d_x=d_x.op, d_weight=dw.op)
        cases = [
            ("d_x over d_y", dict(bwd, d_x=regen.Operand(d_y.buffer, 0, "f32", [rows, n])), "d_x"),
            ("d_residual overlapping d_x, not it", dict(bwd, d_residual=regen.Operand(d_x.buffer, 4, "f32",
                                                                                      [rows, n])), "d_residual"),
            ("d_weight of another length", dict(bwd, d_weight=regen.Operand(dw.buffer, 0, "f32", [n - 1])),
             "d_weight"),
            ("d_y shaped unlike x", dict(bwd, d_y=regen.Operand(d_y.buffer, 0, "f32", [n, rows])), "d_y"),
            ("d_residual of another dtype", dict(bwd, d_residual=regen.Operand(y.buffer, 0, "f16", [rows, n])),
             "d_residual"),
        ]
        for what, kwargs, name in cases:
            with self.subTest(what):
                before = [t.read() for t in (d_y, d_x, dw, y)]
                with self.assertRaises(regen.InvalidOperand) as cm:
                    self.c.layer_norm_backward(**kwargs)
                self.assertEqual(cm.exception.operand, name, cm.exception.reason)
                self.assertEqual([t.read() for t in (d_y, d_x, dw, y)], before, "nothing written")
        # The lane still serves.
        self.forward(2, 5, "f32")


def f32(v):
    """v rounded to f32, as Python's float."""
    return struct.unpack("f", struct.pack("f", v))[0]


class Fp8(DaemonTest):
    """Client.quantize, transpose_quantize, scale_update and an FP8 gemm on
    either transport: the bytes against regen.reference's codec of the f32
    product, the GEMM against float64 of the dequantized operands, the
    update against Transformer Engine's formula, and a bad scale refused
    by name."""

    def scalar(self, value):
        t = self.tensor([1], fill=False)
        t.write([value])
        return t

    def test_a_forward_and_its_scale_update(self):
        m, n, k, h = 6, 5, 16, 3
        x, w = self.tensor([m, k]), self.tensor([n, k])
        hist = self.tensor([h, 2], fill=False)
        hist.write([0.5, 2.0, 4.0, 1.0, 0.0, 0.25])
        scale = self.tensor([2], fill=False)
        scale.write([1.0, 1.0])
        inv = self.tensor([2], fill=False)
        self.c.scale_update(hist.op, scale.op, hist.op, scale.op, scale_inv=inv.op, margin=1)
        sx, sw = scale.read()
        # max of each column, margin 1: 448 / 2 / amax, in f32.
        self.assertEqual((sx, sw), (f32(224.0 / 4.0), f32(224.0 / 2.0)))
        self.assertEqual(inv.read(), [f32(1.0 / sx), f32(1.0 / sw)])
        # Rolled: row 1 takes row 2, row 2 the old row 0, row 0 zeroed.
        self.assertEqual(hist.read(), [0.0, 0.0, 0.0, 0.25, 0.5, 2.0])
        xq, wq, wt = (self.tensor([m, k], "e4m3", fill=False), self.tensor([n, k], "e4m3", fill=False),
                      self.tensor([k, n], "e4m3", fill=False))
        ax, aw = self.tensor([1], fill=False), self.tensor([1], fill=False)
        self.c.quantize(x.op, regen.Operand(scale.buffer, 0, "f32", [1]), xq.op, amax=ax.op)
        self.c.transpose_quantize(w.op, regen.Operand(scale.buffer, 4, "f32", [1]), wt.op, y=wq.op, amax=aw.op)
        xs, ws = x.read(), w.read()
        self.assertEqual(ax.read(), [max(abs(v) for v in xs)])
        self.assertEqual(aw.read(), [max(abs(v) for v in ws)])
        want_x = [reference.fp8_encode("e4m3", f32(v * sx)) for v in xs]
        self.assertEqual(list(os.pread(xq.fd, xq.nbytes, 0)), want_x)
        wq_bytes = list(os.pread(wq.fd, wq.nbytes, 0))
        wt_bytes = list(os.pread(wt.fd, wt.nbytes, 0))
        self.assertEqual(wt_bytes, [wq_bytes[j * k + i] for i in range(k) for j in range(n)], "y_t is y transposed")
        y = self.tensor([m, n], fill=False)
        ix, iw = regen.Operand(inv.buffer, 0, "f32", [1]), regen.Operand(inv.buffer, 4, "f32", [1])
        self.c.gemm(xq.op, wq.op, y.op, trans_b=True, a_scale=ix, b_scale=iw)
        ref = reference.gemm(xq.read(), wq.read(), m, n, k, trans_b=True,
                             alpha=inv.read()[0] * inv.read()[1])
        self.assertClose(y.read(), ref, "f32", "FP8 GEMM")
        # Against x @ w.T itself: FP8's own error, a few percent.
        exact = reference.gemm(xs, ws, m, n, k, trans_b=True)
        self.assertLess(reference.rel_error(y.read(), exact), 0.1)

    def test_a_bad_scale_is_refused_by_name(self):
        x, y = self.tensor([4, 8]), self.tensor([4, 8], "e4m3", fill=False)
        for bad in (0.0, math.nan, math.inf, -2.0):
            e = outcome_of(self.c.quantize, x.op, self.scalar(bad).op, y.op)
            self.assertIsInstance(e, regen.InvalidOperand, f"scale {bad}")
            self.assertEqual(e.parameters["operand"], "scale")
        e = outcome_of(self.c.quantize, x.op, self.scalar(1.0).op, self.tensor([4, 8], fill=False).op)
        self.assertIsInstance(e, regen.InvalidOperand)
        self.assertEqual(e.parameters["operand"], "y", "an f32 y")
        with self.assertRaises(ValueError):
            self.c.scale_update(x.op, x.op, x.op, x.op, fp8_dtype="e3m4")
        with self.assertRaises(ValueError):
            self.c.scale_update(x.op, x.op, x.op, x.op, margin=math.nan)


class Errors(DaemonTest):
    def test_invalid_operand_shapes(self):
        a, b, d = self.tensor([8, 4]), self.tensor([5, 8]), self.tensor([8, 8], fill=False)
        with self.assertRaises(regen.InvalidOperand) as cm:
            self.c.gemm(a.op, b.op, d.op)
        self.assertEqual(cm.exception.name, "io.regen.InvalidOperand")
        self.assertEqual(cm.exception.operand, "b")
        self.assertIn("K must agree", cm.exception.reason)

    def test_dgelu_refusals(self):
        """Each of dgelu's and gelu_aux's mistakes is InvalidOperand naming
        the operand, and nothing is written: not D, not aux, not aux_out."""
        m, n, k = 8, 6, 4
        a, b = self.tensor([m, k]), self.tensor([k, n])
        d, aux, bias = self.tensor([m, n]), self.tensor([m, n]), self.tensor([n])
        big = self.tensor([4 * m * n])    # D and aux sharing one buffer
        d_in_big = regen.Operand(big.buffer, 0, "f32", [m, n])
        cases = [
            ("dgelu without aux", dict(d=d.op, epilogue="dgelu"), "aux"),
            ("aux without an epilogue", dict(d=d.op, aux=aux.op), "aux"),
            ("aux with gelu", dict(d=d.op, aux=aux.op, epilogue="gelu"), "aux"),
            ("aux with bias", dict(d=d.op, aux=aux.op, bias=bias.op, epilogue="bias"), "aux"),
            ("dgelu with a bias", dict(d=d.op, aux=aux.op, bias=bias.op, epilogue="dgelu"), "bias"),
            ("aux of another shape", dict(d=d.op, aux=regen.Operand(aux.buffer, 0, "f32", [n, m]),
                                          epilogue="dgelu"), "aux"),
            ("aux of another dtype", dict(d=d.op, aux=regen.Operand(aux.buffer, 0, "bf16", [m, n]),
                                          epilogue="dgelu"), "aux"),
            ("aux past its buffer", dict(d=d.op, aux=regen.Operand(aux.buffer, 4, "f32", [m, n]),
                                         epilogue="dgelu"), "aux"),
            ("d overlapping aux", dict(d=d_in_big, aux=regen.Operand(big.buffer, 8, "f32", [m, n]),
                                       epilogue="dgelu"), "d"),
            ("d aliasing aux", dict(d=d_in_big, aux=d_in_big, epilogue="dgelu"), "d"),
            ("gelu_aux without aux_out", dict(d=d.op, epilogue="gelu_aux"), "aux_out"),
            ("aux_out with gelu_bias", dict(d=d.op, aux_out=aux.op, bias=bias.op, epilogue="gelu_bias"), "aux_out"),
            ("aux_out with dgelu", dict(d=d.op, aux=aux.op, aux_out=big.op, epilogue="dgelu"), "aux_out"),
            ("aux_out of another dtype", dict(d=d.op, aux_out=regen.Operand(aux.buffer, 0, "bf16", [m, n]),
                                              epilogue="gelu_aux"), "aux_out"),
            ("aux_out overlapping d", dict(d=d_in_big, aux_out=regen.Operand(big.buffer, 8, "f32", [m, n]),
                                           epilogue="gelu_aux"), "aux_out"),
        ]
        for what, kwargs, operand in cases:
            with self.subTest(what):
                before = [t.read() for t in (d, aux, big)]
                with self.assertRaises(regen.InvalidOperand) as cm:
                    self.c.gemm(a.op, b.op, **kwargs)
                self.assertEqual(cm.exception.operand, operand, cm.exception.reason)
                self.assertEqual([t.read() for t in (d, aux, big)], before, "nothing written")
        with self.assertRaises(ValueError):
            self.c.gemm(a.op, b.op, d.op, aux=aux.op, epilogue="dgelu_bias")
        # The lane still serves.
        self.c.gemm(a.op, b.op, d.op, aux=aux.op, epilogue="dgelu")
        self.assertClose(d.read(), reference.gemm(a.read(), b.read(), m, n, k, epilogue="dgelu", aux=aux.read()),
                         "f32", "dgelu after the refusals")

    def test_invalid_operand_past_the_buffer(self):
        a, b, d = self.square(8)
        with self.assertRaises(regen.InvalidOperand) as cm:
            self.c.gemm(regen.Operand(a.buffer, 64, "f32", [8, 8]), b.op, d.op)
        self.assertEqual(cm.exception.operand, "a")

    def test_stale_after_release(self):
        dev = 1
        a, b, d = self.square(4, dev)
        self.c.gemm(a.op, b.op, d.op)
        gen = self.generation_of(dev)
        reply = self.c.release(dev, reason="python test")
        new = next(x for x in reply["devices"] if x["index"] == dev)["generation"]
        self.assertGreater(new, gen)
        with self.assertRaises(regen.StaleGeneration) as cm:
            self.c.gemm(a.op, b.op, d.op)
        self.assertEqual((cm.exception.device, cm.exception.generation), (dev, new))
        with self.assertRaises(regen.StaleGeneration):
            self.c.close_buffer(a.buffer)
        for t in (a, b, d):
            t.import_into(self.c, dev)
        self.assertEqual(a.buffer.generation, new)
        self.c.gemm(a.op, b.op, d.op)
        self.assertClose(d.read(), reference.gemm(a.read(), b.read(), 4, 4, 4), "f32")

    def test_wrong_endpoint(self):
        a = self.tensor([4, 4])
        worker = self.c.device_info(0)["worker_socket"]
        op = regen.Operand(a.buffer, 0, "f32", [4, 4]).to_wire()
        with self.assertRaises(regen.WrongEndpoint) as cm:
            self.c.call("io.regen.Compute.Gemm", {"a": op, "b": op, "d": op})
        self.assertEqual(cm.exception.socket, worker)
        self.assertEqual(cm.exception.method, "io.regen.Compute.Gemm")
        # The other way round: lifecycle calls are not served on a worker socket.
        with self.assertRaises((regen.WrongEndpoint, regen.MethodNotFound)):
            self.c.call("io.regen.Device.Restart", {}, device=0)

    def test_no_such_object(self):
        gen = self.generation_of(0)
        with self.assertRaises(regen.NoSuchObject) as cm:
            self.c.close_buffer(f"b0.{gen}.999999")
        self.assertEqual(cm.exception.id, f"b0.{gen}.999999")
        a = self.tensor([2, 2])
        self.c.close_buffer(a.buffer)
        with self.assertRaises(regen.NoSuchObject):
            self.c.close_buffer(a.buffer.id)

    def test_no_such_device(self):
        with self.assertRaises(regen.NoSuchDevice):
            self.tensor([2, 2], device=9)
        with self.assertRaises(regen.NoSuchDevice):
            self.c.restart(9)

    def test_import_failed(self):
        t = HostTensor([4])
        self.tensors.append(t)
        with self.assertRaises(regen.ImportFailed) as cm:
            self.c.import_memfd(0, t.fd, 4096)
        self.assertEqual(cm.exception.kind, "host_fd")

    def test_cuda_kinds_and_events_on_the_host_backend(self):
        """The host backend maps no CUDA memory and imports no CUDA events:
        each refusal is the named error a rank can act on."""
        t = self.tensor([64])
        with self.assertRaises(regen.ImportFailed) as cm:
            self.c.import_cuda_fd(0, t.fd, 256)
        self.assertEqual(cm.exception.kind, "cuda_fd")
        with self.assertRaises(regen.ImportFailed) as cm:
            self.c.import_cuda_ipc(0, bytes(64), 0, 256)
        self.assertEqual(cm.exception.kind, "cuda_ipc")
        with self.assertRaises(regen.MethodNotImplemented) as cm:
            self.c.import_event(0, bytes(64))
        self.assertEqual(cm.exception.method, "io.regen.Memory.ImportEvent")

    def test_events_nobody_imported(self):
        gen = self.generation_of(0)
        ghost = f"e0.{gen}.999999"
        with self.assertRaises(regen.NoSuchObject) as cm:
            self.c.close_event(ghost)
        self.assertEqual(cm.exception.id, ghost)
        a, b, d = self.square(4)
        for key in ("wait_event", "signal_event"):
            with self.subTest(event=key), self.assertRaises(regen.NoSuchObject) as cm:
                self.c.gemm(a.op, b.op, d.op, **{key: ghost})
            self.assertEqual(cm.exception.id, ghost)

    def test_invalid_parameter_and_method_not_found(self):
        with self.assertRaises(regen.InvalidParameter) as cm:
            self.c.inject_fault(0, "bogus")
        self.assertEqual(cm.exception.parameter, "kind")
        with self.assertRaises(regen.MethodNotFound):
            self.c.call("io.regen.Device.NoSuchMethod")

    def test_release_takes_no_deadline(self):
        with self.assertRaises(TypeError):
            self.c.release(0, deadline_ms=5)

    @unittest.skipUnless(os.geteuid() == 0, "needs root to call as another user")
    def test_not_permitted(self):
        with Regend(devices=1, extra=["--socket-mode", "0666"]) as other:
            os.chmod(other.dir, 0o755)
            r, w = os.pipe()
            pid = os.fork()
            if pid == 0:
                code = b"?"
                try:
                    os.close(r)
                    os.setgid(65534)
                    os.setgroups([])
                    os.setuid(65534)
                    c = regen.Client(other.socket, timeout=10)
                    c.status()  # anyone may look
                    try:
                        c.restart(0, reason="not allowed")
                        code = b"ran"
                    except regen.NotPermitted as e:
                        code = b"ok" if e.method == "io.regen.Device.Restart" else b"badparam"
                    except regen.Error as e:
                        code = type(e).__name__.encode()
                finally:
                    os.write(w, code)
                    os._exit(0)
            os.close(w)
            got = os.read(r, 64)
            os.close(r)
            os.waitpid(pid, 0)
            self.assertEqual(got, b"ok")


class Connections(DaemonTest):
    def test_a_call_interrupted_before_its_reply_does_not_answer_the_next(self):
        """An exception raised while a call waits for its reply (a signal
        handler's, KeyboardInterrupt) closes the connection: its reply, still
        to come, had answered the next call (an import got the GEMM's
        {elapsed_us}: KeyError 'buffer').  The imports outlive it: the
        client opens its next connection before it closes that one (the
        worker closes a process's objects with its last connection; under
        load the GEMM after failed NoSuchObject in 3 of 9 runs before)."""
        self.c.set_transport("varlink")
        n = 384
        a, b, d = self.square(n)
        self.c.gemm(a.op, b.op, d.op)
        t0 = time.monotonic()
        self.c.gemm(a.op, b.op, d.op)
        took = time.monotonic() - t0

        class Interrupt(Exception):
            pass

        def handler(signum, frame):
            raise Interrupt()
        old = signal.signal(signal.SIGALRM, handler)
        try:
            signal.setitimer(signal.ITIMER_REAL, min(0.02, took / 4))
            with self.assertRaises(Interrupt):
                self.c.gemm(a.op, b.op, d.op)
        finally:
            signal.setitimer(signal.ITIMER_REAL, 0)
            signal.signal(signal.SIGALRM, old)
        e = self.tensor([4, 4])
        self.assertIsInstance(e.buffer, regen.Buffer)
        self.assertIsInstance(self.c.gemm(a.op, b.op, d.op), int)

    def test_calls_with_many_fds_open(self):
        """A process with fds past 1024 open (loaders, NCCL) makes its
        second call as its first: the connection's liveness check used
        select(), which refuses such fds (ValueError)."""
        soft, _ = resource.getrlimit(resource.RLIMIT_NOFILE)
        if soft < 1200:
            self.skipTest(f"RLIMIT_NOFILE {soft}")
        fds = []
        try:
            while not fds or fds[-1] < 1100:
                fds.append(os.open("/dev/null", os.O_RDONLY))
            c = regen.Client(daemon.socket, timeout=60)
            try:
                c.status()
                c.status()
            finally:
                c.close()
        finally:
            for fd in fds:
                os.close(fd)

    def test_a_watch_refused_ends(self):
        """A Watch whose call is answered with an error (past the 64 a uid
        may hold) raises it once, then ends (StopIteration); it had waited
        for ever."""
        watches = []
        try:
            err = None
            for _ in range(70):
                w = self.c.watch()
                watches.append(w)
                try:
                    w.next(timeout=5)
                except regen.LimitExceeded as e:
                    err = e
                    break
            self.assertIsNotNone(err, "no LimitExceeded in 70 Watches")
            with self.assertRaises(StopIteration):
                w.next(timeout=2)
        finally:
            for w in watches:
                w.close()


    def half_closed_replies(self, path, calls):
        """Sends calls (method, parameters) on a raw connection to path,
        shuts its writing side and reads to the end of the stream: the
        replies, decoded."""
        s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            s.settimeout(30)
            s.connect(path)
            s.sendall(b"".join(json.dumps({"method": m, "parameters": p}).encode() + b"\0"
                               for m, p in calls))
            s.shutdown(socket.SHUT_WR)
            data = b""
            while True:
                chunk = s.recv(65536)
                if not chunk:
                    break
                data += chunk
        finally:
            s.close()
        return [json.loads(m) for m in data.split(b"\0") if m]

    def test_a_half_closed_connection_gets_every_reply(self):
        """A client that sends its calls and then shuts its writing side
        (shutdown(SHUT_WR)) gets every reply, then the end of the stream, on
        a worker socket (GEMMs that finish on the lane's thread, after the
        end of the stream was read: their replies had been dropped) as on
        the main socket."""
        n = 96
        a, b, d = self.square(n)
        wire = {"a": a.op.to_wire(), "b": b.op.to_wire(), "d": d.op.to_wire()}
        worker = self.c.device_info(0)["worker_socket"]
        replies = self.half_closed_replies(worker, [("io.regen.Compute.Gemm", wire)] * 3)
        self.assertEqual(len(replies), 3, replies)
        for r in replies:
            self.assertNotIn("error", r)
            self.assertIn("elapsed_us", r["parameters"])
        self.assertClose(d.read(), reference.gemm(a.read(), b.read(), n, n, n), "f32")
        replies = self.half_closed_replies(daemon.socket, [("io.regen.Device.Status", {})] * 2)
        self.assertEqual(len(replies), 2, replies)
        self.assertEqual([0, 1], [dev["index"] for dev in replies[1]["parameters"]["devices"]])


class Jobs(DaemonTest):
    """The job a client states (io.regen.SetJob): Client(job=...),
    $REGEN_JOB and set_job, on the main and the worker connections."""

    def jobs_of(self, device):
        return {(j["job"], j["source"]): j for j in self.c.status()["devices"][device]["jobs"]}

    def test_a_stated_job_names_the_client(self):
        c = regen.Client(daemon.socket, timeout=60, job="py-job")
        try:
            reply = c.restart(1, reason="py")
            self.assertIn(f"by pid {os.getpid()} (stated: py-job): py", reply["devices"][1]["reason"])
            t = HostTensor.random([4, 4], "f32", self.rng)
            t.import_into(c, 0)
            self.tensors.append(t)
            entry = self.jobs_of(0)[("py-job", "client")]
            self.assertEqual((entry["sessions"], entry["buffers"]), (1, 1))
            # Another job: the open worker connection moves with it.
            self.assertEqual(c.set_job("py-job-2"), {"job": "py-job-2", "source": "client"})
            self.assertEqual(self.jobs_of(0)[("py-job-2", "client")]["sessions"], 1)
            self.assertEqual(self.jobs_of(0)[("py-job", "client")]["sessions"], 0)
            self.assertIn("(stated: py-job-2)", c.restart(1)["devices"][1]["reason"])
            self.assertEqual(c.set_job(None), {"job": "", "source": "none"})
            self.assertNotIn("stated", c.restart(1)["devices"][1]["reason"])
        finally:
            c.close()

    def test_regen_job_from_the_environment(self):
        old = os.environ.get("REGEN_JOB")
        os.environ["REGEN_JOB"] = "from-env"
        try:
            c = regen.Client(daemon.socket, timeout=60)
        finally:
            if old is None:
                del os.environ["REGEN_JOB"]
            else:
                os.environ["REGEN_JOB"] = old
        try:
            self.assertEqual(c.job, "from-env")
            self.assertIn("(stated: from-env)", c.restart(1)["devices"][1]["reason"])
        finally:
            c.close()

    def test_a_refused_job_changes_nothing(self):
        c = regen.Client(daemon.socket, timeout=60, job="kept")
        try:
            c.status()
            for bad, reason in (('say "hi"', "character"), ("a\nb", "character"), ("x" * 65, "too long"),
                                ("", "empty")):
                with self.subTest(job=bad), self.assertRaises(regen.InvalidJob) as cm:
                    c.call("io.regen.SetJob", {"job": bad})
                self.assertEqual(cm.exception.reason, reason)
            with self.assertRaises(regen.InvalidJob):
                c.set_job("back\\slash")
            self.assertEqual(c.job, "kept")
            self.assertIn("(stated: kept)", c.restart(1)["devices"][1]["reason"])
        finally:
            c.close()
        # A bad job given to the client fails the call that opens the
        # connection, with the named error.
        c = regen.Client(daemon.socket, timeout=60, job="no spaces")
        try:
            with self.assertRaises(regen.InvalidJob):
                c.status()
        finally:
            c.close()


class _TensorLike:
    """Stands in for a torch tensor, its memory a HostTensor's memfd:
    auto_reimport retries only calls that name torch tensors, and the host
    backend maps memfds where the CUDA one maps IPC handles."""

    _next_ptr = 0

    def __init__(self, host, device):
        self.host = host
        self.shape = tuple(host.shape)
        self.dtype = "torch.float32"
        self.device = type("Device", (), {"index": device})()
        _TensorLike._next_ptr += 1 << 20
        self.ptr = _TensorLike._next_ptr

    def data_ptr(self):
        return self.ptr

    def get_device(self):
        return self.device.index

    def storage_offset(self):
        return 0

    def element_size(self):
        return 4

    def dim(self):
        return len(self.shape)

    def stride(self, dim=None):
        strides = (self.shape[1], 1)
        return strides if dim is None else strides[dim]


class _MemfdTensorClient(regen.Client):
    """Imports a _TensorLike's memfd where import_tensor shares a CUDA
    tensor's storage."""

    def import_tensor(self, tensor, device=None):
        buf = self.import_memfd(tensor.device.index, tensor.host.fd, tensor.host.nbytes)
        tensor_glue.load().imports_of(self).buffers[(tensor.device.index, tensor.data_ptr())] = buf
        return buf


class AutoReimport(unittest.TestCase):
    """auto_reimport on each transport ("varlink lane": the ring not used
    where the transport allows it, as on a machine without one), its
    tensors' generation ended by another client's release, which this
    client does not see until a call tells it."""

    device = 1

    def setUp(self):
        client_mod = tensor_glue.load()
        self.mod = client_mod
        self.saved = (client_mod._sync_torch, client_mod._is_torch_tensor, regen.lane.ring_supported)
        is_tensor = client_mod._is_torch_tensor
        client_mod._sync_torch = lambda tensors: None
        client_mod._is_torch_tensor = lambda x: isinstance(x, _TensorLike) or is_tensor(x)
        self.rng = random.Random(self.id())
        self.hosts = []
        self.other = regen.Client(daemon.socket, timeout=60)

    def tearDown(self):
        self.mod._sync_torch, self.mod._is_torch_tensor, regen.lane.ring_supported = self.saved
        self.other.close()
        for t in self.hosts:
            t.close()

    def client(self, transport):
        regen.lane.ring_supported = self.saved[2]
        if transport == "varlink lane":
            regen.lane.ring_supported = lambda: False
            transport = "auto"
        c = _MemfdTensorClient(daemon.socket, timeout=60, auto_reimport=True, transport=transport)
        self.addCleanup(c.close)
        return c

    def square(self, n):
        """x, y (random) and z, each [n, n] f32."""
        out = []
        for fill in (True, True, False):
            h = HostTensor.random([n, n], "f32", self.rng) if fill else HostTensor([n, n], "f32")
            self.hosts.append(h)
            out.append(_TensorLike(h, self.device))
        return out

    def assertProduct(self, x, y, z):
        n = x.shape[0]
        ref = reference.gemm(x.host.read(), y.host.read(), n, n, n)
        self.assertLessEqual(reference.rel_error(z.host.read(), ref), TOL["f32"])

    def test_a_queued_calls_stale_generation_stays_its_own(self):
        """A call queued with wait=False goes stale; the blocking call after
        it reads its answer.  The blocking call is retried for its own
        StaleGeneration only: the queued call's reaches the caller, at the
        blocking call or at the wait() after it (it had been taken for the
        blocking call's and retried away: the caller saw a success)."""
        for transport in ("ring", "varlink", "varlink lane"):
            if transport == "ring" and not regen.lane.ring_supported():
                continue
            with self.subTest(transport=transport):
                c = self.client(transport)
                x, y, z = self.square(4)
                c.gemm(x, y, z)
                self.other.release(self.device, reason="test_daemon auto_reimport")
                c.gemm(x, y, z, wait=False)
                outcomes = [outcome_of(c.gemm, x, y, z), outcome_of(c.wait, self.device)]
                self.assertEqual(sum(isinstance(o, regen.StaleGeneration) for o in outcomes), 1, outcomes)
                self.assertIsInstance(c.gemm(x, y, z), int)
                self.assertProduct(x, y, z)
                self.assertEqual(c.lane_transport(self.device), "ring" if transport == "ring" else "varlink")

    def test_a_stale_bind_is_retried_as_the_call_was_made(self):
        """On the ring, a call naming ids new to the lane binds them first;
        in a later generation the Bind is refused with StaleGeneration.
        auto_reimport imports the tensors again and retries (it had retried
        with the same ids: the Bind's news had not been noted), and a call
        made with wait=False is retried queued, its ticket returned (the
        retry had waited for its answer)."""
        if not regen.lane.ring_supported():
            self.skipTest("no ring in this process (regen._accel and libregen)")
        c = self.client("ring")
        for wait in (True, False):
            with self.subTest(wait=wait):
                x, y, z = self.square(4)
                for t in (x, y, z):
                    c.import_tensor(t)
                self.other.release(self.device, reason="test_daemon auto_reimport")
                got = c.gemm(x, y, z, wait=wait)
                lane = c._lanes[self.device]
                if not wait:
                    self.assertEqual((got, lane.completed), (lane.submitted, lane.submitted - 1),
                                     "the retry waited for its answer")
                    c.wait(self.device, got)
                self.assertProduct(x, y, z)
                self.assertEqual(c.lane_transport(self.device), "ring")


class QueuedCalls(unittest.TestCase):
    def test_queueing_past_the_lanes_depth_waits_for_the_oldest(self):
        """A GEMM that takes a while, then 1100 small calls queued behind it
        with wait=False: past 256 calls unanswered, a call waits for the
        oldest's answer before it is queued, on Varlink as on the ring (whose
        256 entries bound it).  On Varlink every call had gone out: past the
        1024 unanswered calls regend holds for a connection, the rest were
        refused with LimitExceeded."""
        for transport in ("varlink", "ring"):
            if transport == "ring" and not regen.lane.ring_supported():
                continue
            with self.subTest(transport=transport):
                c = regen.Client(daemon.socket, timeout=60, transport=transport)
                hosts = [HostTensor([1024, 1024]) for _ in range(3)] + [HostTensor([2, 2]) for _ in range(3)]
                try:
                    for t in hosts:
                        t.import_into(c, 0)
                    big, small = [t.op for t in hosts[:3]], [t.op for t in hosts[3:]]
                    c.gemm(*big, wait=False)
                    depth = 0
                    for _ in range(1100):
                        c.gemm(*small, wait=False)
                        lane = c._lanes[0]
                        depth = max(depth, lane.submitted - lane.completed)
                    c.wait(0)
                    self.assertLessEqual(depth, 256)
                    self.assertEqual(c.lane_transport(0), transport)
                finally:
                    c.close()
                    for t in hosts:
                        t.close()


class Lifecycle(DaemonTest):
    def test_watch_sees_restart(self):
        dev = 1
        with self.c.watch() as w:
            first = w.next(timeout=10)
            self.assertEqual(first["reason"], "subscribed")
            gen = self.generation_of(dev)
            reply = self.c.restart(dev, reason="watch test", deadline_ms=2000)
            self.assertIn("elapsed_us", reply)
            deadline = time.monotonic() + 10
            while True:
                ev = w.next(timeout=max(0.01, deadline - time.monotonic()))
                if ev["device"] == dev and ev["generation"] > gen:
                    break
            self.assertEqual(ev["generation"], gen + 1)
            self.assertEqual(ev["state"], "ready")
            self.assertIn("watch test", ev["reason"])
            self.assertGreater(ev["epoch"], first["epoch"])
        self.assertEqual(self.generation_of(dev), gen + 1)

    def test_watch_timeout_keeps_watching(self):
        with self.c.watch() as w:
            w.next(timeout=10)
            # Drain the other devices' "subscribed" events, then time out.
            with self.assertRaises(TimeoutError):
                while True:
                    w.next(timeout=0.2)
            self.c.reset(0, reason="after a timeout")
            ev = w.next(timeout=10)
            self.assertEqual(ev["device"], 0)

    def test_reconnect_after_worker_crash(self):
        a, b, d = self.square(8)
        self.c.gemm(a.op, b.op, d.op)
        before = self.c.device_info(0)
        self.c.inject_fault(0, "crash")
        # Wait for the supervisor to respawn the worker.
        deadline = time.monotonic() + 20
        while True:
            info = self.c.device_info(0)
            if info["worker_pid"] != before["worker_pid"] and info["state"] == "ready":
                break
            self.assertLess(time.monotonic(), deadline, f"no respawn: {info}")
            time.sleep(0.02)
        self.assertEqual(info["respawns"], before["respawns"] + 1)
        self.assertGreater(info["generation"], before["generation"])
        # The idle connection to the dead worker is noticed before the next
        # call goes out: it reconnects to the new worker, which knows the
        # ids are from an older generation ...
        with self.assertRaises(regen.StaleGeneration) as cm:
            self.c.gemm(a.op, b.op, d.op)
        self.assertEqual(cm.exception.generation, info["generation"])
        # ... and after importing again, work goes on.
        self.assertServesAgain(a, b, d, 0)

    def test_a_call_past_its_deadline_times_out(self):
        """deadline_ms on a compute call, on the run's transport: a GEMM
        behind a hung device is answered with Timeout once its caller's
        deadline passed; the device counts as hung only at regend's own
        deadline (--call-deadline-ms, 1.5 s here) and comes back in a new
        generation."""
        with Regend(devices=1, extra=["--call-deadline-ms", "1500"]) as own:
            main, self.c = self.c, regen.Client(own.socket, timeout=30)
            try:
                dev = 0
                a, b, d = self.square(8, dev)
                self.c.gemm(a.op, b.op, d.op, deadline_ms=5000)
                gen = self.generation_of(dev)
                self.c.inject_fault(dev, "hang")
                t = time.monotonic()
                with self.assertRaises(regen.Timeout) as cm:
                    self.c.gemm(a.op, b.op, d.op, deadline_ms=300)
                self.assertLess(time.monotonic() - t, 1.2, "the Timeout came long after the deadline")
                self.assertEqual(cm.exception.parameters.get("device"), dev)
                self.assertGreaterEqual(cm.exception.parameters.get("elapsed_ms"), 300)
                self.assertEqual(self.generation_of(dev), gen, "the caller's deadline reset the device")
                deadline = time.monotonic() + 20
                while self.generation_of(dev) <= gen:
                    self.assertLess(time.monotonic(), deadline, "no new generation after regend's deadline")
                    time.sleep(0.05)
                self.assertGreaterEqual(time.monotonic() - t, 1.4, "the device was reset before regend's deadline")
                # The hung call's lane may still hold the old worker: a call either
                # reconnects or fails with StaleGeneration, then works after import.
                outcome_of(self.c.gemm, a.op, b.op, d.op)
                deadline = time.monotonic() + 20
                while True:
                    try:
                        self.assertServesAgain(a, b, d, dev)
                        break
                    except (regen.ConnectionReset, regen.Unavailable, regen.Draining, regen.StaleGeneration):
                        self.assertLess(time.monotonic(), deadline)
                        time.sleep(0.05)
            finally:
                self.c.close()
                self.c = main

    def test_a_callers_short_deadline_is_its_own(self):
        """Any client may name deadline_ms 1: a GEMM that runs longer is
        answered Timeout, and that is all.  The device is not declared hung
        (which cost every client its objects: a respawn and a new
        generation); the next call on the same lane runs after it, right."""
        n = 384
        a, b, d = self.square(n)
        gen, pid = self.generation_of(0), self.c.device_info(0)["worker_pid"]
        with self.assertRaises(regen.Timeout):
            self.c.gemm(a.op, b.op, d.op, deadline_ms=1)
        time.sleep(0.3)
        self.assertEqual(self.generation_of(0), gen, "a client's deadline of 1 ms bumped the generation")
        self.assertEqual(self.c.device_info(0)["worker_pid"], pid, "a client's deadline of 1 ms respawned the worker")
        self.c.gemm(a.op, b.op, d.op)
        rows = 8   # enough to tell; the pure-Python reference of all of it takes seconds
        self.assertClose(d.read()[:rows * n], reference.gemm(a.read()[:rows * n], b.read(), rows, n, n), "f32")

    def test_bad_deadlines_are_refused_by_name(self):
        a, b, d = self.square(4)
        for bad in (0, 86_400_001, 2 ** 40, "1", 1.5, True):
            with self.subTest(deadline_ms=bad):
                with self.assertRaises(regen.InvalidParameter) as cm:
                    self.c.gemm(a.op, b.op, d.op, deadline_ms=bad)
                self.assertEqual(cm.exception.parameters.get("parameter"), "deadline_ms")
        self.c.gemm(a.op, b.op, d.op, deadline_ms=86_400_000)
        self.assertClose(d.read(), reference.gemm(a.read(), b.read(), 4, 4, 4), "f32")

    def test_call_in_flight_when_worker_crashes(self):
        """A call hangs in the worker; the worker crashes: that call raises
        ConnectionReset, the next one reconnects."""
        dev = 1
        a, b, d = self.square(8, dev)
        gen = self.generation_of(dev)
        self.c.inject_fault(dev, "hang")
        outcome = {}

        def in_flight():
            with regen.Client(daemon.socket, timeout=60) as c2:
                outcome["first"] = outcome_of(c2.gemm, a.op, b.op, d.op)
                outcome["second"] = outcome_of(c2.gemm, a.op, b.op, d.op)

        t = threading.Thread(target=in_flight)
        t.start()
        time.sleep(0.3)
        self.c.inject_fault(dev, "crash")
        t.join(60)
        self.assertIsInstance(outcome.get("first"), regen.ConnectionReset, repr(outcome))
        self.assertIsInstance(outcome.get("second"), regen.StaleGeneration, repr(outcome))
        self.assertGreater(outcome["second"].generation, gen)
        self.assertServesAgain(a, b, d, dev)

    def test_device_lost(self):
        a, b, d = self.square(8)
        gen = self.generation_of(0)
        self.c.inject_fault(0, "device_lost")
        # Calls fail with DeviceLost while the worker resets, then with
        # StaleGeneration once it serves the next generation.
        deadline = time.monotonic() + 20
        seen = []
        while True:
            try:
                self.c.gemm(a.op, b.op, d.op)
                self.fail(f"GEMM on generation-{gen} ids succeeded after device_lost")
            except (regen.DeviceLost, regen.Draining) as e:
                seen.append(type(e).__name__)
                self.assertEqual(e.name, "io.regen." + type(e).__name__)
                time.sleep(0.01)
            except regen.StaleGeneration as e:
                self.assertGreater(e.generation, gen)
                break
            self.assertLess(time.monotonic(), deadline)
        self.assertServesAgain(a, b, d, 0)
        self.assertIn("device_lost", self.c.device_info(0)["reason"])

    def test_draining_during_a_stuck_restart(self):
        """A call hangs; a restart drains past its deadline; meanwhile new
        work is refused with Draining; then the device serves again."""
        dev = 1
        a, b, d = self.square(4, dev)
        self.c.inject_fault(dev, "hang")
        results = {}

        def stuck():
            with regen.Client(daemon.socket, timeout=60) as c2:
                results["stuck"] = outcome_of(c2.gemm, a.op, b.op, d.op)

        def restart():
            with regen.Client(daemon.socket, timeout=60) as c3:
                results["restart"] = outcome_of(c3.restart, dev, reason="stuck", deadline_ms=300)

        t1 = threading.Thread(target=stuck)
        t1.start()
        time.sleep(0.2)
        t2 = threading.Thread(target=restart)
        t2.start()
        time.sleep(0.1)  # let the drain begin
        refused = None
        deadline = time.monotonic() + 5
        while t2.is_alive() and time.monotonic() < deadline and refused is None:
            try:
                self.c.gemm(a.op, b.op, d.op)
            except regen.Error as e:
                refused = e
            time.sleep(0.01)
        t2.join(60)
        t1.join(60)
        self.assertIsInstance(results.get("restart"), dict, f"restart: {results.get('restart')!r}")
        self.assertIsNotNone(refused, "no call was refused while the restart drained")
        self.assertIsInstance(refused, regen.Draining, repr(refused))
        self.assertEqual(refused.device, dev)
        self.assertIn("stuck", results)
        # Whatever happened to the worker, the device serves again.
        self.assertServesAgain(a, b, d, dev)


if __name__ == "__main__":
    unittest.main()
