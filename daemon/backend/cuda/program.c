/* SPDX-License-Identifier: Apache-2.0 */
/* Programs on the CUDA backend: a Run is one call on the lane, its steps
 * (daemon/program/plan.h: library calls through the same enqueue functions
 * as io.regen.Compute's, and kernels regend wrote and compiled with NVRTC)
 * launched as one CUDA graph.
 *
 * What a program holds on the device is one registry resource per program,
 * its generation state: the arena (intermediates and the library calls'
 * workspace: the graph's own memory, seed 001), the argument block its
 * kernels read the Run's addresses and scalars from, the loaded kernels,
 * and the graph exec. Release destroys them (the registry walks backwards,
 * so before the pool and the handles they were built on), a reset forgets
 * them, and the next Run makes them again; the plan and the kernels'
 * compiled images are host memory and outlive generations.
 *
 * Rebinding without capturing again: the kernels read every address from
 * the argument block, which each Run writes before it launches the graph,
 * so a Run that binds other buffers replays the same graph. With
 * program_gemm_slots, so do the GEMMs where cuBLASLt offers a pointer-array
 * algorithm for them (their A, B, C and D from four slots after the
 * block's journal headers: cuda_gemm_slots). The other library calls
 * (cuDNN's attention, LayerNorm, a GEMM through no slots) take their
 * pointers at capture: their bound operands' addresses are the graph's
 * key. A program keeps the execs of
 * its last PROGRAM_EXECS keys: a training loop binds the same weights and
 * activations step after step, or a few sets of them in turn (an
 * allocator that hands out two buffers alternately); a Run with a new key
 * captures again into the least recently used exec (cudaGraphExecUpdate,
 * else a new instantiation).
 *
 * The first Runs of a generation go on the stream, step by step: they build
 * the library calls' plans (cuBLASLt's heuristic, cuDNN's graphs and their
 * tuning), which a capture must not do. A capture that fails leaves the
 * program on the stream for the generation, with why in not_captured.
 * Captures that come too often (operands at new addresses in most Runs)
 * stop for a while, twice as long each time, then are tried again: a
 * rank's allocator may settle on a few sets of addresses once its first
 * steps are past, and meanwhile a Run whose key has an exec replays it.
 *
 * Runs of one program on two lanes share its arena: a Run waits for the
 * program's last Run, on whichever lane that was. */
#include "regen-config.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include "daemon/backend/cuda/common.h"
#include "daemon/env.h"
#include "proto/errors.h"
#include "proto/program_journal.h"

/* Runs on the stream before the first capture of a generation: the
 * library calls' plans are built and tuned by then. */
#define PROGRAM_EAGER_RUNS 2
/* The library calls' workspace, for a program that has any, to start
 * with: GEMMs take at most RD_CUDA_WORKSPACE_BYTES; attention's plans say
 * theirs when they are built (the eager Runs), and a call that needs more
 * grows it then (workspace_grow), within max_scratch. */
#define PROGRAM_WORKSPACE_BYTES ((size_t)64 << 20)
/* A program whose library operands move between Runs (fresh activations
 * at new addresses each step) is captured again each time; past this many
 * captures, when they come in more than half its Runs, it runs on the
 * stream instead: the launches alone cost less than a capture, an exec
 * update and a graph launch. */
#define PROGRAM_RECAPTURES_MAX 4
/* Then no capture for this many Runs (the Runs whose key has an exec
 * still replay it), twice as many after each such pause, at most
 * PROGRAM_PAUSE_MAX: what a key that never settles costs in captures
 * shrinks as the Runs go on. */
#define PROGRAM_PAUSE_RUNS 16u
#define PROGRAM_PAUSE_MAX 4096u
/* Graph execs kept per program, each for one key. */
#define PROGRAM_EXECS 4

struct cuda_program;

/* The device part of a program, for one generation. */
struct cuda_program_state {
	struct rd_resource res;
	struct cuda_program *prog;
	void *arena;                    /* intermediates, then the workspace */
	size_t arena_bytes;
	void *workspace;
	size_t workspace_bytes;
	void *args;                     /* device copy of the argument block */
	/* By key (the library operands' addresses each was captured with);
	 * exec NULL: free. */
	struct program_exec {
		cudaGraphExec_t exec;
		uint64_t *key;
		uint64_t used;          /* the Run that last launched it */
	} execs[PROGRAM_EXECS];
	unsigned runs;                  /* Runs this generation */
	unsigned captures;              /* captures since counting_from */
	unsigned counting_from;         /* no capture before this Run (a pause's end); counted from it */
	unsigned pause;                 /* the next pause's length */
	bool no_capture;                /* a capture failed this generation */
	cudaEvent_t last_run;           /* recorded after each Run */
	struct cuda_lane *last_lane;
	cudaEvent_t *trace_marks;       /* REGEN_PROGRAM_TRACE: before the first step, after each */
};

/* REGEN_PROGRAM_TRACE: per step, over the Runs launched step by step,
 * the CPU time its enqueue took and the GPU time between the marks around
 * it. Host memory: outlives generations. */
struct program_trace {
	uint64_t *cpu_ns;
	double *gpu_ms;
	unsigned runs;
};

struct cuda_program {
	struct rd_program base;
	struct cuda_dev *cd;
	struct rd_prog_plan plan;       /* host: outlives generations */
	/* By step: the modules of the steps regend writes (registry
	 * resources, registered before the state, so released after it). */
	struct cuda_rtc_module *modules;
	struct cuda_program_state state;
	pthread_mutex_t lock;           /* one Run enqueued at a time */
	/* The argument block as each Run fills it (host side), and the bound
	 * roots' addresses it is filled from. After the kernels' part
	 * (args_kernels bytes), the two journal headers a Run with a journal
	 * writes (SAVED or BEGUN, then DONE), copied from there on the
	 * device. */
	void *args_host;
	size_t args_bytes, args_kernels;
	/* By step: where a GEMM step's operand slots are in the argument block
	 * (0: it has none, or cuBLASLt offers it no pointer-array algorithm);
	 * through_slots: this Run's steps that read them. */
	size_t *slots_at;
	bool *through_slots;
	void **bound;
	size_t workspace_bytes;         /* 0 without library steps */
	unsigned nkey;                  /* entries of the graph's key */
	uint64_t *key;                  /* this Run's */
	struct program_trace *trace;    /* NULL unless REGEN_PROGRAM_TRACE is set */
};

/* A generation's captures start afresh: after its eager Runs, no pause
 * behind them. */
static void captures_restart(struct cuda_program_state *st)
{
	st->captures = 0;
	st->counting_from = PROGRAM_EAGER_RUNS;
	st->pause = PROGRAM_PAUSE_RUNS;
	st->no_capture = false;
}

/* Forgets every graph exec; `destroy`: in this generation's context,
 * which still holds them. */
static void execs_forget(struct cuda_program_state *st, bool destroy)
{
	for (int i = 0; i < PROGRAM_EXECS; i++) {
		if (destroy && st->execs[i].exec)
			cudaGraphExecDestroy(st->execs[i].exec);
		st->execs[i].exec = NULL;
		st->execs[i].used = 0;
	}
}

static void state_free_device(struct cuda_program_state *st, bool release)
{
	execs_forget(st, release);
	if (release) {
		if (st->last_run)
			cudaEventDestroy(st->last_run);
		for (int i = 0; st->trace_marks && i <= st->prog->plan.nsteps; i++)
			if (st->trace_marks[i])
				cudaEventDestroy(st->trace_marks[i]);
		cudaFree(st->arena);
		cudaFree(st->workspace);
		cudaFree(st->args);
	}
	st->last_run = NULL;
	free(st->trace_marks);
	st->trace_marks = NULL;
	st->arena = st->workspace = st->args = NULL;
	st->last_lane = NULL;
	st->runs = 0;
	captures_restart(st);
	atomic_fetch_sub(&st->prog->cd->program_bytes, st->prog->base.scratch_bytes);
	st->prog->base.scratch_bytes = 0;
}

static int state_init(struct rd_resource *res)
{
	struct cuda_program_state *st = (struct cuda_program_state *)res;
	struct cuda_program *p = st->prog;
	cudaError_t e_;

	e_ = cudaSetDevice(p->cd->dev->index);
	if (e_ != cudaSuccess)
		return STATUS_CUDA("cudaSetDevice");
	st->arena_bytes = p->plan.arena_bytes;
	e_ = cudaMalloc(&st->arena, st->arena_bytes ? st->arena_bytes : 1);
	if (e_ != cudaSuccess)
		return STATUS_CUDA("the program's arena");
	st->workspace_bytes = p->workspace_bytes;
	if (st->workspace_bytes) {
		e_ = cudaMalloc(&st->workspace, st->workspace_bytes);
		if (e_ != cudaSuccess) {
			int r = STATUS_CUDA("the program's workspace");
			state_free_device(st, true);
			return r;
		}
	}
	e_ = cudaMalloc(&st->args, p->args_bytes);
	if (e_ == cudaSuccess)
		e_ = cudaEventCreateWithFlags(&st->last_run, cudaEventDisableTiming);
	/* The embedding steps' note of a bad index starts clear; their report
	 * kernels clear it after each Run. */
	if (e_ == cudaSuccess && p->trace) {
		st->trace_marks = calloc((size_t)p->plan.nsteps + 1, sizeof(cudaEvent_t));
		for (int i = 0; st->trace_marks && i <= p->plan.nsteps && e_ == cudaSuccess; i++)
			e_ = cudaEventCreate(&st->trace_marks[i]);
	}
	if (e_ == cudaSuccess && p->plan.fault_offset != RD_PROG_NOT_IN_ARENA)
		e_ = cudaMemset((char *)st->arena + p->plan.fault_offset, 0, sizeof(struct rd_prog_fault));
	if (e_ != cudaSuccess) {
		int r = STATUS_CUDA("the program's argument block");
		state_free_device(st, true);
		return r;
	}
	p->base.scratch_bytes = st->arena_bytes + st->workspace_bytes + p->args_bytes;
	atomic_fetch_add(&p->cd->program_bytes, p->base.scratch_bytes);
	return 0;
}

static void state_release(struct rd_resource *res)
{
	struct cuda_program_state *st = (struct cuda_program_state *)res;

	cudaSetDevice(st->prog->cd->dev->index);
	state_free_device(st, true);
}

static void state_invalidate(struct rd_resource *res)
{
	state_free_device((struct cuda_program_state *)res, false);
}

static const struct rd_resource_ops state_ops = {
	.kind = "program", .init = state_init, .release = state_release, .invalidate = state_invalidate,
};

/* The host part, once nothing of it is registered. */
static void program_free(struct cuda_program *p)
{
	rd_prog_plan_finish(&p->plan);
	free(p->args_host);
	free(p->slots_at);
	free(p->through_slots);
	free(p->bound);
	free(p->modules);
	free(p->key);
	for (int i = 0; i < PROGRAM_EXECS; i++)
		free(p->state.execs[i].key);
	if (p->trace) {
		free(p->trace->cpu_ns);
		free(p->trace->gpu_ms);
		free(p->trace);
	}
	pthread_mutex_destroy(&p->lock);
	free(p);
}

int cuda_program_create(struct rd_device *dev, const struct rp_program *def, struct rd_program **out,
			struct rp_error *err)
{
	struct cuda_program *p = calloc(1, sizeof(*p));
	int r;

	if (!p) {
		rp_err_out_of_memory(err, dev->index, "no host memory for the program");
		return -ENOMEM;
	}
	p->cd = cuda_dev_of(dev);
	p->base.device = dev;
	pthread_mutex_init(&p->lock, NULL);
	r = rd_prog_plan_build(def, &p->plan, err);
	if (r < 0)
		goto fail;
	p->base.kernels = (uint64_t)p->plan.nsteps;
	for (int i = 0; i < p->plan.nsteps; i++)
		if (p->plan.steps[i].kind == RD_STEP_LIBRARY)
			p->workspace_bytes = PROGRAM_WORKSPACE_BYTES;
	/* What it holds on the device while it lives: bounded as one call's
	 * scratch is. */
	if (dev->max_scratch && p->plan.arena_bytes + p->workspace_bytes > dev->max_scratch) {
		rp_err_limit_exceeded(err, "scratch", (long long)dev->max_scratch,
				      "program '%s' needs %llu bytes of device scratch (its intermediates and its "
				      "library calls' workspace), more than max_scratch_mib allows; raise it or split "
				      "the program", def->name,
				      (unsigned long long)(p->plan.arena_bytes + p->workspace_bytes));
		r = -E2BIG;
		goto fail;
	}
	p->args_kernels = rp_prog_journal_align(rd_prog_args_size(&p->plan));
	p->args_bytes = p->args_kernels + 2 * sizeof(struct rp_prog_journal_header);
	p->slots_at = calloc((size_t)p->plan.nsteps + 1, sizeof(size_t));
	p->through_slots = calloc((size_t)p->plan.nsteps + 1, sizeof(bool));
	for (int i = 0; p->slots_at && p->cd->tuning.program_gemm_slots && i < p->plan.nsteps; i++)
		if (p->plan.steps[i].kind == RD_STEP_LIBRARY &&
		    def->nodes[p->plan.steps[i].first_node].compute.spec->id == RP_OP_GEMM) {
			p->slots_at[i] = p->args_bytes;
			p->args_bytes += CUDA_GEMM_SLOTS * sizeof(void *);
		}
	p->args_host = calloc(1, p->args_bytes);
	p->bound = calloc((size_t)def->nbound + 1, sizeof(void *));
	p->modules = calloc((size_t)p->plan.nsteps + 1, sizeof(*p->modules));
	/* The journal's address and mode, the inouts' addresses (a copy
	 * journal's copies take them at capture), then the library calls'
	 * operands'. */
	p->nkey = 2;
	for (int b = 0; b < def->nbound; b++)
		p->nkey += def->tensors[def->bind[b]].kind == RP_PT_INOUT;
	for (int i = 0; i < p->plan.nsteps; i++)
		if (p->plan.steps[i].kind == RD_STEP_LIBRARY)
			p->nkey += (unsigned)def->nodes[p->plan.steps[i].first_node].compute.spec->noperands;
	p->key = calloc((size_t)p->nkey + 1, sizeof(uint64_t));
	bool keys = true;
	for (int i = 0; i < PROGRAM_EXECS; i++)
		keys = (p->state.execs[i].key = calloc((size_t)p->nkey + 1, sizeof(uint64_t))) != NULL && keys;
	if (rd_env(RD_ENV_PROGRAM_TRACE)) {
		p->trace = calloc(1, sizeof(*p->trace));
		if (p->trace) {
			p->trace->cpu_ns = calloc((size_t)p->plan.nsteps + 1, sizeof(uint64_t));
			p->trace->gpu_ms = calloc((size_t)p->plan.nsteps + 1, sizeof(double));
		}
		if (!p->trace || !p->trace->cpu_ns || !p->trace->gpu_ms) {
			rp_err_out_of_memory(err, dev->index, "no host memory for the program's trace");
			r = -ENOMEM;
			goto fail;
		}
	}
	if (!p->args_host || !p->slots_at || !p->through_slots || !p->bound || !p->modules || !p->key || !keys) {
		rp_err_out_of_memory(err, dev->index, "no host memory for the program");
		r = -ENOMEM;
		goto fail;
	}
	/* Compiled when the first Run needs them, on the lane's thread: a
	 * compile takes far longer than the worker's loop may wait. */
	for (int i = 0; i < p->plan.nsteps; i++)
		if (p->plan.steps[i].kind != RD_STEP_LIBRARY) {
			cuda_rtc_module_init(p->cd, &p->modules[i], &p->plan.steps[i]);
			p->modules[i].prog = &p->base;
		}
	p->state.prog = p;
	captures_restart(&p->state);
	rd_resource_register(&dev->registry, &p->state.res, &state_ops);
	*out = &p->base;
	return 0;
fail:
	program_free(p);
	return r;
}

void cuda_program_destroy(struct rd_program *prog)
{
	struct cuda_program *p = (struct cuda_program *)prog;

	if (!p)
		return;
	rd_resource_unregister(&p->state.res);
	for (int i = 0; i < p->plan.nsteps; i++)
		if (p->plan.steps[i].kind != RD_STEP_LIBRARY)
			cuda_rtc_module_finish(&p->modules[i]);
	program_free(p);
}

/* One library step (a compute node) as the enqueue functions of
 * io.regen.Compute take it: each operand's tensor as a buffer of its own
 * (in views) whose memory starts where the tensor does. */
static void library_op(struct cuda_program *p, const struct rp_prog_node *node, struct rd_buffer *views,
		       struct rd_op *op)
{
	memset(op, 0, sizeof(*op));
	op->compute = node->compute;
	for (unsigned s = 0; s < node->compute.spec->noperands; s++) {
		if (!node->compute.present[s] || node->in[s] < 0)
			continue;
		memset(&views[s], 0, sizeof(views[s]));
		views[s].ptr = rd_prog_tensor_address(&p->plan, p->base.def, node->in[s], p->bound, p->state.arena);
		views[s].size = p->base.def->tensors[node->in[s]].extent_bytes;
		op->compute.operands[s].offset = 0;
		op->buffers[s] = &views[s];
	}
}

/* This Run's GEMM steps' operand addresses into their slots in the
 * argument block (host side), and which steps read them. A step cuBLASLt
 * offers no pointer-array algorithm takes its operands at capture for the
 * program's life; one whose operands are misaligned, for this Run. */
static void slots_fill(struct cuda_program *p)
{
	for (int i = 0; i < p->plan.nsteps; i++) {
		struct rd_buffer views[RP_OP_OPERANDS_MAX];
		struct rd_op op;

		p->through_slots[i] = false;
		if (!p->slots_at[i])
			continue;
		library_op(p, &p->base.def->nodes[p->plan.steps[i].first_node], views, &op);
		int r = cuda_gemm_slots(p->cd, &op, (void **)((char *)p->args_host + p->slots_at[i]));
		p->through_slots[i] = r == 0;
		if (r < 0)
			p->slots_at[i] = 0;
	}
}

static int enqueue_library(struct cuda_lane *lane, struct cuda_program *p, int step, struct rp_error *err)
{
	const struct rp_prog_node *node = &p->base.def->nodes[p->plan.steps[step].first_node];
	struct rd_buffer views[RP_OP_OPERANDS_MAX];
	struct rd_op op;
	int r;

	library_op(p, node, views, &op);
	op.lane = &lane->base;
	cuda_enqueue_fn *enqueue = cuda_enqueue_of(lane->cd, &op);
	if (p->through_slots[step])
		r = cuda_gemm_enqueue_slots(lane, &op, (void *const *)((char *)p->state.args + p->slots_at[step]));
	else if (!enqueue) {
		rp_error_set(err, RP_ERR_METHOD_NOT_IMPLEMENTED, "no CUDA kernel for %s (node %s)",
			     node->compute.spec->method, node->name);
		return -EOPNOTSUPP;
	} else
		r = enqueue(lane, &op);
	if (r < 0) {
		rp_error_move(err, &op.err);
		if (!err->name)
			rp_error_set(err, RP_ERR_BACKEND, "node %s failed", node->name);
	}
	rp_error_clear(&op.err);
	return r;
}

/* The journal's copies: each inout root to its place (save) or back
 * (restore). */
static cudaError_t journal_copy(struct cuda_lane *lane, struct cuda_program *p, char *journal, bool save)
{
	const struct rp_program *def = p->base.def;
	cudaError_t e = cudaSuccess;

	for (int b = 0; b < def->nbound && e == cudaSuccess; b++) {
		const struct rp_prog_tensor *t = &def->tensors[def->bind[b]];
		char *slot = journal + rp_program_journal_offset(def, b);

		if (t->kind != RP_PT_INOUT)
			continue;
		e = cudaMemcpyAsync(save ? slot : p->bound[b], save ? p->bound[b] : slot, t->extent_bytes,
				    cudaMemcpyDeviceToDevice, lane->stream);
	}
	return e;
}

/* The header the Run filled for `state` (the first for SAVED or BEGUN,
 * the second for DONE) onto the journal's. */
static cudaError_t journal_mark(struct cuda_lane *lane, struct cuda_program *p, char *journal,
				enum rp_prog_journal_state state)
{
	const char *src = (const char *)p->state.args + p->args_kernels +
			  (state == RP_JOURNAL_DONE ? sizeof(struct rp_prog_journal_header) : 0);

	return cudaMemcpyAsync(journal, src, sizeof(struct rp_prog_journal_header), cudaMemcpyDeviceToDevice,
			       lane->stream);
}

/* A library call of an eager Run needs more workspace than the program
 * has: the workspace grows to it (within max_scratch), once the lane's
 * work so far, which may use the old one, is done. Graphs captured before
 * took the old one's address: they go. */
static int workspace_grow(struct cuda_lane *lane, struct cuda_program *p, size_t wanted, struct rp_error *err)
{
	struct cuda_program_state *st = &p->state;
	const struct rd_device *dev = p->base.device;
	size_t bytes = (wanted + ((size_t)1 << 20) - 1) & ~(((size_t)1 << 20) - 1);
	cudaError_t e;
	void *ws;

	if (dev->max_scratch && p->plan.arena_bytes + bytes > dev->max_scratch) {
		rp_error_clear(err);
		rp_err_limit_exceeded(err, "scratch", (long long)dev->max_scratch,
				      "program '%s' needs %zu bytes of workspace for its library calls besides %llu of "
				      "intermediates, more than max_scratch_mib allows; raise it or split the program",
				      p->base.def->name, bytes, (unsigned long long)p->plan.arena_bytes);
		return -E2BIG;
	}
	e = cudaStreamSynchronize(lane->stream);
	if (e == cudaSuccess)
		e = cudaMalloc(&ws, bytes);
	if (e != cudaSuccess) {
		rp_error_clear(err);
		rp_error_set(err, cuda_error_name(e), "growing program %s's workspace to %zu bytes: %s",
			     p->base.def->name, bytes, cudaGetErrorString(e));
		return -ENOMEM;
	}
	rp_error_clear(err);
	cudaFree(st->workspace);
	atomic_fetch_add(&p->cd->program_bytes, bytes - st->workspace_bytes);
	p->base.scratch_bytes += bytes - st->workspace_bytes;
	st->workspace = ws;
	st->workspace_bytes = p->workspace_bytes = bytes;
	lane->scratch_fixed = ws;
	lane->scratch_fixed_bytes = bytes;
	execs_forget(st, true);
	return 0;
}

/* Every step, in order, on the lane's stream (captured or not); with a
 * journal, the header marked around them, and in mode copy the inouts
 * saved before. */
static int enqueue_steps(struct cuda_lane *lane, struct cuda_program *p, char *journal,
			 enum rp_prog_journal_mode mode, struct rp_error *err)
{
	struct cuda_program_state *st = &p->state;
	cudaError_t e = cudaSuccess;
	int r = 0;

	if (journal) {
		if (mode == RP_JOURNAL_COPY)
			e = journal_copy(lane, p, journal, true);
		if (e == cudaSuccess)
			e = journal_mark(lane, p, journal, mode == RP_JOURNAL_COPY ? RP_JOURNAL_SAVED : RP_JOURNAL_BEGUN);
		if (e != cudaSuccess) {
			rp_error_set(err, cuda_error_name(e), "%s the journal: %s",
				     mode == RP_JOURNAL_COPY ? "saving the inouts to" : "marking the Run begun in",
				     cudaGetErrorString(e));
			return -EIO;
		}
	}
	lane->scratch_fixed = st->workspace;
	lane->scratch_fixed_bytes = st->workspace_bytes;
	/* Not the first Runs: they build the library calls' plans. */
	const bool traced = st->trace_marks && !lane->capturing && st->runs >= PROGRAM_EAGER_RUNS;
	if (traced)
		cudaEventRecord(st->trace_marks[0], lane->stream);
	for (int i = 0; i < p->plan.nsteps && r == 0; i++) {
		const struct rd_prog_step *step = &p->plan.steps[i];
		const uint64_t t0 = traced ? rd_now_ns() : 0;

		if (step->kind == RD_STEP_LIBRARY) {
			lane->scratch_fixed_wanted = 0;
			r = enqueue_library(lane, p, i, err);
			if (r < 0 && lane->scratch_fixed_wanted && !lane->capturing) {
				r = workspace_grow(lane, p, lane->scratch_fixed_wanted, err);
				if (r == 0)
					r = enqueue_library(lane, p, i, err);
			}
		} else {
			for (int k = 0; k < step->nkernels && r == 0; k++)
				if (step->kernels[k].blocks)
					r = cuda_rtc_launch(&p->modules[i], k, lane->stream, st->args, err);
		}
		if (traced) {
			p->trace->cpu_ns[i] += rd_now_ns() - t0;
			cudaEventRecord(st->trace_marks[i + 1], lane->stream);
		}
	}
	lane->scratch_fixed = NULL;
	lane->scratch_fixed_bytes = 0;
	if (r == 0 && journal && (e = journal_mark(lane, p, journal, RP_JOURNAL_DONE)) != cudaSuccess) {
		rp_error_set(err, cuda_error_name(e), "marking the journal done: %s", cudaGetErrorString(e));
		r = -EIO;
	}
	return r;
}

/* A retried Run: what the journal's header says of the Run it retries.
 * Waits for the lane's earlier work (a retry comes after a fault: there
 * is little). 1: applied already; 0: go on (the inouts put back where the
 * Run had saved them); -EIO with RunTorn: a marks journal's Run that
 * began. */
static int journal_recover(struct cuda_lane *lane, struct cuda_program *p, char *journal,
			   const struct rd_program_run *run, struct rp_error *err)
{
	const uint64_t seq = run->seq;
	struct rp_prog_journal_header h;
	cudaError_t e = cudaMemcpyAsync(&h, journal, sizeof(h), cudaMemcpyDeviceToHost, lane->stream);

	if (e == cudaSuccess)
		e = cudaStreamSynchronize(lane->stream);
	if (e != cudaSuccess) {
		rp_error_set(err, cuda_error_name(e), "reading the journal: %s", cudaGetErrorString(e));
		return -EIO;
	}
	switch (rp_program_journal_retry(&h, seq, run->journal_mode, p->base.def, &p->base.obj.id, err)) {
	case RP_RETRY_APPLIED:
		p->base.retries_applied++;
		return 1;
	case RP_RETRY_TORN:
		p->base.retries_torn++;
		return -EIO;
	case RP_RETRY_MODE_CHANGED:
		return -EINVAL;
	case RP_RETRY_RESTORE:
		e = journal_copy(lane, p, journal, false);
		if (e != cudaSuccess) {
			rp_error_set(err, cuda_error_name(e), "putting the inouts back from the journal: %s",
				     cudaGetErrorString(e));
			return -EIO;
		}
		p->base.retries_restored++;
		return 0;
	case RP_RETRY_RUN:
		break;
	}
	return 0;
}

/* The graph's key: the addresses of the library steps' operands, which
 * their calls take at capture; a GEMM's A, B, C and D, where it reads them
 * from its slots, a mark instead (no address is 1). */
static void fill_key(struct cuda_program *p, const char *journal, enum rp_prog_journal_mode mode)
{
	const struct rp_program *def = p->base.def;
	const bool copies = journal && mode == RP_JOURNAL_COPY;
	unsigned n = 0;

	p->key[n++] = (uint64_t)(uintptr_t)journal;
	p->key[n++] = journal ? (uint64_t)mode + 1 : 0;
	for (int b = 0; b < def->nbound; b++)
		if (def->tensors[def->bind[b]].kind == RP_PT_INOUT)
			p->key[n++] = copies ? (uint64_t)(uintptr_t)p->bound[b] : 0;
	for (int i = 0; i < p->plan.nsteps; i++) {
		const struct rd_prog_step *step = &p->plan.steps[i];
		const struct rp_prog_node *node = &def->nodes[step->first_node];

		if (step->kind != RD_STEP_LIBRARY)
			continue;
		for (unsigned s = 0; s < node->compute.spec->noperands && n < p->nkey; s++)
			p->key[n++] = node->in[s] < 0 ? 0
				      : p->through_slots[i] && s <= RP_GEMM_D
					      ? 1
					      : (uint64_t)(uintptr_t)rd_prog_tensor_address(&p->plan, def, node->in[s],
											    p->bound, p->state.arena);
	}
}

/* What key entry k stands for, into out (as fill_key lays the key out). */
static void key_entry_name(const struct cuda_program *p, unsigned k, char *out, size_t size)
{
	const struct rp_program *def = p->base.def;
	unsigned n = 0;

	if (k == n++) {
		snprintf(out, size, "the journal");
		return;
	}
	if (k == n++) {
		snprintf(out, size, "the journal's mode");
		return;
	}
	for (int b = 0; b < def->nbound; b++)
		if (def->tensors[def->bind[b]].kind == RP_PT_INOUT && k == n++) {
			snprintf(out, size, "inout '%s'", def->tensors[def->bind[b]].name);
			return;
		}
	for (int i = 0; i < p->plan.nsteps; i++) {
		const struct rd_prog_step *step = &p->plan.steps[i];
		const struct rp_prog_node *node = &def->nodes[step->first_node];

		if (step->kind != RD_STEP_LIBRARY)
			continue;
		for (unsigned s = 0; s < node->compute.spec->noperands; s++)
			if (k == n++) {
				snprintf(out, size, "'%s' (%s of node '%s')",
					 node->in[s] < 0 ? "-" : def->tensors[node->in[s]].name,
					 node->compute.spec->operands[s].name, node->name);
				return;
			}
	}
	snprintf(out, size, "key entry %u", k);
}

/* The first entry of this Run's key that differs from the key of the exec
 * launched last: what moved, for not_captured. */
static void first_moved(const struct cuda_program *p, char *out, size_t size)
{
	const struct program_exec *last = NULL;

	for (int i = 0; i < PROGRAM_EXECS; i++)
		if (p->state.execs[i].exec && (!last || p->state.execs[i].used > last->used))
			last = &p->state.execs[i];
	snprintf(out, size, "?");
	if (!last)
		return;
	for (unsigned k = 0; k < p->nkey; k++)
		if (last->key[k] != p->key[k]) {
			key_entry_name(p, k, out, size);
			return;
		}
}

/* The modules of this generation, loaded (compiled first where need be)
 * before anything is enqueued: a capture must not compile. */
static int load_modules(struct cuda_program *p, struct rp_error *err)
{
	uint64_t n = 0;

	for (int i = 0; i < p->plan.nsteps; i++) {
		if (p->plan.steps[i].kind == RD_STEP_LIBRARY)
			continue;
		if (cuda_rtc_module_get(&p->modules[i], err) < 0)
			return -EIO;
		n++;
	}
	p->base.modules = n;
	return 0;
}

/* Captures the Run's steps into x (an exec there is updated in place when
 * the new graph allows, else replaced). 0, 1: the capture failed (what
 * failed may run on the stream), or -errno. */
static int capture(struct cuda_lane *lane, struct cuda_program *p, char *journal, enum rp_prog_journal_mode mode,
		   struct program_exec *x, struct rp_error *err)
{
	cudaGraph_t graph = NULL;
	cudaError_t e;
	int r;

	e = cudaStreamBeginCapture(lane->stream, cudaStreamCaptureModeThreadLocal);
	if (e != cudaSuccess)
		goto fail_cuda;
	lane->capturing = true;
	r = enqueue_steps(lane, p, journal, mode, err);
	lane->capturing = false;
	e = cudaStreamEndCapture(lane->stream, &graph);
	if (r < 0) {
		if (graph)
			cudaGraphDestroy(graph);
		/* What failed in capture may run on the stream. */
		snprintf(p->base.not_captured, sizeof(p->base.not_captured), "capture failed: %s",
			 err->params ? cJSON_GetStringValue(cJSON_GetObjectItem(err->params, "message")) : "?");
		rp_error_clear(err);
		(void)cudaGetLastError();
		return 1;
	}
	if (e != cudaSuccess)
		goto fail_cuda;
	if (x->exec) {
		cudaGraphExecUpdateResultInfo info;
		if (cudaGraphExecUpdate(x->exec, graph, &info) != cudaSuccess) {
			(void)cudaGetLastError();
			cudaGraphExecDestroy(x->exec);
			x->exec = NULL;
		}
	}
	if (!x->exec)
		e = cudaGraphInstantiateWithFlags(&x->exec, graph, 0);
	cudaGraphDestroy(graph);
	if (e != cudaSuccess) {
		x->exec = NULL;
		goto fail_cuda;
	}
	memcpy(x->key, p->key, p->nkey * sizeof(uint64_t));
	p->base.graph_captures++;
	return 0;
fail_cuda:
	snprintf(p->base.not_captured, sizeof(p->base.not_captured), "capture failed: %s", cudaGetErrorString(e));
	(void)cudaGetLastError();
	return 1;
}

/* After the Run's work finished: a bad index its kernels reported fails
 * the call, named as the host backend names it (which refuses the Run
 * before it runs; here the rows read as zeros and the outputs are
 * written). */
void cuda_program_completed(struct rd_op *op)
{
	struct rd_program_run *run = op->run;
	const struct rd_prog_fault *f = run->fault;
	const struct rp_program *def = run->prog->def;

	if (!f || !__atomic_load_n(&f->raised, __ATOMIC_ACQUIRE) || op->err.name)
		return;
	if (f->node < 0 || f->node >= def->nnodes || def->nodes[f->node].nin < 2) {
		rp_error_set(&op->err, RP_ERR_BACKEND, "program %s: a kernel reported a bad index at node %d", def->name,
			     f->node);
		return;
	}
	const struct rp_prog_node *n = &def->nodes[f->node];
	const bool forward = n->gather.fn == RP_GATHER_EMBEDDING;
	const struct rp_prog_tensor *table = &def->tensors[forward ? n->in[0] : n->out[0]];
	const struct rp_prog_tensor *index = &def->tensors[n->in[1]];
	char pos[RP_PROG_RANK_MAX * 24];

	rp_prog_format_position(index, f->position, pos, sizeof(pos));
	rp_error_invalid_operand(&op->err, index->name,
				 "%s%s is %lld, outside [0, %lld): the rows of '%s' (node '%s', %s); the Run %s and "
				 "wrote its outputs",
				 index->name, pos, (long long)f->value, (long long)table->shape[0], table->name, n->name,
				 n->op->name, forward ? "read a row of zeros for it" : "added its gradient to no row");
}

/* The exec captured with this Run's key, or NULL. */
static struct program_exec *exec_of_key(struct cuda_program *p)
{
	for (int i = 0; i < PROGRAM_EXECS; i++) {
		struct program_exec *x = &p->state.execs[i];
		if (x->exec && memcmp(x->key, p->key, p->nkey * sizeof(uint64_t)) == 0)
			return x;
	}
	return NULL;
}

/* Where a new key's capture goes: a free slot, else the least recently
 * launched exec. */
static struct program_exec *exec_to_replace(struct cuda_program_state *st)
{
	struct program_exec *oldest = &st->execs[0];

	for (int i = 0; i < PROGRAM_EXECS; i++) {
		if (!st->execs[i].exec)
			return &st->execs[i];
		if (st->execs[i].used < oldest->used)
			oldest = &st->execs[i];
	}
	return oldest;
}

/* A Run traced step by step: wait for it, add its steps' GPU times, and
 * write the averages where REGEN_PROGRAM_TRACE says: after each of the
 * first 10 such Runs (a short benchmark gets a file too), then every 10. */
static void trace_collect(struct cuda_program *p)
{
	struct program_trace *tr = p->trace;
	const struct rp_program *def = p->base.def;
	cudaEvent_t *marks = p->state.trace_marks;
	const int n = p->plan.nsteps;
	char path[4096];

	if (cudaEventSynchronize(marks[n]) != cudaSuccess) {
		(void)cudaGetLastError();
		return;
	}
	for (int i = 0; i < n; i++) {
		float ms = 0;
		if (cudaEventElapsedTime(&ms, marks[i], marks[i + 1]) == cudaSuccess)
			tr->gpu_ms[i] += ms;
	}
	if (++tr->runs > 10 && tr->runs % 10)
		return;
	snprintf(path, sizeof(path), "%s.%d.%s", rd_env(RD_ENV_PROGRAM_TRACE), (int)getpid(), def->name);
	FILE *f = fopen(path, "w");
	if (!f)
		return;
	double cpu = 0, gpu = 0;
	fprintf(f, "# program %s: %d steps, %d nodes; averages over %u Runs launched step by step\n", def->name, n,
		def->nnodes, tr->runs);
	fprintf(f, "# step kind kernels nodes cpu_us gpu_us first_node op\n");
	for (int i = 0; i < n; i++) {
		const struct rd_prog_step *step = &p->plan.steps[i];
		const struct rp_prog_node *node = &def->nodes[step->first_node];
		const double c = (double)tr->cpu_ns[i] / tr->runs / 1e3, g = tr->gpu_ms[i] / tr->runs * 1e3;

		cpu += c;
		gpu += g;
		fprintf(f, "%d %s %d %d %.1f %.1f %s %s\n", i, rd_prog_step_kind_name(step->kind),
			step->kind == RD_STEP_LIBRARY ? 1 : step->nkernels, step->nnodes, c, g, node->name,
			step->kind == RD_STEP_LIBRARY ? node->compute.spec->method : node->op->name);
	}
	fprintf(f, "# total cpu_us %.1f gpu_us %.1f\n", cpu, gpu);
	fclose(f);
}

int cuda_program_enqueue(struct cuda_lane *lane, struct rd_op *op)
{
	struct rd_program_run *run = op->run;
	struct cuda_program *p = (struct cuda_program *)run->prog;
	struct cuda_program_state *st = &p->state;
	const struct rp_program *def = p->base.def;
	char *journal = run->journal ? (char *)run->journal->ptr + run->journal_offset : NULL;
	uint64_t t0 = rd_now_ns();
	cudaError_t e;
	int r = 0;

	for (int i = 0; i < run->nbound; i++)
		if (run->buffers[i] && rd_resource_ensure_valid(&run->buffers[i]->res))
			return cuda_status_to_error(&op->err, "restoring a buffer mapping");
	if (run->journal && rd_resource_ensure_valid(&run->journal->res))
		return cuda_status_to_error(&op->err, "restoring the journal's mapping");
	journal = run->journal ? (char *)run->journal->ptr + run->journal_offset : NULL;
	pthread_mutex_lock(&p->lock);
	if (rd_resource_ensure_valid(&st->res)) {
		r = cuda_status_to_error(&op->err, "the program's device state");
		goto out;
	}
	if (st->last_lane && st->last_lane != lane) {
		e = cudaStreamWaitEvent(lane->stream, st->last_run, 0);
		if (e != cudaSuccess)
			goto fail_cuda;
	}
	for (int i = 0; i < run->nbound; i++)
		p->bound[i] = run->buffers[i] ? (char *)run->buffers[i]->ptr + run->offsets[i] : NULL;
	/* The lane's report slot for this call: the completion event's, so
	 * that no later call on the lane takes it before this one is read. */
	run->fault = &lane->faults[lane->next_done];
	memset(run->fault, 0, sizeof(struct rd_prog_fault));
	rd_prog_args_fill(&p->plan, p->args_host, p->bound, st->arena, lane->faults_dev + lane->next_done,
			  run->scalars);
	slots_fill(p);
	if (journal) {
		struct rp_prog_journal_header *h = (void *)((char *)p->args_host + p->args_kernels);

		h[0] = (struct rp_prog_journal_header){
			RP_PROG_JOURNAL_MAGIC, run->seq,
			run->journal_mode == RP_JOURNAL_COPY ? RP_JOURNAL_SAVED : RP_JOURNAL_BEGUN, 0
		};
		h[1] = (struct rp_prog_journal_header){ RP_PROG_JOURNAL_MAGIC, run->seq, RP_JOURNAL_DONE, 0 };
	}
	r = load_modules(p, &op->err);
	if (r == 0 && journal && run->retry) {
		r = journal_recover(lane, p, journal, run, &op->err);
		if (r > 0) {
			run->already_done = true;
			r = 0;
			goto out;
		}
	}
	if (r < 0)
		goto out;
	/* From pageable memory: the copy is staged before the call returns,
	 * so the next Run may write the block at once. */
	e = cudaMemcpyAsync(st->args, p->args_host, p->args_bytes, cudaMemcpyHostToDevice, lane->stream);
	if (e != cudaSuccess)
		goto fail_cuda;

	fill_key(p, journal, run->journal_mode);
	struct program_exec *x = NULL;
	/* A traced program runs every Run step by step, to be timed. */
	if (st->runs >= PROGRAM_EAGER_RUNS && !st->no_capture && !st->trace_marks) {
		x = exec_of_key(p);
		/* A pause's reason stays until a graph replays: a capture
		 * between pauses whose key never comes back does not clear it. */
		if (x)
			p->base.not_captured[0] = '\0';
		if (!x && st->runs < st->counting_from) {
			/* Paused: on the stream. */
		} else if (!x && st->captures >= PROGRAM_RECAPTURES_MAX &&
			   st->captures * 2 > st->runs - st->counting_from) {
			char moved[160];

			first_moved(p, moved, sizeof(moved));
			snprintf(p->base.not_captured, sizeof(p->base.not_captured),
				 "its operands moved to new addresses in %u of its last %u Runs (each a capture; "
				 "%d sets kept; the first to move: %s): on the stream but where a kept set comes "
				 "back, captures again after %u Runs",
				 st->captures, st->runs - st->counting_from, PROGRAM_EXECS, moved, st->pause);
			st->counting_from = st->runs + st->pause;
			st->captures = 0;
			st->pause = st->pause * 2 < PROGRAM_PAUSE_MAX ? st->pause * 2 : PROGRAM_PAUSE_MAX;
		} else if (!x) {
			x = exec_to_replace(st);
			st->captures++;
			r = capture(lane, p, journal, run->journal_mode, x, &op->err);
			if (r != 0 || !x->exec)
				x = NULL;
			if (r > 0) {
				st->no_capture = true;
				r = 0;
			}
		}
	}
	if (r == 0 && x) {
		e = cudaGraphLaunch(x->exec, lane->stream);
		if (e != cudaSuccess)
			goto fail_cuda;
		x->used = st->runs + 1;
		p->base.graph_launches++;
	} else if (r == 0) {
		r = enqueue_steps(lane, p, journal, run->journal_mode, &op->err);
		p->base.stream_runs++;
		if (r == 0 && st->trace_marks && st->runs >= PROGRAM_EAGER_RUNS)
			trace_collect(p);
	}
	if (r == 0) {
		e = cudaEventRecord(st->last_run, lane->stream);
		if (e != cudaSuccess)
			goto fail_cuda;
		st->last_lane = lane;
		st->runs++;
	}
out:
	p->base.launch_ns += rd_now_ns() - t0;
	pthread_mutex_unlock(&p->lock);
	return r;
fail_cuda:
	rp_error_set(&op->err, cuda_error_name(e), "program %s: %s", def->name, cudaGetErrorString(e));
	pthread_mutex_unlock(&p->lock);
	return -EIO;
}
