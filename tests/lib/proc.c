/* SPDX-License-Identifier: Apache-2.0 */
/* /proc and identities; see proc.h. */
#include <dirent.h>
#include <errno.h>
#include <grp.h>
#include <pwd.h>
#include <stdio.h>
#include <string.h>
#include <unistd.h>
#include "tests/lib/asserts.h"
#include "tests/lib/proc.h"

void tl_proc_read(pid_t pid, struct tl_proc *p)
{
	char path[64], line[512];
	struct dirent *e;
	DIR *dir;
	FILE *f;

	memset(p, 0, sizeof(*p));
	snprintf(path, sizeof(path), "/proc/%d/fd", (int)pid);
	dir = opendir(path);
	ASSERT_NOT_NULL(dir, "%s: %s", path, strerror(errno));
	while ((e = readdir(dir)) != NULL) {
		p->fds += e->d_name[0] != '.';
	}
	/* Our own directory stream is one of our fds. */
	if (pid == getpid()) {
		p->fds--;
	}
	closedir(dir);
	snprintf(path, sizeof(path), "/proc/%d/status", (int)pid);
	f = fopen(path, "r");
	ASSERT_NOT_NULL(f, "%s: %s", path, strerror(errno));
	while (fgets(line, sizeof(line), f)) {
		sscanf(line, "VmRSS: %ld", &p->rss_kb);
		sscanf(line, "Threads: %ld", &p->threads);
	}
	fclose(f);
	snprintf(path, sizeof(path), "/proc/%d/maps", (int)pid);
	f = fopen(path, "r");
	ASSERT_NOT_NULL(f, "%s: %s", path, strerror(errno));
	while (fgets(line, sizeof(line), f)) {
		p->maps += strchr(line, '\n') != NULL;
		p->asan = p->asan || strstr(line, "libasan") != NULL;
	}
	fclose(f);
}

void tl_become_nobody(gid_t gid, bool keep_gid)
{
	struct passwd *pw = getpwnam("nobody");

	ASSERT_NOT_NULL(pw, "no user nobody");
	ASSERT(setgroups(0, NULL) == 0, "setgroups: %s", strerror(errno));
	ASSERT(setgid(keep_gid ? gid : pw->pw_gid) == 0, "setgid: %s", strerror(errno));
	ASSERT(setuid(pw->pw_uid) == 0, "setuid: %s", strerror(errno));
	ASSERT(getuid() == pw->pw_uid && geteuid() == pw->pw_uid, "still not nobody");
}

const char *tl_group_without_nobody(gid_t except, gid_t *gid)
{
	static const char *const candidates[] = { "regen", "adm", "daemon", "sys", "staff", "users", "mail", "disk",
						  "wheel", NULL };
	struct passwd *pw = getpwnam("nobody");

	if (pw == NULL) {
		return NULL;
	}
	for (int i = 0; candidates[i] != NULL; i++) {
		struct group *g = getgrnam(candidates[i]);
		bool member = false;

		if (g == NULL || g->gr_gid == pw->pw_gid || g->gr_gid == 0 || g->gr_gid == except) {
			continue;
		}
		for (char **m = g->gr_mem; *m != NULL; m++) {
			member = member || strcmp(*m, "nobody") == 0;
		}
		if (!member) {
			*gid = g->gr_gid;
			return candidates[i];
		}
	}
	return NULL;
}
