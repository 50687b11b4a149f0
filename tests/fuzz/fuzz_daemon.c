/* SPDX-License-Identifier: Apache-2.0 */
/* What every reply of the daemon must be, read from the IDL itself: the
 * error declarations of every interface (io.regen's and org.varlink.service's
 * among them) give each error's name and parameters, and a reply is held to
 * them. */
#include <ctype.h>
#include <math.h>
#include "fuzz_daemon.h"
#include "proto/idl.h"

#define IDL_ERRORS_MAX 64
#define IDL_FIELDS_MAX 8

struct idl_error {
	char name[96];                  /* "io.regen.NoSuchObject" */
	unsigned nfields;
	struct {
		char name[32];
		char type[16];          /* "int", "string", "bool", "float"; others not checked */
		bool optional;
	} fields[IDL_FIELDS_MAX];
};

static struct idl_error idl_errors[IDL_ERRORS_MAX];
static unsigned nidl_errors;

static const char *skip_space(const char *p)
{
	while (*p == ' ' || *p == '\t')
		p++;
	return p;
}

/* One "error Name (a: int, b: ?string)" line of interface iface. */
static void parse_error_line(const char *iface, const char *line)
{
	struct idl_error *e;
	const char *p = line + strlen("error ");
	size_t n = strcspn(p, " (");

	FZ_CHECK(nidl_errors < IDL_ERRORS_MAX, "more IDL errors than the table holds");
	e = &idl_errors[nidl_errors++];
	snprintf(e->name, sizeof(e->name), "%s.%.*s", iface, (int)n, p);
	p = strchr(p, '(');
	FZ_CHECK(p != NULL, "IDL error line without fields: %s", line);
	p++;
	while (*(p = skip_space(p)) && *p != ')') {
		size_t len = strcspn(p, ":");
		FZ_CHECK(e->nfields < IDL_FIELDS_MAX && p[len] == ':', "IDL error %s: cannot read its fields", e->name);
		snprintf(e->fields[e->nfields].name, sizeof(e->fields[0].name), "%.*s", (int)len, p);
		p = skip_space(p + len + 1);
		e->fields[e->nfields].optional = *p == '?';
		if (*p == '?')
			p++;
		len = strcspn(p, ",) ");
		snprintf(e->fields[e->nfields].type, sizeof(e->fields[0].type), "%.*s", (int)len, p);
		e->nfields++;
		p += len;
		p = skip_space(p);
		if (*p == ',')
			p++;
	}
}

void fz_idl_errors_load(void)
{
	if (nidl_errors)
		return;
	for (size_t i = 0; i < rp_interfaces_count; i++) {
		const char *text = rp_interfaces[i].description;
		const char *name = rp_interfaces[i].name;
		for (const char *line = text; *line;) {
			const char *p = skip_space(line);
			size_t len = strcspn(line, "\n");
			if (strncmp(p, "error ", 6) == 0) {
				char copy[512];
				snprintf(copy, sizeof(copy), "%.*s", (int)strcspn(p, "\n"), p);
				parse_error_line(name, copy);
			}
			line += len + (line[len] == '\n');
		}
	}
	FZ_CHECK(nidl_errors >= 20, "only %u errors read from the IDL", nidl_errors);
}

static const struct idl_error *find_error(const char *name)
{
	for (unsigned i = 0; i < nidl_errors; i++)
		if (strcmp(idl_errors[i].name, name) == 0)
			return &idl_errors[i];
	return NULL;
}

bool fz_idl_error_known(const char *name)
{
	fz_idl_errors_load();
	return find_error(name) != NULL;
}

static bool has_type(const cJSON *v, const char *type)
{
	if (strcmp(type, "int") == 0)
		return cJSON_IsNumber(v) && isfinite(v->valuedouble) && v->valuedouble == floor(v->valuedouble);
	if (strcmp(type, "float") == 0)
		return cJSON_IsNumber(v);
	if (strcmp(type, "string") == 0)
		return cJSON_IsString(v);
	if (strcmp(type, "bool") == 0)
		return cJSON_IsBool(v);
	return true;
}

void fz_check_reply(const char *text, size_t len, struct rp_call *out, const char *where)
{
	struct rp_error err = { 0 };
	const struct idl_error *e;
	const cJSON *item;
	const char *why;

	fz_idl_errors_load();
	FZ_CHECK(memchr(text, '\0', len) == NULL, "%s: a reply holds a NUL", where);
	why = rp_text_refusal(text, len);
	FZ_CHECK(why == NULL, "%s: a reply a client must refuse (%s): %.*s", where, why, (int)(len > 300 ? 300 : len), text);
	FZ_CHECK(rp_call_parse(text, len, out, &err) == 0, "%s: a reply that does not parse: %.*s", where,
		 (int)(len > 300 ? 300 : len), text);
	FZ_CHECK(out->method == NULL, "%s: the daemon sent a call where a reply was due: %s", where, out->method);
	if (!out->error)
		return;
	e = find_error(out->error);
	FZ_CHECK(e != NULL, "%s: error %s is not in the IDL", where, out->error);
	for (unsigned i = 0; i < e->nfields; i++) {
		item = cJSON_GetObjectItemCaseSensitive(out->params, e->fields[i].name);
		FZ_CHECK(item != NULL || e->fields[i].optional, "%s: %s without its parameter %s: %.*s", where, e->name,
			 e->fields[i].name, (int)(len > 300 ? 300 : len), text);
		FZ_CHECK(item == NULL || (e->fields[i].optional && cJSON_IsNull(item)) || has_type(item, e->fields[i].type),
			 "%s: %s's %s is not %s: %.*s", where, e->name, e->fields[i].name, e->fields[i].type,
			 (int)(len > 300 ? 300 : len), text);
	}
	cJSON_ArrayForEach(item, out->params) {
		unsigned i;
		for (i = 0; i < e->nfields; i++)
			if (strcmp(item->string, e->fields[i].name) == 0)
				break;
		FZ_CHECK(i < e->nfields, "%s: %s carries %s, which the IDL does not give it: %.*s", where, e->name,
			 item->string, (int)(len > 300 ? 300 : len), text);
	}
}
