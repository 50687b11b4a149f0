# SPDX-License-Identifier: Apache-2.0
"""Float64 references in pure Python (small shapes only) and error norms,
for checking regend's results without numpy or torch."""

import bisect
import math

__all__ = ["gemm", "attention", "attention_backward", "layer_norm", "layer_norm_backward", "gelu_tanh", "dgelu_tanh",
           "rel_error", "max_error", "fp8_decode", "fp8_encode", "FP8_MAX"]


def gelu_tanh(x):
    """The tanh approximation of GELU, as cuBLASLt's epilogue computes it."""
    return 0.5 * x * (1.0 + math.tanh(math.sqrt(2.0 / math.pi) * (x + 0.044715 * x * x * x)))


def dgelu_tanh(x):
    """The derivative of gelu_tanh (torch's gelu_backward(1, x, approximate="tanh"))."""
    c = math.sqrt(2.0 / math.pi)
    t = math.tanh(c * (x + 0.044715 * x * x * x))
    return 0.5 * (1.0 + t) + 0.5 * x * (1.0 - t * t) * c * (1.0 + 3.0 * 0.044715 * x * x)


def gemm(a, b, m, n, k, trans_a=False, trans_b=False, alpha=1.0, beta=0.0, c=None, bias=None,
         epilogue=None, aux=None, pre=None):
    """D = alpha op(A) op(B) + beta C (+ bias, GELU), all flat row-major lists;
    with epilogue "dgelu", (alpha op(A) op(B) + beta C) * dgelu_tanh(aux).
    A is stored [m, k] ([k, m] when trans_a), B [k, n] ([n, k] when trans_b).
    ``pre``, a list of m * n, receives each value before GELU (what
    "gelu_aux" and "gelu_aux_bias" write to aux_out)."""
    out = [0.0] * (m * n)
    gelu = epilogue in ("gelu", "gelu_bias", "gelu_aux", "gelu_aux_bias")
    add_bias = bias is not None and epilogue in ("bias", "gelu_bias", "gelu_aux_bias")
    for i in range(m):
        arow = [a[p * m + i] if trans_a else a[i * k + p] for p in range(k)]
        for j in range(n):
            if trans_b:
                s = math.fsum(arow[p] * b[j * k + p] for p in range(k))
            else:
                s = math.fsum(arow[p] * b[p * n + j] for p in range(k))
            v = alpha * s
            if c is not None and beta != 0.0:
                v += beta * c[i * n + j]
            if add_bias:
                v += bias[j]
            if pre is not None:
                pre[i * n + j] = v
            if epilogue == "dgelu":
                v *= dgelu_tanh(aux[i * n + j])
            out[i * n + j] = gelu_tanh(v) if gelu else v
    return out


def _rows(x, bh, s, d):
    return [[x[(g * s + i) * d:(g * s + i + 1) * d] for i in range(s)] for g in range(bh)]


def _exp_scores(q_row, keys, scale, last):
    """(e, sum of e, max score): e[j] = exp(score_j - max) for the scaled
    scores of q_row against keys 0..last."""
    scores = [scale * math.fsum(x * y for x, y in zip(q_row, keys[j])) for j in range(last + 1)]
    mx = max(scores)
    e = [math.exp(s - mx) for s in scores]
    return e, math.fsum(e), mx


def _last_key(i, sq, skv, causal, alignment):
    """The last key query row i sees (-1: none)."""
    if not causal:
        return skv - 1
    diagonal = i + (skv - sq if alignment == "bottom_right" else 0)
    return min(diagonal, skv - 1)


def _lengths(g, h, sq, skv, seq_len_q, seq_len_kv):
    """The (queries, keys) of query group g's batch entry."""
    b = g // h
    return (sq if seq_len_q is None else seq_len_q[b]), (skv if seq_len_kv is None else seq_len_kv[b])


def _kv(g, h, hkv):
    """The k/v row group (batch * Hkv + kv head) of query group g (batch * H + head)."""
    b, head = divmod(g, h)
    return b * hkv + head // (h // hkv)


def attention(q, k, v, b, h, sq, skv, d, dv, scale=None, causal=False, hkv=None, alignment="top_left",
              seq_len_q=None, seq_len_kv=None):
    """(o, lse): o [b, h, sq, dv] flat, lse [b, h, sq] (natural log of the
    sum of exp of the scaled scores). k and v are [b, hkv, skv, *]: query
    head j reads k/v head j // (h // hkv). With seq_len_q and seq_len_kv
    (lists of b), entry n's queries are its first seq_len_q[n] rows and its
    keys its first seq_len_kv[n]; a row past them (or seeing no key) is o 0,
    lse -inf."""
    scale = 1.0 / math.sqrt(d) if scale is None else scale
    hkv = h if hkv is None else hkv
    Q, K, V = _rows(q, b * h, sq, d), _rows(k, b * hkv, skv, d), _rows(v, b * hkv, skv, dv)
    o, lse = [], []
    for g in range(b * h):
        kg = _kv(g, h, hkv)
        lq, lkv = _lengths(g, h, sq, skv, seq_len_q, seq_len_kv)
        for i in range(sq):
            last = _last_key(i, lq, lkv, causal, alignment) if i < lq else -1
            if last < 0:
                lse.append(-math.inf)
                o.extend([0.0] * dv)
                continue
            e, z, mx = _exp_scores(Q[g][i], K[kg], scale, last)
            lse.append(mx + math.log(z))
            for t in range(dv):
                o.append(math.fsum(e[j] * V[kg][j][t] for j in range(last + 1)) / z)
    return o, lse


def attention_backward(q, k, v, d_o, b, h, sq, skv, d, dv, scale=None, causal=False, hkv=None,
                       alignment="top_left", seq_len_q=None, seq_len_kv=None):
    """(d_q, d_k, d_v) of attention, flat, by the textbook formulas; d_k and
    d_v of a shared k/v head sum over its query heads. Lengths as in
    attention(): padding rows' gradients are 0."""
    scale = 1.0 / math.sqrt(d) if scale is None else scale
    hkv = h if hkv is None else hkv
    Q, K, V = _rows(q, b * h, sq, d), _rows(k, b * hkv, skv, d), _rows(v, b * hkv, skv, dv)
    dO = _rows(d_o, b * h, sq, dv)
    dq = [0.0] * (b * h * sq * d)
    dk = [0.0] * (b * hkv * skv * d)
    dvv = [0.0] * (b * hkv * skv * dv)
    for g in range(b * h):
        kg = _kv(g, h, hkv)
        lq, lkv = _lengths(g, h, sq, skv, seq_len_q, seq_len_kv)
        for i in range(sq):
            last = _last_key(i, lq, lkv, causal, alignment) if i < lq else -1
            if last < 0:
                continue
            e, z, _ = _exp_scores(Q[g][i], K[kg], scale, last)
            p = [x / z for x in e]
            dp = [math.fsum(dO[g][i][t] * V[kg][j][t] for t in range(dv)) for j in range(last + 1)]
            row = math.fsum(pj * dpj for pj, dpj in zip(p, dp))
            ds = [pj * (dpj - row) for pj, dpj in zip(p, dp)]
            for j in range(last + 1):
                for t in range(dv):
                    dvv[(kg * skv + j) * dv + t] += p[j] * dO[g][i][t]
                for t in range(d):
                    dq[(g * sq + i) * d + t] += scale * ds[j] * K[kg][j][t]
                    dk[(kg * skv + j) * d + t] += scale * ds[j] * Q[g][i][t]
    return dq, dk, dvv


def layer_norm(x, weight, rows, n, bias=None, eps=1e-5):
    """(y, mean, rstd) of LayerNorm over the rows of x [rows, n] (flat,
    row-major): y = (x - mean) * rstd * weight + bias, the biased variance,
    rstd = 1 / sqrt(variance + eps)."""
    y, mean, rstd = [], [], []
    for i in range(rows):
        row = x[i * n:(i + 1) * n]
        mu = math.fsum(row) / n
        var = math.fsum((v - mu) ** 2 for v in row) / n
        rs = 1.0 / math.sqrt(var + eps)
        mean.append(mu)
        rstd.append(rs)
        y.extend((v - mu) * rs * weight[j] + (bias[j] if bias is not None else 0.0) for j, v in enumerate(row))
    return y, mean, rstd


def layer_norm_backward(d_y, x, weight, mean, rstd, rows, n, d_residual=None):
    """(d_x, d_weight, d_bias) of LayerNorm, flat, from the statistics given
    (the forward's): with xhat = (x - mean) * rstd and g = d_y * weight,
    d_x = rstd * (g - mean(g) - xhat * mean(g * xhat)) (+ d_residual)."""
    d_x, d_weight, d_bias = [], [0.0] * n, [0.0] * n
    for i in range(rows):
        dy = d_y[i * n:(i + 1) * n]
        xhat = [(v - mean[i]) * rstd[i] for v in x[i * n:(i + 1) * n]]
        g = [dy[j] * weight[j] for j in range(n)]
        mean_g = math.fsum(g) / n
        mean_gx = math.fsum(a * b for a, b in zip(g, xhat)) / n
        for j in range(n):
            r = d_residual[i * n + j] if d_residual is not None else 0.0
            d_x.append(rstd[i] * (g[j] - mean_g - xhat[j] * mean_gx) + r)
            d_weight[j] += dy[j] * xhat[j]
            d_bias[j] += dy[j]
    return d_x, d_weight, d_bias


# FP8 (OCP's E4M3 "fn": no infinities, NaN 0x7f/0xff; E5M2: IEEE-like),
# written from the formats' fields, apart from regend's codecs.
FP8_MAX = {"e4m3": 448.0, "e5m2": 57344.0}
_FP8_FIELDS = {"e4m3": (4, 3, 7), "e5m2": (5, 2, 15)}


def fp8_decode(dtype, code):
    """The value of FP8 byte ``code`` of ``dtype`` ("e4m3", "e5m2")."""
    e_bits, m_bits, bias = _FP8_FIELDS[dtype]
    sign = -1.0 if code & 0x80 else 1.0
    e, m = (code >> m_bits) & ((1 << e_bits) - 1), code & ((1 << m_bits) - 1)
    if dtype == "e4m3" and e == 15 and m == 7:
        return math.nan
    if dtype == "e5m2" and e == 31:
        return sign * math.inf if m == 0 else math.nan
    if e == 0:
        return sign * m * 2.0 ** (1 - bias - m_bits)
    return sign * (1 + m / 2.0 ** m_bits) * 2.0 ** (e - bias)


_FP8_POSITIVE = {dt: [fp8_decode(dt, c) for c in range(0x7f if dt == "e4m3" else 0x7c)] for dt in _FP8_FIELDS}


def fp8_encode(dtype, value):
    """The byte ``value`` rounds to: nearest, ties to the even code,
    saturated to the largest finite value (infinities too), NaN the
    canonical 0x7f with its sign: torch's float8 training casts
    (``x.clamp(-max, max).to(float8)``) and cuda_fp8.h's __NV_SATFINITE."""
    sign = 0x80 if math.copysign(1.0, value) < 0 else 0
    if math.isnan(value):
        return sign | 0x7f
    values = _FP8_POSITIVE[dtype]
    a = abs(value)
    if a >= values[-1]:
        return sign | (len(values) - 1)
    hi = bisect.bisect_left(values, a)
    if values[hi] == a:
        return sign | hi
    below, above = a - values[hi - 1], values[hi] - a
    code = hi - 1 if below < above or (below == above and (hi - 1) % 2 == 0) else hi
    return sign | code


def rel_error(out, ref):
    """||out - ref||_2 / ||ref||_2."""
    num = math.sqrt(math.fsum((float(x) - y) ** 2 for x, y in zip(out, ref)))
    den = math.sqrt(math.fsum(y * y for y in ref))
    return num / den if den else num


def max_error(out, ref):
    """max |out - ref| / max |ref|: the worst element against the scale of the result."""
    worst = max((abs(float(x) - y) for x, y in zip(out, ref)), default=0.0)
    scale = max((abs(y) for y in ref), default=0.0)
    return worst / scale if scale else worst
