/* SPDX-License-Identifier: Apache-2.0 */
/* A program's plan for the CUDA backend: the launches of one Run in
 * program order, where every tensor lives, and the CUDA C of the kernels
 * regend writes itself.
 *
 * From a checked struct rp_program (proto/program.h) rd_prog_plan_build
 * makes a list of steps, run one after the other:
 *
 * - LIBRARY: one compute node (gemm, attention, layer_norm, ...), which the
 *   executor runs through cuBLASLt, cuDNN or the project's kernels.
 * - FUSED: pointwise nodes over one iteration domain (their output shape),
 *   one kernel. A node joins a group of its output's shape when it reads
 *   only what is in memory before the group runs or what the group
 *   produced at the same element index (or a recomputed tensor, below,
 *   whose sources the group does not write); two accesses of one root
 *   inside a group, one of them a write, are either the identical view
 *   (the same thread touches the same element, in order) or disjoint. A node may
 *   join a group ahead of nodes it does not depend on (plan.c's window), so
 *   a row statistic or an iota between two nodes of a chain does not cut
 *   it.
 * - REDUCTION: one reduction node, with a group over its input's shape
 *   fused in as its prologue. A reduction over the last dim also takes an
 *   epilogue: pointwise nodes that consume its result (or join a pass the
 *   epilogue makes anyway), over the reduced shape (once a row: rsqrt(mean
 *   + eps)) or over the input's shape (x * rstd), reading the row's values
 *   and the prologue's from registers. Its kernel passes over each row
 *   twice: the prologue and the accumulation, then (once the row's result
 *   is known to the row's threads) the prologue again where the epilogue
 *   reads it and the epilogue; the row is read twice (the second time
 *   mostly from cache), nothing is written between the passes.
 * - GATHER: an embedding or its backward (which sorts the positions by
 *   index, then sums each index's rows in position order: deterministic,
 *   O(N log N) in the N positions).
 * Library calls and gathers keep their order among themselves; the other
 * steps run before or after them wherever neither touches what the other
 * writes (so SwiGLU's silu(x W1) waits past x W3 and takes the product,
 * and silu's backward runs ahead of GEMMs that do not read it).
 *
 * A tensor produced in a step and read by no later node (an intermediate,
 * or a view of one, whose root no later node reads) stays in registers;
 * every other write goes to memory. Materialized intermediate roots live in
 * one arena, at 256-byte aligned offsets, roots whose step lifetimes do not
 * overlap sharing bytes: so the steps must run in program order (one
 * stream, or a graph captured from it), which is also what in-place nodes
 * need.
 *
 * Every generated kernel takes one parameter, `const struct rg_args *a`, in
 * device memory, laid out as rd_prog_args_fill writes it (the generated
 * source declares the same struct):
 *     void *bound[NBOUND];     each bound root's device address (buffer
 *                              mapping + the Run's offset), by bind_index
 *     char *arena;             the scratch arena, arena_bytes long
 *     struct rd_prog_fault *fault;   where the Run's first bad index is
 *                              reported (host memory the device maps)
 *     double scalar[NBOUND];   scalars' values, by bind_index
 * NBOUND is max(p->nbound, 1). Shapes, strides, offsets and constants are
 * literals in the source: a program's shapes are static.
 *
 * No CUDA here: this builds and is tested without a GPU or a toolkit. */
#pragma once

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include "proto/message.h"
#include "proto/program.h"

enum rd_prog_step_kind { RD_STEP_LIBRARY = 0, RD_STEP_FUSED, RD_STEP_REDUCTION, RD_STEP_GATHER };

#define RD_PROG_KERNEL_NAME_MAX 64
/* Tensors in memory a recomputed root (rd_prog_plan.recomputed) may be
 * computed from. */
#define RD_PROG_SOURCES_MAX 4
/* Arena offsets are multiples of this. */
#define RD_PROG_ARENA_ALIGN 256
/* An arena_offset[] entry for a tensor whose root is not in the arena (a
 * bound root, or an intermediate that never leaves registers). */
#define RD_PROG_NOT_IN_ARENA UINT64_MAX

/* A recomputed root's elements as a dense array of `rank` dims, dim k
 * of shape[k] elements stepped by strides[k] in the root (a dim of one
 * element by none): the root's own shape when it is contiguous, or the
 * order a writer's view steps through it (torch keeps a transposed
 * input's strides in a pointwise node's output). Every element of the
 * root is at one place of it; its writers' outputs are boxes of it
 * (rd_prog_box_in). */
struct rd_prog_frame {
	int rank;
	int64_t shape[RP_PROG_RANK_MAX];
	int64_t strides[RP_PROG_RANK_MAX];
};

/* One kernel of a step, launched 1-D: every generated kernel loops over its
 * blocks of work (blockIdx.x, blockIdx.x + gridDim.x, ...), so any grid
 * from 1 to `blocks` is correct; rd_prog_kernel_grid picks one. */
struct rd_prog_kernel {
	char name[RD_PROG_KERNEL_NAME_MAX];   /* extern "C" __global__ name: "k3_fused_gelu_mul" */
	unsigned block;                       /* threads per block */
	uint64_t blocks;                      /* blocks that cover the work once (0: nothing to do, skip) */
	unsigned blocks_per_sm;               /* the grid's cap, per SM (RD_PROG_GRID_UNCAPPED: none) */
};
#define RD_PROG_GRID_UNCAPPED 0u

struct rd_prog_step {
	enum rd_prog_step_kind kind;
	/* Its nodes in the order they run (a node may run ahead of nodes
	 * before it in the definition that it does not depend on; each
	 * dependency keeps its order); a REDUCTION's one reduction node
	 * comes after its prologue and before its epilogue. first_node is
	 * nodes[0]: a LIBRARY or GATHER step's one node. */
	const int *nodes;
	int nnodes;
	int first_node;
	/* FUSED, REDUCTION, GATHER: the CUDA C of the step's kernels (one
	 * translation unit), launched in order; NULL and 0 for LIBRARY. */
	char *source;
	size_t source_len;
	/* FNV-1a of the source text: a module cache's key (with the
	 * architecture and the compiler's version). */
	uint64_t source_hash;
	/* Launched in order: one for most steps; a leading-axis reduction's
	 * partial and final passes; an embedding's gather and its report; an
	 * embedding backward's zeroing, its sort (a pass per doubling of its
	 * positions past 1024), its rows and its report. */
	int nkernels;
	struct rd_prog_kernel *kernels;
	/* Arena bytes the step uses for itself (a leading reduction's partial
	 * sums), at this offset; 0 bytes: none. Inside arena_bytes. */
	uint64_t scratch_offset, scratch_bytes;
};

struct rd_prog_plan {
	struct rd_prog_step *steps;
	int nsteps;
	/* Per tensor index: the byte offset of the tensor's root in the arena
	 * (the tensor itself lies root_offset elements further), or
	 * RD_PROG_NOT_IN_ARENA. */
	uint64_t *arena_offset;
	int ntensors;
	/* Per node: whether its outputs are written to memory. A pointwise
	 * node inside a group may keep its output in registers (read by no
	 * later step, or overwritten in place later in the group), and so may
	 * a reduction with an epilogue (read by no later step); every other
	 * node's outputs are always written. */
	bool *node_stored;
	int *order;                 /* every node, step after step: what steps' nodes point into */
	/* Per tensor: the iota, fill or dropout_mask node whose value its
	 * readers (all pointwise, through that very view; a fill's through
	 * any) compute where they read it, or -1. That node is in no step,
	 * and the tensor never in memory. */
	int *computed_inline;
	/* Per tensor: whether its root is recomputed where it is read: an
	 * intermediate that pointwise nodes write as boxes of its frame
	 * (below: a cat's parts, a slice's gradient into zeros, or one node
	 * the whole) from memory that stays as it is until its last reader,
	 * read only by pointwise nodes after its last writer, through views
	 * that stretch none of it (a broadcast would compute an element
	 * again for each place it is read at), at other elements than
	 * their own (a rotate-half's halves, a transpose, a reshape), or only
	 * by other such writers. A reader
	 * computes the element it reads from the last writer whose box holds
	 * it, at that writer's element, the writer's inputs loaded there (or
	 * recomputed in turn); its writers are in no step, and it is never in
	 * memory. sources[] lists, per recomputed root, the tensors in memory
	 * its elements are computed from, at other elements than the
	 * reader's own (nsources of them); frame[] its frame. */
	bool *recomputed;
	int (*sources)[RD_PROG_SOURCES_MAX];
	int *nsources;
	struct rd_prog_frame *frame;
	uint64_t arena_bytes;
	/* With embedding steps: where in the arena their kernels note the
	 * first index outside the table (a struct rd_prog_fault, zeroed when
	 * the arena is made and by each step's report kernel, which copies a
	 * raised one to rg_args.fault). RD_PROG_NOT_IN_ARENA without. */
	uint64_t fault_offset;
	int nbound;                 /* p->nbound: what rg_args holds */
	uint64_t fused_kernels;     /* kernels over all steps (Status) */
};

/* What a Run's kernels report: the first index found outside its table
 * (which read as a row of zeros, or added to no row). The generated
 * source declares the same layout as struct rg_fault. */
struct rd_prog_fault {
	uint32_t raised;            /* 0: nothing to report */
	int32_t node;
	int64_t position;           /* flat, in the index tensor's elements */
	int64_t value;
	uint64_t reserved;
};
_Static_assert(sizeof(struct rd_prog_fault) == 32, "rg_fault's layout");

/* Plans p (checked, as rp_program_parse leaves it): groups its nodes into
 * steps, lays the arena out and writes each step's source. 0, or -ENOMEM
 * (OutOfMemory) or -EINVAL (BackendError: something the checker should have
 * refused, named) with err set and *plan zeroed. */
int rd_prog_plan_build(const struct rp_program *p, struct rd_prog_plan *plan, struct rp_error *err);
void rd_prog_plan_finish(struct rd_prog_plan *plan);

/* The device address of tensor t for a Run: bound[] the bound roots' base
 * addresses by bind_index (as in rg_args), arena the arena's base. NULL for
 * a scalar or an intermediate that is never materialized. */
void *rd_prog_tensor_address(const struct rd_prog_plan *plan, const struct rp_program *p, int t, void *const *bound,
			     void *arena);

/* rg_args' size in bytes for the plan, and its contents: bound[] and
 * scalars[] by bind_index (p->nbound entries each; scalars' slots of bound
 * and the others' of scalars are ignored). */
size_t rd_prog_args_size(const struct rd_prog_plan *plan);
void rd_prog_args_fill(const struct rd_prog_plan *plan, void *dst, void *const *bound, void *arena,
		       struct rd_prog_fault *fault, const double *scalars);

/* The grid to launch kernel k with on a device of sm_count SMs. */
unsigned rd_prog_kernel_grid(const struct rd_prog_kernel *k, unsigned sm_count);

/* For tests and logs: the step kind's name ("fused"). */
const char *rd_prog_step_kind_name(enum rd_prog_step_kind kind);
