/* SPDX-License-Identifier: Apache-2.0 */
/* Calls left waiting on a dead process's GPU work.
 *
 * A call that names a wait_event runs after the client's own work that the
 * event's last record stands for: its lane's stream waits for it on the
 * GPU. A process that dies before that work finished never completes the
 * event (the work went with its context), and nothing short of the end of
 * the worker's context takes such a wait back: the lane is wedged, and its
 * calls (a Run that would update kept state among them) would sit until
 * call_deadline_ms made the device hung, a minute in which the TakeBack of
 * a resumed rank waits for them (supervisor/keep.c) and after which the
 * uid is charged with the hang.
 *
 * So a session that closes with calls in flight is watched: once its
 * process is gone and, ORPHAN_GRACE_MS later, a call of it still waits on
 * an event that is not done, its calls are failed where the backend waits
 * for client events on the host (cuda_client_wait = host: no stream holds
 * the wait, so nothing else needs to go), and otherwise the worker reports
 * its device hung at once,
 * but not before the session's calls ahead of the first such call (on its
 * lane, in order before it) are done: they wait on nothing unfinished and
 * run, and a respawn would cut one in the middle (a Run whose journal
 * holds marks only, proto/program_journal.h, would be torn). The respawn
 * discards the wedged work, none of which had started (no update applied
 * half; the kept state is at the last step completed, or at the one a Run
 * ahead completed), and kept memory stays with the supervisor. The uid is charged with the hang
 * (daemon/hang_charge.h) only when a session of another uid was open on
 * the device, which the respawn cost its objects: a rank that its
 * scheduler killed costs nobody else anything, and its own resumed rank is
 * not refused. A process that closed its connection but lives on is left
 * to the deadline: its work still runs. */
#include <inttypes.h>
#include <stdio.h>
#include "daemon/log.h"
#include "daemon/worker/session.h"

#define ORPHAN_POLL_MS 10
/* From seeing the process gone (its exit, after its files, the GPU's
 * among them, were closed) to calling its waits wedged. */
#define ORPHAN_GRACE_MS 250
/* A closed session whose process lives on is watched this long: a process
 * on its way out closes its sockets before it is gone. */
#define ORPHAN_EXITING_MS 10000

static uint64_t ms(uint64_t ns)
{
	return ns / 1000000u;
}

/* How many of s's calls in flight wait on an event that is not done (a
 * backend with events: rd_orphan_watch watches nothing otherwise), and
 * (*ahead) how many of its calls in flight come before the first of them:
 * the calls run oldest first on the session's lane, so those run. */
static unsigned waiting_on_unfinished(struct rd_worker *w, const struct rd_session *s, unsigned *ahead)
{
	unsigned n = 0;

	*ahead = 0;
	for (const struct rd_compute_call *cc = w->running; cc; cc = cc->next) {
		if (cc->session != s)
			continue;
		if (cc->op.wait_event && !w->dev.backend->event_done(cc->op.wait_event))
			n++;
		else if (n == 0)
			(*ahead)++;
	}
	return n;
}

static bool another_uid_served(const struct rd_worker *w, uid_t uid)
{
	for (const struct rd_session *s = w->sessions; s; s = s->next)
		if (!s->closed && s->client && s->client->peer.uid != uid)
			return true;
	return false;
}

static void wedged(struct rd_worker *w, struct rd_session *s, unsigned calls)
{
	const struct rd_peer *peer = &s->conn->peer;
	bool charged = another_uid_served(w, peer->uid);
	char reason[160];

	snprintf(reason, sizeof(reason), "orphaned: pid %d died with %u call(s) on lane %u waiting on its unfinished GPU work",
		 (int)peer->pid, calls, s->lane ? s->lane->index : 0);
	/* Where no stream waits on the client's event (the lane's thread
	 * does), its calls fail unlaunched and nothing else is touched. */
	if (s->lane && w->dev.backend->abandon_client_waits &&
	    w->dev.backend->abandon_client_waits(s->lane, reason) == 0) {
		rd_info("health", w->dev.index, rd_worker_generation(w), (int)peer->pid,
			"process gone %" PRIu64 " ms ago, %u call(s) of it still wait on its GPU work, which will never "
			"be done, %u call(s) ahead of them finished first: they fail unlaunched, the device serves on "
			"(uid %u not charged)",
			ms(uv_hrtime() - s->gone_ns), calls, s->orphan_ahead, (unsigned)peer->uid);
		s->orphan_watch = false;
		return;
	}
	rd_warn("health", w->dev.index, rd_worker_generation(w), (int)peer->pid,
		"process gone %" PRIu64 " ms ago, %u call(s) of it still wait on its GPU work, which will never be "
		"done, %u call(s) ahead of them finished first: the device is replaced at once (uid %u %s)",
		ms(uv_hrtime() - s->gone_ns), calls, s->orphan_ahead, (unsigned)peer->uid,
		charged ? "charged: another uid's session was open" : "not charged: nobody else's was open");
	s->orphan_watch = false;
	rd_worker_fault_hung(w, reason, charged ? (int64_t)peer->uid : -1);
}

/* Whether s is still watched after this look at it. */
static bool look(struct rd_worker *w, struct rd_session *s, uint64_t now)
{
	unsigned ahead, calls = waiting_on_unfinished(w, s, &ahead);

	if (!calls) {
		/* Closed: no new call comes, and those in flight will finish. */
		rd_debug("health", w->dev.index, rd_worker_generation(w), (int)s->conn->peer.pid,
			 "closed with %u call(s) in flight, none waiting on unfinished work: not watched",
			 s->in_flight);
		return false;
	}
	if (ahead > s->orphan_ahead) {
		s->orphan_ahead = ahead;   /* the most seen: they finish from here on */
		rd_debug("health", w->dev.index, rd_worker_generation(w), (int)s->conn->peer.pid,
			 "closed: %u call(s) wait on its unfinished GPU work behind %u call(s) that run first",
			 calls, ahead);
	}
	if (!s->gone_ns) {
		if (!rd_peer_alive(&s->conn->peer))
			s->gone_ns = now;
		return s->gone_ns || now - s->closed_ns < (uint64_t)ORPHAN_EXITING_MS * 1000000u;
	}
	if (now - s->gone_ns < (uint64_t)ORPHAN_GRACE_MS * 1000000u)
		return true;
	/* The calls ahead run to their end first (a hang among them is the
	 * call deadline's). */
	if (ahead)
		return true;
	wedged(w, s, calls);
	return false;
}

static void on_orphan_poll(uv_timer_t *t)
{
	struct rd_worker *w = t->data;
	uint64_t now = uv_hrtime();
	bool any = false;

	for (struct rd_session *s = w->sessions; s; s = s->next) {
		if (!s->orphan_watch)
			continue;
		s->orphan_watch = look(w, s, now);
		any |= s->orphan_watch;
	}
	if (any)
		uv_timer_start(&w->orphan_timer, on_orphan_poll, ORPHAN_POLL_MS, 0);
}

void rd_orphan_watch(struct rd_session *s)
{
	struct rd_worker *w = s->worker;

	if (!w->dev.backend->event_done)
		return;
	s->orphan_watch = true;
	s->closed_ns = uv_hrtime();
	if (!uv_is_active((uv_handle_t *)&w->orphan_timer))
		uv_timer_start(&w->orphan_timer, on_orphan_poll, 0, 0);
}

void rd_orphan_init(struct rd_worker *w)
{
	uv_timer_init(w->loop, &w->orphan_timer);
	w->orphan_timer.data = w;
}

void rd_orphan_stop(struct rd_worker *w)
{
	uv_timer_stop(&w->orphan_timer);
}
