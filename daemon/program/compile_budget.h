/* SPDX-License-Identifier: Apache-2.0 */
/* What compiling programs' kernels may cost one uid on a device, so that a
 * client cannot take the worker's CPU or memory by defining many programs
 * whose kernels are slow to compile or large (issue 29's hostile client):
 *
 * - compile time: a budget of max_uid_compile_ms of NVRTC's time, refilled
 *   at that many ms an hour (a bucket: a job's first compiles of a day take
 *   it whole, and a uid that compiles on and on gets max_uid_compile_ms an
 *   hour). A compile is charged as it runs, shared by the uid's compiles on
 *   every lane, and stopped where the budget runs out (NVRTC's flow
 *   callback asks rd_compile_tick); one that finds it empty does not start.
 *   What a compile takes past the budget before it is stopped is owed: the
 *   next starts once the hour's refill paid it back.
 * - compiled modules: the bytes of the images the uid's programs hold at
 *   once, at most max_uid_module_mib; each image counts once, for its host
 *   copy and for the module loaded from it. Given back when its program
 *   goes.
 *
 * Past either, the Run that needed the kernels fails with
 * io.regen.LimitExceeded {resource: "compile time per uid", limit: ms} or
 * {resource: "compiled module bytes per uid", limit: bytes}, and nothing of
 * it ran. The core keeps an account per uid and device (the worker's), and
 * hands each program its owner's (struct rd_program.compile); a backend
 * that compiles charges it. Thread-safe: a lane's thread compiles. No CUDA
 * here. */
#pragma once

#include <pthread.h>
#include <stdbool.h>
#include <stdint.h>
#include <sys/types.h>
#include "proto/message.h"

#define RD_COMPILE_REFILL_NS (UINT64_C(3600) * 1000000000)

struct rd_compile_account {
	pthread_mutex_t lock;
	uid_t uid;
	int device;                     /* for the messages */
	uint64_t budget_ns;             /* max_uid_compile_ms, refilled over RD_COMPILE_REFILL_NS */
	uint64_t modules_max;           /* max_uid_module_mib, in bytes */
	/* Under lock. */
	int64_t left_ns;                /* compile time left now; below 0: owed */
	uint64_t refilled_ns;           /* when left_ns was last brought up to date */
	uint64_t module_bytes;          /* held by the uid's programs now */
	uint64_t compile_ns;            /* spent in all (for the log and tests) */
	struct rd_compile_account *next;   /* the core's list */
};

/* The clock accounts count in: CLOCK_MONOTONIC, ns. */
uint64_t rd_compile_clock_ns(void);

void rd_compile_account_init(struct rd_compile_account *a, uid_t uid, int device, uint64_t budget_ns,
			     uint64_t modules_max, uint64_t now_ns);
void rd_compile_account_finish(struct rd_compile_account *a);

/* One compile, on one thread, from rd_compile_begin to rd_compile_end. */
struct rd_compile {
	struct rd_compile_account *account;   /* NULL: nothing charged, never stopped */
	uint64_t started_ns, last_ns;
	bool stopped;                   /* the budget ran out while it ran */
};

/* 0, or -EDQUOT with err set (LimitExceeded, compile time per uid) when
 * the uid has no compile time left: the compile must not start. */
int rd_compile_begin(struct rd_compile *c, struct rd_compile_account *a, uint64_t now_ns, struct rp_error *err);
/* Charges the time since the last tick. True when the compile must stop
 * now (its uid's budget ran out), and from then on. */
bool rd_compile_tick(struct rd_compile *c, uint64_t now_ns);
/* The compile ended, whole or not: the rest is charged. *spent_ns (may be
 * NULL) its whole time. -EDQUOT with err set when the budget stopped it,
 * else 0. */
int rd_compile_end(struct rd_compile *c, uint64_t now_ns, uint64_t *spent_ns, struct rp_error *err);

/* An image of `bytes` for a program of a's uid: 0, or -EDQUOT with err set
 * (LimitExceeded, compiled module bytes per uid) when it would take the
 * uid past its bound. a NULL: 0. */
int rd_compile_hold(struct rd_compile_account *a, uint64_t bytes, struct rp_error *err);
/* Gives back what rd_compile_hold took. a NULL: nothing. */
void rd_compile_release(struct rd_compile_account *a, uint64_t bytes);
