/* SPDX-License-Identifier: Apache-2.0 */
/* A listening Unix socket on the loop: bound here, or inherited from
 * systemd's socket activation. */
#pragma once

#include <stdbool.h>
#include <sys/types.h>
#include <uv.h>

struct rd_listener {
	uv_poll_t poll;
	int fd;
	int dir;             /* the socket's directory (daemon/socket_dir.h), ours: a dup */
	char path[108];      /* for the log */
	bool owns_path;      /* bound by us: unlinked on close */
	bool open;
	void (*on_accept)(int fd, void *data);
	void *data;
	/* Out of fds (EMFILE, ENFILE, ENOBUFS, ENOMEM): accepting pauses until
	 * the timer, and the log says so once per pause, not once per try. */
	uv_timer_t pause;
	bool paused;
	uint64_t refused_while_paused;
};

/* inherited_fd >= 0: use it (already bound and listening). Otherwise bind
 * path's last component in dir, the checked directory of path
 * (rd_socket_dir_open): a stale socket there is replaced, any other file
 * is an error. The socket is made with mode (umask around bind) and, when
 * group != (gid_t)-1, given the group in that directory, never by name. */
int rd_listener_open(struct rd_listener *l, uv_loop_t *loop, int dir, const char *path, unsigned mode, gid_t group,
		     int inherited_fd, void (*on_accept)(int fd, void *data), void *data);
void rd_listener_close(struct rd_listener *l);
