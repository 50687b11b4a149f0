/* SPDX-License-Identifier: Apache-2.0 */
/* An op table held to its method in the IDL, for test_idl (io.regen.Compute)
 * and test_comm_codec (io.regen.Comm): the method's parameters are exactly
 * the table's (operands, scalars, the fields every call takes), with the
 * same optionality; the table is what the worker enforces, the IDL what
 * clients read. */
#pragma once

#include <check.h>
#include <stdbool.h>
#include <stdio.h>
#include <string.h>
#include "proto/compute.h"
#include "proto/idl.h"

/* Whether `name` is one of the op table's fields, and whether the table
 * makes it optional. */
static inline bool op_table_has(const struct rp_op_spec *spec, const char *name, bool *optional)
{
	for (unsigned i = 0; i < spec->noperands; i++) {
		if (strcmp(spec->operands[i].name, name) == 0) {
			*optional = !spec->operands[i].required;
			return true;
		}
	}
	for (const struct rp_field *f = spec->scalars; f->name; f++) {
		if (strcmp(f->name, name) == 0) {
			*optional = !f->required;
			return true;
		}
	}
	for (const struct rp_field *f = rp_compute_common_fields; f->name; f++) {
		if (strcmp(f->name, name) == 0) {
			*optional = !f->required;
			return true;
		}
	}
	return false;
}

static inline void op_table_matches_idl(const struct rp_op_spec *spec, const char *interface)
{
	const char *text = rp_interface_description(interface);
	const char *short_name = strrchr(spec->method, '.') + 1;
	char opener[96];
	unsigned listed = 0, in_table;
	const char *p;

	ck_assert_msg(text != NULL, "no interface %s", interface);
	snprintf(opener, sizeof(opener), "\nmethod %s(", short_name);
	p = strstr(text, opener);
	ck_assert_msg(p != NULL, "%s has no method %s", interface, short_name);
	p += strlen(opener);
	while (*p && *p != ')') {
		char name[64];
		bool optional;
		size_t n;

		p += strspn(p, " \n\t,");
		if (*p == ')')
			break;
		n = strcspn(p, ":");
		snprintf(name, sizeof(name), "%.*s", (int)n, p);
		p += n + 1;
		p += strspn(p, " ");
		ck_assert_msg(op_table_has(spec, name, &optional), "%s: IDL parameter %s is not in the op table",
			      short_name, name);
		ck_assert_msg(optional == (*p == '?'), "%s: %s is %s in the IDL but not in the table", short_name, name,
			      *p == '?' ? "optional" : "required");
		listed++;
		p += strcspn(p, ",)");
	}
	in_table = spec->noperands + RP_COMPUTE_COMMON_FIELDS;
	for (const struct rp_field *f = spec->scalars; f->name; f++)
		in_table++;
	ck_assert_msg(listed == in_table, "%s: the IDL lists %u parameters, the table %u", short_name, listed, in_table);
}
