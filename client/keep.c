/* SPDX-License-Identifier: Apache-2.0 */
/* libregen: kept state (io.regen.Keep), on the main socket. */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include "private.h"
#include "proto/keep.h"

_Static_assert((int)REGEN_MEMORY_HOST_FD == (int)RP_MEMORY_HOST_FD && (int)REGEN_MEMORY_CUDA_FD == (int)RP_MEMORY_CUDA_FD,
	       "libregen's memory kinds are the protocol's");

/* The struct as the protocol has it, into the caller's, as far as its
 * size goes. */
static void kept_copy(const struct rp_kept *k, struct regen_kept *out)
{
	struct regen_kept full;
	size_t size = out->size < sizeof(full) ? out->size : sizeof(full);

	memset(&full, 0, sizeof(full));
	full.size = size;
	snprintf(full.job, sizeof(full.job), "%s", k->job);
	full.rank = k->rank;
	snprintf(full.name, sizeof(full.name), "%s", k->name);
	full.uid = k->uid;
	full.kind = (enum regen_memory_kind)k->kind;
	full.device = k->has_device ? (int)k->device : -1;
	full.bytes = k->size;
	full.has_step = k->has_step;
	full.step = k->step;
	full.held = k->held;
	full.holder_pid = k->has_holder_pid ? k->holder_pid : 0;
	full.lease_ms = (uint32_t)k->lease_ms;
	full.expires_unix_ms = k->has_expires ? (int64_t)k->expires_unix_ms : -1;
	full.kept_unix_ms = (int64_t)k->kept_unix_ms;
	memcpy(out, &full, size);
}

/* The reply's `kept` object into out (may be NULL). */
static int reply_kept(regen_client *c, const char *method, const cJSON *reply, struct regen_kept *out)
{
	struct rp_error err = { 0 };
	struct rp_kept k;

	if (rp_kept_decode(cJSON_GetObjectItemCaseSensitive(reply, "kept"), "kept.", &k, &err) < 0)
		return rc_malformed_reply(c, method, &err);
	if (out != NULL)
		kept_copy(&k, out);
	return 0;
}

static int set_key(regen_client *c, struct rp_kept_key *key, const char *job, int64_t rank, const char *name)
{
	memset(key, 0, sizeof(*key));
	if (job != NULL) {
		if (strlen(job) > RP_JOB_MAX) {
			rc_set_local_error(c, "job \"%.64s...\" is longer than %d bytes", job, RP_JOB_MAX);
			return -EINVAL;
		}
		key->has_job = true;
		snprintf(key->job, sizeof(key->job), "%s", job);
	}
	if (rank >= 0) {
		if (rank > RP_KEPT_RANK_MAX) {
			rc_set_local_error(c, "rank %lld is past %d", (long long)rank, RP_KEPT_RANK_MAX);
			return -EINVAL;
		}
		key->has_rank = true;
		key->rank = (uint32_t)rank;
	}
	if (name != NULL) {
		if (strlen(name) > RP_KEPT_NAME_MAX) {
			rc_set_local_error(c, "name \"%.64s...\" is longer than %d bytes", name, RP_KEPT_NAME_MAX);
			return -EINVAL;
		}
		key->has_name = true;
		snprintf(key->name, sizeof(key->name), "%s", name);
	}
	return 0;
}

REGEN_EXPORT int regen_keep(regen_client *c, const struct regen_keep_args *args, struct regen_kept *out)
{
	struct rp_keep req = { 0 };
	cJSON *params, *reply = NULL;
	int r;

	if (c == NULL || args == NULL || args->name == NULL || args->fd < 0 ||
	    (args->kind != REGEN_MEMORY_HOST_FD && args->kind != REGEN_MEMORY_CUDA_FD) ||
	    (args->kind == REGEN_MEMORY_CUDA_FD) != (args->device >= 0) || (out != NULL && out->size < sizeof(size_t)))
		return -EINVAL;
	r = set_key(c, &req.key, args->job, args->rank, args->name);
	if (r < 0)
		return r;
	req.kind = (enum rp_memory_kind)args->kind;
	req.fd = 0;
	req.size = args->bytes;
	req.has_device = args->device >= 0;
	req.device = args->device >= 0 ? (uint32_t)args->device : 0;
	req.has_lease = args->lease_ms != 0;
	req.lease_ms = args->lease_ms;
	params = rp_keep_encode(&req);
	if (params == NULL)
		return -ENOMEM;
	r = rc_call(c, -1, RP_KEEP_KEEP, params, &args->fd, 1, &reply);
	cJSON_Delete(params);
	if (r == 0)
		r = reply_kept(c, RP_KEEP_KEEP, reply, out);
	cJSON_Delete(reply);
	return r;
}

REGEN_EXPORT int regen_keep_commit(regen_client *c, const char *job, uint32_t rank, uint64_t step)
{
	struct rp_keep_commit req = { .step = step };
	cJSON *params;
	int r;

	if (c == NULL || step > RP_KEPT_STEP_MAX)
		return -EINVAL;
	r = set_key(c, &req.key, job, rank, NULL);
	if (r < 0)
		return r;
	params = rp_keep_commit_encode(&req);
	if (params == NULL)
		return -ENOMEM;
	r = rc_call(c, -1, RP_KEEP_COMMIT, params, NULL, 0, NULL);
	cJSON_Delete(params);
	return r;
}

/* A call that names kept state by job, rank and name (TakeBack, Drop,
 * List): the selection encoded, the call made; *reply the caller's to
 * delete, *fd (where asked) the descriptor the reply carried or -1. */
static int select_call(regen_client *c, const char *method, const char *job, int64_t rank, const char *name,
		       cJSON **reply, int *fd)
{
	struct rp_keep_select sel = { 0 };
	cJSON *params;
	int r = set_key(c, &sel.key, job, rank, name);

	if (r < 0)
		return r;
	params = rp_keep_select_encode(&sel);
	if (params == NULL)
		return -ENOMEM;
	r = fd ? rc_call_fd(c, -1, method, params, NULL, 0, reply, fd) : rc_call(c, -1, method, params, NULL, 0, reply);
	cJSON_Delete(params);
	return r;
}

REGEN_EXPORT int regen_keep_take_back(regen_client *c, const char *job, uint32_t rank, const char *name,
				      struct regen_kept *out, int *fd)
{
	cJSON *reply = NULL;
	int r, got = -1;

	if (c == NULL || name == NULL || fd == NULL || (out != NULL && out->size < sizeof(size_t)))
		return -EINVAL;
	*fd = -1;
	r = select_call(c, RP_KEEP_TAKE_BACK, job, rank, name, &reply, &got);
	if (r == 0 && got < 0) {
		rc_set_local_error(c, "%s: the reply carried no file descriptor", RP_KEEP_TAKE_BACK);
		r = -EPROTO;
	}
	if (r == 0)
		r = reply_kept(c, RP_KEEP_TAKE_BACK, reply, out);
	cJSON_Delete(reply);
	if (r < 0) {
		if (got >= 0)
			close(got);
		return r;
	}
	*fd = got;
	return 0;
}

REGEN_EXPORT int regen_keep_drop(regen_client *c, const char *job, int64_t rank, const char *name, uint64_t *names,
				 uint64_t *bytes)
{
	cJSON *reply = NULL;
	int r;

	if (c == NULL || job == NULL || (name != NULL && rank < 0))
		return -EINVAL;
	r = select_call(c, RP_KEEP_DROP, job, rank, name, &reply, NULL);
	if (r == 0) {
		if (names != NULL)
			*names = (uint64_t)cJSON_GetNumberValue(cJSON_GetObjectItemCaseSensitive(reply, "names"));
		if (bytes != NULL)
			*bytes = (uint64_t)cJSON_GetNumberValue(cJSON_GetObjectItemCaseSensitive(reply, "bytes"));
	}
	cJSON_Delete(reply);
	return r;
}

struct regen_kept_list {
	size_t count;
	struct regen_kept items[];
};

REGEN_EXPORT int regen_keep_list(regen_client *c, const char *job, regen_kept_list **out)
{
	struct rp_error err = { 0 };
	cJSON *reply = NULL;
	const cJSON *list, *item;
	regen_kept_list *l;
	size_t i = 0;
	int r;

	if (c == NULL || out == NULL)
		return -EINVAL;
	*out = NULL;
	r = select_call(c, RP_KEEP_LIST, job, -1, NULL, &reply, NULL);
	if (r < 0) {
		cJSON_Delete(reply);
		return r;
	}
	list = cJSON_GetObjectItemCaseSensitive(reply, "kept");
	if (!cJSON_IsArray(list)) {
		cJSON_Delete(reply);
		return rc_malformed_reply(c, RP_KEEP_LIST, (rp_error_invalid_parameter(&err, "kept"), &err));
	}
	l = calloc(1, sizeof(*l) + (size_t)cJSON_GetArraySize(list) * sizeof(l->items[0]));
	if (l == NULL) {
		cJSON_Delete(reply);
		return -ENOMEM;
	}
	cJSON_ArrayForEach(item, list) {
		struct rp_kept k;
		char prefix[32];

		snprintf(prefix, sizeof(prefix), "kept[%zu].", i);
		if (rp_kept_decode(item, prefix, &k, &err) < 0) {
			free(l);
			cJSON_Delete(reply);
			return rc_malformed_reply(c, RP_KEEP_LIST, &err);
		}
		l->items[i].size = sizeof(l->items[i]);
		kept_copy(&k, &l->items[i]);
		i++;
	}
	l->count = i;
	cJSON_Delete(reply);
	*out = l;
	return 0;
}

REGEN_EXPORT size_t regen_kept_list_count(const regen_kept_list *l)
{
	return l != NULL ? l->count : 0;
}

REGEN_EXPORT const struct regen_kept *regen_kept_list_get(const regen_kept_list *l, size_t i)
{
	return l != NULL && i < l->count ? &l->items[i] : NULL;
}

REGEN_EXPORT void regen_kept_list_free(regen_kept_list *l)
{
	free(l);
}
