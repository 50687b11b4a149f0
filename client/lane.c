/* SPDX-License-Identifier: Apache-2.0 */
/* libregen: a device's lane, the worker connection's compute calls and
 * program Runs, over the lane's ring (io.regen.Lane, proto/ring.h) where
 * the worker offers one and the transport allows, else as Varlink calls.
 * Calls may be queued without waiting (tickets: one per ring record, so a
 * Run that spans continuations takes one per record and answers at its
 * last); either way their answers are read in order.
 *
 * The ring: a sealed memfd holding both rings, a datagram socket pair for
 * doorbells, and the id table the worker keeps for the lane, which this
 * side mirrors (what each index holds) and fills with io.regen.Lane.Bind
 * as calls name buffers and events it does not hold yet. */
#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>
#include "private.h"
#include "proto/ring.h"

#define RING_ENTRIES 256
#define RING_IDS 256
/* The most a waiting client spins before it sleeps on the doorbell;
 * REGEN_RING_SPIN_US overrides it. */
#define SPIN_MAX_NS 1000000
#define SPIN_MAX_FEW_CPUS_NS 10000
/* A ring's lane idle longer than this is checked for a worker gone before
 * its next call. */
#define IDLE_PROBE_NS 1000000

struct rc_ring {
	void *base;
	size_t size;
	struct rp_ring_header *hdr;
	uint32_t entries;
	uint32_t sq_tail, cq_head;
	int doorbell;
	uint32_t nids, next_victim;
	struct rp_id *bound;          /* what each index of the worker's id table holds */
	uint64_t *submitted_ns;       /* per slot: when its record was written */
	/* Per slot: the number of the Run's record that the record there
	 * continues (RP_RING_NONE: a record of its own), as its completion
	 * must say. */
	uint32_t *continues;
	uint64_t spin_max_ns, spin_ns;
};

static uint64_t now_ns(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (uint64_t)ts.tv_sec * 1000000000u + (uint64_t)ts.tv_nsec;
}

static uint64_t spin_max_ns(void)
{
	const char *env = getenv("REGEN_RING_SPIN_US");
	long v = env ? strtol(env, NULL, 10) : -1;

	if (v >= 0 && v <= 10000000)
		return (uint64_t)v * 1000u;
	/* With few CPUs a spinning client takes the one the worker needs. */
	return sysconf(_SC_NPROCESSORS_ONLN) >= 4 ? SPIN_MAX_NS : SPIN_MAX_FEW_CPUS_NS;
}

enum regen_transport rc_transport_from_env(void)
{
	const char *env = getenv("REGEN_TRANSPORT");

	if (env == NULL || strcmp(env, "auto") == 0 || env[0] == '\0')
		return REGEN_TRANSPORT_AUTO;
	if (strcmp(env, "varlink") == 0)
		return REGEN_TRANSPORT_VARLINK;
	if (strcmp(env, "ring") == 0)
		return REGEN_TRANSPORT_RING;
	return REGEN_TRANSPORT_AUTO;
}

static void ring_free(struct rc_ring *r)
{
	if (r == NULL)
		return;
	if (r->base != NULL)
		munmap(r->base, r->size);
	if (r->doorbell >= 0)
		close(r->doorbell);
	free(r->bound);
	free(r->submitted_ns);
	free(r->continues);
	free(r);
}

/* Tickets go on counting across a reset (the connection went): a caller
 * that holds one of the lost calls' tickets must not find it handed out
 * again to a new call, whose answer would then read as the lost one's.
 * The lost calls' tickets answer -ECONNRESET (rc_lane_wait). An error the
 * lane kept for the next wait stays. */
void rc_lane_reset(struct rc_lane *lane)
{
	struct rc_lane keep = *lane;

	ring_free(lane->open_ring);
	memset(lane, 0, sizeof(*lane));
	lane->submitted = lane->completed = keep.submitted;
	if (keep.completed < keep.submitted) {
		lane->lost_from = keep.completed + 1;
		lane->lost_upto = keep.submitted;
	} else {
		lane->lost_from = keep.lost_from;
		lane->lost_upto = keep.lost_upto;
		lane->lost_told = keep.lost_told;
		lane->lost_in_fork = keep.lost_in_fork;
	}
	memcpy(lane->err_name, keep.err_name, sizeof(lane->err_name));
	lane->err_params = keep.err_params;
	lane->err_ticket = keep.err_ticket;
}

void rc_lane_finish(struct rc_lane *lane)
{
	ring_free(lane->open_ring);
	cJSON_Delete(lane->err_params);
	memset(lane, 0, sizeof(*lane));
}

/* The first error of the calls answered since the last wait is kept for
 * it; later ones are dropped, as they are consequences as often as not. */
static void lane_note_error(struct rc_lane *lane, const char *name, const cJSON *params)
{
	if (lane->err_name[0] != '\0')
		return;
	snprintf(lane->err_name, sizeof(lane->err_name), "%s", name);
	lane->err_params = params ? cJSON_Duplicate(params, true) : NULL;
	lane->err_ticket = lane->completed;
}

/* Whether the worker serves io.regen.Lane: its GetInfo says so. */
static int worker_offers_ring(regen_client *c, struct rc_conn *conn, int64_t deadline, bool *offers)
{
	cJSON *reply = NULL, *it;
	int r = rc_exchange(c, conn, "org.varlink.service.GetInfo", NULL, NULL, 0, deadline, &reply);

	*offers = false;
	/* A peer that does not answer GetInfo serves no ring either. */
	if (r == -EREMOTE) {
		rc_clear_error(c);
		return 0;
	}
	if (r < 0)
		return r;
	cJSON_ArrayForEach(it, cJSON_GetObjectItemCaseSensitive(reply, "interfaces")) {
		if (cJSON_IsString(it) && strcmp(it->valuestring, "io.regen.Lane") == 0)
			*offers = true;
	}
	cJSON_Delete(reply);
	return 0;
}

static int ring_open(regen_client *c, struct rc_conn *conn, int64_t deadline, struct rc_ring **out)
{
	struct rc_ring *r = calloc(1, sizeof(*r));
	int memfd = -1, sv[2] = { -1, -1 }, fds[2], ret;
	cJSON *params = NULL;

	*out = NULL;
	if (r == NULL)
		return -ENOMEM;
	r->doorbell = -1;
	r->entries = RING_ENTRIES;
	r->nids = RING_IDS;
	r->size = rp_ring_size(r->entries);
	r->spin_max_ns = spin_max_ns();
	r->spin_ns = r->spin_max_ns / 2;
	r->bound = calloc(r->nids, sizeof(*r->bound));
	r->submitted_ns = calloc(r->entries, sizeof(*r->submitted_ns));
	r->continues = calloc(r->entries, sizeof(*r->continues));
	memfd = memfd_create("regen-ring", MFD_CLOEXEC | MFD_ALLOW_SEALING);
	if (r->bound == NULL || r->submitted_ns == NULL || r->continues == NULL || memfd < 0 ||
	    ftruncate(memfd, (off_t)r->size) < 0 ||
	    fcntl(memfd, F_ADD_SEALS, F_SEAL_SHRINK | F_SEAL_GROW | F_SEAL_SEAL) < 0 ||
	    socketpair(AF_UNIX, SOCK_DGRAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0, sv) < 0) {
		ret = -errno;
		rc_set_local_error(c, "cannot make a ring: %s", strerror(errno));
		goto out;
	}
	r->base = mmap(NULL, r->size, PROT_READ | PROT_WRITE, MAP_SHARED, memfd, 0);
	if (r->base == MAP_FAILED) {
		r->base = NULL;
		ret = -errno;
		rc_set_local_error(c, "cannot map a ring: %s", strerror(errno));
		goto out;
	}
	r->hdr = rp_ring_header(r->base);
	r->hdr->magic = RP_RING_MAGIC;
	r->hdr->version = RP_RING_VERSION;
	r->hdr->entries = r->entries;
	params = cJSON_CreateObject();
	cJSON_AddNumberToObject(params, "entries", r->entries);
	cJSON_AddNumberToObject(params, "ids", r->nids);
	cJSON_AddNumberToObject(params, "ring", 0);
	cJSON_AddNumberToObject(params, "doorbell", 1);
	fds[0] = memfd;
	fds[1] = sv[1];
	ret = rc_exchange(c, conn, "io.regen.Lane.Open", params, fds, 2, deadline, NULL);
	if (ret < 0)
		goto out;
	r->doorbell = sv[0];
	sv[0] = -1;
	*out = r;
	r = NULL;
out:
	cJSON_Delete(params);
	if (memfd >= 0)
		close(memfd);
	if (sv[0] >= 0)
		close(sv[0]);
	if (sv[1] >= 0)
		close(sv[1]);
	ring_free(r);
	return ret;
}

/* Picks the lane's transport on its first call on a connection. */
static int lane_setup(regen_client *c, int device, int64_t deadline)
{
	struct rc_lane *lane = &c->lanes[device];
	struct rc_conn *conn = &c->worker[device];
	bool offers = false;
	int r;

	if (lane->decided)
		return 0;
	lane->transport_epoch = c->transport_epoch;
	lane->ring = NULL;
	if (c->transport == REGEN_TRANSPORT_VARLINK) {
		lane->decided = true;
		return 0;
	}
	/* The connection keeps the ring it opened. */
	if (lane->open_ring != NULL) {
		lane->ring = lane->open_ring;
		lane->decided = true;
		return 0;
	}
	r = worker_offers_ring(c, conn, deadline, &offers);
	if (r < 0)
		return r;
	if (!offers) {
		if (c->transport == REGEN_TRANSPORT_RING) {
			rc_set_local_error(c, "the worker of device %d offers no ring (io.regen.Lane) and the transport "
					   "is forced to ring", device);
			return -EPROTONOSUPPORT;
		}
		lane->decided = true;
		return 0;
	}
	r = ring_open(c, conn, deadline, &lane->open_ring);
	if (r < 0)
		return r;
	lane->ring = lane->open_ring;
	lane->decided = true;
	return 0;
}

static int lane_broken(regen_client *c, int device, int r);

/* Indexes the record being built holds already (its earlier operands'),
 * each once: none of them may be taken back for a later one, or the record
 * would name the later buffer in both places. `index` has room for every
 * id the record names. */
struct held_indexes {
	uint32_t *index;
	unsigned count;
};

static bool is_held(const struct held_indexes *held, uint32_t index)
{
	for (unsigned i = 0; i < held->count; i++) {
		if (held->index[i] == index)
			return true;
	}
	return false;
}

static void hold(struct held_indexes *held, uint32_t index)
{
	if (!is_held(held, index))
		held->index[held->count++] = index;
}

/* The index that holds rid, bound now if none does. An index is taken
 * back from another id only when no record is outstanding (a queued record
 * names its buffers by index until the worker takes it), and never one the
 * record being built holds: -ENOSPC, nothing bound, where it holds them
 * all (a Run that names more ids than the table has). */
static int ring_index(regen_client *c, struct rc_lane *lane, int device, const struct rp_id *rid, int64_t deadline,
		      struct held_indexes *held, uint32_t *out)
{
	struct rc_ring *r = lane->ring;
	uint32_t free_index = RP_RING_NONE;
	char text[RP_ID_MAX];
	cJSON *params, *ids;
	int ret;

	for (uint32_t i = 0; i < r->nids; i++) {
		const struct rp_id *b = &r->bound[i];

		if (b->kind == rid->kind && b->serial == rid->serial && b->generation == rid->generation &&
		    b->device == rid->device) {
			*out = i;
			hold(held, i);
			return 0;
		}
		if (b->kind == 0 && free_index == RP_RING_NONE)
			free_index = i;
	}
	if (free_index == RP_RING_NONE && held->count >= r->nids)
		return -ENOSPC;
	if (free_index == RP_RING_NONE) {
		/* Answered, their first error kept for the caller's wait: this
		 * call is not theirs to fail. */
		ret = rc_lane_drain(c, device);
		if (ret < 0)
			return ret;
		/* held has fewer entries than the table (each once): this ends. */
		do
			free_index = r->next_victim++ % r->nids;
		while (is_held(held, free_index));
	}
	params = cJSON_CreateObject();
	cJSON_AddNumberToObject(params, "index", free_index);
	ids = cJSON_AddArrayToObject(params, "ids");
	cJSON_AddItemToArray(ids, cJSON_CreateString(rp_id_format(rid, text)));
	ret = rc_exchange(c, &c->worker[device], "io.regen.Lane.Bind", params, NULL, 0, deadline, NULL);
	cJSON_Delete(params);
	/* A Bind that met the connection gone (the worker crashed, or an
	 * earlier failure closed it): the lane goes with it, as when a wait
	 * meets it, and its calls outstanding are told of. Kept, it had no
	 * connection and kept its records outstanding, so no later call
	 * connected again: each failed with -ENOTCONN. */
	if (ret < 0 && ret != -EREMOTE)
		return lane_broken(c, device, ret);
	if (ret < 0)
		return ret;
	r->bound[free_index] = *rid;
	*out = free_index;
	hold(held, free_index);
	return 0;
}

void rc_lane_forget(regen_client *c, int device, const struct rp_id *rid)
{
	struct rc_ring *r = c->lanes[device].open_ring;

	if (r == NULL)
		return;
	for (uint32_t i = 0; i < r->nids; i++) {
		if (r->bound[i].serial == rid->serial && r->bound[i].kind == rid->kind)
			memset(&r->bound[i], 0, sizeof(r->bound[i]));
	}
}

void rc_lane_say_broken(regen_client *c, int device, int r)
{
	if (r == -ETIMEDOUT)
		rc_set_local_error(c, "no completion from device %d's worker before the timeout", device);
	else
		rc_set_local_error(c, "connection to device %d's worker broke with calls in flight", device);
}

/* The connection broke or a wait timed out: what is outstanding is lost
 * with it, and the next call starts afresh. */
static int lane_broken(regen_client *c, int device, int r)
{
	rc_lane_say_broken(c, device, r);
	rc_conn_close(&c->worker[device]);
	rc_lane_reset(&c->lanes[device]);
	c->lanes[device].lost_told = true;   /* this return tells */
	return r == -ETIMEDOUT ? r : -ECONNRESET;
}

/* Waits until completion cq_head is published: spins a while, then sleeps
 * on the doorbell and the connection (which tells of a worker gone). How
 * long it spins adapts: a spin that saw the completion doubles the next
 * one; after a sleep, the next spin covers twice the wait that ended it
 * when the maximum spin would have (a wake-up costs more than the spin
 * would have), and halves when even the maximum would not. */
static int ring_wait_one(struct rc_ring *r, int sock, int64_t deadline)
{
	uint64_t t0 = now_ns(), budget = r->spin_ns;
	bool slept = false;

	/* The connection was closed under the records (a Varlink call on it
	 * timed out or broke): nothing tells of the worker's end any more, and
	 * a poll of fd -1 would wait out the whole deadline. */
	if (sock < 0 && rp_ring_load(&r->hdr->cq_tail) == r->cq_head)
		return -ECONNRESET;

	for (unsigned spins = 0;; spins++) {
		if (rp_ring_load(&r->hdr->cq_tail) != r->cq_head)
			break;
		/* The clock is looked at now and then: it costs more than a look
		 * at the ring. */
		if ((spins & 63) != 0 || now_ns() - t0 < budget) {
			__builtin_ia32_pause();
			continue;
		}
		rp_ring_flag_set(&r->hdr->cq_waiting, 1);
		rp_ring_fence();
		if (rp_ring_load(&r->hdr->cq_tail) != r->cq_head)
			break;
		slept = true;
		struct pollfd p[2] = { { .fd = r->doorbell, .events = POLLIN }, { .fd = sock, .events = POLLIN } };
		int timeout = -1;
		if (deadline != RC_FOREVER) {
			int64_t left = deadline - rc_now_ms();
			if (left <= 0)
				return -ETIMEDOUT;
			timeout = left > 1000000 ? 1000000 : (int)left;
		}
		int n = poll(p, 2, timeout);
		if (n < 0 && errno != EINTR)
			return -errno;
		if (n > 0 && (p[0].revents & POLLIN)) {
			char buf[64];
			while (recv(r->doorbell, buf, sizeof(buf), MSG_DONTWAIT) > 0)
				;
		}
		/* No reply is ever outstanding on the connection while records
		 * are: anything there is its end. */
		if (n > 0 && p[1].revents)
			return rp_ring_load(&r->hdr->cq_tail) != r->cq_head ? 0 : -ECONNRESET;
	}
	if (slept) {
		uint64_t waited = now_ns() - t0;
		r->spin_ns = waited < r->spin_max_ns ? (2 * waited < r->spin_max_ns ? 2 * waited : r->spin_max_ns)
						       : r->spin_ns / 2;
	} else
		r->spin_ns = r->spin_ns * 2 + 1000 < r->spin_max_ns ? r->spin_ns * 2 + 1000 : r->spin_max_ns;
	return 0;
}

/* A completion that breaks the protocol: the lane goes with its
 * connection. */
static int ring_protocol_error(regen_client *c, struct rc_lane *lane, int device)
{
	rc_conn_close(&c->worker[device]);
	rc_lane_reset(lane);
	return -EPROTO;
}

/* Reads one completion (the oldest outstanding), noting its error. A Run's
 * continuation's answers nothing (its Run's record, read just before it,
 * did) and must name the Run it was written for. */
static int ring_reap(regen_client *c, struct rc_lane *lane, int device, int64_t deadline)
{
	struct rc_ring *r = lane->ring;
	struct rp_ring_completion cqe;
	uint32_t slot = r->cq_head & (r->entries - 1), number = r->cq_head;
	char name[64];
	cJSON *params = NULL;
	int ret = ring_wait_one(r, c->worker[device].fd, deadline);

	if (ret < 0)
		return lane_broken(c, device, ret);
	memcpy(&cqe, rp_ring_completion_at(r->base, r->entries, r->cq_head), sizeof(cqe));
	r->cq_head++;
	rp_ring_store(&r->hdr->cq_head, r->cq_head);
	lane->completed++;
	if (cqe.tag != lane->completed) {
		rc_set_local_error(c, "device %d's worker completed record %llu where %llu was next", device,
				   (unsigned long long)cqe.tag, (unsigned long long)lane->completed);
		return ring_protocol_error(c, lane, device);
	}
	ret = rp_ring_completion_error(&cqe, name, &params);
	if (ret < 0) {
		rc_set_local_error(c, "device %d's worker wrote a malformed completion", device);
		return ring_protocol_error(c, lane, device);
	}
	if (ret == 2) {
		if (r->continues[slot] == RP_RING_NONE || cqe.head != r->continues[slot]) {
			rc_set_local_error(c, "device %d's worker completed record %u as a part of record %u, which it is not",
					   device, number, cqe.head);
			return ring_protocol_error(c, lane, device);
		}
		return 0;
	}
	if (ret > 0)
		lane_note_error(lane, name, params);
	lane->last_timing = (struct regen_call_timing){
		.submitted_ns = r->submitted_ns[slot],
		.taken_ns = cqe.timing.taken_ns,
		.launched_ns = cqe.timing.launched_ns,
		.finished_ns = cqe.timing.finished_ns,
		.published_ns = cqe.timing.published_ns,
		.completed_ns = now_ns(),
	};
	lane->last_elapsed_us = cqe.elapsed_us;
	lane->idle_since_ns = now_ns();
	cJSON_Delete(params);
	return 0;
}

/* Reads one Varlink reply (the oldest outstanding call's). */
static int varlink_reap(regen_client *c, struct rc_lane *lane, int device, int64_t deadline)
{
	struct rc_conn *conn = &c->worker[device];
	struct rp_msg msg = { 0 };
	struct rp_call reply = { 0 };
	struct rp_error perr = { 0 };
	int r = rc_conn_recv(conn, &msg, deadline);

	if (r < 0) {
		rc_msg_drop(&msg);
		return lane_broken(c, device, r);
	}
	r = rp_call_parse(msg.text, msg.len, &reply, &perr);
	rc_msg_drop(&msg);
	if (r < 0 || reply.method != NULL) {
		rp_error_clear(&perr);
		if (r == 0)
			rp_call_finish(&reply);
		rc_set_local_error(c, "unparsable reply from %s", conn->path);
		rc_conn_close(conn);
		rc_lane_reset(lane);
		return -EPROTO;
	}
	lane->completed++;
	if (reply.error != NULL) {
		lane_note_error(lane, reply.error, reply.params);
	} else {
		const cJSON *e = cJSON_GetObjectItemCaseSensitive(reply.params, "elapsed_us");
		lane->last_elapsed_us = cJSON_IsNumber(e) && e->valuedouble >= 0 ? (uint64_t)e->valuedouble : 0;
		lane->last_timing = (struct regen_call_timing){ .completed_ns = now_ns() };
	}
	rp_call_finish(&reply);
	return 0;
}

/* Reads answers, ring or Varlink, until ticket's; their first error is kept
 * for the next wait. */
static int reap_upto(regen_client *c, struct rc_lane *lane, int device, uint64_t ticket)
{
	int64_t deadline = rc_deadline(c->timeout_s);
	int r;

	while (lane->completed < ticket) {
		r = lane->ring ? ring_reap(c, lane, device, deadline) : varlink_reap(c, lane, device, deadline);
		if (r < 0)
			return r;
	}
	return 0;
}

int rc_lane_drain(regen_client *c, int device)
{
	rc_check_fork(c);
	return reap_upto(c, &c->lanes[device], device, c->lanes[device].submitted);
}

int rc_lane_settle(regen_client *c, int device)
{
	struct rc_lane *lane = &c->lanes[device];
	int64_t deadline = rc_deadline(c->timeout_s);
	int r;

	rc_check_fork(c);
	while (lane->ring == NULL && lane->completed < lane->submitted) {
		r = varlink_reap(c, lane, device, deadline);
		if (r < 0)
			return r;
	}
	return 0;
}

int rc_lane_wait(regen_client *c, int device, uint64_t ticket)
{
	struct rc_lane *lane = &c->lanes[device];
	int r;

	rc_check_fork(c);
	rc_clear_error(c);
	if (ticket > lane->submitted) {
		rc_set_local_error(c, "ticket %llu was not handed out on device %d's lane (last %llu)",
				   (unsigned long long)ticket, device, (unsigned long long)lane->submitted);
		return -EINVAL;
	}
	r = reap_upto(c, lane, device, ticket);
	if (r < 0)
		return r;
	if (lane->lost_from != 0 && ticket >= lane->lost_from && !(ticket > lane->lost_upto && lane->lost_told)) {
		if (lane->lost_in_fork)
			rc_set_local_error(c, "calls %llu to %llu on device %d's lane were queued by the parent process "
					      "before this one was forked: their answers go to the parent",
					   (unsigned long long)lane->lost_from, (unsigned long long)lane->lost_upto, device);
		else
			rc_set_local_error(c, "calls %llu to %llu were in flight on device %d's lane when its connection "
					      "broke; they may or may not have run",
					   (unsigned long long)lane->lost_from, (unsigned long long)lane->lost_upto, device);
		lane->lost_told = true;
		return -ECONNRESET;
	}
	if (lane->err_name[0] != '\0') {
		rc_set_remote_error(c, lane->err_name, lane->err_params);
		c->err_ticket = lane->err_ticket;
		lane->err_name[0] = '\0';
		cJSON_Delete(lane->err_params);
		lane->err_params = NULL;
		return -EREMOTE;
	}
	return 0;
}

/* Publishes the records written from sq_tail on, `n` of them together (a
 * Run's with its continuations: the worker never sees one in part), and
 * rings a sleeping worker's doorbell. */
static void ring_publish(regen_client *c, struct rc_ring *r, uint32_t n)
{
	r->sq_tail += n;
	rp_ring_store(&r->hdr->sq_tail, r->sq_tail);
	rp_ring_fence();
	if (rp_ring_flag(&r->hdr->sq_sleeping)) {
		char b = 0;
		(void)send(r->doorbell, &b, 1, MSG_DONTWAIT | MSG_NOSIGNAL);
		c->doorbells++;
	}
}

/* Where a record waits for room: the oldest completion is read first. */
static int ring_submit(regen_client *c, struct rc_lane *lane, int device, const struct rp_compute *call,
		       int64_t deadline)
{
	struct rc_ring *r = lane->ring;
	uint32_t index_of[RP_OP_OPERANDS_MAX], wait = RP_RING_NONE, signal = RP_RING_NONE;
	uint32_t held_storage[RP_OP_OPERANDS_MAX + 2];
	struct held_indexes held = { .index = held_storage, .count = 0 };
	int ret;

	for (unsigned i = 0; i < RP_OP_OPERANDS_MAX; i++) {
		index_of[i] = RP_RING_NONE;
		if (i < call->spec->noperands && call->present[i] &&
		    (ret = ring_index(c, lane, device, &call->operands[i].buffer, deadline, &held, &index_of[i])) < 0)
			return ret;
	}
	if (call->wait_event.present &&
	    (ret = ring_index(c, lane, device, &call->wait_event.id, deadline, &held, &wait)) < 0)
		return ret;
	if (call->signal_event.present &&
	    (ret = ring_index(c, lane, device, &call->signal_event.id, deadline, &held, &signal)) < 0)
		return ret;
	while (r->sq_tail - r->cq_head >= r->entries) {
		ret = ring_reap(c, lane, device, deadline);
		if (ret < 0)
			return ret;
	}
	r->submitted_ns[r->sq_tail & (r->entries - 1)] = now_ns();
	r->continues[r->sq_tail & (r->entries - 1)] = RP_RING_NONE;
	rp_ring_encode(call, index_of, wait, signal, lane->submitted + 1,
		       rp_ring_record_at(r->base, r->entries, r->sq_tail));
	ring_publish(c, r, 1);
	lane->submitted++;
	return 0;
}

/* A Run's records: its own and the continuations its bindings and scalars
 * need, written into the next slots and published together. -ENOSPC with
 * nothing written where the Run names more ids than the id table holds. */
static int ring_submit_run(regen_client *c, struct rc_lane *lane, int device, const struct rc_run *run,
			   int64_t deadline)
{
	struct rc_ring *r = lane->ring;
	const unsigned n = RP_RING_RUN_RECORDS(run->nbind + run->nscalars);
	struct rp_ring_binding *bind = calloc((size_t)run->nbind + 1, sizeof(*bind));
	struct rp_ring_scalar *scalars = calloc((size_t)run->nscalars + 1, sizeof(*scalars));
	uint32_t *held_storage = calloc((size_t)run->nbind + 4, sizeof(*held_storage));
	struct held_indexes held = { .index = held_storage, .count = 0 };
	struct rp_ring_run_call call = {
		.wait_event = RP_RING_NONE, .signal_event = RP_RING_NONE, .journal = RP_RING_NONE,
		.deadline_ms = run->deadline_ms, .journal_offset = run->journal_offset, .seq = run->seq,
		.retry = run->retry, .journal_marks = run->journal_marks, .bind = bind, .nbind = run->nbind,
		.scalars = scalars, .nscalars = run->nscalars,
	};
	int ret;

	if (bind == NULL || scalars == NULL || held_storage == NULL) {
		ret = -ENOMEM;
		goto out;
	}
	if ((ret = ring_index(c, lane, device, &run->program, deadline, &held, &call.program)) < 0)
		goto out;
	for (unsigned i = 0; i < run->nbind; i++) {
		bind[i].bound = run->bind[i].bound;
		bind[i].offset = run->bind[i].offset;
		if ((ret = ring_index(c, lane, device, &run->bind[i].buffer, deadline, &held, &bind[i].buffer)) < 0)
			goto out;
	}
	for (unsigned i = 0; i < run->nscalars; i++)
		scalars[i] = (struct rp_ring_scalar){ .bound = run->scalars[i].bound, .value = run->scalars[i].value };
	if ((run->wait_event.kind &&
	     (ret = ring_index(c, lane, device, &run->wait_event, deadline, &held, &call.wait_event)) < 0) ||
	    (run->signal_event.kind &&
	     (ret = ring_index(c, lane, device, &run->signal_event, deadline, &held, &call.signal_event)) < 0) ||
	    (run->has_journal && (ret = ring_index(c, lane, device, &run->journal, deadline, &held, &call.journal)) < 0))
		goto out;
	while (r->sq_tail + n - r->cq_head > r->entries) {
		if ((ret = ring_reap(c, lane, device, deadline)) < 0)
			goto out;
	}
	for (unsigned part = 0; part < n; part++) {
		uint32_t slot = (r->sq_tail + part) & (r->entries - 1);

		r->submitted_ns[slot] = now_ns();
		r->continues[slot] = part ? r->sq_tail : RP_RING_NONE;
		rp_ring_encode_run(&call, lane->submitted + 1, r->sq_tail, part,
				   (union rp_ring_slot *)rp_ring_record_at(r->base, r->entries, r->sq_tail + part));
	}
	ring_publish(c, r, n);
	lane->submitted += n;
out:
	free(bind);
	free(scalars);
	free(held_storage);
	return ret;
}

static int varlink_submit(regen_client *c, struct rc_lane *lane, int device, const char *method, cJSON *params,
			  int64_t deadline)
{
	char *text = params ? rp_build_call(method, params, false, false) : NULL;
	int r;

	cJSON_Delete(params);
	if (text == NULL)
		return -ENOMEM;
	r = rc_conn_send(&c->worker[device], text, NULL, 0, deadline);
	free(text);
	if (r < 0)
		return lane_broken(c, device, r);
	lane->submitted++;
	return 0;
}

/* A Run the ring cannot carry (more ids than its table), on a ring's lane:
 * after every call outstanding is answered, one Varlink call and its reply,
 * counted as a ticket answered at once, its error kept for the wait. */
static int varlink_run_now(regen_client *c, struct rc_lane *lane, int device, const struct rc_run *run,
			   int64_t deadline)
{
	cJSON *params = rc_run_params(run), *reply = NULL, *err_params;
	int r = rc_lane_drain(c, device);

	if (r < 0 || params == NULL) {
		cJSON_Delete(params);
		return r < 0 ? r : -ENOMEM;
	}
	r = rc_exchange(c, &c->worker[device], "io.regen.Program.Run", params, NULL, 0, deadline, &reply);
	cJSON_Delete(params);
	if (r < 0 && r != -EREMOTE)
		return r;
	lane->submitted++;
	lane->completed++;
	if (r == -EREMOTE) {
		err_params = c->err_params ? cJSON_Parse(c->err_params) : NULL;
		lane_note_error(lane, c->err_name, err_params);
		cJSON_Delete(err_params);
	} else {
		const cJSON *e = cJSON_GetObjectItemCaseSensitive(reply, "elapsed_us");
		lane->last_elapsed_us = cJSON_IsNumber(e) && e->valuedouble >= 0 ? (uint64_t)e->valuedouble : 0;
		lane->last_timing = (struct regen_call_timing){ .completed_ns = now_ns() };
	}
	cJSON_Delete(reply);
	return 0;
}

/* The device's lane, ready for a call: its connection checked when idle,
 * its transport picked. */
static int lane_ready(regen_client *c, int device, int64_t deadline, struct rc_lane **out)
{
	struct rc_lane *lane;
	int r;

	if (device < 0 || device >= REGEN_DEVICES_MAX) {
		rc_set_local_error(c, "device %d is past the %d devices libregen reaches", device, REGEN_DEVICES_MAX);
		return -ENODEV;
	}
	rc_check_fork(c);
	lane = &c->lanes[device];
	/* A lane with calls outstanding keeps its connection: checking it
	 * would read their replies as a close. A ring's lane busy a moment ago
	 * is not checked either (a worker gone shows in the wait); an idle one
	 * is, so that a worker respawned in between is found before the call. */
	if (lane->completed == lane->submitted) {
		/* A switch asked for while calls were outstanding applies now. */
		if (lane->decided && lane->transport_epoch != c->transport_epoch)
			lane->decided = false;
		if (lane->ring == NULL || !lane->decided || now_ns() - lane->idle_since_ns > IDLE_PROBE_NS) {
			r = rc_ensure_worker(c, device, deadline);
			if (r < 0)
				return r;
		}
		r = lane_setup(c, device, deadline);
		if (r < 0)
			return r;
	}
	rc_clear_error(c);
	*out = lane;
	return 0;
}

int rc_lane_submit(regen_client *c, int device, const struct rp_compute *call, uint64_t *ticket)
{
	int64_t deadline = rc_deadline(c->timeout_s);
	struct rc_lane *lane;
	int r = lane_ready(c, device, deadline, &lane);

	if (r < 0)
		return r;
	r = lane->ring ? ring_submit(c, lane, device, call, deadline)
		       : varlink_submit(c, lane, device, call->spec->method, rp_compute_to_json(call), deadline);
	if (r == 0 && ticket != NULL)
		*ticket = lane->submitted;
	return r;
}

int rc_lane_submit_run(regen_client *c, int device, const struct rc_run *run, uint64_t *ticket)
{
	int64_t deadline = rc_deadline(c->timeout_s);
	struct rc_lane *lane;
	int r = lane_ready(c, device, deadline, &lane);

	if (r < 0)
		return r;
	if (lane->ring) {
		r = ring_submit_run(c, lane, device, run, deadline);
		if (r == -ENOSPC)
			r = varlink_run_now(c, lane, device, run, deadline);
	} else {
		r = varlink_submit(c, lane, device, "io.regen.Program.Run", rc_run_params(run), deadline);
	}
	if (r == 0 && ticket != NULL)
		*ticket = lane->submitted;
	return r;
}

REGEN_EXPORT int regen_client_set_transport(regen_client *c, enum regen_transport t)
{
	if (c == NULL || (unsigned)t > REGEN_TRANSPORT_RING)
		return -EINVAL;
	c->transport = t;
	/* Lanes pick again on their next call made with nothing outstanding
	 * (rc_lane_submit): those with calls outstanding keep theirs until
	 * they are answered. */
	c->transport_epoch++;
	return 0;
}

REGEN_EXPORT enum regen_transport regen_client_transport(const regen_client *c, int device)
{
	if (c == NULL || device < 0 || device >= REGEN_DEVICES_MAX || !c->lanes[device].decided)
		return REGEN_TRANSPORT_AUTO;
	return c->lanes[device].ring ? REGEN_TRANSPORT_RING : REGEN_TRANSPORT_VARLINK;
}

REGEN_EXPORT int regen_wait(regen_client *c, int device, uint64_t ticket)
{
	if (c == NULL || device < 0 || device >= REGEN_DEVICES_MAX)
		return -EINVAL;
	return rc_lane_wait(c, device, ticket);
}

REGEN_EXPORT uint64_t regen_client_error_ticket(const regen_client *c)
{
	return c != NULL ? c->err_ticket : 0;
}

REGEN_EXPORT int regen_client_tickets(const regen_client *c, int device, uint64_t *submitted, uint64_t *completed)
{
	if (c == NULL || device < 0 || device >= REGEN_DEVICES_MAX)
		return -EINVAL;
	if (submitted != NULL)
		*submitted = c->lanes[device].submitted;
	if (completed != NULL)
		*completed = c->lanes[device].completed;
	return 0;
}

REGEN_EXPORT uint64_t regen_client_doorbells(const regen_client *c)
{
	return c != NULL ? c->doorbells : 0;
}

REGEN_EXPORT uint64_t regen_client_last_elapsed_us(const regen_client *c, int device)
{
	if (c == NULL || device < 0 || device >= REGEN_DEVICES_MAX)
		return 0;
	return c->lanes[device].last_elapsed_us;
}

REGEN_EXPORT int regen_client_last_timing(const regen_client *c, int device, struct regen_call_timing *timing)
{
	if (c == NULL || timing == NULL || device < 0 || device >= REGEN_DEVICES_MAX)
		return -EINVAL;
	*timing = c->lanes[device].last_timing;
	return 0;
}
