/* SPDX-License-Identifier: Apache-2.0 */
#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <stdio.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <time.h>
#include <unistd.h>
#include "conn.h"

int64_t rc_now_ms(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (int64_t)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

int64_t rc_deadline(double seconds)
{
	if (!(seconds > 0) || seconds > 1e9) {
		return RC_FOREVER;
	}
	return rc_now_ms() + (int64_t)(seconds * 1000.0 + 0.5);
}

/* Milliseconds poll() may wait before `deadline`: -1 for none, 0 when due. */
static int poll_timeout(int64_t deadline)
{
	int64_t left;

	if (deadline == RC_FOREVER) {
		return -1;
	}
	left = deadline - rc_now_ms();
	if (left <= 0) {
		return 0;
	}
	return left > INT32_MAX ? INT32_MAX : (int)left;
}

/* Waits for `events` on fd. 0 when ready, -ETIMEDOUT, or -errno. */
static int wait_fd(int fd, short events, int64_t deadline)
{
	struct pollfd pfd = { .fd = fd, .events = events };
	int r;

	for (;;) {
		r = poll(&pfd, 1, poll_timeout(deadline));
		if (r > 0) {
			return 0;
		}
		if (r == 0) {
			return -ETIMEDOUT;
		}
		if (errno != EINTR) {
			return -errno;
		}
	}
}

int rc_backoff(int64_t deadline, int *delay_ms, int max_ms)
{
	if (deadline != RC_FOREVER && rc_now_ms() + *delay_ms >= deadline) {
		return -ETIMEDOUT;
	}
	usleep((useconds_t)*delay_ms * 1000);
	if (*delay_ms < max_ms) {
		*delay_ms *= 2;
	}
	return 0;
}

void rc_conn_init(struct rc_conn *c)
{
	memset(c, 0, sizeof(*c));
	c->fd = -1;
	rp_rx_init(&c->rx);
}

void rc_conn_close(struct rc_conn *c)
{
	if (c->fd >= 0) {
		close(c->fd);
		c->fd = -1;
	}
	/* Drop anything half-received: a new connection starts clean. */
	rp_rx_finish(&c->rx);
	rp_rx_init(&c->rx);
}

static int connect_once(const char *path, int64_t deadline, int *out)
{
	struct sockaddr_un sa = { .sun_family = AF_UNIX };
	socklen_t len;
	int fd, r;

	if (strlen(path) >= sizeof(sa.sun_path)) {
		return -ENAMETOOLONG;
	}
	strcpy(sa.sun_path, path);
	len = (socklen_t)(offsetof(struct sockaddr_un, sun_path) + strlen(path) + 1);
	for (;;) {
		fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);
		if (fd < 0) {
			return -errno;
		}
		if (connect(fd, (struct sockaddr *)&sa, len) == 0) {
			*out = fd;
			return 0;
		}
		r = -errno;
		close(fd);
		if (r != -EAGAIN) {
			return r;
		}
		/* A full backlog. On a Unix socket EAGAIN is a refusal, not a
		 * connection under way: such a socket polls writable and reads
		 * as connected, and the first call on it broke. Try again until
		 * the deadline. */
		if (deadline != RC_FOREVER && rc_now_ms() >= deadline) {
			return -ETIMEDOUT;
		}
		usleep(2000);
	}
}

int rc_conn_open(struct rc_conn *c, const char *path, int64_t deadline, bool retry)
{
	int fd = -1, r;
	int delay_ms = 5;

	rc_conn_close(c);
	if (path != c->path) {
		snprintf(c->path, sizeof(c->path), "%s", path);
	}
	for (;;) {
		r = connect_once(c->path, deadline, &fd);
		if (r == 0) {
			break;
		}
		if (!retry || !rc_conn_retryable(r)) {
			return r;
		}
		r = rc_backoff(deadline, &delay_ms, 100);
		if (r < 0) {
			return r;
		}
	}
	c->fd = fd;
	return 0;
}

bool rc_conn_peer_gone(struct rc_conn *c)
{
	struct pollfd pfd = { .fd = c->fd, .events = POLLIN };
	ssize_t n;

	if (c->fd < 0) {
		return true;
	}
	if (poll(&pfd, 1, 0) <= 0) {
		return false;
	}
	if (pfd.revents & (POLLERR | POLLNVAL)) {
		return true;
	}
	/* Readable or hung up: find out whether data or end of stream. */
	n = rp_rx_read(&c->rx, c->fd);
	if (n == 0 || (n < 0 && n != -EAGAIN && n != -EINTR)) {
		return true;
	}
	return false;
}

int rc_conn_send(struct rc_conn *c, const char *text, const int *fds, size_t nfds, int64_t deadline)
{
	struct rp_tx tx;
	int r;

	if (c->fd < 0) {
		return -ENOTCONN;
	}
	rp_tx_init(&tx);
	r = rp_tx_push(&tx, text, strlen(text), fds, nfds);
	if (r < 0) {
		goto out;
	}
	for (;;) {
		r = rp_tx_flush(&tx, c->fd);
		if (r == 0) {
			break;
		}
		if (r == -EINTR) {
			continue;
		}
		if (r != -EAGAIN) {
			if (r == -EPIPE || r == -ECONNRESET || r == -ENOTCONN) {
				r = -ECONNRESET;
			}
			goto out;
		}
		r = wait_fd(c->fd, POLLOUT, deadline);
		if (r < 0) {
			goto out;
		}
	}
out:
	rp_tx_finish(&tx);
	return r;
}

int rc_conn_recv(struct rc_conn *c, struct rp_msg *msg, int64_t deadline)
{
	ssize_t n;
	int r;

	if (c->fd < 0) {
		return -ENOTCONN;
	}
	for (;;) {
		r = rp_rx_next(&c->rx, msg);
		if (r == RP_RX_MESSAGE) {
			return 0;
		}
		if (r == RP_RX_TOO_LARGE) {
			return -EMSGSIZE;
		}
		if (r < 0) {
			return r;
		}
		n = rp_rx_read(&c->rx, c->fd);
		if (n > 0) {
			continue;
		}
		if (n == 0) {
			return -ECONNRESET;
		}
		if (n == -EINTR) {
			continue;
		}
		if (n != -EAGAIN) {
			return n == -EPIPE || n == -ECONNRESET ? -ECONNRESET : (int)n;
		}
		r = wait_fd(c->fd, POLLIN, deadline);
		if (r < 0) {
			return r;
		}
	}
}
