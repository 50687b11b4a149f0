/* SPDX-License-Identifier: Apache-2.0 */
/* Typed access to call parameters. Every getter names the parameter in its
 * error (org.varlink.service.InvalidParameter {parameter}), so a client
 * learns exactly which field was wrong. */
#pragma once

#include <stdbool.h>
#include <stdint.h>
#include <cjson/cJSON.h>
#include "message.h"

enum rp_type {
	RP_T_INT,      /* JSON number holding an integer (|v| <= 2^53) */
	RP_T_FLOAT,    /* any finite JSON number */
	RP_T_REAL,     /* a finite JSON number, or "inf", "-inf" or "nan" (JSON has no such numbers) */
	RP_T_BOOL,
	RP_T_STRING,
	RP_T_OBJECT,
	RP_T_ARRAY,
};

struct rp_field {
	const char *name;
	enum rp_type type;
	bool required;
};

/* Checks `params` (an object) against a NULL-name-terminated field list:
 * every required field present, every present field of its type (JSON null
 * counts as absent for optional fields), no field the list lacks, and no
 * field given twice. */
int rp_params_check(const cJSON *params, const struct rp_field *fields, struct rp_error *err);

/* Getters: 0 and *out set; 1 when absent (optional) and *out = def;
 * -EINVAL with err set when present but of the wrong type or out of range. */
int rp_params_uint(const cJSON *params, const char *name, uint64_t max, uint64_t def, uint64_t *out, struct rp_error *err);
int rp_params_double(const cJSON *params, const char *name, double def, double *out, struct rp_error *err);
/* A number RP_T_REAL admits: the strings "inf", "-inf" and "nan" too. */
int rp_params_real(const cJSON *params, const char *name, double def, double *out, struct rp_error *err);
int rp_params_bool(const cJSON *params, const char *name, bool def, bool *out, struct rp_error *err);
/* *out points into params (no copy); empty strings are refused; max_len
 * bounds strlen (0: no bound). */
int rp_params_string(const cJSON *params, const char *name, size_t max_len, const char *def, const char **out, struct rp_error *err);
/* Picks the index of the string in `choices` (NULL-terminated). */
int rp_params_enum(const cJSON *params, const char *name, const char *const *choices, int def, int *out, struct rp_error *err);
