/* SPDX-License-Identifier: Apache-2.0 */
/* The bounded plan cache (daemon/backend/plan_cache.c), which keeps the
 * CUDA backend's GEMM plans: never more than its limit once nobody holds
 * an entry, the least recently used leave first, a held entry never
 * leaves, a new key is taken even when every entry is held, and a lookup
 * finds the right entry among thousands. */
#include <check.h>
#include <stdbool.h>
#include <stdlib.h>
#include <string.h>
#include "daemon/backend/plan_cache.h"
#include "tests/unit/unit.h"

/* A plan as an owner embeds the entry: its key beside it. The key has
 * padding-free fields and an odd size, so the hash's tail bytes count. */
struct key {
	int64_t m, n, k;
	int32_t dtype;
	unsigned char flags[3];
};

struct plan {
	struct rd_plan_entry entry;
	struct key key;
	bool freed;
};

static struct key key_of(int64_t m)
{
	struct key k;

	memset(&k, 0, sizeof(k));
	k.m = m;
	k.n = 64;
	k.k = 128;
	k.dtype = 2;
	return k;
}

static struct plan *plan_of(struct rd_plan_entry *e)
{
	return (struct plan *)((char *)e - offsetof(struct plan, entry));
}

/* What an owner does on a call: find or make the plan for key k, held;
 * pool[i] is where a new one goes. */
static struct plan *get_key(struct rd_plan_cache *c, struct plan *pool, size_t i, struct key k, bool *made)
{
	uint64_t h = rd_plan_cache_hash(&k, sizeof(k));
	struct rd_plan_entry *e = rd_plan_cache_get(c, &k, h);

	*made = e == NULL;
	if (e)
		return plan_of(e);
	struct plan *p = &pool[i];
	ck_assert(!p->entry.refs);
	memset(p, 0, sizeof(*p));
	p->key = k;
	ck_assert_int_eq(rd_plan_cache_add(c, &p->entry, &p->key, h), 0);
	return p;
}

/* The same for the key of shape m, made in pool[m]. */
static struct plan *get(struct rd_plan_cache *c, struct plan *pool, int64_t m, bool *made)
{
	return get_key(c, pool, (size_t)m, key_of(m), made);
}

/* Frees (marks) what a trim returned; how many. */
static unsigned free_victims(struct rd_plan_entry *e)
{
	unsigned n = 0;

	while (e) {
		struct rd_plan_entry *next = e->next;
		struct plan *p = plan_of(e);
		ck_assert_msg(p->entry.refs == 0, "a held plan (m=%lld) was evicted", (long long)p->key.m);
		p->freed = true;
		n++;
		e = next;
	}
	return n;
}

START_TEST(never_more_than_the_limit_once_put)
{
	enum { LIMIT = 8, SHAPES = LIMIT + 100 };
	struct plan *pool = calloc(SHAPES + 1, sizeof(*pool));
	struct rd_plan_cache c;
	bool made;

	rd_plan_cache_init(&c, sizeof(struct key), LIMIT);
	for (int64_t m = 1; m <= SHAPES; m++) {
		struct plan *p = get(&c, pool, m, &made);
		ck_assert(made);
		free_victims(rd_plan_cache_trim(&c));
		rd_plan_cache_put(&c, &p->entry);
		free_victims(rd_plan_cache_trim(&c));
		ck_assert_uint_le(c.count, LIMIT);
	}
	ck_assert_uint_eq(c.count, LIMIT);
	/* The newest LIMIT stayed; the first left long ago and is made again. */
	for (int64_t m = SHAPES - LIMIT + 1; m <= SHAPES; m++) {
		ck_assert(!pool[m].freed);
		struct plan *p = get(&c, pool, m, &made);
		ck_assert_msg(!made && p == &pool[m], "m=%lld was not found", (long long)m);
		rd_plan_cache_put(&c, &p->entry);
	}
	ck_assert(pool[1].freed);
	struct plan *p = get(&c, pool, 1, &made);
	ck_assert(made);
	rd_plan_cache_put(&c, &p->entry);
	ck_assert_uint_eq(free_victims(rd_plan_cache_trim(&c)), 1);
	ck_assert_uint_eq(c.count, LIMIT);
	free_victims(rd_plan_cache_take_all(&c));
	rd_plan_cache_finish(&c);
	free(pool);
}
END_TEST

START_TEST(least_recently_used_leaves_first)
{
	struct plan pool[8] = { 0 };
	struct rd_plan_cache c;
	bool made;

	rd_plan_cache_init(&c, sizeof(struct key), 3);
	for (int64_t m = 1; m <= 3; m++)
		rd_plan_cache_put(&c, &get(&c, pool, m, &made)->entry);
	/* 1 used again: 2 is now the least recently used. */
	rd_plan_cache_put(&c, &get(&c, pool, 1, &made)->entry);
	ck_assert(!made);
	rd_plan_cache_put(&c, &get(&c, pool, 4, &made)->entry);
	struct rd_plan_entry *v = rd_plan_cache_trim(&c);
	ck_assert_ptr_eq(v, &pool[2].entry);
	ck_assert_ptr_null(v->next);
	free_victims(rd_plan_cache_take_all(&c));
	rd_plan_cache_finish(&c);
}
END_TEST

START_TEST(held_entries_stay_and_a_new_key_is_still_taken)
{
	enum { LIMIT = 4 };
	struct plan pool[16] = { 0 };
	struct plan *held[LIMIT + 2];
	struct rd_plan_cache c;
	bool made;

	rd_plan_cache_init(&c, sizeof(struct key), LIMIT);
	/* Every cached plan held, as by calls in flight on LIMIT lanes. */
	for (int i = 0; i < LIMIT; i++)
		held[i] = get(&c, pool, i + 1, &made);
	ck_assert_ptr_null(rd_plan_cache_trim(&c));
	/* Two more calls with new shapes: taken, over the limit while held. */
	held[LIMIT] = get(&c, pool, LIMIT + 1, &made);
	ck_assert(made);
	ck_assert_ptr_null(rd_plan_cache_trim(&c));
	held[LIMIT + 1] = get(&c, pool, LIMIT + 2, &made);
	ck_assert_ptr_null(rd_plan_cache_trim(&c));
	ck_assert_uint_eq(c.count, LIMIT + 2);
	/* A held plan is found again (a second call of its shape). */
	struct plan *again = get(&c, pool, 2, &made);
	ck_assert(!made && again == held[1]);
	ck_assert_uint_eq(again->entry.refs, 2);
	rd_plan_cache_put(&c, &again->entry);
	/* As the calls finish, the cache trims back to its limit, oldest
	 * first, and never takes one still held. */
	rd_plan_cache_put(&c, &held[0]->entry);
	ck_assert_uint_eq(free_victims(rd_plan_cache_trim(&c)), 1);
	ck_assert(pool[1].freed);
	ck_assert_uint_eq(c.count, LIMIT + 1);
	rd_plan_cache_put(&c, &held[LIMIT + 1]->entry);
	ck_assert_uint_eq(free_victims(rd_plan_cache_trim(&c)), 1);
	ck_assert(pool[LIMIT + 2].freed);
	ck_assert_uint_eq(c.count, LIMIT);
	for (int i = 1; i <= LIMIT; i++)
		rd_plan_cache_put(&c, &held[i]->entry);
	ck_assert_ptr_null(rd_plan_cache_trim(&c));
	ck_assert_uint_eq(c.count, LIMIT);
	free_victims(rd_plan_cache_take_all(&c));
	rd_plan_cache_finish(&c);
}
END_TEST

START_TEST(a_lower_limit_applies_at_the_next_trim)
{
	struct plan pool[16] = { 0 };
	struct rd_plan_cache c;
	bool made;

	rd_plan_cache_init(&c, sizeof(struct key), 10);
	for (int64_t m = 1; m <= 10; m++)
		rd_plan_cache_put(&c, &get(&c, pool, m, &made)->entry);
	ck_assert_uint_eq(c.count, 10);
	rd_plan_cache_set_max(&c, 2);
	ck_assert_uint_eq(free_victims(rd_plan_cache_trim(&c)), 8);
	ck_assert(!pool[9].freed && !pool[10].freed);
	rd_plan_cache_set_max(&c, 0);   /* 0: 1, never nothing */
	ck_assert_uint_eq(free_victims(rd_plan_cache_trim(&c)), 1);
	ck_assert_uint_eq(c.count, 1);
	free_victims(rd_plan_cache_take_all(&c));
	rd_plan_cache_finish(&c);
}
END_TEST

/* Many keys, the table grown several times over: each found, none
 * mistaken for another (keys differing in one byte anywhere). */
START_TEST(lookup_finds_each_of_many)
{
	enum { N = 5000 };
	struct plan *pool = calloc(N + 1, sizeof(*pool));
	struct rd_plan_cache c;
	bool made;

	rd_plan_cache_init(&c, sizeof(struct key), N);
	for (int64_t m = 1; m <= N; m++) {
		struct key k = key_of(m);
		if (m % 3 == 0)
			k.flags[2] = 1;   /* the key's last byte: the hash's tail */
		struct plan *p = get_key(&c, pool, (size_t)m, k, &made);
		ck_assert(made);
		rd_plan_cache_put(&c, &p->entry);
	}
	ck_assert_uint_ge(c.nbuckets, N);
	for (int64_t m = 1; m <= N; m++) {
		struct key k = key_of(m);
		if (m % 3 == 0)
			k.flags[2] = 1;
		struct rd_plan_entry *e = rd_plan_cache_get(&c, &k, rd_plan_cache_hash(&k, sizeof(k)));
		ck_assert_ptr_eq(e, &pool[m].entry);
		rd_plan_cache_put(&c, e);
		k.flags[2] ^= 1;
		ck_assert_ptr_null(rd_plan_cache_get(&c, &k, rd_plan_cache_hash(&k, sizeof(k))));
	}
	ck_assert_ptr_null(rd_plan_cache_trim(&c));
	free_victims(rd_plan_cache_take_all(&c));
	ck_assert_uint_eq(c.count, 0);
	rd_plan_cache_finish(&c);
	free(pool);
}
END_TEST

static Suite *suite(void)
{
	Suite *s = suite_create("plan_cache");
	TCase *tc = tcase_create("core");

	tcase_add_test(tc, never_more_than_the_limit_once_put);
	tcase_add_test(tc, least_recently_used_leaves_first);
	tcase_add_test(tc, held_entries_stay_and_a_new_key_is_still_taken);
	tcase_add_test(tc, a_lower_limit_applies_at_the_next_trim);
	tcase_add_test(tc, lookup_finds_each_of_many);
	suite_add_tcase(s, tc);
	return s;
}

int main(void)
{
	return unit_run(suite());
}
