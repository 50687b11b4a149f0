/* SPDX-License-Identifier: Apache-2.0 */
/* Who is at the other end of a connection, as the kernel told us when it
 * connected: what ids are bound to and what rights are decided on. Nothing
 * in it comes from the peer's own words.
 *
 * A process is named by its uid, gid, pid and what tells a recycled pid
 * apart: on kernels with pidfs (6.9+) the inode of the peer's pidfd
 * (SO_PEERPIDFD), unique for the life of the system; elsewhere the pid's
 * start time in clock ticks, read while a pidfd holds the process where
 * the kernel has SO_PEERPIDFD (6.5+), so it is not a successor's. (Two
 * processes of one uid that share a pid and start within the same tick
 * look alike there; another uid never does.) A peer whose pid we cannot
 * see (0: another pid namespace) or whose process is already gone is a
 * process of its own, bound to this one connection. */
#pragma once

#include <stdbool.h>
#include <stdint.h>
#include <sys/types.h>

/* Supplementary groups kept in the peer; a process may have up to
 * NGROUPS_MAX (65536), read from its socket when it has more than this. */
#define RD_PEER_GROUPS_MAX 64

struct rd_peer {
	pid_t pid;
	uid_t uid;
	gid_t gid;
	uint64_t start_time;            /* clock ticks after boot */
	uint64_t pidfs_inode;           /* the pidfd's inode on pidfs, else 0 */
	uint64_t token;                 /* nonzero: bound to one connection (pid unseen or gone) */
	unsigned ngroups;               /* supplementary groups, SO_PEERGROUPS: how many it has */
	gid_t groups[RD_PEER_GROUPS_MAX];  /* them, when ngroups <= RD_PEER_GROUPS_MAX */
	char job[64];                   /* "slurm:<job id>", "pod:<uid>", or "" (rd_peer_job_from_cgroup) */
};

/* Reads the identity of a connected Unix socket's peer. Never fails: what
 * cannot be read makes the identity narrower (bound to the connection). */
void rd_peer_read(int fd, struct rd_peer *peer);

/* The job a process runs for, from the text of its /proc/PID/cgroup (which
 * every uid may read, unlike its environment): Slurm's cgroup plugin puts a
 * job's processes under .../job_<id>/..., the kubelet a pod's under
 * .../kubepods.../pod<uid>/... (the systemd driver writes
 * kubepods-<qos>-pod<uid with _ for ->.slice). Writes "slurm:<id>",
 * "pod:<uid>", or "" when neither is there. The kernel keeps the cgroup,
 * and `trusted` (NULL: every line) is asked of the line the job was found
 * in, with the length of its path up to the end of the job's component:
 * regend asks whether that directory is root's, so that a cgroup a user
 * made and named job_N in a subtree delegated to it (systemd's
 * user@.service) names no job, and no client can claim another job's. */
void rd_peer_job_from_cgroup(const char *text, char *out, size_t len,
			     bool (*trusted)(const char *line, size_t path_end));

/* The same process: ids one imported, the other may name. */
bool rd_peer_same_process(const struct rd_peer *a, const struct rd_peer *b);
/* A pidfd of the very process `peer` names (readable once it exits): a
 * pid that now names another process, or none, is -ESRCH; a peer bound to
 * its connection (token) is -ESRCH too, its connection being gone. Another
 * -errno (no pidfd_open: Linux before 5.3) when the process is there but
 * cannot be watched. */
int rd_peer_open_process(const struct rd_peer *peer);
/* Whether the process is still there: its pid names a process that
 * started when it did. False for a peer bound to its connection (its pid
 * unseen or gone when it connected). */
bool rd_peer_alive(const struct rd_peer *peer);

/* Root, or the admin group as the peer's primary or supplementary group
 * at connect time (a process that dropped the group is not an admin).
 * fd: the socket rd_peer_read read, still connected, where the kernel
 * keeps those groups: a peer with more than RD_PEER_GROUPS_MAX is looked
 * up there, all of them (fd < 0: only those kept). */
bool rd_peer_is_admin(const struct rd_peer *peer, int fd, gid_t admin_gid, bool have_admin_gid);
