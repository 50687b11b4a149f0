/* SPDX-License-Identifier: Apache-2.0 */
/* Programs whose generated kernels the tests check, and how: each one's
 * definition and input ranges, its bound memory filled with fresh random
 * values, the host backend's reference run (every node in double, rounded
 * to each tensor's dtype: daemon/backend/host/program_nodes.c), and the
 * comparison of a run's outputs with it. A test supplies the run itself:
 * on the GPU (tests/gpu/test_program_kernels.c), or emulated on the host
 * (tests/unit/test_program_emulated.c). */
#pragma once

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include "daemon/program/plan.h"
#include "proto/program.h"

/* A program as a client defines it ('quotes' for "quotes"); float inputs
 * are drawn on the grid of 1/64 in [lo, hi), integer ones in [0, int_hi)
 * (16 when 0). `steps`: how many steps the CUDA backend's plan must make
 * of it (what a fusion case is about; 0: not checked). `inherited`: each
 * result is held to the least precise of its own dtype and the half-
 * precision tensors the program computed on the way to it (a real model's
 * program, whose f32 results are casts and sums of bf16 values that a
 * fused kernel and the reference may round an ulp apart); else to its own
 * dtype's. */
struct tl_prog_case {
	const char *name;
	const char *json;
	double lo, hi;
	int64_t int_hi;
	int steps;
	bool inherited;
};
extern const struct tl_prog_case tl_prog_cases[];
extern const size_t tl_prog_ncases;

/* A case of the program in file `path` (the JSON REGEN_COMPILE_DUMP writes:
 * a compiled model's program as io.regen.Program.Define gets it), named by
 * its path, float inputs in [-1, 1), `inherited`. 0, or -errno (nothing allocated);
 * tl_prog_case_free gives back what it allocated. */
int tl_prog_case_read(struct tl_prog_case *c, const char *path);
void tl_prog_case_free(struct tl_prog_case *c);

/* A program, planned, with its memory on the host. */
struct tl_prog {
	struct rp_program p;
	struct rd_prog_plan plan;
	size_t *root_bytes;     /* per root tensor: past its furthest view */
	void **initial;         /* per bound root: inputs' and inouts' values, outputs poisoned */
	void **ref;             /* per root: the reference run's memory */
	double *scalars;        /* by bind_index */
	/* per root, for an `inherited` case: the tolerance of the least
	 * precise half-precision tensor the program computed on the way to it
	 * (0: none) */
	double *upstream_tolerance;
};

/* Parses and plans c, draws its inputs (stream `salt`). 0, or -1 with why
 * set. tl_prog_close in both cases. */
int tl_prog_open(struct tl_prog *t, const struct tl_prog_case *c, uint64_t salt, char *why, size_t why_size);
void tl_prog_close(struct tl_prog *t);
/* The reference, from the initial values into ref[]. 0 or the failing
 * node's error (-errno). */
int tl_prog_reference(struct tl_prog *t);
/* Runs library step s's node (a GEMM, an attention) with the host
 * backend's math (the reference's) over a run's memory on the host:
 * bound[] by bind_index and the arena, laid out as the plan says; what
 * the tests do in place of cuBLASLt and cuDNN, around the kernels they
 * launch. 0 or the node's error (-errno). */
int tl_prog_run_library(const struct tl_prog *t, int s, void *const *bound, void *arena);
/* Compares root tensor r's bytes from a run with the reference: relative
 * error over the tensor within the dtype's tolerance, NaN and infinities
 * where the reference has them, integers exact, untouched elements (still
 * poisoned) exactly where the reference left them. Describes the outcome
 * in msg. */
bool tl_prog_compare(const struct tl_prog *t, int r, const void *got, char *msg, size_t msg_size);
/* Whether root r is an output or an inout (what tl_prog_compare checks). */
bool tl_prog_is_result(const struct tl_prog *t, int r);
