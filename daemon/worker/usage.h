/* SPDX-License-Identifier: Apache-2.0 */
/* What each job uses of the worker's device now (io.regen.Device.Job): the
 * connections of its clients, what they imported and their calls. A
 * session counts in the job that names its connection (daemon/job.h),
 * moving when the client states another; an import counts in the job of
 * the session that made it until it is closed. A job's entry lives while
 * a session or an import counts in it, so a job whose clients left leaves
 * nothing behind. A stated job (RP_JOB_CLIENT) is its uid's: the same
 * words from two uids are two entries, so that nobody's work counts under
 * another user's job. At most RD_USAGE_JOBS_MAX jobs get an entry of their
 * own, at most RD_USAGE_JOBS_PER_UID of them made by one uid; the rest
 * count together as `other`, and sessions without a job as `none`, so that
 * the list stays bounded whatever clients state and no uid fills it for
 * the others. All on the worker's loop thread. */
#pragma once

#include <stdint.h>
#include <cjson/cJSON.h>
#include "daemon/worker/objects.h"
#include "proto/job.h"

#define RD_USAGE_JOBS_MAX 64
#define RD_USAGE_JOBS_PER_UID 8

struct rd_usage_table;

struct rd_usage {
	struct rd_usage *next;
	struct rd_usage_table *table;
	unsigned refs;                  /* sessions and objects that count in it */
	enum rp_job_source source;
	char job[RP_JOB_MAX + 1];       /* "" for none and other */
	uid_t uid;                      /* whose session made it: a stated job's owner */
	uint64_t sessions, buffers, buffer_bytes, events, in_flight;
	uint64_t calls, call_errors;
};

struct rd_usage_table {
	struct rd_usage *list;
	unsigned named;                 /* entries of a job of their own (not none, not other) */
};

/* The entry of `job` from `source` (RP_JOB_NONE: job ignored) for a
 * session of uid, made when there is none, with a reference for the
 * caller; NULL on ENOMEM. */
struct rd_usage *rd_usage_get(struct rd_usage_table *t, enum rp_job_source source, const char *job, uid_t uid);
/* Drops a reference; the last one removes the entry. Accepts NULL. */
void rd_usage_put(struct rd_usage *u);

/* An object made by a session of u: it counts in u (holding a reference)
 * until rd_usage_object_closed. u may be NULL (counted nowhere). */
void rd_usage_object_added(struct rd_usage *u, struct rd_object *o, enum rd_object_kind kind, uint64_t bytes);
/* The object left the table (closed); objects.c calls it. */
void rd_usage_object_closed(struct rd_object *o, enum rd_object_kind kind, uint64_t bytes);

/* The table as io.regen.Device.Job entries (a JSON array); NULL on ENOMEM. */
cJSON *rd_usage_json(const struct rd_usage_table *t);
