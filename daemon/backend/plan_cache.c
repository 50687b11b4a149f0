/* SPDX-License-Identifier: Apache-2.0 */
/* The bounded plan cache: see plan_cache.h for the contract. */
#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include "daemon/backend/plan_cache.h"

/* Buckets of the first table; it doubles whenever the entries outnumber
 * its buckets, so a chain stays about one entry long. */
#define PLAN_CACHE_BUCKETS_MIN 64

void rd_plan_cache_init(struct rd_plan_cache *c, size_t key_size, unsigned max)
{
	memset(c, 0, sizeof(*c));
	c->key_size = key_size;
	c->max = max ? max : 1;
}

void rd_plan_cache_finish(struct rd_plan_cache *c)
{
	free(c->buckets);
	c->buckets = NULL;
	c->nbuckets = 0;
	c->head = c->tail = NULL;
	c->count = 0;
}

/* Eight bytes at a time (a GEMM key is 120): a multiply and a shift per
 * word, then a finalizer so that the low bits, which pick the bucket,
 * depend on every byte. */
uint64_t rd_plan_cache_hash(const void *key, size_t size)
{
	const unsigned char *p = key;
	uint64_t h = 0x9e3779b97f4a7c15ull ^ size;
	uint64_t w;

	for (; size >= sizeof(w); p += sizeof(w), size -= sizeof(w)) {
		memcpy(&w, p, sizeof(w));
		h = (h ^ w) * 0xff51afd7ed558ccdull;
		h ^= h >> 32;
	}
	if (size) {
		w = 0;
		memcpy(&w, p, size);
		h = (h ^ w) * 0xff51afd7ed558ccdull;
		h ^= h >> 32;
	}
	h ^= h >> 29;
	h *= 0xbf58476d1ce4e5b9ull;
	h ^= h >> 32;
	return h;
}

static struct rd_plan_entry **bucket_of(struct rd_plan_cache *c, uint64_t hash)
{
	return &c->buckets[hash & (c->nbuckets - 1)];
}

/* A table of n buckets, the cached entries moved into it. Fails (and
 * leaves the old one, whose chains are only longer) on ENOMEM. */
static int rehash(struct rd_plan_cache *c, unsigned n)
{
	struct rd_plan_entry **b = calloc(n, sizeof(*b));

	if (!b)
		return -ENOMEM;
	free(c->buckets);
	c->buckets = b;
	c->nbuckets = n;
	for (struct rd_plan_entry *e = c->head; e; e = e->next) {
		struct rd_plan_entry **slot = bucket_of(c, e->hash);
		e->chain = *slot;
		*slot = e;
	}
	return 0;
}

static void lru_unlink(struct rd_plan_cache *c, struct rd_plan_entry *e)
{
	if (e->prev)
		e->prev->next = e->next;
	else
		c->head = e->next;
	if (e->next)
		e->next->prev = e->prev;
	else
		c->tail = e->prev;
	e->prev = e->next = NULL;
}

static void lru_push_front(struct rd_plan_cache *c, struct rd_plan_entry *e)
{
	e->prev = NULL;
	e->next = c->head;
	if (c->head)
		c->head->prev = e;
	else
		c->tail = e;
	c->head = e;
}

static void chain_unlink(struct rd_plan_cache *c, struct rd_plan_entry *e)
{
	for (struct rd_plan_entry **pp = bucket_of(c, e->hash); *pp; pp = &(*pp)->chain) {
		if (*pp == e) {
			*pp = e->chain;
			break;
		}
	}
	e->chain = NULL;
}

struct rd_plan_entry *rd_plan_cache_get(struct rd_plan_cache *c, const void *key, uint64_t hash)
{
	if (!c->nbuckets)
		return NULL;
	for (struct rd_plan_entry *e = *bucket_of(c, hash); e; e = e->chain) {
		if (e->hash == hash && memcmp(e->key, key, c->key_size) == 0) {
			if (e != c->head) {
				lru_unlink(c, e);
				lru_push_front(c, e);
			}
			e->refs++;
			return e;
		}
	}
	return NULL;
}

int rd_plan_cache_add(struct rd_plan_cache *c, struct rd_plan_entry *e, const void *key, uint64_t hash)
{
	if (!c->nbuckets && rehash(c, PLAN_CACHE_BUCKETS_MIN) < 0)
		return -ENOMEM;
	e->key = key;
	e->hash = hash;
	e->refs = 1;
	lru_push_front(c, e);
	c->count++;
	/* Growing is an optimisation: without the memory, chains lengthen. */
	if (c->count > c->nbuckets && c->nbuckets <= UINT32_MAX / 4 && rehash(c, c->nbuckets * 2) == 0)
		return 0;   /* e went into the new table with the others */
	struct rd_plan_entry **slot = bucket_of(c, hash);
	e->chain = *slot;
	*slot = e;
	return 0;
}

void rd_plan_cache_put(struct rd_plan_cache *c, struct rd_plan_entry *e)
{
	(void)c;
	e->refs--;
}

struct rd_plan_entry *rd_plan_cache_trim(struct rd_plan_cache *c)
{
	struct rd_plan_entry *victims = NULL;

	/* From the least recently used end. Held entries are passed over:
	 * there are at most as many as threads inside a call. */
	for (struct rd_plan_entry *e = c->tail; e && c->count > c->max;) {
		struct rd_plan_entry *prev = e->prev;
		if (e->refs == 0) {
			chain_unlink(c, e);
			lru_unlink(c, e);
			c->count--;
			e->next = victims;
			victims = e;
		}
		e = prev;
	}
	return victims;
}

void rd_plan_cache_set_max(struct rd_plan_cache *c, unsigned max)
{
	c->max = max ? max : 1;
}

struct rd_plan_entry *rd_plan_cache_take_all(struct rd_plan_cache *c)
{
	struct rd_plan_entry *all = c->head;

	for (struct rd_plan_entry *e = all; e; e = e->next) {
		e->prev = NULL;
		e->chain = NULL;
	}
	c->head = c->tail = NULL;
	c->count = 0;
	if (c->buckets)
		memset(c->buckets, 0, c->nbuckets * sizeof(*c->buckets));
	return all;
}
