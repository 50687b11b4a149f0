/* SPDX-License-Identifier: Apache-2.0 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "daemon/worker/usage.h"
#include "proto/device.h"

static bool named(enum rp_job_source source)
{
	return source == RP_JOB_CGROUP || source == RP_JOB_CLIENT;
}

static struct rd_usage *find(struct rd_usage_table *t, enum rp_job_source source, const char *job, uid_t uid)
{
	for (struct rd_usage *u = t->list; u; u = u->next)
		if (u->source == source && strcmp(u->job, job) == 0 && (source != RP_JOB_CLIENT || u->uid == uid))
			return u;
	return NULL;
}

/* Named entries a session of uid made. */
static unsigned named_by(const struct rd_usage_table *t, uid_t uid)
{
	unsigned n = 0;

	for (const struct rd_usage *u = t->list; u; u = u->next)
		n += named(u->source) && u->uid == uid;
	return n;
}

struct rd_usage *rd_usage_get(struct rd_usage_table *t, enum rp_job_source source, const char *job, uid_t uid)
{
	struct rd_usage *u;

	if (source == RP_JOB_NONE || !job || !job[0]) {
		source = RP_JOB_NONE;
		job = "";
	}
	u = find(t, source, job, uid);
	/* Past the limits a new job counts with the others: what clients
	 * state cannot grow the list (nor the metrics' labels) without bound,
	 * nor one uid take every entry. */
	if (!u && named(source) && (t->named >= RD_USAGE_JOBS_MAX || named_by(t, uid) >= RD_USAGE_JOBS_PER_UID)) {
		source = RP_JOB_OTHER;
		job = "";
		u = find(t, source, job, uid);
	}
	if (!u) {
		u = calloc(1, sizeof(*u));
		if (!u)
			return NULL;
		u->table = t;
		u->source = source;
		u->uid = uid;
		snprintf(u->job, sizeof(u->job), "%s", job);
		u->next = t->list;
		t->list = u;
		if (named(source))
			t->named++;
	}
	u->refs++;
	return u;
}

void rd_usage_put(struct rd_usage *u)
{
	struct rd_usage_table *t;

	if (!u || --u->refs)
		return;
	t = u->table;
	for (struct rd_usage **p = &t->list; *p; p = &(*p)->next) {
		if (*p == u) {
			*p = u->next;
			break;
		}
	}
	if (named(u->source))
		t->named--;
	free(u);
}

void rd_usage_object_added(struct rd_usage *u, struct rd_object *o, enum rd_object_kind kind, uint64_t bytes)
{
	if (!u)
		return;
	u->refs++;
	o->usage = u;
	if (kind == RD_OBJECT_BUFFER) {
		u->buffers++;
		u->buffer_bytes += bytes;
	} else if (kind == RD_OBJECT_EVENT) {
		u->events++;
	}
}

void rd_usage_object_closed(struct rd_object *o, enum rd_object_kind kind, uint64_t bytes)
{
	struct rd_usage *u = o->usage;

	if (!u)
		return;
	o->usage = NULL;
	if (kind == RD_OBJECT_BUFFER) {
		u->buffers--;
		u->buffer_bytes -= bytes;
	} else if (kind == RD_OBJECT_EVENT) {
		u->events--;
	}
	rd_usage_put(u);
}

cJSON *rd_usage_json(const struct rd_usage_table *t)
{
	/* At most RD_USAGE_JOBS_MAX jobs, none and other. */
	struct rp_device_job jobs[RD_USAGE_JOBS_MAX + 2];
	size_t n = 0;

	for (const struct rd_usage *u = t->list; u && n < sizeof(jobs) / sizeof(jobs[0]); u = u->next)
		jobs[n++] = (struct rp_device_job){
			.job = u->job,
			.source = u->source,
			.has_uid = u->source == RP_JOB_CLIENT,
			.uid = (uint32_t)u->uid,
			.sessions = u->sessions,
			.buffers = u->buffers,
			.buffer_bytes = u->buffer_bytes,
			.events = u->events,
			.in_flight = u->in_flight,
			.calls = u->calls,
			.call_errors = u->call_errors,
		};
	return rp_device_jobs_encode(jobs, n);
}
