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

/* The socket's directory, made when missing (and its parents), 0755: a
 * fresh machine has no /run/regen until a unit or tmpfiles.d makes it. */
static int make_parent(const char *path)
{
	char dir[108];

	snprintf(dir, sizeof(dir), "%s", path);
	for (char *p = dir + 1; (p = strchr(p, '/')); p++) {
		*p = '\0';
		if (mkdir(dir, 0755) < 0 && errno != EEXIST)
			return -errno;
		*p = '/';
	}
	return 0;
}

int rd_listener_open(struct rd_listener *l, uv_loop_t *loop, const char *path, unsigned mode, gid_t group,
		     int inherited_fd, void (*on_accept)(int fd, void *data), void *data)
{
	struct sockaddr_un addr = { .sun_family = AF_UNIX };
	struct stat st;
	int fd, r;

	memset(l, 0, sizeof(*l));
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
	if (strlen(path) >= sizeof(addr.sun_path))
		return -ENAMETOOLONG;
	strcpy(addr.sun_path, path);
	r = make_parent(path);
	if (r < 0)
		return r;
	if (lstat(path, &st) == 0) {
		if (!S_ISSOCK(st.st_mode))
			return -EEXIST;
		/* A socket nobody answers on is a leftover of an earlier run. */
		int probe = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
		if (probe >= 0 && connect(probe, (struct sockaddr *)&addr, sizeof(addr)) == 0) {
			close(probe);
			return -EADDRINUSE;
		}
		if (probe >= 0)
			close(probe);
		unlink(path);
	}
	fd = socket(AF_UNIX, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
	if (fd < 0)
		return -errno;
	if (bind(fd, (struct sockaddr *)&addr, sizeof(addr)) < 0 || chmod(path, mode) < 0 ||
	    (group != (gid_t)-1 && chown(path, (uid_t)-1, group) < 0) || listen(fd, SOMAXCONN) < 0) {
		r = -errno;
		close(fd);
		unlink(path);
		return r;
	}
	l->owns_path = true;
poll:
	l->fd = fd;
	r = uv_poll_init(loop, &l->poll, fd);
	if (r < 0) {
		if (l->owns_path)
			unlink(path);
		close(fd);
		return r;
	}
	l->poll.data = l;
	uv_timer_init(loop, &l->pause);
	l->pause.data = l;
	l->open = true;
	uv_poll_start(&l->poll, UV_READABLE, on_listen_poll);
	return 0;
}

static void on_listener_closed(uv_handle_t *handle)
{
	struct rd_listener *l = handle->data;

	close(l->fd);
	l->fd = -1;
}

void rd_listener_close(struct rd_listener *l)
{
	if (!l->open)
		return;
	l->open = false;
	if (l->owns_path)
		unlink(l->path);
	uv_poll_stop(&l->poll);
	uv_timer_stop(&l->pause);
	uv_close((uv_handle_t *)&l->pause, NULL);
	uv_close((uv_handle_t *)&l->poll, on_listener_closed);
}
