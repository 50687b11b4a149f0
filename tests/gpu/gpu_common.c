/* SPDX-License-Identifier: Apache-2.0 */
/* Helpers of the GPU tests: see gpu_common.h. */
#include "gpu_common.h"

#include <math.h>
#include <string.h>
#include <time.h>
#include <errno.h>
#include <cjson/cJSON.h>

int gt_failures;

int gt_have_gpu(void)
{
	int n = 0;
	cudaError_t e = cudaGetDeviceCount(&n);
	if (e != cudaSuccess || n == 0) {
		printf("SKIP: no CUDA device (%s, %d devices)\n", e != cudaSuccess ? cudaGetErrorString(e) : "ok", n);
		return GT_SKIP;
	}
	return 0;
}

static void gt_post_completion(struct rd_device *dev, struct rd_op *op)
{
	struct gt *t = (struct gt *)dev;
	pthread_mutex_lock(&t->lock);
	t->completed++;
	op->userdata = (void *)1;
	pthread_cond_broadcast(&t->cond);
	pthread_mutex_unlock(&t->lock);
}

static void gt_on_fault(struct rd_device *dev, enum rd_fault_kind kind, const char *reason)
{
	struct gt *t = (struct gt *)dev;
	pthread_mutex_lock(&t->lock);
	t->faults++;
	t->fault_kind = kind;
	if (!t->first_fault_at)
		t->first_fault_at = gt_now();
	snprintf(t->fault_reason, sizeof(t->fault_reason), "%s", reason);
	pthread_cond_broadcast(&t->cond);
	pthread_mutex_unlock(&t->lock);
}

void gt_open(struct gt *t)
{
	memset(t, 0, sizeof(*t));
	pthread_mutex_init(&t->lock, NULL);
	pthread_cond_init(&t->cond, NULL);
	t->dev.index = 0;
	atomic_init(&t->dev.generation, 1);
	t->dev.backend = rd_backend_cuda_entry(REGEN_VERSION);
	t->dev.post_completion = gt_post_completion;
	t->dev.on_fault = gt_on_fault;
	rd_registry_init(&t->dev.registry, 0);
	struct rp_error err = { 0 };
	if (t->dev.backend->open(&t->dev, &err) < 0) {
		fprintf(stderr, "FAIL: open: %s: %s\n", err.name, gt_err_message(&err));
		exit(1);
	}
}

struct rd_lane *gt_start(struct gt *t, const char *test, uint64_t *seed)
{
	struct rp_error err = { 0 };

	*seed = gt_seed();
	printf("%s: seed %llu (REGEN_TEST_SEED=%llu repeats it)\n", test, (unsigned long long)*seed,
	       (unsigned long long)*seed);
	gt_open(t);
	struct rd_lane *lane = t->dev.backend->lane_create(&t->dev, 0, &err);
	if (!lane) {
		fprintf(stderr, "FAIL: lane_create: %s\n", gt_err_message(&err));
		exit(1);
	}
	return lane;
}

void gt_close(struct gt *t)
{
	t->dev.backend->close(&t->dev);
	rd_registry_finish(&t->dev.registry);
}

double gt_now(void)
{
	struct timespec ts;
	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

int gt_wait(struct gt *t, unsigned target, double timeout_s)
{
	struct timespec dl;
	clock_gettime(CLOCK_REALTIME, &dl);
	double end = (double)dl.tv_sec + (double)dl.tv_nsec * 1e-9 + timeout_s;
	dl.tv_sec = (time_t)end;
	dl.tv_nsec = (long)((end - (double)dl.tv_sec) * 1e9);
	int r = 0;
	pthread_mutex_lock(&t->lock);
	while (t->completed < target && r == 0)
		r = pthread_cond_timedwait(&t->cond, &t->lock, &dl);
	bool ok = t->completed >= target;
	pthread_mutex_unlock(&t->lock);
	return ok ? 0 : -1;
}

int gt_run(struct gt *t, struct rd_lane *lane, struct rd_op *op, double timeout_s)
{
	pthread_mutex_lock(&t->lock);
	unsigned target = t->completed + 1;
	pthread_mutex_unlock(&t->lock);
	op->lane = lane;
	if (t->dev.backend->submit(lane, op) < 0)
		return -1;
	if (gt_wait(t, target, timeout_s) < 0) {
		fprintf(stderr, "FAIL: op did not complete within %.0f s\n", timeout_s);
		exit(1);
	}
	return op->err.name ? -1 : 0;
}

const char *gt_err_message(const struct rp_error *err)
{
	if (!err->params)
		return "";
	cJSON *m = cJSON_GetObjectItem(err->params, "message");
	return cJSON_IsString(m) ? m->valuestring : "";
}

const char *gt_err_name(const struct rd_op *op)
{
	return op->err.name ? op->err.name : "(success)";
}

static enum rk_dtype rk_of(enum rp_dtype dt)
{
	return dt == RP_DTYPE_F16 ? RK_F16 : dt == RP_DTYPE_BF16 ? RK_BF16 : RK_F32;
}

void gt_mat_alloc(struct gt *t, struct gt_mat *m, enum rp_dtype dt, int64_t rows, int64_t cols, int64_t ld)
{
	memset(m, 0, sizeof(*m));
	m->dt = dt;
	m->rows = rows;
	m->cols = cols;
	m->ld = ld;
	m->bytes = (size_t)(rows * ld) * rp_dtype_size(dt);
	CUDA_OK(cudaMalloc(&m->ptr, m->bytes));
	if (rd_cuda_buffer_wrap_local(&t->dev, m->ptr, m->bytes, &m->buf) < 0) {
		fprintf(stderr, "FAIL: rd_cuda_buffer_wrap_local\n");
		exit(1);
	}
}

void gt_mat_free(struct gt *t, struct gt_mat *m)
{
	if (m->buf)
		t->dev.backend->close_buffer(m->buf);
	if (m->ptr)
		cudaFree(m->ptr);
	m->buf = NULL;
	m->ptr = NULL;
}

void gt_mat_fill(struct gt_mat *m, uint64_t seed, int scale_log2)
{
	CUDA_OK(rk_fill_uniform(m->ptr, (size_t)(m->rows * m->ld), rk_of(m->dt), seed, scale_log2, 0));
	CUDA_OK(cudaStreamSynchronize(0));
}

void gt_mat_poison(struct gt_mat *m)
{
	CUDA_OK(rk_fill_nan(m->ptr, (size_t)(m->rows * m->ld), rk_of(m->dt), 0));
	CUDA_OK(cudaStreamSynchronize(0));
}

double gt_half_to_double(uint16_t h)
{
	int s = h >> 15, e = (h >> 10) & 0x1f, f = h & 0x3ff;
	double v;
	if (e == 0)
		v = ldexp((double)f, -24);
	else if (e == 31)
		v = f ? NAN : INFINITY;
	else
		v = ldexp((double)(f | 0x400), e - 25);
	return s ? -v : v;
}

double gt_bf16_to_double(uint16_t h)
{
	uint32_t u = (uint32_t)h << 16;
	float f;
	memcpy(&f, &u, sizeof(f));
	return (double)f;
}

double *gt_mat_download(const struct gt_mat *m)
{
	size_t n = (size_t)(m->rows * m->ld);
	void *raw = malloc(m->bytes);
	double *out = malloc(n * sizeof(double));
	if (!raw || !out) {
		fprintf(stderr, "FAIL: out of host memory\n");
		exit(1);
	}
	CUDA_OK(cudaMemcpy(raw, m->ptr, m->bytes, cudaMemcpyDeviceToHost));
	for (size_t i = 0; i < n; i++) {
		switch (m->dt) {
		case RP_DTYPE_F16: out[i] = gt_half_to_double(((uint16_t *)raw)[i]); break;
		case RP_DTYPE_BF16: out[i] = gt_bf16_to_double(((uint16_t *)raw)[i]); break;
		default: out[i] = (double)((float *)raw)[i]; break;
		}
	}
	free(raw);
	return out;
}

void gt_operand(struct rp_operand *op, const struct gt_mat *m)
{
	memset(op, 0, sizeof(*op));
	op->buffer.kind = RP_ID_BUFFER;
	op->offset = 0;
	op->dtype = m->dt;
	if (m->is_vector) {
		/* Vectors (bias) are rank 1. */
		op->rank = 1;
		op->shape[0] = m->cols;
		op->strides[0] = 1;
		return;
	}
	op->rank = 2;
	op->shape[0] = m->rows;
	op->shape[1] = m->cols;
	op->strides[0] = m->ld;
	op->strides[1] = 1;
}

void gt_gemm(struct rd_op *op, struct gt_mat *a, struct gt_mat *b, struct gt_mat *c, struct gt_mat *d,
	     struct gt_mat *bias, bool trans_a, bool trans_b, double alpha, double beta, enum rp_epilogue epi,
	     enum rp_compute_mode compute)
{
	memset(op, 0, sizeof(*op));
	struct rp_compute *cp = &op->compute;
	struct rp_gemm *g = &cp->gemm;
	struct gt_mat *mats[RP_GEMM_OPERANDS] = {
		[RP_GEMM_A] = a, [RP_GEMM_B] = b, [RP_GEMM_C] = c, [RP_GEMM_D] = d, [RP_GEMM_BIAS] = bias,
	};
	cp->spec = &rp_op_gemm;
	for (int i = 0; i < RP_GEMM_OPERANDS; i++) {
		if (!mats[i])
			continue;
		gt_operand(&cp->operands[i], mats[i]);
		cp->present[i] = true;
		op->buffers[i] = mats[i]->buf;
	}
	g->trans_a = trans_a;
	g->trans_b = trans_b;
	g->alpha = alpha;
	g->beta = beta;
	g->epilogue = epi;
	g->compute = compute;
	g->m = trans_a ? a->cols : a->rows;
	g->k = trans_a ? a->rows : a->cols;
	g->n = trans_b ? b->rows : b->cols;
}

static double gelu_tanh(double x)
{
	return 0.5 * x * (1.0 + tanh(0.7978845608028654 * (x + 0.044715 * x * x * x)));
}

static double gelu_erf(double x)
{
	return 0.5 * x * (1.0 + erf(x / sqrt(2.0)));
}

/* d/dx gelu_tanh (torch's gelu_backward(1, x, approximate="tanh")). */
static double dgelu_tanh(double x)
{
	const double c = 0.7978845608028654, t = tanh(c * (x + 0.044715 * x * x * x));

	return 0.5 * (1.0 + t) + 0.5 * x * (1.0 - t * t) * c * (1.0 + 3.0 * 0.044715 * x * x);
}

void gt_gemm_set_aux(struct rd_op *op, struct gt_mat *aux)
{
	gt_operand(&op->compute.operands[RP_GEMM_AUX], aux);
	op->compute.present[RP_GEMM_AUX] = true;
	op->buffers[RP_GEMM_AUX] = aux->buf;
}

void gt_gemm_set_aux_out(struct rd_op *op, struct gt_mat *aux_out)
{
	gt_operand(&op->compute.operands[RP_GEMM_AUX_OUT], aux_out);
	op->compute.present[RP_GEMM_AUX_OUT] = true;
	op->buffers[RP_GEMM_AUX_OUT] = aux_out->buf;
}

void gt_gemm_reference_dgelu(const struct rd_op *op, struct gt_mat *aux, double *ref)
{
	const struct rp_gemm *g = &op->compute.gemm;
	double *haux = gt_mat_download(aux);

	for (int64_t i = 0; i < g->m; i++) {
		for (int64_t j = 0; j < g->n; j++)
			ref[i * g->n + j] *= dgelu_tanh(haux[i * aux->ld + j]);
	}
	free(haux);
}

void gt_gemm_reference(const struct rd_op *op, struct gt_mat *a, struct gt_mat *b, struct gt_mat *c,
		       struct gt_mat *bias, double *ref, bool use_erf)
{
	const struct rp_gemm *g = &op->compute.gemm;
	double *ha = gt_mat_download(a), *hb = gt_mat_download(b);
	double *hc = c ? gt_mat_download(c) : NULL;
	double *hbias = bias ? gt_mat_download(bias) : NULL;
	int64_t M = g->m, N = g->n, K = g->k;
	for (int64_t i = 0; i < M; i++) {
		for (int64_t j = 0; j < N; j++) {
			double acc = 0;
			for (int64_t k = 0; k < K; k++) {
				double x = g->trans_a ? ha[k * a->ld + i] : ha[i * a->ld + k];
				double y = g->trans_b ? hb[j * b->ld + k] : hb[k * b->ld + j];
				acc += x * y;
			}
			double v = g->alpha * acc;
			if (hc)
				v += g->beta * hc[i * c->ld + j];
			if (hbias)
				v += hbias[j];
			if (g->epilogue == RP_EPILOGUE_GELU || g->epilogue == RP_EPILOGUE_GELU_BIAS ||
			    g->epilogue == RP_EPILOGUE_GELU_AUX || g->epilogue == RP_EPILOGUE_GELU_AUX_BIAS)
				v = use_erf ? gelu_erf(v) : gelu_tanh(v);
			ref[i * N + j] = v;
		}
	}
	free(ha);
	free(hb);
	free(hc);
	free(hbias);
}

double gt_rel_error(const struct gt_mat *d, const double *ref, unsigned long *nan_count, unsigned long *pad_touched)
{
	double *hd = gt_mat_download(d);
	double num = 0, den = 0;
	unsigned long nans = 0, pad = 0;
	for (int64_t i = 0; i < d->rows; i++) {
		for (int64_t j = 0; j < d->ld; j++) {
			double v = hd[i * d->ld + j];
			if (j >= d->cols) {
				if (!isnan(v))
					pad++;
				continue;
			}
			double r = ref[i * d->cols + j];
			if (!isfinite(v)) {
				nans++;
				continue;
			}
			num += (v - r) * (v - r);
			den += r * r;
		}
	}
	free(hd);
	*nan_count = nans;
	*pad_touched = pad;
	if (nans)
		return INFINITY;
	return den > 0 ? sqrt(num / den) : sqrt(num);
}

void *gt_driver_fn(const char *name)
{
	void *p = NULL;
	enum cudaDriverEntryPointQueryResult q = cudaDriverEntryPointSymbolNotFound;
	cudaError_t e = cudaGetDriverEntryPointByVersion(name, &p, 12000, cudaEnableDefault, &q);
	if (e != cudaSuccess || q != cudaDriverEntryPointSuccess || !p) {
		fprintf(stderr, "FAIL: driver entry point %s: %s\n", name, cudaGetErrorString(e));
		exit(1);
	}
	return p;
}

uint64_t gt_seed(void)
{
	const char *s = getenv("REGEN_TEST_SEED");
	if (s && *s)
		return strtoull(s, NULL, 0);
	struct timespec ts;
	clock_gettime(CLOCK_REALTIME, &ts);
	return ((uint64_t)ts.tv_sec * 1000003u) ^ (uint64_t)ts.tv_nsec;
}

int gt_wait_fault(struct gt *t, double timeout_s)
{
	struct timespec until;
	clock_gettime(CLOCK_REALTIME, &until);
	double end = (double)until.tv_sec + (double)until.tv_nsec * 1e-9 + timeout_s;
	until.tv_sec = (time_t)end;
	until.tv_nsec = (long)((end - (double)until.tv_sec) * 1e9);
	pthread_mutex_lock(&t->lock);
	int r = 0;
	while (!t->faults && r != ETIMEDOUT)
		r = pthread_cond_timedwait(&t->cond, &t->lock, &until);
	int got = t->faults ? 0 : -1;
	pthread_mutex_unlock(&t->lock);
	return got;
}

unsigned long long gt_mismatched_words(const void *a, const void *b, size_t bytes)
{
	unsigned long long *d_count, n = 0;

	CUDA_OK(cudaMalloc((void **)&d_count, sizeof(*d_count)));
	CUDA_OK(cudaMemset(d_count, 0, sizeof(*d_count)));
	CUDA_OK(rk_count_mismatch(a, b, bytes, d_count, 0));
	CUDA_OK(cudaMemcpy(&n, d_count, sizeof(n), cudaMemcpyDeviceToHost));
	CUDA_OK(cudaFree(d_count));
	return n;
}
