/* SPDX-License-Identifier: Apache-2.0 */
/* Tuning knobs from the environment (env.h). */
#include <stdlib.h>
#include "daemon/env.h"

/* A spin or a wait longer than this is a mistake, not a setting. */
#define ENV_US_MAX 10000000

uint64_t rd_env_us_as_ns(const char *name, uint64_t fallback)
{
	const char *env = getenv(name);
	long v = env ? strtol(env, NULL, 10) : -1;

	return v >= 0 && v <= ENV_US_MAX ? (uint64_t)v * 1000u : fallback;
}
