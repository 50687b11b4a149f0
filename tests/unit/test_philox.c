/* SPDX-License-Identifier: Apache-2.0 */
/* dropout_mask's generator (proto/philox.h): Philox4x32-10 against the
 * known answers its authors publish, and the draw's rule (the threshold,
 * the counter's layout, the seed as a key) at its edges. The masks a
 * program draws are tested on the host backend (test_host_program) and
 * against the CUDA kernels (test_program_emulated, the GPU's
 * test_program_kernels). */
#include <check.h>
#include <stdint.h>

#include "proto/philox.h"
#include "unit.h"

/* Random123's kat_vectors (D. E. Shaw Research, tests/kat_vectors, the
 * philox4x32 10 lines: counter, key, output), and two of the vectors its
 * manual's examples/kat_vectors adds with a key's high word set. */
static const struct {
	uint32_t counter[4], key[2], out[4];
} kat[] = {
	{ { 0x00000000, 0x00000000, 0x00000000, 0x00000000 }, { 0x00000000, 0x00000000 },
	  { 0x6627e8d5, 0xe169c58d, 0xbc57ac4c, 0x9b00dbd8 } },
	{ { 0xffffffff, 0xffffffff, 0xffffffff, 0xffffffff }, { 0xffffffff, 0xffffffff },
	  { 0x408f276d, 0x41c83b0e, 0xa20bc7c6, 0x6d5451fd } },
	{ { 0x243f6a88, 0x85a308d3, 0x13198a2e, 0x03707344 }, { 0xa4093822, 0x299f31d0 },
	  { 0xd16cfe09, 0x94fdcceb, 0x5001e420, 0x24126ea1 } },
	{ { 0x00000000, 0x00000001, 0x00000000, 0x00000000 }, { 0x00000000, 0x00000001 },
	  { 0x532f1322, 0x36c890fb, 0x6504b937, 0x07bbfef7 } },
	{ { 0x00000000, 0x00000000, 0x00000001, 0x00000000 }, { 0x00000000, 0xffffffff },
	  { 0x6c4b0e80, 0x357e5a94, 0x3255445d, 0x6f433f0b } },
};

START_TEST(philox4x32_10_matches_the_published_answers)
{
	uint32_t out[4];

	rp_philox4x32_10(kat[_i].counter, kat[_i].key, out);
	for (int w = 0; w < 4; w++)
		ck_assert_msg(out[w] == kat[_i].out[w], "vector %d word %d: %08x, want %08x", _i, w, out[w],
			      kat[_i].out[w]);
}
END_TEST

/* u = k 2^-24 >= p exactly where k >= threshold. */
START_TEST(the_threshold_is_p_in_24_bits)
{
	ck_assert_uint_eq(rp_dropout_threshold(0), 0);
	ck_assert_uint_eq(rp_dropout_threshold(0x1p-24), 1);
	ck_assert_uint_eq(rp_dropout_threshold(0x1p-30), 1);
	ck_assert_uint_eq(rp_dropout_threshold(0.5), 1u << 23);
	ck_assert_uint_eq(rp_dropout_threshold(0.5 + 0x1p-30), (1u << 23) + 1);
	ck_assert_uint_eq(rp_dropout_threshold(1 - 0x1p-24), (1u << 24) - 1);
	ck_assert_uint_eq(rp_dropout_threshold(1 - 0x1p-30), 1u << 24);
	for (uint32_t k = 0; k < (1u << 24); k += 4099) {
		const double u = k * 0x1p-24;

		for (double p = 0.001; p < 1; p += 0.0937) {
			ck_assert_msg((k >= rp_dropout_threshold(p)) == (u >= p), "k %u p %.17g", k, p);
		}
	}
}
END_TEST

/* Element i is Philox's word 0 at counter (i lo, i hi, stream, 0) under
 * the key (seed lo, seed hi). */
START_TEST(the_draw_is_word_0_at_the_elements_counter)
{
	const uint64_t seeds[] = { 0, 1, 0x123456789abcULL, (UINT64_C(1) << 53) - 1 };
	const uint64_t indices[] = { 0, 1, 255, 256, UINT64_C(1) << 32, (UINT64_C(1) << 40) - 1 };
	const uint32_t streams[] = { 0, 1, 0xffffffffu };

	for (size_t s = 0; s < sizeof(seeds) / sizeof(seeds[0]); s++)
		for (size_t i = 0; i < sizeof(indices) / sizeof(indices[0]); i++)
			for (size_t t = 0; t < sizeof(streams) / sizeof(streams[0]); t++) {
				const uint32_t c[4] = { (uint32_t)indices[i], (uint32_t)(indices[i] >> 32), streams[t], 0 };
				const uint32_t k[2] = { (uint32_t)seeds[s], (uint32_t)(seeds[s] >> 32) };
				uint32_t out[4];

				rp_philox4x32_10(c, k, out);
				for (double p = 0.05; p < 1; p += 0.15) {
					const uint32_t th = rp_dropout_threshold(p);

					ck_assert((out[0] >> 8 >= th) == rp_dropout_keep(seeds[s], streams[t], indices[i], th));
				}
			}
	/* p = 0 keeps everything. */
	ck_assert(rp_dropout_keep(7, 0, 3, rp_dropout_threshold(0)));
}
END_TEST

START_TEST(a_seed_is_its_integer)
{
	ck_assert_uint_eq(rp_dropout_seed(0), 0);
	ck_assert_uint_eq(rp_dropout_seed(12345), 12345);
	ck_assert_uint_eq(rp_dropout_seed(9007199254740991.0), (UINT64_C(1) << 53) - 1);
	/* What a Run refuses reads as 0, never undefined. */
	ck_assert_uint_eq(rp_dropout_seed(-1), 0);
	ck_assert_uint_eq(rp_dropout_seed(RP_DROPOUT_SEED_LIMIT), 0);
	ck_assert_uint_eq(rp_dropout_seed(__builtin_nan("")), 0);
}
END_TEST

static Suite *suite(void)
{
	Suite *s = suite_create("philox");
	TCase *tc = tcase_create("philox");

	tcase_add_loop_test(tc, philox4x32_10_matches_the_published_answers, 0, (int)(sizeof(kat) / sizeof(kat[0])));
	tcase_add_test(tc, the_threshold_is_p_in_24_bits);
	tcase_add_test(tc, the_draw_is_word_0_at_the_elements_counter);
	tcase_add_test(tc, a_seed_is_its_integer);
	suite_add_tcase(s, tc);
	return s;
}

int main(void)
{
	return unit_run(suite());
}
