/* SPDX-License-Identifier: Apache-2.0 */
/* Which devices a regenctl lifecycle command means: --all, --device LIST
 * (indices, ranges, GPU UUIDs, PCI bus ids, as Status reports them) or
 * --job (the GPUs the scheduler gave the job, from its environment). */
#pragma once

#include <stdbool.h>
#include "regen.h"

struct ctl_targets {
	bool all;                        /* every device regend serves */
	bool want[REGEN_DEVICES_MAX];    /* else these */
	int count;
	char from[192];                  /* --job: the variable and its value, for messages */
};

/* Checks the syntax of a --device LIST before anything is sent: -EINVAL
 * with why in msg. */
int ctl_targets_check(const char *list, char *msg, size_t len);

/* Fills t from a --device LIST. Indices pass as given (regend says
 * io.regen.NoSuchDevice for one it does not serve); UUIDs and PCI bus ids
 * are looked up in Generation's reply. -ENODEV with why in msg when one
 * matches no device; another -errno when regend could not be asked. */
int ctl_targets_from_list(regen_client *c, const char *list, struct ctl_targets *t, char *msg, size_t len);

/* Fills t from the job's environment: SLURM_STEP_GPUS, SLURM_JOB_GPUS,
 * NVIDIA_VISIBLE_DEVICES, CUDA_VISIBLE_DEVICES, the first that is set, as
 * the NVIDIA device plugin's strategies give it: UUIDs or indices
 * (envvar), a folder of them (volume-mounts), "void" with the GPUs'
 * device nodes in the container (CDI), MIG devices (by UUID or GPU:MIG
 * index: their GPU). 0 with t->count 0 when the job has no GPU (none set,
 * "none", empty, "void" without device nodes): nothing to do. */
int ctl_targets_from_job(regen_client *c, struct ctl_targets *t, char *msg, size_t len);

/* Device i is targeted. */
static inline bool ctl_targeted(const struct ctl_targets *t, int i)
{
	return t->all || (i >= 0 && i < REGEN_DEVICES_MAX && t->want[i]);
}
