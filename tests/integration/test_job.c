/* SPDX-License-Identifier: Apache-2.0 */
/* A client states its job through libregen: $REGEN_JOB at connect (a bad
 * one fails the connect with -EINVAL, before any connection), and
 * regen_client_set_job at any time, on the main connection and on the
 * worker connections it has or opens. regend refuses a bad job with
 * REGEN_ERROR_INVALID_JOB and nothing changes; a good one names the
 * client in lifecycle reasons, and Status counts the worker connection's
 * imports and calls under it: an import stays with the job it was made
 * in, the connection moves. Forgetting the job names nothing. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include <cjson/cJSON.h>
#include "tests/lib/client.h"

static struct tl_daemon daemon_;

/* Device `device`'s Job entry of `job` from `source` in a fresh Status, as
 * JSON text in out ("" when it is not listed). */
static void job_entry(regen_client *c, int device, const char *job, const char *source, char *out, size_t len)
{
	regen_status *st = tl_status(c);
	char *text = regen_status_to_json(st);
	cJSON *j = cJSON_Parse(text), *d, *e;

	out[0] = '\0';
	d = cJSON_GetArrayItem(cJSON_GetObjectItemCaseSensitive(j, "devices"), device);
	ASSERT(cJSON_IsArray(cJSON_GetObjectItemCaseSensitive(d, "jobs")), "device %d has no jobs: %s", device, text);
	cJSON_ArrayForEach(e, cJSON_GetObjectItemCaseSensitive(d, "jobs")) {
		if (strcmp(cJSON_GetStringValue(cJSON_GetObjectItem(e, "job")), job) == 0 &&
		    strcmp(cJSON_GetStringValue(cJSON_GetObjectItem(e, "source")), source) == 0) {
			char *p = cJSON_PrintUnformatted(e);
			snprintf(out, len, "%s", p);
			free(p);
		}
	}
	cJSON_Delete(j);
	free(text);
	regen_status_free(st);
}

static long long field_of(const char *entry, const char *key)
{
	cJSON *j = cJSON_Parse(entry);
	long long v = cJSON_IsNumber(cJSON_GetObjectItem(j, key)) ? (long long)cJSON_GetObjectItem(j, key)->valuedouble
								      : -1;

	cJSON_Delete(j);
	return v;
}

static void restart_reason(regen_client *c, int device, const char *why, char *out, size_t len)
{
	regen_status *st = NULL;

	ASSERT_REGEN_OK(c, regen_restart(c, device, why, 0, &st));
	snprintf(out, len, "%s", regen_status_find_device(st, device)->reason);
	regen_status_free(st);
}

int main(void)
{
	regen_client *c = NULL, *bad = NULL;
	struct tl_buffer b, b2;
	char entry[512], reason[320], want[320];

	tl_init(110);
	tl_daemon_start(&daemon_, NULL);

	/* A $REGEN_JOB regend would refuse: no client, no connection. */
	setenv("REGEN_JOB", "two words", 1);
	ASSERT_EQ(regen_client_connect(daemon_.sock, &bad), -EINVAL, "connect with a bad REGEN_JOB");
	ASSERT_NULL(bad, "a client came of a bad REGEN_JOB");

	setenv("REGEN_JOB", "env-job", 1);
	c = tl_client_connect(&daemon_);
	unsetenv("REGEN_JOB");
	ASSERT_STR_EQ(regen_client_job(c), "env-job");
	tl_buffer_create(c, 0, 1 << 20, &b);
	job_entry(c, 0, "env-job", "client", entry, sizeof(entry));
	ASSERT(field_of(entry, "sessions") == 1 && field_of(entry, "buffers") == 1 &&
	       field_of(entry, "buffer_bytes") == 1 << 20, "the worker connection states REGEN_JOB: %s", entry);
	restart_reason(c, 1, "from env", reason, sizeof(reason));
	snprintf(want, sizeof(want), "restart by pid %d (stated: env-job): from env", (int)getpid());
	ASSERT_STR_EQ(reason, want);
	tl_log("REGEN_JOB: stated on the main and the worker connection");

	/* Refused: the named error, and the client and regend keep the job. */
	ASSERT_REGEN_ERROR(c, regen_client_set_job(c, "a\"b"), REGEN_ERROR_INVALID_JOB);
	ASSERT(strstr(regen_client_error_message(c), "byte 2") != NULL, "message: %s", regen_client_error_message(c));
	ASSERT_REGEN_ERROR(c, regen_client_set_job(c, "x123456789012345678901234567890123456789012345678901234567890"
						      "12345"), REGEN_ERROR_INVALID_JOB);
	ASSERT_STR_EQ(regen_client_job(c), "env-job");
	job_entry(c, 0, "env-job", "client", entry, sizeof(entry));
	ASSERT(field_of(entry, "sessions") == 1, "a refused job moved the worker connection: %s", entry);
	restart_reason(c, 1, "kept", reason, sizeof(reason));
	ASSERT(strstr(reason, "(stated: env-job): kept") != NULL, "reason after a refused job: %s", reason);

	/* Another job: the open worker connection moves to it, its import
	 * stays counted where it was made, and its calls count in the new. */
	ASSERT_REGEN_OK(c, regen_client_set_job(c, "moved/2"));
	ASSERT_STR_EQ(regen_client_job(c), "moved/2");
	ASSERT_GEMM_OK(c, &b, "a GEMM after the job changed");
	/* Over the ring the answer may reach the client before the worker's
	 * loop counted the call done. */
	for (double deadline = tl_now() + 5;; usleep(10000)) {
		job_entry(c, 0, "moved/2", "client", entry, sizeof(entry));
		if (field_of(entry, "calls") == 1 || tl_now() > deadline)
			break;
	}
	ASSERT(field_of(entry, "sessions") == 1 && field_of(entry, "buffers") == 0 && field_of(entry, "calls") == 1,
	       "moved/2 on device 0: %s", entry);
	job_entry(c, 0, "env-job", "client", entry, sizeof(entry));
	ASSERT(field_of(entry, "sessions") == 0 && field_of(entry, "buffers") == 1, "env-job on device 0: %s", entry);
	restart_reason(c, 1, "moved", reason, sizeof(reason));
	ASSERT(strstr(reason, "(stated: moved/2): moved") != NULL, "reason: %s", reason);

	/* Forgotten: nothing names the client; its connection has no job. */
	ASSERT_REGEN_OK(c, regen_client_set_job(c, NULL));
	ASSERT_STR_EQ(regen_client_job(c), "");
	restart_reason(c, 1, "none", reason, sizeof(reason));
	snprintf(want, sizeof(want), "restart by pid %d: none", (int)getpid());
	ASSERT_STR_EQ(reason, want);
	job_entry(c, 0, "", "none", entry, sizeof(entry));
	ASSERT(field_of(entry, "sessions") == 1, "the worker connection without a job: %s", entry);
	job_entry(c, 0, "moved/2", "client", entry, sizeof(entry));
	ASSERT_STR_EQ(entry, "", "moved/2 is listed without a connection or an import");

	/* A connection opened later states the job too. */
	ASSERT_REGEN_OK(c, regen_client_set_job(c, "late"));
	tl_buffer_create(c, 1, 4096, &b2);
	job_entry(c, 1, "late", "client", entry, sizeof(entry));
	ASSERT(field_of(entry, "sessions") == 1 && field_of(entry, "buffers") == 1, "late on device 1: %s", entry);
	tl_log("regen_client_set_job: refused jobs change nothing; a job moves open connections and names new ones");

	tl_buffer_free(&b2);
	tl_buffer_free(&b);
	regen_client_destroy(c);
	return 0;
}
