/* SPDX-License-Identifier: Apache-2.0 */
/* The host device's CPUs shared among uids (share.h). The lists are short:
 * running holds at most a slot a CPU, waiting a seat a busy lane. */
#include <string.h>
#include "daemon/backend/host/share.h"

void host_share_init(struct host_share *s, unsigned slots)
{
	memset(s, 0, sizeof(*s));
	pthread_mutex_init(&s->lock, NULL);
	pthread_cond_init(&s->cond, NULL);
	s->slots = slots ? slots : 1;
}

void host_share_destroy(struct host_share *s)
{
	pthread_mutex_destroy(&s->lock);
	pthread_cond_destroy(&s->cond);
}

static unsigned running_of(const struct host_share *s, uid_t uid)
{
	unsigned n = 0;

	for (const struct host_share_seat *r = s->running; r; r = r->next)
		n += r->uid == uid;
	return n;
}

static uint64_t served_at(const struct host_share *s, uid_t uid)
{
	for (unsigned i = 0; i < HOST_SHARE_UIDS; i++)
		if (s->served[i].grant && s->served[i].uid == uid)
			return s->served[i].grant;
	return 0;
}

/* Remembers uid's grant in its entry, a free one, or the oldest's. */
static void note_served(struct host_share *s, uid_t uid)
{
	unsigned at = 0;

	for (unsigned i = 0; i < HOST_SHARE_UIDS; i++) {
		if (s->served[i].grant && s->served[i].uid == uid) {
			at = i;
			break;
		}
		if (s->served[i].grant < s->served[at].grant)
			at = i;
	}
	s->served[at].uid = uid;
	s->served[at].grant = ++s->grants;
}

/* The waiting seat the next free slot goes to. Under lock; NULL when none
 * waits. */
static const struct host_share_seat *next_of(const struct host_share *s)
{
	const struct host_share_seat *best = NULL;
	unsigned best_running = 0;
	uint64_t best_served = 0;

	for (const struct host_share_seat *w = s->waiting; w; w = w->next) {
		unsigned n = running_of(s, w->uid);
		uint64_t at = served_at(s, w->uid);
		if (!best || n < best_running || (n == best_running && at < best_served) ||
		    (n == best_running && at == best_served && w->ticket < best->ticket)) {
			best = w;
			best_running = n;
			best_served = at;
		}
	}
	return best;
}

static void unlink_seat(struct host_share_seat **list, const struct host_share_seat *seat)
{
	for (struct host_share_seat **p = list; *p; p = &(*p)->next) {
		if (*p == seat) {
			*p = seat->next;
			return;
		}
	}
}

static void hold(struct host_share *s, struct host_share_seat *seat)
{
	seat->next = s->running;
	s->running = seat;
	s->nrunning++;
	note_served(s, seat->uid);
}

void host_share_enter(struct host_share *s, struct host_share_seat *seat)
{
	pthread_mutex_lock(&s->lock);
	if (s->nrunning < s->slots && !s->waiting) {
		hold(s, seat);
		pthread_mutex_unlock(&s->lock);
		return;
	}
	seat->ticket = s->next_ticket++;
	seat->next = s->waiting;
	s->waiting = seat;
	while (s->nrunning >= s->slots || next_of(s) != seat)
		pthread_cond_wait(&s->cond, &s->lock);
	unlink_seat(&s->waiting, seat);
	hold(s, seat);
	/* Another slot may be free too (several left at once): the seat it
	 * goes to looks again. */
	if (s->nrunning < s->slots && s->waiting)
		pthread_cond_broadcast(&s->cond);
	pthread_mutex_unlock(&s->lock);
}

bool host_share_try_enter(struct host_share *s, struct host_share_seat *seat)
{
	bool held = false;

	pthread_mutex_lock(&s->lock);
	if (s->nrunning < s->slots && !s->waiting) {
		hold(s, seat);
		held = true;
	}
	pthread_mutex_unlock(&s->lock);
	return held;
}

void host_share_leave(struct host_share *s, struct host_share_seat *seat)
{
	pthread_mutex_lock(&s->lock);
	unlink_seat(&s->running, seat);
	s->nrunning--;
	if (s->waiting)
		pthread_cond_broadcast(&s->cond);
	pthread_mutex_unlock(&s->lock);
}
