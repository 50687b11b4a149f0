/* SPDX-License-Identifier: Apache-2.0 */
#include <stdarg.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
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

int rd_notify_listen_fd(void)
{
#if REGEN_HAVE_SYSTEMD
	if (sd_listen_fds(1) >= 1)
		return SD_LISTEN_FDS_START;
#endif
	return -1;
}
