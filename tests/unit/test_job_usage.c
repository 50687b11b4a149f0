/* SPDX-License-Identifier: Apache-2.0 */
/* A client's job: the rule a stated job must follow (proto/job.c), which
 * job names a connection when its cgroup and its words differ
 * (daemon/job.c), what each job uses of a worker and how long it is
 * listed (daemon/worker/usage.c, with the objects table), and
 * io.regen.Device.Job on the wire (proto/device.c). */
#include <check.h>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "daemon/job.h"
#include "daemon/worker/objects.h"
#include "daemon/worker/usage.h"
#include "proto/device.h"
#include "proto/errors.h"
#include "unit.h"

static const char *reason_of(const struct rp_error *err)
{
	return cJSON_GetStringValue(cJSON_GetObjectItem(err->params, "reason"));
}

START_TEST(the_rule_takes_what_a_scheduler_or_a_person_would_name)
{
	static const char *const good[] = {
		"4242", "slurm:4242", "train-7", "llama/70b@run.3", "a", "A_b+c=d",
		"pod:0f1e2d3c-4b5a-6978-8a9b-0c1d2e3f4a5b",
		"x123456789012345678901234567890123456789012345678901234567890123",   /* 64 bytes */
	};

	for (size_t i = 0; i < sizeof(good) / sizeof(good[0]); i++)
		ck_assert_msg(rp_job_check(good[i], NULL) == 0, "refused '%s'", good[i]);
}
END_TEST

START_TEST(the_rule_refuses_with_a_named_error_that_says_why)
{
	static const struct {
		const char *job, *reason;
	} bad[] = {
		{ "", "empty" },
		{ "x1234567890123456789012345678901234567890123456789012345678901234", "too long" },   /* 65 */
		{ "a\"b", "character" }, { "a\\b", "character" }, { "a\nb", "character" }, { "a b", "character" },
		{ "-x", "character" }, { ".x", "character" }, { "(none)", "character" }, { "caf\xc3\xa9", "character" },
		{ "a\tb", "character" }, { "a}b", "character" }, { "a,b", "character" }, { "a\x7f", "character" },
	};

	for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
		struct rp_error err = { 0 };
		const char *message;

		ck_assert_int_eq(rp_job_check(bad[i].job, &err), -EINVAL);
		ck_assert_str_eq(err.name, RP_ERR_INVALID_JOB);
		ck_assert_msg(strcmp(reason_of(&err), bad[i].reason) == 0, "case %zu: reason '%s', want '%s'", i,
			      reason_of(&err), bad[i].reason);
		/* The message says what the rule is, and never repeats the job. */
		message = cJSON_GetStringValue(cJSON_GetObjectItem(err.params, "message"));
		ck_assert_ptr_nonnull(strstr(message, "1 to 64"));
		if (strlen(bad[i].job) > 2)
			ck_assert_ptr_null(strstr(message, bad[i].job));
		rp_error_clear(&err);
	}
	ck_assert_int_eq(rp_job_check(NULL, NULL), -EINVAL);
}
END_TEST

START_TEST(the_cgroup_names_the_connection_and_both_are_described)
{
	struct rd_conn conn;
	const char *job;
	char text[2 * RP_JOB_MAX + 16];

	memset(&conn, 0, sizeof(conn));
	ck_assert_int_eq(rd_job_of(&conn, &job), RP_JOB_NONE);
	ck_assert_str_eq(job, "");
	ck_assert_str_eq(rd_job_describe(&conn, text, sizeof(text)), "");

	snprintf(conn.job, sizeof(conn.job), "train-7");
	ck_assert_int_eq(rd_job_of(&conn, &job), RP_JOB_CLIENT);
	ck_assert_str_eq(job, "train-7");
	ck_assert_str_eq(rd_job_describe(&conn, text, sizeof(text)), "stated: train-7");

	/* A client in a job's cgroup cannot put its work under another name. */
	snprintf(conn.peer.job, sizeof(conn.peer.job), "slurm:4242");
	ck_assert_int_eq(rd_job_of(&conn, &job), RP_JOB_CGROUP);
	ck_assert_str_eq(job, "slurm:4242");
	ck_assert_str_eq(rd_job_describe(&conn, text, sizeof(text)), "slurm:4242, stated: train-7");

	/* The same words twice say nothing new. */
	snprintf(conn.job, sizeof(conn.job), "slurm:4242");
	ck_assert_str_eq(rd_job_describe(&conn, text, sizeof(text)), "slurm:4242");
	conn.job[0] = '\0';
	ck_assert_str_eq(rd_job_describe(&conn, text, sizeof(text)), "slurm:4242");
}
END_TEST

/* ---- What each job uses ---- */

static struct rd_buffer bufs[4];
static struct rd_event evs[2];

static void close_nothing(struct rd_buffer *b)
{
}

static const struct rd_backend_ops fake = { .name = "fake", .close_buffer = close_nothing };

static struct rd_usage *entry(struct rd_usage_table *t, enum rp_job_source source, const char *job)
{
	for (struct rd_usage *u = t->list; u; u = u->next)
		if (u->source == source && strcmp(u->job, job) == 0)
			return u;
	return NULL;
}

START_TEST(a_job_is_listed_while_a_session_or_an_import_counts_in_it)
{
	struct rd_usage_table t = { 0 };
	struct rd_device dev = { .index = 0, .backend = &fake };
	struct rd_objects objects;
	struct rd_peer peer = { .pid = 10, .uid = 1000, .start_time = 1 };
	struct rd_client *proc;
	struct rd_usage *a, *b, *none;

	memset(bufs, 0, sizeof(bufs));
	atomic_init(&dev.generation, 1);
	rd_objects_init(&objects, &dev);
	proc = rd_objects_client_get(&objects, &peer);

	a = rd_usage_get(&t, RP_JOB_CLIENT, "train-7", 1000);
	none = rd_usage_get(&t, RP_JOB_NONE, "ignored", 1000);
	ck_assert_ptr_eq(rd_usage_get(&t, RP_JOB_CLIENT, "train-7", 1000), a);
	rd_usage_put(a);
	ck_assert_str_eq(none->job, "");
	ck_assert_uint_eq(t.named, 1);
	/* The same words from the cgroup are another entry: a stated job
	 * never counts as the kernel's. */
	b = rd_usage_get(&t, RP_JOB_CGROUP, "train-7", 1000);
	ck_assert_ptr_ne(a, b);
	ck_assert_uint_eq(t.named, 2);
	rd_usage_put(b);
	ck_assert_ptr_null(entry(&t, RP_JOB_CGROUP, "train-7"));
	ck_assert_uint_eq(t.named, 1);

	/* An import counts in the job of the session that made it, and keeps
	 * the entry after that session's reference is gone. */
	bufs[0].size = 4096;
	rd_objects_add(&objects, rd_buffer_object(&bufs[0]), RD_OBJECT_BUFFER, proc);
	rd_usage_object_added(a, rd_buffer_object(&bufs[0]), RD_OBJECT_BUFFER, bufs[0].size);
	rd_objects_add(&objects, rd_event_object(&evs[0]), RD_OBJECT_EVENT, proc);
	rd_usage_object_added(a, rd_event_object(&evs[0]), RD_OBJECT_EVENT, 0);
	ck_assert_uint_eq(a->buffers, 1);
	ck_assert_uint_eq(a->buffer_bytes, 4096);
	ck_assert_uint_eq(a->events, 1);
	rd_usage_put(a);
	ck_assert_ptr_eq(entry(&t, RP_JOB_CLIENT, "train-7"), a);
	rd_objects_close(&objects, rd_buffer_object(&bufs[0]));
	ck_assert_uint_eq(a->buffers, 0);
	ck_assert_uint_eq(a->buffer_bytes, 0);
	ck_assert_ptr_null(bufs[0].obj.usage);
	/* The process's last connection closes its event: the job is gone. */
	rd_objects_client_put(&objects, proc);
	ck_assert_ptr_null(entry(&t, RP_JOB_CLIENT, "train-7"));
	ck_assert_uint_eq(t.named, 0);
	rd_usage_put(none);
	ck_assert_ptr_null(t.list);
}
END_TEST

START_TEST(a_stated_job_is_its_uid_s_own)
{
	struct rd_usage_table t = { 0 };
	struct rd_usage *mine, *theirs, *cgroup_a, *cgroup_b;
	cJSON *json, *e;
	int with_uid = 0;

	/* Another uid stating the same words is another job: its work never
	 * counts under the first's. */
	mine = rd_usage_get(&t, RP_JOB_CLIENT, "train-7", 1000);
	theirs = rd_usage_get(&t, RP_JOB_CLIENT, "train-7", 1001);
	ck_assert_ptr_ne(mine, theirs);
	ck_assert_ptr_eq(rd_usage_get(&t, RP_JOB_CLIENT, "train-7", 1000), mine);
	rd_usage_put(mine);
	/* The kernel's word (a cgroup) is one job whoever's process is in it. */
	cgroup_a = rd_usage_get(&t, RP_JOB_CGROUP, "slurm:42", 1000);
	cgroup_b = rd_usage_get(&t, RP_JOB_CGROUP, "slurm:42", 0);
	ck_assert_ptr_eq(cgroup_a, cgroup_b);
	json = rd_usage_json(&t);
	cJSON_ArrayForEach(e, json) {
		const cJSON *uid = cJSON_GetObjectItem(e, "uid");
		bool client = strcmp(cJSON_GetStringValue(cJSON_GetObjectItem(e, "source")), "client") == 0;

		ck_assert(client == (uid != NULL));
		with_uid += client && ((int)uid->valuedouble == 1000 || (int)uid->valuedouble == 1001);
	}
	ck_assert_int_eq(with_uid, 2);
	cJSON_Delete(json);
	rd_usage_put(mine);
	rd_usage_put(theirs);
	rd_usage_put(cgroup_a);
	rd_usage_put(cgroup_b);
	ck_assert_ptr_null(t.list);
}
END_TEST

START_TEST(one_uid_makes_at_most_its_share_of_the_jobs)
{
	struct rd_usage_table t = { 0 };
	struct rd_usage *u[RD_USAGE_JOBS_PER_UID + 2], *other_uid;
	char name[16];

	for (int i = 0; i < RD_USAGE_JOBS_PER_UID + 2; i++) {
		snprintf(name, sizeof(name), "job-%d", i);
		u[i] = rd_usage_get(&t, i % 2 ? RP_JOB_CLIENT : RP_JOB_CGROUP, name, 1000);
		ck_assert_int_eq(u[i]->source,
				 i >= RD_USAGE_JOBS_PER_UID ? RP_JOB_OTHER : i % 2 ? RP_JOB_CLIENT : RP_JOB_CGROUP);
	}
	ck_assert_uint_eq(t.named, RD_USAGE_JOBS_PER_UID);
	/* Another uid still gets entries of its own. */
	other_uid = rd_usage_get(&t, RP_JOB_CLIENT, "job-0", 1001);
	ck_assert_int_eq(other_uid->source, RP_JOB_CLIENT);
	rd_usage_put(other_uid);
	for (int i = 0; i < RD_USAGE_JOBS_PER_UID + 2; i++)
		rd_usage_put(u[i]);
	ck_assert_ptr_null(t.list);
	ck_assert_uint_eq(t.named, 0);
}
END_TEST

START_TEST(jobs_past_the_limit_count_together_as_other)
{
	struct rd_usage_table t = { 0 };
	struct rd_usage *u[RD_USAGE_JOBS_MAX], *other, *other2, *again;
	char name[16];
	cJSON *json;

	/* Each uid under its own share: the table's bound. */
	for (int i = 0; i < RD_USAGE_JOBS_MAX; i++) {
		snprintf(name, sizeof(name), "job-%d", i);
		u[i] = rd_usage_get(&t, i % 2 ? RP_JOB_CLIENT : RP_JOB_CGROUP, name, 2000 + i);
		ck_assert_int_eq(u[i]->source, i % 2 ? RP_JOB_CLIENT : RP_JOB_CGROUP);
	}
	other = rd_usage_get(&t, RP_JOB_CLIENT, "one-more", 1000);
	other2 = rd_usage_get(&t, RP_JOB_CGROUP, "slurm:1", 1001);
	ck_assert_int_eq(other->source, RP_JOB_OTHER);
	ck_assert_ptr_eq(other, other2);
	ck_assert_str_eq(other->job, "");
	/* A job listed already keeps its own entry. */
	again = rd_usage_get(&t, RP_JOB_CLIENT, "job-1", 2001);
	ck_assert_ptr_eq(again, u[1]);
	rd_usage_put(again);
	json = rd_usage_json(&t);
	ck_assert_int_eq(cJSON_GetArraySize(json), RD_USAGE_JOBS_MAX + 1);
	cJSON_Delete(json);
	/* Room again: a new job gets its own entry. */
	rd_usage_put(u[0]);
	again = rd_usage_get(&t, RP_JOB_CLIENT, "one-more", 1000);
	ck_assert_int_eq(again->source, RP_JOB_CLIENT);
	rd_usage_put(again);
	rd_usage_put(other);
	rd_usage_put(other2);
	for (int i = 1; i < RD_USAGE_JOBS_MAX; i++)
		rd_usage_put(u[i]);
	ck_assert_ptr_null(t.list);
	ck_assert_uint_eq(t.named, 0);
}
END_TEST

/* ---- io.regen.Device.Job on the wire ---- */

START_TEST(jobs_encode_and_decode)
{
	const struct rp_device_job in[] = {
		{ .job = "slurm:4242", .source = RP_JOB_CGROUP, .sessions = 2, .buffers = 3, .buffer_bytes = 1ull << 40,
		  .events = 1, .in_flight = 4, .calls = 5, .call_errors = 1 },
		{ .job = "", .source = RP_JOB_NONE, .sessions = 1 },
		{ .job = NULL, .source = RP_JOB_OTHER, .calls = 9 },
		{ .job = "train-7", .source = RP_JOB_CLIENT, .has_uid = true, .uid = 65534, .sessions = 1 },
	};
	struct rp_device_job *out;
	struct rp_error err = { 0 };
	size_t n;
	cJSON *a = rp_device_jobs_encode(in, 4);

	ck_assert_ptr_nonnull(a);
	ck_assert_int_eq(rp_device_jobs_decode(a, 8, &out, &n, &err), 0);
	ck_assert_uint_eq(n, 4);
	ck_assert_str_eq(out[0].job, "slurm:4242");
	ck_assert_int_eq(out[0].source, RP_JOB_CGROUP);
	ck_assert_uint_eq(out[0].buffer_bytes, 1ull << 40);
	ck_assert_uint_eq(out[0].in_flight, 4);
	ck_assert_uint_eq(out[0].call_errors, 1);
	ck_assert_int_eq(out[1].source, RP_JOB_NONE);
	ck_assert_str_eq(out[2].job, "");
	ck_assert_int_eq(out[2].source, RP_JOB_OTHER);
	ck_assert_uint_eq(out[2].calls, 9);
	ck_assert(!out[0].has_uid && !out[2].has_uid);
	ck_assert(out[3].has_uid && out[3].uid == 65534 && out[3].source == RP_JOB_CLIENT);
	free(out);
	/* More than the reader takes. */
	ck_assert_int_eq(rp_device_jobs_decode(a, 2, &out, &n, &err), -EINVAL);
	ck_assert_ptr_null(out);
	rp_error_clear(&err);
	cJSON_Delete(a);
}
END_TEST

START_TEST(a_malformed_job_entry_is_named)
{
	static const struct {
		const char *json, *parameter;
	} bad[] = {
		{ "{}", "jobs" },
		{ "[1]", "jobs[0]" },
		{ "[{\"source\":\"client\"}]", "jobs[0].job" },
		{ "[{\"job\":\"x\",\"source\":\"kernel\"}]", "jobs[0].source" },
		{ "[{\"job\":\"x\",\"source\":\"client\",\"sessions\":-1,\"buffers\":0,\"buffer_bytes\":0,\"events\":0,"
		  "\"in_flight\":0,\"calls\":0,\"call_errors\":0}]", "jobs[0].sessions" },
		{ "[{\"job\":\"x\",\"source\":\"client\",\"sessions\":1,\"buffers\":0,\"buffer_bytes\":0,\"events\":0,"
		  "\"in_flight\":0,\"calls\":0}]", "jobs[0].call_errors" },
		{ "[{\"job\":\"x12345678901234567890123456789012345678901234567890123456789012345\","
		  "\"source\":\"client\"}]", "jobs[0].job" },
	};

	for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
		cJSON *a = cJSON_Parse(bad[i].json);
		struct rp_device_job *out = (void *)1;
		struct rp_error err = { 0 };
		const char *parameter;
		size_t n = 7;

		ck_assert_int_eq(rp_device_jobs_decode(a, 8, &out, &n, &err), -EINVAL);
		ck_assert_ptr_null(out);
		ck_assert_uint_eq(n, 0);
		parameter = cJSON_GetStringValue(cJSON_GetObjectItem(err.params, "parameter"));
		ck_assert_msg(strcmp(parameter, bad[i].parameter) == 0, "%s: parameter %s", bad[i].json, parameter);
		rp_error_clear(&err);
		cJSON_Delete(a);
	}
}
END_TEST

int main(void)
{
	Suite *s = suite_create("job");
	TCase *tc = tcase_create("job");

	tcase_add_test(tc, the_rule_takes_what_a_scheduler_or_a_person_would_name);
	tcase_add_test(tc, the_rule_refuses_with_a_named_error_that_says_why);
	tcase_add_test(tc, the_cgroup_names_the_connection_and_both_are_described);
	tcase_add_test(tc, a_job_is_listed_while_a_session_or_an_import_counts_in_it);
	tcase_add_test(tc, a_stated_job_is_its_uid_s_own);
	tcase_add_test(tc, one_uid_makes_at_most_its_share_of_the_jobs);
	tcase_add_test(tc, jobs_past_the_limit_count_together_as_other);
	tcase_add_test(tc, jobs_encode_and_decode);
	tcase_add_test(tc, a_malformed_job_entry_is_named);
	suite_add_tcase(s, tc);
	return unit_run(s);
}
