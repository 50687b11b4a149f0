/* SPDX-License-Identifier: Apache-2.0 */
/* LayerNorm and LayerNormBackward through rd_backend_cuda (kernels/
 * layernorm.cu) from C, as the worker core drives it: each call's
 * descriptor goes through rp_compute_check (the parser's checks and derived
 * sizes), then the lane. For f32, f16 and bf16 and several shapes (one row
 * of one element, odd lengths, n = 2048, n = 8192 (1024 threads a row), the
 * longest row, padded rows), through the scalar kernels and the vectorised
 * ones (rows of 16-byte vectors: n = 768 with padded rows, 1024 over 4099
 * rows, 2048, bf16's 8192): the forward's y, mean and rstd against a
 * float64 reference on the inputs as
 * stored, y's row padding untouched; the backward's d_x (with d_residual
 * beside it and in place of it), d_weight and d_bias against float64 from
 * the forward's own statistics, d_weight the same bits on a second run (no
 * atomics). Refusals: a misaligned operand, scratch over max_scratch. Then
 * the kernels' own time per call on a stream of this test, printed, not
 * asserted. Fresh random inputs (seed printed; REGEN_TEST_SEED repeats
 * it). Exit 77 without a GPU. */
#include "gpu_common.h"

#include <math.h>
#include <string.h>
#include "proto/errors.h"

static double tol_of(enum rp_dtype dt)
{
	return dt == RP_DTYPE_F32 ? 1e-5 : dt == RP_DTYPE_F16 ? 2e-3 : 1e-2;
}

/* Operand of matrix m ([rows, cols], row stride ld) or vector (rank 1), in
 * a buffer of its own: `serial` tells buffers apart for the placement
 * checks. */
static void put(struct rd_op *op, int slot, struct gt_mat *m, uint32_t serial)
{
	gt_operand(&op->compute.operands[slot], m);
	op->compute.operands[slot].buffer.serial = serial;
	op->compute.present[slot] = true;
	op->buffers[slot] = m->buf;
}

static void vec_alloc(struct gt *t, struct gt_mat *m, enum rp_dtype dt, int64_t n)
{
	gt_mat_alloc(t, m, dt, 1, n, n);
	m->is_vector = true;
}

/* rp_compute_check, as the worker runs it on every call. */
static bool checked(struct rd_op *op, const char *label)
{
	struct rp_error err = { 0 };
	bool ok = rp_compute_check(&op->compute, &err) == 0;

	if (!ok) {
		gt_failures++;
		printf("  FAIL: %s: refused by the parser: %s: %s\n", label, err.name, gt_err_message(&err));
	}
	rp_error_clear(&err);
	return ok;
}

struct ln {
	enum rp_dtype dt;
	int64_t rows, n, ld;
	double eps;
	struct gt_mat x, w, b, y, mean, rstd;
	struct gt_mat dy, dx, res, dw, db;
};

static void ln_alloc(struct gt *t, struct ln *l, enum rp_dtype dt, int64_t rows, int64_t n, int64_t ld, uint64_t *seed)
{
	memset(l, 0, sizeof(*l));
	l->dt = dt;
	l->rows = rows;
	l->n = n;
	l->ld = ld;
	gt_mat_alloc(t, &l->x, dt, rows, n, ld);
	vec_alloc(t, &l->w, dt, n);
	vec_alloc(t, &l->b, dt, n);
	gt_mat_alloc(t, &l->y, dt, rows, n, ld);
	vec_alloc(t, &l->mean, RP_DTYPE_F32, rows);
	vec_alloc(t, &l->rstd, RP_DTYPE_F32, rows);
	gt_mat_alloc(t, &l->dy, dt, rows, n, ld);
	gt_mat_alloc(t, &l->dx, dt, rows, n, ld);
	gt_mat_alloc(t, &l->res, dt, rows, n, ld);
	vec_alloc(t, &l->dw, dt, n);
	vec_alloc(t, &l->db, dt, n);
	gt_mat_fill(&l->x, ++*seed, 1);     /* [-2, 2): rows whose mean is not 0 */
	gt_mat_fill(&l->w, ++*seed, 0);
	gt_mat_fill(&l->b, ++*seed, 0);
	gt_mat_fill(&l->dy, ++*seed, 0);
	gt_mat_fill(&l->res, ++*seed, 0);
	gt_mat_poison(&l->y);
	gt_mat_poison(&l->mean);
	gt_mat_poison(&l->rstd);
	gt_mat_poison(&l->dx);
	gt_mat_poison(&l->dw);
	gt_mat_poison(&l->db);
}

static void ln_free(struct gt *t, struct ln *l)
{
	struct gt_mat *all[] = { &l->x, &l->w, &l->b, &l->y, &l->mean, &l->rstd, &l->dy, &l->dx, &l->res, &l->dw, &l->db };
	for (size_t i = 0; i < sizeof(all) / sizeof(all[0]); i++)
		gt_mat_free(t, all[i]);
}

static void forward_op(struct rd_op *op, struct ln *l)
{
	memset(op, 0, sizeof(*op));
	op->compute.spec = &rp_op_layer_norm;
	put(op, RP_LN_X, &l->x, 1);
	put(op, RP_LN_WEIGHT, &l->w, 2);
	put(op, RP_LN_BIAS, &l->b, 3);
	put(op, RP_LN_Y, &l->y, 4);
	put(op, RP_LN_MEAN, &l->mean, 5);
	put(op, RP_LN_RSTD, &l->rstd, 6);
	op->compute.layer_norm.eps = l->eps;
}

/* residual: 0 none, 1 d_residual apart, 2 d_x in place of d_residual. */
static void backward_op(struct rd_op *op, struct ln *l, int residual)
{
	memset(op, 0, sizeof(*op));
	op->compute.spec = &rp_op_layer_norm_backward;
	put(op, RP_LNB_DY, &l->dy, 1);
	put(op, RP_LNB_X, &l->x, 2);
	put(op, RP_LNB_WEIGHT, &l->w, 3);
	put(op, RP_LNB_MEAN, &l->mean, 4);
	put(op, RP_LNB_RSTD, &l->rstd, 5);
	put(op, RP_LNB_DX, residual == 2 ? &l->res : &l->dx, 6);
	put(op, RP_LNB_DWEIGHT, &l->dw, 7);
	put(op, RP_LNB_DBIAS, &l->db, 8);
	if (residual)
		put(op, RP_LNB_DRESIDUAL, &l->res, residual == 2 ? 6 : 9);
}

/* The [rows, n] values of m as dense doubles (malloc'ed). */
static double *dense(const struct gt_mat *m)
{
	double *all = gt_mat_download(m), *out = malloc(sizeof(double) * (size_t)(m->rows * m->cols));
	for (int64_t i = 0; i < m->rows; i++)
		memcpy(out + i * m->cols, all + i * m->ld, sizeof(double) * (size_t)m->cols);
	free(all);
	return out;
}

static double vec_rel(const double *got, const double *ref, int64_t n)
{
	double num = 0, den = 0;
	for (int64_t i = 0; i < n; i++) {
		if (!isfinite(got[i]))
			return INFINITY;
		num += (got[i] - ref[i]) * (got[i] - ref[i]);
		den += ref[i] * ref[i];
	}
	return den > 0 ? sqrt(num / den) : sqrt(num);
}

static void check_forward(struct ln *l, const char *label)
{
	const int64_t rows = l->rows, n = l->n;
	double *x = dense(&l->x), *w = gt_mat_download(&l->w), *b = gt_mat_download(&l->b);
	double *mean = gt_mat_download(&l->mean), *rstd = gt_mat_download(&l->rstd);
	double *y = malloc(sizeof(double) * (size_t)(rows * n));
	double *rm = malloc(sizeof(double) * (size_t)rows), *rr = malloc(sizeof(double) * (size_t)rows);
	unsigned long nans = 0, pad = 0;

	for (int64_t i = 0; i < rows; i++) {
		double s = 0, q = 0;
		for (int64_t j = 0; j < n; j++)
			s += x[i * n + j];
		rm[i] = s / (double)n;
		for (int64_t j = 0; j < n; j++)
			q += (x[i * n + j] - rm[i]) * (x[i * n + j] - rm[i]);
		rr[i] = 1.0 / sqrt(q / (double)n + l->eps);
		for (int64_t j = 0; j < n; j++)
			y[i * n + j] = (x[i * n + j] - rm[i]) * rr[i] * w[j] + b[j];
	}
	double e_y = gt_rel_error(&l->y, y, &nans, &pad);
	double e_r = vec_rel(rstd, rr, rows);
	/* The means of rows centred near 0 are small: measured against the
	 * rows' scale, which is what their error moves y by. */
	double m_abs = 0;
	for (int64_t i = 0; i < rows; i++)
		m_abs = fmax(m_abs, fabs(mean[i] - rm[i]) * rr[i]);
	GT_CHECK(nans == 0 && pad == 0 && e_y < tol_of(l->dt) && m_abs < 1e-5 && e_r < 1e-5,
	      "%s forward: y rel %.3g (tol %.0e), %lu not finite, %lu padding written; mean off by %.3g of a std, "
	      "rstd rel %.3g",
	      label, e_y, tol_of(l->dt), nans, pad, m_abs, e_r);
	free(x);
	free(w);
	free(b);
	free(mean);
	free(rstd);
	free(y);
	free(rm);
	free(rr);
}

/* From the forward's statistics as it stored them. res_in: d_residual's
 * values before the call (NULL: none). out: where d_x went; out_before: its
 * whole allocation before the call when that was not poisoned (d_x in
 * place of d_residual), whose row padding must be as it was. */
static void check_backward(struct ln *l, const double *res_in, const struct gt_mat *out, const double *out_before,
			   const char *label)
{
	const int64_t rows = l->rows, n = l->n;
	double *x = dense(&l->x), *dy = dense(&l->dy), *w = gt_mat_download(&l->w);
	double *mean = gt_mat_download(&l->mean), *rstd = gt_mat_download(&l->rstd);
	double *dw = gt_mat_download(&l->dw), *db = gt_mat_download(&l->db);
	double *rdx = malloc(sizeof(double) * (size_t)(rows * n));
	double *rdw = calloc((size_t)n, sizeof(double)), *rdb = calloc((size_t)n, sizeof(double));
	unsigned long nans = 0, pad = 0;

	for (int64_t i = 0; i < rows; i++) {
		double sg = 0, sgx = 0;
		for (int64_t j = 0; j < n; j++) {
			double xh = (x[i * n + j] - mean[i]) * rstd[i], g = dy[i * n + j] * w[j];
			sg += g;
			sgx += g * xh;
			rdw[j] += dy[i * n + j] * xh;
			rdb[j] += dy[i * n + j];
		}
		for (int64_t j = 0; j < n; j++) {
			double xh = (x[i * n + j] - mean[i]) * rstd[i], g = dy[i * n + j] * w[j];
			rdx[i * n + j] = rstd[i] * (g - sg / (double)n - xh * sgx / (double)n) + (res_in ? res_in[i * n + j] : 0);
		}
	}
	double e_dx = gt_rel_error(out, rdx, &nans, &pad);
	if (out_before) {
		/* Its padding held values, not the poison gt_rel_error looks for. */
		double *after = gt_mat_download(out);
		pad = 0;
		for (int64_t i = 0; i < out->rows; i++)
			for (int64_t j = out->cols; j < out->ld; j++)
				pad += memcmp(&after[i * out->ld + j], &out_before[i * out->ld + j], sizeof(double)) != 0;
		free(after);
	}
	double e_dw = vec_rel(dw, rdw, n), e_db = vec_rel(db, rdb, n);
	double tol = tol_of(l->dt);
	GT_CHECK(nans == 0 && pad == 0 && e_dx < tol && e_dw < tol && e_db < tol,
	      "%s backward: d_x rel %.3g (%lu not finite, %lu padding written), d_weight rel %.3g, d_bias rel %.3g "
	      "(tol %.0e)",
	      label, e_dx, nans, pad, e_dw, e_db, tol);
	free(x);
	free(dy);
	free(w);
	free(mean);
	free(rstd);
	free(dw);
	free(db);
	free(rdx);
	free(rdw);
	free(rdb);
}

static void run_case(struct gt *t, struct rd_lane *lane, enum rp_dtype dt, int64_t rows, int64_t n, int64_t ld,
		     double eps, uint64_t *seed)
{
	char label[128];
	struct rd_op op;
	struct ln l;

	snprintf(label, sizeof(label), "%s [%lld, %lld] ld %lld eps %g", rp_dtype_name(dt), (long long)rows,
		 (long long)n, (long long)ld, eps);
	ln_alloc(t, &l, dt, rows, n, ld, seed);
	l.eps = eps;
	forward_op(&op, &l);
	if (!checked(&op, label))
		goto out;
	GT_CHECK(gt_run(t, lane, &op, 60) == 0, "%s forward ran: %s %s", label, gt_err_name(&op),
		 gt_err_message(&op.err));
	rp_error_clear(&op.err);
	check_forward(&l, label);

	for (int residual = 0; residual < 3; residual++) {
		double *res_in = residual ? dense(&l.res) : NULL;
		double *res_all = residual == 2 ? gt_mat_download(&l.res) : NULL;
		char what[160];

		snprintf(what, sizeof(what), "%s %s", label,
			 residual == 0 ? "" : residual == 1 ? "+ d_residual" : "d_x in place of d_residual");
		gt_mat_poison(&l.dx);
		gt_mat_poison(&l.dw);
		gt_mat_poison(&l.db);
		backward_op(&op, &l, residual);
		if (checked(&op, what)) {
			GT_CHECK(gt_run(t, lane, &op, 60) == 0, "%s backward ran: %s %s", what, gt_err_name(&op),
			      gt_err_message(&op.err));
			rp_error_clear(&op.err);
			check_backward(&l, res_in, residual == 2 ? &l.res : &l.dx, res_all, what);
		}
		free(res_in);
		free(res_all);
		if (residual == 2) {
			/* d_residual was overwritten: fresh values for what follows. */
			gt_mat_fill(&l.res, ++*seed, 0);
		}
	}
	/* The same inputs, the same d_weight bits: no atomics in the sums. */
	double *first = gt_mat_download(&l.dw);
	gt_mat_poison(&l.dw);
	backward_op(&op, &l, 0);
	if (checked(&op, label) && gt_run(t, lane, &op, 60) == 0) {
		double *again = gt_mat_download(&l.dw);
		GT_CHECK(memcmp(first, again, sizeof(double) * (size_t)n) == 0, "%s: d_weight the same bits on a second run",
			 label);
		free(again);
	}
	rp_error_clear(&op.err);
	free(first);
out:
	ln_free(t, &l);
}

/* Refused by name before anything runs: an operand whose first element is
 * misaligned (a buffer starting one byte into its allocation), scratch
 * past max_scratch. The lane serves on. */
static void refusals(struct gt *t, struct rd_lane *lane, uint64_t *seed)
{
	struct rd_op op;
	struct ln l;

	ln_alloc(t, &l, RP_DTYPE_BF16, 16, 64, 64, seed);
	forward_op(&op, &l);
	struct rd_buffer *odd = NULL;
	GT_CHECK(rd_cuda_buffer_wrap_local(&t->dev, (char *)l.x.ptr + 1, l.x.bytes - 2, &odd) == 0, "wrapping x + 1");
	if (odd) {
		op.buffers[RP_LN_X] = odd;
		GT_CHECK(checked(&op, "misaligned x") && gt_run(t, lane, &op, 60) < 0 &&
			      strcmp(gt_err_name(&op), RP_ERR_INVALID_OPERAND) == 0 && strstr(gt_err_message(&op.err), "x"),
		      "misaligned x refused: %s: %s", gt_err_name(&op), gt_err_message(&op.err));
		rp_error_clear(&op.err);
		t->dev.backend->close_buffer(odd);
	}
	forward_op(&op, &l);
	GT_CHECK(checked(&op, "forward") && gt_run(t, lane, &op, 60) == 0, "forward after a refusal: %s",
		 gt_err_name(&op));
	rp_error_clear(&op.err);

	/* Its d_weight and d_bias need 2 x 64 f32 partial sums: 512 bytes. */
	uint64_t cap = t->dev.max_scratch;
	t->dev.max_scratch = 256;
	backward_op(&op, &l, 0);
	GT_CHECK(checked(&op, "backward") && gt_run(t, lane, &op, 60) < 0 &&
		      strcmp(gt_err_name(&op), RP_ERR_LIMIT_EXCEEDED) == 0,
	      "backward refused with 256 bytes of scratch allowed: %s: %s", gt_err_name(&op), gt_err_message(&op.err));
	rp_error_clear(&op.err);
	/* d_x alone needs no scratch. */
	backward_op(&op, &l, 0);
	op.compute.present[RP_LNB_DWEIGHT] = op.compute.present[RP_LNB_DBIAS] = false;
	op.buffers[RP_LNB_DWEIGHT] = op.buffers[RP_LNB_DBIAS] = NULL;
	GT_CHECK(checked(&op, "backward, d_x only") && gt_run(t, lane, &op, 60) == 0,
	      "backward without d_weight and d_bias under the scratch cap: %s: %s", gt_err_name(&op),
	      gt_err_message(&op.err));
	rp_error_clear(&op.err);
	t->dev.max_scratch = cap;
	ln_free(t, &l);
}

/* The kernels alone, on a stream of this test: µs per call, averaged. */
static void timing(struct gt *t, enum rp_dtype dt, int64_t rows, int64_t n, uint64_t *seed)
{
	struct ln l;
	cudaStream_t s;
	cudaEvent_t e0, e1;
	void *partial = NULL;
	const int reps = 50;
	float ms_f = 0, ms_b = 0;

	ln_alloc(t, &l, dt, rows, n, n, seed);
	CUDA_OK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
	CUDA_OK(cudaEventCreate(&e0));
	CUDA_OK(cudaEventCreate(&e1));
	CUDA_OK(cudaMalloc(&partial, rk_layer_norm_backward_scratch(rows, n)));
	const struct rk_layer_norm f = {
		.dtype = (enum rk_dtype)dt, .rows = rows, .n = n, .x = l.x.ptr, .weight = l.w.ptr, .bias = l.b.ptr,
		.y = l.y.ptr, .x_ld = n, .y_ld = n, .mean = l.mean.ptr, .rstd = l.rstd.ptr, .eps = 1e-5f,
	};
	const struct rk_layer_norm_backward b = {
		.dtype = (enum rk_dtype)dt, .rows = rows, .n = n, .d_y = l.dy.ptr, .x = l.x.ptr, .weight = l.w.ptr,
		.d_residual = l.res.ptr, .mean = l.mean.ptr, .rstd = l.rstd.ptr, .d_x = l.dx.ptr, .d_weight = l.dw.ptr,
		.d_bias = l.db.ptr, .d_y_ld = n, .x_ld = n, .d_x_ld = n, .d_residual_ld = n, .partial = partial,
	};
	/* Once each to warm up, then timed. */
	CUDA_OK(rk_layer_norm(&f, s));
	CUDA_OK(rk_layer_norm_backward(&b, s));
	CUDA_OK(cudaEventRecord(e0, s));
	for (int i = 0; i < reps; i++)
		CUDA_OK(rk_layer_norm(&f, s));
	CUDA_OK(cudaEventRecord(e1, s));
	CUDA_OK(cudaEventSynchronize(e1));
	CUDA_OK(cudaEventElapsedTime(&ms_f, e0, e1));
	CUDA_OK(cudaEventRecord(e0, s));
	for (int i = 0; i < reps; i++)
		CUDA_OK(rk_layer_norm_backward(&b, s));
	CUDA_OK(cudaEventRecord(e1, s));
	CUDA_OK(cudaEventSynchronize(e1));
	CUDA_OK(cudaEventElapsedTime(&ms_b, e0, e1));
	double bytes = (double)rows * (double)n * (double)rp_dtype_size(dt);
	printf("  timing %s [%lld, %lld]: forward %.1f us/call (%.0f GB/s of x and y), backward with d_residual, "
	       "d_weight, d_bias %.1f us/call\n",
	       rp_dtype_name(dt), (long long)rows, (long long)n, 1e3 * ms_f / reps, 2 * bytes / (1e6 * ms_f / reps),
	       1e3 * ms_b / reps);
	cudaFree(partial);
	cudaEventDestroy(e0);
	cudaEventDestroy(e1);
	cudaStreamDestroy(s);
	ln_free(t, &l);
}

int main(void)
{
	if (gt_have_gpu())
		return GT_SKIP;
	struct gt t;
	uint64_t seed;
	struct rd_lane *lane = gt_start(&t, "test_cuda_layernorm", &seed);
	static const enum rp_dtype dts[] = { RP_DTYPE_F32, RP_DTYPE_F16, RP_DTYPE_BF16 };
	static const struct {
		int64_t rows, n, ld;
		double eps;
	} shapes[] = {
		{ 1, 1, 1, 1e-5 },          /* one element: y is the bias, d_x 0 */
		{ 7, 33, 33, 1e-5 },        /* less than a warp's columns each */
		{ 33, 768, 800, 1e-3 },     /* padded rows */
		{ 130, 2048, 2048, 1e-5 },  /* GPT width; more rows than a chunk */
		{ 4099, 1024, 1024, 1e-5 }, /* vectorised: each block many rows, the last rows a part of a block's */
		{ 257, 2048, 2051, 1e-5 },  /* n = 2048 with an odd row stride */
		{ 9, 8192, 8200, 1e-5 },    /* 1024 threads a row (row_threads' most), padded rows */
		{ 2, 65536, 65536, 1e-5 },  /* the longest row */
	};
	for (size_t d = 0; d < sizeof(dts) / sizeof(dts[0]); d++)
		for (size_t s = 0; s < sizeof(shapes) / sizeof(shapes[0]); s++)
			run_case(&t, lane, dts[d], shapes[s].rows, shapes[s].n, shapes[s].ld, shapes[s].eps, &seed);
	refusals(&t, lane, &seed);
	timing(&t, RP_DTYPE_BF16, 8192, 1024, &seed);
	timing(&t, RP_DTYPE_BF16, 8192, 2048, &seed);
	timing(&t, RP_DTYPE_F32, 8192, 2048, &seed);
	t.dev.backend->lane_destroy(lane);
	gt_close(&t);
	if (gt_failures) {
		printf("test_cuda_layernorm: %d failures (seed %llu)\n", gt_failures, (unsigned long long)seed);
		return 1;
	}
	printf("test_cuda_layernorm: PASS\n");
	return 0;
}
