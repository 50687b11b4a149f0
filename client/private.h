/* libregen internals shared by its source files. */
#pragma once

#include <stdbool.h>
#include <stdint.h>
#include <cjson/cJSON.h>
#include "include/regen.h"
#include "conn.h"
#include "proto/ids.h"

struct regen_client {
	char socket_path[sizeof(((struct rc_conn *)0)->path)];
	struct rc_conn main;
	struct rc_conn worker[REGEN_DEVICES_MAX];
	double timeout_s;
	/* The last named error. */
	char err_name[128];
	char err_message[512];
	char *err_params;                 /* JSON text, malloc'ed */
	/* The newest generation seen per device (Status, Generation, errors). */
	uint64_t known_generation[REGEN_DEVICES_MAX];
	struct regen_buffer *buffers;     /* open buffers, so destroy can detach them */
};

struct regen_buffer {
	regen_client *client;             /* NULL once the client is gone */
	struct regen_buffer *prev, *next;
	int device;
	char id[RP_ID_MAX];
	uint64_t generation;
	uint64_t size;
};

/* Calls `method` on the main socket (device < 0) or the device's worker
 * socket, connecting (or reconnecting) first when needed. `params` (may be
 * NULL) is not consumed. On success, *reply (when not NULL) receives the
 * reply's parameters, a cJSON object the caller deletes. */
int rc_call(regen_client *c, int device, const char *method, const cJSON *params,
	    const int *fds, size_t nfds, cJSON **reply);
void rc_clear_error(regen_client *c);
/* Records a failure made on this side under a name, for -EREMOTE-less
 * diagnostics (message only). */
void rc_set_local_error(regen_client *c, const char *fmt, ...) __attribute__((format(printf, 2, 3)));

/* DeviceInfo lists (Status, Generation, Release, Reset, Restart replies). */
int rc_parse_status(regen_client *c, const cJSON *params, struct regen_status *out);

/* Small cJSON readers that tolerate absent fields. */
int64_t rc_json_int(const cJSON *obj, const char *key, int64_t def);
void rc_json_str(const cJSON *obj, const char *key, char *dst, size_t size);
