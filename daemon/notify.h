/* SPDX-License-Identifier: Apache-2.0 */
/* systemd's notify protocol (Type=notify) through libsystemd where present;
 * each call does nothing without it or outside systemd. */
#pragma once

#include <uv.h>

void rd_notify_ready(void);
void rd_notify_statusf(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
void rd_notify_stopping(void);
/* WATCHDOG=1 heartbeats at half of WatchdogSec, when the service has one. */
void rd_notify_watchdog_start(uv_loop_t *loop);
void rd_notify_close(void);
/* Socket activation: the first passed fd, or -1. */
int rd_notify_listen_fd(void);
