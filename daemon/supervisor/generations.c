/* SPDX-License-Identifier: Apache-2.0 */
#include "regen-config.h"
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <stdbool.h>
#include <stdio.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>
#include "daemon/log.h"
#include "daemon/options.h"
#include "daemon/supervisor/generations.h"

#define HEADER "regen-generations 1"
/* JSON carries a generation as a double: exact below 2^53. */
#define COUNT_MAX (UINT64_C(1) << 52)

static int file_name(const char *socket_name, const char *suffix, char *buf, size_t size)
{
	int n = snprintf(buf, size, "%s.generations%s", socket_name, suffix);
	return n < 0 || (size_t)n >= size ? -ENAMETOOLONG : 0;
}

static const char *file_kind(mode_t mode)
{
	return S_ISFIFO(mode) ? "a FIFO" : S_ISDIR(mode) ? "a directory" : S_ISSOCK(mode) ? "a socket" :
	       S_ISCHR(mode) || S_ISBLK(mode) ? "a device" : S_ISLNK(mode) ? "a symbolic link" : "not a file";
}

int rd_sv_generations_load(int dir, const char *socket_name, uint64_t *epoch, uint64_t *generations, int n, char *why,
			   size_t why_size)
{
	char name[256], line[128];
	uint64_t saved_epoch = 0, saved[RD_DEVICES_MAX] = { 0 };
	struct stat st;
	bool header = false;
	FILE *f;
	int fd;

	if (file_name(socket_name, "", name, sizeof(name)) < 0)
		return 0;
	/* Not even a FIFO's open may wait: it is looked at before it is read. */
	if (fstatat(dir, name, &st, AT_SYMLINK_NOFOLLOW) < 0) {
		if (errno != ENOENT)
			rd_warn("supervisor", -1, 0, 0, "cannot read %s (%s): generations start at 1", name, strerror(errno));
		return 0;
	}
	if (!S_ISREG(st.st_mode)) {
		snprintf(why, why_size, "%s beside the socket is %s, not regend's file of generations: remove it", name,
			 file_kind(st.st_mode));
		return -EINVAL;
	}
	fd = openat(dir, name, O_RDONLY | O_NOFOLLOW | O_NONBLOCK | O_CLOEXEC);
	if (fd < 0) {
		rd_warn("supervisor", -1, 0, 0, "cannot read %s (%s): generations start at 1", name, strerror(errno));
		return 0;
	}
	/* What is open now is what was looked at, or it is not read. */
	if (fstat(fd, &st) < 0 || !S_ISREG(st.st_mode) || st.st_uid != geteuid()) {
		rd_warn("supervisor", -1, 0, 0, "%s is not a file of regend's user: generations start at 1", name);
		close(fd);
		return 0;
	}
	f = fdopen(fd, "r");
	if (f == NULL) {
		close(fd);
		return 0;
	}
	while (fgets(line, sizeof(line), f) != NULL) {
		uint64_t a, b;

		if (strcmp(line, HEADER "\n") == 0) {
			header = true;
		} else if (header && sscanf(line, "epoch %" SCNu64, &a) == 1 && a < COUNT_MAX) {
			saved_epoch = a;
		} else if (header && sscanf(line, "device %" SCNu64 " %" SCNu64, &a, &b) == 2 && a < RD_DEVICES_MAX &&
			   b < COUNT_MAX) {
			saved[a] = b;
		} else {
			header = false;
			break;
		}
	}
	fclose(f);
	if (!header) {
		rd_warn("supervisor", -1, 0, 0, "%s is malformed: generations start at 1", name);
		return 0;
	}
	if (saved_epoch > 0)
		*epoch = saved_epoch + 1;
	for (int i = 0; i < n && i < RD_DEVICES_MAX; i++) {
		if (saved[i] > 0)
			generations[i] = saved[i] + 1;
	}
	rd_info("supervisor", -1, 0, 0, "a regend served before on this socket: epoch %" PRIu64 " and generations one past %s",
		*epoch, name);
	return 0;
}

/* A file of regend's own, new: what is at tmp already (a crash's
 * leftover, or anything else) is removed first, never written through. */
static int create_new(int dir, const char *tmp)
{
	int fd = openat(dir, tmp, O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, 0600);

	if (fd < 0 && errno == EEXIST && unlinkat(dir, tmp, 0) == 0)
		fd = openat(dir, tmp, O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, 0600);
	return fd < 0 ? -errno : fd;
}

void rd_sv_generations_save(int dir, const char *socket_name, uint64_t epoch, const uint64_t *generations, int n)
{
	static bool warned;
	char name[256], tmp[256];
	FILE *f;
	int fd, r = 0;

	if (file_name(socket_name, "", name, sizeof(name)) < 0 || file_name(socket_name, ".new", tmp, sizeof(tmp)) < 0)
		return;
	fd = create_new(dir, tmp);
	if (fd < 0) {
		r = fd;
	} else if ((f = fdopen(fd, "w")) == NULL) {
		r = -errno;
		close(fd);
		unlinkat(dir, tmp, 0);
	} else {
		fprintf(f, HEADER "\nepoch %" PRIu64 "\n", epoch);
		for (int i = 0; i < n; i++)
			fprintf(f, "device %d %" PRIu64 "\n", i, generations[i]);
		if (fflush(f) != 0)
			r = -errno;
		if (fclose(f) != 0 && r == 0)
			r = -errno;
		if (r == 0 && renameat(dir, tmp, dir, name) < 0)
			r = -errno;
		if (r < 0)
			unlinkat(dir, tmp, 0);
	}
	if (r < 0 && !warned) {
		warned = true;
		rd_warn("supervisor", -1, 0, 0, "cannot write %s (%s): a regend started after this one counts generations "
						 "from 1 again",
			name, strerror(-r));
	}
}
