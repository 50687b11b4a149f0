/* SPDX-License-Identifier: Apache-2.0 */
#include <errno.h>
#include <limits.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>
#include "daemon/log.h"
#include "daemon/notify.h"
#include "regen-config.h"
#if REGEN_HAVE_SYSTEMD
#include <systemd/sd-daemon.h>
#endif

static uv_timer_t watchdog;
static bool watchdog_on;
static bool ready_sent;

void rd_notify_ready(void)
{
#if REGEN_HAVE_SYSTEMD
	if (!ready_sent)
		sd_notify(0, "READY=1");
#endif
	ready_sent = true;
}

void rd_notify_statusf(const char *fmt, ...)
{
#if REGEN_HAVE_SYSTEMD
	char buf[256];
	va_list ap;
	va_start(ap, fmt);
	vsnprintf(buf, sizeof(buf), fmt, ap);
	va_end(ap);
	sd_notifyf(0, "STATUS=%s", buf);
#else
	(void)fmt;
#endif
}

void rd_notify_stopping(void)
{
#if REGEN_HAVE_SYSTEMD
	sd_notify(0, "STOPPING=1");
#endif
}

#if REGEN_HAVE_SYSTEMD
/* A timer of the supervisor's loop, not a thread of its own: WATCHDOG=1
 * says that loop turns, which a thread could not. Clients cannot delay it:
 * the loop runs its timers at the start of every turn, and a turn serves
 * clients a bounded number of messages (daemon/conn.c), so the ping is at
 * most one turn late however many clients call. */
static void on_watchdog(uv_timer_t *t)
{
	sd_notify(0, "WATCHDOG=1");
}
#endif

void rd_notify_watchdog_start(uv_loop_t *loop)
{
#if REGEN_HAVE_SYSTEMD
	uint64_t usec = 0;
	if (sd_watchdog_enabled(0, &usec) > 0 && usec > 0) {
		uv_timer_init(loop, &watchdog);
		uv_timer_start(&watchdog, on_watchdog, usec / 2000, usec / 2000);
		watchdog_on = true;
	}
#else
	(void)loop;
#endif
}

void rd_notify_close(void)
{
	if (watchdog_on) {
		uv_timer_stop(&watchdog);
		uv_close((uv_handle_t *)&watchdog, NULL);
		watchdog_on = false;
	}
}

void rd_passed_fds_take(struct rd_passed_fds *out)
{
	memset(out, 0, sizeof(*out));
#if REGEN_HAVE_SYSTEMD
	char **names = NULL;
	int n = sd_listen_fds_with_names(1, &names);

	if (n > 0) {
		out->fds = calloc((size_t)n, sizeof(*out->fds));
		out->names = calloc((size_t)n, sizeof(*out->names));
	}
	if (n > 0 && (!out->fds || !out->names)) {
		rd_err("notify", -1, 0, 0, "no memory for the %d fds the service manager passed: closed", n);
		for (int i = 0; i < n; i++)
			close(SD_LISTEN_FDS_START + i);
		free(out->fds);
		free(out->names);
		memset(out, 0, sizeof(*out));
		n = 0;
	}
	for (int i = 0; i < n; i++) {
		out->fds[i] = SD_LISTEN_FDS_START + i;
		out->names[i] = names ? names[i] : NULL;
		if (names)
			names[i] = NULL;
	}
	out->n = n > 0 ? n : 0;
	for (int i = 0; names && names[i]; i++)
		free(names[i]);
	free(names);
#endif
}

int rd_passed_fds_listen_fd(struct rd_passed_fds *p)
{
	for (int i = 0; i < p->n; i++) {
		int accepting = 0;
		socklen_t len = sizeof(accepting);

		if (p->fds[i] < 0 || getsockopt(p->fds[i], SOL_SOCKET, SO_ACCEPTCONN, &accepting, &len) < 0 || !accepting)
			continue;
		int fd = p->fds[i];
		p->fds[i] = -1;
		return fd;
	}
	return -1;
}

void rd_passed_fds_close(struct rd_passed_fds *p)
{
	for (int i = 0; i < p->n; i++) {
		if (p->fds[i] >= 0) {
			rd_warn("notify", -1, 0, 0, "fd %d the service manager passed (named '%s') is not one regend "
				"uses: closed", p->fds[i], p->names && p->names[i] ? p->names[i] : "unknown");
			close(p->fds[i]);
		}
		if (p->names)
			free(p->names[i]);
	}
	free(p->fds);
	free(p->names);
	memset(p, 0, sizeof(*p));
}

bool rd_notify_fd_store_available(unsigned *max_fds)
{
	const char *text = getenv("FDSTORE");

	*max_fds = UINT_MAX;
#if REGEN_HAVE_SYSTEMD
	const char *sock = getenv("NOTIFY_SOCKET");
	if (!sock || !sock[0])
		return false;
	if (text && text[0]) {
		char *end;
		unsigned long v = strtoul(text, &end, 10);
		if (*end || v == 0)
			return false;
		*max_fds = v > UINT_MAX ? UINT_MAX : (unsigned)v;
	}
	return true;
#else
	(void)text;
	return false;
#endif
}

int rd_notify_fd_store(int fd, const char *name)
{
#if REGEN_HAVE_SYSTEMD
	char msg[320];

	snprintf(msg, sizeof(msg), "FDSTORE=1\nFDNAME=%s\nFDPOLL=0", name);
	int r = sd_pid_notify_with_fds(0, 0, msg, &fd, 1);
	return r > 0 ? 0 : r < 0 ? r : -ENOTCONN;
#else
	(void)fd;
	(void)name;
	return -ENOTSUP;
#endif
}

int rd_notify_fd_store_remove(const char *name)
{
#if REGEN_HAVE_SYSTEMD
	int r = sd_notifyf(0, "FDSTOREREMOVE=1\nFDNAME=%s", name);
	return r > 0 ? 0 : r < 0 ? r : -ENOTCONN;
#else
	(void)name;
	return -ENOTSUP;
#endif
}
