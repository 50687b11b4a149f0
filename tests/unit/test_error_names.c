/* SPDX-License-Identifier: Apache-2.0 */
/* libregen's REGEN_ERROR_* constants (client/include/regen.h) and the IDL
 * agree: every error proto/idl/io.regen.varlink declares has a constant
 * spelling its full name, every constant names an error that
 * io.regen.varlink or org.varlink.service.varlink declares, every error
 * name the daemon sends (proto/errors.h) has one, and each constant is
 * named REGEN_ERROR_ + the error's short name in upper snake case. The
 * files are read from $REGEN_TEST_SOURCE_ROOT. */
#include <check.h>
#include <ctype.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "client/include/regen.h"

#define MAX_NAMES 64

struct name_list {
	int n;
	char macro[MAX_NAMES][64];   /* empty for IDL errors */
	char text[MAX_NAMES][96];
};

/* What the compiler sees; must match the header's text, so that neither
 * list can lose a constant unnoticed. */
static const struct {
	const char *macro, *text;
} compiled[] = {
	{ "REGEN_ERROR_STALE_GENERATION", REGEN_ERROR_STALE_GENERATION },
	{ "REGEN_ERROR_DEVICE_LOST", REGEN_ERROR_DEVICE_LOST },
	{ "REGEN_ERROR_DRAINING", REGEN_ERROR_DRAINING },
	{ "REGEN_ERROR_NOT_PERMITTED", REGEN_ERROR_NOT_PERMITTED },
	{ "REGEN_ERROR_OUT_OF_MEMORY", REGEN_ERROR_OUT_OF_MEMORY },
	{ "REGEN_ERROR_INVALID_OPERAND", REGEN_ERROR_INVALID_OPERAND },
	{ "REGEN_ERROR_NO_SUCH_DEVICE", REGEN_ERROR_NO_SUCH_DEVICE },
	{ "REGEN_ERROR_NO_SUCH_OBJECT", REGEN_ERROR_NO_SUCH_OBJECT },
	{ "REGEN_ERROR_IMPORT_FAILED", REGEN_ERROR_IMPORT_FAILED },
	{ "REGEN_ERROR_INVALID_MESSAGE", REGEN_ERROR_INVALID_MESSAGE },
	{ "REGEN_ERROR_MESSAGE_TOO_LARGE", REGEN_ERROR_MESSAGE_TOO_LARGE },
	{ "REGEN_ERROR_LIMIT_EXCEEDED", REGEN_ERROR_LIMIT_EXCEEDED },
	{ "REGEN_ERROR_TIMEOUT", REGEN_ERROR_TIMEOUT },
	{ "REGEN_ERROR_FAULT_INJECTION_DISABLED", REGEN_ERROR_FAULT_INJECTION_DISABLED },
	{ "REGEN_ERROR_WRONG_ENDPOINT", REGEN_ERROR_WRONG_ENDPOINT },
	{ "REGEN_ERROR_DETACHED", REGEN_ERROR_DETACHED },
	{ "REGEN_ERROR_BACKEND_ERROR", REGEN_ERROR_BACKEND_ERROR },
	{ "REGEN_ERROR_COMM_FAILED", REGEN_ERROR_COMM_FAILED },
	{ "REGEN_ERROR_COMM_TIMEOUT", REGEN_ERROR_COMM_TIMEOUT },
	{ "REGEN_ERROR_COMM_IN_FLIGHT", REGEN_ERROR_COMM_IN_FLIGHT },
	{ "REGEN_ERROR_INVALID_JOB", REGEN_ERROR_INVALID_JOB },
	{ "REGEN_ERROR_INVALID_PROGRAM", REGEN_ERROR_INVALID_PROGRAM },
	{ "REGEN_ERROR_RUN_TORN", REGEN_ERROR_RUN_TORN },
	{ "REGEN_ERROR_INTERFACE_NOT_FOUND", REGEN_ERROR_INTERFACE_NOT_FOUND },
	{ "REGEN_ERROR_METHOD_NOT_FOUND", REGEN_ERROR_METHOD_NOT_FOUND },
	{ "REGEN_ERROR_METHOD_NOT_IMPLEMENTED", REGEN_ERROR_METHOD_NOT_IMPLEMENTED },
	{ "REGEN_ERROR_INVALID_PARAMETER", REGEN_ERROR_INVALID_PARAMETER },
	{ "REGEN_ERROR_PERMISSION_DENIED", REGEN_ERROR_PERMISSION_DENIED },
	{ "REGEN_ERROR_EXPECTED_MORE", REGEN_ERROR_EXPECTED_MORE },
};

static char *read_source(const char *relative)
{
	const char *root = getenv("REGEN_TEST_SOURCE_ROOT");
	char path[1024];
	FILE *f;
	long size;
	char *text;

	ck_assert_msg(root != NULL && root[0] != '\0', "REGEN_TEST_SOURCE_ROOT is not set (run through meson test)");
	snprintf(path, sizeof(path), "%s/%s", root, relative);
	f = fopen(path, "r");
	ck_assert_msg(f != NULL, "cannot open %s", path);
	ck_assert_int_eq(fseek(f, 0, SEEK_END), 0);
	size = ftell(f);
	ck_assert_int_ge(size, 0);
	rewind(f);
	text = calloc(1, (size_t)size + 1);
	ck_assert_ptr_nonnull(text);
	ck_assert_uint_eq(fread(text, 1, (size_t)size, f), (size_t)size);
	fclose(f);
	return text;
}

/* The next line of *p (its '#' comment cut off) into line; false at the end. */
static bool next_line(const char **p, char *line, size_t size)
{
	const char *eol;
	size_t n;
	char *hash;

	if (**p == '\0')
		return false;
	eol = strchr(*p, '\n');
	n = eol != NULL ? (size_t)(eol - *p) : strlen(*p);
	ck_assert_uint_lt(n, size);
	memcpy(line, *p, n);
	line[n] = '\0';
	*p += n + (eol != NULL);
	hash = strchr(line, '#');
	if (hash != NULL && line[0] != '#')
		*hash = '\0';
	return true;
}

static void add(struct name_list *l, const char *macro, const char *text)
{
	ck_assert_int_lt(l->n, MAX_NAMES);
	snprintf(l->macro[l->n], sizeof(l->macro[0]), "%s", macro);
	snprintf(l->text[l->n], sizeof(l->text[0]), "%s", text);
	l->n++;
}

static int find_text(const struct name_list *l, const char *text)
{
	for (int i = 0; i < l->n; i++) {
		if (strcmp(l->text[i], text) == 0)
			return i;
	}
	return -1;
}

/* "interface io.regen" and "error Name (" lines of a .varlink file. */
static void parse_idl(const char *relative, struct name_list *out)
{
	char *text = read_source(relative);
	const char *p = text;
	char line[512], iface[96] = "", name[64], full[sizeof(iface) + sizeof(name)];

	while (next_line(&p, line, sizeof(line))) {
		if (line[0] == '#')
			continue;
		if (sscanf(line, "interface %95s", iface) == 1)
			continue;
		if (sscanf(line, "error %63[A-Za-z0-9]", name) == 1) {
			ck_assert_msg(iface[0] != '\0', "%s: error %s before the interface line", relative, name);
			snprintf(full, sizeof(full), "%s.%s", iface, name);
			add(out, "", full);
		}
	}
	free(text);
}

/* Every `#define PREFIX... "text"` of a header. */
static void parse_defines(const char *relative, const char *prefix, struct name_list *out)
{
	char *text = read_source(relative);
	const char *p = text;
	char line[512], macro[64], value[96];

	while (next_line(&p, line, sizeof(line))) {
		if (strncmp(line, "#define ", 8) != 0 || strncmp(line + 8, prefix, strlen(prefix)) != 0)
			continue;
		ck_assert_msg(sscanf(line, "#define %63s \"%95[^\"]\"", macro, value) == 2,
			      "%s: cannot read the define: %s", relative, line);
		add(out, macro, value);
	}
	free(text);
}

/* "io.regen.StaleGeneration" -> "REGEN_ERROR_STALE_GENERATION". */
static void expected_macro(const char *full, char *out, size_t size)
{
	const char *s = strrchr(full, '.') + 1;
	size_t n = (size_t)snprintf(out, size, "REGEN_ERROR_");

	for (; *s != '\0' && n + 2 < size; s++) {
		if (isupper((unsigned char)*s) && n > strlen("REGEN_ERROR_"))
			out[n++] = '_';
		out[n++] = (char)toupper((unsigned char)*s);
	}
	out[n] = '\0';
}

START_TEST(every_idl_error_has_a_constant)
{
	struct name_list idl = { 0 }, header = { 0 };

	parse_idl("proto/idl/io.regen.varlink", &idl);
	parse_defines("client/include/regen.h", "REGEN_ERROR_", &header);
	ck_assert_int_ge(idl.n, 10);
	for (int i = 0; i < idl.n; i++) {
		ck_assert_msg(find_text(&header, idl.text[i]) >= 0, "%s has no REGEN_ERROR_ constant in regen.h",
			      idl.text[i]);
	}
}
END_TEST

START_TEST(every_constant_is_a_declared_error)
{
	struct name_list idl = { 0 }, header = { 0 };
	char want[64];

	parse_idl("proto/idl/io.regen.varlink", &idl);
	parse_idl("proto/idl/org.varlink.service.varlink", &idl);
	parse_defines("client/include/regen.h", "REGEN_ERROR_", &header);
	for (int i = 0; i < header.n; i++) {
		ck_assert_msg(find_text(&idl, header.text[i]) >= 0, "%s = \"%s\": no such error in the IDL",
			      header.macro[i], header.text[i]);
		expected_macro(header.text[i], want, sizeof(want));
		ck_assert_msg(strcmp(header.macro[i], want) == 0, "\"%s\" is %s, want %s", header.text[i],
			      header.macro[i], want);
	}
}
END_TEST

START_TEST(every_error_the_daemon_sends_has_a_constant)
{
	struct name_list sent = { 0 }, header = { 0 };

	parse_defines("proto/errors.h", "RP_ERR_", &sent);
	parse_defines("client/include/regen.h", "REGEN_ERROR_", &header);
	ck_assert_int_ge(sent.n, 10);
	for (int i = 0; i < sent.n; i++) {
		ck_assert_msg(find_text(&header, sent.text[i]) >= 0, "%s (\"%s\") has no REGEN_ERROR_ constant",
			      sent.macro[i], sent.text[i]);
	}
}
END_TEST

START_TEST(the_compiled_constants_are_the_header)
{
	struct name_list header = { 0 };
	int j;

	parse_defines("client/include/regen.h", "REGEN_ERROR_", &header);
	ck_assert_int_eq(header.n, (int)(sizeof(compiled) / sizeof(compiled[0])));
	for (size_t i = 0; i < sizeof(compiled) / sizeof(compiled[0]); i++) {
		j = find_text(&header, compiled[i].text);
		ck_assert_msg(j >= 0, "%s is not in regen.h", compiled[i].macro);
		ck_assert_str_eq(header.macro[j], compiled[i].macro);
	}
}
END_TEST

static Suite *error_names_suite(void)
{
	Suite *s = suite_create("error_names");
	TCase *tc = tcase_create("regen.h");

	tcase_add_test(tc, every_idl_error_has_a_constant);
	tcase_add_test(tc, every_constant_is_a_declared_error);
	tcase_add_test(tc, every_error_the_daemon_sends_has_a_constant);
	tcase_add_test(tc, the_compiled_constants_are_the_header);
	suite_add_tcase(s, tc);
	return s;
}

int main(void)
{
	SRunner *sr = srunner_create(error_names_suite());
	int failed;

	srunner_run_all(sr, CK_NORMAL);
	failed = srunner_ntests_failed(sr);
	srunner_free(sr);
	return failed == 0 ? EXIT_SUCCESS : EXIT_FAILURE;
}
