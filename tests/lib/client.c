/* SPDX-License-Identifier: Apache-2.0 */
/* Tests through libregen; see client.h. */
#include <errno.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include "tests/lib/client.h"
#include "tests/lib/dtype.h"
#include "tests/lib/rand.h"
#include "tests/lib/reference.h"

/* libregen's element types and epilogues are proto's, value for value. */
_Static_assert((int)REGEN_F32 == (int)RP_DTYPE_F32 && (int)REGEN_F16 == (int)RP_DTYPE_F16 &&
	       (int)REGEN_BF16 == (int)RP_DTYPE_BF16, "regen_dtype and rp_dtype differ");
_Static_assert((int)REGEN_EPILOGUE_BIAS == (int)RP_EPILOGUE_BIAS && (int)REGEN_EPILOGUE_GELU == (int)RP_EPILOGUE_GELU &&
	       (int)REGEN_EPILOGUE_GELU_BIAS == (int)RP_EPILOGUE_GELU_BIAS &&
	       (int)REGEN_EPILOGUE_DGELU == (int)RP_EPILOGUE_DGELU &&
	       (int)REGEN_EPILOGUE_GELU_AUX_BIAS == (int)RP_EPILOGUE_GELU_AUX_BIAS, "regen_epilogue and rp_epilogue differ");

static enum rp_dtype rp(enum regen_dtype dt)
{
	return (enum rp_dtype)dt;
}

void tl_fail_regen(const char *file, int line, const char *expr, regen_client *c, int r, const char *fmt, ...)
{
	const char *name = c != NULL ? regen_client_error_name(c) : NULL;
	const char *msg = c != NULL ? regen_client_error_message(c) : NULL;
	char what[2048];
	va_list ap;

	snprintf(what, sizeof(what), "%s (= %d, %s%s%s%s%s)", expr, r, r < 0 ? strerror(-r) : "no error",
		 name ? ": " : "", name ? name : "", msg ? " " : "", msg ? msg : "");
	va_start(ap, fmt);
	tl_failv(file, line, what, fmt, ap);
}

void tl_check_transport(regen_client *c, int device)
{
	const char *want = getenv("REGEN_TRANSPORT");
	enum regen_transport t = regen_client_transport(c, device);

	if (want && strcmp(want, "ring") == 0)
		ASSERT_EQ(t, REGEN_TRANSPORT_RING, "REGEN_TRANSPORT=ring but device %d's lane uses %d", device, (int)t);
	else if (want && strcmp(want, "varlink") == 0)
		ASSERT_EQ(t, REGEN_TRANSPORT_VARLINK, "REGEN_TRANSPORT=varlink but device %d's lane uses %d", device,
			  (int)t);
}

regen_client *tl_client_connect(const struct tl_daemon *d)
{
	regen_client *c = NULL;

	ASSERT_OK(regen_client_connect(d->sock, &c), "connect to %s", d->sock);
	regen_client_set_timeout(c, 30);
	return c;
}

regen_status *tl_status(regen_client *c)
{
	regen_status *st = NULL;

	ASSERT_REGEN_OK(c, regen_status_get(c, &st));
	return st;
}

const struct regen_device_info *tl_status_device(const regen_status *st, int index)
{
	const struct regen_device_info *d = regen_status_find_device(st, index);

	ASSERT_NOT_NULL(d, "Status lists no device %d", index);
	ASSERT_UINT_GE(d->size, sizeof(*d), "device info smaller than this header's");
	return d;
}

uint64_t tl_wait_generation(regen_client *c, int device, uint64_t after, double timeout_s)
{
	double deadline = tl_now() + tl_timeout(timeout_s);
	const struct regen_device_info *d;
	regen_status *st = NULL;
	uint64_t generation;
	int r;

	for (;;) {
		r = regen_status_get(c, &st);
		if (r == 0) {
			d = regen_status_find_device(st, device);
			if (d != NULL && d->generation > after && strcmp(d->state, "ready") == 0) {
				generation = d->generation;
				regen_status_free(st);
				return generation;
			}
			regen_status_free(st);
		} else if (r != -ECONNRESET) {
			ASSERT_REGEN_OK(c, r);
		}
		ASSERT(tl_now() < deadline, "device %d not ready in a generation > %llu after %.0f s", device,
		       (unsigned long long)after, tl_timeout(timeout_s));
		usleep(20000);
	}
}

/* Buffers. */

void tl_buffer_alloc(size_t size, struct tl_buffer *b)
{
	tl_memfd_create(&b->mem, size);
	b->buf = NULL;
}

int tl_buffer_import(regen_client *c, int device, struct tl_buffer *b)
{
	if (b->buf != NULL) {
		regen_buffer_close(b->buf);
		b->buf = NULL;
	}
	return regen_buffer_import_fd(c, device, b->mem.fd, b->mem.size, &b->buf);
}

void tl_buffer_create(regen_client *c, int device, size_t size, struct tl_buffer *b)
{
	tl_buffer_alloc(size, b);
	ASSERT_REGEN_OK(c, tl_buffer_import(c, device, b));
}

void tl_buffer_free(struct tl_buffer *b)
{
	if (b->buf != NULL) {
		regen_buffer_close(b->buf);
	}
	tl_memfd_destroy(&b->mem);
	b->buf = NULL;
}

/* GEMM. */

static size_t align64(size_t x)
{
	return (x + 63) & ~(size_t)63;
}

struct gemm_layout {
	int a_rows, a_cols, b_rows, b_cols;
	int lda, ldb, ldc;
	size_t off_a, off_b, off_c, off_d, off_bias, off_aux, total;
};

static void gemm_layout(const struct tl_gemm_case *gc, struct gemm_layout *l)
{
	size_t ein = rp_dtype_size(rp(gc->in)), eout = rp_dtype_size(rp(gc->out));

	l->a_rows = gc->trans_a ? gc->k : gc->m;
	l->a_cols = gc->trans_a ? gc->m : gc->k;
	l->b_rows = gc->trans_b ? gc->n : gc->k;
	l->b_cols = gc->trans_b ? gc->k : gc->n;
	l->lda = l->a_cols + gc->pad;
	l->ldb = l->b_cols + gc->pad;
	l->ldc = gc->n + gc->pad;
	l->off_a = 0;
	l->off_b = align64(l->off_a + (size_t)l->a_rows * (size_t)l->lda * ein);
	l->off_c = align64(l->off_b + (size_t)l->b_rows * (size_t)l->ldb * ein);
	l->off_d = align64(l->off_c + (size_t)gc->m * (size_t)l->ldc * eout);
	l->off_bias = align64(l->off_d + (size_t)gc->m * (size_t)l->ldc * eout);
	/* aux only for dgelu and aux_out for gelu_aux(_bias) (the same
	 * place), so that other cases' sizes stay as they were. */
	l->off_aux = align64(l->off_bias + (size_t)gc->n * eout);
	l->total = gc->epilogue >= REGEN_EPILOGUE_DGELU ? align64(l->off_aux + (size_t)gc->m * (size_t)l->ldc * eout)
							: l->off_aux;
}

size_t tl_gemm_bytes(const struct tl_gemm_case *gc)
{
	struct gemm_layout l;

	gemm_layout(gc, &l);
	return l.total;
}

void tl_gemm_random_case(struct tl_gemm_case *gc, int max_dim)
{
	static const enum regen_dtype dts[] = { REGEN_F32, REGEN_F16, REGEN_BF16 };

	memset(gc, 0, sizeof(*gc));
	gc->in = dts[tl_rand_int(0, 2)];
	gc->out = tl_rand_int(0, 3) == 0 ? REGEN_F32 : gc->in;
	gc->m = tl_rand_int(1, max_dim);
	gc->n = tl_rand_int(1, max_dim);
	gc->k = tl_rand_int(1, max_dim);
	gc->trans_a = tl_rand_int(0, 1);
	gc->trans_b = tl_rand_int(0, 1);
	gc->alpha = tl_rand_int(0, 1) ? 1.0 : tl_rand_uniform(-2, 2);
	gc->with_c = tl_rand_int(0, 1);
	gc->beta = gc->with_c ? tl_rand_uniform(-1.5, 1.5) : 0;
	gc->pad = tl_rand_int(0, 2) == 0 ? tl_rand_int(1, 5) : 0;
}

void tl_gemm_ok_at(const char *file, int line, regen_client *c, struct tl_buffer *b, const char *what)
{
	struct tl_gemm_case gc;
	char why[512] = "";
	int r;

	tl_gemm_random_case(&gc, 24);
	r = tl_gemm_run(c, b, 0, &gc, why, sizeof(why));
	if (r < 0) {
		tl_fail_regen(file, line, what, c, r, "");
	}
	if (r > 0) {
		tl_fail(file, line, what, "wrong result: %s", why);
	}
}

void tl_gemm_describe(const struct tl_gemm_case *gc, char *buf, size_t size)
{
	static const char *const ep[] = { "none", "bias", "gelu", "gelu_bias", "dgelu", "gelu_aux", "gelu_aux_bias" };

	snprintf(buf, size, "gemm %s->%s m=%d n=%d k=%d ta=%d tb=%d alpha=%g beta=%g c=%d bias=%d epilogue=%s pad=%d",
		 rp_dtype_name(rp(gc->in)), rp_dtype_name(rp(gc->out)), gc->m, gc->n, gc->k, gc->trans_a, gc->trans_b,
		 gc->alpha, gc->beta, gc->with_c, gc->with_bias, ep[gc->epilogue], gc->pad);
}

static void tensor2(struct regen_tensor *t, regen_buffer *b, uint64_t offset, enum regen_dtype dt, int rows, int cols,
		    int ld)
{
	memset(t, 0, sizeof(*t));
	t->buffer = b;
	t->offset = offset;
	t->dtype = dt;
	t->rank = 2;
	t->shape[0] = rows;
	t->shape[1] = cols;
	if (ld != cols) {
		t->strides[0] = ld;
		t->strides[1] = 1;
	}
}

/* Random values into a rows x ld matrix at p (its padding columns too, with
 * pad_value when that is not NaN, so that nothing stale is read), the
 * values inside [rows, cols] as stored to out. */
static void fill_matrix(enum regen_dtype dt, unsigned char *p, int rows, int cols, int ld, double pad_value,
			double *out)
{
	for (int i = 0; i < rows; i++) {
		for (int j = 0; j < ld; j++) {
			double v = tl_store(rp(dt), p, (size_t)i * (size_t)ld + (size_t)j,
					    j < cols || isnan(pad_value) ? tl_rand_uniform(-1, 1) : pad_value);

			if (j < cols) {
				out[(size_t)i * (size_t)cols + (size_t)j] = v;
			}
		}
	}
}

int tl_gemm_run(regen_client *c, struct tl_buffer *b, uint64_t base, const struct tl_gemm_case *gc, char *why,
		size_t why_size)
{
	const bool use_bias = gc->with_bias || gc->epilogue == REGEN_EPILOGUE_BIAS ||
			      gc->epilogue == REGEN_EPILOGUE_GELU_BIAS || gc->epilogue == REGEN_EPILOGUE_GELU_AUX_BIAS;
	const bool use_aux = gc->epilogue == REGEN_EPILOGUE_DGELU;
	const bool use_aux_out = gc->epilogue == REGEN_EPILOGUE_GELU_AUX || gc->epilogue == REGEN_EPILOGUE_GELU_AUX_BIAS;
	const size_t mn = (size_t)gc->m * (size_t)gc->n;
	unsigned char *p = b->mem.ptr + base;
	struct regen_gemm_args args;
	struct regen_tensor tc, tbias, taux;
	struct gemm_layout l;
	double *a, *bm, *cv, *bias, *aux, *ref, *mag, *got, *pre, *pre_mag;
	int r;

	gemm_layout(gc, &l);
	ASSERT_UINT_LE(base + l.total, b->mem.size, "the gemm case needs %zu bytes at %llu", l.total,
		       (unsigned long long)base);
	a = malloc(sizeof(double) * ((size_t)gc->m * (size_t)gc->k + 1));
	bm = malloc(sizeof(double) * ((size_t)gc->k * (size_t)gc->n + 1));
	cv = malloc(sizeof(double) * (mn + 1));
	bias = malloc(sizeof(double) * ((size_t)gc->n + 1));
	aux = malloc(sizeof(double) * (mn + 1));
	ref = malloc(sizeof(double) * (mn + 1));
	mag = malloc(sizeof(double) * (mn + 1));
	got = malloc(sizeof(double) * (mn + 1));
	pre = malloc(sizeof(double) * (mn + 1));
	pre_mag = malloc(sizeof(double) * (mn + 1));
	ASSERT(a && bm && cv && bias && aux && ref && mag && got && pre && pre_mag, "out of memory");

	/* Fresh random inputs, as stored (A and B in their stored layout);
	 * padding between rows holds 1e3, which a kernel must not read. */
	fill_matrix(gc->in, p + l.off_a, l.a_rows, l.a_cols, l.lda, 1e3, a);
	fill_matrix(gc->in, p + l.off_b, l.b_rows, l.b_cols, l.ldb, 1e3, bm);
	fill_matrix(gc->out, p + l.off_c, gc->m, gc->n, l.ldc, NAN, cv);
	fill_matrix(gc->out, p + l.off_bias, 1, gc->n, gc->n, NAN, bias);
	/* The pre-activation spans GELU's bend and both tails: its slope
	 * passes 0 near -0.75 and peaks near 1.5. */
	for (int i = 0; i < gc->m; i++) {
		for (int j = 0; j < l.ldc; j++) {
			double v = tl_store(rp(gc->out), p + l.off_aux, (size_t)i * (size_t)l.ldc + (size_t)j,
					    j < gc->n ? tl_rand_uniform(-4, 4) : 1e3);

			if (j < gc->n) {
				aux[(size_t)i * (size_t)gc->n + (size_t)j] = v;
			}
		}
	}
	tl_poison(rp(gc->out), p + l.off_d, (size_t)gc->m * (size_t)l.ldc);
	if (use_aux_out) {
		tl_poison(rp(gc->out), p + l.off_aux, (size_t)gc->m * (size_t)l.ldc);
	}

	memset(&args, 0, sizeof(args));
	tensor2(&args.a, b->buf, base + l.off_a, gc->in, l.a_rows, l.a_cols, l.lda);
	tensor2(&args.b, b->buf, base + l.off_b, gc->in, l.b_rows, l.b_cols, l.ldb);
	tensor2(&args.d, b->buf, base + l.off_d, gc->out, gc->m, gc->n, l.ldc);
	if (gc->with_c) {
		tensor2(&tc, b->buf, base + l.off_c, gc->out, gc->m, gc->n, l.ldc);
		args.c = &tc;
	}
	if (use_bias) {
		memset(&tbias, 0, sizeof(tbias));
		tbias.buffer = b->buf;
		tbias.offset = base + l.off_bias;
		tbias.dtype = gc->out;
		tbias.rank = 1;
		tbias.shape[0] = gc->n;
		args.bias = &tbias;
	}
	if (use_aux || use_aux_out) {
		tensor2(&taux, b->buf, base + l.off_aux, gc->out, gc->m, gc->n, l.ldc);
		if (use_aux) {
			args.aux = &taux;
		} else {
			args.aux_out = &taux;
		}
	}
	args.trans_a = gc->trans_a;
	args.trans_b = gc->trans_b;
	args.alpha = gc->alpha;
	args.alpha_set = true;
	args.beta = gc->with_c ? gc->beta : 0;
	args.epilogue = gc->epilogue;

	r = regen_gemm(c, &args);
	if (r < 0) {
		goto out;
	}
	tl_check_transport(c, regen_buffer_device(b->buf));
	tl_gemm_ref(&(struct tl_gemm){ .m = gc->m, .n = gc->n, .k = gc->k, .trans_a = gc->trans_a,
				       .trans_b = gc->trans_b, .alpha = gc->alpha, .beta = gc->beta,
				       .epilogue = (enum rp_epilogue)gc->epilogue, .aux = use_aux ? aux : NULL,
				       .pre = pre, .pre_magnitude = pre_mag },
		    a, bm, gc->with_c ? cv : NULL, use_bias ? bias : NULL, ref, mag);
	for (int i = 0; i < gc->m; i++) {
		for (int j = 0; j < gc->n; j++) {
			got[(size_t)i * (size_t)gc->n + (size_t)j] =
				tl_load(rp(gc->out), p + l.off_d, (size_t)i * (size_t)l.ldc + (size_t)j);
		}
	}
	if (tl_check_close("D", rp(gc->out), got, ref, mag, mn, 3e-5, why, why_size) > 0) {
		r = 1;
		goto out;
	}
	/* aux_out holds GELU's input, in D's dtype, and its row padding is
	 * left alone as D's. */
	for (int i = 0; use_aux_out && i < gc->m; i++) {
		for (int j = 0; j < l.ldc; j++) {
			size_t at = (size_t)i * (size_t)l.ldc + (size_t)j;

			if (j < gc->n) {
				got[(size_t)i * (size_t)gc->n + (size_t)j] = tl_load(rp(gc->out), p + l.off_aux, at);
			} else if (!tl_is_poison(rp(gc->out), p + l.off_aux, at)) {
				snprintf(why, why_size, "wrote aux_out's row padding at [%d,%d]", i, j);
				r = 1;
				goto out;
			}
		}
	}
	if (use_aux_out && tl_check_close("aux_out", rp(gc->out), got, pre, pre_mag, mn, 3e-5, why, why_size) > 0) {
		r = 1;
		goto out;
	}
	/* aux is an input: read, never written. */
	for (int i = 0; use_aux && i < gc->m; i++) {
		for (int j = 0; j < gc->n; j++) {
			double v = tl_load(rp(gc->out), p + l.off_aux, (size_t)i * (size_t)l.ldc + (size_t)j);

			if (v != aux[(size_t)i * (size_t)gc->n + (size_t)j]) {
				snprintf(why, why_size, "wrote aux at [%d,%d]", i, j);
				r = 1;
				goto out;
			}
		}
	}
	/* Padding between rows of D is not D's: it must be left alone. */
	for (int i = 0; i < gc->m; i++) {
		for (int j = gc->n; j < l.ldc; j++) {
			if (!tl_is_poison(rp(gc->out), p + l.off_d, (size_t)i * (size_t)l.ldc + (size_t)j)) {
				snprintf(why, why_size, "wrote D's row padding at [%d,%d]", i, j);
				r = 1;
				goto out;
			}
		}
	}
out:
	free(a);
	free(bm);
	free(cv);
	free(bias);
	free(aux);
	free(ref);
	free(mag);
	free(got);
	free(pre);
	free(pre_mag);
	return r;
}

/* Attention. */

void tl_attn_describe(const struct tl_attn_case *ac, char *buf, size_t size)
{
	int n = snprintf(buf, size, "attention %s B=%d H=%d Sq=%d Skv=%d D=%d Dv=%d causal=%d%s scale=%g",
			 rp_dtype_name(rp(ac->dt)), ac->b, ac->h, ac->sq, ac->skv, ac->d, ac->dv, ac->causal,
			 ac->bottom_right ? " bottom_right" : "", ac->scale);

	for (int i = 0; ac->varlen && i < ac->b && n > 0 && (size_t)n < size; i++) {
		n += snprintf(buf + n, size - (size_t)n, "%s%d/%d", i ? "," : " lengths ", ac->seq_len_q[i],
			      ac->seq_len_kv[i]);
	}
}

/* NaN in the rows of x ([B, H, S, W] stored, dense) past each entry's
 * length; the stored copy in mem and the reference's values alike. */
static void poison_padding(enum rp_dtype dt, void *mem, double *x, int B, int H, int S, int W, const int32_t *len)
{
	for (int b = 0; b < B; b++) {
		for (int h = 0; h < H; h++) {
			for (int i = len[b]; i < S; i++) {
				size_t at = (((size_t)b * H + h) * S + i) * W;
				tl_poison(dt, (char *)mem + at * rp_dtype_size(dt), (size_t)W);
				for (int w = 0; w < W; w++) {
					x[at + w] = NAN;
				}
			}
		}
	}
}

static void tensor4(struct regen_tensor *t, regen_buffer *b, uint64_t offset, enum regen_dtype dt, int n0, int n1,
		    int n2, int n3)
{
	memset(t, 0, sizeof(*t));
	t->buffer = b;
	t->offset = offset;
	t->dtype = dt;
	t->rank = n3 > 0 ? 4 : 3;
	t->shape[0] = n0;
	t->shape[1] = n1;
	t->shape[2] = n2;
	t->shape[3] = n3;
}

/* n elements of dt at base, as doubles (malloc'ed). */
static double *load_all(enum rp_dtype dt, const void *base, size_t n)
{
	double *v = malloc((n + 1) * sizeof(double));

	ASSERT_NOT_NULL(v);
	for (size_t i = 0; i < n; i++) {
		v[i] = tl_load(dt, base, i);
	}
	return v;
}

/* Adds `slack` to every magnitude: the absolute part of the bound. */
static void add_slack(double *mag, size_t n, double slack)
{
	for (size_t i = 0; i < n; i++) {
		mag[i] += slack;
	}
}

int tl_attention_run(regen_client *c, int device, const struct tl_attn_case *ac, char *why, size_t why_size)
{
	const enum regen_dtype dt = ac->dt;
	const size_t es = rp_dtype_size(rp(dt));
	const int B = ac->b, H = ac->h, SQ = ac->sq, SK = ac->skv, D = ac->d, DV = ac->dv;
	const size_t nq = (size_t)B * H * SQ * D, nk = (size_t)B * H * SK * D, nv = (size_t)B * H * SK * DV;
	const size_t no = (size_t)B * H * SQ * DV, ns = (size_t)B * H * SQ;
	const double tol = dt == REGEN_F32 ? 2e-5 : dt == REGEN_F16 ? 2e-3 : 1.6e-2;
	const struct tl_attention at = { .b = B, .h = H, .sq = SQ, .skv = SK, .d = D, .dv = DV, .causal = ac->causal,
					 .bottom_right = ac->bottom_right,
					 .scale = ac->scale != 0 ? ac->scale : 1.0 / sqrt((double)D),
					 .seq_len_q = ac->varlen ? ac->seq_len_q : NULL,
					 .seq_len_kv = ac->varlen ? ac->seq_len_kv : NULL };
	size_t off_q, off_k, off_v, off_do, off_len, off_o, off_st, off_dq, off_dk, off_dv;
	struct regen_tensor tlen_q, tlen_kv;
	double *q, *k, *v, *d_o, *o_ref, *o_mag, *st_ref, *st_mag, *o_got = NULL, *st_got = NULL;
	double *dq_ref, *dk_ref, *dv_ref, *dq_got = NULL, *dk_got = NULL, *dv_got = NULL;
	struct tl_attention_grad_magnitude gm;
	struct regen_attention_backward_args ba;
	struct regen_attention_args fa;
	struct tl_buffer in, out, grad;
	struct regen_tensor tstats;
	int r;

	off_q = 0;
	off_k = align64(off_q + nq * es);
	off_v = align64(off_k + nk * es);
	off_do = align64(off_v + nv * es);
	off_len = align64(off_do + no * es);
	tl_buffer_alloc(align64(off_len + 2 * TL_ATTN_BATCH_MAX * sizeof(int32_t)), &in);
	off_o = 0;
	off_st = align64(no * es);
	tl_buffer_alloc(align64(off_st + ns * 4), &out);
	off_dq = 0;
	off_dk = align64(nq * es);
	off_dv = align64(off_dk + nk * es);
	tl_buffer_alloc(align64(off_dv + nv * es), &grad);

	q = malloc((nq + 1) * sizeof(double));
	k = malloc((nk + 1) * sizeof(double));
	v = malloc((nv + 1) * sizeof(double));
	d_o = malloc((no + 1) * sizeof(double));
	o_ref = malloc((no + 1) * sizeof(double));
	o_mag = malloc((no + 1) * sizeof(double));
	st_ref = malloc((ns + 1) * sizeof(double));
	st_mag = malloc((ns + 1) * sizeof(double));
	dq_ref = malloc((nq + 1) * sizeof(double));
	dk_ref = malloc((nk + 1) * sizeof(double));
	dv_ref = malloc((nv + 1) * sizeof(double));
	gm.dq = malloc((nq + 1) * sizeof(double));
	gm.dk = malloc((nk + 1) * sizeof(double));
	gm.dv = malloc((nv + 1) * sizeof(double));
	ASSERT(q && k && v && d_o && o_ref && o_mag && st_ref && st_mag && dq_ref && dk_ref && dv_ref && gm.dq && gm.dk &&
	       gm.dv, "out of memory");

	tl_fill_random(NULL, rp(dt), in.mem.ptr + off_q, nq, -1, 1, q);
	tl_fill_random(NULL, rp(dt), in.mem.ptr + off_k, nk, -1, 1, k);
	tl_fill_random(NULL, rp(dt), in.mem.ptr + off_v, nv, -1, 1, v);
	tl_fill_random(NULL, rp(dt), in.mem.ptr + off_do, no, -1, 1, d_o);
	if (ac->varlen) {
		ASSERT(B <= TL_ATTN_BATCH_MAX, "at most %d batch entries with lengths", TL_ATTN_BATCH_MAX);
		memcpy(in.mem.ptr + off_len, ac->seq_len_q, (size_t)B * sizeof(int32_t));
		memcpy(in.mem.ptr + off_len + (size_t)B * sizeof(int32_t), ac->seq_len_kv, (size_t)B * sizeof(int32_t));
		poison_padding(rp(dt), in.mem.ptr + off_q, q, B, H, SQ, D, ac->seq_len_q);
		poison_padding(rp(dt), in.mem.ptr + off_k, k, B, H, SK, D, ac->seq_len_kv);
		poison_padding(rp(dt), in.mem.ptr + off_v, v, B, H, SK, DV, ac->seq_len_kv);
		poison_padding(rp(dt), in.mem.ptr + off_do, d_o, B, H, SQ, DV, ac->seq_len_q);
	}
	tl_poison(rp(dt), out.mem.ptr + off_o, no);
	tl_poison(RP_DTYPE_F32, out.mem.ptr + off_st, ns);
	tl_poison(rp(dt), grad.mem.ptr + off_dq, nq);
	tl_poison(rp(dt), grad.mem.ptr + off_dk, nk);
	tl_poison(rp(dt), grad.mem.ptr + off_dv, nv);

	r = tl_buffer_import(c, device, &in);
	if (r == 0) {
		r = tl_buffer_import(c, device, &out);
	}
	if (r == 0) {
		r = tl_buffer_import(c, device, &grad);
	}
	if (r < 0) {
		goto done;
	}

	memset(&fa, 0, sizeof(fa));
	tensor4(&fa.q, in.buf, off_q, dt, B, H, SQ, D);
	tensor4(&fa.k, in.buf, off_k, dt, B, H, SK, D);
	tensor4(&fa.v, in.buf, off_v, dt, B, H, SK, DV);
	tensor4(&fa.o, out.buf, off_o, dt, B, H, SQ, DV);
	tensor4(&tstats, out.buf, off_st, REGEN_F32, B, H, SQ, 0);
	fa.stats = &tstats;
	fa.scale = ac->scale;
	fa.causal = ac->causal;
	fa.causal_alignment = ac->bottom_right ? REGEN_CAUSAL_BOTTOM_RIGHT : REGEN_CAUSAL_TOP_LEFT;
	if (ac->varlen) {
		memset(&tlen_q, 0, sizeof(tlen_q));
		tlen_q.buffer = in.buf;
		tlen_q.offset = off_len;
		tlen_q.dtype = REGEN_I32;
		tlen_q.rank = 1;
		tlen_q.shape[0] = B;
		tlen_kv = tlen_q;
		tlen_kv.offset = off_len + (size_t)B * sizeof(int32_t);
		fa.seq_len_q = &tlen_q;
		fa.seq_len_kv = &tlen_kv;
	}
	r = regen_attention(c, &fa);
	if (r == 0)
		tl_check_transport(c, device);
	if (r < 0) {
		goto done;
	}
	o_got = load_all(rp(dt), out.mem.ptr + off_o, no);
	st_got = load_all(RP_DTYPE_F32, out.mem.ptr + off_st, ns);

	memset(&ba, 0, sizeof(ba));
	ba.q = fa.q;
	ba.k = fa.k;
	ba.v = fa.v;
	ba.o = fa.o;
	tensor4(&ba.d_o, in.buf, off_do, dt, B, H, SQ, DV);
	ba.stats = tstats;
	tensor4(&ba.d_q, grad.buf, off_dq, dt, B, H, SQ, D);
	tensor4(&ba.d_k, grad.buf, off_dk, dt, B, H, SK, D);
	tensor4(&ba.d_v, grad.buf, off_dv, dt, B, H, SK, DV);
	ba.scale = ac->scale;
	ba.causal = ac->causal;
	ba.causal_alignment = fa.causal_alignment;
	ba.seq_len_q = fa.seq_len_q;
	ba.seq_len_kv = fa.seq_len_kv;
	r = regen_attention_backward(c, &ba);
	if (r < 0) {
		goto done;
	}
	dq_got = load_all(rp(dt), grad.mem.ptr + off_dq, nq);
	dk_got = load_all(rp(dt), grad.mem.ptr + off_dk, nk);
	dv_got = load_all(rp(dt), grad.mem.ptr + off_dv, nv);

	/* The backward reads o as the forward stored it, as on the device. */
	tl_attention_ref(&at, q, k, v, o_ref, st_ref, o_mag);
	tl_attention_backward_ref(&at, q, k, v, o_got, d_o, dq_ref, dk_ref, dv_ref, &gm);
	add_slack(o_mag, no, 1e-3);
	add_slack(gm.dq, nq, 1e-3);
	add_slack(gm.dk, nk, 1e-3);
	add_slack(gm.dv, nv, 1e-3);
	for (size_t i = 0; i < ns; i++) {
		st_mag[i] = 1.0 + fabs(st_ref[i]);
	}
	r = tl_check_close("o", rp(dt), o_got, o_ref, o_mag, no, tol, why, why_size) > 0 ||
	    tl_check_close("stats", RP_DTYPE_F32, st_got, st_ref, st_mag, ns, dt == REGEN_F32 ? 2e-6 : 1e-4, why,
			   why_size) > 0 ||
	    tl_check_close("d_q", rp(dt), dq_got, dq_ref, gm.dq, nq, tol, why, why_size) > 0 ||
	    tl_check_close("d_k", rp(dt), dk_got, dk_ref, gm.dk, nk, tol, why, why_size) > 0 ||
	    tl_check_close("d_v", rp(dt), dv_got, dv_ref, gm.dv, nv, tol, why, why_size) > 0;
done:
	tl_buffer_free(&in);
	tl_buffer_free(&out);
	tl_buffer_free(&grad);
	free(q);
	free(k);
	free(v);
	free(d_o);
	free(o_ref);
	free(o_mag);
	free(st_ref);
	free(st_mag);
	free(o_got);
	free(st_got);
	free(dq_ref);
	free(dk_ref);
	free(dv_ref);
	free(dq_got);
	free(dk_got);
	free(dv_got);
	free(gm.dq);
	free(gm.dk);
	free(gm.dv);
	return r;
}

/* LayerNorm. */

void tl_ln_describe(const struct tl_ln_case *lc, char *buf, size_t size)
{
	static const char *const res[] = { "", " +d_residual", " d_x=d_residual" };

	snprintf(buf, size, "layer_norm %s [%d, %d] pad %d eps %g%s%s%s", rp_dtype_name(rp(lc->dt)), lc->rows, lc->n,
		 lc->pad, lc->eps, lc->bias ? " bias" : "", res[lc->residual], lc->param_grads ? " d_weight d_bias" : "");
}

/* The [rows, n] elements of a matrix with row stride ld at p, as doubles. */
static double *load_rows(enum rp_dtype dt, const unsigned char *p, int rows, int n, int ld)
{
	double *v = malloc(((size_t)rows * (size_t)n + 1) * sizeof(double));

	ASSERT_NOT_NULL(v);
	for (int i = 0; i < rows; i++) {
		for (int j = 0; j < n; j++) {
			v[(size_t)i * (size_t)n + (size_t)j] = tl_load(dt, p, (size_t)i * (size_t)ld + (size_t)j);
		}
	}
	return v;
}

/* Whether every padding element of a rows x ld matrix at p is still the
 * poison (or, with before, still what before holds). */
static bool padding_kept(enum rp_dtype dt, const unsigned char *p, const unsigned char *before, int rows, int n, int ld)
{
	const size_t es = rp_dtype_size(dt);

	for (int i = 0; i < rows; i++) {
		for (int j = n; j < ld; j++) {
			size_t at = (size_t)i * (size_t)ld + (size_t)j;

			if (before ? memcmp(p + at * es, before + at * es, es) != 0 : !tl_is_poison(dt, p, at)) {
				return false;
			}
		}
	}
	return true;
}

int tl_layer_norm_run(regen_client *c, int device, const struct tl_ln_case *lc, char *why, size_t why_size)
{
	const enum rp_dtype dt = rp(lc->dt);
	const size_t es = rp_dtype_size(dt);
	const int rows = lc->rows, n = lc->n, ld = lc->n + lc->pad;
	const size_t mat = align64((size_t)rows * (size_t)ld * es), vec = align64((size_t)n * es);
	const size_t stat = align64((size_t)rows * 4), nn = (size_t)rows * (size_t)n;
	const size_t off_x = 0, off_w = mat, off_b = off_w + vec, off_y = off_b + vec, off_mean = off_y + mat;
	const size_t off_rstd = off_mean + stat, off_dy = off_rstd + stat, off_dx = off_dy + mat, off_res = off_dx + mat;
	const size_t off_dw = off_res + mat, off_db = off_dw + vec, total = off_db + vec;
	const struct tl_layer_norm ln = { rows, n, lc->eps != 0 ? lc->eps : 1e-5 };
	struct tl_layer_norm_grad_magnitude gm = { 0 };
	struct regen_layer_norm_backward_args ba;
	struct regen_layer_norm_args fa;
	struct regen_tensor tb, tmean, trstd, tdw, tdb, tres;
	unsigned char *res_before = NULL;
	double *x = NULL, *w = NULL, *b = NULL, *dy = NULL, *res = NULL, *y_ref = NULL, *y_mag = NULL;
	double *mean_ref = NULL, *rstd_ref = NULL, *got = NULL, *mean = NULL, *rstd = NULL, *mean_mag = NULL;
	double *dx_ref = NULL, *dw_ref = NULL, *db_ref = NULL;
	struct tl_buffer m;
	unsigned char *p;
	int r;

	tl_buffer_alloc(total, &m);
	p = m.mem.ptr;
	/* Inputs off centre, rows padded with values a kernel must not read
	 * into a sum; outputs all poison. */
	x = malloc((nn + 1) * sizeof(double));
	dy = malloc((nn + 1) * sizeof(double));
	res = malloc((nn + 1) * sizeof(double));
	w = malloc(((size_t)n + 1) * sizeof(double));
	b = malloc(((size_t)n + 1) * sizeof(double));
	ASSERT(x && dy && res && w && b, "out of memory");
	fill_matrix(lc->dt, p + off_x, rows, n, ld, 1e3, x);
	for (size_t e = 0; e < nn; e++) {
		size_t i = e / (size_t)n, j = e % (size_t)n;
		x[e] = tl_store(dt, p + off_x, i * (size_t)ld + j, 3.0 * x[e] + 1.0);
	}
	fill_matrix(lc->dt, p + off_dy, rows, n, ld, 1e3, dy);
	fill_matrix(lc->dt, p + off_res, rows, n, ld, 1e3, res);
	fill_matrix(lc->dt, p + off_w, 1, n, n, NAN, w);
	fill_matrix(lc->dt, p + off_b, 1, n, n, NAN, b);
	tl_poison(dt, p + off_y, (size_t)rows * (size_t)ld);
	tl_poison(RP_DTYPE_F32, p + off_mean, (size_t)rows);
	tl_poison(RP_DTYPE_F32, p + off_rstd, (size_t)rows);
	tl_poison(dt, p + off_dx, (size_t)rows * (size_t)ld);
	tl_poison(dt, p + off_dw, (size_t)n);
	tl_poison(dt, p + off_db, (size_t)n);
	r = tl_buffer_import(c, device, &m);
	if (r < 0) {
		goto out;
	}

	memset(&fa, 0, sizeof(fa));
	tensor2(&fa.x, m.buf, off_x, lc->dt, rows, n, ld);
	tensor2(&fa.y, m.buf, off_y, lc->dt, rows, n, ld);
	fa.weight = (struct regen_tensor){ .buffer = m.buf, .offset = off_w, .dtype = lc->dt, .rank = 1, .shape = { n } };
	tb = fa.weight;
	tb.offset = off_b;
	tmean = (struct regen_tensor){ .buffer = m.buf, .offset = off_mean, .dtype = REGEN_F32, .rank = 1,
				       .shape = { rows } };
	trstd = tmean;
	trstd.offset = off_rstd;
	fa.bias = lc->bias ? &tb : NULL;
	fa.mean = &tmean;
	fa.rstd = &trstd;
	fa.eps = lc->eps;
	r = regen_layer_norm(c, &fa);
	if (r < 0) {
		goto out;
	}
	tl_check_transport(c, device);

	y_ref = malloc((nn + 1) * sizeof(double));
	y_mag = malloc((nn + 1) * sizeof(double));
	mean_ref = malloc(((size_t)rows + 1) * sizeof(double));
	rstd_ref = malloc(((size_t)rows + 1) * sizeof(double));
	mean_mag = malloc(((size_t)rows + 1) * sizeof(double));
	ASSERT(y_ref && y_mag && mean_ref && rstd_ref && mean_mag, "out of memory");
	tl_layer_norm_ref(&ln, x, w, lc->bias ? b : NULL, y_ref, mean_ref, rstd_ref, y_mag);
	got = load_rows(dt, p + off_y, rows, n, ld);
	mean = load_all(RP_DTYPE_F32, p + off_mean, (size_t)rows);
	rstd = load_all(RP_DTYPE_F32, p + off_rstd, (size_t)rows);
	for (int i = 0; i < rows; i++) {
		mean_mag[i] = 8.0;   /* the row's largest |x| bounds its terms' rounding: x is in [-2, 4) */
	}
	r = tl_check_close("y", dt, got, y_ref, y_mag, nn, 2e-5, why, why_size) > 0 ||
	    tl_check_close("mean", RP_DTYPE_F32, mean, mean_ref, mean_mag, (size_t)rows, 1e-6, why, why_size) > 0 ||
	    tl_check_close("rstd", RP_DTYPE_F32, rstd, rstd_ref, rstd_ref, (size_t)rows, 2e-5, why, why_size) > 0;
	if (r == 0 && !padding_kept(dt, p + off_y, NULL, rows, n, ld)) {
		snprintf(why, why_size, "wrote y's row padding");
		r = 1;
	}
	if (r != 0) {
		goto out;
	}

	memset(&ba, 0, sizeof(ba));
	tensor2(&ba.d_y, m.buf, off_dy, lc->dt, rows, n, ld);
	ba.x = fa.x;
	ba.weight = fa.weight;
	ba.mean = tmean;
	ba.rstd = trstd;
	tensor2(&tres, m.buf, off_res, lc->dt, rows, n, ld);
	tensor2(&ba.d_x, m.buf, lc->residual == 2 ? off_res : off_dx, lc->dt, rows, n, ld);
	ba.d_residual = lc->residual ? &tres : NULL;
	tdw = fa.weight;
	tdw.offset = off_dw;
	tdb = fa.weight;
	tdb.offset = off_db;
	ba.d_weight = lc->param_grads ? &tdw : NULL;
	ba.d_bias = lc->param_grads ? &tdb : NULL;
	res_before = malloc(mat);
	ASSERT_NOT_NULL(res_before);
	memcpy(res_before, p + off_res, mat);
	r = regen_layer_norm_backward(c, &ba);
	if (r < 0) {
		goto out;
	}

	dx_ref = malloc((nn + 1) * sizeof(double));
	dw_ref = malloc(((size_t)n + 1) * sizeof(double));
	db_ref = malloc(((size_t)n + 1) * sizeof(double));
	gm.d_x = malloc((nn + 1) * sizeof(double));
	gm.d_weight = malloc(((size_t)n + 1) * sizeof(double));
	gm.d_bias = malloc(((size_t)n + 1) * sizeof(double));
	ASSERT(dx_ref && dw_ref && db_ref && gm.d_x && gm.d_weight && gm.d_bias, "out of memory");
	/* From the statistics the forward stored, as the backward reads them. */
	tl_layer_norm_backward_ref(&ln, dy, x, w, mean, rstd, lc->residual ? res : NULL, dx_ref, dw_ref, db_ref, &gm);
	free(got);
	got = load_rows(dt, p + (lc->residual == 2 ? off_res : off_dx), rows, n, ld);
	r = tl_check_close("d_x", dt, got, dx_ref, gm.d_x, nn, 2e-5, why, why_size) > 0;
	if (r == 0 && lc->param_grads) {
		free(got);
		got = load_all(dt, p + off_dw, (size_t)n);
		r = tl_check_close("d_weight", dt, got, dw_ref, gm.d_weight, (size_t)n, 2e-5, why, why_size) > 0;
		free(got);
		got = load_all(dt, p + off_db, (size_t)n);
		r = r || tl_check_close("d_bias", dt, got, db_ref, gm.d_bias, (size_t)n, 2e-5, why, why_size) > 0;
	}
	if (r == 0 && !lc->param_grads && !tl_is_poison(dt, p + off_dw, 0)) {
		snprintf(why, why_size, "wrote d_weight, which was not asked for");
		r = 1;
	}
	if (r == 0 && lc->residual == 1 && memcmp(res_before, p + off_res, mat) != 0) {
		snprintf(why, why_size, "wrote d_residual, an input");
		r = 1;
	}
	if (r == 0 && !padding_kept(dt, p + (lc->residual == 2 ? off_res : off_dx),
				    lc->residual == 2 ? res_before : NULL, rows, n, ld)) {
		snprintf(why, why_size, "wrote d_x's row padding");
		r = 1;
	}
out:
	tl_buffer_free(&m);
	free(res_before);
	free(x);
	free(w);
	free(b);
	free(dy);
	free(res);
	free(y_ref);
	free(y_mag);
	free(mean_ref);
	free(rstd_ref);
	free(mean_mag);
	free(got);
	free(mean);
	free(rstd);
	free(dx_ref);
	free(dw_ref);
	free(db_ref);
	free(gm.d_x);
	free(gm.d_weight);
	free(gm.d_bias);
	return r;
}
