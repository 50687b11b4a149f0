#!/bin/sh
# SPDX-License-Identifier: Apache-2.0
# Slurm prolog: give the job a fresh generation of its own GPUs, and only
# those: regenctl --job reads SLURM_JOB_GPUS (the GPUs Slurm gave the job on
# this node), so the jobs beside it on a shared node are not disturbed. A job
# without GPUs has nothing to restart (regenctl exits 0).
# Install as /etc/slurm/prolog.d/50-regen.sh (root, 0755). Runs as root on
# each node of the allocation before the job starts. A non-zero exit makes
# Slurm drain the node and requeue the job, so fail only when this node
# cannot serve a clean generation.
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
REASON="slurm prolog job ${SLURM_JOB_ID:-?} user ${SLURM_JOB_USER:-?}"

log() { logger -t regen-prolog -- "$*"; echo "regen-prolog: $*" >&2; }

drain() {
	# Slurm drains the node itself on a failed prolog; the reason says why.
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

restart() {
	"$REGENCTL" restart --job --reason "$REASON" --wait --timeout "$TIMEOUT" 2>"$ERR"
	rc=$?
	cat "$ERR" >&2
	return $rc
}

restart
rc=$?
case $rc in
0)
	exit 0 ;;
5)
	# Nobody answers on the socket: restart the service, wait for it to be
	# ready (Type=notify: systemctl returns when it is), try once more.
	log "regend unreachable; restarting regend.service"
	systemctl restart regend.service || drain "regend.service does not start"
	restart
	rc=$?
	[ $rc -eq 0 ] && exit 0
	drain "restart after a service restart failed (regenctl exit $rc): $(said)" ;;
3)
	drain "devices not ready in a new generation within ${TIMEOUT}s" ;;
4)
	# A configuration error, not the node's fault: fail loudly, but the
	# node is drained all the same because the job cannot get clean GPUs.
	drain "regenctl restart not permitted: the prolog must run as root or in admin_group" ;;
2)
	drain "prolog script bug: regenctl usage error: $(said)" ;;
*)
	drain "regenctl restart failed (exit $rc): $(said)" ;;
esac
