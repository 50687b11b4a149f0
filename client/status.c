/* SPDX-License-Identifier: Apache-2.0 */
/* libregen: io.regen.Device's calls on the main socket (Status, Generation,
 * Release, Reset, Restart, InjectFault) and the status object they answer
 * with. */
#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include "private.h"
#include "proto/device.h"

/* The reply owns the strings that devices[] point to. */
struct regen_status {
	cJSON *reply;
	struct rp_status st;
	struct regen_device_info *devices;
};

REGEN_EXPORT void regen_status_free(regen_status *st)
{
	if (st == NULL) {
		return;
	}
	free(st->devices);
	rp_status_finish(&st->st);
	cJSON_Delete(st->reply);
	free(st);
}

int rc_status_from_reply(regen_client *c, const char *method, cJSON *reply, regen_status **out)
{
	struct rp_error err = { 0 };
	regen_status *st;
	size_t i;
	int r;

	*out = NULL;
	st = calloc(1, sizeof(*st));
	if (st == NULL) {
		cJSON_Delete(reply);
		return -ENOMEM;
	}
	st->reply = reply;
	r = rp_status_decode(reply, &st->st, &err);
	if (r < 0) {
		r = r == -ENOMEM ? r : rc_malformed_reply(c, method, &err);
		goto fail;
	}
	st->devices = calloc(st->st.ndevices > 0 ? st->st.ndevices : 1, sizeof(*st->devices));
	if (st->devices == NULL) {
		r = -ENOMEM;
		goto fail;
	}
	for (i = 0; i < st->st.ndevices; i++) {
		const struct rp_device_info *d = &st->st.devices[i];
		struct regen_device_info *info = &st->devices[i];

		info->size = sizeof(*info);
		info->index = d->index > INT32_MAX ? -1 : (int)d->index;
		info->generation = d->generation;
		info->state = rp_state_name(d->state);
		info->backend = d->backend;
		info->worker_socket = d->worker_socket;
		info->worker_pid = d->worker_pid;
		info->respawns = d->respawns;
		info->memory_used = d->memory_used;
		info->memory_baseline = d->memory_baseline;
		info->reason = d->reason;
		info->has_health = d->has_health;
		info->health_source = d->has_health ? d->health.source : "";
		info->health_detail = d->has_health ? d->health.detail : "";
		info->uuid = d->has_health ? d->health.uuid : "";
		info->pci_bus_id = d->has_health ? d->health.pci_bus_id : "";
		info->last_xid = d->has_health ? d->health.last_xid : 0;
		info->last_xid_unix_ms = d->has_health ? d->health.last_xid_unix_ms : 0;
		info->last_xid_text = d->has_health ? d->health.last_xid_text : "";
		info->ecc_dbe_volatile = d->has_health ? d->health.ecc_dbe_volatile : -1;
		info->ecc_dbe_aggregate = d->has_health ? d->health.ecc_dbe_aggregate : -1;
		info->retired_pages_pending = d->has_health ? d->health.retired_pages_pending : -1;
		info->remap_pending = d->has_health ? d->health.remap_pending : -1;
		info->remap_failed = d->has_health ? d->health.remap_failed : -1;
		info->has_sharing = d->has_sharing;
		info->mps = d->has_sharing && d->sharing.mps;
		info->mps_pipe_directory = d->has_sharing ? d->sharing.mps_pipe_directory : "";
		info->compute_mode = d->has_sharing ? d->sharing.compute_mode : "";
		info->mps_clients = d->has_sharing ? d->sharing.mps_clients : -1;
		info->sharing_reason = d->has_sharing ? d->sharing.reason : "";
		rc_note_generation(c, info->index, info->generation);
	}
	*out = st;
	return 0;
fail:
	rp_error_clear(&err);
	regen_status_free(st);
	return r;
}

REGEN_EXPORT uint64_t regen_status_epoch(const regen_status *st)
{
	return st != NULL ? st->st.epoch : 0;
}

REGEN_EXPORT int regen_status_device_count(const regen_status *st)
{
	return st != NULL ? (int)st->st.ndevices : 0;
}

REGEN_EXPORT const struct regen_device_info *regen_status_device(const regen_status *st, int i)
{
	if (st == NULL || i < 0 || (size_t)i >= st->st.ndevices) {
		return NULL;
	}
	return &st->devices[i];
}

REGEN_EXPORT const struct regen_device_info *regen_status_find_device(const regen_status *st, int index)
{
	for (size_t i = 0; st != NULL && index >= 0 && i < st->st.ndevices; i++) {
		if (st->devices[i].index == index) {
			return &st->devices[i];
		}
	}
	return NULL;
}

REGEN_EXPORT uint64_t regen_status_elapsed_us(const regen_status *st)
{
	return st != NULL && st->st.has_elapsed_us ? st->st.elapsed_us : 0;
}

REGEN_EXPORT char *regen_status_to_json(const regen_status *st)
{
	return st != NULL ? cJSON_PrintUnformatted(st->reply) : NULL;
}

/* A call on the main socket whose reply is a device list; out may be NULL
 * (the reply is still checked). */
static int status_call(regen_client *c, const char *method, const cJSON *params, regen_status **out)
{
	regen_status *st = NULL;
	cJSON *reply = NULL;
	int r;

	if (out != NULL) {
		*out = NULL;
	}
	if (c == NULL) {
		return -EINVAL;
	}
	r = rc_call(c, -1, method, params, NULL, 0, &reply);
	if (r < 0) {
		return r;
	}
	r = rc_status_from_reply(c, method, reply, &st);
	if (r == 0 && out != NULL) {
		*out = st;
	} else {
		regen_status_free(st);
	}
	return r;
}

REGEN_EXPORT int regen_status_get(regen_client *c, regen_status **out)
{
	return out != NULL ? status_call(c, RP_DEVICE_STATUS, NULL, out) : -EINVAL;
}

REGEN_EXPORT int regen_generation_get(regen_client *c, regen_status **out)
{
	return out != NULL ? status_call(c, RP_DEVICE_GENERATION, NULL, out) : -EINVAL;
}

static int lifecycle(regen_client *c, const char *method, int device, const char *reason, int deadline_ms,
		     regen_status **out)
{
	cJSON *p = cJSON_CreateObject();
	int r = -ENOMEM;

	if (out != NULL) {
		*out = NULL;
	}
	if (p == NULL) {
		return -ENOMEM;
	}
	if (device >= 0 && cJSON_AddNumberToObject(p, "device", device) == NULL) {
		goto out;
	}
	if (reason != NULL && reason[0] != '\0' && cJSON_AddStringToObject(p, "reason", reason) == NULL) {
		goto out;
	}
	if (deadline_ms > 0 && cJSON_AddNumberToObject(p, "deadline_ms", deadline_ms) == NULL) {
		goto out;
	}
	r = status_call(c, method, p, out);
out:
	cJSON_Delete(p);
	return r;
}

REGEN_EXPORT int regen_release(regen_client *c, int device, const char *reason, regen_status **out)
{
	return lifecycle(c, RP_DEVICE_RELEASE, device, reason, 0, out);
}

REGEN_EXPORT int regen_reset(regen_client *c, int device, const char *reason, regen_status **out)
{
	return lifecycle(c, RP_DEVICE_RESET, device, reason, 0, out);
}

REGEN_EXPORT int regen_restart(regen_client *c, int device, const char *reason, int deadline_ms, regen_status **out)
{
	return lifecycle(c, RP_DEVICE_RESTART, device, reason, deadline_ms, out);
}

REGEN_EXPORT int regen_inject_fault(regen_client *c, int device, const char *kind)
{
	cJSON *p;
	int r = -ENOMEM;

	if (c == NULL || kind == NULL) {
		return -EINVAL;
	}
	p = cJSON_CreateObject();
	if (p == NULL) {
		return -ENOMEM;
	}
	if (cJSON_AddNumberToObject(p, "device", device) == NULL || cJSON_AddStringToObject(p, "kind", kind) == NULL) {
		goto out;
	}
	r = rc_call(c, -1, RP_DEVICE_INJECT_FAULT, p, NULL, 0, NULL);
out:
	cJSON_Delete(p);
	return r;
}
