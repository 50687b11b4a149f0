/* SPDX-License-Identifier: Apache-2.0 */
/* io.regen.Device's codecs (proto/device.h): the device list of Status,
 * Generation and the lifecycle replies, and Watch's events. What the daemon
 * encodes a client decodes to the same struct; a reply that lacks a field
 * the IDL declares, or has one of the wrong type, is refused naming it; a
 * field the client does not know is ignored. */
#include <check.h>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "proto/device.h"
#include "proto/errors.h"

static cJSON *json(const char *text)
{
	cJSON *j = cJSON_Parse(text);

	ck_assert_msg(j != NULL, "test JSON does not parse: %s", text);
	return j;
}

static void assert_invalid_parameter(struct rp_error *err, const char *name)
{
	const cJSON *p;

	ck_assert_ptr_nonnull(err->name);
	ck_assert_str_eq(err->name, RP_ERR_INVALID_PARAMETER);
	p = cJSON_GetObjectItemCaseSensitive(err->params, "parameter");
	ck_assert(cJSON_IsString(p));
	ck_assert_str_eq(p->valuestring, name);
	rp_error_clear(err);
}

START_TEST(state_names)
{
	/* The IDL's order: io.regen.Device.State. */
	static const char *const idl[] = {
		"ready", "draining", "released", "faulted", "resetting", "respawning", "unresponsive", "failed", "detached",
		"unsupported",
	};

	ck_assert_int_eq(RP_STATE_COUNT, 10);
	for (int i = 0; i < RP_STATE_COUNT; i++) {
		ck_assert_str_eq(rp_state_name((enum rp_state)i), idl[i]);
		ck_assert_int_eq(rp_state_from_name(idl[i]), i);
	}
	ck_assert_ptr_null(rp_state_name(RP_STATE_COUNT));
	ck_assert_int_eq(rp_state_from_name("Ready"), -1);
	ck_assert_int_eq(rp_state_from_name(""), -1);
	ck_assert_int_eq(rp_state_from_name(NULL), -1);
}
END_TEST

static const struct rp_device_info sample_devices[] = {
	{ 0, 3, RP_STATE_READY, "host", "/run/regen/regend.sock.dev0", 4242, 1, 1 << 20, 4096, "restart by pid 9: x" },
	{ 1, 1, RP_STATE_RESPAWNING, NULL, NULL, -1, 0, 0, 0, NULL },
};

static void assert_device_eq(const struct rp_device_info *got, const struct rp_device_info *want)
{
	ck_assert_uint_eq(got->index, want->index);
	ck_assert_uint_eq(got->generation, want->generation);
	ck_assert_int_eq(got->state, want->state);
	ck_assert_str_eq(got->backend, want->backend ? want->backend : "");
	ck_assert_str_eq(got->worker_socket, want->worker_socket ? want->worker_socket : "");
	ck_assert_int_eq(got->worker_pid, want->worker_pid);
	ck_assert_uint_eq(got->respawns, want->respawns);
	ck_assert_uint_eq(got->memory_used, want->memory_used);
	ck_assert_uint_eq(got->memory_baseline, want->memory_baseline);
	ck_assert_str_eq(got->reason, want->reason ? want->reason : "");
}

START_TEST(status_round_trip)
{
	struct rp_status in = { .epoch = 7, .devices = (struct rp_device_info *)sample_devices, .ndevices = 2 }, out;
	struct rp_error err = { 0 };
	cJSON *p;

	p = rp_status_encode(&in);
	ck_assert_ptr_nonnull(p);
	ck_assert_ptr_null(cJSON_GetObjectItem(p, "elapsed_us"));
	ck_assert_str_eq(cJSON_GetObjectItem(cJSON_GetArrayItem(cJSON_GetObjectItem(p, "devices"), 1), "state")->valuestring,
			 "respawning");
	ck_assert_int_eq(rp_status_decode(p, &out, &err), 0);
	ck_assert_ptr_null(err.name);
	ck_assert_uint_eq(out.epoch, 7);
	ck_assert_uint_eq(out.ndevices, 2);
	ck_assert(!out.has_elapsed_us);
	assert_device_eq(&out.devices[0], &sample_devices[0]);
	assert_device_eq(&out.devices[1], &sample_devices[1]);
	rp_status_finish(&out);
	ck_assert_ptr_null(out.devices);
	cJSON_Delete(p);

	/* Restart's reply: the time it took; and no devices at all. */
	in.ndevices = 0;
	in.has_elapsed_us = true;
	in.elapsed_us = 123456;
	p = rp_status_encode(&in);
	ck_assert_int_eq(rp_status_decode(p, &out, &err), 0);
	ck_assert_uint_eq(out.ndevices, 0);
	ck_assert(out.has_elapsed_us);
	ck_assert_uint_eq(out.elapsed_us, 123456);
	rp_status_finish(&out);
	rp_status_finish(NULL);
	cJSON_Delete(p);
}
END_TEST

/* Health is optional: a device without it has none after the round trip;
 * one with it keeps every field, and unknown counts stay unknown. */
START_TEST(health_round_trip)
{
	struct rp_device_info devs[2] = { sample_devices[0], sample_devices[1] };
	struct rp_status in = { .epoch = 2, .devices = devs, .ndevices = 2 }, out;
	struct rp_error err = { 0 };
	cJSON *p, *h;

	devs[0].has_health = true;
	devs[0].health = (struct rp_device_health){
		.source = "nvml", .detail = "", .uuid = "GPU-1234", .pci_bus_id = "0000:3b:00.0", .last_xid = 79,
		.last_xid_unix_ms = 1700000000123, .last_xid_text = "GPU has fallen off the bus", .ecc_dbe_volatile = 2,
		.ecc_dbe_aggregate = -1, .retired_pages_pending = 1, .remap_pending = 0, .remap_failed = -1,
		.has_minor_number = true, .minor_number = 3, .nmig = 2, .mig_devices = { "MIG-aa", "MIG-bb" },
	};
	p = rp_status_encode(&in);
	ck_assert_ptr_nonnull(p);
	h = cJSON_GetObjectItem(cJSON_GetArrayItem(cJSON_GetObjectItem(p, "devices"), 0), "health");
	ck_assert_ptr_nonnull(h);
	ck_assert_ptr_null(cJSON_GetObjectItem(h, "ecc_dbe_aggregate"));
	ck_assert_ptr_null(cJSON_GetObjectItem(h, "remap_failed"));
	ck_assert_ptr_null(cJSON_GetObjectItem(cJSON_GetArrayItem(cJSON_GetObjectItem(p, "devices"), 1), "health"));
	ck_assert_int_eq(rp_status_decode(p, &out, &err), 0);
	ck_assert(out.devices[0].has_health);
	ck_assert(!out.devices[1].has_health);
	ck_assert_str_eq(out.devices[0].health.source, "nvml");
	ck_assert_str_eq(out.devices[0].health.uuid, "GPU-1234");
	ck_assert_str_eq(out.devices[0].health.pci_bus_id, "0000:3b:00.0");
	ck_assert_uint_eq(out.devices[0].health.last_xid, 79);
	ck_assert_int_eq(out.devices[0].health.last_xid_unix_ms, 1700000000123);
	ck_assert_str_eq(out.devices[0].health.last_xid_text, "GPU has fallen off the bus");
	ck_assert_int_eq(out.devices[0].health.ecc_dbe_volatile, 2);
	ck_assert_int_eq(out.devices[0].health.ecc_dbe_aggregate, -1);
	ck_assert_int_eq(out.devices[0].health.retired_pages_pending, 1);
	ck_assert_int_eq(out.devices[0].health.remap_pending, 0);
	ck_assert_int_eq(out.devices[0].health.remap_failed, -1);
	/* What names the GPU in a container: its minor number, its MIG
	 * devices; absent where not known. */
	ck_assert(out.devices[0].health.has_minor_number);
	ck_assert_uint_eq(out.devices[0].health.minor_number, 3);
	ck_assert_uint_eq(out.devices[0].health.nmig, 2);
	ck_assert_str_eq(out.devices[0].health.mig_devices[0], "MIG-aa");
	ck_assert_str_eq(out.devices[0].health.mig_devices[1], "MIG-bb");
	rp_status_finish(&out);

	/* A wrong field inside is named with its path. */
	cJSON_ReplaceItemInObject(h, "mig_devices", cJSON_CreateString("MIG-aa"));
	ck_assert_int_lt(rp_status_decode(p, &out, &err), 0);
	assert_invalid_parameter(&err, "devices[0].health.mig_devices");
	cJSON_DeleteItemFromObject(h, "mig_devices");
	cJSON_DeleteItemFromObject(h, "minor_number");
	ck_assert_int_eq(rp_status_decode(p, &out, &err), 0);
	ck_assert(!out.devices[0].health.has_minor_number);
	ck_assert_uint_eq(out.devices[0].health.nmig, 0);
	rp_status_finish(&out);
	cJSON_ReplaceItemInObject(h, "remap_pending", cJSON_CreateNumber(1));
	ck_assert_int_lt(rp_status_decode(p, &out, &err), 0);
	assert_invalid_parameter(&err, "devices[0].health.remap_pending");
	cJSON_Delete(p);
}
END_TEST

/* Sharing is optional too: a device without it has none after the round
 * trip; one with it keeps every field, NVML's unknowns stay unknown (left
 * out on the wire), and a hostile value is refused naming its path. */
START_TEST(sharing_round_trip)
{
	struct rp_device_info devs[2] = { sample_devices[0], sample_devices[1] };
	struct rp_status in = { .epoch = 2, .devices = devs, .ndevices = 2 }, out;
	struct rp_error err = { 0 };
	cJSON *p, *sh;

	devs[0].has_sharing = true;
	devs[0].sharing = (struct rp_device_sharing){
		.mps = true, .mps_pipe_directory = "/run/nvidia-mps", .compute_mode = "exclusive_process",
		.mps_clients = 3, .reason = "MPS client: no isolation",
	};
	devs[1].has_sharing = true;
	devs[1].sharing = (struct rp_device_sharing){ .mps = false, .compute_mode = "", .mps_clients = -1 };
	p = rp_status_encode(&in);
	ck_assert_ptr_nonnull(p);
	sh = cJSON_GetObjectItem(cJSON_GetArrayItem(cJSON_GetObjectItem(p, "devices"), 1), "sharing");
	ck_assert_ptr_nonnull(sh);
	ck_assert_ptr_null(cJSON_GetObjectItem(sh, "compute_mode"));
	ck_assert_ptr_null(cJSON_GetObjectItem(sh, "mps_clients"));
	ck_assert_str_eq(cJSON_GetStringValue(cJSON_GetObjectItem(sh, "mps_pipe_directory")), "");
	ck_assert_int_eq(rp_status_decode(p, &out, &err), 0);
	ck_assert(out.devices[0].has_sharing && out.devices[1].has_sharing);
	ck_assert(out.devices[0].sharing.mps);
	ck_assert_str_eq(out.devices[0].sharing.mps_pipe_directory, "/run/nvidia-mps");
	ck_assert_str_eq(out.devices[0].sharing.compute_mode, "exclusive_process");
	ck_assert_int_eq(out.devices[0].sharing.mps_clients, 3);
	ck_assert_str_eq(out.devices[0].sharing.reason, "MPS client: no isolation");
	ck_assert(!out.devices[1].sharing.mps);
	ck_assert_str_eq(out.devices[1].sharing.compute_mode, "");
	ck_assert_int_eq(out.devices[1].sharing.mps_clients, -1);
	ck_assert_str_eq(out.devices[1].sharing.reason, "");
	rp_status_finish(&out);

	/* Without it, none. */
	cJSON_DeleteItemFromObject(cJSON_GetArrayItem(cJSON_GetObjectItem(p, "devices"), 1), "sharing");
	ck_assert_int_eq(rp_status_decode(p, &out, &err), 0);
	ck_assert(out.devices[0].has_sharing && !out.devices[1].has_sharing);
	rp_status_finish(&out);

	/* Wrong fields inside are named with their path. */
	sh = cJSON_GetObjectItem(cJSON_GetArrayItem(cJSON_GetObjectItem(p, "devices"), 0), "sharing");
	cJSON_ReplaceItemInObject(sh, "mps", cJSON_CreateNumber(1));
	ck_assert_int_lt(rp_status_decode(p, &out, &err), 0);
	assert_invalid_parameter(&err, "devices[0].sharing.mps");
	cJSON_ReplaceItemInObject(sh, "mps", cJSON_CreateFalse());
	cJSON_ReplaceItemInObject(sh, "mps_clients", cJSON_CreateNumber(-2));
	ck_assert_int_lt(rp_status_decode(p, &out, &err), 0);
	assert_invalid_parameter(&err, "devices[0].sharing.mps_clients");
	cJSON_ReplaceItemInObject(sh, "mps_clients", cJSON_CreateNumber(1));
	cJSON_DeleteItemFromObject(sh, "reason");
	ck_assert_int_lt(rp_status_decode(p, &out, &err), 0);
	assert_invalid_parameter(&err, "devices[0].sharing.reason");
	cJSON_ReplaceItemInObject(cJSON_GetArrayItem(cJSON_GetObjectItem(p, "devices"), 0), "sharing",
				  cJSON_CreateString("mps"));
	ck_assert_int_lt(rp_status_decode(p, &out, &err), 0);
	assert_invalid_parameter(&err, "devices[0].sharing");
	cJSON_Delete(p);
}
END_TEST

START_TEST(status_ignores_unknown_fields)
{
	struct rp_status out;
	struct rp_error err = { 0 };
	cJSON *p = json("{\"epoch\":1,\"later\":[1],\"devices\":[{\"index\":0,\"generation\":1,\"state\":\"ready\","
			"\"backend\":\"host\",\"worker_socket\":\"s\",\"worker_pid\":5,\"respawns\":0,"
			"\"memory_used\":0,\"memory_baseline\":0,\"reason\":\"\",\"temperature\":40}]}");

	ck_assert_int_eq(rp_status_decode(p, &out, &err), 0);
	ck_assert_uint_eq(out.ndevices, 1);
	ck_assert_str_eq(out.devices[0].worker_socket, "s");
	rp_status_finish(&out);
	cJSON_Delete(p);
}
END_TEST

/* Each case: one field of a good two-device reply replaced (value NULL:
 * removed), and the parameter the refusal must name. */
static const struct {
	int device;              /* -1: the top level */
	const char *key, *value, *parameter;
} status_refusals[] = {
	{ -1, "epoch", NULL, "epoch" },
	{ -1, "epoch", "-1", "epoch" },
	{ -1, "epoch", "1.5", "epoch" },
	{ -1, "devices", NULL, "devices" },
	{ -1, "devices", "{}", "devices" },
	{ -1, "elapsed_us", "\"7\"", "elapsed_us" },
	{ 0, "index", NULL, "devices[0].index" },
	{ 1, "index", "4294967296", "devices[1].index" },
	{ 1, "generation", "true", "devices[1].generation" },
	{ 0, "state", "\"sleeping\"", "devices[0].state" },
	{ 1, "state", NULL, "devices[1].state" },
	{ 1, "backend", "3", "devices[1].backend" },
	{ 0, "worker_socket", NULL, "devices[0].worker_socket" },
	{ 0, "worker_pid", "\"5\"", "devices[0].worker_pid" },
	{ 0, "worker_pid", "1e300", "devices[0].worker_pid" },
	{ 1, "respawns", "-2", "devices[1].respawns" },
	{ 1, "memory_used", NULL, "devices[1].memory_used" },
	{ 0, "memory_baseline", "null", "devices[0].memory_baseline" },
	{ 1, "reason", "[]", "devices[1].reason" },
};

START_TEST(status_refused)
{
	struct rp_status in = { .epoch = 7, .devices = (struct rp_device_info *)sample_devices, .ndevices = 2 }, out;
	struct rp_error err = { 0 };
	cJSON *p = rp_status_encode(&in), *where;

	where = status_refusals[_i].device < 0
			? p
			: cJSON_GetArrayItem(cJSON_GetObjectItem(p, "devices"), status_refusals[_i].device);
	cJSON_DeleteItemFromObjectCaseSensitive(where, status_refusals[_i].key);
	if (status_refusals[_i].value != NULL)
		cJSON_AddItemToObject(where, status_refusals[_i].key, json(status_refusals[_i].value));
	ck_assert_msg(rp_status_decode(p, &out, &err) == -EINVAL, "%s = %s accepted", status_refusals[_i].key,
		      status_refusals[_i].value ? status_refusals[_i].value : "(absent)");
	ck_assert_ptr_null(out.devices);
	assert_invalid_parameter(&err, status_refusals[_i].parameter);
	cJSON_Delete(p);
}
END_TEST

START_TEST(status_refuses_non_objects)
{
	struct rp_status out;
	struct rp_error err = { 0 };
	cJSON *p = json("[1]");

	ck_assert_int_eq(rp_status_decode(p, &out, &err), -EINVAL);
	assert_invalid_parameter(&err, "parameters");
	cJSON_Delete(p);
	p = json("{\"epoch\":1,\"devices\":[7]}");
	ck_assert_int_eq(rp_status_decode(p, &out, &err), -EINVAL);
	assert_invalid_parameter(&err, "devices[0]");
	cJSON_Delete(p);
}
END_TEST

START_TEST(watch_event_round_trip)
{
	struct rp_watch_event in = { 9, 1, 4, RP_STATE_READY, "subscribed" }, out;
	struct rp_error err = { 0 };
	cJSON *p = rp_watch_event_encode(&in);

	ck_assert_ptr_nonnull(p);
	ck_assert_int_eq(cJSON_GetArraySize(p), 5);
	cJSON_AddStringToObject(p, "later", "x");
	ck_assert_int_eq(rp_watch_event_decode(p, &out, &err), 0);
	ck_assert_uint_eq(out.epoch, 9);
	ck_assert_uint_eq(out.device, 1);
	ck_assert_uint_eq(out.generation, 4);
	ck_assert_int_eq(out.state, RP_STATE_READY);
	ck_assert_str_eq(out.reason, "subscribed");
	cJSON_Delete(p);
	/* A state out of range is not encoded. */
	in.state = RP_STATE_COUNT;
	ck_assert_ptr_null(rp_watch_event_encode(&in));
}
END_TEST

START_TEST(watch_event_refused)
{
	static const char *const keys[] = { "epoch", "device", "generation", "state", "reason" };
	static const char *const bad[] = { "-1", "\"x\"", "0.5", "\"bored\"", "null" };
	struct rp_watch_event in = { 9, 1, 4, RP_STATE_DRAINING, "restart" }, out;
	struct rp_error err = { 0 };

	for (int i = 0; i < 5; i++) {
		for (int absent = 0; absent < 2; absent++) {
			cJSON *p = rp_watch_event_encode(&in);

			cJSON_DeleteItemFromObjectCaseSensitive(p, keys[i]);
			if (!absent)
				cJSON_AddItemToObject(p, keys[i], json(bad[i]));
			ck_assert_msg(rp_watch_event_decode(p, &out, &err) == -EINVAL, "%s %s accepted", keys[i],
				      absent ? "absent" : bad[i]);
			assert_invalid_parameter(&err, keys[i]);
			cJSON_Delete(p);
		}
	}
	{
		cJSON *p = json("{\"epoch\":1,\"device\":4294967296,\"generation\":1,\"state\":\"ready\",\"reason\":\"\"}");

		ck_assert_int_eq(rp_watch_event_decode(p, &out, &err), -EINVAL);
		assert_invalid_parameter(&err, "device");
		cJSON_Delete(p);
		p = json("\"event\"");
		ck_assert_int_eq(rp_watch_event_decode(p, &out, &err), -EINVAL);
		assert_invalid_parameter(&err, "parameters");
		cJSON_Delete(p);
	}
}
END_TEST

static Suite *device_suite(void)
{
	Suite *s = suite_create("device");
	TCase *tc = tcase_create("status");

	tcase_add_test(tc, state_names);
	tcase_add_test(tc, status_round_trip);
	tcase_add_test(tc, health_round_trip);
	tcase_add_test(tc, sharing_round_trip);
	tcase_add_test(tc, status_ignores_unknown_fields);
	tcase_add_loop_test(tc, status_refused, 0, sizeof(status_refusals) / sizeof(status_refusals[0]));
	tcase_add_test(tc, status_refuses_non_objects);
	suite_add_tcase(s, tc);

	tc = tcase_create("watch");
	tcase_add_test(tc, watch_event_round_trip);
	tcase_add_test(tc, watch_event_refused);
	suite_add_tcase(s, tc);
	return s;
}

int main(void)
{
	SRunner *sr = srunner_create(device_suite());
	int failed;

	srunner_run_all(sr, CK_NORMAL);
	failed = srunner_ntests_failed(sr);
	srunner_free(sr);
	return failed == 0 ? EXIT_SUCCESS : EXIT_FAILURE;
}
