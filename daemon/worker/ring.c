/* SPDX-License-Identifier: Apache-2.0 */
/* io.regen.Lane on a worker socket: a lane's submission and completion
 * rings in a memfd the client shares (proto/ring.h), beside the lane's
 * Varlink connection, which stays its identity, its lifetime and its error
 * channel.
 *
 * Records are taken on the loop thread: each is copied out of shared
 * memory before it is looked at, decoded into a struct rp_compute and held
 * to every check a Varlink call is (rp_ring_decode, rd_compute_submit), its
 * indexes resolved through the lane's id table, whose ids were checked when
 * they were bound and are resolved again, for this process and this
 * generation, with every record. A program's Run spans its own record and
 * its continuations: it is taken once all of them are published (until
 * then the loop waits, asleep, for the doorbell that publishes the rest),
 * all are copied out, decoded into the struct rp_program_run a Varlink
 * Run's parameters become (rp_ring_decode_run) and prepared by the same
 * rd_program_run_prepare. A completion is written by whichever
 * thread finishes the record (the lane's, or the loop for a refusal) and
 * published in record order, a Run's continuations' right after the Run's
 * own: a slot's state is the worker's own, never the client's.
 *
 * Doorbells: the client's end of a datagram socket pair wakes the loop
 * (uv_poll); after a wake-up, a record taken or a record's op back, the
 * loop keeps looking at the ring from an idle handle a while before it
 * says it sleeps. While records are in flight that is the longest spin;
 * idle, how long adapts: a spin
 * that found the next record doubles it, one that ran out halves it, a
 * doorbell that came within the longest spin sets it to twice the gap (at
 * most ring_spin_us; by default 1 ms where there are four CPUs or
 * more, and 10 µs below, where a spinning loop takes the CPU the client
 * needs to write the record it waits for). */
#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <unistd.h>
#include <uv.h>
#include "daemon/log.h"
#include "daemon/options.h"
#include "daemon/worker/session.h"
#include "proto/errors.h"
#include "proto/params.h"
#include "proto/ring.h"

/* How long the loop keeps looking after the last record at most (with
 * four CPUs or more, and fewer), and how much of that it spends inside one
 * idle callback before it lets the loop poll its other handles.
 * ring_spin_us (REGEN_RING_SPIN_US) overrides the first. */
#define SPIN_MAX_NS 1000000
#define SPIN_MAX_FEW_CPUS_NS 10000
#define SPIN_SLICE_NS 5000
/* Doorbell datagrams read per wake-up at most (one is enough to wake; a
 * client that rings without pause must not hold the loop in recv). */
#define DOORBELL_DRAIN 64
/* Records taken in one turn of the loop at most: a client that refills its
 * ring as fast as it is emptied (refusals are answered at once) must not
 * keep the loop from its other connections. The rest waits for the spin
 * handle's next turn. */
#define TAKE_PER_TURN 128
/* Ids bound in one call at most. */
#define BIND_MAX 1024

enum slot_state { SLOT_FREE = 0, SLOT_RUNNING, SLOT_DONE };

struct rd_ring {
	struct rd_session *session;
	struct rd_worker *worker;
	void *base;
	size_t size;
	struct rp_ring_header *hdr;
	uint32_t entries;            /* the worker's copy: the header's is the client's to change */
	uint32_t sq_head;            /* records taken (loop thread) */
	_Atomic uint32_t cq_tail;    /* completions published (written under lock, read by the loop) */
	pthread_mutex_t lock;        /* slot states, cq_tail, completion slots */
	uint8_t *state;              /* enum slot_state per slot */
	uint64_t *tags;              /* the record's tag per slot, for completions written without the record */
	uint64_t *taken_ns;          /* per slot: when its record was taken (rd_now_ns) */
	struct ring_op *ops;         /* one per slot: a record in flight needs no allocation */
	uint8_t *held;               /* per slot, loop thread: its op is out (until its done ran) */
	int doorbell;
	uv_poll_t poll;
	uv_idle_t spin;
	unsigned handles;            /* open uv handles */
	bool stopped;                /* no more records taken */
	/* The connection closed: the records published before it (up to
	 * final_tail) are still taken, and run, then the ring stops. */
	bool closing;
	uint32_t final_tail;
	bool destroyed;              /* the session is gone: free once the handles closed */
	/* When a record was last taken or a record's op last came back: a
	 * client that waits for its calls submits the next soon after. */
	uint64_t last_active_ns, spin_ns, spin_max_ns;
	unsigned in_flight;          /* records whose op is out (loop thread) */
	bool spun;                   /* the loop is spinning since a record or a wake-up */
	struct rp_id *ids;
	uint32_t nids;
	/* Per slot: the continuations of the Run whose own record it holds
	 * (their completions go out with its own). */
	uint16_t *continuations;
	/* Where a Run's records are copied out of shared memory. */
	union rp_ring_slot *copies;
	/* Records the Run at sq_head needs published before it is taken (0:
	 * none waits): a ring that has those published in part has nothing to
	 * take yet, and the loop sleeps. */
	uint32_t waiting_for;
};

/* A record on its way: the call the backend finishes (with its deadline)
 * and where its completion goes (the ring's, in the slot of its record). */
struct ring_op {
	struct rd_compute_call cc;   /* first: the backend hands its op back */
	struct rd_ring *ring;
	uint32_t seq;
	uint64_t tag;
	bool published;
};

/* ring_spin_us; auto by the CPUs. */
static uint64_t spin_max_ns(const struct rd_options *opts)
{
	if (opts->ring_spin_us >= 0)
		return (uint64_t)opts->ring_spin_us * 1000u;
	return sysconf(_SC_NPROCESSORS_ONLN) >= 4 ? SPIN_MAX_NS : SPIN_MAX_FEW_CPUS_NS;
}

static void ring_wake_client(struct rd_ring *r)
{
	char b = 0;

	/* Never blocks: a full socket already holds a wake-up. */
	if (rp_ring_flag_take(&r->hdr->cq_waiting))
		(void)send(r->doorbell, &b, 1, MSG_DONTWAIT | MSG_NOSIGNAL);
}

/* How far a record's op had got when its completion is written. */
enum op_stage {
	OP_FINISHED,    /* the backend handed it back */
	OP_LAUNCHED,    /* its work is enqueued (answered at launch) */
	OP_IN_FLIGHT,   /* answered early (deadline, stop): queued or running */
};

/* Any thread: writes record seq's completion (with the stage times of op,
 * the backend's, where there is one, as far as stage says it got) and
 * publishes every one that is done in order. A record already answered (at
 * launch, or failed as the worker stops) is not answered twice: false. */
static bool ring_publish(struct rd_ring *r, uint32_t seq, uint64_t tag, const struct rp_error *err,
			 const struct rd_op *op, enum op_stage stage)
{
	uint32_t mask = r->entries - 1;
	bool advanced = false;

	pthread_mutex_lock(&r->lock);
	if (r->state[seq & mask] != SLOT_RUNNING) {
		pthread_mutex_unlock(&r->lock);
		return false;
	}
	struct rp_ring_completion *cqe = rp_ring_completion_at(r->base, r->entries, seq);
	/* An op answered early may be launched by its lane's thread as this
	 * reads it: the completion says what was true when it was written. */
	uint64_t launched_ns = op ? atomic_load_explicit(&op->launched_ns, memory_order_relaxed) : 0;
	uint64_t elapsed_us = 0;
	if (op && stage == OP_LAUNCHED)
		elapsed_us = rd_compute_launch_us(op);
	else if (op && stage == OP_FINISHED)
		elapsed_us = op->elapsed_us;
	rp_ring_complete(cqe, tag, err, elapsed_us);
	cqe->timing = (struct rp_ring_timing){
		.taken_ns = r->taken_ns[seq & mask],
		.launched_ns = launched_ns,
		.finished_ns = op && stage == OP_FINISHED ? op->finished_ns : 0,
		.published_ns = rd_now_ns(),
	};
	r->state[seq & mask] = SLOT_DONE;
	for (uint32_t k = 1; k <= r->continuations[seq & mask]; k++) {
		uint32_t slot = (seq + k) & mask;

		cqe = rp_ring_completion_at(r->base, r->entries, seq + k);
		rp_ring_complete_continuation(cqe, r->tags[slot], seq);
		cqe->timing = (struct rp_ring_timing){ .taken_ns = r->taken_ns[slot], .published_ns = rd_now_ns() };
		r->state[slot] = SLOT_DONE;
	}
	uint32_t tail = atomic_load_explicit(&r->cq_tail, memory_order_relaxed);
	while (r->state[tail & mask] == SLOT_DONE) {
		r->state[tail & mask] = SLOT_FREE;
		tail++;
		advanced = true;
	}
	if (advanced) {
		atomic_store_explicit(&r->cq_tail, tail, memory_order_release);
		rp_ring_store(&r->hdr->cq_tail, tail);
	}
	pthread_mutex_unlock(&r->lock);
	if (advanced) {
		rp_ring_fence();
		ring_wake_client(r);
	}
	return true;
}

static void ring_fail(struct rd_ring *r, uint32_t seq, uint64_t tag, struct rp_error *err)
{
	rd_session_complete_error(r->session, err);
	ring_publish(r, seq, tag, err, NULL, OP_FINISHED);
	rp_error_clear(err);
}

/* The backend's thread, as the op is handed back. */
static void ring_op_completed(struct rd_op *op)
{
	struct ring_op *ro = (struct ring_op *)op;

	rd_session_complete_error(ro->ring->session, &op->err);
	ring_publish(ro->ring, ro->seq, ro->tag, &op->err, op, OP_FINISHED);
	ro->published = true;
}

/* The backend's thread, as the work of a record that names a signal_event
 * is enqueued: its completion goes out now (io.regen.Compute), the client
 * orders on the event; what the backend says at the end is not published. */
static void ring_op_launched(struct rd_op *op)
{
	struct ring_op *ro = (struct ring_op *)op;
	static const struct rp_error ok = { 0 };

	if (ring_publish(ro->ring, ro->seq, ro->tag, &ok, op, OP_LAUNCHED))
		ro->cc.answered_at_launch = true;
}

static void ring_take(struct rd_ring *r);
static void ring_spin_from_now(struct rd_ring *r);
static void ring_spin_after_completion(struct rd_ring *r);

/* The loop thread, once the backend finished the op. */
static void ring_op_done(struct rd_op *op)
{
	struct ring_op *ro = (struct ring_op *)op;
	struct rd_ring *r = ro->ring;
	struct rd_session *s = r->session;

	if (!ro->published) {
		rd_session_complete_error(s, &op->err);
		ring_publish(r, ro->seq, ro->tag, &op->err, op, OP_FINISHED);
	}
	rd_compute_log_after_launch(&ro->cc);
	rd_compute_finished(s->worker, &ro->cc);
	rp_error_clear(&op->err);
	r->held[ro->seq & (r->entries - 1)] = 0;
	r->in_flight--;
	/* A full ring has room again. */
	ring_take(r);
	ring_spin_after_completion(r);
	rd_session_call_finished(s);
}

/* The loop thread: the record passed its deadline (health.c). Its
 * completion goes out now, saying whether its work was launched; what the
 * backend says later is not published, and the slot is not taken again
 * before the op's done ran. */
static void ring_answer_early(struct rd_compute_call *cc, struct rp_error *err)
{
	struct ring_op *ro = (struct ring_op *)cc;

	rd_session_complete_error(ro->ring->session, err);
	ring_publish(ro->ring, ro->seq, ro->tag, err, &cc->op, OP_IN_FLIGHT);
}

/* A Run's records (copied out) into cc's op, as a Varlink Run's parameters
 * become it in rd_program_run: the program looked up for the caller, the
 * records decoded against it, the same preparation. What is held on
 * failure stays on cc's op. */
static int ring_prepare_run(struct rd_ring *r, uint32_t seq, const union rp_ring_slot *recs, struct rd_compute_call *cc,
			    struct rp_error *err)
{
	struct rp_program_run req = { 0 };
	struct rd_program *prog;
	struct rp_id id;
	int ret;

	if ((ret = rp_ring_run_check_span(&recs[0].run, r->entries, err)) < 0 ||
	    (ret = rp_ring_run_program(&recs[0].run, r->ids, r->nids, &id, err)) < 0 ||
	    (ret = rd_program_find(r->worker, r->session, &id, &prog, err)) < 0)
		return ret;
	ret = rp_ring_decode_run(recs, seq, r->ids, r->nids, prog->def, &req, err);
	if (ret == 0)
		ret = rd_program_run_prepare(r->session, prog, &req, cc, err);
	else if (!err->name)
		rp_err_out_of_memory(err, r->worker->dev.index, "no host memory for the run");
	rp_program_run_finish(&req);
	return ret;
}

static void ring_submit(struct rd_ring *r, uint32_t seq, const union rp_ring_slot *recs)
{
	struct rp_error err = { 0 };
	/* ring_take saw the slot's op free: its done ran. */
	struct ring_op *ro = &r->ops[seq & (r->entries - 1)];
	int ret;

	memset(ro, 0, sizeof(*ro));
	ro->ring = r;
	ro->seq = seq;
	ro->tag = recs[0].call.tag;
	if (recs[0].call.op == RP_OP_PROGRAM)
		ret = ring_prepare_run(r, seq, recs, &ro->cc, &err);
	else
		ret = rp_ring_decode(&recs[0].call, r->ids, r->nids, &ro->cc.op.compute, &err);
	if (ret < 0) {
		rd_compute_release(r->worker, &ro->cc.op);
		ring_fail(r, seq, ro->tag, &err);
		return;
	}
	ro->cc.op.done = ring_op_done;
	ro->cc.op.completed = ring_op_completed;
	if (ro->cc.op.compute.signal_event.present)
		ro->cc.op.launched = ring_op_launched;
	ro->cc.op.userdata = ro;
	ro->cc.answer_early = ring_answer_early;
	if (rd_compute_submit(r->session, &ro->cc, &err) < 0) {
		ring_fail(r, seq, ro->tag, &err);
		return;
	}
	r->held[seq & (r->entries - 1)] = 1;
	r->in_flight++;
}

/* The client wrote nonsense into the ring's counters: the lane's
 * connection, its error channel, closes, which fails what is in flight for
 * the client as a broken connection does. */
static void ring_break(struct rd_ring *r, const char *why)
{
	rd_warn("ring", r->worker->dev.index, rd_worker_generation(r->worker), r->session->conn->peer.pid,
		"closing the lane: %s", why);
	r->stopped = true;
	rd_conn_close(r->session->conn);
}

/* How many records the one at sq_head (its copy) takes: a Run's with its
 * continuations, where their count may be waited for (a Run whose count may
 * not is taken alone, and refused). */
static uint32_t record_span(const struct rd_ring *r, const union rp_ring_slot *rec)
{
	struct rp_error ignored = { 0 };

	if (rec->call.op != RP_OP_PROGRAM || rp_ring_run_check_span(&rec->run, r->entries, &ignored) < 0) {
		rp_error_clear(&ignored);
		return 1;
	}
	return 1u + rec->run.continuations;
}

/* Whether the slots of records sq_head .. sq_head + span - 1 are free:
 * their completions read by the client, no op of theirs still out. */
static bool slots_free(const struct rd_ring *r, uint32_t published, uint32_t span)
{
	if (r->sq_head + span - 1 - published >= r->entries)
		return false;
	for (uint32_t k = 0; k < span; k++)
		if (r->held[(r->sq_head + k) & (r->entries - 1)])
			return false;
	return true;
}

/* Takes every record the client published, as far as completion slots
 * allow. */
static void on_spin(uv_idle_t *h);

static void ring_take_published(struct rd_ring *r)
{
	for (unsigned taken = 0; !r->stopped; taken++) {
		uint32_t published = atomic_load_explicit(&r->cq_tail, memory_order_acquire);
		uint32_t tail, seq, avail, span;
		const uint32_t mask = r->entries - 1;

		r->waiting_for = 0;
		if (!slots_free(r, published, 1))
			return;   /* the next slot's record is still in flight */
		tail = r->closing ? r->final_tail : rp_ring_load(&r->hdr->sq_tail);
		avail = tail - r->sq_head;
		if (avail == 0)
			return;
		if (taken == TAKE_PER_TURN) {
			/* More next turn: the spin handle comes back for them. */
			rp_ring_flag_set(&r->hdr->sq_sleeping, 0);
			if (!uv_is_active((uv_handle_t *)&r->spin))
				ring_spin_from_now(r);
			return;
		}
		if (avail > r->entries) {
			ring_break(r, "the submission counter is ahead of the ring");
			return;
		}
		/* The client may rewrite the slot while we look: look at a copy. */
		memcpy(&r->copies[0], rp_ring_record_at(r->base, r->entries, r->sq_head), sizeof(r->copies[0]));
		span = record_span(r, &r->copies[0]);
		if (avail < span) {
			/* A Run's continuations are not all published: taken
			 * once they are (their publication rings the doorbell
			 * of a loop asleep). */
			r->waiting_for = span;
			return;
		}
		if (!slots_free(r, published, span))
			return;
		for (uint32_t k = 1; k < span; k++)
			memcpy(&r->copies[k], rp_ring_record_at(r->base, r->entries, r->sq_head + k),
			       sizeof(r->copies[k]));
		seq = r->sq_head;
		r->sq_head += span;
		rp_ring_store(&r->hdr->sq_head, r->sq_head);
		pthread_mutex_lock(&r->lock);
		uint64_t taken_ns = rd_now_ns();
		for (uint32_t k = 0; k < span; k++) {
			r->state[(seq + k) & mask] = SLOT_RUNNING;
			r->tags[(seq + k) & mask] = r->copies[k].call.tag;
			r->taken_ns[(seq + k) & mask] = taken_ns;
			r->continuations[(seq + k) & mask] = k == 0 ? (uint16_t)(span - 1) : 0;
		}
		pthread_mutex_unlock(&r->lock);
		uint64_t now = uv_hrtime();
		/* Found while spinning: spinning pays, spin longer next time. */
		if (r->spun) {
			r->spin_ns = r->spin_ns * 2 + 1000;
			if (r->spin_ns > r->spin_max_ns)
				r->spin_ns = r->spin_max_ns;
		}
		r->last_active_ns = now;
		ring_submit(r, seq, r->copies);
	}
}

/* A closing ring stops once it took every record published before the
 * close, or finds the last Run's continuations never came. */
static void ring_take(struct rd_ring *r)
{
	ring_take_published(r);
	if (r->closing && !r->stopped && (r->sq_head == r->final_tail || r->waiting_for))
		rd_ring_stop(r);
}

/* While records are in flight the loop spins as long as it may: their
 * client is waiting and submits again as soon as it is answered (a loop
 * asleep then cost each pipelined round of 20 GEMMs 15-35 µs on the H200
 * before it took the first record). Idle, the spin adapts. */
static uint64_t spin_budget(const struct rd_ring *r)
{
	return r->in_flight ? r->spin_max_ns : r->spin_ns;
}

static void ring_sleep(struct rd_ring *r);

static void on_spin(uv_idle_t *h)
{
	struct rd_ring *r = h->data;
	uint64_t start = uv_hrtime(), now = start;

	if (r->stopped) {
		uv_idle_stop(h);
		return;
	}
	do {
		uint32_t before = r->sq_head;

		ring_take(r);
		if (r->stopped)
			return;
		now = uv_hrtime();
		if (r->sq_head != before)
			return;   /* let the loop poll the rest, then look again */
		if (now - r->last_active_ns >= spin_budget(r)) {
			/* Ran out: spinning did not pay this time. */
			if (!r->in_flight)
				r->spin_ns /= 2;
			ring_sleep(r);
			return;
		}
		__builtin_ia32_pause();
	} while (now - start < SPIN_SLICE_NS);
}

/* Says the loop sleeps, then looks once more: a record published before
 * the flag was seen would otherwise wait for the next doorbell. */
static void ring_sleep(struct rd_ring *r)
{
	uv_idle_stop(&r->spin);
	r->spun = false;
	rp_ring_flag_set(&r->hdr->sq_sleeping, 1);
	rp_ring_fence();
	/* A Run published in part is nothing to take: the loop sleeps until
	 * the rest comes (with its doorbell), rather than spin on it. */
	uint32_t avail = rp_ring_load(&r->hdr->sq_tail) - r->sq_head;
	if (avail != 0 && avail >= r->waiting_for) {
		rp_ring_flag_set(&r->hdr->sq_sleeping, 0);
		ring_take(r);
		if (!r->stopped)
			ring_spin_from_now(r);
	}
}

/* The loop looks at the ring from its idle handle, its budget counted
 * from now. */
static void ring_spin_from_now(struct rd_ring *r)
{
	r->last_active_ns = uv_hrtime();
	r->spun = true;
	uv_idle_start(&r->spin, on_spin);
}

/* A record's op came back (its completion is out): the client answered
 * will likely submit again at once, so the loop looks for that record
 * from now, awake, instead of paying a doorbell and a wake-up. */
static void ring_spin_after_completion(struct rd_ring *r)
{
	if (r->stopped)
		return;
	if (uv_is_active((uv_handle_t *)&r->spin)) {
		r->last_active_ns = uv_hrtime();
		return;
	}
	rp_ring_flag_set(&r->hdr->sq_sleeping, 0);
	ring_spin_from_now(r);
}

static void on_doorbell(uv_poll_t *h, int status, int events)
{
	struct rd_ring *r = h->data;
	char buf[DOORBELL_DRAIN];

	if (r->stopped)
		return;
	/* Each datagram is one ring of the bell; what counts is that one came.
	 * The poll is level-triggered: what is left wakes the next turn. */
	for (int i = 0; i < DOORBELL_DRAIN && recv(r->doorbell, buf, sizeof(buf), MSG_DONTWAIT) > 0; i++)
		;
	/* Woken within the longest spin of the last record: a spin that long
	 * would have found this one without the wake-up, which costs more. */
	uint64_t gap = uv_hrtime() - r->last_active_ns;
	if (gap < r->spin_max_ns)
		r->spin_ns = 2 * gap < r->spin_max_ns ? 2 * gap : r->spin_max_ns;
	rp_ring_flag_set(&r->hdr->sq_sleeping, 0);
	ring_take(r);
	if (r->stopped)
		return;
	ring_spin_from_now(r);
}

static void ring_free(struct rd_ring *r)
{
	if (r->base)
		munmap(r->base, r->size);
	if (r->doorbell >= 0)
		close(r->doorbell);
	pthread_mutex_destroy(&r->lock);
	free(r->state);
	free(r->tags);
	free(r->taken_ns);
	free(r->ops);
	free(r->held);
	free(r->ids);
	free(r->continuations);
	free(r->copies);
	free(r);
}

static void on_handle_closed(uv_handle_t *h)
{
	struct rd_ring *r = h->data;

	if (--r->handles == 0 && r->destroyed)
		ring_free(r);
}

void rd_ring_stop(struct rd_ring *r)
{
	if (!r || r->handles == 0 || uv_is_closing((uv_handle_t *)&r->poll))
		return;
	r->stopped = true;
	uv_idle_stop(&r->spin);
	uv_close((uv_handle_t *)&r->spin, on_handle_closed);
	uv_close((uv_handle_t *)&r->poll, on_handle_closed);
}

void rd_ring_finish(struct rd_ring *r)
{
	if (!r)
		return;
	if (r->stopped || r->handles == 0 || uv_is_closing((uv_handle_t *)&r->poll)) {
		rd_ring_stop(r);
		return;
	}
	/* What the client published before its connection closed is work it
	 * submitted: a rank killed right after it published an optimizer
	 * step's Run still has that step applied, whole, as a Varlink call
	 * sent before the close is. Later records are never taken: the
	 * counter is read once, now. No doorbell wakes the loop any more. */
	r->final_tail = rp_ring_load(&r->hdr->sq_tail);
	r->closing = true;
	uv_poll_stop(&r->poll);
	if (r->final_tail - r->sq_head > r->entries) {
		rd_ring_stop(r);
		return;
	}
	ring_take(r);
}

void rd_ring_destroy(struct rd_ring *r)
{
	if (!r)
		return;
	/* Before its session lets its process go: its entries no longer count
	 * for the uid (its memory goes once the handles closed). */
	if (r->session->client)
		r->session->client->ring_entries -= r->entries;
	rd_ring_stop(r);
	r->destroyed = true;
	if (r->handles == 0)
		ring_free(r);
}

void rd_ring_fail_unfinished(struct rd_ring *r, const struct rp_error *err)
{
	if (!r)
		return;
	for (uint32_t seq = atomic_load_explicit(&r->cq_tail, memory_order_acquire); seq != r->sq_head; seq++) {
		uint32_t slot = seq & (r->entries - 1);
		struct rp_error copy = { .name = err->name, .params = cJSON_Duplicate(err->params, true) };
		/* A record whose op is out may have been launched. */
		const struct rd_op *op = r->held[slot] ? &r->ops[slot].cc.op : NULL;
		ring_publish(r, seq, r->tags[slot], &copy, op, OP_IN_FLIGHT);
		rp_error_clear(&copy);
	}
}

/* ---- io.regen.Lane ---- */

static int import_failed(struct rp_error *err, const char *what, const char *why)
{
	rp_err_import_failed(err, what, "%s", why);
	return -EINVAL;
}

/* The ring's memfd: sealed against shrinking (as client memory must be, so
 * that it cannot vanish under the worker), big enough, with a header that
 * says what the client asked for. */
static int map_ring(struct rd_ring *r, int fd, uint32_t entries, struct rp_error *err)
{
	size_t need = rp_ring_size(entries);
	struct stat st;
	int seals = fcntl(fd, F_GET_SEALS);
	struct rp_ring_header *hdr;

	if (seals < 0 || !(seals & F_SEAL_SHRINK))
		return import_failed(err, "ring", "the ring must be a memfd sealed with F_SEAL_SHRINK");
	if (fstat(fd, &st) < 0 || (uint64_t)st.st_size < need)
		return import_failed(err, "ring", "the ring's memfd is smaller than its entries need");
	r->base = mmap(NULL, need, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
	if (r->base == MAP_FAILED) {
		r->base = NULL;
		return import_failed(err, "ring", "cannot map the ring's memfd");
	}
	r->size = need;
	hdr = rp_ring_header(r->base);
	if (hdr->magic != RP_RING_MAGIC || hdr->version != RP_RING_VERSION || hdr->entries != entries) {
		char why[96];

		snprintf(why, sizeof(why), "the ring's header is not a version %d ring of the entries asked for",
			 RP_RING_VERSION);
		return import_failed(err, "ring", why);
	}
	r->hdr = hdr;
	return 0;
}

static int check_doorbell(int fd, struct rp_error *err)
{
	int domain = 0, type = 0;
	socklen_t len = sizeof(int);

	if (getsockopt(fd, SOL_SOCKET, SO_DOMAIN, &domain, &len) < 0 || domain != AF_UNIX ||
	    getsockopt(fd, SOL_SOCKET, SO_TYPE, &type, &len) < 0 || type != SOCK_DGRAM)
		return import_failed(err, "doorbell", "the doorbell must be an AF_UNIX SOCK_DGRAM socket");
	return 0;
}

static int fd_param(const struct rd_call *call, const char *name, int *fd, struct rp_error *err)
{
	uint64_t index;
	int r = rp_params_uint(call->msg.params, name, RP_FDS_MAX - 1, 0, &index, err);

	if (r < 0)
		return r;
	if (r == 1 || index >= call->raw.nfds || call->raw.fds[index] < 0)
		return rp_error_invalid_parameter(err, name);
	*fd = (int)index;
	return 0;
}

void rd_ring_open(struct rd_call *call)
{
	static const struct rp_field fields[] = {
		{ "entries", RP_T_INT, true },
		{ "ids", RP_T_INT, false },
		{ "ring", RP_T_INT, true },
		{ "doorbell", RP_T_INT, true },
		{ NULL },
	};
	struct rd_session *s = rd_session_of(call);
	struct rd_worker *w = s->worker;
	struct rp_error err = { 0 };
	uint64_t entries, nids;
	int ring_fd, bell_fd;
	struct rd_ring *r = NULL;

	if (rp_params_check(call->msg.params, fields, &err) < 0 ||
	    rp_params_uint(call->msg.params, "entries", RP_RING_ENTRIES_MAX, 0, &entries, &err) < 0 ||
	    rp_params_uint(call->msg.params, "ids", RP_RING_IDS_MAX, RP_RING_IDS_DEFAULT, &nids, &err) < 0 ||
	    fd_param(call, "ring", &ring_fd, &err) < 0 || fd_param(call, "doorbell", &bell_fd, &err) < 0)
		goto fail;
	if (!rp_ring_entries_valid((uint32_t)entries)) {
		rp_error_invalid_parameter(&err, "entries");
		goto fail;
	}
	if (nids == 0) {
		rp_error_invalid_parameter(&err, "ids");
		goto fail;
	}
	if (s->ring) {
		rp_err_limit_exceeded(&err, "rings", 1, "this connection already has its ring: one per lane");
		goto fail;
	}
	/* A record in flight is an unfinished call: the ring may not hold more
	 * than the connection may. */
	if (entries > s->conn->max_in_flight) {
		rp_err_limit_exceeded(&err, "calls in flight", s->conn->max_in_flight,
				      "a ring of %u entries holds more calls in flight than a connection may",
				      (unsigned)entries);
		goto fail;
	}
	/* Each entry holds a call's state in this worker (kilobytes): a uid's
	 * rings together are bounded, not only each one. */
	unsigned uid_entries = rd_objects_ring_entries_of_uid(&w->objects, s->client->peer.uid);
	if (uid_entries + entries > w->opts->max_ring_entries) {
		rp_err_limit_exceeded(&err, "ring entries", w->opts->max_ring_entries,
				      "uid %u's rings on device %d hold %u entries; %u more would pass max_ring_entries "
				      "(%u); close a lane or open a smaller ring",
				      (unsigned)s->client->peer.uid, w->dev.index, uid_entries, (unsigned)entries,
				      w->opts->max_ring_entries);
		goto fail;
	}
	r = calloc(1, sizeof(*r));
	if (!r) {
		rp_err_out_of_memory(&err, w->dev.index, "no host memory for a ring");
		goto fail;
	}
	r->doorbell = -1;
	pthread_mutex_init(&r->lock, NULL);
	r->session = s;
	r->worker = w;
	r->entries = (uint32_t)entries;
	r->nids = (uint32_t)nids;
	r->spin_max_ns = spin_max_ns(r->worker->opts);
	r->spin_ns = r->spin_max_ns / 2;
	r->state = calloc(entries, 1);
	r->tags = calloc(entries, sizeof(*r->tags));
	r->taken_ns = calloc(entries, sizeof(*r->taken_ns));
	r->ops = calloc(entries, sizeof(*r->ops));
	r->held = calloc(entries, 1);
	r->ids = calloc(nids, sizeof(*r->ids));
	r->continuations = calloc(entries, sizeof(*r->continuations));
	r->copies = calloc(RP_RING_RUN_CONTINUATIONS_MAX + 1, sizeof(*r->copies));
	if (!r->state || !r->tags || !r->taken_ns || !r->ops || !r->held || !r->ids || !r->continuations || !r->copies) {
		rp_err_out_of_memory(&err, w->dev.index, "no host memory for a ring");
		goto fail;
	}
	if (check_doorbell(call->raw.fds[bell_fd], &err) < 0 ||
	    map_ring(r, call->raw.fds[ring_fd], r->entries, &err) < 0)
		goto fail;
	/* The counters start where the worker says; the client starts at 0. */
	rp_ring_store(&r->hdr->sq_head, 0);
	rp_ring_store(&r->hdr->cq_tail, 0);
	rp_ring_flag_set(&r->hdr->sq_sleeping, 1);
	r->doorbell = call->raw.fds[bell_fd];
	call->raw.fds[bell_fd] = -1;
	uv_poll_init_socket(w->loop, &r->poll, r->doorbell);
	uv_idle_init(w->loop, &r->spin);
	r->poll.data = r->spin.data = r;
	r->handles = 2;
	uv_poll_start(&r->poll, UV_READABLE, on_doorbell);
	s->ring = r;
	s->client->ring_entries += r->entries;
	rd_debug("ring", w->dev.index, rd_worker_generation(w), s->conn->peer.pid, "ring of %u entries, %u ids",
		 r->entries, r->nids);
	cJSON *reply = cJSON_CreateObject();
	cJSON_AddNumberToObject(reply, "entries", r->entries);
	cJSON_AddNumberToObject(reply, "ids", r->nids);
	cJSON_AddNumberToObject(reply, "version", RP_RING_VERSION);
	cJSON_AddNumberToObject(reply, "record_size", RP_RING_RECORD_SIZE);
	cJSON_AddNumberToObject(reply, "completion_size", RP_RING_COMPLETION_SIZE);
	rd_call_reply(call, reply, false);
	/* Records written before the reply came are taken now. */
	ring_take(r);
	return;
fail:
	if (r)
		ring_free(r);
	rd_call_fail(call, &err);
}

/* What an id names in the table: an event, a program (a Run's), or else
 * a buffer (an id of another kind is refused as no buffer's). */
static enum rd_object_kind bindable_kind(const struct rp_id *id)
{
	switch (id->kind) {
	case RP_ID_EVENT:
		return RD_OBJECT_EVENT;
	case RP_ID_PROGRAM:
		return RD_OBJECT_PROGRAM;
	default:
		return RD_OBJECT_BUFFER;
	}
}

void rd_ring_bind(struct rd_call *call)
{
	static const struct rp_field fields[] = {
		{ "index", RP_T_INT, true },
		{ "ids", RP_T_ARRAY, true },
		{ NULL },
	};
	struct rd_session *s = rd_session_of(call);
	struct rd_worker *w = s->worker;
	struct rp_error err = { 0 };
	struct rp_id *ids = NULL;
	uint64_t index;
	const cJSON *list, *item;
	int n = 0, count;

	if (rp_params_check(call->msg.params, fields, &err) < 0 ||
	    rp_params_uint(call->msg.params, "index", RP_RING_IDS_MAX, 0, &index, &err) < 0)
		goto fail;
	if (!s->ring) {
		rp_error_invalid_parameter(&err, "ring");
		goto fail;
	}
	list = cJSON_GetObjectItemCaseSensitive(call->msg.params, "ids");
	count = cJSON_GetArraySize(list);
	if (count > BIND_MAX || index + (uint64_t)count > s->ring->nids) {
		rp_error_invalid_parameter(&err, "index");
		goto fail;
	}
	ids = calloc((size_t)count + 1, sizeof(*ids));
	if (!ids) {
		rp_err_out_of_memory(&err, w->dev.index, "no host memory");
		goto fail;
	}
	/* Every id is checked before any is bound: the call binds all or none. */
	cJSON_ArrayForEach(item, list) {
		struct rd_object *o;
		struct rp_id *id = &ids[n++];

		if (!cJSON_IsString(item) || strlen(item->valuestring) >= RP_ID_MAX) {
			rp_error_invalid_parameter(&err, "ids");
			goto fail;
		}
		if (item->valuestring[0] == '\0')
			continue;   /* unbinds the index */
		if (rp_id_parse(item->valuestring, id) < 0) {
			rp_error_invalid_parameter(&err, "ids");
			goto fail;
		}
		if (rd_objects_find(&w->objects, id, bindable_kind(id), s->client, "ids", &o, &err) < 0)
			goto fail;
	}
	memcpy(&s->ring->ids[index], ids, (size_t)count * sizeof(*ids));
	free(ids);
	rd_call_reply(call, NULL, false);
	return;
fail:
	free(ids);
	rd_call_fail(call, &err);
}
