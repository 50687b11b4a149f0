/* SPDX-License-Identifier: Apache-2.0 */
/* A bounded cache of plans (the CUDA backend's cuBLASLt GEMM plans), keyed
 * by a fixed-size byte key. A client that sends ever new shapes must not
 * grow the daemon without bound nor make every later call slower, so:
 *
 * - at most `max` entries stay cached; past it the least recently used
 *   entries nobody holds are taken out (rd_plan_cache_trim) for the owner
 *   to free;
 * - the lookup is a hash table (chained, doubled when the entries outgrow
 *   its buckets): its cost does not grow with the count;
 * - an entry is held (refs) from the lookup that returned it until
 *   rd_plan_cache_put: a held entry is never taken out, so nothing a call
 *   is using is freed under it;
 * - a new key is always added, even when every cached entry is held: the
 *   cache then stands over `max` by at most the entries held at once (one
 *   per thread inside a call), and the put that lets go of one trims it.
 *   A legal call is never refused because of the cache.
 *
 * No locking and no allocation of entries here: the owner calls under its
 * own lock, embeds struct rd_plan_entry in its plan, and frees what a trim
 * returns after dropping that lock. No CUDA here, so it is unit-tested
 * without a GPU (tests/unit/test_plan_cache.c). */
#pragma once

#include <stddef.h>
#include <stdint.h>

struct rd_plan_entry {
	const void *key;                       /* key_size bytes, in the owner's plan */
	uint64_t hash;
	unsigned refs;
	struct rd_plan_entry *chain;           /* the bucket's next */
	/* Most recently used first. A trim's victims are returned chained
	 * by next. */
	struct rd_plan_entry *prev, *next;
};

struct rd_plan_cache {
	size_t key_size;
	unsigned max;                          /* entries kept when none is held */
	unsigned count;                        /* entries cached now */
	struct rd_plan_entry **buckets;
	unsigned nbuckets;                     /* a power of two; 0 before the first add */
	struct rd_plan_entry *head, *tail;
};

/* max 0 is taken as 1: a cache that keeps nothing would build a plan for
 * every call. */
void rd_plan_cache_init(struct rd_plan_cache *c, size_t key_size, unsigned max);
/* Frees the table. The entries are the owner's: take them out first
 * (rd_plan_cache_take_all). */
void rd_plan_cache_finish(struct rd_plan_cache *c);

/* The hash rd_plan_cache_get and _add expect for a key of size bytes. */
uint64_t rd_plan_cache_hash(const void *key, size_t size);

/* The entry cached for key, now the most recently used and held; NULL if
 * there is none. */
struct rd_plan_entry *rd_plan_cache_get(struct rd_plan_cache *c, const void *key, uint64_t hash);
/* Caches e (not cached yet) for key, which must stay valid while e is
 * cached, as the most recently used and held. 0, or -ENOMEM when no table
 * could be made (nothing changed then). Call rd_plan_cache_trim after. */
int rd_plan_cache_add(struct rd_plan_cache *c, struct rd_plan_entry *e, const void *key, uint64_t hash);
/* Lets go of an entry rd_plan_cache_get or _add returned held. Call
 * rd_plan_cache_trim after. */
void rd_plan_cache_put(struct rd_plan_cache *c, struct rd_plan_entry *e);

/* While more than max are cached, takes out the least recently used
 * entries nobody holds and returns them chained by next (NULL: none), for
 * the owner to free. O(1) when the cache is within its limit. */
struct rd_plan_entry *rd_plan_cache_trim(struct rd_plan_cache *c);
/* A new limit (0: 1); the next trim applies it. */
void rd_plan_cache_set_max(struct rd_plan_cache *c, unsigned max);
/* Takes every entry out, held or not, chained by next: teardown, when no
 * call can hold one any more. */
struct rd_plan_entry *rd_plan_cache_take_all(struct rd_plan_cache *c);
