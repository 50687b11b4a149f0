/* SPDX-License-Identifier: Apache-2.0 */
/* The node's epoch on the worker sockets: io.regen.Device.Generation on a
 * device's worker socket reports the same epoch (and generation) as the
 * main socket, at start, after a Restart of one device, after a Restart of
 * every device, and after a crash and respawn. The worker of the device that
 * changed knows the new epoch before the supervisor answers (it came with its
 * Release, or on the respawned worker's command line); the other workers
 * hear it in a oneway call that may still be on its way, so for them the
 * test waits a little. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include <cjson/cJSON.h>
#include "tests/lib/client.h"

static struct tl_daemon daemon_;

/* Generation on device's worker socket: its epoch, and the generation of
 * the one device it reports. */
static uint64_t worker_epoch(regen_client *c, int device, uint64_t *generation)
{
	char *reply = NULL;
	cJSON *j, *devices, *d;
	uint64_t epoch;

	ASSERT_REGEN_OK(c, regen_call(c, device, "io.regen.Device.Generation", NULL, NULL, 0, &reply));
	j = cJSON_Parse(reply);
	ASSERT_NOT_NULL(j, "device %d's worker: Generation reply does not parse: %s", device, reply);
	devices = cJSON_GetObjectItemCaseSensitive(j, "devices");
	d = cJSON_GetArrayItem(devices, 0);
	ASSERT_EQ(cJSON_GetArraySize(devices), 1, "device %d's worker reports %d devices: %s", device,
	          cJSON_GetArraySize(devices), reply);
	ASSERT(cJSON_GetNumberValue(cJSON_GetObjectItemCaseSensitive(d, "index")) == device,
	       "device %d's worker reports another device: %s", device, reply);
	ASSERT(cJSON_IsNumber(cJSON_GetObjectItemCaseSensitive(j, "epoch")), "no epoch: %s", reply);
	epoch = (uint64_t)cJSON_GetNumberValue(cJSON_GetObjectItemCaseSensitive(j, "epoch"));
	*generation = (uint64_t)cJSON_GetNumberValue(cJSON_GetObjectItemCaseSensitive(d, "generation"));
	cJSON_Delete(j);
	free(reply);
	return epoch;
}

/* Every worker reports the main socket's epoch and its device's generation;
 * `changed` (or -1) must already, the others within 5 s. */
static uint64_t expect_same_epoch(regen_client *c, int changed, const char *when)
{
	regen_status *st;
	uint64_t epoch, generation, main_epoch;

	ASSERT_REGEN_OK(c, regen_generation_get(c, &st));
	main_epoch = regen_status_epoch(st);
	ASSERT_EQ(regen_status_device_count(st), 2, "%s: %d devices", when, regen_status_device_count(st));
	for (int i = 0; i < regen_status_device_count(st); i++) {
		double deadline = tl_now() + (i == changed ? 0 : 5);
		while ((epoch = worker_epoch(c, i, &generation)) != main_epoch && tl_now() < deadline) {
			usleep(10000);
		}
		ASSERT_UINT_EQ(epoch, main_epoch, "%s: device %d's worker says epoch %llu, the main socket %llu", when, i,
		               (unsigned long long)epoch, (unsigned long long)main_epoch);
		ASSERT_UINT_EQ(generation, regen_status_device(st, i)->generation,
		               "%s: device %d's worker says generation %llu, the main socket %llu", when, i,
		               (unsigned long long)generation, (unsigned long long)regen_status_device(st, i)->generation);
	}
	regen_status_free(st);
	tl_log("%s: epoch %llu on the main socket and both worker sockets", when, (unsigned long long)main_epoch);
	return main_epoch;
}

int main(void)
{
	regen_status *st;
	regen_client *c;
	uint64_t e0, e1, e2, e3, g1;

	tl_init(110);
	tl_daemon_start(&daemon_, NULL);
	c = tl_client_connect(&daemon_);

	e0 = expect_same_epoch(c, 0, "at start");
	ASSERT_UINT_EQ(e0, 1, "the epoch starts at %llu, not 1", (unsigned long long)e0);

	ASSERT_REGEN_OK(c, regen_restart(c, 0, "test_epoch", 2000, NULL));
	e1 = expect_same_epoch(c, 0, "after a restart of device 0");
	ASSERT_UINT_EQ(e1, e0 + 1, "a restart of one device moved the epoch %llu -> %llu", (unsigned long long)e0,
	               (unsigned long long)e1);

	ASSERT_REGEN_OK(c, regen_restart(c, -1, "test_epoch all", 2000, NULL));
	e2 = expect_same_epoch(c, -1, "after a restart of every device");
	ASSERT_UINT_EQ(e2, e1 + 2, "a restart of both devices moved the epoch %llu -> %llu", (unsigned long long)e1,
	               (unsigned long long)e2);

	/* A respawned worker starts with the epoch on its command line. */
	ASSERT_REGEN_OK(c, regen_generation_get(c, &st));
	g1 = regen_status_find_device(st, 1)->generation;
	regen_status_free(st);
	ASSERT_REGEN_OK(c, regen_inject_fault(c, 1, "crash"));
	tl_wait_generation(c, 1, g1, 30);
	e3 = expect_same_epoch(c, 1, "after device 1's worker crashed and was respawned");
	ASSERT_UINT_GT(e3, e2, "the crash left the epoch at %llu", (unsigned long long)e3);

	regen_client_destroy(c);
	ASSERT(tl_daemon_alive(&daemon_), "regend died");
	tl_log("PASS");
	return 0;
}
