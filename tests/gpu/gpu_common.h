/* SPDX-License-Identifier: Apache-2.0 */
/* Shared by the GPU test programs: a device driven the way the worker core
 * drives it (registry, post_completion, on_fault), device matrices wrapped as
 * buffers, host conversions and references. Exit codes: 0 pass, 1 fail,
 * 77 skipped (no GPU). */
#pragma once

#include <pthread.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <cuda_runtime_api.h>
#include "regen-config.h"
#include "daemon/backend/backend.h"
#include "daemon/backend/cuda/cuda.h"
#include "kernels/kernels.h"
#include "tests/lib/cuda_check.h"
#include "tests/lib/expect.h"

#define GT_SKIP 77

struct gt {
	struct rd_device dev;
	pthread_mutex_t lock;
	pthread_cond_t cond;
	unsigned completed;
	unsigned faults;
	enum rd_fault_kind fault_kind;   /* the last on_fault's */
	double first_fault_at;           /* gt_now() of the first on_fault, 0 before */
	char fault_reason[256];
};

/* 0 when a CUDA device is usable, else prints why and returns GT_SKIP. */
/* A check that goes on (tests/lib/expect.h): "ok:" or "FAIL file:line:"
 * and the message on stdout; the failures are counted in gt_failures, a
 * test's exit status. */
extern int gt_failures;
#define GT_CHECK(cond, ...) TL_EXPECT(gt_failures, cond, __VA_ARGS__)

int gt_have_gpu(void);
/* Registry, callbacks, the CUDA backend's open on device 0. Exits 1 on failure. */
void gt_open(struct gt *t);
void gt_close(struct gt *t);
/* What a test's main does first: prints the seed (gt_seed) under the
 * test's name, opens t and makes lane 0; exits 1 when the lane cannot be
 * made. Call after gt_have_gpu. */
struct rd_lane *gt_start(struct gt *t, const char *test, uint64_t *seed);
/* Waits until t->completed >= target; -1 after timeout_s. */
int gt_wait(struct gt *t, unsigned target, double timeout_s);
/* Waits until on_fault was called; -1 after timeout_s. */
int gt_wait_fault(struct gt *t, double timeout_s);
/* Submits and waits for one op; 0 when it succeeded. */
int gt_run(struct gt *t, struct rd_lane *lane, struct rd_op *op, double timeout_s);
const char *gt_err_name(const struct rd_op *op);
const char *gt_err_message(const struct rp_error *err);

/* A row-major matrix on the device, wrapped as a buffer. */
struct gt_mat {
	enum rp_dtype dt;
	int64_t rows, cols, ld;
	size_t bytes;
	bool is_vector;     /* rank 1 [cols] (bias) */
	void *ptr;
	struct rd_buffer *buf;
};
void gt_mat_alloc(struct gt *t, struct gt_mat *m, enum rp_dtype dt, int64_t rows, int64_t cols, int64_t ld);
void gt_mat_free(struct gt *t, struct gt_mat *m);
/* Random fill of the whole allocation (padding included). */
void gt_mat_fill(struct gt_mat *m, uint64_t seed, int scale_log2);
void gt_mat_poison(struct gt_mat *m);
/* Whole allocation to host as doubles (rows * ld elements). */
double *gt_mat_download(const struct gt_mat *m);
void gt_operand(struct rp_operand *op, const struct gt_mat *m);

/* A GEMM op over matrices (c, bias may be NULL). */
void gt_gemm(struct rd_op *op, struct gt_mat *a, struct gt_mat *b, struct gt_mat *c, struct gt_mat *d,
	     struct gt_mat *bias, bool trans_a, bool trans_b, double alpha, double beta, enum rp_epilogue epi,
	     enum rp_compute_mode compute);
/* dgelu's aux ([M, N], D's dtype) into op's aux slot. */
void gt_gemm_set_aux(struct rd_op *op, struct gt_mat *aux);
/* gelu_aux's aux_out ([M, N], D's dtype) into op's aux_out slot. */
void gt_gemm_set_aux_out(struct rd_op *op, struct gt_mat *aux_out);
/* ref[M*N] *= GELU'(aux), tanh GELU's slope: a dgelu reference from the
 * one gt_gemm_reference gave. */
void gt_gemm_reference_dgelu(const struct rd_op *op, struct gt_mat *aux, double *ref);
/* float64 reference of op (inputs downloaded), into ref[M*N]. */
void gt_gemm_reference(const struct rd_op *op, struct gt_mat *a, struct gt_mat *b, struct gt_mat *c,
		       struct gt_mat *bias, double *ref, bool gelu_erf);
/* ‖out − ref‖ / ‖ref‖ over D's [M,N]; counts NaN/unwritten elements and
 * padding elements that lost their poison. */
double gt_rel_error(const struct gt_mat *d, const double *ref, unsigned long *nan_count, unsigned long *pad_touched);

/* A driver-API function through the runtime, so the tests never link
 * libcuda.so.1 (and can exit 77 where there is no driver). Exits 1 if
 * missing. Use as DRV(cuMemCreate)(...). */
void *gt_driver_fn(const char *name);
#define DRV(fn) ((__typeof__(fn) *)gt_driver_fn(#fn))

double gt_half_to_double(uint16_t h);
double gt_bf16_to_double(uint16_t h);
uint64_t gt_seed(void);
double gt_now(void);
/* How many 32-bit words differ bitwise between device buffers a and b
 * (bytes a multiple of 4; rk_count_mismatch on the legacy stream). */
unsigned long long gt_mismatched_words(const void *a, const void *b, size_t bytes);
