/* SPDX-License-Identifier: Apache-2.0 */
/* Parameter tables: any JSON checked with rp_params_check against the
 * field tables of every method regend serves (as the IDL declares them;
 * the first input byte picks the table), then read with the typed getters.
 * Invariants: a refusal is InvalidParameter naming a field that is given
 * or required; after a pass, each getter agrees with the table's type (an
 * int field reads with rp_params_uint unless negative, a float with
 * rp_params_double, and so on) and required fields are never absent. */
#include <math.h>

#include "fuzz_common.h"
#include "proto/params.h"

struct table {
	const char *method;
	struct rp_field fields[16];
};

/* Kept in step with the IDL (proto/idl) by hand; a table missing here only
 * loses coverage, never correctness. */
static const struct table tables[] = {
	{ "io.regen.Memory.ImportBuffer", { { "device", RP_T_INT, true }, { "kind", RP_T_STRING, true },
					    { "size", RP_T_INT, true }, { "offset", RP_T_INT, false },
					    { "fd", RP_T_INT, false }, { "handle", RP_T_STRING, false }, { NULL, 0, false } } },
	{ "io.regen.Memory.CloseBuffer", { { "buffer", RP_T_STRING, true }, { NULL, 0, false } } },
	{ "io.regen.Memory.ImportEvent", { { "device", RP_T_INT, true }, { "handle", RP_T_STRING, true }, { NULL, 0, false } } },
	{ "io.regen.Memory.CloseEvent", { { "event", RP_T_STRING, true }, { NULL, 0, false } } },
	{ "io.regen.Device.Restart", { { "device", RP_T_INT, false }, { "reason", RP_T_STRING, false },
				       { "deadline_ms", RP_T_INT, false }, { NULL, 0, false } } },
	{ "io.regen.Device.Release", { { "device", RP_T_INT, false }, { "reason", RP_T_STRING, false }, { NULL, 0, false } } },
	{ "io.regen.Device.InjectFault", { { "device", RP_T_INT, true }, { "kind", RP_T_STRING, true }, { NULL, 0, false } } },
	{ "io.regen.Device.Status", { { NULL, 0, false } } },
	{ "org.varlink.service.GetInterfaceDescription", { { "interface", RP_T_STRING, true }, { NULL, 0, false } } },
	{ "io.regen.Worker.Ready", { { "pid", RP_T_INT, true }, { "worker_socket", RP_T_STRING, true },
				     { "backend", RP_T_STRING, true }, { "memory_used", RP_T_INT, true },
				     { "memory_baseline", RP_T_INT, true }, { NULL, 0, false } } },
	{ "mixed", { { "i", RP_T_INT, false }, { "f", RP_T_FLOAT, false }, { "b", RP_T_BOOL, false },
		     { "s", RP_T_STRING, false }, { "o", RP_T_OBJECT, false }, { "a", RP_T_ARRAY, false }, { NULL, 0, false } } },
};

static const char *const kinds[] = { "host_fd", "cuda_ipc", "cuda_fd", NULL };

static void check_getters(const cJSON *params, const struct rp_field *f)
{
	const cJSON *item = cJSON_GetObjectItemCaseSensitive(params, f->name);
	bool absent = item == NULL || cJSON_IsNull(item);
	struct rp_error err = { 0 };
	uint64_t u;
	double d;
	bool b;
	const char *s;
	int e, r = 0;

	FZ_CHECK(!(f->required && absent), "required %s absent after a pass", f->name);
	switch (f->type) {
	case RP_T_INT:
		r = rp_params_uint(params, f->name, UINT64_MAX, 7, &u, &err);
		if (absent)
			FZ_CHECK(r == 1 && u == 7, "absent %s read as %d", f->name, r);
		else if (item->valuedouble >= 0)
			FZ_CHECK(r == 0 && (double)u == item->valuedouble, "int %s read back as %d", f->name, r);
		r = rp_params_uint(params, f->name, 1000, 7, &u, &err);
		FZ_CHECK(r < 0 || u <= 1000, "uint over its max");
		break;
	case RP_T_FLOAT:
		r = rp_params_double(params, f->name, 0.5, &d, &err);
		FZ_CHECK(absent ? r == 1 : (r == 0 && isfinite(d)), "float %s read as %d", f->name, r);
		break;
	case RP_T_REAL:
		r = rp_params_real(params, f->name, 0.5, &d, &err);
		FZ_CHECK(absent ? r == 1 : r == 0, "real %s read as %d", f->name, r);
		break;
	case RP_T_BOOL:
		r = rp_params_bool(params, f->name, false, &b, &err);
		FZ_CHECK(absent ? r == 1 : r == 0, "bool %s read as %d", f->name, r);
		break;
	case RP_T_STRING:
		r = rp_params_string(params, f->name, 0, NULL, &s, &err);
		FZ_CHECK(absent ? r == 1 : (r == 0) == (item->valuestring[0] != '\0'), "string %s read as %d", f->name, r);
		if (r == 0)
			FZ_CHECK(s[0] != '\0', "empty string accepted");
		r = rp_params_string(params, f->name, 8, NULL, &s, &err);
		FZ_CHECK(r != 0 || strlen(s) <= 8, "string over its max length");
		r = rp_params_enum(params, f->name, kinds, -1, &e, &err);
		FZ_CHECK(r != 0 || (e >= 0 && e < 3 && strcmp(kinds[e], item->valuestring) == 0), "enum picked %d", e);
		break;
	case RP_T_OBJECT:
	case RP_T_ARRAY:
		break;
	}
	if (r < 0) {
		fz_check_error(r, &err, f->name);
		FZ_CHECK(strcmp(err.name, RP_ERR_INVALID_PARAMETER) == 0, "getter error %s", err.name);
	}
	rp_error_clear(&err);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
	const struct table *t;
	struct rp_error err = { 0 };
	cJSON *params;
	int r;

	if (size < 1)
		return 0;
	t = &tables[data[0] % (sizeof(tables) / sizeof(tables[0]))];
	params = fz_json(data + 1, size - 1);
	if (params == NULL)
		return 0;
	r = rp_params_check(params, t->fields, &err);
	if (r < 0) {
		const cJSON *named;
		bool known = false;

		fz_check_error(r, &err, t->method);
		FZ_CHECK(strcmp(err.name, RP_ERR_INVALID_PARAMETER) == 0, "%s: %s", t->method, err.name);
		named = cJSON_GetObjectItemCaseSensitive(err.params, "parameter");
		FZ_CHECK(cJSON_IsString(named), "InvalidParameter names nothing");
		known = strcmp(named->valuestring, "parameters") == 0 ||
			cJSON_GetObjectItemCaseSensitive(params, named->valuestring) != NULL;
		for (const struct rp_field *f = t->fields; f->name && !known; f++)
			known = f->required && strcmp(f->name, named->valuestring) == 0;
		FZ_CHECK(known, "%s: InvalidParameter names '%s', neither given nor required", t->method, named->valuestring);
		rp_error_clear(&err);
	} else {
		FZ_CHECK(cJSON_IsObject(params), "non-object passed");
		for (const struct rp_field *f = t->fields; f->name; f++)
			check_getters(params, f);
	}
	cJSON_Delete(params);
	return 0;
}
