#!/bin/sh
# SPDX-License-Identifier: Apache-2.0
# Slurm epilog: after a job, drain what its ranks left behind (killed ranks'
# calls in flight, imported buffers), release every CUDA resource and return
# the device memory, so the next job starts from a clean generation. Only
# the job's own GPUs (regenctl --job reads SLURM_JOB_GPUS): the jobs still
# running beside it keep theirs.
# Install as /etc/slurm/epilog.d/50-regen.sh (root, 0755). A non-zero exit
# drains the node.
#
# regenctl exit codes: 0 ok, 1 error, 2 usage, 3 timeout, 4 not permitted,
# 5 regend unreachable. The drain reason says which, with regenctl's own
# words where it gave some.
TIMEOUT=${REGEN_RESTART_TIMEOUT:-60}
NODE=$(hostname -s)
# slurmd runs this outside the job's cgroup, so regend cannot tell the job
# from it: state it (shown as "stated: slurm:N" in the restart's reason, in
# Status, Watch and the journal). A job id is digits, always a valid job.
case ${SLURM_JOB_ID:-} in
*[!0-9]* | "") ;;
*) export REGEN_JOB="slurm:$SLURM_JOB_ID" ;;
esac
REASON="slurm epilog job ${SLURM_JOB_ID:-?}"

log() { logger -t regen-epilog -- "$*"; echo "regen-epilog: $*" >&2; }

drain() {
	scontrol update nodename="$NODE" state=drain reason="regen: $1" 2>/dev/null || true
	log "$1"
	exit 1
}

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

REGENCTL=$(find_regenctl) || drain "$REGENCTL"
ERR=$(mktemp) || drain "mktemp failed"
trap 'rm -f "$ERR"' EXIT

# regenctl's last line on stderr: its own words on what failed.
said() { tail -n 1 "$ERR" | cut -c 1-200; }

"$REGENCTL" restart --job --reason "$REASON" --wait --timeout "$TIMEOUT" 2>"$ERR"
rc=$?
cat "$ERR" >&2
case $rc in
0)
	exit 0 ;;
5)
	# regend is down: the next job's prolog starts it again (socket
	# activation) or drains the node; nothing to release now.
	log "regend unreachable after job ${SLURM_JOB_ID:-?}; leaving it to the next prolog"
	exit 0 ;;
3)
	# A device that does not come back after its job is a node problem.
	drain "devices not ready in a new generation within ${TIMEOUT}s after job ${SLURM_JOB_ID:-?}" ;;
4)
	drain "regenctl restart not permitted: the epilog must run as root or in admin_group" ;;
2)
	drain "epilog script bug: regenctl usage error: $(said)" ;;
*)
	drain "regenctl restart failed (exit $rc) after job ${SLURM_JOB_ID:-?}: $(said)" ;;
esac
