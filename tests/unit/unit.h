/* SPDX-License-Identifier: Apache-2.0 */
/* What every Check program of tests/unit ends with: run the suite, exit 0
 * when every test passed. */
#pragma once

#include <check.h>

static inline int unit_run(Suite *s)
{
	SRunner *sr = srunner_create(s);
	int failed;

	srunner_run_all(sr, CK_NORMAL);
	failed = srunner_ntests_failed(sr);
	srunner_free(sr);
	return failed == 0 ? 0 : 1;
}
