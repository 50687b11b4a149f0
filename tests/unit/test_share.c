/* SPDX-License-Identifier: Apache-2.0 */
/* A device shared among uids (daemon/backend/share.c): a uid alone runs
 * calls up to its bound (the capacity, or a window that follows its calls'
 * time), as many as it asks where that is lifted; beside other uids at most the
 * capacity runs, each uid's at most its part of it, however many lanes it
 * has (its part taken among the uids that run or wait), and the uids take
 * turns; a uid holds its part for a linger after its last call ended;
 * try_enter answers as enter would, without waiting. Each
 * waiting call is a thread that enters and records itself; the test ends
 * calls one at a time and reads who came in. First-come order, a share
 * among lanes, or none, fails these. */
#include <check.h>
#include <pthread.h>
#include <stdint.h>
#include <string.h>
#include <time.h>
#include "daemon/backend/backend.h"
#include "daemon/backend/share.h"
#include "unit.h"

#define CALLS 16

static struct rd_share share;
/* A call that takes at least ns. */
#define LEAST(ns) ((struct rd_share_call){ .least_ns = (ns) })
/* What the tests of the share among uids leave with: nothing to follow. */
static const struct rd_share_ticket none;
static uid_t uid_of[CALLS];
static pthread_t threads[CALLS];
static pthread_mutex_t order_lock = PTHREAD_MUTEX_INITIALIZER;
static int order[CALLS * 2];
static unsigned norder;

/* What each call entered with: a call let in past the bounds leaves so. */
static struct rd_share_ticket tickets[CALLS];

static void *enter_and_record(void *arg)
{
	int i = (int)(intptr_t)arg;

	tickets[i] = rd_share_enter(&share, uid_of[i], LEAST(0));
	pthread_mutex_lock(&order_lock);
	order[norder++] = i;
	pthread_mutex_unlock(&order_lock);
	return NULL;
}

static unsigned waiting(void)
{
	unsigned n = 0;

	pthread_mutex_lock(&share.lock);
	for (unsigned i = 0; i < RD_SHARE_USERS; i++)
		n += share.users[i].used ? share.users[i].waiting : 0;
	pthread_mutex_unlock(&share.lock);
	return n;
}

static unsigned recorded(void)
{
	pthread_mutex_lock(&order_lock);
	unsigned n = norder;
	pthread_mutex_unlock(&order_lock);
	return n;
}

static void pause_ms(long ms)
{
	struct timespec ts = { ms / 1000, (ms % 1000) * 1000000L };
	nanosleep(&ts, NULL);
}

/* Call i (of uid) comes: returns once it waits, and checks it did not run. */
static void comes_and_waits(int i, uid_t uid)
{
	unsigned before = waiting(), ran = recorded();

	uid_of[i] = uid;
	ck_assert_int_eq(pthread_create(&threads[i], NULL, enter_and_record, (void *)(intptr_t)i), 0);
	for (int t = 0; t < 5000 && waiting() == before && recorded() == ran; t++)
		pause_ms(1);
	ck_assert_uint_eq(recorded(), ran);
	ck_assert_uint_eq(waiting(), before + 1);
}

/* Call i (of uid) comes and runs at once. */
static void comes_and_runs(int i, uid_t uid)
{
	unsigned ran = recorded();

	uid_of[i] = uid;
	ck_assert_int_eq(pthread_create(&threads[i], NULL, enter_and_record, (void *)(intptr_t)i), 0);
	pthread_join(threads[i], NULL);
	ck_assert_uint_eq(recorded(), ran + 1);
	ck_assert_int_eq(order[ran], i);
}

/* A call of uid ends; returns the call that came in then (-1: none),
 * after making sure no second one did. */
static int ends_and_see(uid_t uid)
{
	unsigned before = recorded();

	rd_share_leave(&share, uid, none);
	for (int t = 0; t < 300 && recorded() == before; t++)
		pause_ms(1);
	pause_ms(20);
	ck_assert_uint_le(recorded(), before + 1);
	return recorded() > before ? order[before] : -1;
}

/* alone_ns: what a uid alone keeps charged (the tests of the share among
 * uids lift it, as the one of a uid alone sets it). */
static void start_bounded(unsigned capacity, uint64_t linger_ns, uint64_t alone_ns)
{
	memset(uid_of, 0, sizeof(uid_of));
	norder = 0;
	rd_share_init(&share, capacity, linger_ns, alone_ns);
}

static void start(unsigned capacity, uint64_t linger_ns)
{
	start_bounded(capacity, linger_ns, UINT64_MAX);
}

static unsigned running(void)
{
	pthread_mutex_lock(&share.lock);
	unsigned n = share.running;
	pthread_mutex_unlock(&share.lock);
	return n;
}

static double now_s(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

/* Every call has ended: nothing runs. */
static void finish(void)
{
	ck_assert_uint_eq(running(), 0);
	rd_share_destroy(&share);
}

static void join(int i)
{
	pthread_join(threads[i], NULL);
}

START_TEST(a_uid_alone_unbounded_is_never_held_back)
{
	start(1, 0);
	for (int i = 0; i < 6; i++)
		comes_and_runs(i, 1);
	ck_assert_uint_eq(running(), 6);
	for (int i = 0; i < 6; i++)
		rd_share_leave(&share, 1, none);
	finish();
}
END_TEST

START_TEST(the_uids_take_turns_not_the_lanes)
{
	start(1, 0);
	/* uid 2 runs a call; uid 1 then waits with three, on three lanes,
	 * and uid 2 with one more, last. */
	comes_and_runs(0, 2);
	comes_and_waits(1, 1);
	comes_and_waits(2, 1);
	comes_and_waits(3, 1);
	comes_and_waits(4, 2);
	/* uid 1 had no turn yet: its first call. */
	ck_assert_int_eq(ends_and_see(2), 1);
	join(1);
	/* Then uid 2's, not uid 1's that came before it: first come (or a
	 * turn a lane) would run all three of uid 1's first. */
	ck_assert_int_eq(ends_and_see(1), 4);
	join(4);
	/* uid 2 has nothing more: uid 1 is alone, its two left run at once. */
	rd_share_leave(&share, 2, none);
	join(2);
	join(3);
	ck_assert_uint_eq(recorded(), 5);
	ck_assert(order[3] + order[4] == 5);
	rd_share_leave(&share, 1, none);
	rd_share_leave(&share, 1, none);
	finish();
}
END_TEST

START_TEST(beside_others_a_uid_runs_its_part_of_the_capacity)
{
	start(4, 0);
	/* Alone, uid 1 runs four (its lanes' calls). */
	for (int i = 0; i < 4; i++)
		comes_and_runs(i, 1);
	/* uid 2 comes: the capacity is taken, it waits for one call of uid
	 * 1's; uid 1's fifth waits for its part (two of four). */
	comes_and_waits(4, 2);
	comes_and_waits(5, 1);
	ck_assert_int_eq(ends_and_see(1), 4);
	ck_assert_int_eq(ends_and_see(1), -1);   /* uid 1 runs two: its part */
	ck_assert_int_eq(ends_and_see(1), 5);    /* one: under it */
	join(4);
	join(5);
	/* uid 3 comes: a part is one now (four among three), and it runs
	 * none: at once; uid 2's second waits for its part. */
	comes_and_runs(6, 3);
	comes_and_waits(7, 2);
	/* uid 3 done (no linger here): two uids again, uid 2 under its part. */
	ck_assert_int_eq(ends_and_see(3), 7);
	join(7);
	rd_share_leave(&share, 2, none);
	rd_share_leave(&share, 2, none);
	rd_share_leave(&share, 1, none);
	rd_share_leave(&share, 1, none);
	finish();
}
END_TEST

/* A call of uid ends within another uid's linger (or its own): no call
 * comes in. */
static void ends_and_none_comes(uid_t uid)
{
	unsigned before = recorded();

	rd_share_leave(&share, uid, none);
	pause_ms(20);
	ck_assert_uint_eq(recorded(), before);
}

START_TEST(a_uid_whose_call_ended_holds_its_part_for_its_linger)
{
	start(4, 100 * 1000000ull);
	/* uid 2 runs a call; uid 1 its part (two of four), and waits with a
	 * third. */
	comes_and_runs(0, 2);
	comes_and_runs(1, 1);
	comes_and_runs(2, 1);
	comes_and_waits(3, 1);
	/* uid 2's call ends: its client's next call would come within the
	 * linger, so its part holds: uid 1's third still waits... */
	ends_and_none_comes(2);
	/* ...and uid 2's next call finds its part free, none of uid 1's ahead
	 * of it but its part. */
	comes_and_runs(4, 2);
	double t0 = now_s();
	ends_and_none_comes(2);
	/* uid 2 calls no more: once its linger is over, uid 1 is alone and
	 * runs its third. */
	for (int t = 0; t < 1000 && recorded() < 5; t++)
		pause_ms(1);
	double waited = now_s() - t0;
	ck_assert_uint_eq(recorded(), 5);
	ck_assert_int_eq(order[4], 3);
	ck_assert_msg(waited >= 0.08, "uid 1's third call ran %.3f s after uid 2's ended, within its linger", waited);
	ck_assert_msg(waited < 0.5, "uid 1's third call waited %.3f s, long past uid 2's linger", waited);
	join(3);
	for (int i = 0; i < 3; i++)
		rd_share_leave(&share, 1, none);
	finish();
}
END_TEST

/* A call that waits on the device for a client's event holds its uid's
 * part; should that event wait for the uid's next call, which the share
 * holds back, the next call enters past the part once it has waited a
 * linger, one such call a linger, and the calls let in so take nothing of
 * the capacity the other uid waits for. A uid with no such call running
 * gets none. */
START_TEST(a_uid_whose_call_waits_for_a_client_gets_a_call_past_its_part_each_linger)
{
	start(2, 50 * 1000000ull);
	comes_and_runs(0, 2);
	/* uid 1's call that waits for a client's event: its part (one of two). */
	struct rd_share_ticket waits = rd_share_enter(&share, 1, (struct rd_share_call){ .waits = true });
	ck_assert_uint_eq(running(), 2);
	/* Its next waits a linger, then comes in past its part... */
	double t0 = now_s();
	comes_and_waits(1, 1);
	for (int t = 0; t < 1000 && recorded() < 2; t++)
		pause_ms(1);
	double waited = now_s() - t0;
	ck_assert_uint_eq(recorded(), 2);
	ck_assert_int_eq(order[1], 1);
	ck_assert(tickets[1].escaped);
	ck_assert_msg(waited >= 0.04, "uid 1's call came in past its part after %.3f s, within a linger", waited);
	ck_assert_msg(waited < 0.5, "uid 1's call waited %.3f s, long past a linger", waited);
	/* ...and the one after it a linger after that. */
	t0 = now_s();
	comes_and_waits(2, 1);
	for (int t = 0; t < 1000 && recorded() < 3; t++)
		pause_ms(1);
	waited = now_s() - t0;
	ck_assert_uint_eq(recorded(), 3);
	ck_assert_msg(waited >= 0.04, "uid 1's second call past its part came %.3f s after the first", waited);
	/* uid 2's call ends and its next comes: four of uid 1's and uid 2's
	 * run, over the capacity, but the two let in past uid 1's part are
	 * not counted: uid 2 has its part at once. */
	rd_share_leave(&share, 2, none);
	comes_and_runs(3, 2);
	ck_assert_uint_eq(running(), 4);
	/* The call that waited for the client ends: uid 1's next waits for its
	 * part, however long (two lingers here). */
	rd_share_leave(&share, 1, waits);
	comes_and_waits(4, 1);
	pause_ms(120);
	ck_assert_uint_eq(recorded(), 4);
	rd_share_leave(&share, 1, tickets[1]);
	rd_share_leave(&share, 1, tickets[2]);
	join(1);
	join(2);
	for (int t = 0; t < 1000 && recorded() < 5; t++)
		pause_ms(1);
	ck_assert_uint_eq(recorded(), 5);
	ck_assert(!tickets[4].escaped);
	join(4);
	rd_share_leave(&share, 2, none);
	rd_share_leave(&share, 1, tickets[4]);
	finish();
}
END_TEST

/* With no time bound (the host backend's), a uid alone runs at most the
 * capacity: a uid that comes then waits for one of its calls, not for
 * every lane's. */
START_TEST(a_uid_alone_runs_at_most_the_capacity_without_a_time_bound)
{
	start_bounded(2, 0, 0);
	comes_and_runs(0, 1);
	comes_and_runs(1, 1);
	comes_and_waits(2, 1);
	ck_assert_int_eq(ends_and_see(1), 2);
	join(2);
	rd_share_leave(&share, 1, none);
	rd_share_leave(&share, 1, none);
	finish();
}
END_TEST

static unsigned window_of(uid_t uid)
{
	unsigned w = 0;

	pthread_mutex_lock(&share.lock);
	for (unsigned i = 0; i < share.top; i++)
		if (share.users[i].used && share.users[i].uid == uid)
			w = share.users[i].window;
	pthread_mutex_unlock(&share.lock);
	return w;
}

/* A ticket as if its call had entered ago_ns before now. */
static struct rd_share_ticket entered_ago(struct rd_share_ticket t, uint64_t ago_ns)
{
	t.entered_ns = rd_now_ns() - ago_ns;
	return t;
}

/* With a time bound (the CUDA backend's), a uid alone runs a window of
 * calls that narrows while they take longer than the bound from entering
 * to their end, never under two, and widens while they take under half of
 * it and fill it, never past RD_SHARE_WINDOW_MAX; beside it, the least
 * times of its calls running fit in the bound. */
START_TEST(a_uid_alone_keeps_a_window_that_follows_its_calls_time)
{
	const uint64_t ms = 1000000u, bound = 100 * ms;
	struct rd_share_ticket t[RD_SHARE_WINDOW_MAX + 1], extra;

	start_bounded(8, 0, bound);
	/* The window starts at RD_SHARE_WINDOW_START (4). */
	ck_assert_uint_eq(RD_SHARE_WINDOW_START, 4);
	for (int i = 0; i < 4; i++)
		ck_assert(rd_share_try_enter(&share, 1, LEAST(0), &t[i]));
	ck_assert(!rd_share_try_enter(&share, 1, LEAST(0), &extra));
	/* Calls that took 150 ms from entering: a quarter narrower each, to
	 * two. */
	rd_share_leave(&share, 1, entered_ago(t[0], 150 * ms));
	ck_assert_uint_eq(window_of(1), 3);
	ck_assert(!rd_share_try_enter(&share, 1, LEAST(0), &extra));   /* three run: the window's */
	rd_share_leave(&share, 1, entered_ago(t[1], 150 * ms));
	ck_assert_uint_eq(window_of(1), 2);
	rd_share_leave(&share, 1, entered_ago(t[2], 150 * ms));
	ck_assert_uint_eq(window_of(1), 2);
	ck_assert(rd_share_try_enter(&share, 1, LEAST(0), &t[0]));     /* one ran: two whatever */
	ck_assert(!rd_share_try_enter(&share, 1, LEAST(0), &extra));
	/* Calls that took 60 ms (between half the bound and it): no change. */
	rd_share_leave(&share, 1, entered_ago(t[3], 60 * ms));
	ck_assert_uint_eq(window_of(1), 2);
	/* Quick calls from a full window: wider each time, to the most. */
	ck_assert(rd_share_try_enter(&share, 1, LEAST(0), &t[1]));
	unsigned running = 2, widened = 0;
	while (window_of(1) < RD_SHARE_WINDOW_MAX && widened++ < 100) {
		unsigned before = window_of(1);
		while (rd_share_try_enter(&share, 1, LEAST(0), &t[running]))
			running++;
		ck_assert_uint_eq(running, before);
		rd_share_leave(&share, 1, t[--running]);
		ck_assert_uint_gt(window_of(1), before);
	}
	ck_assert_uint_eq(window_of(1), RD_SHARE_WINDOW_MAX);
	while (rd_share_try_enter(&share, 1, LEAST(0), &t[running]))
		running++;
	ck_assert_uint_eq(running, RD_SHARE_WINDOW_MAX);
	/* Quick calls from a window not full: it stays. */
	rd_share_leave(&share, 1, t[--running]);
	rd_share_leave(&share, 1, t[--running]);
	ck_assert_uint_eq(window_of(1), RD_SHARE_WINDOW_MAX);
	while (running)
		rd_share_leave(&share, 1, t[--running]);
	/* The window is wide, but calls of 40 ms at least: two run whatever,
	 * a third would pass the bound; a call of no known least time fits. */
	ck_assert(rd_share_try_enter(&share, 1, LEAST(40 * ms), &t[0]));
	ck_assert(rd_share_try_enter(&share, 1, LEAST(40 * ms), &t[1]));
	ck_assert(!rd_share_try_enter(&share, 1, LEAST(40 * ms), &extra));
	ck_assert(rd_share_try_enter(&share, 1, LEAST(0), &t[2]));
	rd_share_leave(&share, 1, t[0]);
	ck_assert(rd_share_try_enter(&share, 1, LEAST(40 * ms), &t[0]));
	for (int i = 0; i < 3; i++)
		rd_share_leave(&share, 1, t[i]);
	/* Untimed calls (they may wait for the client's own work): run past
	 * the window and the least times, up to the widest window (an event
	 * on every call does not lift the bound), and their time is not
	 * followed. */
	struct rd_share_call untimed = { .least_ns = 90 * ms, .untimed = true };
	unsigned wide = window_of(1);
	for (int i = 0; i < RD_SHARE_WINDOW_MAX; i++)
		ck_assert(rd_share_try_enter(&share, 1, untimed, &t[i]));
	ck_assert(!rd_share_try_enter(&share, 1, untimed, &extra));
	for (int i = 0; i < RD_SHARE_WINDOW_MAX; i++)
		rd_share_leave(&share, 1, entered_ago(t[i], 10 * bound));
	ck_assert_uint_eq(window_of(1), wide);
	finish();
}
END_TEST

START_TEST(try_enter_answers_as_enter_would_without_waiting)
{
	struct rd_share_ticket ticket;

	start(2, 0);
	ck_assert(rd_share_try_enter(&share, 1, LEAST(0), &ticket));
	ck_assert(rd_share_try_enter(&share, 1, LEAST(0), &ticket));      /* alone: not held back */
	ck_assert(!rd_share_try_enter(&share, 2, LEAST(0), &ticket));     /* the capacity is taken */
	rd_share_leave(&share, 1, none);
	ck_assert(rd_share_try_enter(&share, 2, LEAST(0), &ticket));      /* under it, and under its part */
	ck_assert(!rd_share_try_enter(&share, 1, LEAST(0), &ticket));     /* uid 1 at its part */
	ck_assert(!rd_share_try_enter(&share, 3, LEAST(0), &ticket));     /* the capacity is taken */
	rd_share_leave(&share, 1, none);
	rd_share_leave(&share, 2, none);
	ck_assert(rd_share_try_enter(&share, 3, LEAST(0), &ticket));
	ck_assert(rd_share_try_enter(&share, 3, LEAST(0), &ticket));      /* alone again */
	rd_share_leave(&share, 3, none);
	rd_share_leave(&share, 3, none);
	finish();
}
END_TEST

static Suite *suite(void)
{
	Suite *s = suite_create("share");
	TCase *tc = tcase_create("share");

	tcase_set_timeout(tc, 60);
	tcase_add_test(tc, a_uid_alone_unbounded_is_never_held_back);
	tcase_add_test(tc, a_uid_alone_runs_at_most_the_capacity_without_a_time_bound);
	tcase_add_test(tc, a_uid_alone_keeps_a_window_that_follows_its_calls_time);
	tcase_add_test(tc, the_uids_take_turns_not_the_lanes);
	tcase_add_test(tc, beside_others_a_uid_runs_its_part_of_the_capacity);
	tcase_add_test(tc, a_uid_whose_call_ended_holds_its_part_for_its_linger);
	tcase_add_test(tc, a_uid_whose_call_waits_for_a_client_gets_a_call_past_its_part_each_linger);
	tcase_add_test(tc, try_enter_answers_as_enter_would_without_waiting);
	suite_add_tcase(s, tc);
	return s;
}

int main(void)
{
	return unit_run(suite());
}
