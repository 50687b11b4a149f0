/* SPDX-License-Identifier: Apache-2.0 */
/* Attention on the CUDA backend: cuDNN's fused flash attention (the graphs
 * of cudnn_graph.c), forward and backward, bf16 and f16.
 *
 * Per device, made on the first attention call: the cuDNN handle and a
 * cache of execution plans, one per problem (shapes, strides, dtype, mask),
 * at most ATTENTION_PLANS_MAX, the least recently used evicted past that.
 * The handle and every plan are registry resources: a release destroys
 * them, a reset forgets them (a plan's kernels and the handle's state
 * belonged to the lost context), and the next call builds them again.
 * Building a plan compiles its kernels (NVRTC): 0.4-1.1 s for a new
 * problem on the H200, 40-100 ms where the kernel was compiled before;
 * once per problem and generation.
 *
 * The handle is one per device and cuDNN wants a handle used by one thread
 * at a time: lanes take exec_lock around setting its stream and enqueueing,
 * which costs microseconds, and around a plan's build, which holds other
 * lanes' attention calls back for as long (GEMMs are not affected).
 *
 * Scratch: each call takes its workspace (cuDNN's, plus the backward's f32
 * accumulators and the bounded sequence lengths) from the device's pool on
 * its lane's stream and frees it there after the attention, as GEMM does,
 * at most dev->max_scratch bytes (--max-scratch-mib).
 *
 * Sequence lengths: the client's int32 arrays are copied into the call's
 * scratch clamped into [0, Sq] and [0, Skv] by a kernel of regen's own
 * (kernels/lengths.cu) before cuDNN reads them, so no value, however
 * hostile or however changed while the call runs, makes cuDNN read or
 * write past the operands; after the attention a second kernel writes the
 * outputs' padding rows (o 0, stats -inf, gradients 0), which cuDNN
 * leaves undefined. Two small launches per call, only with lengths.
 *
 * Autotuning (attention_autotune = N, N from 2 to 16; off by default):
 * a new problem's plan is built from the first N engine configurations
 * cuda_sdpa_plan_build lists that finalize (the heuristics' ranking, then
 * a sweep of the engines' knobs; each compiles its kernels). Its first
 * call also runs each candidate on the call's own operands, on its lane's
 * stream after its wait (a warm-up run, then TUNE_RUNS runs between two
 * events), and goes on with the first; a later call that finds those runs
 * finished reads the events, switches to the fastest and, once no call
 * runs the others, destroys them. Nothing waits for the GPU. The choice is
 * remembered for the problem: after a release or reset the plan is rebuilt
 * with that configuration alone, untimed. Without it, the heuristics'
 * first configuration that finalizes runs (as cudnn-frontend and PyTorch
 * do). */
#include "regen-config.h"

#include <errno.h>
#include <math.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "daemon/backend/cuda/common.h"
#include "daemon/backend/cuda/cudnn_graph.h"
#include "proto/errors.h"
#if REGEN_HAVE_KERNELS
#include "kernels.h"
#endif

/* Execution plans kept per device (rd_cuda_set_attention_plan_limit
 * changes it). */
#define ATTENTION_PLANS_MAX 64
/* Timed runs of each candidate when autotuning, after one warm-up. */
#define TUNE_RUNS 5

struct attention_handle {
	struct rd_resource res;
	struct cuda_dev *cd;
	cudnnHandle_t handle;
};

/* A stream a plan was enqueued on and an event recorded there after its
 * last use there: an evicted plan is destroyed once all have completed. */
struct plan_use {
	cudaStream_t stream;
	cudaEvent_t done;
};

struct attention_plan {
	struct rd_resource res;
	struct cuda_attention *at;
	struct cuda_sdpa_key key;
	uint64_t hash;
	struct cuda_sdpa_plan plan;
	/* cuDNN takes no such problem: remembered, so that asking again is
	 * answered at once with the same reason. */
	bool refused;
	char why[320];
	/* Autotuning's choice, kept across releases and resets: the place of
	 * the fastest configuration in cuda_sdpa_plan_build's list (-1: none
	 * yet). Under exec_lock. */
	int tuned_index;
	/* Autotuning under way (the plan holds several candidates): each
	 * one's timing events, recorded on the lane of the call that started
	 * it. Under exec_lock; gone with the plan's release or invalidation. */
	struct {
		bool started, timed;
		unsigned n;                  /* candidates with events */
		bool ran[CUDA_SDPA_CANDIDATES_MAX];
		cudaEvent_t ev[CUDA_SDPA_CANDIDATES_MAX][2];
	} tuning;
	/* Under at->lock. */
	struct plan_use *uses;
	unsigned nuses, cap_uses;
	unsigned refs;                       /* calls between lookup and enqueue */
	struct attention_plan *prev, *next;  /* the cache, most recently used first */
};

struct cuda_attention {
	struct cuda_dev *cd;
	struct attention_handle handle;
	pthread_mutex_t exec_lock;           /* the handle's one user at a time */
	pthread_mutex_t lock;                /* the lists below and plans' uses and refs */
	struct attention_plan *head, *tail;
	unsigned count;
	/* Evicted while their last uses may still run. */
	struct attention_plan *retired;
	unsigned plans_max;
	/* Configurations a new problem's plan is timed among (1: none timed);
	 * attention_autotune, or rd_cuda_set_attention_autotune. */
	unsigned tune_candidates;
};

/* ---- The handle --------------------------------------------------------------- */

static const char *cudnn_error_name(cudnnStatus_t s)
{
	if (s == CUDNN_STATUS_INTERNAL_ERROR_HOST_ALLOCATION_FAILED ||
	    s == CUDNN_STATUS_INTERNAL_ERROR_DEVICE_ALLOCATION_FAILED)
		return RP_ERR_OUT_OF_MEMORY;
	return RP_ERR_BACKEND;
}

/* The graphs here lean on what cuDNN does itself from 9.16 on: before 9.6
 * the backward's dQ accumulator had to be zeroed by the caller (d_q would
 * be stale scratch plus the gradient), and up to 9.15 a key length off 128
 * needed a padding mask the graph does not add. An older cuDNN is refused
 * by name rather than trusted. */
#define CUDNN_VERSION_MIN 91600

static int handle_init(struct rd_resource *res)
{
	struct attention_handle *h = (struct attention_handle *)res;
	size_t version = cudnnGetVersion();
	if (version < CUDNN_VERSION_MIN)
		return cuda_status_set(RP_ERR_BACKEND,
				       "cuDNN %zu is loaded; attention needs cuDNN 9.16 or later (91600), whose "
				       "backward zeroes its own dQ accumulator and pads keys off 128 itself",
				       version);
	cudaError_t e = cudaSetDevice(h->cd->dev->index);
	if (e != cudaSuccess)
		return cuda_status_set(cuda_error_name(e), "cudaSetDevice: %s", cudaGetErrorString(e));
	cudnnStatus_t s = cudnnCreate(&h->handle);
	if (s != CUDNN_STATUS_SUCCESS) {
		char detail[256] = "";
		cudnnGetLastErrorString(detail, sizeof(detail));
		h->handle = NULL;
		return cuda_status_set(cudnn_error_name(s), "cudnnCreate: %s %s", cudnnGetErrorString(s), detail);
	}
	return 0;
}

static void handle_release(struct rd_resource *res)
{
	struct attention_handle *h = (struct attention_handle *)res;
	if (h->handle)
		cudnnDestroy(h->handle);
	h->handle = NULL;
}

/* The handle's streams and memory belonged to the lost context: cudnnDestroy
 * would call into it. Forgetting leaks its host memory once per reset. */
static void handle_invalidate(struct rd_resource *res)
{
	((struct attention_handle *)res)->handle = NULL;
}

static const struct rd_resource_ops handle_ops = {
	.kind = "cudnn_handle", .init = handle_init, .release = handle_release, .invalidate = handle_invalidate,
};

/* ---- Plans ------------------------------------------------------------------------ */

static int plan_init(struct rd_resource *res)
{
	struct attention_plan *p = (struct attention_plan *)res;
	struct cuda_attention *at = p->at;
	char why[320];

	if (p->refused)
		return cuda_status_set(RP_ERR_INVALID_OPERAND, "%s", p->why);
	if (rd_resource_ensure_valid(&at->handle.res))
		return -EIO;   /* the handle's init left its status */
	pthread_mutex_lock(&at->exec_lock);
	/* A choice made before is rebuilt alone; else as many as autotuning
	 * wants to time (one when it is off). */
	int start = p->tuned_index >= 0 ? p->tuned_index : 0;
	unsigned candidates = p->tuned_index >= 0 ? 1 : at->tune_candidates;
	int r = cuda_sdpa_plan_build(&p->key, at->handle.handle, NULL, start, candidates, &p->plan, why, sizeof(why));
	pthread_mutex_unlock(&at->exec_lock);
	if (r == -ENOTSUP) {
		p->refused = true;
		snprintf(p->why, sizeof(p->why), "%s", why);
		return cuda_status_set(RP_ERR_INVALID_OPERAND, "%s", why);
	}
	if (r < 0)
		return cuda_status_set(r == -ENOMEM ? RP_ERR_OUT_OF_MEMORY : RP_ERR_BACKEND, "%s", why);
	return 0;
}

/* The timing events of an autotuning under way, destroyed (CUDA usable)
 * or forgotten. */
static void tuning_end(struct attention_plan *p, bool destroy)
{
	for (unsigned i = 0; destroy && i < p->tuning.n; i++) {
		cudaEventDestroy(p->tuning.ev[i][0]);
		cudaEventDestroy(p->tuning.ev[i][1]);
	}
	memset(&p->tuning, 0, sizeof(p->tuning));
}

static void plan_release(struct rd_resource *res)
{
	struct attention_plan *p = (struct attention_plan *)res;
	/* Called with nothing in flight (a release drains first; an evicted
	 * plan is released once its uses completed): safe to unload. */
	cuda_sdpa_plan_destroy(&p->plan);
	tuning_end(p, true);
	for (unsigned i = 0; i < p->nuses; i++)
		cudaEventDestroy(p->uses[i].done);
	p->nuses = 0;
}

/* The plan's kernels and events lived in the lost context. Its descriptors
 * are host objects, but destroying an execution plan unloads its module
 * from the context: forget them (host memory leaked once per reset). */
static void plan_invalidate(struct rd_resource *res)
{
	struct attention_plan *p = (struct attention_plan *)res;
	free(p->plan.descs);
	memset(&p->plan, 0, sizeof(p->plan));
	tuning_end(p, false);
	p->nuses = 0;
}

static const struct rd_resource_ops plan_ops = {
	.kind = "cudnn_sdpa_plan", .init = plan_init, .release = plan_release, .invalidate = plan_invalidate,
};

static uint64_t key_hash(const struct cuda_sdpa_key *k)
{
	const unsigned char *b = (const unsigned char *)k;
	uint64_t h = 1469598103934665603ull;
	for (size_t i = 0; i < sizeof(*k); i++) {
		h ^= b[i];
		h *= 1099511628211ull;
	}
	return h;
}

static void plan_free(struct attention_plan *p)
{
	rd_resource_unregister(&p->res);
	free(p->uses);
	free(p);
}

/* Whether every stream that ran the plan is past it; under at->lock. */
static bool plan_idle(struct attention_plan *p)
{
	if (!rd_resource_is_valid(&p->res))
		return true;
	for (unsigned i = 0; i < p->nuses; i++) {
		if (cudaEventQuery(p->uses[i].done) == cudaErrorNotReady)
			return false;
	}
	return true;
}

static void unlink_plan(struct cuda_attention *at, struct attention_plan *p)
{
	if (p->prev)
		p->prev->next = p->next;
	else
		at->head = p->next;
	if (p->next)
		p->next->prev = p->prev;
	else
		at->tail = p->prev;
	p->prev = p->next = NULL;
}

/* Past the limit, the least recently used plans nobody holds leave the
 * cache; each is destroyed at once if idle, else retired until it is. The
 * victims are returned for destruction outside the lock. Under at->lock. */
static struct attention_plan *evict_locked(struct cuda_attention *at)
{
	struct attention_plan *doomed = NULL;

	for (struct attention_plan **pp = &at->retired; *pp;) {
		struct attention_plan *p = *pp;
		if (plan_idle(p)) {
			*pp = p->next;
			p->next = doomed;
			doomed = p;
		} else {
			pp = &p->next;
		}
	}
	for (struct attention_plan *p = at->tail; p && at->count > at->plans_max;) {
		struct attention_plan *prev = p->prev;
		if (p->refs == 0) {
			unlink_plan(at, p);
			at->count--;
			if (plan_idle(p)) {
				p->next = doomed;
				doomed = p;
			} else {
				p->next = at->retired;
				at->retired = p;
			}
		}
		p = prev;
	}
	return doomed;
}

/* Finds or makes the plan for key, most recently used now, held (refs)
 * until plan_put. NULL on ENOMEM. */
static struct attention_plan *plan_get(struct cuda_attention *at, const struct cuda_sdpa_key *key)
{
	uint64_t h = key_hash(key);
	struct attention_plan *p, *doomed = NULL;

	pthread_mutex_lock(&at->lock);
	for (p = at->head; p; p = p->next) {
		if (p->hash == h && memcmp(&p->key, key, sizeof(*key)) == 0)
			break;
	}
	if (p) {
		if (p != at->head) {
			unlink_plan(at, p);
			p->next = at->head;
			at->head->prev = p;
			at->head = p;
		}
	} else {
		p = calloc(1, sizeof(*p));
		if (p) {
			p->at = at;
			p->key = *key;
			p->hash = h;
			p->tuned_index = -1;
			rd_resource_register(&at->cd->dev->registry, &p->res, &plan_ops);
			p->next = at->head;
			if (at->head)
				at->head->prev = p;
			else
				at->tail = p;
			at->head = p;
			at->count++;
			p->refs++;
			doomed = evict_locked(at);
			p->refs--;
		}
	}
	if (p)
		p->refs++;
	pthread_mutex_unlock(&at->lock);
	while (doomed) {
		struct attention_plan *next = doomed->next;
		plan_free(doomed);
		doomed = next;
	}
	return p;
}

static void plan_put(struct cuda_attention *at, struct attention_plan *p)
{
	pthread_mutex_lock(&at->lock);
	p->refs--;
	pthread_mutex_unlock(&at->lock);
}

/* Records, on the lane's stream, that the plan's work there is enqueued up
 * to here. Under exec_lock (the plan is in use, so valid). */
static cudaError_t plan_note_use(struct cuda_attention *at, struct attention_plan *p, cudaStream_t stream)
{
	cudaError_t e = cudaSuccess;
	struct plan_use *u = NULL;

	pthread_mutex_lock(&at->lock);
	for (unsigned i = 0; i < p->nuses; i++) {
		if (p->uses[i].stream == stream) {
			u = &p->uses[i];
			break;
		}
	}
	if (!u) {
		if (p->nuses == p->cap_uses) {
			unsigned cap = p->cap_uses ? p->cap_uses * 2 : 4;
			struct plan_use *n = realloc(p->uses, cap * sizeof(*n));
			if (!n) {
				e = cudaErrorMemoryAllocation;
				goto out;
			}
			p->uses = n;
			p->cap_uses = cap;
		}
		cudaEvent_t ev;
		e = cudaEventCreateWithFlags(&ev, cudaEventDisableTiming);
		if (e != cudaSuccess)
			goto out;
		u = &p->uses[p->nuses++];
		u->stream = stream;
		u->done = ev;
	}
	e = cudaEventRecord(u->done, stream);
out:
	pthread_mutex_unlock(&at->lock);
	return e;
}

/* ---- Per-device state ------------------------------------------------------------ */

static pthread_mutex_t create_lock = PTHREAD_MUTEX_INITIALIZER;

/* attention_autotune: how many configurations to time, 1 (off) unless it
 * names 2 to CUDA_SDPA_CANDIDATES_MAX. */
static unsigned autotune_candidates(const struct cuda_dev *cd)
{
	unsigned n = cd->tuning.attention_autotune;

	return n < 2 ? 1u : n > CUDA_SDPA_CANDIDATES_MAX ? CUDA_SDPA_CANDIDATES_MAX : n;
}

/* The device's attention state, made (and its handle registered) on first
 * use. NULL on ENOMEM. */
static struct cuda_attention *attention_of(struct cuda_dev *cd)
{
	struct cuda_attention *at = atomic_load_explicit(&cd->attention, memory_order_acquire);
	if (at)
		return at;
	pthread_mutex_lock(&create_lock);
	at = atomic_load_explicit(&cd->attention, memory_order_acquire);
	if (!at) {
		at = calloc(1, sizeof(*at));
		if (at) {
			at->cd = cd;
			at->handle.cd = cd;
			at->plans_max = ATTENTION_PLANS_MAX;
			at->tune_candidates = autotune_candidates(cd);
			pthread_mutex_init(&at->exec_lock, NULL);
			pthread_mutex_init(&at->lock, NULL);
			rd_resource_register(&cd->dev->registry, &at->handle.res, &handle_ops);
			atomic_store_explicit(&cd->attention, at, memory_order_release);
		}
	}
	pthread_mutex_unlock(&create_lock);
	return at;
}

void cuda_attention_finish(struct cuda_dev *cd)
{
	struct cuda_attention *at = atomic_exchange(&cd->attention, NULL);
	if (!at)
		return;
	/* Plans were registered after the handle: they go first. The device
	 * was synchronized (or is lost, and unregistering an invalid resource
	 * calls nothing). */
	struct attention_plan *lists[2] = { at->head, at->retired };
	for (int i = 0; i < 2; i++) {
		for (struct attention_plan *p = lists[i]; p;) {
			struct attention_plan *next = p->next;
			plan_free(p);
			p = next;
		}
	}
	rd_resource_unregister(&at->handle.res);
	pthread_mutex_destroy(&at->lock);
	pthread_mutex_destroy(&at->exec_lock);
	free(at);
}

/* ---- Calls ------------------------------------------------------------------------- */

/* One call's problem and addresses, from either descriptor. */
struct sdpa_call {
	struct cuda_sdpa_key key;
	void *ptr[CUDA_SDPA_OPERANDS];
	/* The client's sequence lengths (int32 [B], contiguous), NULL
	 * without; and each operand's dtype, for the padding rows. */
	const int32_t *len_q, *len_kv;
	enum rp_dtype dtype[CUDA_SDPA_OPERANDS];
	float scale;
	const char *name;   /* "attention" or "attention backward", for messages */
};

static const char *const operand_names[CUDA_SDPA_OPERANDS] = {
	[CUDA_SDPA_Q] = "q", [CUDA_SDPA_K] = "k", [CUDA_SDPA_V] = "v", [CUDA_SDPA_O] = "o", [CUDA_SDPA_STATS] = "stats",
	[CUDA_SDPA_DO] = "d_o", [CUDA_SDPA_DQ] = "d_q", [CUDA_SDPA_DK] = "d_k", [CUDA_SDPA_DV] = "d_v",
};

/* Resolves operand uid: its device address, checked for the alignment the
 * graph declares, and its strides into the key. */
static int take_operand(struct sdpa_call *c, int uid, const struct rp_operand *op, struct rd_buffer *buf,
			struct rp_error *err)
{
	const char *name = operand_names[uid];

	if (!buf)
		return rp_error_invalid_operand(err, name, "%s has no buffer", name);
	if (!buf->ptr) {
		rp_error_set(err, RP_ERR_BACKEND, "%s's buffer is not mapped", name);
		return -EIO;
	}
	char *p = (char *)buf->ptr + op->offset;
	if ((uintptr_t)p % 16 != 0)
		return rp_error_invalid_operand(err, name,
						"%s's first element (offset %llu in its buffer) is not 16-byte aligned: "
						"cuDNN's attention kernels need 16-byte aligned tensors",
						name, (unsigned long long)op->offset);
	for (int i = 0; i < op->rank; i++) {
		c->key.strides[uid][i] = op->strides[i];
		/* Rows are loaded with 16-byte copies: every stride but the
		 * last (1) a multiple of 8 elements. Stats (f32, written one
		 * element at a time) are exempt. */
		if (uid != CUDA_SDPA_STATS && i < op->rank - 1 && op->shape[i] > 1 && op->strides[i] % 8 != 0)
			return rp_error_invalid_operand(err, name,
							"%s's stride %d is %lld elements: cuDNN's attention kernels need "
							"strides that are multiples of 8 elements (16 bytes)",
							name, i, (long long)op->strides[i]);
	}
	c->ptr[uid] = p;
	c->dtype[uid] = op->dtype;
	return 0;
}

/* The client's lengths: read by regen's clamp kernel only, with 4-byte
 * loads (a misaligned one would cost the context). */
static int take_lengths(struct sdpa_call *c, const struct rp_compute *pc, int slot_q, int slot_kv,
			struct rd_buffer *const *buffers, struct rp_error *err)
{
	const int slots[2] = { slot_q, slot_kv };
	const int32_t **out[2] = { &c->len_q, &c->len_kv };

	if (!pc->attention.padded)
		return 0;
#if !REGEN_HAVE_KERNELS
	return rp_error_invalid_operand(err, "seq_len_q",
					"this regend was built without nvcc, and sequence lengths on the CUDA backend "
					"need its kernels (kernels/lengths.cu)");
#endif
	for (int i = 0; i < 2; i++) {
		const char *name = pc->spec->operands[slots[i]].name;
		struct rd_buffer *buf = buffers[slots[i]];
		if (!buf)
			return rp_error_invalid_operand(err, name, "%s has no buffer", name);
		if (!buf->ptr) {
			rp_error_set(err, RP_ERR_BACKEND, "%s's buffer is not mapped", name);
			return -EIO;
		}
		char *p = (char *)buf->ptr + pc->operands[slots[i]].offset;
		if ((uintptr_t)p % sizeof(int32_t) != 0)
			return rp_error_invalid_operand(err, name, "%s's first element is not 4-byte aligned in device memory",
							name);
		*out[i] = (const int32_t *)p;
	}
	return 0;
}

static int describe(struct rd_op *op, struct sdpa_call *c)
{
	const struct rp_compute *pc = &op->compute;
	const struct rp_attention *a = &pc->attention;
	struct cuda_sdpa_key *k = &c->key;
	const bool backward = pc->spec->id == RP_OP_ATTENTION_BACKWARD;
	/* Operand slots by cuDNN tensor, per direction (-1: not an operand). */
	static const int fwd_slot[CUDA_SDPA_OPERANDS] = {
		-1, RP_ATT_Q, RP_ATT_K, RP_ATT_V, RP_ATT_O, RP_ATT_STATS, -1, -1, -1, -1,
	};
	static const int bwd_slot[CUDA_SDPA_OPERANDS] = {
		-1, RP_ATB_Q, RP_ATB_K, RP_ATB_V, RP_ATB_O, RP_ATB_STATS, RP_ATB_DO, RP_ATB_DQ, RP_ATB_DK, RP_ATB_DV,
	};
	const int *slot = backward ? bwd_slot : fwd_slot;
	enum rp_dtype dtype = pc->operands[slot[CUDA_SDPA_Q]].dtype;
	int r;

	cuda_sdpa_key_init(k);
	memset(c->ptr, 0, sizeof(c->ptr));
	c->name = backward ? "attention backward" : "attention";
	c->scale = (float)a->scale;
	if (dtype != RP_DTYPE_BF16 && dtype != RP_DTYPE_F16)
		return rp_error_invalid_operand(&op->err, "q",
						"q is %s: attention on the CUDA backend (cuDNN's fused attention) takes "
						"bf16 or f16 operands; f32 attention runs on the host backend only",
						rp_dtype_name(dtype));
	k->backward = backward;
	k->dtype = dtype == RP_DTYPE_BF16 ? CUDNN_DATA_BFLOAT16 : CUDNN_DATA_HALF;
	k->b = a->batch;
	k->h = a->heads;
	k->h_kv = a->heads_kv;
	k->s_q = a->seq_q;
	k->s_kv = a->seq_kv;
	k->d = a->head_dim;
	k->d_v = a->head_dim_v;
	k->mask = !a->causal ? CUDA_SDPA_NO_MASK
		  : a->alignment == RP_CAUSAL_BOTTOM_RIGHT ? CUDA_SDPA_CAUSAL_BOTTOM_RIGHT : CUDA_SDPA_CAUSAL_TOP_LEFT;
	k->padded = a->padded;
	/* Bottom-right with Sq > Skv never gets here without lengths: the
	 * parser refuses it. */
	if (k->s_q > INT32_MAX || k->s_kv > INT32_MAX)
		return rp_error_invalid_operand(&op->err, "q", "sequence lengths over 2^31 - 1 are not supported");
	if (backward && k->s_q == 1 && k->s_kv == 1)
		return rp_error_invalid_operand(&op->err, "q",
						"cuDNN's attention backward does not take Sq = Skv = 1 (one score per "
						"row has no gradient through the softmax)");
	for (int uid = CUDA_SDPA_Q; uid <= CUDA_SDPA_DV; uid++) {
		if (slot[uid] < 0 || !pc->present[slot[uid]])
			continue;
		if ((r = take_operand(c, uid, &pc->operands[slot[uid]], op->buffers[slot[uid]], &op->err)) < 0)
			return r;
	}
	k->stats = c->ptr[CUDA_SDPA_STATS] != NULL;
	c->len_q = c->len_kv = NULL;
	return take_lengths(c, pc, backward ? RP_ATB_SEQ_LEN_Q : RP_ATT_SEQ_LEN_Q,
			    backward ? RP_ATB_SEQ_LEN_KV : RP_ATT_SEQ_LEN_KV, op->buffers, &op->err);
}

static const char *problem(const struct cuda_sdpa_key *k, char *buf, size_t n)
{
	static const char *const masks[] = { "", ", causal top-left", ", causal bottom-right" };
	snprintf(buf, n, "%s B%lld H%lld Hkv%lld Sq%lld Skv%lld D%lld Dv%lld%s%s",
		 k->dtype == CUDNN_DATA_BFLOAT16 ? "bf16" : "f16", (long long)k->b, (long long)k->h, (long long)k->h_kv,
		 (long long)k->s_q, (long long)k->s_kv, (long long)k->d, (long long)k->d_v, masks[k->mask],
		 k->padded ? ", sequence lengths" : "");
	return buf;
}

#if REGEN_HAVE_KERNELS
static enum rk_dtype rk_of(enum rp_dtype dt)
{
	return dt == RP_DTYPE_F32 ? RK_F32 : dt == RP_DTYPE_F16 ? RK_F16 : RK_BF16;
}

/* Operand uid as a [B, heads, rows, width] tensor whose rows past len
 * (all an entry's where gate is 0) are set to value. */
static void padding_rows(struct rk_rows *r, const struct sdpa_call *c, int uid, int64_t heads, int64_t rows,
			 int64_t width, const int32_t *len, const int32_t *gate, float value)
{
	const struct cuda_sdpa_key *k = &c->key;

	r->p = c->ptr[uid];
	r->dtype = rk_of(c->dtype[uid]);
	r->dims[0] = k->b;
	r->dims[1] = heads;
	r->dims[2] = rows;
	r->dims[3] = width;
	for (int i = 0; i < 3; i++)
		r->strides[i] = k->strides[uid][i];
	r->strides[3] = uid == CUDA_SDPA_STATS ? 1 : k->strides[uid][3];
	r->len = len;
	r->gate = gate;
	r->value = value;
}

/* After the attention: the outputs' padding rows as the protocol says,
 * from the bounded lengths in the workspace. */
static cudaError_t fill_padding(const struct sdpa_call *c, const struct cuda_sdpa_plan *plan, char *ws,
				cudaStream_t stream)
{
	const struct cuda_sdpa_key *k = &c->key;
	const int32_t *lq = (const int32_t *)(ws + plan->seq_len_q_offset);
	const int32_t *lkv = (const int32_t *)(ws + plan->seq_len_kv_offset);
	struct rk_rows rows[RK_ROWS_MAX];
	int n = 0;

	/* An entry without queries has no gradient for its keys either,
	 * whether or not cuDNN writes them. */
	if (k->backward) {
		padding_rows(&rows[n++], c, CUDA_SDPA_DQ, k->h, k->s_q, k->d, lq, NULL, 0.0f);
		padding_rows(&rows[n++], c, CUDA_SDPA_DK, k->h_kv, k->s_kv, k->d, lkv, lq, 0.0f);
		padding_rows(&rows[n++], c, CUDA_SDPA_DV, k->h_kv, k->s_kv, k->d_v, lkv, lq, 0.0f);
	} else {
		padding_rows(&rows[n++], c, CUDA_SDPA_O, k->h, k->s_q, k->d_v, lq, NULL, 0.0f);
		if (c->ptr[CUDA_SDPA_STATS])
			padding_rows(&rows[n++], c, CUDA_SDPA_STATS, k->h, k->s_q, 1, lq, NULL, -INFINITY);
	}
	return rk_fill_padding_rows(rows, n, stream);
}
#endif

/* Autotuning's first step: each candidate run on this call's operands, a
 * warm-up and then TUNE_RUNS runs between two events, on the lane's stream
 * (after the call's wait). A candidate that fails to run is passed over.
 * Under exec_lock, the handle on the lane's stream, the lengths (if any)
 * already in ws. */
static void tune_start(struct cuda_lane *lane, struct cuda_attention *at, struct attention_plan *p,
		       const struct sdpa_call *c, void *ws)
{
	struct cuda_sdpa_plan *plan = &p->plan;

	p->tuning.started = true;
	for (unsigned i = 0; i < plan->ncandidates; i++) {
		cudaEvent_t *ev = p->tuning.ev[i];
		if (cudaEventCreate(&ev[0]) != cudaSuccess)
			break;
		if (cudaEventCreate(&ev[1]) != cudaSuccess) {
			cudaEventDestroy(ev[0]);
			break;
		}
		p->tuning.n++;
		bool ran = cuda_sdpa_execute(at->handle.handle, plan, i, c->ptr, c->scale, ws, NULL, 0) ==
			   CUDNN_STATUS_SUCCESS;
		cudaEventRecord(ev[0], lane->stream);
		for (int run = 0; run < TUNE_RUNS && ran; run++)
			ran = cuda_sdpa_execute(at->handle.handle, plan, i, c->ptr, c->scale, ws, NULL, 0) ==
			      CUDNN_STATUS_SUCCESS;
		cudaEventRecord(ev[1], lane->stream);
		p->tuning.ran[i] = ran;
	}
	cudaGetLastError();   /* a failed event call is the timing's loss alone */
}

/* Once the timing runs have finished: the fastest becomes the plan's
 * choice (and the problem's, across releases), one line on the worker's
 * standard error says what was timed. */
static void tune_read(struct cuda_lane *lane, struct attention_plan *p, const struct sdpa_call *c)
{
	struct cuda_sdpa_plan *plan = &p->plan;
	unsigned n = p->tuning.n, best = 0;
	float ms[CUDA_SDPA_CANDIDATES_MAX];
	char desc[160];

	if (n == 0 || cudaEventQuery(p->tuning.ev[n - 1][1]) != cudaSuccess) {
		cudaGetLastError();
		return;   /* not yet, or the context's error, which the call's own run reports */
	}
	fprintf(stderr, "regend-worker dev=%d: attention autotune, %s:", lane->cd->dev->index,
		problem(&c->key, desc, sizeof(desc)));
	for (unsigned i = 0; i < n; i++) {
		if (!p->tuning.ran[i] || cudaEventElapsedTime(&ms[i], p->tuning.ev[i][0], p->tuning.ev[i][1]) != cudaSuccess)
			ms[i] = INFINITY;
		else
			ms[i] /= TUNE_RUNS;
		if (ms[i] < ms[best])
			best = i;
		fprintf(stderr, " [%u] %s %.4f ms%s", i, plan->candidate[i].knobs, ms[i], p->tuning.ran[i] ? "" : " (failed)");
	}
	fprintf(stderr, "; %u of %d configurations built; running [%u]\n", plan->ncandidates, plan->heuristic_results,
		best);
	cudaGetLastError();
	tuning_end(p, true);
	p->tuning.started = p->tuning.timed = true;
	plan->chosen = best;
	p->tuned_index = plan->candidate[best].index;
}

/* Autotuning, a step per call while the plan holds several candidates:
 * start the timing, read it once finished, and drop the candidates not
 * chosen once no call runs any of them (the plan's uses all complete).
 * Under exec_lock. */
static void tune_step(struct cuda_lane *lane, struct cuda_attention *at, struct attention_plan *p,
		      const struct sdpa_call *c, void *ws)
{
	if (!p->tuning.started) {
		tune_start(lane, at, p, c, ws);
		return;
	}
	if (!p->tuning.timed) {
		tune_read(lane, p, c);
		if (!p->tuning.timed)
			return;
	}
	pthread_mutex_lock(&at->lock);
	bool idle = plan_idle(p);
	pthread_mutex_unlock(&at->lock);
	if (idle)
		cuda_sdpa_plan_keep(&p->plan, p->plan.chosen);
}

/* A cuDNN failure that may be the context's: the lane's stream tells
 * whether the context took a sticky error (then DeviceLost, and the lane's
 * completion marks the device lost). */
static int fail_cudnn(struct cuda_lane *lane, struct rd_op *op, const char *what, const char *why)
{
	cudaError_t e = cudaStreamQuery(lane->stream);
	if (cuda_error_is_sticky(e)) {
		rp_error_set(&op->err, RP_ERR_DEVICE_LOST, "%s: %s; the context is lost: %s", what, why,
			     cudaGetErrorString(e));
		return -EIO;
	}
	rp_error_set(&op->err, RP_ERR_BACKEND, "%s: %s", what, why);
	return -EIO;
}

int cuda_attention_enqueue(struct cuda_lane *lane, struct rd_op *op)
{
	struct cuda_dev *cd = lane->cd;
	struct sdpa_call c;
	char desc[160];
	int r;

	r = describe(op, &c);
	if (r < 0)
		return r;
	struct cuda_attention *at = attention_of(cd);
	struct attention_plan *p = at ? plan_get(at, &c.key) : NULL;
	if (!p) {
		rp_error_set(&op->err, RP_ERR_OUT_OF_MEMORY, "no memory for an attention plan");
		return -ENOMEM;
	}

	if (rd_resource_ensure_valid(&p->res)) {
		r = cuda_status_to_error(&op->err, "planning the attention");
		if (p->refused) {
			/* Set once under the plan's lock and never changed: its
			 * ensure_valid ordered it before this read. */
			rp_error_clear(&op->err);
			r = rp_error_invalid_operand(&op->err, "q", "cuDNN's fused attention does not take %s (%s): %s",
						     c.name, problem(&c.key, desc, sizeof(desc)), p->why);
		} else {
			cudaError_t e = cudaStreamQuery(lane->stream);
			if (cuda_error_is_sticky(e)) {
				rp_error_clear(&op->err);
				rp_error_set(&op->err, RP_ERR_DEVICE_LOST,
					     "planning the attention: the context is lost: %s", cudaGetErrorString(e));
				r = -EIO;
			}
		}
		goto out;
	}

	size_t bytes = p->plan.workspace;
	uint64_t cap = cd->dev->max_scratch;
	if (cap && bytes > cap) {
		rp_err_limit_exceeded(&op->err, "scratch", (long long)cap,
				      "%s (%s) needs %zu bytes of scratch, more than the %llu one call may take "
				      "(max_scratch_mib)",
				      c.name, problem(&c.key, desc, sizeof(desc)), bytes, (unsigned long long)cap);
		r = -E2BIG;
		goto out;
	}
	struct cuda_scratch scratch;
	if (cuda_scratch_take(lane, bytes, &scratch, c.name, &op->err)) {
		r = -EIO;
		goto out;
	}
	void *ws = scratch.ptr;
	cudaError_t e;

	char why[320] = "";
	cudnnStatus_t s = CUDNN_STATUS_SUCCESS;
	e = cudaSuccess;
#if REGEN_HAVE_KERNELS
	/* The lengths, bounded, where the plan reads them. */
	if (c.key.padded) {
		e = rk_clamp_lengths(c.len_q, c.len_kv, (int32_t *)((char *)ws + p->plan.seq_len_q_offset),
				     (int32_t *)((char *)ws + p->plan.seq_len_kv_offset), c.key.b, (int32_t)c.key.s_q,
				     (int32_t)c.key.s_kv, lane->stream);
		if (e != cudaSuccess) {
			rp_error_set(&op->err, cuda_error_name(e), "bounding the sequence lengths: %s",
				     cudaGetErrorString(e));
			r = -EIO;
		}
	}
#endif
	if (r < 0) {
		/* The scratch is freed below. */
	} else if (rd_resource_ensure_valid(&at->handle.res)) {
		r = cuda_status_to_error(&op->err, "cuDNN handle");
	} else {
		pthread_mutex_lock(&at->exec_lock);
		s = cudnnSetStream(at->handle.handle, lane->stream);
		if (s == CUDNN_STATUS_SUCCESS && p->plan.ncandidates > 1 && !lane->capturing)
			tune_step(lane, at, p, &c, ws);
		if (s == CUDNN_STATUS_SUCCESS)
			s = cuda_sdpa_execute(at->handle.handle, &p->plan, p->plan.chosen, c.ptr, c.scale, ws, why,
					      sizeof(why));
		else
			snprintf(why, sizeof(why), "cudnnSetStream: %s", cudnnGetErrorString(s));
#if REGEN_HAVE_KERNELS
		if (s == CUDNN_STATUS_SUCCESS && c.key.padded)
			e = fill_padding(&c, &p->plan, ws, lane->stream);
#endif
		if (s == CUDNN_STATUS_SUCCESS && e == cudaSuccess && !lane->capturing)
			e = plan_note_use(at, p, lane->stream);
		pthread_mutex_unlock(&at->exec_lock);
		if (s != CUDNN_STATUS_SUCCESS)
			r = fail_cudnn(lane, op, "running the attention", why);
		else if (e != cudaSuccess) {
			rp_error_set(&op->err, cuda_error_name(e), "finishing the attention (padding rows, the plan's use): %s",
				     cudaGetErrorString(e));
			r = -EIO;
		}
	}
	e = cuda_scratch_give(lane, &scratch);
	if (e != cudaSuccess && r == 0) {
		rp_error_set(&op->err, cuda_error_name(e), "freeing the attention scratch: %s", cudaGetErrorString(e));
		r = -EIO;
	}
out:
	plan_put(at, p);
	return r;
}

unsigned rd_cuda_attention_plan_count(struct rd_device *dev)
{
	struct cuda_attention *at = atomic_load_explicit(&cuda_dev_of(dev)->attention, memory_order_acquire);
	if (!at)
		return 0;
	pthread_mutex_lock(&at->lock);
	unsigned n = at->count;
	pthread_mutex_unlock(&at->lock);
	return n;
}

void rd_cuda_set_attention_autotune(struct rd_device *dev, unsigned candidates)
{
	struct cuda_attention *at = attention_of(cuda_dev_of(dev));
	if (!at)
		return;
	pthread_mutex_lock(&at->exec_lock);
	at->tune_candidates = candidates < 2 ? 1u : candidates > CUDA_SDPA_CANDIDATES_MAX ? CUDA_SDPA_CANDIDATES_MAX
											  : candidates;
	pthread_mutex_unlock(&at->exec_lock);
}

int rd_cuda_attention_plan_choice(struct rd_device *dev, unsigned *candidates, int *heuristic_index, long long *engine)
{
	struct cuda_attention *at = atomic_load_explicit(&cuda_dev_of(dev)->attention, memory_order_acquire);
	int r = -ENOENT;
	if (!at)
		return r;
	pthread_mutex_lock(&at->exec_lock);
	pthread_mutex_lock(&at->lock);
	struct attention_plan *p = at->head;
	if (p && rd_resource_is_valid(&p->res) && p->plan.ncandidates > 0) {
		*candidates = p->plan.ncandidates;
		*heuristic_index = p->plan.candidate[p->plan.chosen].index;
		*engine = (long long)p->plan.engine;
		r = 0;
	}
	pthread_mutex_unlock(&at->lock);
	pthread_mutex_unlock(&at->exec_lock);
	return r;
}

void rd_cuda_set_attention_plan_limit(struct rd_device *dev, unsigned plans_max)
{
	struct cuda_attention *at = attention_of(cuda_dev_of(dev));
	if (!at)
		return;
	pthread_mutex_lock(&at->lock);
	at->plans_max = plans_max ? plans_max : ATTENTION_PLANS_MAX;
	pthread_mutex_unlock(&at->lock);
}
