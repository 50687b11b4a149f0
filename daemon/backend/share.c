/* SPDX-License-Identifier: Apache-2.0 */
/* A device shared among uids (share.h): a table of the uids it follows,
 * the few that call at once, and the calls waiting, one a busy lane.
 * Whoever frees room (a call's end, the timekeeper's look) lets the calls
 * in that may run, each woken alone: a uid's 256 lanes waiting cost a
 * wake-up each as they go in, not a wake-up each at every call's end (on
 * two CPUs, 170 lanes of one uid polling the list every millisecond left
 * no CPU for the call they waited for). */
#include <string.h>
#include <time.h>
#include "daemon/backend/backend.h"
#include "daemon/backend/share.h"

/* The timekeeper looks again this often: a uid that lingered stops
 * holding the others back without any call ending. */
#define RECHECK_NS 1000000u
/* A uid alone runs this many calls at once whatever: one on the device and
 * the next launched behind it. */
#define ALONE_AT_LEAST 2u

struct rd_share_waiter {
	struct rd_share_user *user;
	uint64_t ticket;
	uint64_t since_ns;             /* when it began to wait */
	struct rd_share_call call;
	pthread_cond_t cond;
	bool let_in;
	struct rd_share_ticket got;
	struct rd_share_waiter *next;
};

static void cond_init_monotonic(pthread_cond_t *c)
{
	pthread_condattr_t attr;

	pthread_condattr_init(&attr);
	pthread_condattr_setclock(&attr, CLOCK_MONOTONIC);
	pthread_cond_init(c, &attr);
	pthread_condattr_destroy(&attr);
}

void rd_share_init(struct rd_share *s, unsigned capacity, uint64_t linger_ns, uint64_t alone_ns)
{
	memset(s, 0, sizeof(*s));
	pthread_mutex_init(&s->lock, NULL);
	cond_init_monotonic(&s->cond);
	s->capacity = capacity ? capacity : 1;
	s->linger_ns = linger_ns;
	s->alone_ns = alone_ns;
}

void rd_share_destroy(struct rd_share *s)
{
	pthread_mutex_destroy(&s->lock);
	pthread_cond_destroy(&s->cond);
}

static bool calling(const struct rd_share_user *u)
{
	return u->running || u->waiting;
}

/* Calls running or waiting, or its last one ended less than linger_ns ago. */
static bool active(const struct rd_share *s, const struct rd_share_user *u, uint64_t now)
{
	return calling(u) || (u->idle_ns && now - u->idle_ns < s->linger_ns);
}

/* Whether a uid alone runs a window of calls that follows their time
 * (alone_ns set and not lifted). */
static bool windowed(const struct rd_share *s)
{
	return s->alone_ns && s->alone_ns != UINT64_MAX;
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
		*u = (struct rd_share_user){ .used = true, .uid = uid, .window = RD_SHARE_WINDOW_START };
		if (i >= s->top)
			s->top = i + 1;
		return u;
	}
	return NULL;
}

/* The uids active, counted once for every call it asks about. */
struct tally {
	uint64_t now;
	unsigned active;
};

static struct tally tally_of(const struct rd_share *s, uint64_t now)
{
	struct tally t = { .now = now };

	for (unsigned i = 0; i < s->top; i++) {
		const struct rd_share_user *u = &s->users[i];
		t.active += u->used && active(s, u, now);
	}
	return t;
}

/* Whether a call of u alone may run now. */
static bool alone_may_run(const struct rd_share *s, const struct rd_share_user *u, struct rd_share_call call)
{
	if (!s->alone_ns)
		return u->running < s->capacity;
	if (!windowed(s) || u->running < ALONE_AT_LEAST)
		return true;
	/* Its time is not the queue's: no window to keep, but a bound still
	 * (a client's event on every call would otherwise lift it). */
	if (call.untimed)
		return u->running < RD_SHARE_WINDOW_MAX;
	return u->running < u->window && call.least_ns <= s->alone_ns && u->least_ns <= s->alone_ns - call.least_ns;
}

/* Whether a call of u may run now: u alone and under the bound of a uid
 * alone, or the calls running under the capacity and u's under its part
 * of it, shared with the uids active (one that lingers keeps its part for
 * the linger: given to the others, its client's next call would find the
 * whole capacity of theirs ahead, as a test of a uid with one call at a
 * time against eight lanes of another's saw on an H100: a fifth of the
 * GEMMs, not a third). */
static bool may_run(const struct rd_share *s, const struct tally *t, const struct rd_share_user *u,
		    struct rd_share_call call)
{
	bool u_active = active(s, u, t->now);
	unsigned others = t->active - u_active;

	if (!others)
		return alone_may_run(s, u, call);
	unsigned part = s->capacity / (others + 1);
	return s->running - s->escaped < s->capacity && u->running < (part ? part : 1);
}

/* The waiting call that runs next: of those that may run, its uid running
 * fewest, then with its last turn longest ago, then the one that came
 * first. NULL: none may run. */
static struct rd_share_waiter *next_of(const struct rd_share *s, const struct tally *t)
{
	struct rd_share_waiter *best = NULL;

	for (struct rd_share_waiter *w = s->waiting; w; w = w->next) {
		const struct rd_share_user *u = w->user;
		if (!may_run(s, t, u, w->call))
			continue;
		if (!best || u->running < best->user->running ||
		    (u->running == best->user->running &&
		     (u->served < best->user->served || (u->served == best->user->served && w->ticket < best->ticket))))
			best = w;
	}
	return best;
}

/* The waiting call that enters past the bounds now, if any: the first
 * to come of a uid with a call running that waits for a client's event,
 * that has waited a linger, its uid's last such entry a linger ago or
 * more. NULL: none. */
static struct rd_share_waiter *escape_of(const struct rd_share *s, uint64_t now)
{
	struct rd_share_waiter *first = NULL;

	for (struct rd_share_waiter *w = s->waiting; w; w = w->next) {
		const struct rd_share_user *u = w->user;
		if (u->client_waits && now - w->since_ns >= s->linger_ns &&
		    (!u->escaped_ns || now - u->escaped_ns >= s->linger_ns) && (!first || w->ticket < first->ticket))
			first = w;
	}
	return first;
}

static struct rd_share_ticket take_turn(struct rd_share *s, struct rd_share_user *u, struct rd_share_call call,
				       uint64_t now, bool escaped)
{
	u->least_ns += call.least_ns;
	u->running++;
	u->client_waits += call.waits;
	s->running++;
	s->escaped += escaped;
	if (escaped)
		u->escaped_ns = now;
	u->served = ++s->turns;
	return (struct rd_share_ticket){ .entered_ns = now, .call = call, .escaped = escaped };
}

/* Lets in every waiting call that may run now, in turn, each woken alone.
 * Under lock. */
static void let_in(struct rd_share *s)
{
	while (s->waiting) {
		uint64_t now = rd_now_ns();
		struct tally t = tally_of(s, now);
		struct rd_share_waiter *w = next_of(s, &t);
		bool escaped = false;
		if (!w) {
			w = escape_of(s, now);
			if (!w)
				return;
			escaped = true;
		}
		for (struct rd_share_waiter **p = &s->waiting; *p; p = &(*p)->next) {
			if (*p == w) {
				*p = w->next;
				break;
			}
		}
		/* Running before it stops waiting: the uid never looks idle between. */
		w->got = take_turn(s, w->user, w->call, now, escaped);
		w->user->waiting--;
		w->let_in = true;
		pthread_cond_signal(&w->cond);
	}
}

static void wait_until(pthread_cond_t *c, pthread_mutex_t *lock, uint64_t t)
{
	struct timespec until = { (time_t)(t / 1000000000u), (long)(t % 1000000000u) };

	(void)pthread_cond_timedwait(c, lock, &until);
}

struct rd_share_ticket rd_share_enter(struct rd_share *s, uid_t uid, struct rd_share_call call)
{
	struct rd_share_user *u;

	pthread_mutex_lock(&s->lock);
	uint64_t now = rd_now_ns();
	while (!(u = user_of(s, uid, now))) {
		s->for_entry++;
		wait_until(&s->cond, &s->lock, now + RECHECK_NS);
		s->for_entry--;
		now = rd_now_ns();
	}
	struct tally t = tally_of(s, now);
	if (!s->waiting && may_run(s, &t, u, call)) {
		struct rd_share_ticket got = take_turn(s, u, call, now, false);
		pthread_mutex_unlock(&s->lock);
		return got;
	}
	struct rd_share_waiter me = { .user = u, .ticket = s->tickets++, .since_ns = now, .call = call,
				      .next = s->waiting };
	cond_init_monotonic(&me.cond);
	s->waiting = &me;
	u->waiting++;
	let_in(s);
	while (!me.let_in) {
		if (!s->timekeeper)
			s->timekeeper = &me;
		if (s->timekeeper == &me) {
			wait_until(&me.cond, &s->lock, rd_now_ns() + RECHECK_NS);
			let_in(s);
		} else {
			pthread_cond_wait(&me.cond, &s->lock);
		}
	}
	/* The timekeeper's look goes to another waiting call. */
	if (s->timekeeper == &me) {
		s->timekeeper = NULL;
		if (s->waiting)
			pthread_cond_signal(&s->waiting->cond);
	}
	pthread_mutex_unlock(&s->lock);
	pthread_cond_destroy(&me.cond);
	return me.got;
}

bool rd_share_try_enter(struct rd_share *s, uid_t uid, struct rd_share_call call, struct rd_share_ticket *ticket)
{
	struct rd_share_user *u;
	bool ran = false;
	uint64_t now = rd_now_ns();

	pthread_mutex_lock(&s->lock);
	if ((u = user_of(s, uid, now))) {
		struct tally t = tally_of(s, now);
		if (may_run(s, &t, u, call) && !next_of(s, &t)) {
			*ticket = take_turn(s, u, call, now, false);
			ran = true;
		}
	}
	pthread_mutex_unlock(&s->lock);
	return ran;
}

/* u's window after a call that took took_ns from entering to its end:
 * narrower past alone_ns, wider well under it while the window was full
 * (it was what held u back). */
static void follow(const struct rd_share *s, struct rd_share_user *u, uint64_t took_ns)
{
	if (!windowed(s))
		return;
	unsigned quarter = u->window / 4 ? u->window / 4 : 1;
	if (took_ns > s->alone_ns)
		u->window = u->window - quarter > ALONE_AT_LEAST ? u->window - quarter : ALONE_AT_LEAST;
	else if (took_ns < s->alone_ns / 2 && u->running >= u->window)
		u->window = u->window + quarter < RD_SHARE_WINDOW_MAX ? u->window + quarter : RD_SHARE_WINDOW_MAX;
}

void rd_share_leave(struct rd_share *s, uid_t uid, struct rd_share_ticket ticket)
{
	pthread_mutex_lock(&s->lock);
	struct rd_share_user *u = find(s, uid);
	if (u && u->running) {
		uint64_t now = rd_now_ns();
		if (!ticket.call.untimed)
			follow(s, u, now > ticket.entered_ns ? now - ticket.entered_ns : 0);
		u->least_ns -= ticket.call.least_ns < u->least_ns ? ticket.call.least_ns : u->least_ns;
		u->client_waits -= ticket.call.waits && u->client_waits;
		u->running--;
		s->running--;
		s->escaped -= ticket.escaped && s->escaped;
		if (!u->running && !u->waiting)
			u->idle_ns = now;
	}
	let_in(s);
	/* A uid waits for an entry: it looks again. */
	if (s->for_entry)
		pthread_cond_broadcast(&s->cond);
	pthread_mutex_unlock(&s->lock);
}
