/* SPDX-License-Identifier: Apache-2.0 */
/* daemon/supervisor/watch.c on real connections: every watcher hears every
 * announcement; a watcher whose connection breaks while an announcement is
 * being written (its close drops it from the list being walked) costs the
 * others nothing and the supervisor no freed memory. CI found the second
 * one: regend died after a release when the watcher that asked had gone. */
#include <check.h>
#include <string.h>
#include "conn_pair.h"
#include "daemon/supervisor/watch.h"
#include "unit.h"

static struct rd_sv_watch watch;
static struct rd_sv_device device;
static struct conn_pair pairs[3];

static void on_call(struct rd_conn *conn, struct rd_call *call)
{
	struct rp_error err = { 0 };

	ck_assert_str_eq(call->msg.method, "io.regen.Device.Watch");
	ck_assert_int_eq(rd_sv_watch_subscribe(&watch, call, &device, 1, &err), 0);
}

static void on_close(struct rd_conn *conn)
{
	rd_sv_watch_drop(&watch, conn);
}

static void subscribe(struct conn_pair *p)
{
	struct tl_reply r;

	conn_pair_open(p, on_call, on_close);
	ck_assert_int_eq(tl_send_text(&p->peer, "{\"method\":\"io.regen.Device.Watch\",\"more\":true}", NULL, 0), 0);
	ck_assert_int_eq(tl_recv(&p->peer, &r, 5), 0);
	ck_assert_msg(r.error == NULL && r.continues, "subscribe: %s", tl_reply_describe(&r));
	ck_assert_str_eq(tl_reply_str(&r, "reason"), "subscribed");
	tl_reply_finish(&r);
}

static void expect_event(struct conn_pair *p, uint64_t generation, const char *reason)
{
	struct tl_reply r;

	ck_assert_int_eq(tl_recv(&p->peer, &r, 5), 0);
	ck_assert_msg(r.error == NULL && r.continues, "event: %s", tl_reply_describe(&r));
	ck_assert_int_eq(tl_reply_int(&r, "generation"), (int64_t)generation);
	ck_assert_str_eq(tl_reply_str(&r, "reason"), reason);
	tl_reply_finish(&r);
}

static void announce(uint64_t generation, const char *reason)
{
	device.generation = generation;
	snprintf(device.reason, sizeof(device.reason), "%s", reason);
	rd_sv_watch_bump(&watch);
	rd_sv_watch_announce(&watch, &device);
}

static void setup(void)
{
	rd_sv_watch_init(&watch);
	memset(&device, 0, sizeof(device));
	device.index = 0;
	device.generation = 1;
	device.state = RP_STATE_READY;
	snprintf(device.reason, sizeof(device.reason), "started");
	for (int i = 0; i < 3; i++)
		subscribe(&pairs[i]);
}

static void teardown(void)
{
	for (int i = 0; i < 3; i++)
		conn_pair_close(&pairs[i]);
	ck_assert_ptr_null(watch.watchers);
}

START_TEST(every_watcher_hears_every_change)
{
	announce(2, "release: one");
	announce(3, "reset: two");
	for (int i = 0; i < 3; i++) {
		expect_event(&pairs[i], 2, "release: one");
		expect_event(&pairs[i], 3, "reset: two");
	}
}
END_TEST

/* The middle watcher's peer is gone: writing its event fails, its
 * connection closes, and its close drops it from the list. Replies are
 * written at the end of the loop's turn (daemon/conn.c), so the write that
 * fails comes once the walk is over; the close must come all the same. */
START_TEST(a_watcher_gone_during_an_announcement)
{
	tl_conn_close(&pairs[1].peer);
	announce(2, "release: the asker hung up");
	conn_pair_pump_until(&pairs[1], &pairs[1].closes, 1);
	expect_event(&pairs[0], 2, "release: the asker hung up");
	expect_event(&pairs[2], 2, "release: the asker hung up");
	announce(3, "reset: after");
	expect_event(&pairs[0], 3, "reset: after");
	expect_event(&pairs[2], 3, "reset: after");
	ck_assert_int_eq(pairs[1].closes, 1);
}
END_TEST

/* The first watcher in the list goes: what is left stays reachable. */
START_TEST(watchers_gone_one_by_one)
{
	for (int gone = 0; gone < 3; gone++) {
		tl_conn_close(&pairs[gone].peer);
		announce(2 + gone, "change");
		conn_pair_pump_until(&pairs[gone], &pairs[gone].closes, 1);
		for (int i = gone + 1; i < 3; i++)
			expect_event(&pairs[i], 2 + gone, "change");
	}
	ck_assert_ptr_null(watch.watchers);
}
END_TEST

int main(void)
{
	Suite *s = suite_create("watch");
	TCase *tc = tcase_create("watch");

	tcase_add_checked_fixture(tc, setup, teardown);
	tcase_add_test(tc, every_watcher_hears_every_change);
	tcase_add_test(tc, a_watcher_gone_during_an_announcement);
	tcase_add_test(tc, watchers_gone_one_by_one);
	suite_add_tcase(s, tc);
	return unit_run(s);
}
