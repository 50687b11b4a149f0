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

static int file_path(const char *socket_path, const char *suffix, char *buf, size_t size)
{
	int n = snprintf(buf, size, "%s.generations%s", socket_path, suffix);
	return n < 0 || (size_t)n >= size ? -ENAMETOOLONG : 0;
}

void rd_sv_generations_load(const char *socket_path, uint64_t *epoch, uint64_t *generations, int n)
{
	char path[256], line[128];
	uint64_t saved_epoch = 0, saved[RD_DEVICES_MAX] = { 0 };
	struct stat st;
	bool header = false;
	FILE *f;
	int fd;

	if (file_path(socket_path, "", path, sizeof(path)) < 0)
		return;
	fd = open(path, O_RDONLY | O_NOFOLLOW | O_CLOEXEC);
	if (fd < 0) {
		if (errno != ENOENT)
			rd_warn("supervisor", -1, 0, 0, "cannot read %s (%s): generations start at 1", path, strerror(errno));
		return;
	}
	/* A file another user put in a shared directory says nothing of ours. */
	if (fstat(fd, &st) < 0 || !S_ISREG(st.st_mode) || st.st_uid != geteuid()) {
		rd_warn("supervisor", -1, 0, 0, "%s is not a file of regend's user: generations start at 1", path);
		close(fd);
		return;
	}
	f = fdopen(fd, "r");
	if (f == NULL) {
		close(fd);
		return;
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
		rd_warn("supervisor", -1, 0, 0, "%s is malformed: generations start at 1", path);
		return;
	}
	if (saved_epoch > 0)
		*epoch = saved_epoch + 1;
	for (int i = 0; i < n && i < RD_DEVICES_MAX; i++) {
		if (saved[i] > 0)
			generations[i] = saved[i] + 1;
	}
	rd_info("supervisor", -1, 0, 0, "a regend served before on this socket: epoch %" PRIu64 " and generations one past %s",
		*epoch, path);
}

void rd_sv_generations_save(const char *socket_path, uint64_t epoch, const uint64_t *generations, int n)
{
	static bool warned;
	char path[256], tmp[256];
	FILE *f;
	int fd, r = 0;

	if (file_path(socket_path, "", path, sizeof(path)) < 0 || file_path(socket_path, ".new", tmp, sizeof(tmp)) < 0)
		return;
	fd = open(tmp, O_WRONLY | O_CREAT | O_TRUNC | O_NOFOLLOW | O_CLOEXEC, 0600);
	if (fd < 0) {
		r = -errno;
	} else if ((f = fdopen(fd, "w")) == NULL) {
		r = -errno;
		close(fd);
	} else {
		fprintf(f, HEADER "\nepoch %" PRIu64 "\n", epoch);
		for (int i = 0; i < n; i++)
			fprintf(f, "device %d %" PRIu64 "\n", i, generations[i]);
		if (fflush(f) != 0)
			r = -errno;
		if (fclose(f) != 0 && r == 0)
			r = -errno;
		if (r == 0 && rename(tmp, path) < 0)
			r = -errno;
		if (r < 0)
			unlink(tmp);
	}
	if (r < 0 && !warned) {
		warned = true;
		rd_warn("supervisor", -1, 0, 0, "cannot write %s (%s): a regend started after this one counts generations "
						 "from 1 again",
			path, strerror(-r));
	}
}
