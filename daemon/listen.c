/* SPDX-License-Identifier: Apache-2.0 */
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <unistd.h>
#include "daemon/listen.h"
#include "daemon/log.h"
#include "daemon/socket_dir.h"

/* How long accepting pauses when the process is out of fds: a pending
 * connection keeps the socket readable, so retrying at once would spin. */
#define PAUSE_MS 250

static void on_listen_poll(uv_poll_t *handle, int status, int events);

static void on_pause_end(uv_timer_t *t)
{
	struct rd_listener *l = t->data;

	if (!l->open)
		return;
	l->paused = false;
	uv_poll_start(&l->poll, UV_READABLE, on_listen_poll);
}

static bool out_of_resources(int e)
{
	return e == EMFILE || e == ENFILE || e == ENOBUFS || e == ENOMEM;
}

static void on_listen_poll(uv_poll_t *handle, int status, int events)
{
	struct rd_listener *l = handle->data;

	if (status < 0)
		return;
	/* Bounded per wakeup so a connection storm cannot starve the loop. */
	for (int i = 0; i < 64; i++) {
		int fd = accept4(l->fd, NULL, NULL, SOCK_NONBLOCK | SOCK_CLOEXEC);
		if (fd < 0) {
			if (out_of_resources(errno)) {
				if (!l->refused_while_paused)
					rd_warn("listen", -1, 0, 0,
						"accept on %s: %s; pausing %d ms at a time until an fd is free (connected "
						"clients are served)", l->path, strerror(errno), PAUSE_MS);
				l->paused = true;
				l->refused_while_paused++;
				uv_poll_stop(&l->poll);
				uv_timer_start(&l->pause, on_pause_end, PAUSE_MS, 0);
			} else if (errno != EAGAIN && errno != EINTR && errno != ECONNABORTED) {
				rd_warn("listen", -1, 0, 0, "accept on %s: %s", l->path, strerror(errno));
			}
			return;
		}
		if (l->refused_while_paused) {
			rd_info("listen", -1, 0, 0, "accepting on %s again (%llu tries found no fd)", l->path,
				(unsigned long long)l->refused_while_paused);
			l->refused_while_paused = 0;
		}
		l->on_accept(fd, l->data);
	}
}

/* Binds path, whose last component is name in dir, with mode: the umask
 * makes the mode as bind() makes the file, so it is never there with
 * another. bind() takes no directory fd, and a socket keeps the path it was
 * bound with as its name (clients read it back with getpeername), so the
 * path is bound and the directory asked afterwards whether the socket is in
 * it: nobody but regend can put a name there, so it is ours unless the
 * path no longer leads to that directory. */
static int bind_in(int fd, int dir, const char *path, const char *name, unsigned mode)
{
	struct sockaddr_un addr = { .sun_family = AF_UNIX };
	struct stat st;
	mode_t old;
	int r;

	if (strlen(path) >= sizeof(addr.sun_path))
		return -ENAMETOOLONG;
	strcpy(addr.sun_path, path);
	old = umask(~mode & 0777);
	r = bind(fd, (struct sockaddr *)&addr, sizeof(addr)) < 0 ? -errno : 0;
	umask(old);
	if (r == 0 && (fstatat(dir, name, &st, AT_SYMLINK_NOFOLLOW) < 0 || !S_ISSOCK(st.st_mode))) {
		rd_err("listen", -1, 0, 0, "%s is no longer in the socket directory regend checked: not listening there",
		       path);
		r = -EXDEV;
	}
	return r;
}

/* A socket nobody answers on is a leftover of an earlier run: removed. One
 * that answers is another regend's; any other file is not ours to remove. */
static int clear_leftover(int dir, const char *path, const char *name)
{
	struct sockaddr_un addr = { .sun_family = AF_UNIX };
	struct stat st;
	int probe;

	if (fstatat(dir, name, &st, AT_SYMLINK_NOFOLLOW) < 0)
		return errno == ENOENT ? 0 : -errno;
	if (!S_ISSOCK(st.st_mode))
		return -EEXIST;
	if (strlen(path) >= sizeof(addr.sun_path))
		return -ENAMETOOLONG;
	strcpy(addr.sun_path, path);
	probe = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
	if (probe >= 0 && connect(probe, (struct sockaddr *)&addr, sizeof(addr)) == 0) {
		close(probe);
		return -EADDRINUSE;
	}
	if (probe >= 0)
		close(probe);
	return unlinkat(dir, name, 0) < 0 && errno != ENOENT ? -errno : 0;
}

int rd_listener_open(struct rd_listener *l, uv_loop_t *loop, int dir, const char *path, unsigned mode, gid_t group,
		     int inherited_fd, void (*on_accept)(int fd, void *data), void *data)
{
	const char *name = rd_socket_dir_name(path);
	int fd, r;

	memset(l, 0, sizeof(*l));
	l->dir = -1;
	l->on_accept = on_accept;
	l->data = data;
	snprintf(l->path, sizeof(l->path), "%s", path);
	if (inherited_fd >= 0) {
		fd = inherited_fd;
		int flags = fcntl(fd, F_GETFL);
		if (flags < 0 || fcntl(fd, F_SETFL, flags | O_NONBLOCK) < 0)
			return -errno;
		goto poll;
	}
	if (dir < 0)
		return -EBADF;
	l->dir = fcntl(dir, F_DUPFD_CLOEXEC, 3);
	if (l->dir < 0)
		return -errno;
	r = clear_leftover(l->dir, path, name);
	if (r < 0)
		goto fail_dir;
	fd = socket(AF_UNIX, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
	if (fd < 0) {
		r = -errno;
		goto fail_dir;
	}
	r = bind_in(fd, l->dir, path, name, mode);
	if (r == 0 && group != (gid_t)-1 && fchownat(l->dir, name, (uid_t)-1, group, AT_SYMLINK_NOFOLLOW) < 0)
		r = -errno;
	if (r == 0 && listen(fd, SOMAXCONN) < 0)
		r = -errno;
	if (r < 0) {
		close(fd);
		if (r != -EXDEV)
			unlinkat(l->dir, name, 0);
		goto fail_dir;
	}
	l->owns_path = true;
poll:
	l->fd = fd;
	r = uv_poll_init(loop, &l->poll, fd);
	if (r < 0) {
		if (l->owns_path)
			unlinkat(l->dir, name, 0);
		close(fd);
		goto fail_dir;
	}
	l->poll.data = l;
	uv_timer_init(loop, &l->pause);
	l->pause.data = l;
	l->open = true;
	uv_poll_start(&l->poll, UV_READABLE, on_listen_poll);
	return 0;

fail_dir:
	if (l->dir >= 0)
		close(l->dir);
	l->dir = -1;
	return r;
}

static void on_listener_closed(uv_handle_t *handle)
{
	struct rd_listener *l = handle->data;

	close(l->fd);
	l->fd = -1;
	if (l->dir >= 0)
		close(l->dir);
	l->dir = -1;
}

void rd_listener_close(struct rd_listener *l)
{
	if (!l->open)
		return;
	l->open = false;
	/* Only what is still the socket this listener bound: a name in the
	 * directory it checked, not whatever the path leads to now. */
	if (l->owns_path)
		unlinkat(l->dir, rd_socket_dir_name(l->path), 0);
	uv_poll_stop(&l->poll);
	uv_timer_stop(&l->pause);
	uv_close((uv_handle_t *)&l->pause, NULL);
	uv_close((uv_handle_t *)&l->poll, on_listener_closed);
}
