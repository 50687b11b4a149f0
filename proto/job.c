/* SPDX-License-Identifier: Apache-2.0 */
/* The rule for a stated job, and the names of a job's sources. */
#include <errno.h>
#include <string.h>

#include "errors.h"
#include "job.h"

static const char *const source_names[RP_JOB_SOURCES] = { "cgroup", "client", "none", "other" };

const char *rp_job_source_name(enum rp_job_source source)
{
	return (unsigned)source < RP_JOB_SOURCES ? source_names[source] : NULL;
}

int rp_job_source_from_name(const char *name)
{
	for (int i = 0; name != NULL && i < RP_JOB_SOURCES; i++) {
		if (strcmp(source_names[i], name) == 0)
			return i;
	}
	return -1;
}

static bool alnum(unsigned char c)
{
	return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9');
}

#define RULE "a job is 1 to 64 bytes of A-Z a-z 0-9 and . _ - : / @ + =, the first a letter or a digit"

int rp_job_check(const char *job, struct rp_error *err)
{
	size_t len = job != NULL ? strlen(job) : 0;

	if (len == 0) {
		if (err != NULL)
			rp_err_invalid_job(err, "empty", "the job is empty: " RULE);
		return -EINVAL;
	}
	if (len > RP_JOB_MAX) {
		if (err != NULL)
			rp_err_invalid_job(err, "too long", "the job is %zu bytes long: " RULE, len);
		return -EINVAL;
	}
	for (size_t i = 0; i < len; i++) {
		unsigned char c = (unsigned char)job[i];

		if (alnum(c) || (i > 0 && strchr("._-:/@+=", c) != NULL))
			continue;
		/* The byte by its number: the job itself may be anything, and
		 * is not repeated back. */
		if (err != NULL)
			rp_err_invalid_job(err, "character", "byte %zu of the job (0x%02x) is not allowed: " RULE,
					   i + 1, c);
		return -EINVAL;
	}
	return 0;
}
