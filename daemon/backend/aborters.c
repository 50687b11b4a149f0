/* SPDX-License-Identifier: Apache-2.0 */
/* Aborter threads (aborters.h): a list of them under the set's own lock,
 * each marking itself done as its last act so that a reap joins only those
 * that will not block it. */
#include <stdlib.h>
#include "daemon/backend/aborters.h"

struct rd_aborter {
	pthread_t thread;
	struct rd_aborters *set;
	void (*fn)(void *arg);
	void *arg;
	bool done;                     /* under set->lock: the thread's last act */
	struct rd_aborter *next;
};

void rd_aborters_init(struct rd_aborters *as)
{
	pthread_mutex_init(&as->lock, NULL);
	pthread_cond_init(&as->finished, NULL);
	as->head = NULL;
}

void rd_aborters_finish(struct rd_aborters *as)
{
	rd_aborters_reap(as, true);
	pthread_cond_destroy(&as->finished);
	pthread_mutex_destroy(&as->lock);
}

static void *aborter_main(void *arg)
{
	struct rd_aborter *a = arg;
	struct rd_aborters *as = a->set;

	a->fn(a->arg);
	pthread_mutex_lock(&as->lock);
	a->done = true;
	pthread_cond_broadcast(&as->finished);
	pthread_mutex_unlock(&as->lock);
	return NULL;
}

void rd_aborters_run(struct rd_aborters *as, void (*fn)(void *arg), void *arg)
{
	struct rd_aborter *a = calloc(1, sizeof(*a));

	if (a) {
		a->set = as;
		a->fn = fn;
		a->arg = arg;
		/* Listed before the thread can mark itself done. */
		pthread_mutex_lock(&as->lock);
		if (pthread_create(&a->thread, NULL, aborter_main, a) == 0) {
			a->next = as->head;
			as->head = a;
			pthread_mutex_unlock(&as->lock);
			return;
		}
		pthread_mutex_unlock(&as->lock);
		free(a);
	}
	fn(arg);
}

void rd_aborters_reap(struct rd_aborters *as, bool all)
{
	struct rd_aborter *done = NULL;

	pthread_mutex_lock(&as->lock);
	for (;;) {
		bool running = false;

		for (struct rd_aborter **p = &as->head; *p;) {
			struct rd_aborter *a = *p;

			if (a->done) {
				*p = a->next;
				a->next = done;
				done = a;
			} else {
				running = true;
				p = &a->next;
			}
		}
		if (!all || !running)
			break;
		pthread_cond_wait(&as->finished, &as->lock);
	}
	pthread_mutex_unlock(&as->lock);
	/* Outside the lock: a thread marked done has nothing left to do but
	 * return, so the join is short. */
	while (done) {
		struct rd_aborter *a = done;

		done = a->next;
		pthread_join(a->thread, NULL);
		free(a);
	}
}
