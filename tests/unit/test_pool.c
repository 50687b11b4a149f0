/* SPDX-License-Identifier: Apache-2.0 */
/* libregen's pool without a daemon: host chunks carved, aligned and
 * coalesced; a chunk of its own for a big request; hostile arguments
 * refused with the errno regen.h names; the CUDA side, on a machine without
 * a GPU, failing with a message instead of crashing; a lookup with no regend
 * to reach told apart from memory that is not the pool's. (With regend:
 * client/python/tests/test_pool.py; on a GPU: tests/gpu/test_regen_torch.py.) */
#include <check.h>
#include <errno.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "client/include/regen.h"

#define MIB (UINT64_C(1) << 20)

static struct regen_pool_stats stats(void)
{
	struct regen_pool_stats st = { .size = sizeof(st) };

	ck_assert_int_eq(regen_pool_stats_get(&st), 0);
	return st;
}

START_TEST(test_host_allocations_are_carved_aligned_and_coalesced)
{
	ck_assert_int_eq(regen_pool_configure(NULL, 4 * MIB), 0);
	struct regen_pool_stats before = stats();
	char *a = regen_pool_alloc_host(1000);
	char *b = regen_pool_alloc_host(3000);
	char *c = regen_pool_alloc_host(512);

	ck_assert_ptr_nonnull(a);
	ck_assert_ptr_nonnull(b);
	ck_assert_ptr_nonnull(c);
	ck_assert_uint_eq((uintptr_t)a % 512, 0);
	ck_assert_uint_eq((uintptr_t)b % 512, 0);
	/* One chunk, pieces back to back, rounded to the alignment. */
	ck_assert_ptr_eq(b, a + 1024);
	ck_assert_ptr_eq(c, b + 3072);
	ck_assert_uint_eq(stats().chunks, before.chunks + 1);
	ck_assert_uint_eq(stats().used_bytes, before.used_bytes + 1024 + 3072 + 512);
	memset(a, 1, 1000);
	memset(b, 2, 3000);

	/* Freeing a and b merges them: 4096 bytes fit where a was. */
	regen_pool_free_host(b);
	regen_pool_free_host(a);
	char *d = regen_pool_alloc_host(4096);
	ck_assert_ptr_eq(d, a);
	regen_pool_free_host(d);
	regen_pool_free_host(c);
	ck_assert_uint_eq(stats().used_bytes, before.used_bytes);
	/* One empty host chunk is kept for the next allocations. */
	ck_assert_uint_eq(stats().chunks, before.chunks + 1);
}
END_TEST

START_TEST(test_big_request_gets_its_own_chunk_and_gives_it_back)
{
	ck_assert_int_eq(regen_pool_configure(NULL, 4 * MIB), 0);
	char *small = regen_pool_alloc_host(4096);
	struct regen_pool_stats before = stats();
	char *big = regen_pool_alloc_host(3 * MIB);

	ck_assert_ptr_nonnull(big);
	ck_assert_uint_eq(stats().chunks, before.chunks + 1);
	ck_assert_uint_eq(stats().chunk_bytes, before.chunk_bytes + 3 * MIB);
	big[3 * MIB - 1] = 1;
	regen_pool_free_host(big);
	ck_assert_uint_eq(stats().chunks, before.chunks);
	ck_assert_uint_eq(stats().chunk_bytes, before.chunk_bytes);
	regen_pool_free_host(small);
}
END_TEST

START_TEST(test_hostile_arguments)
{
	struct regen_pool_ref ref = { .size = sizeof(ref) };
	struct regen_pool_ref small = { .size = 8 };
	struct regen_pool_stats st = { .size = 0 };
	char path[200];
	int local = 0;

	ck_assert_int_eq(regen_pool_configure(NULL, 3), -EINVAL);
	ck_assert_int_eq(regen_pool_configure(NULL, 3 * MIB + 1), -EINVAL);
	ck_assert_str_ne(regen_pool_error(), "");
	memset(path, 'x', sizeof(path) - 1);
	path[sizeof(path) - 1] = '\0';
	ck_assert_int_eq(regen_pool_configure(path, 0), -ENAMETOOLONG);
	ck_assert_int_eq(regen_pool_map_device(-1, 0), -EINVAL);
	ck_assert_int_eq(regen_pool_map_device(0, REGEN_DEVICES_MAX), -EINVAL);
	ck_assert_int_eq(regen_pool_map_device(REGEN_DEVICES_MAX, 0), -EINVAL);
	ck_assert_int_eq(regen_pool_map_device(0, -1), 0);
	ck_assert_int_eq(regen_pool_lookup(&local, 0, NULL), -EINVAL);
	ck_assert_int_eq(regen_pool_lookup(&local, 0, &small), -EINVAL);
	ck_assert_int_eq(regen_pool_lookup(&local, 0, &ref), -ENOENT);
	ck_assert_int_eq(regen_pool_lookup(NULL, 0, &ref), -ENOENT);
	ck_assert_int_eq(regen_pool_stats_get(NULL), -EINVAL);
	ck_assert_int_eq(regen_pool_stats_get(&st), -EINVAL);
	ck_assert_ptr_null(regen_pool_alloc(MIB, -1, NULL));
	ck_assert_ptr_null(regen_pool_alloc(MIB, REGEN_DEVICES_MAX, NULL));
	/* Frees of what the pool never gave are ignored. */
	regen_pool_free_host(NULL);
	regen_pool_free_host(&local);
	regen_pool_free(&local, 4, 0, NULL);
}
END_TEST

START_TEST(test_hostile_sizes_and_frees_change_nothing)
{
	struct regen_pool_stats before, after;
	char *a, *b;

	ck_assert_int_eq(regen_pool_configure(NULL, 4 * MIB), 0);
	a = regen_pool_alloc_host(4096);
	ck_assert_ptr_nonnull(a);
	before = stats();
	/* Sizes that would wrap around when rounded, or that no machine has:
	 * refused with a message, no chunk made. */
	ck_assert_ptr_null(regen_pool_alloc_host(SIZE_MAX));
	ck_assert_ptr_nonnull(strstr(regen_pool_error(), "larger than any device"));
	ck_assert_ptr_null(regen_pool_alloc_host(SIZE_MAX - 100));
	ck_assert_ptr_null(regen_pool_alloc_host((size_t)1 << 60));
	ck_assert_ptr_null(regen_pool_alloc(SIZE_MAX, 0, NULL));
	/* A pointer inside an allocation, host memory given to the CUDA free,
	 * and a second free of the same allocation: each left alone. */
	regen_pool_free_host(a + 512);
	regen_pool_free(a, 4096, 0, NULL);
	after = stats();
	ck_assert_uint_eq(after.chunks, before.chunks);
	ck_assert_uint_eq(after.chunk_bytes, before.chunk_bytes);
	ck_assert_uint_eq(after.used_bytes, before.used_bytes);
	ck_assert_uint_eq(after.allocs, before.allocs);
	ck_assert_uint_eq(after.frees, before.frees);
	regen_pool_free_host(a);
	ck_assert_uint_eq(stats().frees, before.frees + 1);
	ck_assert_uint_eq(stats().used_bytes, before.used_bytes - 4096);
	regen_pool_free_host(a);
	ck_assert_uint_eq(stats().frees, before.frees + 1);
	/* The memory is the pool's again: the next allocation reuses it. */
	b = regen_pool_alloc_host(4096);
	ck_assert_ptr_eq(b, a);
	regen_pool_free_host(b);
}
END_TEST

START_TEST(test_stats_fill_what_the_caller_knows)
{
	struct {
		size_t size;
		uint64_t chunks;
	} old = { .size = sizeof(old), .chunks = UINT64_MAX };
	char *p = regen_pool_alloc_host(100);

	ck_assert_int_eq(regen_pool_stats_get((struct regen_pool_stats *)&old), 0);
	ck_assert_uint_eq(old.size, sizeof(old));
	ck_assert_uint_ge(old.chunks, 1);
	ck_assert_uint_ne(old.chunks, UINT64_MAX);
	regen_pool_free_host(p);
}
END_TEST

START_TEST(test_no_regend_is_not_foreign_memory)
{
	struct regen_pool_ref ref = { .size = sizeof(ref) };
	char *p;

	ck_assert_int_eq(regen_pool_configure("/nonexistent/regen-test.sock", 0), 0);
	p = regen_pool_alloc_host(64);
	ck_assert_ptr_nonnull(p);
	ck_assert_int_eq(regen_pool_lookup(p, 0, &ref), -ECONNREFUSED);
	ck_assert_ptr_nonnull(strstr(regen_pool_error(), "/nonexistent/regen-test.sock"));
	ck_assert_ptr_null(regen_pool_error_name());
	/* host_device is needed for host memory. */
	ck_assert_int_eq(regen_pool_lookup(p, -1, &ref), -EINVAL);
	regen_pool_free_host(p);
}
END_TEST

START_TEST(test_cuda_side_says_why_without_a_gpu)
{
	uint64_t base = 0, size = 0;
	int local = 0;

	if (regen_pool_cuda_available() == 0) {
		/* A machine with a GPU: tests/gpu/test_regen_torch.py covers it. */
		return;
	}
	ck_assert_str_ne(regen_pool_error(), "");
	ck_assert_ptr_null(regen_pool_alloc(MIB, 0, NULL));
	ck_assert_str_ne(regen_pool_error(), "");
	ck_assert_int_lt(regen_cuda_address_range(&local, &base, &size), 0);
	ck_assert_int_eq(regen_cuda_address_range(&local, NULL, &size) < 0, 1);
}
END_TEST

/* A forked child (a DataLoader worker) shares the host chunks' pages with
 * its parent: it must neither carve what the parent holds nor give back what
 * it inherited. Its allocation comes from a chunk of its own, and its free
 * of an inherited allocation is left alone (before, both carved the same
 * free piece of the same page). */
START_TEST(test_a_forked_child_allocates_apart_from_its_parent)
{
	int go[2], done[2];
	char token = 0;
	pid_t pid;

	ck_assert_int_eq(regen_pool_configure(NULL, 4 * MIB), 0);
	char *a = regen_pool_alloc_host(4096);   /* the chunk exists before the fork */
	ck_assert_ptr_nonnull(a);
	memset(a, 0x11, 4096);
	ck_assert_int_eq(pipe(go), 0);
	ck_assert_int_eq(pipe(done), 0);
	pid = fork();
	ck_assert_int_ge(pid, 0);
	if (pid == 0) {
		ck_assert_int_eq(read(go[0], &token, 1), 1);
		regen_pool_free_host(a);               /* inherited: the parent's */
		char *b = regen_pool_alloc_host(4096);
		char *b2 = regen_pool_alloc_host(4096);
		if (b != NULL)
			memset(b, 0xAA, 4096);
		if (b2 != NULL)
			memset(b2, 0xBB, 4096);
		ck_assert_int_eq(write(done[1], &b, sizeof(b)), sizeof(b));
		_exit(0);
	}
	char *c = regen_pool_alloc_host(4096);   /* the parent's, after the fork */
	memset(c, 0x55, 4096);
	ck_assert_int_eq(write(go[1], &token, 1), 1);
	char *b = NULL;
	ck_assert_int_eq(read(done[0], &b, sizeof(b)), sizeof(b));
	waitpid(pid, NULL, 0);
	ck_assert_ptr_nonnull(b);
	ck_assert_msg((unsigned char)c[0] == 0x55 && (unsigned char)c[4095] == 0x55,
		      "the child's allocation (%p) overwrote the parent's live one (%p)", (void *)b, (void *)c);
	ck_assert_msg((unsigned char)a[0] == 0x11 && (unsigned char)a[4095] == 0x11,
		      "the child's allocations overwrote the allocation it inherited and freed");
	regen_pool_free_host(c);
	regen_pool_free_host(a);
	close(go[0]);
	close(go[1]);
	close(done[0]);
	close(done[1]);
}
END_TEST

static Suite *pool_suite(void)
{
	Suite *s = suite_create("pool");
	TCase *tc = tcase_create("pool");

	tcase_add_test(tc, test_host_allocations_are_carved_aligned_and_coalesced);
	tcase_add_test(tc, test_big_request_gets_its_own_chunk_and_gives_it_back);
	tcase_add_test(tc, test_hostile_arguments);
	tcase_add_test(tc, test_hostile_sizes_and_frees_change_nothing);
	tcase_add_test(tc, test_stats_fill_what_the_caller_knows);
	tcase_add_test(tc, test_no_regend_is_not_foreign_memory);
	tcase_add_test(tc, test_cuda_side_says_why_without_a_gpu);
	tcase_add_test(tc, test_a_forked_child_allocates_apart_from_its_parent);
	suite_add_tcase(s, tc);
	return s;
}

int main(void)
{
	SRunner *sr = srunner_create(pool_suite());
	int failed;

	srunner_run_all(sr, CK_NORMAL);
	failed = srunner_ntests_failed(sr);
	srunner_free(sr);
	return failed == 0 ? EXIT_SUCCESS : EXIT_FAILURE;
}
