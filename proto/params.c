/* SPDX-License-Identifier: Apache-2.0 */
/* Typed access to call parameters, each error naming the parameter. */
#include <errno.h>
#include <math.h>
#include <string.h>

#include "errors.h"
#include "params.h"

/* 2^53: beyond it a JSON number (a double) no longer holds every integer,
 * so a client's 2^53 + 1 would silently become 2^53. */
#define INT_EXACT_MAX 9007199254740992.0

static bool is_integer(const cJSON *item)
{
	double d;

	if (!cJSON_IsNumber(item))
		return false;
	d = item->valuedouble;
	return isfinite(d) && d == trunc(d) && fabs(d) <= INT_EXACT_MAX;
}

static bool is_float(const cJSON *item)
{
	/* cJSON turns 1e999 into infinity; JSON itself has no such number. */
	return cJSON_IsNumber(item) && isfinite(item->valuedouble);
}

/* The non-finite values a RP_T_REAL may spell, and what they stand for. */
static bool special_real(const cJSON *item, double *v)
{
	const char *s = cJSON_GetStringValue(item);

	if (s == NULL)
		return false;
	if (strcmp(s, "inf") == 0)
		*v = INFINITY;
	else if (strcmp(s, "-inf") == 0)
		*v = -INFINITY;
	else if (strcmp(s, "nan") == 0)
		*v = NAN;
	else
		return false;
	return true;
}

static bool type_ok(const cJSON *item, enum rp_type type)
{
	double v;

	switch (type) {
	case RP_T_INT:
		return is_integer(item);
	case RP_T_FLOAT:
		return is_float(item);
	case RP_T_REAL:
		return is_float(item) || special_real(item, &v);
	case RP_T_BOOL:
		return cJSON_IsBool(item);
	case RP_T_STRING:
		return cJSON_IsString(item);
	case RP_T_OBJECT:
		return cJSON_IsObject(item);
	case RP_T_ARRAY:
		return cJSON_IsArray(item);
	}
	return false;
}

static const struct rp_field *field_find(const struct rp_field *fields, const char *name)
{
	for (const struct rp_field *f = fields; f->name != NULL; f++) {
		if (strcmp(f->name, name) == 0)
			return f;
	}
	return NULL;
}

int rp_params_check(const cJSON *params, const struct rp_field *fields, struct rp_error *err)
{
	const cJSON *item, *other;

	if (!cJSON_IsObject(params))
		return rp_error_invalid_parameter(err, "parameters");

	cJSON_ArrayForEach(item, params) {
		const struct rp_field *f = field_find(fields, item->string);

		if (f == NULL)
			return rp_error_invalid_parameter(err, item->string);
		/* A key given twice is ambiguous: cJSON would pick the first,
		 * another parser the last. Only known keys get here, so the
		 * scan is bounded by the field list's length. */
		for (other = params->child; other != item; other = other->next) {
			if (strcmp(other->string, item->string) == 0)
				return rp_error_invalid_parameter(err, item->string);
		}
		if (cJSON_IsNull(item)) {
			if (f->required)
				return rp_error_invalid_parameter(err, f->name);
			continue;
		}
		if (!type_ok(item, f->type))
			return rp_error_invalid_parameter(err, f->name);
	}
	for (const struct rp_field *f = fields; f->name != NULL; f++) {
		if (f->required && cJSON_GetObjectItemCaseSensitive(params, f->name) == NULL)
			return rp_error_invalid_parameter(err, f->name);
	}
	return 0;
}

/* The item, or NULL when absent or null (null means "not given"). */
static const cJSON *lookup(const cJSON *params, const char *name)
{
	const cJSON *item = cJSON_GetObjectItemCaseSensitive(params, name);

	return cJSON_IsNull(item) ? NULL : item;
}

int rp_params_uint(const cJSON *params, const char *name, uint64_t max, uint64_t def, uint64_t *out,
		   struct rp_error *err)
{
	const cJSON *item = lookup(params, name);
	uint64_t v;

	if (item == NULL) {
		*out = def;
		return 1;
	}
	if (!is_integer(item) || item->valuedouble < 0)
		return rp_error_invalid_parameter(err, name);
	v = (uint64_t)item->valuedouble;
	if (v > max)
		return rp_error_invalid_parameter(err, name);
	*out = v;
	return 0;
}

int rp_params_double(const cJSON *params, const char *name, double def, double *out, struct rp_error *err)
{
	const cJSON *item = lookup(params, name);

	if (item == NULL) {
		*out = def;
		return 1;
	}
	if (!is_float(item))
		return rp_error_invalid_parameter(err, name);
	*out = item->valuedouble;
	return 0;
}

int rp_params_real(const cJSON *params, const char *name, double def, double *out, struct rp_error *err)
{
	const cJSON *item = lookup(params, name);

	if (item == NULL) {
		*out = def;
		return 1;
	}
	if (is_float(item)) {
		*out = item->valuedouble;
		return 0;
	}
	if (special_real(item, out))
		return 0;
	return rp_error_invalid_parameter(err, name);
}

int rp_params_bool(const cJSON *params, const char *name, bool def, bool *out, struct rp_error *err)
{
	const cJSON *item = lookup(params, name);

	if (item == NULL) {
		*out = def;
		return 1;
	}
	if (!cJSON_IsBool(item))
		return rp_error_invalid_parameter(err, name);
	*out = cJSON_IsTrue(item);
	return 0;
}

int rp_params_string(const cJSON *params, const char *name, size_t max_len, const char *def, const char **out,
		     struct rp_error *err)
{
	const cJSON *item = lookup(params, name);
	size_t len;

	if (item == NULL) {
		*out = def;
		return 1;
	}
	if (!cJSON_IsString(item))
		return rp_error_invalid_parameter(err, name);
	len = strlen(item->valuestring);
	if (len == 0 || (max_len > 0 && len > max_len))
		return rp_error_invalid_parameter(err, name);
	*out = item->valuestring;
	return 0;
}

int rp_params_enum(const cJSON *params, const char *name, const char *const *choices, int def, int *out,
		   struct rp_error *err)
{
	const cJSON *item = lookup(params, name);

	if (item == NULL) {
		*out = def;
		return 1;
	}
	if (!cJSON_IsString(item))
		return rp_error_invalid_parameter(err, name);
	for (int i = 0; choices[i] != NULL; i++) {
		if (strcmp(choices[i], item->valuestring) == 0) {
			*out = i;
			return 0;
		}
	}
	return rp_error_invalid_parameter(err, name);
}
