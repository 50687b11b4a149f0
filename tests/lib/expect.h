/* SPDX-License-Identifier: Apache-2.0 */
/* The assertion that goes on, beside asserts.h's that end the test: for
 * test programs that run every case and report them all (the GPU tests),
 * where one failure must not hide the next. Prints "  ok: message" or
 * "  FAIL file:line: message" and counts the failure in `failures` (an
 * int the test's exit status reads). Header-only: a test that links
 * nothing else of tests/lib may use it.
 *
 *   TL_EXPECT(gt_failures, err == NULL, "GEMM %dx%d ran", m, n);
 *
 * The GPU tests spell it GT_CHECK (gpu_common.h). */
#pragma once

#include <stdio.h>

#define TL_EXPECT(failures, cond, ...)                                  \
	do {                                                            \
		if (cond) {                                             \
			printf("  ok: ");                               \
		} else {                                                \
			printf("  FAIL %s:%d: ", __FILE__, __LINE__);   \
			(failures)++;                                   \
		}                                                       \
		printf(__VA_ARGS__);                                    \
		printf("\n");                                           \
	} while (0)
