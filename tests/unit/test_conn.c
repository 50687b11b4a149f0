/* SPDX-License-Identifier: Apache-2.0 */
/* daemon/conn.c on a socketpair: one end is an rd_conn on a libuv loop, the
 * other a raw Varlink peer (tests/lib/varlink.h) that runs the loop while it
 * waits. Calls are answered in the order they arrived whatever order they
 * finish in; replies to a peer that went away are dropped, the calls still
 * finish safely; a peer that only shut its writing side gets every reply
 * before the close; the in-flight limit refuses by name; fds travel with their
 * message; the connection's own calls get their replies, or NULL on a
 * close; one turn of the loop hands a client connection at most 16
 * messages (daemon/conn.c's CONN_SLICE), the rest in the turns after, and
 * a control channel all it has. */
#include <check.h>
#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <unistd.h>
#include "conn_pair.h"
#include "unit.h"

#define HELD_MAX 32

static struct conn_pair pair;
static struct {
	bool hold;                        /* on_call keeps calls instead of answering them */
	struct rd_call *held[HELD_MAX];
	int nheld;
	int calls;
	char fd_text[64];                 /* what the fd of the last call held */
	size_t last_nfds;
} t;

/* Echoes the call's "n" back, with the method. */
static void answer(struct rd_call *call)
{
	cJSON *reply = cJSON_CreateObject();
	const cJSON *n = cJSON_GetObjectItem(call->msg.params, "n");

	cJSON_AddNumberToObject(reply, "n", cJSON_IsNumber(n) ? n->valuedouble : -1);
	cJSON_AddStringToObject(reply, "method", call->msg.method);
	rd_call_reply(call, reply, false);
}

static void on_call(struct rd_conn *conn, struct rd_call *call)
{
	t.calls++;
	t.last_nfds = call->raw.nfds;
	if (call->raw.nfds > 0) {
		ssize_t n = pread(call->raw.fds[0], t.fd_text, sizeof(t.fd_text) - 1, 0);

		t.fd_text[n > 0 ? n : 0] = '\0';
	}
	if (t.hold) {
		ck_assert_int_lt(t.nheld, HELD_MAX);
		t.held[t.nheld++] = call;
		return;
	}
	answer(call);
}

static void setup(void)
{
	memset(&t, 0, sizeof(t));
	conn_pair_open(&pair, on_call, NULL);
}

static void teardown(void)
{
	conn_pair_close(&pair);
}

/* The next reply must be a success carrying n. */
static void expect_n(int n)
{
	struct tl_reply r;

	ck_assert_int_eq(tl_recv(&pair.peer, &r, 5), 0);
	ck_assert_msg(r.error == NULL, "reply %d failed: %s", n, tl_reply_describe(&r));
	ck_assert_int_eq(tl_reply_int(&r, "n"), n);
	tl_reply_finish(&r);
}

START_TEST(a_call_is_answered)
{
	ck_assert_int_eq(tl_send(&pair.peer, "test.Echo", NULL, 0, "{\"n\":7}"), 0);
	expect_n(7);
	ck_assert_int_eq(t.calls, 1);
	ck_assert_uint_eq(pair.conn->in_flight, 0);
}
END_TEST

START_TEST(replies_go_out_in_call_order_whatever_order_calls_finish)
{
	const int order[] = { 3, 0, 4, 2, 1 };

	t.hold = true;
	for (int i = 0; i < 5; i++) {
		ck_assert_int_eq(tl_send(&pair.peer, "test.Echo", NULL, 0, "{\"n\":%d}", i), 0);
	}
	conn_pair_pump_until(&pair, &t.nheld, 5);
	ck_assert_uint_eq(pair.conn->in_flight, 5);
	for (int i = 0; i < 5; i++) {
		answer(t.held[order[i]]);
		conn_pair_pump(&pair);
	}
	/* Call 0 finished second: nothing may have gone out before it. */
	for (int i = 0; i < 5; i++) {
		expect_n(i);
	}
	ck_assert_uint_eq(pair.conn->in_flight, 0);
}
END_TEST

START_TEST(a_later_reply_waits_for_an_earlier_call)
{
	struct tl_reply r;

	t.hold = true;
	ck_assert_int_eq(tl_send(&pair.peer, "test.Echo", NULL, 0, "{\"n\":0}"), 0);
	ck_assert_int_eq(tl_send(&pair.peer, "test.Echo", NULL, 0, "{\"n\":1}"), 0);
	conn_pair_pump_until(&pair, &t.nheld, 2);
	answer(t.held[1]);
	/* Call 1 is answered, call 0 is not: the peer sees nothing yet. */
	ck_assert_int_eq(tl_recv(&pair.peer, &r, 0.2), -ETIMEDOUT);
	answer(t.held[0]);
	expect_n(0);
	expect_n(1);
}
END_TEST

START_TEST(replies_after_the_peer_closed_are_dropped_and_the_calls_still_finish)
{
	t.hold = true;
	for (int i = 0; i < 3; i++) {
		ck_assert_int_eq(tl_send(&pair.peer, "test.Echo", NULL, 0, "{\"n\":%d}", i), 0);
	}
	conn_pair_pump_until(&pair, &t.nheld, 3);
	tl_conn_close(&pair.peer);
	conn_pair_pump_until(&pair, &pair.closes, 1);
	/* Closed, and still allocated for the three calls in flight. */
	ck_assert(pair.conn->closed);
	ck_assert_uint_eq(pair.conn->in_flight, 3);
	answer(t.held[2]);
	rd_call_failf(t.held[0], "io.regen.Draining", "going away");
	/* Call 0 is gone; call 2, finished, waits behind call 1. */
	ck_assert_uint_eq(pair.conn->in_flight, 2);
	/* The last call frees the connection: nothing of it may be touched
	 * after this, and nothing may crash. */
	answer(t.held[1]);
	conn_pair_pump(&pair);
	ck_assert_int_eq(pair.closes, 1);
}
END_TEST

START_TEST(a_peer_that_shut_its_writing_side_gets_every_reply_then_the_close)
{
	const int order[] = { 2, 0, 1 };
	struct tl_reply r;

	t.hold = true;
	for (int i = 0; i < 3; i++) {
		ck_assert_int_eq(tl_send(&pair.peer, "test.Echo", NULL, 0, "{\"n\":%d}", i), 0);
	}
	ck_assert_int_eq(shutdown(pair.peer.fd, SHUT_WR), 0);
	conn_pair_pump_until(&pair, &t.nheld, 3);
	for (int i = 0; i < 50; i++) {
		conn_pair_pump(&pair);
	}
	/* The end of the stream is not the end of the connection. */
	ck_assert_int_eq(pair.closes, 0);
	for (int i = 0; i < 3; i++) {
		answer(t.held[order[i]]);
		conn_pair_pump(&pair);
	}
	for (int i = 0; i < 3; i++) {
		expect_n(i);
	}
	/* Nothing is owed any more: the daemon closes its side. */
	conn_pair_pump_until(&pair, &pair.closes, 1);
	ck_assert_int_eq(tl_recv(&pair.peer, &r, 5), -ECONNRESET);
}
END_TEST

/* Holds call 0 only: the rest are answered at once and held behind it. */
static void hold_the_first(struct rd_conn *conn, struct rd_call *call)
{
	t.hold = t.calls == 0;
	on_call(conn, call);
}

START_TEST(a_half_close_while_regend_does_not_read_still_gets_every_reply)
{
	/* More than the answered calls held behind an unanswered one, past
	 * which regend stops reading (daemon/conn.c's HELD_MAX, 256). */
	const int n = 400;

	pair.ops.on_call = hold_the_first;
	for (int i = 0; i < n; i++) {
		ck_assert_int_eq(tl_send(&pair.peer, "test.Echo", NULL, 0, "{\"n\":%d}", i), 0);
	}
	ck_assert_int_eq(shutdown(pair.peer.fd, SHUT_WR), 0);
	conn_pair_pump_until(&pair, &t.nheld, 1);
	for (int i = 0; i < 100; i++) {
		conn_pair_pump(&pair);
	}
	ck_assert(!pair.conn->reading);
	ck_assert_int_lt(t.calls, n);
	ck_assert_int_eq(pair.closes, 0);
	answer(t.held[0]);
	for (int i = 0; i < n; i++) {
		expect_n(i);
	}
	conn_pair_pump_until(&pair, &pair.closes, 1);
	ck_assert_int_eq(t.calls, n);
}
END_TEST

START_TEST(the_in_flight_limit_refuses_by_name_and_in_order)
{
	struct tl_reply r;

	t.hold = true;
	pair.conn->max_in_flight = 2;
	for (int i = 0; i < 3; i++) {
		ck_assert_int_eq(tl_send(&pair.peer, "test.Echo", NULL, 0, "{\"n\":%d}", i), 0);
	}
	conn_pair_pump_until(&pair, &t.nheld, 2);
	for (int i = 0; i < 50; i++) {
		conn_pair_pump(&pair);
	}
	/* The third never reached the handler... */
	ck_assert_int_eq(t.calls, 2);
	answer(t.held[0]);
	answer(t.held[1]);
	expect_n(0);
	expect_n(1);
	/* ...and its refusal came after the replies to the calls before it. */
	ck_assert_int_eq(tl_recv(&pair.peer, &r, 5), 0);
	ck_assert_str_eq(r.error, "io.regen.LimitExceeded");
	ck_assert_str_eq(tl_reply_str(&r, "resource"), "calls in flight");
	ck_assert_int_eq(tl_reply_int(&r, "limit"), 2);
	tl_reply_finish(&r);
	/* Below the limit again: served. */
	ck_assert_int_eq(tl_send(&pair.peer, "test.Echo", NULL, 0, "{\"n\":9}"), 0);
	conn_pair_pump_until(&pair, &t.nheld, 3);
	answer(t.held[2]);
	expect_n(9);
}
END_TEST

static int memfd_with(const char *text)
{
	int fd = memfd_create("test-conn", MFD_CLOEXEC);

	ck_assert_int_ge(fd, 0);
	ck_assert_int_eq(pwrite(fd, text, strlen(text), 0), (ssize_t)strlen(text));
	return fd;
}

START_TEST(an_fd_travels_with_its_message)
{
	int fd = memfd_with("hello through SCM_RIGHTS");

	ck_assert_int_eq(tl_send(&pair.peer, "test.Echo", NULL, 0, "{\"n\":1}"), 0);
	expect_n(1);
	ck_assert_uint_eq(t.last_nfds, 0);
	ck_assert_int_eq(tl_send(&pair.peer, "test.Echo", &fd, 1, "{\"n\":2}"), 0);
	expect_n(2);
	ck_assert_uint_eq(t.last_nfds, 1);
	ck_assert_str_eq(t.fd_text, "hello through SCM_RIGHTS");
	close(fd);
}
END_TEST

START_TEST(a_message_whose_fds_were_dropped_is_refused_whole)
{
	int fds[RP_FDS_MAX + 1];
	const char *text = "{\"method\":\"test.Echo\",\"parameters\":{\"n\":3}}";
	struct tl_reply r;

	for (int i = 0; i <= RP_FDS_MAX; i++) {
		fds[i] = memfd_with("x");
	}
	ck_assert_int_eq(tl_send_bytes(&pair.peer, text, strlen(text) + 1, fds, RP_FDS_MAX + 1), 0);
	ck_assert_int_eq(tl_recv(&pair.peer, &r, 5), 0);
	ck_assert_str_eq(r.error, "io.regen.LimitExceeded");
	ck_assert_str_eq(tl_reply_str(&r, "resource"), "fds");
	ck_assert_int_eq(tl_reply_int(&r, "limit"), RP_FDS_MAX);
	tl_reply_finish(&r);
	ck_assert_int_eq(t.calls, 0);
	/* The connection goes on. */
	ck_assert_int_eq(tl_send(&pair.peer, "test.Echo", NULL, 0, "{\"n\":4}"), 0);
	expect_n(4);
	for (int i = 0; i <= RP_FDS_MAX; i++) {
		close(fds[i]);
	}
}
END_TEST

START_TEST(a_oneway_call_gets_no_reply)
{
	ck_assert_int_eq(tl_send_text(&pair.peer, "{\"method\":\"test.Echo\",\"oneway\":true,\"parameters\":{\"n\":1}}",
				      NULL, 0), 0);
	ck_assert_int_eq(tl_send(&pair.peer, "test.Echo", NULL, 0, "{\"n\":2}"), 0);
	/* The next thing on the wire answers the second call. */
	expect_n(2);
	ck_assert_int_eq(t.calls, 2);
}
END_TEST

START_TEST(a_bad_message_is_answered_and_the_connection_goes_on)
{
	struct tl_reply r;

	ck_assert_int_eq(tl_send_text(&pair.peer, "{\"method\":", NULL, 0), 0);
	ck_assert_int_eq(tl_recv(&pair.peer, &r, 5), 0);
	ck_assert_str_eq(r.error, "io.regen.InvalidMessage");
	tl_reply_finish(&r);
	ck_assert_int_eq(t.calls, 0);
	ck_assert_int_eq(tl_send(&pair.peer, "test.Echo", NULL, 0, "{\"n\":5}"), 0);
	expect_n(5);
}
END_TEST

/* The connection calling out (the supervisor on a worker's channel). */
static int got_replies, got_null;
static char got_text[64];

static void on_reply(struct rd_conn *conn, const struct rp_call *reply, void *userdata)
{
	if (reply == NULL) {
		got_null++;
		return;
	}
	got_replies++;
	snprintf(got_text, sizeof(got_text), "%s", cJSON_GetStringValue(cJSON_GetObjectItem(reply->params, "x")));
}

START_TEST(an_outgoing_call_gets_its_reply_or_null_on_close)
{
	char *text;

	got_replies = got_null = 0;
	ck_assert_int_eq(rd_conn_call(pair.conn, "test.Out", cJSON_CreateObject(), false, on_reply, NULL), 0);
	text = tl_recv_text(&pair.peer, 5);
	ck_assert_ptr_nonnull(text);
	ck_assert_ptr_nonnull(strstr(text, "\"test.Out\""));
	free(text);
	ck_assert_int_eq(tl_send_text(&pair.peer, "{\"parameters\":{\"x\":\"back\"}}", NULL, 0), 0);
	conn_pair_pump_until(&pair, &got_replies, 1);
	ck_assert_str_eq(got_text, "back");

	ck_assert_int_eq(rd_conn_call(pair.conn, "test.Out", NULL, false, on_reply, NULL), 0);
	rd_conn_close(pair.conn);
	ck_assert_int_eq(got_null, 1);
	ck_assert_int_eq(pair.closes, 1);
	ck_assert_int_eq(rd_conn_call(pair.conn, "test.Out", NULL, false, on_reply, NULL), -ENOTCONN);
}
END_TEST

/* What a connection sent at once: 100 calls in one write. */
static void send_burst(int n)
{
	char text[128], burst[100 * 64];
	size_t len = 0;

	for (int i = 0; i < n; i++) {
		int k = snprintf(text, sizeof(text), "{\"method\":\"test.Echo\",\"parameters\":{\"n\":%d}}", i);
		memcpy(burst + len, text, (size_t)k + 1);
		len += (size_t)k + 1;
	}
	ck_assert_int_eq(tl_send_bytes(&pair.peer, burst, len, NULL, 0), 0);
}

START_TEST(a_turn_hands_a_client_connection_sixteen_messages)
{
	send_burst(100);
	/* The first turn that sees the socket readable. */
	for (int i = 0; i < 100 && t.calls == 0; i++) {
		conn_pair_pump(&pair);
		if (t.calls == 0)
			usleep(1000);
	}
	ck_assert_int_eq(t.calls, 16);
	conn_pair_pump(&pair);
	ck_assert_int_eq(t.calls, 32);
	conn_pair_pump_until(&pair, &t.calls, 100);
	for (int i = 0; i < 100; i++)
		expect_n(i);
}
END_TEST

/* Not one turn later: a wake-up more per call is latency on every call. */
START_TEST(a_call_is_handed_over_in_the_turn_that_reads_it)
{
	send_burst(1);
	conn_pair_pump(&pair);
	ck_assert_int_eq(t.calls, 1);
	expect_n(0);
}
END_TEST

START_TEST(a_control_channel_is_handed_everything_it_sent)
{
	rd_conn_make_control(pair.conn);
	send_burst(100);
	for (int i = 0; i < 100 && t.calls == 0; i++) {
		conn_pair_pump(&pair);
		if (t.calls == 0)
			usleep(1000);
	}
	ck_assert_int_eq(t.calls, 100);
	for (int i = 0; i < 100; i++)
		expect_n(i);
}
END_TEST

int main(void)
{
	Suite *s = suite_create("conn");
	TCase *tc = tcase_create("socketpair");

	tcase_add_checked_fixture(tc, setup, teardown);
	tcase_add_test(tc, a_call_is_answered);
	tcase_add_test(tc, replies_go_out_in_call_order_whatever_order_calls_finish);
	tcase_add_test(tc, a_later_reply_waits_for_an_earlier_call);
	tcase_add_test(tc, replies_after_the_peer_closed_are_dropped_and_the_calls_still_finish);
	tcase_add_test(tc, a_peer_that_shut_its_writing_side_gets_every_reply_then_the_close);
	tcase_add_test(tc, a_half_close_while_regend_does_not_read_still_gets_every_reply);
	tcase_add_test(tc, the_in_flight_limit_refuses_by_name_and_in_order);
	tcase_add_test(tc, an_fd_travels_with_its_message);
	tcase_add_test(tc, a_message_whose_fds_were_dropped_is_refused_whole);
	tcase_add_test(tc, a_oneway_call_gets_no_reply);
	tcase_add_test(tc, a_bad_message_is_answered_and_the_connection_goes_on);
	tcase_add_test(tc, an_outgoing_call_gets_its_reply_or_null_on_close);
	tcase_add_test(tc, a_turn_hands_a_client_connection_sixteen_messages);
	tcase_add_test(tc, a_call_is_handed_over_in_the_turn_that_reads_it);
	tcase_add_test(tc, a_control_channel_is_handed_everything_it_sent);
	suite_add_tcase(s, tc);
	return unit_run(s);
}
