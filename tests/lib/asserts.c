/* SPDX-License-Identifier: Apache-2.0 */
/* The assertions' failure paths; see asserts.h. */
#include <stdarg.h>
#include <stdlib.h>
#include <string.h>
#include "tests/lib/asserts.h"

__attribute__((noreturn, format(printf, 5, 0)))
static void fail_with(const char *file, int line, const char *expr, const char *values, const char *fmt, va_list ap)
{
	char what[4096];

	snprintf(what, sizeof(what), "%s (%s)", expr, values);
	tl_failv(file, line, what, fmt, ap);
}

void tl_fail_values(const char *file, int line, const char *expr, const char *values, const char *fmt, ...)
{
	va_list ap;

	va_start(ap, fmt);
	fail_with(file, line, expr, values, fmt, ap);
}

bool tl_str_eq(const char *a, const char *b)
{
	return a == b || (a != NULL && b != NULL && strcmp(a, b) == 0);
}

void tl_fail_str(const char *file, int line, const char *expr, const char *a, const char *op, const char *b,
		 const char *fmt, ...)
{
	char values[2048];
	va_list ap;

	snprintf(values, sizeof(values), "%s%.900s%s %s %s%.900s%s", a ? "\"" : "", a ? a : "NULL", a ? "\"" : "", op,
		 b ? "\"" : "", b ? b : "NULL", b ? "\"" : "");
	va_start(ap, fmt);
	fail_with(file, line, expr, values, fmt, ap);
}

void tl_fail_errno(const char *file, int line, const char *expr, int64_t r, const char *fmt, ...)
{
	char values[160];
	va_list ap;

	snprintf(values, sizeof(values), "= %" PRId64 ", %s", r, r >= -4095 ? strerror((int)-r) : "not an errno");
	va_start(ap, fmt);
	fail_with(file, line, expr, values, fmt, ap);
}
