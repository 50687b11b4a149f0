/* SPDX-License-Identifier: Apache-2.0 */
/* The resource registry of one device (seed 000, with its review folded in).
 *
 * Every native object the worker makes (lane queues and streams, library
 * handles, plans, pools, buffer mappings) embeds a struct rd_resource.
 * Creating it registers it: there is no separate bind step. Before every
 * use, rd_resource_ensure_valid() re-runs init if a release or reset left it
 * invalid. Release and reset walk the registry in reverse registration order,
 * so a resource is torn down before the ones it was built on. */
#pragma once

#include <pthread.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdint.h>

struct rd_resource;
struct rd_registry;

struct rd_resource_ops {
	const char *kind;     /* for logs: "lane", "cublaslt_handle", ... */
	/* Build the native state. 0 or -errno. Called with the resource's lock held. */
	int (*init)(struct rd_resource *res);
	/* The context is usable: destroy the native state properly, free device memory. */
	void (*release)(struct rd_resource *res);
	/* The context is lost: forget native handles. Never block, never call into
	 * the dead context unless the API is documented safe then. */
	void (*invalidate)(struct rd_resource *res);
};

struct rd_resource {
	const struct rd_resource_ops *ops;
	struct rd_registry *registry;
	struct rd_resource *prev, *next;   /* registration order */
	pthread_mutex_t lock;
	atomic_bool valid;
	uint64_t init_count;               /* how often init ran: tests read it */
};

struct rd_registry {
	pthread_mutex_t lock;
	struct rd_resource *head, *tail;
	unsigned count;
	int device;
};

void rd_registry_init(struct rd_registry *reg, int device);
/* Releases whatever is still registered and valid (process exit path). */
void rd_registry_finish(struct rd_registry *reg);

/* Registers res at the tail. The resource starts invalid: its first
 * ensure_valid() builds it. `ops` must outlive the resource. */
void rd_resource_register(struct rd_registry *reg, struct rd_resource *res, const struct rd_resource_ops *ops);
/* Releases res if valid, then removes it from the registry. */
void rd_resource_unregister(struct rd_resource *res);

/* Lazy, thread-safe: init once if invalid. 0 or init's -errno. */
int rd_resource_ensure_valid(struct rd_resource *res);
static inline bool rd_resource_is_valid(struct rd_resource *res)
{
	return atomic_load_explicit(&res->valid, memory_order_acquire);
}

/* Walk in reverse registration order: release (or invalidate) every valid
 * resource and mark it invalid. Returns how many were torn down. */
unsigned rd_registry_release(struct rd_registry *reg);
unsigned rd_registry_invalidate(struct rd_registry *reg);

/* Visits resources in registration order (tests, Stats). */
void rd_registry_foreach(struct rd_registry *reg, void (*fn)(struct rd_resource *res, void *data), void *data);
