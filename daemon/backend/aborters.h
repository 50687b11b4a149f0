/* SPDX-License-Identifier: Apache-2.0 */
/* Aborter threads: an end that may take long (an ncclCommAbort whose peers
 * or device may be gone, or the host backend's stand-in for one) runs on a
 * thread of its own, so that whoever asks for it (the loop, a lane, a
 * watch) never waits for it. The owner joins the threads that finished
 * now and then, and waits for those still running only where it must: a
 * lifecycle change (the context must not be reset under an abort, and a
 * release gives back the memory the aborts free). The CUDA and the host
 * backends' communicators keep one set each. */
#pragma once

#include <pthread.h>
#include <stdbool.h>

struct rd_aborter;

struct rd_aborters {
	pthread_mutex_t lock;
	pthread_cond_t finished;       /* an aborter finished */
	struct rd_aborter *head;       /* under lock: those not joined yet */
};

#define RD_ABORTERS_INIT { PTHREAD_MUTEX_INITIALIZER, PTHREAD_COND_INITIALIZER, NULL }

void rd_aborters_init(struct rd_aborters *as);

/* Joins every aborter, waiting for those still running. */
void rd_aborters_finish(struct rd_aborters *as);

/* Runs fn(arg) on an aborter thread of its own; in the caller, before it
 * returns, when no thread can be had (out of memory). Any thread, holding
 * no lock that fn takes. */
void rd_aborters_run(struct rd_aborters *as, void (*fn)(void *arg), void *arg);

/* Joins the aborters that finished; with `all`, waits for those still
 * running too. No lock held that an aborter takes. */
void rd_aborters_reap(struct rd_aborters *as, bool all);
