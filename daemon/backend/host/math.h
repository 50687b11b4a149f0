/* Reference math for the host backend: GEMM and attention in C, f32
 * accumulation whatever the storage type. Inputs are validated descriptors
 * (proto/compute.h) with their buffers resolved to host pointers. */
#pragma once

#include <stddef.h>
#include <stdint.h>
#include "proto/compute.h"

/* Storage conversions, round-to-nearest-even, NaN kept NaN. */
uint16_t rd_f32_to_bf16(float f);
float rd_bf16_to_f32(uint16_t h);
uint16_t rd_f32_to_f16(float f);
float rd_f16_to_f32(uint16_t h);

/* Base pointers already include each operand's byte offset. */
struct rd_gemm_ptrs {
	const void *a, *b, *c, *bias;
	void *d;
};

/* D = epilogue(alpha * op(A) op(B) + beta * C + bias); GELU is the tanh
 * approximation, as cuBLASLt's epilogue. It takes no scratch: its packed
 * panels are malloc'ed per call. 0, or -ENOMEM for those panels, -EINVAL
 * for an empty shape. */
int rd_host_gemm(const struct rp_gemm *g, const struct rd_gemm_ptrs *p);

struct rd_attention_ptrs {
	const void *q, *k, *v;
	void *o;
	float *stats;        /* may be NULL */
};

/* Scratch for one call, in bytes, so the caller can pass its lane's buffer
 * (grown to the largest call's need) rather than malloc per call. */
size_t rd_host_attention_scratch_size(const struct rp_attention *a);
int rd_host_attention(const struct rp_attention *a, const struct rd_attention_ptrs *p, void *scratch, size_t scratch_size);

struct rd_attention_backward_ptrs {
	const void *q, *k, *v, *o, *d_o;
	const float *stats;
	void *d_q, *d_k, *d_v;
};

size_t rd_host_attention_backward_scratch_size(const struct rp_attention_backward *a);
int rd_host_attention_backward(const struct rp_attention_backward *a, const struct rd_attention_backward_ptrs *p, void *scratch, size_t scratch_size);
