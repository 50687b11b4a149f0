/* SPDX-License-Identifier: Apache-2.0 */
/* io.regen.Device's replies: the device list and Watch's events. */
#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "device.h"
#include "params.h"

static const char *const state_names[] = {
	"ready", "draining", "released", "faulted", "resetting", "respawning", "unresponsive", "failed", "detached",
	"unsupported",
};

const char *rp_state_name(enum rp_state state)
{
	return (unsigned)state < RP_STATE_COUNT ? state_names[state] : NULL;
}

int rp_state_from_name(const char *name)
{
	for (int i = 0; name != NULL && i < RP_STATE_COUNT; i++) {
		if (strcmp(state_names[i], name) == 0)
			return i;
	}
	return -1;
}

/* A field inside the reply: its decoder names it "<prefix><key>", e.g.
 * "devices[1].state" (prefix "devices[1].") or "epoch" (prefix ""). */
static int refuse(struct rp_error *err, const char *prefix, const char *key)
{
	char name[96];

	snprintf(name, sizeof(name), "%s%s", prefix, key);
	return rp_error_invalid_parameter(err, name);
}

static int get_uint(const cJSON *obj, const char *prefix, const char *key, uint64_t max, uint64_t *out,
		    struct rp_error *err)
{
	if (rp_params_uint(obj, key, max, 0, out, err) != 0)
		return refuse(err, prefix, key);
	return 0;
}

/* A signed integer a double holds exactly. */
static int get_int(const cJSON *obj, const char *prefix, const char *key, int64_t *out, struct rp_error *err)
{
	const cJSON *item = cJSON_GetObjectItemCaseSensitive(obj, key);
	double d;

	if (!cJSON_IsNumber(item))
		return refuse(err, prefix, key);
	d = item->valuedouble;
	if (!isfinite(d) || d != trunc(d) || fabs(d) > 9007199254740992.0)
		return refuse(err, prefix, key);
	*out = (int64_t)d;
	return 0;
}

/* A string, which may be empty (a worker not yet up has no socket). */
static int get_string(const cJSON *obj, const char *prefix, const char *key, const char **out, struct rp_error *err)
{
	const cJSON *item = cJSON_GetObjectItemCaseSensitive(obj, key);

	if (!cJSON_IsString(item) || item->valuestring == NULL)
		return refuse(err, prefix, key);
	*out = item->valuestring;
	return 0;
}

static int get_state(const cJSON *obj, const char *prefix, enum rp_state *out, struct rp_error *err)
{
	const cJSON *item = cJSON_GetObjectItemCaseSensitive(obj, "state");
	int state = cJSON_IsString(item) ? rp_state_from_name(item->valuestring) : -1;

	if (state < 0)
		return refuse(err, prefix, "state");
	*out = (enum rp_state)state;
	return 0;
}

static const char *or_empty(const char *s)
{
	return s != NULL ? s : "";
}

static bool add_tristate(cJSON *o, const char *key, int v)
{
	return v < 0 || cJSON_AddBoolToObject(o, key, v != 0) != NULL;
}

static bool add_known(cJSON *o, const char *key, int64_t v)
{
	return v < 0 || cJSON_AddNumberToObject(o, key, (double)v) != NULL;
}

cJSON *rp_device_health_encode(const struct rp_device_health *h)
{
	cJSON *o = cJSON_CreateObject();

	if (o == NULL || cJSON_AddStringToObject(o, "source", or_empty(h->source)) == NULL ||
	    cJSON_AddStringToObject(o, "detail", or_empty(h->detail)) == NULL ||
	    cJSON_AddStringToObject(o, "uuid", or_empty(h->uuid)) == NULL ||
	    cJSON_AddStringToObject(o, "pci_bus_id", or_empty(h->pci_bus_id)) == NULL ||
	    cJSON_AddNumberToObject(o, "last_xid", h->last_xid) == NULL ||
	    cJSON_AddNumberToObject(o, "last_xid_unix_ms", (double)h->last_xid_unix_ms) == NULL ||
	    cJSON_AddStringToObject(o, "last_xid_text", or_empty(h->last_xid_text)) == NULL ||
	    !add_known(o, "ecc_dbe_volatile", h->ecc_dbe_volatile) || !add_known(o, "ecc_dbe_aggregate", h->ecc_dbe_aggregate) ||
	    !add_tristate(o, "retired_pages_pending", h->retired_pages_pending) ||
	    !add_tristate(o, "remap_pending", h->remap_pending) || !add_tristate(o, "remap_failed", h->remap_failed) ||
	    (h->has_minor_number && cJSON_AddNumberToObject(o, "minor_number", h->minor_number) == NULL)) {
		cJSON_Delete(o);
		return NULL;
	}
	if (h->nmig) {
		cJSON *mig = cJSON_AddArrayToObject(o, "mig_devices");
		for (size_t i = 0; mig != NULL && i < h->nmig && i < RP_MIG_DEVICES_MAX; i++)
			cJSON_AddItemToArray(mig, cJSON_CreateString(or_empty(h->mig_devices[i])));
		if (mig == NULL || cJSON_GetArraySize(mig) != (int)(h->nmig < RP_MIG_DEVICES_MAX ? h->nmig : RP_MIG_DEVICES_MAX)) {
			cJSON_Delete(o);
			return NULL;
		}
	}
	return o;
}

/* An optional count: -1 when absent. */
static int get_known(const cJSON *obj, const char *prefix, const char *key, int64_t *out, struct rp_error *err)
{
	if (!cJSON_HasObjectItem(obj, key)) {
		*out = -1;
		return 0;
	}
	if (get_int(obj, prefix, key, out, err) < 0 || *out < 0)
		return refuse(err, prefix, key);
	return 0;
}

/* An optional bool: -1 when absent. */
static int get_tristate(const cJSON *obj, const char *prefix, const char *key, int *out, struct rp_error *err)
{
	const cJSON *item = cJSON_GetObjectItemCaseSensitive(obj, key);

	if (item == NULL) {
		*out = -1;
		return 0;
	}
	if (!cJSON_IsBool(item))
		return refuse(err, prefix, key);
	*out = cJSON_IsTrue(item);
	return 0;
}

static int health_decode(const cJSON *o, const char *device_prefix, struct rp_device_health *h, struct rp_error *err)
{
	char prefix[48];
	uint64_t xid;

	snprintf(prefix, sizeof(prefix), "%shealth.", device_prefix);
	if (!cJSON_IsObject(o))
		return refuse(err, device_prefix, "health");
	if (get_string(o, prefix, "source", &h->source, err) < 0 || get_string(o, prefix, "detail", &h->detail, err) < 0 ||
	    get_string(o, prefix, "uuid", &h->uuid, err) < 0 || get_string(o, prefix, "pci_bus_id", &h->pci_bus_id, err) < 0 ||
	    get_uint(o, prefix, "last_xid", UINT32_MAX, &xid, err) < 0 ||
	    get_int(o, prefix, "last_xid_unix_ms", &h->last_xid_unix_ms, err) < 0 ||
	    get_string(o, prefix, "last_xid_text", &h->last_xid_text, err) < 0 ||
	    get_known(o, prefix, "ecc_dbe_volatile", &h->ecc_dbe_volatile, err) < 0 ||
	    get_known(o, prefix, "ecc_dbe_aggregate", &h->ecc_dbe_aggregate, err) < 0 ||
	    get_tristate(o, prefix, "retired_pages_pending", &h->retired_pages_pending, err) < 0 ||
	    get_tristate(o, prefix, "remap_pending", &h->remap_pending, err) < 0 ||
	    get_tristate(o, prefix, "remap_failed", &h->remap_failed, err) < 0)
		return -EINVAL;
	h->last_xid = (uint32_t)xid;
	if (cJSON_HasObjectItem(o, "minor_number")) {
		uint64_t minor;

		if (get_uint(o, prefix, "minor_number", UINT32_MAX, &minor, err) < 0)
			return -EINVAL;
		h->has_minor_number = true;
		h->minor_number = (uint32_t)minor;
	}
	if (cJSON_HasObjectItem(o, "mig_devices")) {
		const cJSON *mig = cJSON_GetObjectItemCaseSensitive(o, "mig_devices"), *u;

		if (!cJSON_IsArray(mig) || cJSON_GetArraySize(mig) > RP_MIG_DEVICES_MAX)
			return refuse(err, prefix, "mig_devices");
		cJSON_ArrayForEach(u, mig) {
			if (!cJSON_IsString(u))
				return refuse(err, prefix, "mig_devices");
			h->mig_devices[h->nmig++] = u->valuestring;
		}
	}
	return 0;
}

int rp_device_health_decode(const cJSON *o, struct rp_device_health *out, struct rp_error *err)
{
	memset(out, 0, sizeof(*out));
	return health_decode(o, "", out, err);
}

cJSON *rp_device_sharing_encode(const struct rp_device_sharing *s)
{
	cJSON *o = cJSON_CreateObject();

	if (o == NULL || cJSON_AddBoolToObject(o, "mps", s->mps) == NULL ||
	    cJSON_AddStringToObject(o, "mps_pipe_directory", or_empty(s->mps_pipe_directory)) == NULL ||
	    (s->compute_mode && s->compute_mode[0] &&
	     cJSON_AddStringToObject(o, "compute_mode", s->compute_mode) == NULL) ||
	    !add_known(o, "mps_clients", s->mps_clients) ||
	    cJSON_AddStringToObject(o, "reason", or_empty(s->reason)) == NULL) {
		cJSON_Delete(o);
		return NULL;
	}
	return o;
}

static int sharing_decode(const cJSON *o, const char *device_prefix, struct rp_device_sharing *s, struct rp_error *err)
{
	char prefix[48];
	const cJSON *mps = cJSON_GetObjectItemCaseSensitive(o, "mps");

	snprintf(prefix, sizeof(prefix), "%ssharing.", device_prefix);
	if (!cJSON_IsObject(o))
		return refuse(err, device_prefix, "sharing");
	if (!cJSON_IsBool(mps))
		return refuse(err, prefix, "mps");
	s->mps = cJSON_IsTrue(mps);
	s->compute_mode = "";
	if (get_string(o, prefix, "mps_pipe_directory", &s->mps_pipe_directory, err) < 0 ||
	    (cJSON_HasObjectItem(o, "compute_mode") && get_string(o, prefix, "compute_mode", &s->compute_mode, err) < 0) ||
	    get_known(o, prefix, "mps_clients", &s->mps_clients, err) < 0 ||
	    get_string(o, prefix, "reason", &s->reason, err) < 0)
		return -EINVAL;
	return 0;
}

int rp_device_sharing_decode(const cJSON *o, struct rp_device_sharing *out, struct rp_error *err)
{
	memset(out, 0, sizeof(*out));
	return sharing_decode(o, "", out, err);
}

static cJSON *counters_encode(const struct rp_device_counters *c)
{
	const struct { const char *name; uint64_t v; } fields[] = {
		{ "releases", c->releases }, { "resets", c->resets }, { "restarts", c->restarts },
		{ "faults", c->faults }, { "calls", c->calls }, { "call_errors", c->call_errors },
		{ "call_us", c->call_us }, { "in_flight", c->in_flight }, { "buffers", c->buffers },
		{ "events", c->events }, { "connections", c->connections },
	};
	cJSON *o = cJSON_CreateObject();

	for (size_t i = 0; o && i < sizeof(fields) / sizeof(fields[0]); i++) {
		if (!cJSON_AddNumberToObject(o, fields[i].name, (double)fields[i].v)) {
			cJSON_Delete(o);
			return NULL;
		}
	}
	return o;
}

cJSON *rp_device_jobs_encode(const struct rp_device_job *jobs, size_t n)
{
	cJSON *a = cJSON_CreateArray();

	for (size_t i = 0; a && i < n; i++) {
		const struct rp_device_job *j = &jobs[i];
		const struct { const char *name; uint64_t v; } counts[] = {
			{ "sessions", j->sessions }, { "buffers", j->buffers }, { "buffer_bytes", j->buffer_bytes },
			{ "events", j->events }, { "in_flight", j->in_flight }, { "calls", j->calls },
			{ "call_errors", j->call_errors },
		};
		const char *source = rp_job_source_name(j->source);
		cJSON *o = cJSON_CreateObject();
		bool ok;

		if (o == NULL || !cJSON_AddItemToArray(a, o)) {
			cJSON_Delete(o);
			goto fail;
		}
		/* The array holds o from here. */
		ok = source && cJSON_AddStringToObject(o, "job", or_empty(j->job)) &&
		     cJSON_AddStringToObject(o, "source", source) &&
		     (!j->has_uid || cJSON_AddNumberToObject(o, "uid", (double)j->uid));
		for (size_t k = 0; ok && k < sizeof(counts) / sizeof(counts[0]); k++)
			ok = cJSON_AddNumberToObject(o, counts[k].name, (double)counts[k].v) != NULL;
		if (!ok)
			goto fail;
	}
	return a;
fail:
	cJSON_Delete(a);
	return NULL;
}

static int job_decode(const cJSON *o, size_t i, struct rp_device_job *j, struct rp_error *err)
{
	const struct { const char *name; uint64_t *v; } counts[] = {
		{ "sessions", &j->sessions }, { "buffers", &j->buffers }, { "buffer_bytes", &j->buffer_bytes },
		{ "events", &j->events }, { "in_flight", &j->in_flight }, { "calls", &j->calls },
		{ "call_errors", &j->call_errors },
	};
	const cJSON *source = cJSON_GetObjectItemCaseSensitive(o, "source");
	char prefix[40];
	int s;

	snprintf(prefix, sizeof(prefix), "jobs[%zu].", i);
	if (!cJSON_IsObject(o)) {
		snprintf(prefix, sizeof(prefix), "jobs[%zu]", i);
		return rp_error_invalid_parameter(err, prefix);
	}
	if (get_string(o, prefix, "job", &j->job, err) < 0)
		return -EINVAL;
	if (strlen(j->job) > RP_JOB_MAX)
		return refuse(err, prefix, "job");
	s = cJSON_IsString(source) ? rp_job_source_from_name(source->valuestring) : -1;
	if (s < 0)
		return refuse(err, prefix, "source");
	j->source = (enum rp_job_source)s;
	if (cJSON_HasObjectItem(o, "uid")) {
		uint64_t uid;

		if (get_uint(o, prefix, "uid", UINT32_MAX, &uid, err) < 0)
			return -EINVAL;
		j->has_uid = true;
		j->uid = (uint32_t)uid;
	}
	for (size_t k = 0; k < sizeof(counts) / sizeof(counts[0]); k++)
		if (get_uint(o, prefix, counts[k].name, UINT64_MAX, counts[k].v, err) < 0)
			return -EINVAL;
	return 0;
}

int rp_device_jobs_decode(const cJSON *array, size_t max, struct rp_device_job **out, size_t *n, struct rp_error *err)
{
	const cJSON *o;
	size_t count, i = 0;

	*out = NULL;
	*n = 0;
	if (!cJSON_IsArray(array) || (count = (size_t)cJSON_GetArraySize(array)) > max)
		return rp_error_invalid_parameter(err, "jobs");
	if (count == 0)
		return 0;
	*out = calloc(count, sizeof(**out));
	if (*out == NULL)
		return -ENOMEM;
	cJSON_ArrayForEach(o, array) {
		if (job_decode(o, i, &(*out)[i], err) < 0) {
			free(*out);
			*out = NULL;
			return -EINVAL;
		}
		i++;
	}
	*n = count;
	return 0;
}

static cJSON *device_info_encode(const struct rp_device_info *d)
{
	const char *state = rp_state_name(d->state);
	cJSON *o = cJSON_CreateObject();

	if (o == NULL || state == NULL || cJSON_AddNumberToObject(o, "index", d->index) == NULL ||
	    cJSON_AddNumberToObject(o, "generation", (double)d->generation) == NULL ||
	    cJSON_AddStringToObject(o, "state", state) == NULL ||
	    cJSON_AddStringToObject(o, "backend", or_empty(d->backend)) == NULL ||
	    cJSON_AddStringToObject(o, "worker_socket", or_empty(d->worker_socket)) == NULL ||
	    cJSON_AddNumberToObject(o, "worker_pid", (double)d->worker_pid) == NULL ||
	    cJSON_AddNumberToObject(o, "respawns", (double)d->respawns) == NULL ||
	    cJSON_AddNumberToObject(o, "memory_used", (double)d->memory_used) == NULL ||
	    cJSON_AddNumberToObject(o, "memory_baseline", (double)d->memory_baseline) == NULL ||
	    cJSON_AddStringToObject(o, "reason", or_empty(d->reason)) == NULL) {
		cJSON_Delete(o);
		return NULL;
	}
	if (d->has_health) {
		cJSON *h = rp_device_health_encode(&d->health);
		if (h == NULL || !cJSON_AddItemToObject(o, "health", h)) {
			cJSON_Delete(h);
			cJSON_Delete(o);
			return NULL;
		}
	}
	if (d->has_sharing) {
		cJSON *sh = rp_device_sharing_encode(&d->sharing);
		if (sh == NULL || !cJSON_AddItemToObject(o, "sharing", sh)) {
			cJSON_Delete(sh);
			cJSON_Delete(o);
			return NULL;
		}
	}
	if (d->has_counters) {
		cJSON *c = counters_encode(&d->counters);
		if (c == NULL || !cJSON_AddItemToObject(o, "counters", c)) {
			cJSON_Delete(c);
			cJSON_Delete(o);
			return NULL;
		}
	}
	if (d->has_jobs) {
		cJSON *j = rp_device_jobs_encode(d->jobs, d->njobs);
		if (j == NULL || !cJSON_AddItemToObject(o, "jobs", j)) {
			cJSON_Delete(j);
			cJSON_Delete(o);
			return NULL;
		}
	}
	return o;
}

static int device_info_decode(const cJSON *o, size_t i, struct rp_device_info *d, struct rp_error *err)
{
	char prefix[32];
	uint64_t index;

	snprintf(prefix, sizeof(prefix), "devices[%zu].", i);
	if (!cJSON_IsObject(o)) {
		snprintf(prefix, sizeof(prefix), "devices[%zu]", i);
		return rp_error_invalid_parameter(err, prefix);
	}
	if (get_uint(o, prefix, "index", UINT32_MAX, &index, err) < 0 ||
	    get_uint(o, prefix, "generation", UINT64_MAX, &d->generation, err) < 0 ||
	    get_state(o, prefix, &d->state, err) < 0 || get_string(o, prefix, "backend", &d->backend, err) < 0 ||
	    get_string(o, prefix, "worker_socket", &d->worker_socket, err) < 0 ||
	    get_int(o, prefix, "worker_pid", &d->worker_pid, err) < 0 ||
	    get_uint(o, prefix, "respawns", UINT64_MAX, &d->respawns, err) < 0 ||
	    get_uint(o, prefix, "memory_used", UINT64_MAX, &d->memory_used, err) < 0 ||
	    get_uint(o, prefix, "memory_baseline", UINT64_MAX, &d->memory_baseline, err) < 0 ||
	    get_string(o, prefix, "reason", &d->reason, err) < 0)
		return -EINVAL;
	d->index = (uint32_t)index;
	d->has_health = cJSON_HasObjectItem(o, "health");
	if (d->has_health && health_decode(cJSON_GetObjectItemCaseSensitive(o, "health"), prefix, &d->health, err) < 0)
		return -EINVAL;
	d->has_sharing = cJSON_HasObjectItem(o, "sharing");
	if (d->has_sharing &&
	    sharing_decode(cJSON_GetObjectItemCaseSensitive(o, "sharing"), prefix, &d->sharing, err) < 0)
		return -EINVAL;
	return 0;
}

cJSON *rp_status_encode(const struct rp_status *status)
{
	cJSON *o = cJSON_CreateObject();
	cJSON *devices, *d;

	if (o == NULL || cJSON_AddNumberToObject(o, "epoch", (double)status->epoch) == NULL)
		goto fail;
	devices = cJSON_AddArrayToObject(o, "devices");
	if (devices == NULL)
		goto fail;
	for (size_t i = 0; i < status->ndevices; i++) {
		d = device_info_encode(&status->devices[i]);
		if (d == NULL || !cJSON_AddItemToArray(devices, d)) {
			cJSON_Delete(d);
			goto fail;
		}
	}
	if (status->has_elapsed_us && cJSON_AddNumberToObject(o, "elapsed_us", (double)status->elapsed_us) == NULL)
		goto fail;
	return o;
fail:
	cJSON_Delete(o);
	return NULL;
}

int rp_status_decode(const cJSON *params, struct rp_status *out, struct rp_error *err)
{
	const cJSON *devices, *d;
	size_t i = 0;
	int r;

	memset(out, 0, sizeof(*out));
	if (!cJSON_IsObject(params))
		return rp_error_invalid_parameter(err, "parameters");
	if (get_uint(params, "", "epoch", UINT64_MAX, &out->epoch, err) < 0)
		return -EINVAL;
	devices = cJSON_GetObjectItemCaseSensitive(params, "devices");
	if (!cJSON_IsArray(devices))
		return rp_error_invalid_parameter(err, "devices");
	out->ndevices = (size_t)cJSON_GetArraySize(devices);
	out->devices = calloc(out->ndevices > 0 ? out->ndevices : 1, sizeof(*out->devices));
	if (out->devices == NULL) {
		r = -ENOMEM;
		goto fail;
	}
	cJSON_ArrayForEach(d, devices) {
		r = device_info_decode(d, i, &out->devices[i], err);
		if (r < 0)
			goto fail;
		i++;
	}
	r = rp_params_uint(params, "elapsed_us", UINT64_MAX, 0, &out->elapsed_us, err);
	if (r < 0)
		goto fail;
	out->has_elapsed_us = r == 0;
	return 0;
fail:
	rp_status_finish(out);
	return r;
}

void rp_status_finish(struct rp_status *status)
{
	if (status == NULL)
		return;
	free(status->devices);
	memset(status, 0, sizeof(*status));
}

cJSON *rp_watch_event_encode(const struct rp_watch_event *event)
{
	const char *state = rp_state_name(event->state);
	cJSON *o = cJSON_CreateObject();

	if (o == NULL || state == NULL || cJSON_AddNumberToObject(o, "epoch", (double)event->epoch) == NULL ||
	    cJSON_AddNumberToObject(o, "device", event->device) == NULL ||
	    cJSON_AddNumberToObject(o, "generation", (double)event->generation) == NULL ||
	    cJSON_AddStringToObject(o, "state", state) == NULL ||
	    cJSON_AddStringToObject(o, "reason", or_empty(event->reason)) == NULL) {
		cJSON_Delete(o);
		return NULL;
	}
	return o;
}

int rp_watch_event_decode(const cJSON *params, struct rp_watch_event *out, struct rp_error *err)
{
	uint64_t device;

	memset(out, 0, sizeof(*out));
	if (!cJSON_IsObject(params))
		return rp_error_invalid_parameter(err, "parameters");
	if (get_uint(params, "", "epoch", UINT64_MAX, &out->epoch, err) < 0 ||
	    get_uint(params, "", "device", UINT32_MAX, &device, err) < 0 ||
	    get_uint(params, "", "generation", UINT64_MAX, &out->generation, err) < 0 ||
	    get_state(params, "", &out->state, err) < 0 || get_string(params, "", "reason", &out->reason, err) < 0)
		return -EINVAL;
	out->device = (uint32_t)device;
	return 0;
}
