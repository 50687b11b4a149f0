/* SPDX-License-Identifier: Apache-2.0 */
/* The test process: one overall time limit, failures that say where and
 * why, forked helper processes and programs run with their output captured.
 *
 * Exit codes, as meson reads them: 0 pass, 1 fail, 77 skipped. Every wait
 * has a deadline, and every deadline is multiplied by
 * $REGEN_TEST_TIMEOUT_MULTIPLIER (default 1) for slow machines (sanitizers,
 * valgrind, a busy CI), as libuv's UV_TEST_TIMEOUT_MULTIPLIER does; meson's
 * own limit is scaled by `meson test --timeout-multiplier`. */
#pragma once

#include <stdarg.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <sys/types.h>

#define TL_SKIP 77

/* First call of a test program: ignores SIGPIPE (a peer that goes away is an
 * error return, not a signal), arms an overall alarm of limit_s seconds
 * (scaled) after which every process the test started is killed and the
 * test fails, and seeds the random numbers (the seed is printed). */
void tl_init(unsigned limit_s);

/* $REGEN_TEST_TIMEOUT_MULTIPLIER, read once. */
double tl_timeout_multiplier(void);
/* seconds * the multiplier. */
double tl_timeout(double seconds);
/* Monotonic seconds. */
double tl_now(void);

/* "[pid 123.456] message" on stderr. */
void tl_log(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
/* Prints "SKIP: ..." and exits 77. */
void tl_skip(const char *fmt, ...) __attribute__((format(printf, 1, 2), noreturn));
/* Prints "FAIL file:line: what: message", runs the failure hooks (the
 * daemon's log tail) in the process that called tl_init, and exits 1. The
 * assertions of asserts.h end here. */
void tl_fail(const char *file, int line, const char *what, const char *fmt, ...)
	__attribute__((format(printf, 4, 5), noreturn));
void tl_failv(const char *file, int line, const char *what, const char *fmt, va_list ap)
	__attribute__((format(printf, 4, 0), noreturn));

/* Run on a failure in the main test process, before it exits: what helps
 * to read the failure (a log tail). At most 4. */
void tl_on_failure(void (*fn)(void));
/* Run when the overall alarm fires: kill what the test started.
 * Async-signal-safe code only. At most 4. */
void tl_on_alarm(void (*fn)(void));
/* Whether this is the process that called tl_init (not a forked helper). */
bool tl_is_main_process(void);

/* The build tree: $REGEN_TEST_BUILD_ROOT, else three levels above this
 * program (<build>/tests/<suite>/<program>). */
const char *tl_build_root(void);

/* Forks fn(arg) in a child that exits with fn's value; the child has its
 * own alarm of limit_s seconds (scaled; 0: none, the parent's wait bounds
 * it) and its own random seed. The
 * children still running when the main process fails or times out are
 * killed. */
pid_t tl_fork(int (*fn)(void *), void *arg, unsigned limit_s);
/* Exit status of one child (128 + signal for a signal); fails the test
 * when it runs past timeout_s (scaled), after killing it. */
int tl_wait(pid_t pid, double timeout_s);
/* Waits for n children; those still running after timeout_s (scaled) are
 * killed. Returns how many failed (non-zero exit, signal or timeout),
 * each logged. */
int tl_wait_children(const pid_t *pids, int n, double timeout_s);

/* Runs argv[0] with stdout and stderr captured (malloc'ed, never NULL when
 * asked for). as_uid >= 0: drops to that uid and as_gid, without
 * supplementary groups, before exec. Returns the exit status, or -1 for a
 * signal or the timeout (scaled). */
int tl_run(char *const argv[], char **out, char **err, double timeout_s, int as_uid, int as_gid);
