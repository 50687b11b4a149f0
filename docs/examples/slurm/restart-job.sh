#!/bin/sh
# SPDX-License-Identifier: Apache-2.0
# Inside a Slurm job (its batch script, after a rank failed and before the
# job's ranks start again, e.g. between torchrun restarts): restart exactly
# the job's own GPUs on every node of the allocation, one regenctl a node.
# regenctl --job reads the step's GPUs (SLURM_STEP_GPUS), so the jobs beside
# it on a shared node are not disturbed; --wait returns once each GPU serves
# in its new generation. The communicators of the "regen" process group on
# those GPUs end with their generation: the job's next processes make them
# afresh (docs/torch.md, "torch.distributed: the regen backend").
#
#   sh restart-job.sh && srun torchrun ... train.py
#
# Needs regenctl's admin right (root or regend's --admin-group) on each
# node, as the prolog has (prolog.sh beside this file).
set -eu
srun --overlap --nodes="${SLURM_JOB_NUM_NODES:-1}" --ntasks-per-node=1 \
	--export=ALL,REGEN_JOB="slurm:${SLURM_JOB_ID:-0}" \
	regenctl restart --job --wait --timeout "${REGEN_RESTART_TIMEOUT:-60}"
