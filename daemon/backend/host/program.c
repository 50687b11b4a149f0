/* SPDX-License-Identifier: Apache-2.0 */
/* Programs on the host backend (io.regen.Program, proto/program.h): a Run
 * interprets the checked definition node by node, in program order, on
 * its lane's thread, with the reference math of program_nodes.c. No
 * fusion and no graphs: every Run counts as a stream run.
 *
 * Memory. A tensor's first element is its root's memory plus its
 * root_offset elements: a bound root is the Run's buffer at its offset (a
 * scalar's, the Run's value), an intermediate root a place in the
 * program's arena. The arena holds every intermediate root side by side
 * (64-byte aligned; no sharing between lifetimes: simple, and the host
 * has memory) and, after them, a workspace as large as the largest
 * node's (a compute op's scratch, a reduction's accumulators). It is
 * bounded by max_scratch at Define, taken at the first Run and kept
 * between Runs, like a lane's scratch, unless it is larger than
 * HOST_SCRATCH_KEEP; it goes when the program does.
 *
 * One Run of a program at a time (a lock): its Runs on two lanes would
 * share the arena's intermediates.
 *
 * Failures. Values that can refuse a Run (gather indices, attention's
 * lengths) are checked before any node runs when no earlier node writes
 * them, so such a refused Run wrote nothing; a value an earlier node
 * computes is checked just before its node, and the error says the Run
 * stopped part way. Client memory is read under the SIGBUS guard. */
#include <errno.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "daemon/backend/host/common.h"
#include "daemon/backend/host/guard.h"
#include "daemon/backend/host/program_nodes.h"
#include "proto/errors.h"
#include "proto/program_journal.h"

#define ARENA_ALIGN 64

struct host_program {
	struct rd_program base;
	pthread_mutex_t lock;          /* held through a Run */
	/* Per tensor: the byte offset of an intermediate root in the arena;
	 * -1 for every other tensor. */
	int64_t *arena_offset;
	size_t workspace_offset, workspace_size;
	size_t arena_size;
	void *arena;                   /* NULL until a Run takes it, and after a Run when large */
	void **addr;                   /* per tensor: its first element in this Run */
	/* Per node: its data check runs before any node does (no earlier
	 * node writes the values it checks). */
	bool *check_first;
};

static size_t align_up(size_t v)
{
	return (v + ARENA_ALIGN - 1) & ~(size_t)(ARENA_ALIGN - 1);
}

static bool bound_kind(enum rp_prog_tensor_kind k)
{
	return k == RP_PT_INPUT || k == RP_PT_OUTPUT || k == RP_PT_INOUT || k == RP_PT_SCALAR;
}

/* What the addresses rely on: every root a bound or intermediate tensor,
 * every bound root's bind index in the table. */
static int validate_tensors(const struct rp_program *def, struct rp_error *err)
{
	for (int i = 0; i < def->ntensors; i++) {
		const struct rp_prog_tensor *t = &def->tensors[i];
		const struct rp_prog_tensor *root = t->root >= 0 && t->root < def->ntensors ? &def->tensors[t->root] : NULL;

		if (!root || !(bound_kind(root->kind) || root->kind == RP_PT_INTERMEDIATE) ||
		    (bound_kind(root->kind) && (root->bind_index < 0 || root->bind_index >= def->nbound)) ||
		    rp_dtype_size(t->dtype) == 0 || t->rank < 0 || t->rank > RP_PROG_RANK_MAX) {
			rp_error_set(err, RP_ERR_BACKEND,
				     "the host backend cannot address tensor '%s' of program '%s' (root %d, kind %d); "
				     "the definition checker let it through, which is a bug of regend's to report",
				     t->name, def->name, t->root, (int)t->kind);
			return -EINVAL;
		}
	}
	return 0;
}

/* Which nodes' data checks can run before any node writes: those whose
 * checked tensors no earlier node writes (by root). */
static int plan_checks(const struct rp_program *def, bool *check_first)
{
	bool *written = calloc((size_t)def->ntensors + 1, sizeof(*written));
	int t[RP_PROG_NODE_IN_MAX];

	if (!written)
		return -ENOMEM;
	for (int k = 0; k < def->nnodes; k++) {
		int n = rd_host_node_data_tensors(def, k, t);

		check_first[k] = true;
		for (int i = 0; i < n; i++)
			if (t[i] >= 0 && written[def->tensors[t[i]].root])
				check_first[k] = false;
		n = rd_host_node_outputs(def, k, t);
		for (int i = 0; i < n; i++)
			written[def->tensors[t[i]].root] = true;
	}
	free(written);
	return 0;
}

static void program_free(struct host_program *hp)
{
	struct rd_device *dev = hp->base.device;

	if (hp->arena) {
		atomic_fetch_sub(&hd(dev)->scratch_bytes, hp->arena_size);
		free(hp->arena);
	}
	free(hp->arena_offset);
	free(hp->addr);
	free(hp->check_first);
	pthread_mutex_destroy(&hp->lock);
	free(hp);
}

int host_program_create(struct rd_device *dev, const struct rp_program *def, struct rd_program **out,
			struct rp_error *err)
{
	struct host_program *hp = calloc(1, sizeof(*hp));
	size_t intermediates = 0;
	int r;

	if (!hp) {
		rp_err_out_of_memory(err, dev->index, "no host memory for program '%s'", def->name);
		return -ENOMEM;
	}
	pthread_mutex_init(&hp->lock, NULL);
	hp->base.device = dev;
	hp->arena_offset = malloc(((size_t)def->ntensors + 1) * sizeof(*hp->arena_offset));
	hp->addr = calloc((size_t)def->ntensors + 1, sizeof(*hp->addr));
	hp->check_first = calloc((size_t)def->nnodes + 1, sizeof(*hp->check_first));
	r = validate_tensors(def, err);
	for (int k = 0; r == 0 && k < def->nnodes; k++)
		r = rd_host_node_validate(def, k, err);
	if (r < 0) {
		program_free(hp);
		return r;
	}
	if (!hp->arena_offset || !hp->addr || !hp->check_first || plan_checks(def, hp->check_first) < 0) {
		program_free(hp);
		rp_err_out_of_memory(err, dev->index, "no host memory for program '%s'", def->name);
		return -ENOMEM;
	}
	for (int i = 0; i < def->ntensors; i++) {
		const struct rp_prog_tensor *t = &def->tensors[i];

		hp->arena_offset[i] = -1;
		if (t->kind == RP_PT_INTERMEDIATE && t->root == i) {
			hp->arena_offset[i] = (int64_t)intermediates;
			intermediates = align_up(intermediates + t->extent_bytes);
		}
	}
	for (int k = 0; k < def->nnodes; k++) {
		size_t need = rd_host_node_workspace(def, k);

		hp->workspace_size = need > hp->workspace_size ? need : hp->workspace_size;
	}
	hp->workspace_offset = intermediates;
	hp->arena_size = intermediates + align_up(hp->workspace_size);
	if (dev->max_scratch && hp->arena_size > dev->max_scratch) {
		rp_err_limit_exceeded(err, "scratch", (long long)dev->max_scratch,
				      "program '%s' needs %zu bytes of scratch (%zu for its intermediates, %zu for its "
				      "largest node's workspace), more than the %llu one call may take: raise max_scratch_mib or "
				      "split the program",
				      def->name, hp->arena_size, intermediates, hp->workspace_size,
				      (unsigned long long)dev->max_scratch);
		program_free(hp);
		return -E2BIG;
	}
	hp->base.kernels = (uint64_t)def->nnodes;
	snprintf(hp->base.not_captured, sizeof(hp->base.not_captured), "host backend: no graphs");
	*out = &hp->base;
	return 0;
}

void host_program_destroy(struct rd_program *base)
{
	program_free((struct host_program *)base);
}

/* ---- a Run -------------------------------------------------------------------- */

static int take_arena(struct host_program *hp, struct rp_error *err)
{
	struct rd_device *dev = hp->base.device;

	if (hp->arena || hp->arena_size == 0)
		return 0;
	hp->arena = aligned_alloc(ARENA_ALIGN, hp->arena_size);
	if (!hp->arena) {
		rp_err_out_of_memory(err, dev->index, "no host memory for program '%s''s scratch of %zu bytes",
				     hp->base.def->name, hp->arena_size);
		return -ENOMEM;
	}
	/* Zeroed when taken: nothing of another program's or an earlier
	 * allocation's memory shows through an intermediate. */
	memset(hp->arena, 0, hp->arena_size);
	hp->base.scratch_bytes = hp->arena_size;
	atomic_fetch_add(&hd(dev)->scratch_bytes, hp->arena_size);
	return 0;
}

/* A Run must not leave a large arena to an idle program. */
static void trim_arena(struct host_program *hp)
{
	if (!hp->arena || hp->arena_size <= HOST_SCRATCH_KEEP)
		return;
	atomic_fetch_sub(&hd(hp->base.device)->scratch_bytes, hp->arena_size);
	free(hp->arena);
	hp->arena = NULL;
	hp->base.scratch_bytes = 0;
}

/* Every tensor's address for this Run's bindings. */
static int resolve(struct host_program *hp, const struct rd_program_run *run, struct rp_error *err)
{
	const struct rp_program *def = hp->base.def;
	struct rd_device *dev = hp->base.device;

	if (run->nbound != def->nbound) {
		rp_err_backend_error(err, dev->index, "a Run of program '%s' bound %d tensors; it has %d",
				     def->name, run->nbound, def->nbound);
		return -EINVAL;
	}
	for (int i = 0; i < def->ntensors; i++) {
		const struct rp_prog_tensor *t = &def->tensors[i], *root = &def->tensors[t->root];
		const int b = root->bind_index;
		char *base;

		if (root->kind == RP_PT_INTERMEDIATE) {
			base = (char *)hp->arena + hp->arena_offset[t->root];
		} else if (root->kind == RP_PT_SCALAR) {
			base = (char *)&run->scalars[b];
		} else if (run->buffers[b] && run->buffers[b]->ptr) {
			base = (char *)run->buffers[b]->ptr + run->offsets[b];
		} else {
			rp_err_invalid_operand(err, root->name, "its buffer is not mapped",
					       "'%s' is bound to a buffer whose memory is not mapped in the worker; "
					       "import it again", root->name);
			return -EINVAL;
		}
		hp->addr[i] = base + (size_t)t->root_offset * rp_dtype_size(t->dtype);
	}
	return 0;
}

struct run_state {
	struct host_program *hp;
	struct rp_error *err;
	int node;                      /* where it stopped; -1 before the first node ran */
};

#define OUTCOME_NOTHING "the Run wrote nothing"
#define OUTCOME_PART "the Run stopped there; the nodes before it ran, so outputs and inouts may be partly written"

/* -EIO with DeviceLost where a fault came before node k (-1: before the
 * Run began, its journal unmarked). */
static int check_lost(struct run_state *st, int k)
{
	const struct host_program *hp = st->hp;
	const struct rp_program *def = hp->base.def;

	if (!atomic_load(&hd(hp->base.device)->lost))
		return 0;
	if (k < 0)
		rp_error_set(st->err, RP_ERR_DEVICE_LOST, "device %d lost its context before program '%s' began; %s",
			     hp->base.device->index, def->name, OUTCOME_NOTHING);
	else
		rp_error_set(st->err, RP_ERR_DEVICE_LOST,
			     "device %d lost its context during program '%s', before node %d '%s'; %s",
			     hp->base.device->index, def->name, k, def->nodes[k].name, k ? OUTCOME_PART : OUTCOME_NOTHING);
	return -EIO;
}

static int run_nodes(void *arg)
{
	struct run_state *st = arg;
	struct host_program *hp = st->hp;
	const struct rp_program *def = hp->base.def;
	void *ws = hp->workspace_size ? (char *)hp->arena + hp->workspace_offset : NULL;
	int t[RD_HOST_DATA_TENSORS_MAX];
	int r;

	for (int k = 0; k < def->nnodes; k++) {
		if (hp->check_first[k] && rd_host_node_data_tensors(def, k, t) > 0) {
			r = rd_host_node_check(def, k, hp->addr, OUTCOME_NOTHING, st->err);
			if (r < 0)
				return r;
		}
	}
	for (int k = 0; k < def->nnodes; k++) {
		st->node = k;
		/* A fault (an injected device_lost) ends the Run between two
		 * nodes, as a real one ends a graph between two kernels: what
		 * the nodes before wrote stays written. */
		if ((r = check_lost(st, k)) < 0)
			return r;
		if (!hp->check_first[k] && rd_host_node_data_tensors(def, k, t) > 0) {
			r = rd_host_node_check(def, k, hp->addr, k ? OUTCOME_PART : OUTCOME_NOTHING, st->err);
			if (r < 0)
				return r;
		}
		r = rd_host_node_run(def, k, hp->addr, ws, hp->workspace_size);
		if (r < 0)
			return r;
	}
	return 0;
}

/* The bound tensor whose buffer holds addr, or NULL. */
static const struct rp_prog_tensor *tensor_at(const struct host_program *hp, const struct rd_program_run *run,
					       uintptr_t addr)
{
	const struct rp_program *def = hp->base.def;

	for (int i = 0; i < def->nbound; i++) {
		const struct rp_prog_tensor *t = &def->tensors[def->bind[i]];
		const struct rd_buffer *b = t->kind == RP_PT_SCALAR ? NULL : run->buffers[t->bind_index];

		if (b && addr >= (uintptr_t)b->ptr && addr < (uintptr_t)b->ptr + b->size)
			return t;
	}
	return NULL;
}

/* A node failed without naming why (it only returned -errno). */
static void report(const struct run_state *st, const struct rd_program_run *run, int r, uintptr_t fault,
		   struct rp_error *err)
{
	const struct rp_program *def = st->hp->base.def;
	const int dev = st->hp->base.device->index;
	const struct rp_prog_node *n = st->node >= 0 ? &def->nodes[st->node] : NULL;
	char where[RP_PROG_NAME_MAX * 2 + 64];

	if (n)
		snprintf(where, sizeof(where), "node %d '%s' (%s)", st->node, n->name, n->op->name);
	else
		snprintf(where, sizeof(where), "the checks before the first node");
	if (r == -EFAULT) {
		const struct rp_prog_tensor *t = tensor_at(st->hp, run, fault);

		if (t) {
			rp_err_invalid_operand(err, t->name, "its memory is gone",
					       "'%s''s buffer is no longer backed by its file (it was truncated); the Run "
					       "stopped at %s; %s", t->name, where, st->node > 0 ? OUTCOME_PART : OUTCOME_NOTHING);
			return;
		}
		rp_err_backend_error(err, dev, "program '%s' touched memory that is gone (address %#lx) at %s",
				     def->name, (unsigned long)fault, where);
	} else if (r == -ENOMEM) {
		rp_err_out_of_memory(err, dev, "host compute ran out of memory at %s of program '%s'; %s", where,
				     def->name, st->node > 0 ? OUTCOME_PART : OUTCOME_NOTHING);
	} else {
		rp_err_backend_error(err, dev, "program '%s' failed at %s: %s; %s", def->name, where, strerror(-r),
				     st->node > 0 ? OUTCOME_PART : OUTCOME_NOTHING);
	}
}

/* The journal's copies of the inouts (proto/program_journal.h, mode
 * copy): saved before the first node, put back by a retry of a Run that
 * saved them. */
static void journal_copy(const struct host_program *hp, const struct rd_program_run *run, char *journal, bool save)
{
	const struct rp_program *def = hp->base.def;

	for (int b = 0; b < def->nbound; b++) {
		const struct rp_prog_tensor *t = &def->tensors[def->bind[b]];
		char *slot, *mem;

		/* Scalars have no buffer, inputs and outputs no place. */
		if (t->kind != RP_PT_INOUT)
			continue;
		slot = journal + rp_program_journal_offset(def, b);
		mem = (char *)run->buffers[b]->ptr + run->offsets[b];
		memcpy(save ? slot : mem, save ? mem : slot, t->extent_bytes);
	}
}

static void journal_mark(char *journal, uint64_t seq, enum rp_prog_journal_state state)
{
	struct rp_prog_journal_header h = { RP_PROG_JOURNAL_MAGIC, seq, state, 0 };

	memcpy(journal, &h, sizeof(h));
}

/* A retry: 1 when the Run it retries was applied whole; 0 to run (the
 * inouts put back where it had saved them); -EIO with RunTorn where a
 * marks journal's Run had begun, -EINVAL where copies were saved and the
 * retry's journal is bound for marks. */
static int journal_recover(struct host_program *hp, const struct rd_program_run *run, char *journal,
			   struct rp_error *err)
{
	struct rp_prog_journal_header h;

	memcpy(&h, journal, sizeof(h));
	switch (rp_program_journal_retry(&h, run->seq, run->journal_mode, hp->base.def, &hp->base.obj.id, err)) {
	case RP_RETRY_APPLIED:
		hp->base.retries_applied++;
		return 1;
	case RP_RETRY_TORN:
		hp->base.retries_torn++;
		return -EIO;
	case RP_RETRY_MODE_CHANGED:
		return -EINVAL;
	case RP_RETRY_RESTORE:
		journal_copy(hp, run, journal, false);
		hp->base.retries_restored++;
		return 0;
	case RP_RETRY_RUN:
		break;
	}
	return 0;
}

struct journaled_run {
	struct run_state *st;
	const struct rd_program_run *run;
	char *journal;
};

/* The nodes, and around them what a journal asks; under the SIGBUS guard
 * like every touch of client memory. */
static int run_journaled(void *arg)
{
	struct journaled_run *jr = arg;
	struct host_program *hp = jr->st->hp;
	const bool copies = jr->run->journal_mode == RP_JOURNAL_COPY;
	int r;

	if (jr->journal && jr->run->retry && (r = journal_recover(hp, jr->run, jr->journal, jr->st->err)) != 0)
		return r;
	/* A fault found before the journal is marked: the Run never began,
	 * and its retry runs it as a first one. */
	if (jr->journal && (r = check_lost(jr->st, -1)) < 0)
		return r;
	if (jr->journal) {
		if (copies)
			journal_copy(hp, jr->run, jr->journal, true);
		journal_mark(jr->journal, jr->run->seq, copies ? RP_JOURNAL_SAVED : RP_JOURNAL_BEGUN);
	}
	r = run_nodes(jr->st);
	if (r == 0 && jr->journal)
		journal_mark(jr->journal, jr->run->seq, RP_JOURNAL_DONE);
	return r;
}

void host_program_run(struct rd_op *op)
{
	struct rd_program_run *run = op->run;
	struct host_program *hp = (struct host_program *)run->prog;
	struct run_state st = { hp, &op->err, -1 };
	const uint64_t start = rd_now_ns();
	uintptr_t fault = 0;
	int r;

	pthread_mutex_lock(&hp->lock);
	r = take_arena(hp, &op->err);
	if (r == 0)
		r = resolve(hp, run, &op->err);
	if (r == 0) {
		struct journaled_run jr = {
			&st, run, run->journal ? (char *)run->journal->ptr + run->journal_offset : NULL,
		};

		r = rd_host_guarded(run_journaled, &jr, &fault);
		if (r > 0) {
			run->already_done = true;
			r = 0;
		}
		if (r < 0 && !op->err.name)
			report(&st, run, r, fault, &op->err);
	}
	trim_arena(hp);
	hp->base.stream_runs++;
	hp->base.launch_ns += rd_now_ns() - start;
	pthread_mutex_unlock(&hp->lock);
}
