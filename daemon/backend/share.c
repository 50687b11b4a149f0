/* SPDX-License-Identifier: Apache-2.0 */
/* A device shared among uids (share.h): a table of the uids it follows,
 * the few that call at once, and the calls waiting, one a busy lane. */
#include <string.h>
#include <time.h>
#include "daemon/backend/backend.h"
#include "daemon/backend/share.h"

/* A waiting call looks again at least this often: a uid that lingered
 * stops holding it back without any call ending. */
#define RECHECK_NS 1000000u

struct rd_share_waiter {
	struct rd_share_user *user;
	uint64_t ticket;
	struct rd_share_waiter *next;
};

void rd_share_init(struct rd_share *s, unsigned capacity, uint64_t linger_ns)
{
	pthread_condattr_t attr;

	memset(s, 0, sizeof(*s));
	pthread_mutex_init(&s->lock, NULL);
	pthread_condattr_init(&attr);
	pthread_condattr_setclock(&attr, CLOCK_MONOTONIC);
	pthread_cond_init(&s->cond, &attr);
	pthread_condattr_destroy(&attr);
	s->capacity = capacity ? capacity : 1;
	s->linger_ns = linger_ns;
}

void rd_share_destroy(struct rd_share *s)
{
	pthread_mutex_destroy(&s->lock);
	pthread_cond_destroy(&s->cond);
}

/* Calls running or waiting, or its last one ended less than linger_ns ago. */
static bool active(const struct rd_share *s, const struct rd_share_user *u, uint64_t now)
{
	return u->running || u->waiting || (u->idle_ns && now - u->idle_ns < s->linger_ns);
}

static struct rd_share_user *find(struct rd_share *s, uid_t uid)
{
	for (unsigned i = 0; i < s->top; i++)
		if (s->users[i].used && s->users[i].uid == uid)
			return &s->users[i];
	return NULL;
}

/* uid's entry; else a free or inactive one made uid's; NULL when every
 * entry is active. Under lock. */
static struct rd_share_user *user_of(struct rd_share *s, uid_t uid, uint64_t now)
{
	struct rd_share_user *u = find(s, uid);

	if (u)
		return u;
	for (unsigned i = 0; i < RD_SHARE_USERS; i++) {
		u = &s->users[i];
		if (i < s->top && u->used && active(s, u, now))
			continue;
		*u = (struct rd_share_user){ .used = true, .uid = uid };
		if (i >= s->top)
			s->top = i + 1;
		return u;
	}
	return NULL;
}

/* Whether a call of u may run now: u alone, or the calls running under
 * the capacity and u's under its part of it, shared with the uids that
 * run or wait (one that lingers keeps the capacity, not a part: what it
 * does not use goes to the others). */
static bool may_run(const struct rd_share *s, const struct rd_share_user *u, uint64_t now)
{
	unsigned others = 0, calling = 1;

	for (unsigned i = 0; i < s->top; i++) {
		const struct rd_share_user *o = &s->users[i];
		if (o == u || !o->used || !active(s, o, now))
			continue;
		others++;
		calling += o->running || o->waiting;
	}
	if (!others)
		return true;
	unsigned part = s->capacity / calling;
	return s->running < s->capacity && u->running < (part ? part : 1);
}

/* The waiting call that runs next: of those that may run, its uid running
 * fewest, then with its last turn longest ago, then the one that came
 * first. NULL: none may run. */
static const struct rd_share_waiter *next_of(const struct rd_share *s, uint64_t now)
{
	const struct rd_share_waiter *best = NULL;

	for (const struct rd_share_waiter *w = s->waiting; w; w = w->next) {
		const struct rd_share_user *u = w->user;
		if (!may_run(s, u, now))
			continue;
		if (!best || u->running < best->user->running ||
		    (u->running == best->user->running &&
		     (u->served < best->user->served || (u->served == best->user->served && w->ticket < best->ticket))))
			best = w;
	}
	return best;
}

static void take_turn(struct rd_share *s, struct rd_share_user *u)
{
	u->running++;
	s->running++;
	u->served = ++s->turns;
}

static void wait_a_while(struct rd_share *s)
{
	uint64_t t = rd_now_ns() + RECHECK_NS;
	struct timespec until = { (time_t)(t / 1000000000u), (long)(t % 1000000000u) };

	(void)pthread_cond_timedwait(&s->cond, &s->lock, &until);
}

void rd_share_enter(struct rd_share *s, uid_t uid)
{
	struct rd_share_user *u;

	pthread_mutex_lock(&s->lock);
	uint64_t now = rd_now_ns();
	while (!(u = user_of(s, uid, now))) {
		wait_a_while(s);
		now = rd_now_ns();
	}
	if (!s->waiting && may_run(s, u, now)) {
		take_turn(s, u);
		pthread_mutex_unlock(&s->lock);
		return;
	}
	struct rd_share_waiter me = { .user = u, .ticket = s->tickets++, .next = s->waiting };
	s->waiting = &me;
	u->waiting++;
	while (next_of(s, rd_now_ns()) != &me)
		wait_a_while(s);
	for (struct rd_share_waiter **p = &s->waiting; *p; p = &(*p)->next) {
		if (*p == &me) {
			*p = me.next;
			break;
		}
	}
	/* Running before it stops waiting: the uid never looks idle between. */
	take_turn(s, u);
	u->waiting--;
	/* Another may run too: it looks again. */
	if (s->waiting)
		pthread_cond_broadcast(&s->cond);
	pthread_mutex_unlock(&s->lock);
}

bool rd_share_try_enter(struct rd_share *s, uid_t uid)
{
	struct rd_share_user *u;
	bool ran = false;
	uint64_t now = rd_now_ns();

	pthread_mutex_lock(&s->lock);
	if ((u = user_of(s, uid, now)) && may_run(s, u, now) && !next_of(s, now)) {
		take_turn(s, u);
		ran = true;
	}
	pthread_mutex_unlock(&s->lock);
	return ran;
}

void rd_share_leave(struct rd_share *s, uid_t uid)
{
	pthread_mutex_lock(&s->lock);
	struct rd_share_user *u = find(s, uid);
	if (u && u->running) {
		u->running--;
		s->running--;
		if (!u->running && !u->waiting)
			u->idle_ns = rd_now_ns();
	}
	/* A call waits, or a uid waits for an entry: they look again. */
	pthread_cond_broadcast(&s->cond);
	pthread_mutex_unlock(&s->lock);
}
