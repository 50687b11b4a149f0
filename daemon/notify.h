/* SPDX-License-Identifier: Apache-2.0 */
/* systemd's notify protocol (Type=notify) through libsystemd where present;
 * each call does nothing without it or outside systemd. */
#pragma once

#include <stdbool.h>
#include <uv.h>

void rd_notify_ready(void);
void rd_notify_statusf(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
void rd_notify_stopping(void);
/* WATCHDOG=1 heartbeats at half of WatchdogSec, when the service has one. */
void rd_notify_watchdog_start(uv_loop_t *loop);
void rd_notify_close(void);

/* What the service manager passed at start, each fd with its name (its
 * LISTEN_FDNAMES entry; "unknown" where it gave none): the socket of
 * socket activation, and what the fd store kept across a restart
 * (regend's kept state, daemon/supervisor/keep_store.h). Every fd is
 * close-on-exec (the workers never see them); LISTEN_* are unset. A user
 * of an fd sets its entry to -1; rd_passed_fds_close closes the rest. */
struct rd_passed_fds {
	int n;
	int *fds;
	char **names;
};
void rd_passed_fds_take(struct rd_passed_fds *out);
/* The listening socket among them, taken out (-1 when there is none): the
 * first fd that is a socket in the listening state. */
int rd_passed_fds_listen_fd(struct rd_passed_fds *p);
/* Closes what nobody took, naming each in a warning, and frees the rest. */
void rd_passed_fds_close(struct rd_passed_fds *p);

/* The fd store (FileDescriptorStoreMax= in the unit): whether a service
 * manager keeps one for regend ($NOTIFY_SOCKET set, and $FDSTORE, which
 * systemd 254 and later set to FileDescriptorStoreMax=, not 0), and how
 * many fds it holds at most (UINT_MAX when it does not say). */
bool rd_notify_fd_store_available(unsigned *max_fds);
/* FDSTORE=1 with FDNAME=name (FDPOLL=0: systemd must not drop a memory
 * fd for what polling it says); the manager keeps a duplicate of fd and
 * passes it back at regend's next start. FDSTOREREMOVE=1: it closes every
 * fd stored under name. Negative errno when the message cannot be sent. */
int rd_notify_fd_store(int fd, const char *name);
int rd_notify_fd_store_remove(const char *name);
