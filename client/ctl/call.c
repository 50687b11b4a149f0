/* SPDX-License-Identifier: Apache-2.0 */
#include <errno.h>
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <time.h>
#include <unistd.h>
#include <cjson/cJSON.h>
#include "client/ctl/call.h"
#include "proto/text.h"

/* The largest reply regenctl takes, as libregen. */
#define REPLY_MAX (16u << 20)

static double now_s(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

/* timeout_s > 0 bounds the connect too: a Unix socket's blocking connect
 * to a full backlog waits (for SO_SNDTIMEO), and --timeout must hold. */
static int connect_to(const char *path, double timeout_s)
{
	struct sockaddr_un sa = { .sun_family = AF_UNIX };
	int fd;

	if (strlen(path) >= sizeof(sa.sun_path))
		return -ENAMETOOLONG;
	memcpy(sa.sun_path, path, strlen(path) + 1);
	fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
	if (fd < 0)
		return -errno;
	if (timeout_s > 0) {
		struct timeval tv = { .tv_sec = (time_t)timeout_s,
				      .tv_usec = (suseconds_t)((timeout_s - (double)(time_t)timeout_s) * 1e6) };
		(void)setsockopt(fd, SOL_SOCKET, SO_SNDTIMEO, &tv, sizeof(tv));
	}
	if (connect(fd, (struct sockaddr *)&sa, sizeof(sa)) < 0) {
		int r = -errno;
		close(fd);
		return r;
	}
	return fd;
}

static int send_all(int fd, const char *data, size_t len)
{
	while (len > 0) {
		ssize_t n = send(fd, data, len, MSG_NOSIGNAL);

		if (n < 0 && errno == EINTR)
			continue;
		if (n < 0)
			return -errno;
		data += n;
		len -= (size_t)n;
	}
	return 0;
}

/* Reads the next NUL-terminated message into *buf (grown as needed);
 * *have counts what is buffered, the message is *buf up to its NUL. */
static int read_message(int fd, char **buf, size_t *have, size_t *cap, double deadline, size_t *msg_len)
{
	for (;;) {
		char *nul = *have ? memchr(*buf, '\0', *have) : NULL;
		struct pollfd p = { .fd = fd, .events = POLLIN };
		int wait_ms = -1;
		ssize_t n;

		if (nul) {
			*msg_len = (size_t)(nul - *buf);
			return 0;
		}
		if (*have == *cap) {
			char *grown;

			if (*cap >= REPLY_MAX)
				return -EMSGSIZE;
			grown = realloc(*buf, *cap * 2);
			if (!grown)
				return -ENOMEM;
			*buf = grown;
			*cap *= 2;
		}
		if (deadline > 0) {
			double left = deadline - now_s();
			if (left <= 0)
				return -ETIMEDOUT;
			wait_ms = (int)(left * 1000.0) + 1;
		}
		n = poll(&p, 1, wait_ms);
		if (n < 0 && errno == EINTR)
			continue;
		if (n < 0)
			return -errno;
		if (n == 0)
			return -ETIMEDOUT;
		n = recv(fd, *buf + *have, *cap - *have, 0);
		if (n < 0 && errno == EINTR)
			continue;
		if (n < 0)
			return -errno;
		if (n == 0)
			return -ECONNRESET;
		*have += (size_t)n;
	}
}

int ctl_call(const char *socket_path, const char *method, const char *params_json, bool more, double timeout_s,
	     char *err_name, size_t err_len)
{
	cJSON *msg = cJSON_CreateObject(), *params = params_json ? cJSON_Parse(params_json) : NULL;
	size_t have = 0, cap = 4096, len = 0;
	char *text = NULL, *buf = malloc(cap);
	double deadline = timeout_s > 0 ? now_s() + timeout_s : 0;
	int fd = -1, r;

	err_name[0] = '\0';
	if (!msg || !buf || (params_json && !params)) {
		r = -ENOMEM;
		goto out;
	}
	cJSON_AddStringToObject(msg, "method", method);
	if (params) {
		cJSON_AddItemToObject(msg, "parameters", params);
		params = NULL;
	}
	if (more)
		cJSON_AddBoolToObject(msg, "more", 1);
	text = cJSON_PrintUnformatted(msg);
	fd = connect_to(socket_path, timeout_s);
	if (!text || fd < 0) {
		r = text ? fd : -ENOMEM;
		goto out;
	}
	r = send_all(fd, text, strlen(text) + 1);
	while (r == 0) {
		cJSON *reply, *error, *rparams;
		char *line, *printed;
		bool continues;

		r = read_message(fd, &buf, &have, &cap, deadline, &len);
		if (r < 0)
			break;
		reply = cJSON_ParseWithLength(buf, len);
		memmove(buf, buf + len + 1, have - len - 1);
		have -= len + 1;
		if (!cJSON_IsObject(reply)) {
			cJSON_Delete(reply);
			r = -EBADMSG;
			break;
		}
		error = cJSON_GetObjectItemCaseSensitive(reply, "error");
		rparams = cJSON_GetObjectItemCaseSensitive(reply, "parameters");
		continues = cJSON_IsTrue(cJSON_GetObjectItemCaseSensitive(reply, "continues"));
		/* What a terminal would act on, escaped (proto/text.h): regend's
		 * replies carry clients' words. */
		printed = rparams ? cJSON_PrintUnformatted(rparams) : NULL;
		line = printed ? rp_text_escape_dup(printed, RP_TEXT_JSON) : NULL;
		free(printed);
		if (cJSON_IsString(error)) {
			char name[256];

			snprintf(err_name, err_len, "%s", error->valuestring);
			rp_text_escape(error->valuestring, RP_TEXT_LINE, name, sizeof(name));
			fprintf(stderr, "regenctl: call: %s %s\n", name, line ? line : "{}");
			r = -EREMOTE;
		} else {
			printf("%s\n", line ? line : "{}");
			fflush(stdout);
		}
		free(line);
		cJSON_Delete(reply);
		if (r == 0 && !continues)
			break;
	}
out:
	if (fd >= 0)
		close(fd);
	cJSON_Delete(params);
	cJSON_Delete(msg);
	free(text);
	free(buf);
	return r;
}
