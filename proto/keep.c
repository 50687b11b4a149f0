/* SPDX-License-Identifier: Apache-2.0 */
/* io.regen.Keep's messages: Keep, Commit, TakeBack, Drop, List and Kept. */
#include <errno.h>
#include <inttypes.h>
#include <math.h>
#include <stdio.h>
#include <string.h>

#include "errors.h"
#include "frame.h"
#include "keep.h"
#include "params.h"

static const char *const kind_names[] = { "host_fd", "cuda_fd", NULL };

const char *rp_memory_kind_name(enum rp_memory_kind kind)
{
	return (unsigned)kind < RP_MEMORY_KINDS ? kind_names[kind] : NULL;
}

int rp_kept_name_check(const char *name, struct rp_error *err)
{
	size_t len = name != NULL ? strlen(name) : 0;

	if (len == 0 || len > RP_KEPT_NAME_MAX)
		return rp_error_invalid_parameter(err, "name");
	for (size_t i = 0; i < len; i++) {
		unsigned char c = (unsigned char)name[i];

		if (!((c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') ||
		      strchr("_.:-", c) != NULL))
			return rp_error_invalid_parameter(err, "name");
	}
	return 0;
}

char *rp_kept_key_text(const char *job, const uint32_t *rank, const char *name, char *buf, size_t size)
{
	if (rank == NULL)
		snprintf(buf, size, "%s", job);
	else if (name == NULL)
		snprintf(buf, size, "%s/%" PRIu32, job, *rank);
	else
		snprintf(buf, size, "%s/%" PRIu32 "/%s", job, *rank, name);
	return buf;
}

/* The key's fields a method takes: job (a stated job's rule), rank, name.
 * A field the method requires was checked present by the field table. */
static int decode_key(const cJSON *params, struct rp_kept_key *key, struct rp_error *err)
{
	const char *job = NULL, *name = NULL;
	uint64_t rank = 0;
	int r;

	memset(key, 0, sizeof(*key));
	if (rp_params_string(params, "job", 0, NULL, &job, err) < 0)
		return -EINVAL;
	if (job != NULL) {
		if (rp_job_check(job, err) < 0)
			return -EINVAL;
		key->has_job = true;
		snprintf(key->job, sizeof(key->job), "%s", job);
	}
	r = rp_params_uint(params, "rank", RP_KEPT_RANK_MAX, 0, &rank, err);
	if (r < 0)
		return -EINVAL;
	key->has_rank = r == 0;
	key->rank = (uint32_t)rank;
	if (rp_params_string(params, "name", 0, NULL, &name, err) < 0)
		return -EINVAL;
	if (name != NULL) {
		if (rp_kept_name_check(name, err) < 0)
			return -EINVAL;
		key->has_name = true;
		snprintf(key->name, sizeof(key->name), "%s", name);
	}
	return 0;
}

static bool add_key(cJSON *p, const struct rp_kept_key *key)
{
	return (!key->has_job || cJSON_AddStringToObject(p, "job", key->job) != NULL) &&
	       (!key->has_rank || cJSON_AddNumberToObject(p, "rank", key->rank) != NULL) &&
	       (!key->has_name || cJSON_AddStringToObject(p, "name", key->name) != NULL);
}

int rp_keep_decode(const cJSON *params, struct rp_keep *out, struct rp_error *err)
{
	static const struct rp_field fields[] = {
		{ "job", RP_T_STRING, false },
		{ "rank", RP_T_INT, true },
		{ "name", RP_T_STRING, true },
		{ "kind", RP_T_STRING, true },
		{ "fd", RP_T_INT, true },
		{ "size", RP_T_INT, true },
		{ "device", RP_T_INT, false },
		{ "lease_ms", RP_T_INT, false },
		{ NULL },
	};
	uint64_t fd = 0, device = 0;
	int kind = -1, has_device, has_lease;

	memset(out, 0, sizeof(*out));
	if (rp_params_check(params, fields, err) < 0 || decode_key(params, &out->key, err) < 0 ||
	    rp_params_enum(params, "kind", kind_names, -1, &kind, err) < 0 ||
	    rp_params_uint(params, "fd", RP_FDS_MAX - 1, 0, &fd, err) < 0 ||
	    rp_params_uint(params, "size", RP_KEPT_SIZE_MAX, 0, &out->size, err) < 0 ||
	    (has_device = rp_params_uint(params, "device", UINT32_MAX, 0, &device, err)) < 0 ||
	    (has_lease = rp_params_uint(params, "lease_ms", UINT32_MAX, 0, &out->lease_ms, err)) < 0)
		return -EINVAL;
	if (out->size == 0)
		return rp_error_invalid_parameter(err, "size");
	/* CUDA memory is a device's; host memory is no device's. */
	if ((kind == RP_MEMORY_CUDA_FD) != (has_device == 0))
		return rp_error_invalid_parameter(err, "device");
	out->kind = (enum rp_memory_kind)kind;
	out->fd = (uint32_t)fd;
	out->has_device = has_device == 0;
	out->device = (uint32_t)device;
	out->has_lease = has_lease == 0;
	return 0;
}

cJSON *rp_keep_encode(const struct rp_keep *req)
{
	cJSON *p = cJSON_CreateObject();
	const char *kind = rp_memory_kind_name(req->kind);

	if (p == NULL || kind == NULL || !add_key(p, &req->key) || cJSON_AddStringToObject(p, "kind", kind) == NULL ||
	    cJSON_AddNumberToObject(p, "fd", req->fd) == NULL ||
	    cJSON_AddNumberToObject(p, "size", (double)req->size) == NULL ||
	    (req->has_device && cJSON_AddNumberToObject(p, "device", req->device) == NULL) ||
	    (req->has_lease && cJSON_AddNumberToObject(p, "lease_ms", (double)req->lease_ms) == NULL)) {
		cJSON_Delete(p);
		return NULL;
	}
	return p;
}

int rp_keep_commit_decode(const cJSON *params, struct rp_keep_commit *out, struct rp_error *err)
{
	static const struct rp_field fields[] = {
		{ "job", RP_T_STRING, false },
		{ "rank", RP_T_INT, true },
		{ "step", RP_T_INT, true },
		{ NULL },
	};

	memset(out, 0, sizeof(*out));
	if (rp_params_check(params, fields, err) < 0 || decode_key(params, &out->key, err) < 0 ||
	    rp_params_uint(params, "step", RP_KEPT_STEP_MAX, 0, &out->step, err) < 0)
		return -EINVAL;
	return 0;
}

cJSON *rp_keep_commit_encode(const struct rp_keep_commit *req)
{
	cJSON *p = cJSON_CreateObject();

	if (p == NULL || !add_key(p, &req->key) || cJSON_AddNumberToObject(p, "step", (double)req->step) == NULL) {
		cJSON_Delete(p);
		return NULL;
	}
	return p;
}

static int decode_select(const cJSON *params, const struct rp_field *fields, struct rp_keep_select *out,
			 struct rp_error *err)
{
	uint64_t uid = 0;
	int r;

	memset(out, 0, sizeof(*out));
	if (rp_params_check(params, fields, err) < 0 || decode_key(params, &out->key, err) < 0)
		return -EINVAL;
	r = rp_params_uint(params, "uid", UINT32_MAX - 1, 0, &uid, err);
	if (r < 0)
		return -EINVAL;
	out->has_uid = r == 0;
	out->uid = (uint32_t)uid;
	return 0;
}

int rp_keep_take_back_decode(const cJSON *params, struct rp_keep_select *out, struct rp_error *err)
{
	static const struct rp_field fields[] = {
		{ "job", RP_T_STRING, false },
		{ "rank", RP_T_INT, true },
		{ "name", RP_T_STRING, true },
		{ "uid", RP_T_INT, false },
		{ NULL },
	};

	return decode_select(params, fields, out, err);
}

int rp_keep_drop_decode(const cJSON *params, struct rp_keep_select *out, struct rp_error *err)
{
	static const struct rp_field fields[] = {
		{ "job", RP_T_STRING, true },
		{ "rank", RP_T_INT, false },
		{ "name", RP_T_STRING, false },
		{ "uid", RP_T_INT, false },
		{ NULL },
	};

	if (decode_select(params, fields, out, err) < 0)
		return -EINVAL;
	/* A name is a name of one set: without a rank it names nothing. */
	if (out->key.has_name && !out->key.has_rank)
		return rp_error_invalid_parameter(err, "name");
	return 0;
}

int rp_keep_list_decode(const cJSON *params, struct rp_keep_select *out, struct rp_error *err)
{
	static const struct rp_field fields[] = {
		{ "job", RP_T_STRING, false },
		{ "uid", RP_T_INT, false },
		{ NULL },
	};

	return decode_select(params, fields, out, err);
}

cJSON *rp_keep_select_encode(const struct rp_keep_select *sel)
{
	cJSON *p = cJSON_CreateObject();

	if (p == NULL || !add_key(p, &sel->key) || (sel->has_uid && cJSON_AddNumberToObject(p, "uid", sel->uid) == NULL)) {
		cJSON_Delete(p);
		return NULL;
	}
	return p;
}

cJSON *rp_kept_encode(const struct rp_kept *k)
{
	cJSON *o = cJSON_CreateObject();
	const char *kind = rp_memory_kind_name(k->kind);

	if (o == NULL || kind == NULL || cJSON_AddStringToObject(o, "job", k->job) == NULL ||
	    cJSON_AddNumberToObject(o, "rank", k->rank) == NULL || cJSON_AddStringToObject(o, "name", k->name) == NULL ||
	    cJSON_AddNumberToObject(o, "uid", k->uid) == NULL || cJSON_AddStringToObject(o, "kind", kind) == NULL ||
	    (k->has_device && cJSON_AddNumberToObject(o, "device", k->device) == NULL) ||
	    cJSON_AddNumberToObject(o, "size", (double)k->size) == NULL ||
	    (k->has_step && cJSON_AddNumberToObject(o, "step", (double)k->step) == NULL) ||
	    cJSON_AddBoolToObject(o, "held", k->held) == NULL ||
	    (k->has_holder_pid && cJSON_AddNumberToObject(o, "holder_pid", (double)k->holder_pid) == NULL) ||
	    cJSON_AddNumberToObject(o, "lease_ms", (double)k->lease_ms) == NULL ||
	    (k->has_expires && cJSON_AddNumberToObject(o, "expires_unix_ms", (double)k->expires_unix_ms) == NULL) ||
	    cJSON_AddNumberToObject(o, "kept_unix_ms", (double)k->kept_unix_ms) == NULL) {
		cJSON_Delete(o);
		return NULL;
	}
	return o;
}

static int refuse(struct rp_error *err, const char *prefix, const char *key)
{
	char name[96];

	snprintf(name, sizeof(name), "%s%s", prefix, key);
	return rp_error_invalid_parameter(err, name);
}

/* A field of a Kept: absent and optional is 1, absent and required (or
 * wrong) is refused. */
static int kept_uint(const cJSON *o, const char *prefix, const char *key, bool required, uint64_t max, uint64_t *out,
		     struct rp_error *err)
{
	int r = rp_params_uint(o, key, max, 0, out, err);

	if (r < 0 || (r == 1 && required))
		return refuse(err, prefix, key);
	return r;
}

static int kept_string(const cJSON *o, const char *prefix, const char *key, char *out, size_t size,
		       struct rp_error *err)
{
	const cJSON *item = cJSON_GetObjectItemCaseSensitive(o, key);

	if (!cJSON_IsString(item) || item->valuestring == NULL || strlen(item->valuestring) >= size)
		return refuse(err, prefix, key);
	memcpy(out, item->valuestring, strlen(item->valuestring) + 1);
	return 0;
}

int rp_kept_decode(const cJSON *o, const char *prefix, struct rp_kept *out, struct rp_error *err)
{
	const cJSON *kind = cJSON_GetObjectItemCaseSensitive(o, "kind");
	const cJSON *held = cJSON_GetObjectItemCaseSensitive(o, "held");
	const cJSON *pid = cJSON_GetObjectItemCaseSensitive(o, "holder_pid");
	uint64_t rank = 0, uid = 0, device = 0;
	int r;

	memset(out, 0, sizeof(*out));
	if (!cJSON_IsObject(o))
		return refuse(err, prefix, "");
	if (kept_string(o, prefix, "job", out->job, sizeof(out->job), err) < 0 ||
	    kept_string(o, prefix, "name", out->name, sizeof(out->name), err) < 0 ||
	    kept_uint(o, prefix, "rank", true, RP_KEPT_RANK_MAX, &rank, err) < 0 ||
	    kept_uint(o, prefix, "uid", true, UINT32_MAX, &uid, err) < 0 ||
	    kept_uint(o, prefix, "size", true, RP_KEPT_SIZE_MAX, &out->size, err) < 0 ||
	    kept_uint(o, prefix, "lease_ms", true, UINT32_MAX, &out->lease_ms, err) < 0 ||
	    kept_uint(o, prefix, "kept_unix_ms", true, RP_KEPT_STEP_MAX, &out->kept_unix_ms, err) < 0)
		return -EINVAL;
	out->rank = (uint32_t)rank;
	out->uid = (uint32_t)uid;
	if (!cJSON_IsString(kind) || kind->valuestring == NULL)
		return refuse(err, prefix, "kind");
	if (strcmp(kind->valuestring, "host_fd") == 0)
		out->kind = RP_MEMORY_HOST_FD;
	else if (strcmp(kind->valuestring, "cuda_fd") == 0)
		out->kind = RP_MEMORY_CUDA_FD;
	else
		return refuse(err, prefix, "kind");
	if (!cJSON_IsBool(held))
		return refuse(err, prefix, "held");
	out->held = cJSON_IsTrue(held);
	if ((r = kept_uint(o, prefix, "device", false, UINT32_MAX, &device, err)) < 0)
		return -EINVAL;
	out->has_device = r == 0;
	out->device = (uint32_t)device;
	if ((r = kept_uint(o, prefix, "step", false, RP_KEPT_STEP_MAX, &out->step, err)) < 0)
		return -EINVAL;
	out->has_step = r == 0;
	if ((r = kept_uint(o, prefix, "expires_unix_ms", false, RP_KEPT_STEP_MAX, &out->expires_unix_ms, err)) < 0)
		return -EINVAL;
	out->has_expires = r == 0;
	if (pid != NULL && !cJSON_IsNull(pid)) {
		if (!cJSON_IsNumber(pid) || !isfinite(pid->valuedouble) || pid->valuedouble != trunc(pid->valuedouble) ||
		    pid->valuedouble < 0 || pid->valuedouble > INT32_MAX)
			return refuse(err, prefix, "holder_pid");
		out->has_holder_pid = true;
		out->holder_pid = (int64_t)pid->valuedouble;
	}
	return 0;
}
