/* SPDX-License-Identifier: Apache-2.0 */
/* What the C benchmarks share: a regend child of their own (started in a
 * fresh temporary directory, its output in a log there, always stopped and
 * the directory removed at exit), a death that says whose, a clock, and
 * percentiles. */
#ifndef REGEN_BENCH_DAEMON_H
#define REGEN_BENCH_DAEMON_H

#include <stddef.h>
#include <sys/types.h>
#include "regen.h"

/* Names the benchmark (die()'s prefix), makes the temporary directory and
 * registers the clean-up. Call first. */
void bench_init(const char *name);

void bench_die(const char *fmt, ...) __attribute__((format(printf, 1, 2), noreturn));
/* bench_die with libregen's error for `r` (and the regend log). */
void bench_die_regen(regen_client *c, const char *what, int r) __attribute__((noreturn));

double bench_now_s(void);

/* Starts `regend --socket DIR/regend.sock --backend BACKEND --devices 1`
 * with stdin from /dev/null and its output in DIR/regend.log. */
void bench_start_regend(const char *regend, const char *backend);
/* Connects (retrying up to `seconds`) until device 0 is `ready`; dies with
 * the log when regend exits or the time runs out. */
regen_client *bench_wait_ready(double seconds);

const char *bench_tmp_dir(void);
const char *bench_socket(void);
const char *bench_log(void);
pid_t bench_regend_pid(void);
/* regend's log to stderr (what a failure shows). */
void bench_dump_log(void);

/* SIGTERM, up to 10 s for it to go, then SIGKILL; *pid becomes -1. */
void bench_stop_child(pid_t *pid);

/* Sorts `us` (n > 0 samples, µs) and summarizes it. */
struct bench_stats {
	double p50, p99, min, mean;
};
struct bench_stats bench_summarize(double *us, size_t n);

#endif
