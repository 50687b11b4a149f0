/* SPDX-License-Identifier: Apache-2.0 */
/* The environment variables regend reads that are not options: the log's
 * switch and the test knobs, each named once here with what it does, read
 * through rd_env(). Settings that tune regend are options (options.c),
 * which the environment may set too (each option's `env`, read in
 * rd_options_load); --help and regend(8) list both. */
#pragma once

#include <stdbool.h>

enum rd_env_var {
	RD_ENV_DEBUG = 0,            /* REGEN_DEBUG: the log's levels per topic */
	RD_ENV_PROGRAM_TRACE,        /* REGEN_PROGRAM_TRACE: programs' per-step times, to a file */
	/* Test knobs: only tests set them (docs/testing.md). */
	RD_ENV_BACKEND_DIR,
	RD_ENV_HANG_SECONDS,
	RD_ENV_HOST_NS_PER_MAC,
	RD_ENV_HOST_COMM_ABORT_MS,
	RD_ENV_HOST_COMM_SLOT_BYTES,
	RD_ENV_HOST_OPEN_HANG_FILE,
	RD_ENV_HOST_MIG_DEVICES,
	RD_ENV_VARS
};

struct rd_env_info {
	const char *name;            /* "REGEN_HOST_NS_PER_MAC" */
	bool test;                   /* a test knob: no setting to use in production */
	const char *value;           /* its value's form, for --help */
	const char *help;
};

extern const struct rd_env_info rd_env_table[RD_ENV_VARS];

/* The variable's value; NULL when it is unset or empty. */
const char *rd_env(enum rd_env_var var);
/* As a number from min to max (strtod reads the whole text); fallback
 * when it is unset, empty or not such a number. */
double rd_env_number(enum rd_env_var var, double min, double max, double fallback);
