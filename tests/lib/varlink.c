/* SPDX-License-Identifier: Apache-2.0 */
/* A raw Varlink peer; see varlink.h. */
#include <errno.h>
#include <poll.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>
#include "proto/ids.h"
#include "proto/message.h"
#include "tests/lib/varlink.h"

int tl_conn_open(struct tl_conn *c, const char *path)
{
	struct sockaddr_un sa = { .sun_family = AF_UNIX };
	int fd, e;

	memset(c, 0, sizeof(*c));
	c->fd = -1;
	rp_rx_init(&c->rx);
	fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
	ASSERT(fd >= 0, "socket: %s", strerror(errno));
	snprintf(sa.sun_path, sizeof(sa.sun_path), "%s", path);
	if (connect(fd, (struct sockaddr *)&sa, sizeof(sa)) < 0) {
		e = errno;
		close(fd);
		return -e;
	}
	c->fd = fd;
	return 0;
}

void tl_conn_adopt(struct tl_conn *c, int fd)
{
	memset(c, 0, sizeof(*c));
	rp_rx_init(&c->rx);
	c->fd = fd;
}

void tl_conn_close(struct tl_conn *c)
{
	if (c->fd >= 0) {
		close(c->fd);
	}
	c->fd = -1;
	rp_rx_finish(&c->rx);
}

/* Waits until fd is ready for events, running the pump meanwhile. 1 ready,
 * 0 timed out. */
static int wait_fd(struct tl_conn *c, short events, double deadline)
{
	for (;;) {
		struct pollfd p = { .fd = c->fd, .events = events };
		double left = deadline - tl_now();
		int ms, n;

		if (left <= 0) {
			return 0;
		}
		ms = c->pump != NULL ? 1 : (int)(left * 1000) + 1;
		if (c->pump != NULL) {
			c->pump(c->pump_data);
		}
		n = poll(&p, 1, ms);
		if (n > 0) {
			return 1;
		}
		if (n < 0 && errno != EINTR) {
			return 1;   /* let the read report it */
		}
	}
}

int tl_send_bytes(struct tl_conn *c, const void *data, size_t len, const int *fds, size_t nfds)
{
	const char *p = data;
	size_t sent = 0;
	ssize_t n;

	ASSERT_UINT_LE(nfds, RP_FDS_MAX * 4);
	while (sent < len) {
		struct iovec iov = { .iov_base = (void *)(p + sent), .iov_len = len - sent };
		union {
			char buf[CMSG_SPACE(sizeof(int) * RP_FDS_MAX * 4)];
			struct cmsghdr align;
		} u;
		struct msghdr mh = { .msg_iov = &iov, .msg_iovlen = 1 };

		if (sent == 0 && nfds > 0) {
			struct cmsghdr *cm;

			memset(&u, 0, sizeof(u));
			mh.msg_control = u.buf;
			mh.msg_controllen = CMSG_SPACE(sizeof(int) * nfds);
			cm = CMSG_FIRSTHDR(&mh);
			cm->cmsg_level = SOL_SOCKET;
			cm->cmsg_type = SCM_RIGHTS;
			cm->cmsg_len = CMSG_LEN(sizeof(int) * nfds);
			memcpy(CMSG_DATA(cm), fds, sizeof(int) * nfds);
		}
		n = sendmsg(c->fd, &mh, MSG_NOSIGNAL);
		if (n < 0) {
			if (errno == EINTR) {
				continue;
			}
			if (errno == EAGAIN) {
				ASSERT(wait_fd(c, POLLOUT, tl_now() + tl_timeout(30)), "the peer took nothing for 30 s");
				continue;
			}
			return -errno;
		}
		sent += (size_t)n;
	}
	return 0;
}

int tl_send_text(struct tl_conn *c, const char *text, const int *fds, size_t nfds)
{
	return tl_send_bytes(c, text, strlen(text) + 1, fds, nfds);
}

/* The parameters' text (malloc'ed), NULL for none. */
__attribute__((format(printf, 1, 0))) static char *vformat(const char *fmt, va_list ap)
{
	char *text = NULL;

	if (fmt != NULL) {
		ASSERT(vasprintf(&text, fmt, ap) >= 0, "vasprintf");
	}
	return text;
}

int tl_send(struct tl_conn *c, const char *method, const int *fds, size_t nfds, const char *params_fmt, ...)
{
	char *params, *text = NULL;
	va_list ap;
	int r;

	va_start(ap, params_fmt);
	params = vformat(params_fmt, ap);
	va_end(ap);
	ASSERT(asprintf(&text, "{\"method\":\"%s\",\"parameters\":%s}", method, params ? params : "{}") >= 0,
	       "asprintf");
	r = tl_send_text(c, text, fds, nfds);
	free(params);
	free(text);
	return r;
}

/* The next message: 0 with *msg, -ETIMEDOUT or -ECONNRESET. */
static int next_message(struct tl_conn *c, struct rp_msg *msg, double timeout_s)
{
	double deadline = tl_now() + tl_timeout(timeout_s);

	for (;;) {
		int r = rp_rx_next(&c->rx, msg);
		ssize_t got;

		ASSERT(r >= 0 && r != RP_RX_TOO_LARGE, "rp_rx_next: %d", r);
		if (r == RP_RX_MESSAGE) {
			return 0;
		}
		if (!wait_fd(c, POLLIN, deadline)) {
			return -ETIMEDOUT;
		}
		got = rp_rx_read(&c->rx, c->fd);
		if (got == -EAGAIN || got == -EINTR) {
			continue;
		}
		if (got <= 0) {
			return -ECONNRESET;
		}
	}
}

char *tl_recv_text(struct tl_conn *c, double timeout_s)
{
	struct rp_msg msg;
	char *text;

	if (next_message(c, &msg, timeout_s) < 0) {
		return NULL;
	}
	text = msg.text;
	msg.text = NULL;
	rp_msg_finish(&msg);
	return text;
}

int tl_recv(struct tl_conn *c, struct tl_reply *out, double timeout_s)
{
	struct rp_error err = { 0 };
	struct rp_call call;
	struct rp_msg msg;
	int r;

	memset(out, 0, sizeof(*out));
	r = next_message(c, &msg, timeout_s);
	if (r < 0) {
		return r;
	}
	ASSERT(rp_call_parse(msg.text, msg.len, &call, &err) == 0, "reply does not parse: %s", msg.text);
	ASSERT(call.method == NULL, "got a call, not a reply: %s", msg.text);
	out->error = call.error ? strdup(call.error) : NULL;
	out->params = cJSON_Duplicate(call.params, true);
	out->continues = call.continues;
	rp_call_finish(&call);
	rp_msg_finish(&msg);
	return 0;
}

void tl_reply_finish(struct tl_reply *r)
{
	free(r->error);
	cJSON_Delete(r->params);
	memset(r, 0, sizeof(*r));
}

const char *tl_reply_str(const struct tl_reply *r, const char *key)
{
	const cJSON *item = cJSON_GetObjectItemCaseSensitive(r->params, key);

	return cJSON_IsString(item) ? item->valuestring : NULL;
}

int64_t tl_reply_int(const struct tl_reply *r, const char *key)
{
	const cJSON *item = cJSON_GetObjectItemCaseSensitive(r->params, key);

	return cJSON_IsNumber(item) ? (int64_t)item->valuedouble : -1;
}

const char *tl_reply_text(const struct tl_reply *r)
{
	static __thread char buf[2048];
	char *text = r->params ? cJSON_PrintUnformatted(r->params) : NULL;

	snprintf(buf, sizeof(buf), "%s", text ? text : "{}");
	free(text);
	return buf;
}

const char *tl_reply_describe(const struct tl_reply *r)
{
	static __thread char buf[2200];

	snprintf(buf, sizeof(buf), "%s %s", r->error ? r->error : "success", tl_reply_text(r));
	return buf;
}

static void vcall(struct tl_conn *c, struct tl_reply *r, double timeout_s, const int *fds, size_t nfds,
		  const char *method, const char *params)
{
	int e = tl_send(c, method, fds, nfds, "%s", params ? params : "{}");

	ASSERT(e == 0, "sending %s: %s", method, strerror(-e));
	e = tl_recv(c, r, timeout_s);
	ASSERT(e == 0, "no reply to %s within %.0f s: %s", method, tl_timeout(timeout_s), strerror(-e));
}

void tl_call(struct tl_conn *c, struct tl_reply *r, double timeout_s, const int *fds, size_t nfds, const char *method,
	     const char *params_fmt, ...)
{
	char *params;
	va_list ap;

	va_start(ap, params_fmt);
	params = vformat(params_fmt, ap);
	va_end(ap);
	vcall(c, r, timeout_s, fds, nfds, method, params);
	free(params);
}

void tl_call_ok(struct tl_conn *c, struct tl_reply *r, const char *method, const char *params_fmt, ...)
{
	char *params;
	va_list ap;

	va_start(ap, params_fmt);
	params = vformat(params_fmt, ap);
	va_end(ap);
	vcall(c, r, 60, NULL, 0, method, params);
	ASSERT_REPLY_OK(r, "%s with parameters %s", method, params ? params : "{}");
	free(params);
}

void tl_device_status(struct tl_conn *main_conn, int device, struct tl_device *out)
{
	struct tl_reply r;
	cJSON *dev;
	bool found = false;

	tl_call_ok(main_conn, &r, "io.regen.Device.Status", NULL);
	memset(out, 0, sizeof(*out));
	cJSON_ArrayForEach(dev, cJSON_GetObjectItem(r.params, "devices")) {
		const char *state = cJSON_GetStringValue(cJSON_GetObjectItem(dev, "state"));
		const char *ws = cJSON_GetStringValue(cJSON_GetObjectItem(dev, "worker_socket"));

		if ((int)cJSON_GetNumberValue(cJSON_GetObjectItem(dev, "index")) != device) {
			continue;
		}
		found = true;
		out->generation = (int64_t)cJSON_GetNumberValue(cJSON_GetObjectItem(dev, "generation"));
		out->worker_pid = (int64_t)cJSON_GetNumberValue(cJSON_GetObjectItem(dev, "worker_pid"));
		out->memory_used = (int64_t)cJSON_GetNumberValue(cJSON_GetObjectItem(dev, "memory_used"));
		out->memory_baseline = (int64_t)cJSON_GetNumberValue(cJSON_GetObjectItem(dev, "memory_baseline"));
		out->respawns = (int64_t)cJSON_GetNumberValue(cJSON_GetObjectItem(dev, "respawns"));
		snprintf(out->state, sizeof(out->state), "%s", state ? state : "");
		snprintf(out->worker_socket, sizeof(out->worker_socket), "%s", ws ? ws : "");
	}
	ASSERT(found, "Status names no device %d: %s", device, tl_reply_text(&r));
	tl_reply_finish(&r);
}

int tl_import_memfd(struct tl_conn *c, int device, int fd, size_t size, char *id_out, struct tl_reply *r)
{
	tl_call(c, r, 30, &fd, 1, "io.regen.Memory.ImportBuffer",
		"{\"device\":%d,\"kind\":\"host_fd\",\"size\":%zu,\"fd\":0}", device, size);
	if (r->error != NULL) {
		return -1;
	}
	ASSERT_NOT_NULL(tl_reply_str(r, "buffer"), "ImportBuffer reply without a buffer id: %s", tl_reply_text(r));
	snprintf(id_out, RP_ID_MAX, "%s", tl_reply_str(r, "buffer"));
	return 0;
}
