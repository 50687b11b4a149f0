/* SPDX-License-Identifier: Apache-2.0 */
/* Tests through libregen, on top of the rest of tests/lib: a client of the
 * test's daemon, its Status, memfd buffers imported into a worker, and GEMM,
 * attention and LayerNorm cases run through regend and checked against the float64
 * references of reference.h. */
#pragma once

#include <errno.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include "regen.h"
#include "tests/lib/asserts.h"
#include "tests/lib/daemon.h"
#include "tests/lib/memfd.h"

/* A libregen call that returns 0 or more, or a negative errno: on failure
 * prints the errno and the named error regend answered with. */
void tl_fail_regen(const char *file, int line, const char *expr, regen_client *c, int r, const char *fmt, ...)
	__attribute__((format(printf, 6, 7), noreturn));
#define ASSERT_REGEN_OK(c, expr, ...)                                                         \
	do {                                                                                  \
		int tl_r_ = (expr);                                                           \
		if (tl_r_ < 0) {                                                              \
			tl_fail_regen(__FILE__, __LINE__, #expr, (c), tl_r_, TL_MSG(__VA_ARGS__)); \
		}                                                                             \
	} while (0)
/* A libregen call that must fail with the named error `name`. */
#define ASSERT_REGEN_ERROR(c, expr, name, ...)                                                \
	do {                                                                                  \
		int tl_r_ = (expr);                                                           \
		if (tl_r_ != -EREMOTE || !tl_str_eq(regen_client_error_name(c), (name))) {    \
			tl_fail_regen(__FILE__, __LINE__, #expr " failed with " #name, (c), tl_r_, \
				      TL_MSG(__VA_ARGS__));                                   \
		}                                                                             \
	} while (0)

/* Under REGEN_TRANSPORT=ring (or varlink), the device's lane must have used
 * that transport for the call just made: the suite's second run is on the
 * ring for real. */
void tl_check_transport(regen_client *c, int device);

/* A client of d's main socket, with a 30 s timeout per call. */
regen_client *tl_client_connect(const struct tl_daemon *d);
/* Status, or the test fails (regen_status_free). */
regen_status *tl_status(regen_client *c);
/* The device with this index in st, or the test fails. */
const struct regen_device_info *tl_status_device(const regen_status *st, int index);
/* Polls Status until `device` is ready in a generation > `after`; returns
 * that generation (fails the test after timeout_s, scaled). */
uint64_t tl_wait_generation(regen_client *c, int device, uint64_t after, double timeout_s);

/* A memfd imported into a worker. */
struct tl_buffer {
	struct tl_memfd mem;
	regen_buffer *buf;          /* NULL until imported */
};
/* Creates, maps and imports (fails the test on error). */
void tl_buffer_create(regen_client *c, int device, size_t size, struct tl_buffer *b);
/* Creates and maps only. */
void tl_buffer_alloc(size_t size, struct tl_buffer *b);
/* Imports (again, after a generation change: the old id is closed first);
 * returns libregen's result. */
int tl_buffer_import(regen_client *c, int device, struct tl_buffer *b);
void tl_buffer_free(struct tl_buffer *b);

/* A GEMM on one buffer: fresh random inputs, D poisoned, a reference. */
struct tl_gemm_case {
	enum regen_dtype in, out;
	int m, n, k;
	bool trans_a, trans_b;
	double alpha, beta;
	bool with_c;
	bool with_bias;
	enum regen_epilogue epilogue;   /* DGELU: an aux shaped and strided like D */
	int pad;                    /* extra elements per row of A, B, C, D, aux (strides) */
};
/* Bytes the case needs. */
size_t tl_gemm_bytes(const struct tl_gemm_case *gc);
/* Fills the inputs at b's memory + base, poisons D, runs regen_gemm and
 * checks D (and that D's row padding and aux are untouched). Returns regen_gemm's
 * result when it failed; else 0, or 1 with what is wrong in `why`. */
int tl_gemm_run(regen_client *c, struct tl_buffer *b, uint64_t base, const struct tl_gemm_case *gc, char *why,
		size_t why_size);
void tl_gemm_random_case(struct tl_gemm_case *gc, int max_dim);
/* A random GEMM of dimensions up to 24 at the start of b must run and be
 * right; `what` names it in the failure. */
#define ASSERT_GEMM_OK(c, b, what) tl_gemm_ok_at(__FILE__, __LINE__, (c), (b), (what))
void tl_gemm_ok_at(const char *file, int line, regen_client *c, struct tl_buffer *b, const char *what);
void tl_gemm_describe(const struct tl_gemm_case *gc, char *buf, size_t size);

/* Attention forward, then backward, on buffers of its own. */
#define TL_ATTN_BATCH_MAX 8
struct tl_attn_case {
	enum regen_dtype dt;
	int b, h, sq, skv, d, dv;
	bool causal;
	double scale;               /* 0: the default, 1/sqrt(d) */
	bool bottom_right;          /* the causal diagonal aligned bottom-right */
	/* Sequence lengths (b <= TL_ATTN_BATCH_MAX): each entry's, passed as
	 * seq_len_q and seq_len_kv; the padding rows of q, k, v and d_o hold
	 * NaN, which must reach no result. */
	bool varlen;
	int32_t seq_len_q[TL_ATTN_BATCH_MAX], seq_len_kv[TL_ATTN_BATCH_MAX];
};
/* The same contract as tl_gemm_run. */
int tl_attention_run(regen_client *c, int device, const struct tl_attn_case *ac, char *why, size_t why_size);
void tl_attn_describe(const struct tl_attn_case *ac, char *buf, size_t size);

/* LayerNorm forward, then its backward, on one buffer of their own: x,
 * y, d_y, d_x and d_residual [rows, n] with rows padded by `pad` elements
 * (the padding must stay untouched), fresh random inputs, outputs poisoned,
 * each result against the float64 reference (the backward's from the
 * forward's statistics as stored). */
struct tl_ln_case {
	enum regen_dtype dt;
	int rows, n, pad;
	double eps;                 /* 0: regend's default, 1e-5 */
	bool bias;
	int residual;               /* 0 none, 1 d_residual apart, 2 d_x in place of d_residual */
	bool param_grads;           /* d_weight and d_bias */
};
/* The same contract as tl_gemm_run. */
int tl_layer_norm_run(regen_client *c, int device, const struct tl_ln_case *lc, char *why, size_t why_size);
void tl_ln_describe(const struct tl_ln_case *lc, char *buf, size_t size);
