/* SPDX-License-Identifier: Apache-2.0 */
/* The host device's CPUs shared among uids (daemon/backend/host/share.c):
 * a slot that frees goes to the uid running the fewest calls, then to the
 * uid served longest ago, whatever the number of lanes each has waiting;
 * within a uid, its lanes in the order they came; a free slot is taken at
 * once, and never by try_enter past a lane that waits. Each waiting lane
 * is a thread that enters and records itself; the test gives the slots
 * back one at a time and reads who came in. */
#include <check.h>
#include <pthread.h>
#include <string.h>
#include <time.h>
#include "daemon/backend/host/share.h"
#include "unit.h"

#define SEATS 8

static struct host_share share;
static struct host_share_seat seats[SEATS];
static pthread_t threads[SEATS];
static pthread_mutex_t order_lock = PTHREAD_MUTEX_INITIALIZER;
static int order[SEATS * 4];
static unsigned norder;

static void *enter_and_record(void *arg)
{
	int i = (int)(intptr_t)arg;

	host_share_enter(&share, &seats[i]);
	pthread_mutex_lock(&order_lock);
	order[norder++] = i;
	pthread_mutex_unlock(&order_lock);
	return NULL;
}

static unsigned count(const struct host_share_seat *list)
{
	unsigned n = 0;

	for (; list; list = list->next)
		n++;
	return n;
}

static unsigned waiting(void)
{
	pthread_mutex_lock(&share.lock);
	unsigned n = count(share.waiting);
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

/* Seat i (of uid) starts waiting: returns once it is in the queue. */
static void queue(int i, uid_t uid)
{
	unsigned before = waiting();

	seats[i].uid = uid;
	ck_assert_int_eq(pthread_create(&threads[i], NULL, enter_and_record, (void *)(intptr_t)i), 0);
	for (int t = 0; t < 5000 && waiting() == before; t++)
		pause_ms(1);
	ck_assert_uint_eq(waiting(), before + 1);
}

/* Gives seat i's slot back; returns the seat that came in, after making
 * sure no second one did. */
static int leave_and_see(int i)
{
	unsigned before = recorded();

	host_share_leave(&share, &seats[i]);
	for (int t = 0; t < 5000 && recorded() == before; t++)
		pause_ms(1);
	ck_assert_uint_eq(recorded(), before + 1);
	pause_ms(20);
	ck_assert_uint_eq(recorded(), before + 1);
	return order[before];
}

static void start(unsigned slots)
{
	memset(seats, 0, sizeof(seats));
	norder = 0;
	host_share_init(&share, slots);
}

static void join(int i)
{
	pthread_join(threads[i], NULL);
}

START_TEST(one_slot_goes_round_the_uids_not_the_lanes)
{
	start(1);
	/* uid 1 holds the slot with seat 0 and has three more lanes waiting;
	 * uid 2's one lane comes last. */
	seats[0].uid = 1;
	ck_assert(host_share_try_enter(&share, &seats[0]));
	queue(1, 1);
	queue(2, 1);
	queue(3, 1);
	queue(4, 2);
	/* A slot-per-lane (or first come) order would serve seats 1 to 3
	 * first: uid 2's call would wait for three of uid 1's. */
	ck_assert_int_eq(leave_and_see(0), 4);
	join(4);
	ck_assert_int_eq(leave_and_see(4), 1);
	join(1);
	/* uid 2 waits again: its turn comes after the call of uid 1 now
	 * running, before uid 1's lanes that waited longer. */
	queue(5, 2);
	ck_assert_int_eq(leave_and_see(1), 5);
	join(5);
	ck_assert_int_eq(leave_and_see(5), 2);
	join(2);
	ck_assert_int_eq(leave_and_see(2), 3);
	join(3);
	host_share_leave(&share, &seats[3]);
	ck_assert_uint_eq(share.nrunning, 0);
	host_share_destroy(&share);
}
END_TEST

START_TEST(a_freed_slot_goes_to_the_uid_running_fewest)
{
	start(2);
	/* uid 1 holds both slots and has two lanes waiting; uid 2's lane,
	 * and uid 3's, come after them. */
	seats[0].uid = seats[1].uid = 1;
	ck_assert(host_share_try_enter(&share, &seats[0]));
	ck_assert(host_share_try_enter(&share, &seats[1]));
	queue(2, 1);
	queue(3, 1);
	queue(4, 2);
	queue(5, 3);
	/* One slot frees: uid 1 runs one call, uids 2 and 3 none; uid 2
	 * waited first. */
	ck_assert_int_eq(leave_and_see(0), 4);
	/* The next: uid 3 runs none. */
	ck_assert_int_eq(leave_and_see(1), 5);
	/* Now each of the three runs at most one: uid 1, none running, is
	 * next, its lanes in their order. */
	ck_assert_int_eq(leave_and_see(4), 2);
	ck_assert_int_eq(leave_and_see(5), 3);
	for (int i = 2; i <= 5; i++)
		join(i);
	host_share_leave(&share, &seats[2]);
	host_share_leave(&share, &seats[3]);
	ck_assert_uint_eq(share.nrunning, 0);
	host_share_destroy(&share);
}
END_TEST

START_TEST(free_slots_are_taken_at_once_and_try_enter_never_cuts_in)
{
	start(2);
	seats[0].uid = seats[1].uid = seats[2].uid = 1;
	/* Alone, a uid takes every slot, without waiting. */
	host_share_enter(&share, &seats[0]);
	host_share_enter(&share, &seats[1]);
	ck_assert_uint_eq(share.nrunning, 2);
	ck_assert(!host_share_try_enter(&share, &seats[2]));
	/* A lane waits: a slot that frees is its, not try_enter's. */
	queue(3, 2);
	pthread_mutex_lock(&share.lock);
	share.nrunning--;   /* as if a slot were free while the waiter has not woken yet */
	pthread_mutex_unlock(&share.lock);
	seats[6].uid = 3;
	ck_assert(!host_share_try_enter(&share, &seats[6]));
	pthread_mutex_lock(&share.lock);
	share.nrunning++;
	pthread_mutex_unlock(&share.lock);
	ck_assert_int_eq(leave_and_see(0), 3);
	join(3);
	host_share_leave(&share, &seats[3]);
	host_share_leave(&share, &seats[1]);
	ck_assert(host_share_try_enter(&share, &seats[6]));
	host_share_leave(&share, &seats[6]);
	ck_assert_uint_eq(share.nrunning, 0);
	host_share_destroy(&share);
}
END_TEST

static Suite *suite(void)
{
	Suite *s = suite_create("host_share");
	TCase *tc = tcase_create("share");

	tcase_set_timeout(tc, 60);
	tcase_add_test(tc, one_slot_goes_round_the_uids_not_the_lanes);
	tcase_add_test(tc, a_freed_slot_goes_to_the_uid_running_fewest);
	tcase_add_test(tc, free_slots_are_taken_at_once_and_try_enter_never_cuts_in);
	suite_add_tcase(s, tc);
	return s;
}

int main(void)
{
	return unit_run(suite());
}
