/* SPDX-License-Identifier: Apache-2.0 */
/* Prints proto's op tables as JSON, for what other languages generate from
 * them: the build turns it into the Python client's regen/ops.py
 * (client/python/gen_ops.py), and client/python/tests/test_ops.py holds
 * that file to it. Per op: its id (a ring record's op), its method, its
 * operands in slot order, its call scalars (an enum's names with it), and
 * where a ring record carries its scalars. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <cjson/cJSON.h>
#include "proto/compute.h"

static const char *const types[] = {
	[RP_T_INT] = "int", [RP_T_FLOAT] = "float", [RP_T_BOOL] = "bool",
	[RP_T_STRING] = "string", [RP_T_OBJECT] = "object", [RP_T_ARRAY] = "array",
};

/* The names the record's fields go by (proto/ring.h). */
static const char *const ring_fields[RP_RING_FIELDS] = {
	[RP_RING_FIELD_FLAG] = "flags", [RP_RING_FIELD_EPILOGUE] = "epilogue", [RP_RING_FIELD_COMPUTE] = "compute",
	[RP_RING_FIELD_ALIGNMENT] = "alignment", [RP_RING_FIELD_ALPHA] = "alpha", [RP_RING_FIELD_BETA] = "beta",
	[RP_RING_FIELD_SCALE] = "scale",
};

static cJSON *choices_json(const char *const *choices)
{
	cJSON *a = cJSON_CreateArray();

	for (; *choices; choices++)
		cJSON_AddItemToArray(a, cJSON_CreateString(*choices));
	return a;
}

static const struct rp_op_ring_scalar *ring_scalar(const struct rp_op_spec *spec, const char *name)
{
	for (const struct rp_op_ring_scalar *rs = spec->ring_scalars; rs && rs->name; rs++)
		if (strcmp(rs->name, name) == 0)
			return rs;
	return NULL;
}

int main(void)
{
	cJSON *all = cJSON_CreateObject();
	char *text;

	for (int id = 0; id < RP_OP_COUNT; id++) {
		const struct rp_op_spec *spec = rp_op_get((enum rp_op_id)id);
		cJSON *op = cJSON_AddObjectToObject(all, spec->name);
		cJSON *operands, *scalars, *ring;

		cJSON_AddNumberToObject(op, "id", spec->id);
		cJSON_AddStringToObject(op, "method", spec->method);
		operands = cJSON_AddArrayToObject(op, "operands");
		scalars = cJSON_AddArrayToObject(op, "scalars");
		ring = cJSON_AddArrayToObject(op, "ring");
		for (unsigned i = 0; i < spec->noperands; i++) {
			const struct rp_operand_spec *s = &spec->operands[i];
			cJSON *o = cJSON_CreateObject(), *dtypes;

			cJSON_AddStringToObject(o, "name", s->name);
			cJSON_AddBoolToObject(o, "output", s->role == RP_ROLE_OUT);
			cJSON_AddBoolToObject(o, "required", s->required);
			cJSON_AddNumberToObject(o, "rank", s->rank);
			dtypes = cJSON_AddArrayToObject(o, "dtypes");
			for (int dt = 0; dt < RP_DTYPE_COUNT; dt++)
				if (s->dtypes & RP_DTYPE_BIT(dt))
					cJSON_AddItemToArray(dtypes, cJSON_CreateString(rp_dtype_name(dt)));
			cJSON_AddItemToArray(operands, o);
		}
		for (const struct rp_field *f = spec->scalars; f->name; f++) {
			const struct rp_op_ring_scalar *rs = ring_scalar(spec, f->name);
			cJSON *o = cJSON_CreateObject();

			cJSON_AddStringToObject(o, "name", f->name);
			cJSON_AddStringToObject(o, "type", types[f->type]);
			if (rs && rs->choices)
				cJSON_AddItemToObject(o, "choices", choices_json(rs->choices));
			cJSON_AddItemToArray(scalars, o);
		}
		for (const struct rp_op_ring_scalar *rs = spec->ring_scalars; rs && rs->name; rs++) {
			cJSON *o = cJSON_CreateObject();

			cJSON_AddStringToObject(o, "name", rs->name);
			cJSON_AddStringToObject(o, "field", ring_fields[rs->field]);
			cJSON_AddNumberToObject(o, "flag", rs->flag);
			cJSON_AddItemToArray(ring, o);
		}
	}
	/* The dtypes' codes (enum rp_dtype: a ring record's operand dtype). */
	cJSON *dtypes = cJSON_AddObjectToObject(all, "_dtypes");
	for (int dt = 0; dt < RP_DTYPE_COUNT; dt++)
		cJSON_AddNumberToObject(dtypes, rp_dtype_name((enum rp_dtype)dt), dt);
	/* And their sizes in bytes (what a client allocates and offsets by). */
	cJSON *sizes = cJSON_AddObjectToObject(all, "_dtype_sizes");
	for (int dt = 0; dt < RP_DTYPE_COUNT; dt++)
		cJSON_AddNumberToObject(sizes, rp_dtype_name((enum rp_dtype)dt), (double)rp_dtype_size((enum rp_dtype)dt));
	text = cJSON_Print(all);
	puts(text);
	free(text);
	cJSON_Delete(all);
	return 0;
}
