/* SPDX-License-Identifier: Apache-2.0 */
/* The embedded Varlink interface definitions (what GetInterfaceDescription
 * returns) and the error names in proto/errors.h must agree: every error we
 * send is declared, as "error <Short>", in the interface its name is in. */
#include <check.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "proto/compute.h"
#include "proto/errors.h"
#include "proto/idl.h"
#include "op_table_idl.h"

static const char *const error_names[] = {
	RP_ERR_STALE_GENERATION,
	RP_ERR_DEVICE_LOST,
	RP_ERR_DRAINING,
	RP_ERR_NOT_PERMITTED,
	RP_ERR_OUT_OF_MEMORY,
	RP_ERR_INVALID_OPERAND,
	RP_ERR_NO_SUCH_DEVICE,
	RP_ERR_NO_SUCH_OBJECT,
	RP_ERR_IMPORT_FAILED,
	RP_ERR_INVALID_MESSAGE,
	RP_ERR_MESSAGE_TOO_LARGE,
	RP_ERR_LIMIT_EXCEEDED,
	RP_ERR_TIMEOUT,
	RP_ERR_FAULT_INJECTION_DISABLED,
	RP_ERR_WRONG_ENDPOINT,
	RP_ERR_DETACHED,
	RP_ERR_BACKEND,
	RP_ERR_COMM_FAILED,
	RP_ERR_COMM_TIMEOUT,
	RP_ERR_COMM_IN_FLIGHT,
	RP_ERR_INVALID_JOB,
	RP_ERR_INVALID_PROGRAM,
	RP_ERR_RUN_TORN,
	RP_ERR_INTERFACE_NOT_FOUND,
	RP_ERR_METHOD_NOT_FOUND,
	RP_ERR_METHOD_NOT_IMPLEMENTED,
	RP_ERR_INVALID_PARAMETER,
	RP_ERR_PERMISSION_DENIED,
	RP_ERR_EXPECTED_MORE,
};
#define N_ERRORS (sizeof(error_names) / sizeof(error_names[0]))

/* The first line that is neither blank nor a comment. */
static const char *first_declaration(const char *text, size_t *len)
{
	const char *p = text;

	while (*p != '\0') {
		const char *eol = strchr(p, '\n');
		size_t n = eol != NULL ? (size_t)(eol - p) : strlen(p);
		const char *q = p;

		while (q < p + n && (*q == ' ' || *q == '\t'))
			q++;
		if (q < p + n && *q != '#') {
			*len = n - (size_t)(q - p);
			return q;
		}
		p += n + (eol != NULL);
	}
	*len = 0;
	return NULL;
}

/* True when some line of text starts with "error <short>" followed by a
 * space or '('. */
static bool declares_error(const char *text, const char *short_name)
{
	size_t n = strlen(short_name);

	for (const char *line = text; line != NULL && *line != '\0';) {
		if (strncmp(line, "error ", 6) == 0 && strncmp(line + 6, short_name, n) == 0 &&
		    (line[6 + n] == ' ' || line[6 + n] == '('))
			return true;
		line = strchr(line, '\n');
		if (line != NULL)
			line++;
	}
	return false;
}

START_TEST(every_interface_describes_itself)
{
	const struct rp_interface *iface = &rp_interfaces[_i];
	char want[256];
	const char *decl;
	size_t len;

	ck_assert_ptr_nonnull(iface->name);
	ck_assert_ptr_nonnull(iface->description);
	ck_assert_uint_gt(strlen(iface->description), 0);
	/* It opens with its comment or straight with its declaration. */
	ck_assert_msg(iface->description[0] == '#' || strncmp(iface->description, "interface ", 10) == 0,
		      "%s starts with neither a comment nor 'interface'", iface->name);
	decl = first_declaration(iface->description, &len);
	ck_assert_ptr_nonnull(decl);
	snprintf(want, sizeof(want), "interface %s", iface->name);
	ck_assert_msg(len == strlen(want) && strncmp(decl, want, len) == 0, "%s declares '%.*s' first", iface->name,
		      (int)len, decl);
	/* Lookup by name gives the same text; names are unique. */
	ck_assert_ptr_eq(rp_interface_description(iface->name), iface->description);
}
END_TEST

START_TEST(the_interfaces_we_serve_are_embedded)
{
	static const char *const names[] = {
		"org.varlink.service", "io.regen", "io.regen.Device", "io.regen.Memory", "io.regen.Compute",
		"io.regen.Worker", "io.regen.Comm", "io.regen.Keep",
	};

	for (size_t i = 0; i < sizeof(names) / sizeof(names[0]); i++)
		ck_assert_msg(rp_interface_description(names[i]) != NULL, "%s missing", names[i]);
	ck_assert_ptr_null(rp_interface_description("io.regen.Nope"));
	ck_assert_ptr_null(rp_interface_description("io.rege"));
	ck_assert_ptr_null(rp_interface_description(""));
}
END_TEST

START_TEST(every_error_is_declared_in_its_interface)
{
	const char *name = error_names[_i];
	const char *dot = strrchr(name, '.');
	char iface[128];
	const char *text;

	ck_assert_ptr_nonnull(dot);
	snprintf(iface, sizeof(iface), "%.*s", (int)(dot - name), name);
	text = rp_interface_description(iface);
	ck_assert_msg(text != NULL, "%s: no interface %s", name, iface);
	ck_assert_msg(declares_error(text, dot + 1), "%s: interface %s has no 'error %s'", name, iface, dot + 1);
}
END_TEST

/* errors.h and the table above list the same names: a new RP_ERR_ macro
 * without its IDL declaration fails here, not in a client. */
START_TEST(the_table_covers_errors_h)
{
	const char *root = getenv("REGEN_TEST_SOURCE_ROOT");
	char path[4096], line[512];
	size_t found = 0;
	FILE *f;

	if (root == NULL)
		root = "../..";
	snprintf(path, sizeof(path), "%s/proto/errors.h", root);
	f = fopen(path, "r");
	ck_assert_msg(f != NULL, "cannot open %s", path);
	while (fgets(line, sizeof(line), f) != NULL) {
		char *q1, *q2;
		bool listed = false;

		if (strncmp(line, "#define RP_ERR_", 15) != 0)
			continue;
		q1 = strchr(line, '"');
		q2 = q1 != NULL ? strchr(q1 + 1, '"') : NULL;
		ck_assert_msg(q2 != NULL, "no string in: %s", line);
		*q2 = '\0';
		for (size_t i = 0; i < N_ERRORS; i++)
			listed = listed || strcmp(error_names[i], q1 + 1) == 0;
		ck_assert_msg(listed, "%s is in errors.h but not in this test's table", q1 + 1);
		found++;
	}
	fclose(f);
	ck_assert_uint_eq(found, N_ERRORS);
}
END_TEST

/* And the other way: every error io.regen declares has a macro. */
START_TEST(every_declared_error_has_a_name)
{
	const char *text = rp_interface_description("io.regen");
	size_t declared = 0;

	ck_assert_ptr_nonnull(text);
	for (const char *line = text; line != NULL && *line != '\0';) {
		if (strncmp(line, "error ", 6) == 0) {
			char full[128];
			size_t n = strcspn(line + 6, " (\n");
			bool known = false;

			snprintf(full, sizeof(full), "io.regen.%.*s", (int)n, line + 6);
			for (size_t i = 0; i < N_ERRORS; i++)
				known = known || strcmp(error_names[i], full) == 0;
			ck_assert_msg(known, "%s is declared but has no RP_ERR_ name", full);
			declared++;
		}
		line = strchr(line, '\n');
		if (line != NULL)
			line++;
	}
	ck_assert_uint_gt(declared, 0);
}
END_TEST

/* Each Compute method's parameters in the IDL are exactly its op table's
 * (op_table_idl.h). */
START_TEST(every_op_table_matches_its_method)
{
	const struct rp_op_spec *spec = rp_op_get((enum rp_op_id)_i);

	ck_assert_ptr_eq(rp_op_find(spec->method), spec);
	op_table_matches_idl(spec, "io.regen.Compute");
}
END_TEST

/* The methods embed_idl.py listed for an interface are the ones its text
 * declares, and each is found back by name. */
START_TEST(every_interface_lists_its_methods)
{
	const struct rp_interface *iface = &rp_interfaces[_i];
	unsigned declared = 0, listed = 0;

	for (const char *line = iface->description; line != NULL && *line != '\0';) {
		if (strncmp(line, "method ", 7) == 0) {
			char full[160];
			bool found = false;

			snprintf(full, sizeof(full), "%s.%.*s", iface->name, (int)strcspn(line + 7, " ("), line + 7);
			for (const char *const *m = iface->methods; *m; m++)
				found = found || strcmp(*m, full) == 0;
			ck_assert_msg(found, "%s is declared but not listed", full);
			ck_assert_ptr_eq(rp_method_interface(full), iface);
			declared++;
		}
		line = strchr(line, '\n');
		if (line != NULL)
			line++;
	}
	for (const char *const *m = iface->methods; *m; m++)
		listed++;
	ck_assert_uint_eq(listed, declared);
	ck_assert_ptr_null(rp_method_interface("io.regen.Compute.Convolve"));
	ck_assert_ptr_null(rp_method_interface("io.regen.Compute"));
}
END_TEST

static bool listed_in(const char *const *names, const char *name)
{
	for (; *names; names++)
		if (strcmp(*names, name) == 0)
			return true;
	return false;
}

/* Every io.regen interface says where it is served, and the endpoints'
 * lists are those sentences: the data plane on the worker socket, the
 * lifecycle on the main socket, the control channel apart. */
START_TEST(every_interface_is_served_somewhere)
{
	static const struct {
		const char *name;
		unsigned served;
	} want[] = {
		{ "io.regen", RP_SERVED_MAIN | RP_SERVED_WORKER },
		{ "io.regen.Device", RP_SERVED_MAIN },
		{ "io.regen.Memory", RP_SERVED_WORKER },
		{ "io.regen.Compute", RP_SERVED_WORKER },
		{ "io.regen.Lane", RP_SERVED_WORKER },
		{ "io.regen.Comm", RP_SERVED_WORKER },
		{ "io.regen.Program", RP_SERVED_WORKER },
		{ "io.regen.Worker", RP_SERVED_CONTROL },
	};

	for (size_t i = 0; i < rp_interfaces_count; i++) {
		const struct rp_interface *iface = &rp_interfaces[i];

		if (strcmp(iface->name, "org.varlink.service") == 0)
			continue;
		ck_assert_msg(iface->served != 0, "%s is served nowhere", iface->name);
		ck_assert_msg(listed_in(rp_main_interfaces, iface->name) == !!(iface->served & RP_SERVED_MAIN), "%s",
			      iface->name);
		ck_assert_msg(listed_in(rp_worker_interfaces, iface->name) == !!(iface->served & RP_SERVED_WORKER),
			      "%s", iface->name);
		ck_assert_msg(listed_in(rp_control_interfaces, iface->name) == !!(iface->served & RP_SERVED_CONTROL),
			      "%s", iface->name);
	}
	for (size_t i = 0; i < sizeof(want) / sizeof(want[0]); i++) {
		const struct rp_interface *iface = NULL;

		for (size_t j = 0; j < rp_interfaces_count; j++)
			if (strcmp(rp_interfaces[j].name, want[i].name) == 0)
				iface = &rp_interfaces[j];
		ck_assert_msg(iface != NULL, "%s missing", want[i].name);
		ck_assert_msg(iface->served == want[i].served, "%s is served at %#x, not %#x", want[i].name,
			      iface->served, want[i].served);
	}
	/* The op tables' methods are served where the worker dispatches them. */
	for (int id = 0; id < RP_OP_COUNT; id++)
		ck_assert(rp_method_interface(rp_op_get((enum rp_op_id)id)->method)->served & RP_SERVED_WORKER);
}
END_TEST

static Suite *idl_suite(void)
{
	Suite *s = suite_create("idl");
	TCase *tc = tcase_create("idl");

	tcase_add_loop_test(tc, every_interface_describes_itself, 0, (int)rp_interfaces_count);
	tcase_add_test(tc, the_interfaces_we_serve_are_embedded);
	tcase_add_loop_test(tc, every_error_is_declared_in_its_interface, 0, (int)N_ERRORS);
	tcase_add_test(tc, the_table_covers_errors_h);
	tcase_add_test(tc, every_declared_error_has_a_name);
	tcase_add_loop_test(tc, every_op_table_matches_its_method, 0, RP_OP_COUNT);
	tcase_add_loop_test(tc, every_interface_lists_its_methods, 0, (int)rp_interfaces_count);
	tcase_add_test(tc, every_interface_is_served_somewhere);
	suite_add_tcase(s, tc);
	return s;
}

int main(void)
{
	SRunner *sr = srunner_create(idl_suite());
	int failed;

	srunner_run_all(sr, CK_NORMAL);
	failed = srunner_ntests_failed(sr);
	srunner_free(sr);
	return failed == 0 ? EXIT_SUCCESS : EXIT_FAILURE;
}
