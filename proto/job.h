/* SPDX-License-Identifier: Apache-2.0 */
/* A job a client names: the rule for a job a client states on its
 * connection (io.regen.SetJob), which regend enforces and regenctl checks
 * before it connects, and where a connection's job comes from. */
#pragma once

#include <stdbool.h>
#include "message.h"

/* The longest job a client may state, in bytes. */
#define RP_JOB_MAX 64

/* io.regen.JobSource, and io.regen.Device.Job's source (which adds
 * `other`: the jobs past a worker's limit, counted together). */
enum rp_job_source {
	RP_JOB_CGROUP = 0,   /* the client's cgroup: the kernel's word */
	RP_JOB_CLIENT,       /* io.regen.SetJob: the client's own word */
	RP_JOB_NONE,
	RP_JOB_OTHER,
	RP_JOB_SOURCES,
};

/* "cgroup", "client", "none", "other"; NULL out of range. */
const char *rp_job_source_name(enum rp_job_source source);
/* The source of that name, -1 when there is none. */
int rp_job_source_from_name(const char *name);

/* 0 when a client may state `job`: 1 to RP_JOB_MAX bytes of A-Z a-z 0-9
 * and . _ - : / @ + =, the first a letter or a digit (so that no stated job
 * is empty, spans lines, needs quoting in a log line or a metric label, or
 * looks like regend's own words). Else -EINVAL, and io.regen.InvalidJob
 * {reason} in err when err is not NULL. */
int rp_job_check(const char *job, struct rp_error *err);
