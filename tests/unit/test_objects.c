/* SPDX-License-Identifier: Apache-2.0 */
/* daemon/worker/objects.c: the worker's table of ids. An id names an
 * object for the process that made it (its pid, uid and start time: a
 * recycled pid is another process) and only in its generation; another
 * process's id reads exactly like one that never existed; a close waits for
 * the calls holding the object; a generation change closes everything; a
 * process's last connection going closes what it held. A fake backend
 * counts the closes. */
#include <check.h>
#include <errno.h>
#include <stdio.h>
#include <string.h>
#include "daemon/worker/objects.h"
#include "proto/errors.h"
#include "unit.h"

#define NBUF 8

static struct rd_buffer bufs[NBUF];
static struct rd_event evs[NBUF];
static int buf_closed[NBUF], ev_closed[NBUF];

static void fake_close_buffer(struct rd_buffer *b)
{
	buf_closed[b - bufs]++;
}

static void fake_close_event(struct rd_event *e)
{
	ev_closed[e - evs]++;
}

static const struct rd_backend_ops fake = {
	.name = "fake", .close_buffer = fake_close_buffer, .close_event = fake_close_event,
};
/* A backend without events, as the host backend is. */
static const struct rd_backend_ops fake_without_events = { .name = "fake", .close_buffer = fake_close_buffer };

static struct rd_device dev;
static struct rd_objects table;

static void setup(void)
{
	memset(bufs, 0, sizeof(bufs));
	memset(evs, 0, sizeof(evs));
	memset(buf_closed, 0, sizeof(buf_closed));
	memset(ev_closed, 0, sizeof(ev_closed));
	memset(&dev, 0, sizeof(dev));
	dev.index = 1;
	dev.backend = &fake;
	atomic_init(&dev.generation, 3);
	rd_objects_init(&table, &dev);
}

/* A process as the kernel names it (daemon/peer.h). */
static struct rd_client *client(pid_t pid, uid_t uid, uint64_t start_time)
{
	struct rd_peer peer = { .pid = pid, .uid = uid, .gid = uid, .start_time = start_time };

	return rd_objects_client_get(&table, &peer);
}

static int find(const struct rp_id *id, enum rd_object_kind kind, const struct rd_client *who, struct rd_object **out,
		struct rp_error *err)
{
	return rd_objects_find(&table, id, kind, who, "operand", out, err);
}

static const char *err_str(const struct rp_error *err, const char *key)
{
	return cJSON_GetStringValue(cJSON_GetObjectItem(err->params, key));
}

static long long err_int(const struct rp_error *err, const char *key)
{
	return (long long)cJSON_GetNumberValue(cJSON_GetObjectItem(err->params, key));
}

START_TEST(ids_carry_kind_device_generation_and_a_fresh_serial)
{
	struct rd_client *a = client(100, 1000, 1);

	rd_objects_add(&table, rd_buffer_object(&bufs[0]), RD_OBJECT_BUFFER, a);
	rd_objects_add(&table, rd_buffer_object(&bufs[1]), RD_OBJECT_BUFFER, a);
	rd_objects_add(&table, rd_event_object(&evs[0]), RD_OBJECT_EVENT, a);
	ck_assert_int_eq(bufs[0].obj.id.kind, RP_ID_BUFFER);
	ck_assert_int_eq(evs[0].obj.id.kind, RP_ID_EVENT);
	ck_assert_uint_eq(bufs[0].obj.id.device, 1);
	ck_assert_uint_eq(bufs[0].obj.id.generation, 3);
	ck_assert_ptr_eq(bufs[0].obj.owner, a);
	ck_assert_uint_lt(bufs[0].obj.id.serial, bufs[1].obj.id.serial);
	ck_assert_uint_lt(bufs[1].obj.id.serial, evs[0].obj.id.serial);
	ck_assert_uint_eq(table.count[RD_OBJECT_BUFFER], 2);
	ck_assert_uint_eq(table.count[RD_OBJECT_EVENT], 1);
	ck_assert_uint_eq(a->count[RD_OBJECT_BUFFER], 2);
	ck_assert_uint_eq(a->count[RD_OBJECT_EVENT], 1);
	rd_objects_close_all(&table);
	rd_objects_client_put(&table, a);
}
END_TEST

START_TEST(serials_start_at_a_random_point)
{
	/* An id a client kept from an earlier regend must not name a new
	 * object: two tables start far apart (2^-40 odds of a clash). */
	struct rd_objects other;

	rd_objects_init(&other, &dev);
	ck_assert_uint_ne(other.next_serial, table.next_serial);
	ck_assert_uint_ge(table.next_serial, 1);
}
END_TEST

START_TEST(an_id_names_an_object_only_for_its_owner)
{
	struct rd_client *a = client(100, 1000, 1), *b = client(200, 1000, 1);
	struct rp_error e1 = { 0 }, e2 = { 0 };
	struct rd_object *o = NULL;
	struct rp_id never = { .kind = RP_ID_BUFFER, .device = 1, .generation = 3 };
	char id_text[RP_ID_MAX], msg1[256], msg2[256];
	char *p;

	rd_objects_add(&table, rd_buffer_object(&bufs[0]), RD_OBJECT_BUFFER, a);
	ck_assert_int_eq(find(&bufs[0].obj.id, RD_OBJECT_BUFFER, a, &o, &e1), 0);
	ck_assert_ptr_eq(o, &bufs[0].obj);
	ck_assert_ptr_eq(rd_object_buffer(o), &bufs[0]);

	/* Process 200 names 100's buffer, and a serial nobody has. */
	o = NULL;
	ck_assert_int_eq(find(&bufs[0].obj.id, RD_OBJECT_BUFFER, b, &o, &e1), -ENOENT);
	ck_assert_ptr_null(o);
	ck_assert_str_eq(e1.name, RP_ERR_NO_SUCH_OBJECT);
	ck_assert_str_eq(err_str(&e1, "id"), rp_id_format(&bufs[0].obj.id, id_text));
	never.serial = bufs[0].obj.id.serial + 1000;
	ck_assert_int_eq(find(&never, RD_OBJECT_BUFFER, b, &o, &e2), -ENOENT);
	ck_assert_str_eq(e2.name, RP_ERR_NO_SUCH_OBJECT);
	/* The two messages differ only in the id: existence is not revealed. */
	snprintf(msg1, sizeof(msg1), "%s", err_str(&e1, "message"));
	snprintf(msg2, sizeof(msg2), "%s", err_str(&e2, "message"));
	p = strstr(msg1, id_text);
	ck_assert_ptr_nonnull(p);
	memmove(p + 2, p + strlen(id_text), strlen(p + strlen(id_text)) + 1);
	memcpy(p, "ID", 2);
	p = strstr(msg2, rp_id_format(&never, id_text));
	ck_assert_ptr_nonnull(p);
	memmove(p + 2, p + strlen(id_text), strlen(p + strlen(id_text)) + 1);
	memcpy(p, "ID", 2);
	ck_assert_str_eq(msg1, msg2);
	rp_error_clear(&e1);
	rp_error_clear(&e2);

	rd_objects_close_all(&table);
	rd_objects_client_put(&table, a);
	rd_objects_client_put(&table, b);
}
END_TEST

START_TEST(an_id_of_another_kind_or_device_names_nothing)
{
	struct rd_client *a = client(100, 1000, 1);
	struct rp_error err = { 0 };
	struct rd_object *o = NULL;
	struct rp_id id;

	rd_objects_add(&table, rd_buffer_object(&bufs[0]), RD_OBJECT_BUFFER, a);
	rd_objects_add(&table, rd_event_object(&evs[0]), RD_OBJECT_EVENT, a);
	/* A buffer's id where an event is wanted, and the other way round. */
	ck_assert_int_eq(find(&bufs[0].obj.id, RD_OBJECT_EVENT, a, &o, &err), -EINVAL);
	ck_assert_str_eq(err.name, RP_ERR_NO_SUCH_OBJECT);
	ck_assert_int_eq(find(&evs[0].obj.id, RD_OBJECT_BUFFER, a, &o, &err), -EINVAL);
	ck_assert_str_eq(err.name, RP_ERR_NO_SUCH_OBJECT);
	ck_assert_int_eq(find(&evs[0].obj.id, RD_OBJECT_EVENT, a, &o, &err), 0);
	ck_assert_ptr_eq(rd_object_event(o), &evs[0]);
	/* The same serial on another device. */
	id = bufs[0].obj.id;
	id.device = 0;
	ck_assert_int_eq(find(&id, RD_OBJECT_BUFFER, a, &o, &err), -ENOENT);
	ck_assert_str_eq(err.name, RP_ERR_NO_SUCH_OBJECT);
	ck_assert_ptr_nonnull(strstr(err_str(&err, "message"), "device"));
	rp_error_clear(&err);
	rd_objects_close_all(&table);
	rd_objects_client_put(&table, a);
}
END_TEST

START_TEST(an_id_of_another_generation_is_stale)
{
	struct rd_client *a = client(100, 1000, 1), *b = client(200, 1000, 1);
	struct rp_error err = { 0 };
	struct rd_object *o = NULL;
	struct rp_id old;

	rd_objects_add(&table, rd_buffer_object(&bufs[0]), RD_OBJECT_BUFFER, a);
	old = bufs[0].obj.id;
	atomic_store(&dev.generation, 4);
	/* Stale before anything else: also for another process, which learns
	 * only the generation every client may read. */
	ck_assert_int_eq(find(&old, RD_OBJECT_BUFFER, a, &o, &err), -ESTALE);
	ck_assert_str_eq(err.name, RP_ERR_STALE_GENERATION);
	ck_assert_int_eq(err_int(&err, "device"), 1);
	ck_assert_int_eq(err_int(&err, "generation"), 4);
	ck_assert_int_eq(find(&old, RD_OBJECT_BUFFER, b, &o, &err), -ESTALE);
	ck_assert_str_eq(err.name, RP_ERR_STALE_GENERATION);
	rp_error_clear(&err);
	/* What is made now is of the new generation. */
	rd_objects_add(&table, rd_buffer_object(&bufs[1]), RD_OBJECT_BUFFER, a);
	ck_assert_uint_eq(bufs[1].obj.id.generation, 4);
	ck_assert_int_eq(find(&bufs[1].obj.id, RD_OBJECT_BUFFER, a, &o, &err), 0);
	rd_objects_close_all(&table);
	rd_objects_client_put(&table, a);
	rd_objects_client_put(&table, b);
}
END_TEST

START_TEST(a_process_is_its_pid_uid_and_start_time)
{
	struct rd_client *a = client(100, 1000, 1);
	struct rd_client *recycled = client(100, 1000, 2), *other_uid = client(100, 1001, 1);
	struct rp_error err = { 0 };
	struct rd_object *o = NULL;

	/* The same pid started later, or under another uid, is another
	 * process: it gets its own client and cannot name a's ids. */
	ck_assert_ptr_ne(recycled, a);
	ck_assert_ptr_ne(other_uid, a);
	rd_objects_add(&table, rd_buffer_object(&bufs[0]), RD_OBJECT_BUFFER, a);
	ck_assert_int_eq(find(&bufs[0].obj.id, RD_OBJECT_BUFFER, recycled, &o, &err), -ENOENT);
	ck_assert_str_eq(err.name, RP_ERR_NO_SUCH_OBJECT);
	ck_assert_int_eq(find(&bufs[0].obj.id, RD_OBJECT_BUFFER, other_uid, &o, &err), -ENOENT);
	rp_error_clear(&err);
	ck_assert_int_eq(find(&bufs[0].obj.id, RD_OBJECT_BUFFER, a, &o, &err), 0);
	/* Connections are counted per uid, over its processes. */
	ck_assert_ptr_eq(client(100, 1000, 1), a);
	ck_assert_uint_eq(rd_objects_connections_of_uid(&table, 1000), 3);
	ck_assert_uint_eq(rd_objects_connections_of_uid(&table, 1001), 1);
	ck_assert_uint_eq(rd_objects_connections_of_uid(&table, 1002), 0);
	/* The recycled pid's going closes nothing of a's. */
	rd_objects_client_put(&table, recycled);
	ck_assert_int_eq(buf_closed[0], 0);
	rd_objects_client_put(&table, other_uid);
	rd_objects_client_put(&table, a);
	rd_objects_client_put(&table, a);
	ck_assert_int_eq(buf_closed[0], 1);
}
END_TEST

START_TEST(a_close_waits_for_the_calls_holding_the_object)
{
	struct rd_client *a = client(100, 1000, 1);
	struct rp_error err = { 0 };
	struct rd_object *o = NULL;

	rd_objects_add(&table, rd_buffer_object(&bufs[0]), RD_OBJECT_BUFFER, a);
	rd_objects_ref(&bufs[0].obj);          /* a call in flight */
	rd_objects_ref(&bufs[0].obj);          /* and another */
	rd_objects_close(&table, &bufs[0].obj);
	/* Gone from the table at once, closed in the backend only later. */
	ck_assert_int_eq(find(&bufs[0].obj.id, RD_OBJECT_BUFFER, a, &o, &err), -ENOENT);
	rp_error_clear(&err);
	ck_assert_uint_eq(table.count[RD_OBJECT_BUFFER], 0);
	ck_assert_uint_eq(a->count[RD_OBJECT_BUFFER], 0);
	ck_assert_int_eq(buf_closed[0], 0);
	rd_objects_unref(&table, &bufs[0].obj);
	ck_assert_int_eq(buf_closed[0], 0);
	rd_objects_unref(&table, &bufs[0].obj);
	ck_assert_int_eq(buf_closed[0], 1);

	/* Without a call in flight the close is immediate. */
	rd_objects_add(&table, rd_buffer_object(&bufs[1]), RD_OBJECT_BUFFER, a);
	rd_objects_close(&table, &bufs[1].obj);
	ck_assert_int_eq(buf_closed[1], 1);
	rd_objects_client_put(&table, a);
}
END_TEST

START_TEST(close_all_closes_every_object_of_every_owner)
{
	struct rd_client *a = client(100, 1000, 1), *b = client(200, 1000, 1);
	struct rp_error err = { 0 };
	struct rd_object *o = NULL;

	for (int i = 0; i < 3; i++) {
		rd_objects_add(&table, rd_buffer_object(&bufs[i]), RD_OBJECT_BUFFER, i == 2 ? b : a);
		rd_objects_add(&table, rd_event_object(&evs[i]), RD_OBJECT_EVENT, i == 2 ? b : a);
	}
	rd_objects_ref(&bufs[2].obj);
	rd_objects_close_all(&table);
	for (int i = 0; i < 3; i++) {
		ck_assert_int_eq(find(&bufs[i].obj.id, RD_OBJECT_BUFFER, i == 2 ? b : a, &o, &err), -ENOENT);
		ck_assert_int_eq(find(&evs[i].obj.id, RD_OBJECT_EVENT, i == 2 ? b : a, &o, &err), -ENOENT);
		ck_assert_int_eq(ev_closed[i], 1);
	}
	rp_error_clear(&err);
	ck_assert_int_eq(buf_closed[0] + buf_closed[1], 2);
	ck_assert_int_eq(buf_closed[2], 0);   /* its call still runs */
	ck_assert_uint_eq(table.count[RD_OBJECT_BUFFER] + table.count[RD_OBJECT_EVENT], 0);
	ck_assert_uint_eq(a->count[RD_OBJECT_BUFFER] + a->count[RD_OBJECT_EVENT], 0);
	ck_assert_uint_eq(b->count[RD_OBJECT_BUFFER] + b->count[RD_OBJECT_EVENT], 0);
	rd_objects_unref(&table, &bufs[2].obj);
	ck_assert_int_eq(buf_closed[2], 1);
	rd_objects_client_put(&table, a);
	rd_objects_client_put(&table, b);
}
END_TEST

START_TEST(the_last_connection_of_a_process_closes_its_objects)
{
	struct rd_client *a = client(100, 1000, 1), *b = client(200, 1000, 1);
	struct rp_error err = { 0 };
	struct rd_object *o = NULL;

	/* Process 100 has two connections. */
	ck_assert_ptr_eq(client(100, 1000, 1), a);
	ck_assert_uint_eq(a->connections, 2);
	rd_objects_add(&table, rd_buffer_object(&bufs[0]), RD_OBJECT_BUFFER, a);
	rd_objects_add(&table, rd_event_object(&evs[0]), RD_OBJECT_EVENT, a);
	rd_objects_add(&table, rd_buffer_object(&bufs[1]), RD_OBJECT_BUFFER, b);

	rd_objects_client_put(&table, a);
	ck_assert_int_eq(buf_closed[0] + ev_closed[0], 0);
	ck_assert_int_eq(find(&bufs[0].obj.id, RD_OBJECT_BUFFER, a, &o, &err), 0);

	rd_objects_client_put(&table, a);
	ck_assert_int_eq(buf_closed[0], 1);
	ck_assert_int_eq(ev_closed[0], 1);
	ck_assert_ptr_null(bufs[0].obj.owner);
	ck_assert_int_eq(find(&bufs[0].obj.id, RD_OBJECT_BUFFER, b, &o, &err), -ENOENT);
	rp_error_clear(&err);
	/* The other process keeps its buffer. */
	ck_assert_int_eq(buf_closed[1], 0);
	ck_assert_int_eq(find(&bufs[1].obj.id, RD_OBJECT_BUFFER, b, &o, &err), 0);
	ck_assert_ptr_eq(table.clients, b);
	ck_assert_ptr_null(b->next);
	/* Process 100 coming back starts afresh. */
	a = client(100, 1000, 1);
	ck_assert_uint_eq(a->connections, 1);
	ck_assert_uint_eq(a->count[RD_OBJECT_BUFFER], 0);
	rd_objects_client_put(&table, a);
	rd_objects_client_put(&table, b);
	ck_assert_int_eq(buf_closed[1], 1);
	ck_assert_ptr_null(table.clients);
}
END_TEST

START_TEST(a_backend_without_events_closes_its_buffers)
{
	struct rd_client *a;

	dev.backend = &fake_without_events;
	a = client(100, 1000, 1);
	rd_objects_add(&table, rd_buffer_object(&bufs[0]), RD_OBJECT_BUFFER, a);
	rd_objects_add(&table, rd_event_object(&evs[0]), RD_OBJECT_EVENT, a);
	rd_objects_client_put(&table, a);
	ck_assert_int_eq(buf_closed[0], 1);
	ck_assert_int_eq(ev_closed[0], 0);
	ck_assert_uint_eq(table.count[RD_OBJECT_EVENT], 0);
}
END_TEST

int main(void)
{
	Suite *s = suite_create("objects");
	TCase *tc = tcase_create("table");

	tcase_add_checked_fixture(tc, setup, NULL);
	tcase_add_test(tc, ids_carry_kind_device_generation_and_a_fresh_serial);
	tcase_add_test(tc, serials_start_at_a_random_point);
	tcase_add_test(tc, an_id_names_an_object_only_for_its_owner);
	tcase_add_test(tc, an_id_of_another_kind_or_device_names_nothing);
	tcase_add_test(tc, an_id_of_another_generation_is_stale);
	tcase_add_test(tc, a_process_is_its_pid_uid_and_start_time);
	tcase_add_test(tc, a_close_waits_for_the_calls_holding_the_object);
	tcase_add_test(tc, close_all_closes_every_object_of_every_owner);
	tcase_add_test(tc, the_last_connection_of_a_process_closes_its_objects);
	tcase_add_test(tc, a_backend_without_events_closes_its_buffers);
	suite_add_tcase(s, tc);
	return unit_run(s);
}
