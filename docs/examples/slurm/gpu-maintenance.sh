#!/bin/sh
# SPDX-License-Identifier: Apache-2.0
# GPU maintenance on one Slurm node: take GPUs out of regend so that a GPU
# reset (`nvidia-smi -r`) or a driver upgrade can go ahead, then bring them
# back. Without this, regend's worker holds each GPU open and the reset
# fails with "in use", so people wait for a reboot.
#
#   gpu-maintenance.sh DEVICES COMMAND...
#   gpu-maintenance.sh 0,1 nvidia-smi -r -i 0,1
#
# DEVICES is regenctl's --device LIST (indices, UUIDs, PCI bus ids). Run as
# root on the node. Steps: drain the node in Slurm (no new jobs) and wait
# for its jobs to end; regenctl detach (regend drains the GPUs, its workers
# exit, it holds no handle); run COMMAND; regenctl attach --wait (a new
# generation); resume the node. A failure leaves the node drained with a
# reason that says where it stopped.
set -u
NODE=${NODE:-$(hostname -s)}
DEVICES=$1
shift
REASON="gpu maintenance of $DEVICES: $*"

log() { logger -t regen-maintenance -- "$*" 2>/dev/null; echo "regen-maintenance: $*" >&2; }
stop() { scontrol update nodename="$NODE" state=drain reason="regen: $1" 2>/dev/null; log "$1"; exit 1; }

# regenctl: $REGENCTL where the site sets it, else the one on PATH, else
# where the packages (/usr/bin) or a source install (/usr/local/bin) put it:
# slurmd's PATH for prolog and epilog may hold neither.
find_regenctl() {
	if [ -n "${REGENCTL:-}" ]; then
		[ -x "$REGENCTL" ] && { echo "$REGENCTL"; return 0; }
		echo "REGENCTL=$REGENCTL is not an executable file"
		return 1
	fi
	for c in "$(command -v regenctl 2>/dev/null)" /usr/bin/regenctl /usr/local/bin/regenctl; do
		[ -n "$c" ] && [ -x "$c" ] && { echo "$c"; return 0; }
	done
	echo "regenctl not found (not on PATH, not in /usr/bin or /usr/local/bin): install regen, or set REGENCTL"
	return 1
}

REGENCTL=$(find_regenctl) || stop "$REGENCTL"

scontrol update nodename="$NODE" state=drain reason="$REASON"
while [ -n "$(squeue -h -w "$NODE" -o %i 2>/dev/null)" ]; do
	sleep 10
done

"$REGENCTL" detach --device "$DEVICES" --reason "$REASON" --deadline-ms 30000 ||
	stop "regenctl detach failed (exit $?)"
"$@" || stop "maintenance command failed (exit $?); devices $DEVICES stay detached"
"$REGENCTL" attach --device "$DEVICES" --reason "$REASON done" --wait --timeout 120 ||
	stop "regenctl attach failed (exit $?)"
scontrol update nodename="$NODE" state=resume
log "devices $DEVICES back in a new generation; node resumed"
