/* SPDX-License-Identifier: Apache-2.0 */
/* The one way a test starts regend: the binary of this build, in a fresh
 * temp dir of its own (socket, worker sockets, an empty configuration file
 * so that the host's never leaks in, the log), ready only when every device
 * serves. The log is printed (its tail) when the test fails, kept under
 * <build>/meson-logs/<program>-regend.log when the daemon stops, and the
 * daemon and its workers are killed when the test ends or times out. */
#pragma once

#include <stdbool.h>
#include <sys/types.h>

struct tl_daemon_opts {
	int devices;                  /* 0: 2 */
	const char *backend;          /* NULL: "host" */
	bool no_fault_injection;      /* leave --enable-fault-injection out */
	const char *admin_group;      /* --admin-group, or NULL */
	const char *const *extra;     /* more arguments, NULL-terminated (must outlive the daemon), or NULL */
	const char *config;           /* the configuration file's text, or NULL for an empty one */
	/* REGEN_DEBUG for regend unless the environment sets it; NULL: "I". */
	const char *debug;
	/* regend runs as pid 1 of a pid namespace of its own, so that every
	 * client is pid 0 to it (what a daemon in a container sees of the
	 * host's processes); the test exits 77 where it may not unshare. */
	bool pid_namespace;
	/* systemd's notify protocol as a unit with WatchdogSec= sees it:
	 * NOTIFY_SOCKET (a datagram socket the test bound), WATCHDOG_USEC and
	 * WATCHDOG_PID (regend's own pid). NULL: not under systemd. */
	const char *notify_socket;
	unsigned long watchdog_usec;
};

struct tl_daemon {
	pid_t pid;                    /* -1 once stopped */
	int exit_status;              /* once it exited: its status (128 + signal) */
	int ndevices;
	char dir[64];
	char sock[128];               /* main socket; device N's worker listens on sock.devN */
	char log[128];
	char config[128];
	char regend[512];
	char regenctl[512];           /* <build>/client/regenctl, for tests of it */
	struct tl_daemon_opts opts;
};

/* Exits 77 (skipped) when regend is not built. Needs tl_init first. */
void tl_daemon_start(struct tl_daemon *d, const struct tl_daemon_opts *opts);
/* SIGTERM, SIGKILL after 10 s, then the workers' process group; keeps the
 * log and removes the temp dir. Safe to call twice. */
void tl_daemon_stop(struct tl_daemon *d);
/* Stops regend (it must exit on SIGTERM within 10 s) and starts it again
 * with the same options on the same socket, the log appended to. */
void tl_daemon_restart(struct tl_daemon *d);
/* Polls the main socket until every device is ready and its worker socket
 * exists; fails the test after timeout_s (scaled). */
void tl_daemon_wait_ready(struct tl_daemon *d, double timeout_s);
/* False once the daemon process exited (which is logged). */
bool tl_daemon_alive(struct tl_daemon *d);
/* The last `lines` lines of the log on stderr. */
void tl_daemon_dump_log(const struct tl_daemon *d, int lines);
/* "<sock>.dev<N>" (a static buffer, one of four in turn). */
const char *tl_daemon_worker_socket(const struct tl_daemon *d, int device);
