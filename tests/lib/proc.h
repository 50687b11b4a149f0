/* SPDX-License-Identifier: Apache-2.0 */
/* What a test reads about a process from /proc, and the identities a
 * permission test takes on. */
#pragma once

#include <stdbool.h>
#include <sys/types.h>

struct tl_proc {
	long fds, rss_kb, maps, threads;
	bool asan;     /* AddressSanitizer is mapped: its quarantine holds freed memory */
};
void tl_proc_read(pid_t pid, struct tl_proc *p);

/* Drops to `nobody`, with gid (keep_gid) or nobody's own group, and no
 * supplementary groups. Only root can; fails the test otherwise. */
void tl_become_nobody(gid_t gid, bool keep_gid);
/* A group that exists, that `nobody` is not in, that is not root's and not
 * `except`: its name, and its gid in *gid (NULL when there is none). */
const char *tl_group_without_nobody(gid_t except, gid_t *gid);
