/* SPDX-License-Identifier: Apache-2.0 */
/* The resource registry: see registry.h for the contract. */
#include <stdlib.h>
#include "daemon/registry.h"

void rd_registry_init(struct rd_registry *reg, int device)
{
	pthread_mutex_init(&reg->lock, NULL);
	reg->head = reg->tail = NULL;
	reg->count = 0;
	reg->device = device;
}

void rd_registry_finish(struct rd_registry *reg)
{
	rd_registry_release(reg);
	pthread_mutex_destroy(&reg->lock);
}

void rd_resource_register(struct rd_registry *reg, struct rd_resource *res, const struct rd_resource_ops *ops)
{
	res->ops = ops;
	res->registry = reg;
	res->init_count = 0;
	atomic_init(&res->valid, false);
	pthread_mutex_init(&res->lock, NULL);

	pthread_mutex_lock(&reg->lock);
	res->next = NULL;
	res->prev = reg->tail;
	if (reg->tail)
		reg->tail->next = res;
	else
		reg->head = res;
	reg->tail = res;
	reg->count++;
	pthread_mutex_unlock(&reg->lock);
}

/* Called with the resource's lock held. */
static void teardown_locked(struct rd_resource *res, bool context_usable)
{
	if (!atomic_load_explicit(&res->valid, memory_order_acquire))
		return;
	if (context_usable) {
		if (res->ops->release)
			res->ops->release(res);
	} else if (res->ops->invalidate) {
		res->ops->invalidate(res);
	}
	atomic_store_explicit(&res->valid, false, memory_order_release);
}

void rd_resource_unregister(struct rd_resource *res)
{
	struct rd_registry *reg = res->registry;

	if (!reg)
		return;
	pthread_mutex_lock(&reg->lock);
	if (res->prev)
		res->prev->next = res->next;
	else
		reg->head = res->next;
	if (res->next)
		res->next->prev = res->prev;
	else
		reg->tail = res->prev;
	reg->count--;
	pthread_mutex_unlock(&reg->lock);

	pthread_mutex_lock(&res->lock);
	teardown_locked(res, true);
	pthread_mutex_unlock(&res->lock);
	pthread_mutex_destroy(&res->lock);
	res->registry = NULL;
	res->prev = res->next = NULL;
}

int rd_resource_ensure_valid(struct rd_resource *res)
{
	int r = 0;

	/* The fast path is one acquire load: the common case on every call. */
	if (atomic_load_explicit(&res->valid, memory_order_acquire))
		return 0;
	pthread_mutex_lock(&res->lock);
	if (!atomic_load_explicit(&res->valid, memory_order_acquire)) {
		r = res->ops->init ? res->ops->init(res) : 0;
		if (r == 0) {
			res->init_count++;
			atomic_store_explicit(&res->valid, true, memory_order_release);
		}
	}
	pthread_mutex_unlock(&res->lock);
	return r;
}

static unsigned teardown_all(struct rd_registry *reg, bool context_usable)
{
	unsigned n = 0;

	/* The registry lock is held across the walk so nothing registers or
	 * unregisters underneath it; a resource's own lock keeps a concurrent
	 * ensure_valid from re-initialising it halfway. */
	pthread_mutex_lock(&reg->lock);
	for (struct rd_resource *res = reg->tail; res; res = res->prev) {
		pthread_mutex_lock(&res->lock);
		if (atomic_load_explicit(&res->valid, memory_order_acquire)) {
			teardown_locked(res, context_usable);
			n++;
		}
		pthread_mutex_unlock(&res->lock);
	}
	pthread_mutex_unlock(&reg->lock);
	return n;
}

unsigned rd_registry_release(struct rd_registry *reg)
{
	return teardown_all(reg, true);
}

unsigned rd_registry_invalidate(struct rd_registry *reg)
{
	return teardown_all(reg, false);
}

void rd_registry_foreach(struct rd_registry *reg, void (*fn)(struct rd_resource *res, void *data), void *data)
{
	pthread_mutex_lock(&reg->lock);
	for (struct rd_resource *res = reg->head; res; res = res->next)
		fn(res, data);
	pthread_mutex_unlock(&reg->lock);
}
