/* SPDX-License-Identifier: Apache-2.0 */
/* The one assertion style of the test programs that start regend (Check
 * stays for the unit tests): typed assertions that print the expression,
 * both values, the file and line, and an optional printf-style message
 * whose format is a string literal, then fail the test through
 * tl_fail (harness.h), which prints the daemon's log tail in the main test
 * process.
 *
 *   ASSERT_EQ(st.ndevices, 2);
 *   ASSERT_UINT_GT(g1, g0, "Release of device %d", dev);
 *   ASSERT_STR_EQ(reply.error, "io.regen.NoSuchObject", "CloseBuffer %s", id);
 *   ASSERT_OK(rt_connect(&c, path));      // 0 or more, not a -errno
 *
 * prints, for the second:
 *   FAIL test_stale.c:57: g1 > g0 (3 > 3): Release of device 0
 *
 * The signed family compares as int64_t, the UINT family as uint64_t, the
 * DOUBLE family as double: pick the one that holds both values. */
#pragma once

#include <inttypes.h>
#include <stdbool.h>
#include <stdio.h>
#include <string.h>
#include "tests/lib/harness.h"

/* The optional message: "" when there is none, which is a format of zero
 * length on purpose. */
#pragma GCC diagnostic ignored "-Wformat-zero-length"
#define TL_MSG(...) "" __VA_ARGS__

void tl_fail_values(const char *file, int line, const char *expr, const char *values, const char *fmt, ...)
	__attribute__((format(printf, 5, 6), noreturn));

#define ASSERT(cond, ...)                                                                     \
	do {                                                                                  \
		if (!(cond)) {                                                                \
			tl_fail(__FILE__, __LINE__, #cond, TL_MSG(__VA_ARGS__));               \
		}                                                                             \
	} while (0)

#define TL_ASSERT_CMP(type, pfmt, a, op, b, ...)                                                      \
	do {                                                                                          \
		type tl_a_ = (type)(a), tl_b_ = (type)(b);                                            \
		if (!(tl_a_ op tl_b_)) {                                                              \
			char tl_v_[128];                                                              \
			snprintf(tl_v_, sizeof(tl_v_), "%" pfmt " " #op " %" pfmt, tl_a_, tl_b_);    \
			tl_fail_values(__FILE__, __LINE__, #a " " #op " " #b, tl_v_, TL_MSG(__VA_ARGS__)); \
		}                                                                                     \
	} while (0)

#define ASSERT_EQ(a, b, ...) TL_ASSERT_CMP(int64_t, PRId64, a, ==, b, __VA_ARGS__)
#define ASSERT_NE(a, b, ...) TL_ASSERT_CMP(int64_t, PRId64, a, !=, b, __VA_ARGS__)
#define ASSERT_LT(a, b, ...) TL_ASSERT_CMP(int64_t, PRId64, a, <, b, __VA_ARGS__)
#define ASSERT_LE(a, b, ...) TL_ASSERT_CMP(int64_t, PRId64, a, <=, b, __VA_ARGS__)
#define ASSERT_GT(a, b, ...) TL_ASSERT_CMP(int64_t, PRId64, a, >, b, __VA_ARGS__)
#define ASSERT_GE(a, b, ...) TL_ASSERT_CMP(int64_t, PRId64, a, >=, b, __VA_ARGS__)

#define ASSERT_UINT_EQ(a, b, ...) TL_ASSERT_CMP(uint64_t, PRIu64, a, ==, b, __VA_ARGS__)
#define ASSERT_UINT_NE(a, b, ...) TL_ASSERT_CMP(uint64_t, PRIu64, a, !=, b, __VA_ARGS__)
#define ASSERT_UINT_LT(a, b, ...) TL_ASSERT_CMP(uint64_t, PRIu64, a, <, b, __VA_ARGS__)
#define ASSERT_UINT_LE(a, b, ...) TL_ASSERT_CMP(uint64_t, PRIu64, a, <=, b, __VA_ARGS__)
#define ASSERT_UINT_GT(a, b, ...) TL_ASSERT_CMP(uint64_t, PRIu64, a, >, b, __VA_ARGS__)
#define ASSERT_UINT_GE(a, b, ...) TL_ASSERT_CMP(uint64_t, PRIu64, a, >=, b, __VA_ARGS__)

#define ASSERT_DOUBLE_LT(a, b, ...) TL_ASSERT_CMP(double, ".9g", a, <, b, __VA_ARGS__)
#define ASSERT_DOUBLE_LE(a, b, ...) TL_ASSERT_CMP(double, ".9g", a, <=, b, __VA_ARGS__)
#define ASSERT_DOUBLE_GT(a, b, ...) TL_ASSERT_CMP(double, ".9g", a, >, b, __VA_ARGS__)
#define ASSERT_DOUBLE_GE(a, b, ...) TL_ASSERT_CMP(double, ".9g", a, >=, b, __VA_ARGS__)

/* Pointers. */
#define ASSERT_NULL(p, ...)                                                                         \
	do {                                                                                        \
		const void *tl_p_ = (p);                                                            \
		if (tl_p_ != NULL) {                                                                \
			char tl_v_[64];                                                             \
			snprintf(tl_v_, sizeof(tl_v_), "%p", tl_p_);                                \
			tl_fail_values(__FILE__, __LINE__, #p " == NULL", tl_v_, TL_MSG(__VA_ARGS__)); \
		}                                                                                   \
	} while (0)
#define ASSERT_NOT_NULL(p, ...)                                                                     \
	do {                                                                                        \
		if ((p) == NULL) {                                                                  \
			tl_fail_values(__FILE__, __LINE__, #p " != NULL", "NULL", TL_MSG(__VA_ARGS__)); \
		}                                                                                   \
	} while (0)

/* Strings, NULL allowed (it equals only NULL). */
bool tl_str_eq(const char *a, const char *b);
void tl_fail_str(const char *file, int line, const char *expr, const char *a, const char *op, const char *b,
		 const char *fmt, ...) __attribute__((format(printf, 7, 8), noreturn));

#define ASSERT_STR_EQ(a, b, ...)                                                                     \
	do {                                                                                         \
		const char *tl_a_ = (a), *tl_b_ = (b);                                               \
		if (!tl_str_eq(tl_a_, tl_b_)) {                                                      \
			tl_fail_str(__FILE__, __LINE__, #a " == " #b, tl_a_, "==", tl_b_, TL_MSG(__VA_ARGS__)); \
		}                                                                                    \
	} while (0)
#define ASSERT_STR_NE(a, b, ...)                                                                     \
	do {                                                                                         \
		const char *tl_a_ = (a), *tl_b_ = (b);                                               \
		if (tl_str_eq(tl_a_, tl_b_)) {                                                       \
			tl_fail_str(__FILE__, __LINE__, #a " != " #b, tl_a_, "!=", tl_b_, TL_MSG(__VA_ARGS__)); \
		}                                                                                    \
	} while (0)
/* a contains b (a NULL a contains nothing). */
#define ASSERT_STR_CONTAINS(a, b, ...)                                                               \
	do {                                                                                         \
		const char *tl_a_ = (a), *tl_b_ = (b);                                               \
		if (tl_a_ == NULL || strstr(tl_a_, tl_b_) == NULL) {                                 \
			tl_fail_str(__FILE__, __LINE__, #a " contains " #b, tl_a_, "does not contain", tl_b_, \
				    TL_MSG(__VA_ARGS__));                                            \
		}                                                                                    \
	} while (0)

/* A C call that returns 0 or more, or a negative errno: prints the errno's
 * name on failure. Evaluates to nothing; use ASSERT_GE for the value. */
void tl_fail_errno(const char *file, int line, const char *expr, int64_t r, const char *fmt, ...)
	__attribute__((format(printf, 5, 6), noreturn));
#define ASSERT_OK(expr, ...)                                                                  \
	do {                                                                                  \
		int64_t tl_r_ = (int64_t)(expr);                                              \
		if (tl_r_ < 0) {                                                              \
			tl_fail_errno(__FILE__, __LINE__, #expr, tl_r_, TL_MSG(__VA_ARGS__)); \
		}                                                                             \
	} while (0)
