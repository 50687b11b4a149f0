/* SPDX-License-Identifier: Apache-2.0 */
/* A device shared among uids (daemon/backend/share.c): a uid alone runs
 * calls up to its bound (the capacity, or a time each call is charged
 * against), as many as it asks where that is lifted; beside other uids at most the
 * capacity runs, each uid's at most its part of it, however many lanes it
 * has (its part taken among the uids that run or wait), and the uids take
 * turns; a uid holds the capacity for a linger after its last call ended;
 * try_enter answers as enter would, without waiting. Each
 * waiting call is a thread that enters and records itself; the test ends
 * calls one at a time and reads who came in. First-come order, a share
 * among lanes, or none, fails these. */
#include <check.h>
#include <pthread.h>
#include <stdint.h>
#include <string.h>
#include <time.h>
#include "daemon/backend/share.h"
#include "unit.h"

#define CALLS 16

static struct rd_share share;
static uid_t uid_of[CALLS];
static pthread_t threads[CALLS];
static pthread_mutex_t order_lock = PTHREAD_MUTEX_INITIALIZER;
static int order[CALLS * 2];
static unsigned norder;

static void *enter_and_record(void *arg)
{
	int i = (int)(intptr_t)arg;

	rd_share_enter(&share, uid_of[i], 0);
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

	rd_share_leave(&share, uid, 0);
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
		rd_share_leave(&share, 1, 0);
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
	rd_share_leave(&share, 2, 0);
	join(2);
	join(3);
	ck_assert_uint_eq(recorded(), 5);
	ck_assert(order[3] + order[4] == 5);
	rd_share_leave(&share, 1, 0);
	rd_share_leave(&share, 1, 0);
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
	rd_share_leave(&share, 2, 0);
	rd_share_leave(&share, 2, 0);
	rd_share_leave(&share, 1, 0);
	rd_share_leave(&share, 1, 0);
	finish();
}
END_TEST

START_TEST(a_uid_whose_call_ended_holds_the_capacity_for_its_linger)
{
	start(2, 100 * 1000000ull);
	/* uid 2 runs a call; uid 1 its part (one of two) and then waits with
	 * a second. */
	comes_and_runs(0, 2);
	comes_and_runs(1, 1);
	comes_and_waits(2, 1);
	/* uid 2's call ends: it has nothing to run, so its part is uid 1's at
	 * once... */
	double t0 = now_s();
	ck_assert_int_eq(ends_and_see(2), 2);
	join(2);
	/* ...but its client's next call would come within the linger, so
	 * the capacity holds until the linger is over: uid 1's third waits. */
	comes_and_waits(3, 1);
	for (int t = 0; t < 1000 && recorded() < 4; t++)
		pause_ms(1);
	double waited = now_s() - t0;
	ck_assert_uint_eq(recorded(), 4);
	ck_assert_int_eq(order[3], 3);
	ck_assert_msg(waited >= 0.08, "uid 1's third call ran %.3f s after uid 2's ended, within its linger", waited);
	ck_assert_msg(waited < 0.5, "uid 1's third call waited %.3f s, long past uid 2's linger", waited);
	join(3);
	for (int i = 0; i < 3; i++)
		rd_share_leave(&share, 1, 0);
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
	rd_share_leave(&share, 1, 0);
	rd_share_leave(&share, 1, 0);
	finish();
}
END_TEST

static uint64_t charged_now(uid_t uid)
{
	uint64_t c = UINT64_MAX;

	pthread_mutex_lock(&share.lock);
	for (unsigned i = 0; i < share.top; i++)
		if (share.users[i].used && share.users[i].uid == uid)
			c = share.users[i].charged_ns;
	pthread_mutex_unlock(&share.lock);
	return c;
}

/* With a time bound (the CUDA backend's), a uid alone keeps at most that
 * much charged: each call its uid's pace or its least time, whichever is
 * more, two calls whatever they are charged. Small calls go deep, large
 * ones shallow; a large call made after small ones is charged its least
 * time, not the small pace. */
START_TEST(a_uid_alone_keeps_at_most_its_time_bound_charged)
{
	const uint64_t ms = 1000000u, bound = 200 * ms;
	uint64_t c[64], big[2];

	start_bounded(4, 0, bound);
	/* Before any call ended, a call is charged a capacity's part of the
	 * bound: four run, the fifth is held back. */
	for (int i = 0; i < 4; i++) {
		ck_assert(rd_share_try_enter(&share, 1, 0, &c[i]));
		ck_assert_uint_eq(c[i], bound / 4);
	}
	ck_assert(!rd_share_try_enter(&share, 1, 0, &c[4]));
	ck_assert_uint_eq(charged_now(1), bound);
	/* They end at once: the pace is well under a millisecond. */
	for (int i = 0; i < 4; i++)
		rd_share_leave(&share, 1, c[i]);
	ck_assert_uint_eq(charged_now(1), 0);
	/* Small calls at that pace: 64 at once, each charged under 3 ms. */
	for (int i = 0; i < 64; i++) {
		ck_assert(rd_share_try_enter(&share, 1, 0, &c[i]));
		ck_assert_uint_lt(c[i], 3 * ms);
	}
	for (int i = 0; i < 64; i++)
		rd_share_leave(&share, 1, c[i]);
	/* Calls that take at least 150 ms each: the pace is small, but they
	 * are charged their least time; two run whatever, the third waits
	 * (its uid is alone: a time-free share would run it). */
	ck_assert(rd_share_try_enter(&share, 1, 150 * ms, &big[0]));
	ck_assert(rd_share_try_enter(&share, 1, 150 * ms, &big[1]));
	ck_assert_uint_eq(big[0], 150 * ms);
	uid_of[0] = 1;
	ck_assert_int_eq(pthread_create(&threads[0], NULL, enter_and_record, (void *)(intptr_t)0), 0);
	pause_ms(50);
	ck_assert_uint_eq(recorded(), 0);
	/* One ends: 150 ms charged, the waiting call fits beside it. */
	rd_share_leave(&share, 1, big[0]);
	join(0);
	ck_assert_uint_eq(recorded(), 1);
	/* A charge never passes the bound: a call of 10 s is charged 200 ms,
	 * and held back where two run. */
	uint64_t huge;
	ck_assert(!rd_share_try_enter(&share, 1, 10000 * ms, &huge));
	pthread_mutex_lock(&share.lock);
	uint64_t waiter_charge = share.users[0].charged_ns - big[1];
	pthread_mutex_unlock(&share.lock);
	rd_share_leave(&share, 1, big[1]);
	rd_share_leave(&share, 1, waiter_charge);
	ck_assert_uint_eq(charged_now(1), 0);
	ck_assert(rd_share_try_enter(&share, 1, 10000 * ms, &huge));
	ck_assert_uint_eq(huge, bound);
	rd_share_leave(&share, 1, huge);
	finish();
}
END_TEST

START_TEST(try_enter_answers_as_enter_would_without_waiting)
{
	uint64_t charged;

	start(2, 0);
	ck_assert(rd_share_try_enter(&share, 1, 0, &charged));
	ck_assert(rd_share_try_enter(&share, 1, 0, &charged));      /* alone: not held back */
	ck_assert(!rd_share_try_enter(&share, 2, 0, &charged));     /* the capacity is taken */
	rd_share_leave(&share, 1, 0);
	ck_assert(rd_share_try_enter(&share, 2, 0, &charged));      /* under it, and under its part */
	ck_assert(!rd_share_try_enter(&share, 1, 0, &charged));     /* uid 1 at its part */
	ck_assert(!rd_share_try_enter(&share, 3, 0, &charged));     /* the capacity is taken */
	rd_share_leave(&share, 1, 0);
	rd_share_leave(&share, 2, 0);
	ck_assert(rd_share_try_enter(&share, 3, 0, &charged));
	ck_assert(rd_share_try_enter(&share, 3, 0, &charged));      /* alone again */
	rd_share_leave(&share, 3, 0);
	rd_share_leave(&share, 3, 0);
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
	tcase_add_test(tc, a_uid_alone_keeps_at_most_its_time_bound_charged);
	tcase_add_test(tc, the_uids_take_turns_not_the_lanes);
	tcase_add_test(tc, beside_others_a_uid_runs_its_part_of_the_capacity);
	tcase_add_test(tc, a_uid_whose_call_ended_holds_the_capacity_for_its_linger);
	tcase_add_test(tc, try_enter_answers_as_enter_would_without_waiting);
	suite_add_tcase(s, tc);
	return s;
}

int main(void)
{
	return unit_run(suite());
}
