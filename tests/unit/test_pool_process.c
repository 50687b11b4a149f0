/* SPDX-License-Identifier: Apache-2.0 */
/* libregen's pool as the process's whole CUDA allocator
 * (regen_pool_set_process_allocator), without a GPU: $REGEN_POOL_FAKE_CUDA=1
 * makes its CUDA chunks memfds, so that the bookkeeping torch relies on is
 * tested here, and on the GPU by tests/gpu/test_torch_process_pool.py.
 *
 *  - memory freed on a stream is taken again by an allocation on that
 *    stream (its work runs after the free), never by one on another stream
 *    until a trim has synchronised;
 *  - pieces freed side by side on one stream coalesce, on two streams not;
 *  - empty chunks are kept (a big request's too, and reused) until a trim
 *    gives them back; a failed chunk creation is not needed to see that;
 *  - a training loop's pattern holds its memory flat: the smallest free
 *    piece serves (best fit) and a small request never splits a big
 *    request's chunk;
 *  - switched off (under a MemPool, the default) nothing of this: frees are
 *    not ordered and an empty chunk goes at once; switching off trims;
 *  - hostile frees change nothing. */
#include <check.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "client/include/regen.h"

#define MIB (UINT64_C(1) << 20)
#define S1 ((void *)0x1111)
#define S2 ((void *)0x2222)

static struct regen_pool_stats stats(void)
{
	struct regen_pool_stats st = { .size = sizeof(st) };

	ck_assert_int_eq(regen_pool_stats_get(&st), 0);
	return st;
}

/* Each test starts from an empty CUDA side, whatever ran before it in
 * this process (CK_FORK=no). */
static void start(int process)
{
	ck_assert_int_eq(regen_pool_configure(NULL, 4 * MIB), 0);
	ck_assert_int_eq(regen_pool_set_process_allocator(process), 0);
	ck_assert_int_eq(regen_pool_trim(), 0);
}

/* An allocation of size on stream (device 0) gets want; it goes back on
 * that stream at once. */
static void expect_alloc_at(size_t size, void *stream, const void *want)
{
	char *p = regen_pool_alloc(size, 0, stream);

	ck_assert_ptr_eq(p, want);
	regen_pool_free(p, size, 0, stream);
}

START_TEST(test_a_free_is_taken_again_only_on_its_stream)
{
	start(1);
	char *keep = regen_pool_alloc(4096, 0, S1);
	char *a = regen_pool_alloc(4096, 0, S1);
	char *after = regen_pool_alloc(4096, 0, S1);

	ck_assert_ptr_nonnull(keep);
	ck_assert_ptr_nonnull(a);
	ck_assert_ptr_nonnull(after);
	ck_assert_ptr_eq(a, keep + 4096);
	memset(a, 7, 4096);
	regen_pool_free(a, 4096, 0, S1);
	/* Another stream's allocation may run before S1's work that still uses
	 * a: it gets other memory. */
	char *b = regen_pool_alloc(4096, 0, S2);
	ck_assert_ptr_nonnull(b);
	ck_assert_ptr_ne(b, a);
	/* S1's own allocation runs after that work: it takes a again. */
	expect_alloc_at(4096, S1, a);
	/* The legacy stream (NULL) is a stream like any other. */
	char *d = regen_pool_alloc(4096, 0, NULL);
	ck_assert_ptr_ne(d, a);
	regen_pool_free(d, 4096, 0, NULL);
	char *e = regen_pool_alloc(4096, 0, S2);
	ck_assert_ptr_ne(e, a);
	ck_assert_ptr_ne(e, d);
	/* After a trim (which synchronises) a is anyone's. */
	ck_assert_int_eq(regen_pool_trim(), 0);
	expect_alloc_at(4096, S2, a);
	regen_pool_free(e, 4096, 0, S2);
	regen_pool_free(b, 4096, 0, S2);
	regen_pool_free(after, 4096, 0, S1);
	regen_pool_free(keep, 4096, 0, S1);
}
END_TEST

START_TEST(test_frees_coalesce_on_one_stream_only)
{
	start(1);
	char *keep = regen_pool_alloc(512, 0, S1);
	char *a = regen_pool_alloc(4096, 0, S1);
	char *b = regen_pool_alloc(4096, 0, S1);
	char *c = regen_pool_alloc(4096, 0, S1);
	char *fence = regen_pool_alloc(512, 0, S1);

	ck_assert_ptr_eq(b, a + 4096);
	ck_assert_ptr_eq(c, b + 4096);
	/* a and b freed on S1 make one 8 KiB piece for S1. */
	regen_pool_free(a, 4096, 0, S1);
	regen_pool_free(b, 4096, 0, S1);
	expect_alloc_at(8192, S1, a);
	/* c freed on S2 beside them stays apart: 12 KiB fit there for nobody. */
	regen_pool_free(c, 4096, 0, S2);
	char *x = regen_pool_alloc(12288, 0, S1);
	char *y = regen_pool_alloc(12288, 0, S2);
	ck_assert(x < a || x >= c + 4096);
	ck_assert(y < a || y >= c + 4096);
	regen_pool_free(x, 12288, 0, S1);
	regen_pool_free(y, 12288, 0, S2);
	/* Settled, they are one again. */
	ck_assert_int_eq(regen_pool_trim(), 0);
	expect_alloc_at(12288, S2, a);
	regen_pool_free(fence, 512, 0, S1);
	regen_pool_free(keep, 512, 0, S1);
}
END_TEST

START_TEST(test_empty_chunks_are_kept_until_a_trim)
{
	start(1);
	struct regen_pool_stats before = stats();
	char *a = regen_pool_alloc(4096, 0, S1);
	char *big = regen_pool_alloc(5 * MIB, 0, S1);

	ck_assert_ptr_nonnull(a);
	ck_assert_ptr_nonnull(big);
	ck_assert_uint_eq(stats().chunks, before.chunks + 2);
	regen_pool_free(a, 4096, 0, S1);
	regen_pool_free(big, 5 * MIB, 0, S1);
	/* Kept: the next allocations need no new chunk, the big one's either. */
	ck_assert_uint_eq(stats().chunks, before.chunks + 2);
	ck_assert_uint_eq(stats().used_bytes, before.used_bytes);
	char *big2 = regen_pool_alloc(5 * MIB, 0, S1);
	char *a2 = regen_pool_alloc(4096, 0, S1);
	ck_assert_uint_eq(stats().chunks, before.chunks + 2);
	ck_assert_ptr_eq(big2, big);
	ck_assert_ptr_nonnull(a2);
	regen_pool_free(big2, 5 * MIB, 0, S1);
	regen_pool_free(a2, 4096, 0, S1);
	/* Another device has chunks of its own. */
	char *other = regen_pool_alloc(4096, 1, S1);
	ck_assert_ptr_nonnull(other);
	ck_assert_uint_eq(stats().chunks, before.chunks + 3);
	/* A trim gives back what is empty and keeps what is used. */
	ck_assert_int_eq(regen_pool_trim(), 0);
	ck_assert_uint_eq(stats().chunks, before.chunks + 1);
	regen_pool_free(other, 4096, 1, S1);
	ck_assert_int_eq(regen_pool_trim(), 0);
	ck_assert_uint_eq(stats().chunks, before.chunks);
	ck_assert_uint_eq(stats().chunk_bytes, before.chunk_bytes);
}
END_TEST

/* A step of training, over and over: small tensors that outlive the step
 * (a gradient, a saved activation) allocated while last step's largest
 * tensor (the logits) is free, then that tensor again. First fit put each
 * step's small tensors into the logits' chunk, and the logits into a new
 * chunk every step. */
START_TEST(test_a_training_loop_holds_its_memory_flat)
{
	start(1);
	struct regen_pool_stats before = stats(), warm = before;
	char *held[2] = { NULL, NULL };

	for (int step = 0; step < 20; step++) {
		char *small = regen_pool_alloc(64 * 1024, 0, S1);
		char *mid = regen_pool_alloc(1 * MIB, 0, S1);
		char *logits = regen_pool_alloc(5 * MIB, 0, S1);
		char *grad = regen_pool_alloc(6 * MIB, 0, S1);

		ck_assert_ptr_nonnull(small);
		ck_assert_ptr_nonnull(mid);
		ck_assert_ptr_nonnull(logits);
		ck_assert_ptr_nonnull(grad);
		regen_pool_free(grad, 6 * MIB, 0, S1);
		regen_pool_free(logits, 5 * MIB, 0, S1);
		regen_pool_free(mid, 1 * MIB, 0, S1);
		if (held[0] != NULL) {
			regen_pool_free(held[0], 64 * 1024, 0, S1);
		}
		held[0] = held[1];
		held[1] = small;
		if (step == 2) {
			warm = stats();
		}
		if (step > 2) {
			ck_assert_uint_eq(stats().chunk_bytes, warm.chunk_bytes);
		}
	}
	ck_assert_uint_le(warm.chunk_bytes - before.chunk_bytes, 4 * MIB + 5 * MIB + 6 * MIB);
	regen_pool_free(held[0], 64 * 1024, 0, S1);
	regen_pool_free(held[1], 64 * 1024, 0, S1);
	ck_assert_int_eq(regen_pool_trim(), 0);
	ck_assert_uint_eq(stats().chunk_bytes, before.chunk_bytes);
}
END_TEST

START_TEST(test_off_frees_are_not_ordered_and_chunks_go)
{
	start(0);
	struct regen_pool_stats before = stats();
	char *keep = regen_pool_alloc(4096, 0, S1);
	char *a = regen_pool_alloc(4096, 0, S1);

	regen_pool_free(a, 4096, 0, S1);
	/* Under a MemPool, torch's caching allocator orders frees itself. */
	expect_alloc_at(4096, S2, a);
	regen_pool_free(keep, 4096, 0, S1);
	ck_assert_uint_eq(stats().chunks, before.chunks);
}
END_TEST

START_TEST(test_switching_off_trims)
{
	start(1);
	struct regen_pool_stats before = stats();
	char *keep = regen_pool_alloc(4096, 0, S1);
	char *a = regen_pool_alloc(4096, 0, S1);
	char *lone = regen_pool_alloc(5 * MIB, 0, S1);

	regen_pool_free(a, 4096, 0, S1);
	regen_pool_free(lone, 5 * MIB, 0, S1);
	ck_assert_uint_eq(stats().chunks, before.chunks + 2);
	ck_assert_int_eq(regen_pool_set_process_allocator(0), 0);
	/* The empty chunk went, and a is no longer pending on S1. */
	ck_assert_uint_eq(stats().chunks, before.chunks + 1);
	expect_alloc_at(4096, S2, a);
	regen_pool_free(keep, 4096, 0, S1);
	ck_assert_uint_eq(stats().chunks, before.chunks);
}
END_TEST

START_TEST(test_hostile_frees_change_nothing)
{
	start(1);
	char *a = regen_pool_alloc(4096, 0, S1);
	struct regen_pool_stats before = stats();
	int local = 0;

	regen_pool_free(NULL, 0, 0, S1);
	regen_pool_free(&local, 4, 0, S1);
	regen_pool_free(a + 512, 512, 0, S1);
	ck_assert_uint_eq(stats().frees, before.frees);
	ck_assert_uint_eq(stats().used_bytes, before.used_bytes);
	regen_pool_free(a, 4096, 0, S1);
	regen_pool_free(a, 4096, 0, S2);
	ck_assert_uint_eq(stats().frees, before.frees + 1);
	/* The second free (on S2) did not make a S2's. */
	char *b = regen_pool_alloc(4096, 0, S2);
	ck_assert_ptr_ne(b, a);
	regen_pool_free(b, 4096, 0, S2);
	ck_assert_int_eq(regen_pool_trim(), 0);
}
END_TEST

static Suite *pool_process_suite(void)
{
	Suite *s = suite_create("pool_process");
	TCase *tc = tcase_create("process");

	tcase_add_test(tc, test_a_free_is_taken_again_only_on_its_stream);
	tcase_add_test(tc, test_frees_coalesce_on_one_stream_only);
	tcase_add_test(tc, test_empty_chunks_are_kept_until_a_trim);
	tcase_add_test(tc, test_a_training_loop_holds_its_memory_flat);
	tcase_add_test(tc, test_off_frees_are_not_ordered_and_chunks_go);
	tcase_add_test(tc, test_switching_off_trims);
	tcase_add_test(tc, test_hostile_frees_change_nothing);
	suite_add_tcase(s, tc);
	return s;
}

int main(void)
{
	SRunner *sr;
	int failed;

	/* Before the pool reads it (once, at its first chunk). */
	setenv("REGEN_POOL_FAKE_CUDA", "1", 1);
	sr = srunner_create(pool_process_suite());
	srunner_run_all(sr, CK_NORMAL);
	failed = srunner_ntests_failed(sr);
	srunner_free(sr);
	return failed == 0 ? EXIT_SUCCESS : EXIT_FAILURE;
}
