/* SPDX-License-Identifier: Apache-2.0 */
#include <errno.h>
#include <string.h>
#include <time.h>
#include "daemon/program/compile_budget.h"
#include "proto/errors.h"

uint64_t rd_compile_clock_ns(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (uint64_t)ts.tv_sec * 1000000000u + (uint64_t)ts.tv_nsec;
}

void rd_compile_account_init(struct rd_compile_account *a, uid_t uid, int device, uint64_t budget_ns,
			     uint64_t modules_max, uint64_t now_ns)
{
	memset(a, 0, sizeof(*a));
	pthread_mutex_init(&a->lock, NULL);
	a->uid = uid;
	a->device = device;
	a->budget_ns = budget_ns;
	a->modules_max = modules_max;
	a->left_ns = (int64_t)budget_ns;
	a->refilled_ns = now_ns;
}

void rd_compile_account_finish(struct rd_compile_account *a)
{
	pthread_mutex_destroy(&a->lock);
}

/* Under the lock: left_ns as of now. */
static void refill(struct rd_compile_account *a, uint64_t now_ns)
{
	uint64_t elapsed = now_ns > a->refilled_ns ? now_ns - a->refilled_ns : 0;
	__int128 left = (__int128)a->left_ns + (__int128)elapsed * a->budget_ns / RD_COMPILE_REFILL_NS;

	a->left_ns = left >= (__int128)a->budget_ns ? (int64_t)a->budget_ns : (int64_t)left;
	a->refilled_ns = now_ns;
}

/* Under the lock: spends ns (past 0: owed); true when nothing is left. */
static bool spend(struct rd_compile_account *a, uint64_t ns)
{
	a->compile_ns += ns;
	a->left_ns = ns > (uint64_t)INT64_MAX / 2 ? INT64_MIN / 2 : a->left_ns - (int64_t)ns;
	return a->left_ns <= 0;
}

static void time_error(const struct rd_compile_account *a, struct rp_error *err)
{
	unsigned long long limit_ms = (unsigned long long)(a->budget_ns / 1000000);

	rp_err_limit_exceeded(err, "compile time per uid", (long long)limit_ms,
			      "uid %u's programs took the %llu ms of kernel compiles (NVRTC) they may take on device %d "
			      "(max_uid_compile_ms, given back at %llu ms an hour): nothing ran; run it again later, "
			      "define fewer or smaller programs, or raise max_uid_compile_ms",
			      (unsigned)a->uid, limit_ms, a->device, limit_ms);
}

int rd_compile_begin(struct rd_compile *c, struct rd_compile_account *a, uint64_t now_ns, struct rp_error *err)
{
	bool empty = false;

	c->account = a;
	c->started_ns = c->last_ns = now_ns;
	c->stopped = false;
	if (!a)
		return 0;
	pthread_mutex_lock(&a->lock);
	refill(a, now_ns);
	empty = a->left_ns <= 0;
	if (empty)
		time_error(a, err);
	pthread_mutex_unlock(&a->lock);
	return empty ? -EDQUOT : 0;
}

/* Charges the time since the last tick; true when nothing is left. */
static bool charge(struct rd_compile *c, uint64_t now_ns)
{
	struct rd_compile_account *a = c->account;
	bool empty;

	pthread_mutex_lock(&a->lock);
	refill(a, now_ns);
	empty = spend(a, now_ns > c->last_ns ? now_ns - c->last_ns : 0);
	pthread_mutex_unlock(&a->lock);
	c->last_ns = now_ns;
	return empty;
}

bool rd_compile_tick(struct rd_compile *c, uint64_t now_ns)
{
	if (!c->account)
		return false;
	if (charge(c, now_ns))
		c->stopped = true;
	return c->stopped;
}

int rd_compile_end(struct rd_compile *c, uint64_t now_ns, uint64_t *spent_ns, struct rp_error *err)
{
	struct rd_compile_account *a = c->account;
	bool stopped = c->stopped;

	/* NVRTC's time to wind down after a stop is its time too. */
	if (a)
		charge(c, now_ns);
	c->last_ns = now_ns;
	if (spent_ns)
		*spent_ns = now_ns > c->started_ns ? now_ns - c->started_ns : 0;
	if (!stopped)
		return 0;
	pthread_mutex_lock(&a->lock);
	time_error(a, err);
	pthread_mutex_unlock(&a->lock);
	return -EDQUOT;
}

int rd_compile_hold(struct rd_compile_account *a, uint64_t bytes, struct rp_error *err)
{
	int r = 0;

	if (!a)
		return 0;
	pthread_mutex_lock(&a->lock);
	if (bytes > a->modules_max || a->module_bytes > a->modules_max - bytes) {
		rp_err_limit_exceeded(err, "compiled module bytes per uid", (long long)a->modules_max,
				      "uid %u's programs hold %llu bytes of compiled kernels on device %d, and this "
				      "program's next takes %llu more, past max_uid_module_mib (%llu MiB): nothing ran; "
				      "Drop programs first, define smaller ones, or raise max_uid_module_mib",
				      (unsigned)a->uid, (unsigned long long)a->module_bytes, a->device,
				      (unsigned long long)bytes, (unsigned long long)(a->modules_max >> 20));
		r = -EDQUOT;
	} else {
		a->module_bytes += bytes;
	}
	pthread_mutex_unlock(&a->lock);
	return r;
}

void rd_compile_release(struct rd_compile_account *a, uint64_t bytes)
{
	if (!a)
		return;
	pthread_mutex_lock(&a->lock);
	a->module_bytes -= bytes < a->module_bytes ? bytes : a->module_bytes;
	pthread_mutex_unlock(&a->lock);
}
