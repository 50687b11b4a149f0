/* SPDX-License-Identifier: Apache-2.0 */
/* The registry's contract: creation registers, ensure_valid builds lazily
 * and once, release and invalidate walk in reverse registration order and
 * never mix their callbacks. */
#include <check.h>
#include <pthread.h>
#include <string.h>
#include "daemon/registry.h"

struct probe {
	struct rd_resource res;
	char name;
	int live;            /* 1 while native state exists */
};

static char journal[64];
static size_t journal_len;

static void note(char what, char name)
{
	journal[journal_len++] = what;
	journal[journal_len++] = name;
	journal[journal_len] = '\0';
}

static int probe_init(struct rd_resource *res)
{
	struct probe *p = (struct probe *)res;
	p->live = 1;
	note('+', p->name);
	return 0;
}

static void probe_release(struct rd_resource *res)
{
	struct probe *p = (struct probe *)res;
	p->live = 0;
	note('r', p->name);
}

static void probe_invalidate(struct rd_resource *res)
{
	struct probe *p = (struct probe *)res;
	p->live = 0;
	note('i', p->name);
}

static const struct rd_resource_ops probe_ops = {
	.kind = "probe", .init = probe_init, .release = probe_release, .invalidate = probe_invalidate,
};

static void setup(void)
{
	journal_len = 0;
	journal[0] = '\0';
}

START_TEST(resources_start_invalid_and_build_on_first_use)
{
	struct rd_registry reg;
	struct probe a = { .name = 'a' };

	rd_registry_init(&reg, 0);
	rd_resource_register(&reg, &a.res, &probe_ops);
	ck_assert(!rd_resource_is_valid(&a.res));
	ck_assert_int_eq(a.live, 0);
	ck_assert_int_eq(rd_resource_ensure_valid(&a.res), 0);
	ck_assert_int_eq(rd_resource_ensure_valid(&a.res), 0);
	ck_assert_uint_eq(a.res.init_count, 1);
	ck_assert_str_eq(journal, "+a");
	rd_resource_unregister(&a.res);
	ck_assert_str_eq(journal, "+ara");
	rd_registry_finish(&reg);
}
END_TEST

START_TEST(release_walks_in_reverse_registration_order_and_rebuilds_lazily)
{
	struct rd_registry reg;
	struct probe p[3] = { { .name = 'a' }, { .name = 'b' }, { .name = 'c' } };

	rd_registry_init(&reg, 0);
	for (int i = 0; i < 3; i++) {
		rd_resource_register(&reg, &p[i].res, &probe_ops);
		rd_resource_ensure_valid(&p[i].res);
	}
	ck_assert_str_eq(journal, "+a+b+c");
	ck_assert_uint_eq(rd_registry_release(&reg), 3);
	ck_assert_str_eq(journal + 6, "rcrbra");
	for (int i = 0; i < 3; i++)
		ck_assert(!rd_resource_is_valid(&p[i].res));
	/* Only what is used again comes back. */
	rd_resource_ensure_valid(&p[1].res);
	ck_assert_str_eq(journal + 12, "+b");
	ck_assert_uint_eq(p[1].res.init_count, 2);
	ck_assert_uint_eq(p[0].res.init_count, 1);
	/* A second release touches only the valid one. */
	ck_assert_uint_eq(rd_registry_release(&reg), 1);
	ck_assert_str_eq(journal + 14, "rb");
	for (int i = 2; i >= 0; i--)
		rd_resource_unregister(&p[i].res);
	ck_assert_str_eq(journal + 16, "");
	ck_assert_uint_eq(reg.count, 0);
	rd_registry_finish(&reg);
}
END_TEST

START_TEST(invalidate_never_calls_release)
{
	struct rd_registry reg;
	struct probe p[2] = { { .name = 'a' }, { .name = 'b' } };

	rd_registry_init(&reg, 1);
	for (int i = 0; i < 2; i++) {
		rd_resource_register(&reg, &p[i].res, &probe_ops);
		rd_resource_ensure_valid(&p[i].res);
	}
	ck_assert_uint_eq(rd_registry_invalidate(&reg), 2);
	ck_assert_str_eq(journal, "+a+bibia");
	/* Unregistering an invalid resource calls nothing into the dead context. */
	rd_resource_unregister(&p[1].res);
	rd_resource_unregister(&p[0].res);
	ck_assert_str_eq(journal, "+a+bibia");
	rd_registry_finish(&reg);
}
END_TEST

static int slow_inits;
static int slow_init(struct rd_resource *res)
{
	__atomic_add_fetch(&slow_inits, 1, __ATOMIC_SEQ_CST);
	for (volatile int i = 0; i < 100000; i++)
		;
	return 0;
}
static const struct rd_resource_ops slow_ops = { .kind = "slow", .init = slow_init };

static void *hammer(void *arg)
{
	for (int i = 0; i < 1000; i++)
		rd_resource_ensure_valid(arg);
	return NULL;
}

START_TEST(concurrent_first_use_initialises_once)
{
	struct rd_registry reg;
	struct rd_resource res;
	pthread_t t[8];

	slow_inits = 0;
	rd_registry_init(&reg, 0);
	rd_resource_register(&reg, &res, &slow_ops);
	for (int i = 0; i < 8; i++)
		pthread_create(&t[i], NULL, hammer, &res);
	for (int i = 0; i < 8; i++)
		pthread_join(t[i], NULL);
	ck_assert_int_eq(slow_inits, 1);
	rd_resource_unregister(&res);
	rd_registry_finish(&reg);
}
END_TEST

static int failing_init(struct rd_resource *res) { return -12; }
static const struct rd_resource_ops failing_ops = { .kind = "failing", .init = failing_init };

START_TEST(a_failed_init_leaves_the_resource_invalid_and_is_retried)
{
	struct rd_registry reg;
	struct rd_resource res;

	rd_registry_init(&reg, 0);
	rd_resource_register(&reg, &res, &failing_ops);
	ck_assert_int_eq(rd_resource_ensure_valid(&res), -12);
	ck_assert(!rd_resource_is_valid(&res));
	ck_assert_int_eq(rd_resource_ensure_valid(&res), -12);
	ck_assert_uint_eq(res.init_count, 0);
	rd_resource_unregister(&res);
	rd_registry_finish(&reg);
}
END_TEST

int main(void)
{
	Suite *s = suite_create("registry");
	TCase *tc = tcase_create("core");
	tcase_add_checked_fixture(tc, setup, NULL);
	tcase_add_test(tc, resources_start_invalid_and_build_on_first_use);
	tcase_add_test(tc, release_walks_in_reverse_registration_order_and_rebuilds_lazily);
	tcase_add_test(tc, invalidate_never_calls_release);
	tcase_add_test(tc, concurrent_first_use_initialises_once);
	tcase_add_test(tc, a_failed_init_leaves_the_resource_invalid_and_is_retried);
	suite_add_tcase(s, tc);
	SRunner *sr = srunner_create(s);
	srunner_run_all(sr, CK_NORMAL);
	int failed = srunner_ntests_failed(sr);
	srunner_free(sr);
	return failed ? 1 : 0;
}
