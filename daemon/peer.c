/* SPDX-License-Identifier: Apache-2.0 */
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <sys/vfs.h>
#include <unistd.h>
#include "daemon/peer.h"

/* Linux 6.5; Debian 12's headers predate it. */
#ifndef SO_PEERPIDFD
#define SO_PEERPIDFD 77
#endif
#ifndef SO_PEERGROUPS
#define SO_PEERGROUPS 59
#endif

/* pidfs (Linux 6.9): a pidfd's inode number names its process uniquely for
 * the life of the system, unlike a pid or its start time in clock ticks
 * (two processes started within one tick share it). */
#define PIDFS_MAGIC 0x50494446

static _Atomic uint64_t next_token = 1;

static uint64_t pidfs_inode(int pidfd)
{
	struct statfs fs;
	struct stat st;

	if (fstatfs(pidfd, &fs) < 0 || fs.f_type != PIDFS_MAGIC || fstat(pidfd, &st) < 0)
		return 0;
	return (uint64_t)st.st_ino;
}

/* Field 22 of /proc/PID/stat; 0 when the process is not there. The command
 * (field 2) may hold spaces and parentheses: read after its last ')'. */
static uint64_t start_time_of(pid_t pid)
{
	char path[32], buf[1024];
	unsigned long long start = 0;
	ssize_t n;
	int fd;

	snprintf(path, sizeof(path), "/proc/%d/stat", (int)pid);
	fd = open(path, O_RDONLY | O_CLOEXEC);
	if (fd < 0)
		return 0;
	n = read(fd, buf, sizeof(buf) - 1);
	close(fd);
	if (n <= 0)
		return 0;
	buf[n] = '\0';
	char *p = strrchr(buf, ')');
	if (!p)
		return 0;
	/* After ") " come fields 3 (state) .. 22 (starttime). */
	p++;
	for (int field = 3; field < 22 && p; field++)
		p = strchr(p + 1, ' ');
	if (!p || sscanf(p + 1, "%llu", &start) != 1)
		return 0;
	return start;
}

/* Signal 0 checks only that the process is there: EPERM (another uid, and
 * regend holds no CAP_KILL) says it is. */
static bool alive(int pidfd)
{
	return syscall(SYS_pidfd_send_signal, pidfd, 0, NULL, 0) == 0 || errno == EPERM;
}

static bool component_end(char c)
{
	return c == '/' || c == '\0' || c == '\n';
}

/* The digits after "job_" at a path component's start, up to its end.
 * Returns where the component ends, or NULL. */
static const char *slurm_job(const char *line, char *out, size_t len)
{
	for (const char *p = strstr(line, "/job_"); p; p = strstr(p + 1, "/job_")) {
		size_t n = strspn(p + 5, "0123456789");

		if (n > 0 && n < 24 && component_end(p[5 + n])) {
			snprintf(out, len, "slurm:%.*s", (int)n, p + 5);
			return p + 5 + n;
		}
	}
	return NULL;
}

/* "pod" and a UUID (36 characters, '_' for '-' under the systemd driver)
 * in a kubepods path. Returns where its component ends, or NULL. */
static const char *k8s_pod(const char *line, char *out, size_t len)
{
	const char *end = strchr(line, '\n');

	if (!strstr(line, "kubepods") || (end && strstr(line, "kubepods") > end))
		return NULL;
	for (const char *p = strstr(line, "pod"); p && (!end || p < end); p = strstr(p + 1, "pod")) {
		char uid[37];

		if (strspn(p + 3, "0123456789abcdef-_") < 36)
			continue;
		memcpy(uid, p + 3, 36);
		uid[36] = '\0';
		for (int i = 0; i < 36; i++)
			uid[i] = uid[i] == '_' ? '-' : uid[i];
		snprintf(out, len, "pod:%s", uid);
		for (p += 39; !component_end(*p); p++)
			;
		return p;
	}
	return NULL;
}

void rd_peer_job_from_cgroup(const char *text, char *out, size_t len,
			     bool (*trusted)(const char *line, size_t path_end))
{
	out[0] = '\0';
	for (const char *line = text; line && *line; line = strchr(line, '\n') ? strchr(line, '\n') + 1 : NULL) {
		const char *end = slurm_job(line, out, len);

		if (!end)
			end = k8s_pod(line, out, len);
		if (end && (!trusted || trusted(line, (size_t)(end - line))))
			return;
		out[0] = '\0';
	}
}

/* Whether the cgroup directory a job was read from is root's: a scheduler
 * (slurmstepd, the kubelet) makes its jobs' cgroups as root, while one a
 * user made in a subtree delegated to it (systemd's user@.service, a
 * container's) is the user's, whatever its name says. line is
 * "HIERARCHY:CONTROLLERS:PATH", cut at path_end after the job's component;
 * the directory is looked for where cgroup v2 (unified or hybrid) and v1
 * mount it. Not found: not trusted. */
static bool job_dir_is_roots(const char *line, size_t path_end)
{
	const char *controllers = strchr(line, ':'), *path;
	char dir[PATH_MAX], mount[96];
	struct stat st;

	if (!controllers || !(path = strchr(controllers + 1, ':')) || (size_t)(++path - line) > path_end)
		return false;
	controllers++;
	for (int i = 0; i < 2; i++) {
		if (path - controllers == 1)
			snprintf(mount, sizeof(mount), "%s", i == 0 ? "/sys/fs/cgroup/unified" : "/sys/fs/cgroup");
		else if (i == 0)
			snprintf(mount, sizeof(mount), "/sys/fs/cgroup/%.*s", (int)(path - controllers - 1),
				 strncmp(controllers, "name=", 5) == 0 ? controllers + 5 : controllers);
		else
			break;
		if (snprintf(dir, sizeof(dir), "%s%.*s", mount, (int)(line + path_end - path), path) >= (int)sizeof(dir))
			return false;
		if (lstat(dir, &st) == 0)
			return S_ISDIR(st.st_mode) && st.st_uid == 0;
	}
	return false;
}

static void read_job(pid_t pid, char *out, size_t len)
{
	char path[64], text[4096];
	ssize_t n;
	int fd;

	out[0] = '\0';
	snprintf(path, sizeof(path), "/proc/%d/cgroup", (int)pid);
	fd = open(path, O_RDONLY | O_CLOEXEC);
	if (fd < 0)
		return;
	n = read(fd, text, sizeof(text) - 1);
	close(fd);
	if (n <= 0)
		return;
	text[n] = '\0';
	rd_peer_job_from_cgroup(text, out, len, job_dir_is_roots);
}

void rd_peer_read(int fd, struct rd_peer *peer)
{
	struct ucred cred;
	socklen_t len = sizeof(cred);
	int pidfd = -1;

	memset(peer, 0, sizeof(*peer));
	if (getsockopt(fd, SOL_SOCKET, SO_PEERCRED, &cred, &len) == 0) {
		peer->pid = cred.pid;
		peer->uid = cred.uid;
		peer->gid = cred.gid;
	} else {
		peer->uid = (uid_t)-1;
		peer->gid = (gid_t)-1;
	}
	len = sizeof(peer->groups);
	/* ERANGE: more than fit, and len says how many bytes they take. */
	if (getsockopt(fd, SOL_SOCKET, SO_PEERGROUPS, peer->groups, &len) == 0 || errno == ERANGE)
		peer->ngroups = len / sizeof(gid_t);

	if (peer->pid > 0) {
		len = sizeof(pidfd);
		if (getsockopt(fd, SOL_SOCKET, SO_PEERPIDFD, &pidfd, &len) < 0)
			pidfd = -1;
		peer->start_time = start_time_of(peer->pid);
		peer->pidfs_inode = pidfd >= 0 ? pidfs_inode(pidfd) : 0;
		/* Read while the pidfd held the process: its own start time.
		 * Gone already: the pid may name a successor by now. */
		if (pidfd >= 0 && !alive(pidfd))
			peer->start_time = 0;
		if (peer->start_time)
			read_job(peer->pid, peer->job, sizeof(peer->job));
		if (pidfd >= 0)
			close(pidfd);
	}
	if (peer->pid <= 0 || peer->start_time == 0)
		peer->token = atomic_fetch_add(&next_token, 1);
}


bool rd_peer_same_process(const struct rd_peer *a, const struct rd_peer *b)
{
	return a->uid == b->uid && a->gid == b->gid && a->pid == b->pid && a->start_time == b->start_time &&
	       a->pidfs_inode == b->pidfs_inode && a->token == b->token;
}

int rd_peer_open_process(const struct rd_peer *peer)
{
	int pidfd;
	bool same;

	if (peer->token || peer->pid <= 0)
		return -ESRCH;
	pidfd = (int)syscall(SYS_pidfd_open, peer->pid, 0);
	if (pidfd < 0) {
		if (errno == ESRCH)
			return -ESRCH;
		/* No pidfd: the start time alone says whether it is the one. */
		return start_time_of(peer->pid) == peer->start_time ? -errno : -ESRCH;
	}
	/* Read while the pidfd holds the process, as rd_peer_read does. */
	same = peer->pidfs_inode ? pidfs_inode(pidfd) == peer->pidfs_inode : start_time_of(peer->pid) == peer->start_time;
	if (!same || !alive(pidfd)) {
		close(pidfd);
		return -ESRCH;
	}
	return pidfd;
}

/* Whether gid is among the socket peer's supplementary groups, all of
 * them: the kernel says how many bytes they take (ERANGE) and is asked
 * again with that room, bounded by what a process may have. A connected
 * socket's peer groups are those of connect() and never change, but a
 * second ERANGE is taken as a no rather than looped on. */
static bool socket_peer_in_group(int fd, gid_t gid)
{
	socklen_t len = 0;
	gid_t *groups;
	bool found = false;

	if (getsockopt(fd, SOL_SOCKET, SO_PEERGROUPS, NULL, &len) == 0 || errno != ERANGE || len == 0 ||
	    len > NGROUPS_MAX * sizeof(gid_t))
		return false;
	groups = malloc(len);
	if (!groups)
		return false;
	if (getsockopt(fd, SOL_SOCKET, SO_PEERGROUPS, groups, &len) == 0)
		for (size_t i = 0; i < len / sizeof(gid_t) && !found; i++)
			found = groups[i] == gid;
	free(groups);
	return found;
}

bool rd_peer_is_admin(const struct rd_peer *peer, int fd, gid_t admin_gid, bool have_admin_gid)
{
	if (peer->uid == 0)
		return true;
	if (!have_admin_gid)
		return false;
	if (peer->gid == admin_gid)
		return true;
	if (peer->ngroups > RD_PEER_GROUPS_MAX)
		return fd >= 0 && socket_peer_in_group(fd, admin_gid);
	for (unsigned i = 0; i < peer->ngroups; i++)
		if (peer->groups[i] == admin_gid)
			return true;
	return false;
}

bool rd_peer_alive(const struct rd_peer *peer)
{
	int pidfd = rd_peer_open_process(peer);

	if (pidfd >= 0)
		close(pidfd);
	/* Another error: there, but it cannot be watched. */
	return pidfd != -ESRCH;
}
