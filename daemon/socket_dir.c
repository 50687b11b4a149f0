/* SPDX-License-Identifier: Apache-2.0 */
#include <errno.h>
#include <fcntl.h>
#include <stdbool.h>
#include <stdio.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <unistd.h>
#include "daemon/socket_dir.h"

/* The directory and its missing parents, 0755 (less the umask): a fresh
 * machine has no /run/regen until a unit or tmpfiles.d makes it. One that
 * someone else made first is found out by the checks after. */
static int make_dirs(char *dir)
{
	for (char *p = dir + 1;; p++) {
		bool last = *p == '\0';

		if (*p != '/' && !last)
			continue;
		*p = '\0';
		if (mkdir(dir, 0755) < 0 && errno != EEXIST)
			return -errno;
		if (last)
			return 0;
		*p = '/';
	}
}

const char *rd_socket_dir_name(const char *socket_path)
{
	const char *slash = strrchr(socket_path, '/');

	return slash ? slash + 1 : socket_path;
}

int rd_socket_dir_open(const char *socket_path, char *why, size_t why_size)
{
	const char *name = rd_socket_dir_name(socket_path);
	char dir[sizeof(((struct sockaddr_un *)0)->sun_path)];
	struct stat st;
	int fd, r;

	if (name == socket_path)
		snprintf(dir, sizeof(dir), ".");
	else if (name - 1 == socket_path)
		snprintf(dir, sizeof(dir), "/");
	else if ((size_t)(name - 1 - socket_path) >= sizeof(dir))
		return snprintf(why, why_size, "the socket path %s is too long", socket_path), -ENAMETOOLONG;
	else
		snprintf(dir, sizeof(dir), "%.*s", (int)(name - 1 - socket_path), socket_path);
	if (strcmp(dir, ".") != 0 && strcmp(dir, "/") != 0 && (r = make_dirs(dir)) < 0) {
		snprintf(why, why_size, "cannot make the socket directory %s: %s", dir, strerror(-r));
		return r;
	}
	fd = open(dir, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
	if (fd < 0) {
		r = -errno;
		if ((r == -ELOOP || r == -ENOTDIR) && lstat(dir, &st) == 0 && S_ISLNK(st.st_mode))
			snprintf(why, why_size, "the socket directory %s is a symbolic link: regend uses only a directory "
				 "it can check; name the directory itself in socket_path", dir);
		else
			snprintf(why, why_size, "cannot open the socket directory %s: %s", dir, strerror(-r));
		return r;
	}
	if (fstat(fd, &st) < 0) {
		r = -errno;
		snprintf(why, why_size, "cannot read the socket directory %s: %s", dir, strerror(-r));
		close(fd);
		return r;
	}
	if (st.st_uid != geteuid() && st.st_uid != 0) {
		snprintf(why, why_size, "the socket directory %s belongs to uid %u, not to regend's uid %u or root: its "
			 "owner could replace regend's sockets; remove it (regend makes it) or chown it to uid %u",
			 dir, (unsigned)st.st_uid, (unsigned)geteuid(), (unsigned)geteuid());
		close(fd);
		return -EPERM;
	}
	if (st.st_mode & (S_IWGRP | S_IWOTH)) {
		snprintf(why, why_size, "the socket directory %s is writable by %s (mode %04o): they could replace "
			 "regend's sockets; chmod go-w %s, or choose a directory of regend's own",
			 dir, st.st_mode & S_IWOTH ? "every user" : "its group", (unsigned)(st.st_mode & 07777), dir);
		close(fd);
		return -EPERM;
	}
	return fd;
}
