/* SPDX-License-Identifier: Apache-2.0 */
/* Prints proto's op tables as JSON, so that clients written in other
 * languages can be held to them (client/python/tests/test_ops.py compares
 * regen/ops.py with this). */
#include <stdio.h>
#include <stdlib.h>
#include <cjson/cJSON.h>
#include "proto/compute.h"

static const char *const types[] = {
	[RP_T_INT] = "int", [RP_T_FLOAT] = "float", [RP_T_BOOL] = "bool",
	[RP_T_STRING] = "string", [RP_T_OBJECT] = "object", [RP_T_ARRAY] = "array",
};

int main(void)
{
	cJSON *all = cJSON_CreateObject();
	char *text;

	for (int id = 0; id < RP_OP_COUNT; id++) {
		const struct rp_op_spec *spec = rp_op_get((enum rp_op_id)id);
		cJSON *op = cJSON_AddObjectToObject(all, spec->name);
		cJSON *operands = cJSON_AddArrayToObject(op, "operands");
		cJSON *scalars = cJSON_AddArrayToObject(op, "scalars");

		cJSON_AddStringToObject(op, "method", spec->method);
		for (unsigned i = 0; i < spec->noperands; i++) {
			const struct rp_operand_spec *s = &spec->operands[i];
			cJSON *o = cJSON_CreateObject(), *dtypes = cJSON_AddArrayToObject(o, "dtypes");

			cJSON_AddStringToObject(o, "name", s->name);
			cJSON_AddBoolToObject(o, "output", s->role == RP_ROLE_OUT);
			cJSON_AddBoolToObject(o, "required", s->required);
			cJSON_AddNumberToObject(o, "rank", s->rank);
			for (int dt = 0; dt < RP_DTYPE_COUNT; dt++)
				if (s->dtypes & RP_DTYPE_BIT(dt))
					cJSON_AddItemToArray(dtypes, cJSON_CreateString(rp_dtype_name(dt)));
			cJSON_AddItemToArray(operands, o);
		}
		for (const struct rp_field *f = spec->scalars; f->name; f++) {
			cJSON *o = cJSON_CreateObject();
			cJSON_AddStringToObject(o, "name", f->name);
			cJSON_AddStringToObject(o, "type", types[f->type]);
			cJSON_AddItemToArray(scalars, o);
		}
	}
	text = cJSON_Print(all);
	puts(text);
	free(text);
	cJSON_Delete(all);
	return 0;
}
