/* SPDX-License-Identifier: Apache-2.0 */
/* The environment variables regend reads that are not options (env.h). */
#include <stdlib.h>
#include "daemon/env.h"

const struct rd_env_info rd_env_table[RD_ENV_VARS] = {
	[RD_ENV_DEBUG] = { "REGEN_DEBUG", false, "E|W|I|D|T[,topic:LEVEL...]",
			   "log levels, per topic (lifecycle, conn, worker, ...); wins over log_level" },
	[RD_ENV_PROGRAM_TRACE] = { "REGEN_PROGRAM_TRACE", false, "PATH",
				   "a CUDA worker launches every program Run step by step (no CUDA graphs) and "
				   "times each step past the first two Runs "
				   "(CPU to enqueue, GPU to run; the Run waits for its work, so the rank loses its "
				   "lead) and writes the averages to PATH.<pid>.<program> after each of the first 10 such Runs, then every 10" },
	[RD_ENV_BACKEND_DIR] = { "REGEN_BACKEND_DIR", true, "DIR",
				 "a CUDA worker loads backend-cuda.so from DIR only (a build tree's)" },
	[RD_ENV_HANG_SECONDS] = { "REGEN_HANG_SECONDS", true, "S",
				  "how long an injected hang's kernel spins on a CUDA worker (default 600)" },
	[RD_ENV_HOST_NS_PER_MAC] = { "REGEN_HOST_NS_PER_MAC", true, "NS",
				     "the pace the host backend's work estimate assumes, instead of the one it "
				     "measured at open (to let a call through that then hangs)" },
	[RD_ENV_HOST_COMM_ABORT_MS] = { "REGEN_HOST_COMM_ABORT_MS", true, "MS",
					"every communicator abort on the host backend takes this long (0-60000), as "
					"an ncclCommAbort whose peer is gone may" },
	[RD_ENV_HOST_COMM_SLOT_BYTES] = { "REGEN_HOST_COMM_SLOT_BYTES", true, "BYTES",
					  "each rank's staging slot of a host communicator (64-4194304, rounded down "
					  "to 64) instead of 64 MiB / nranks, so that small messages take many steps" },
	[RD_ENV_HOST_OPEN_HANG_FILE] = { "REGEN_HOST_OPEN_HANG_FILE", true, "PATH",
					 "device N's open on the host backend waits while PATH.N exists, as a driver "
					 "init that does not return" },
	[RD_ENV_HOST_MIG_DEVICES] = { "REGEN_HOST_MIG_DEVICES", true, "N",
				      "each simulated GPU of the host backend reports N MIG devices "
				      "(MIG-HOST-<index>-<k>) in its health, as NVML does on a MIG-partitioned GPU" },
};

const char *rd_env(enum rd_env_var var)
{
	const char *v = getenv(rd_env_table[var].name);

	return v && *v ? v : NULL;
}

double rd_env_number(enum rd_env_var var, double min, double max, double fallback)
{
	const char *text = rd_env(var);
	char *end;
	double v;

	if (!text)
		return fallback;
	v = strtod(text, &end);
	return *end == '\0' && v >= min && v <= max ? v : fallback;
}
