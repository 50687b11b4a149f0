/* SPDX-License-Identifier: Apache-2.0 */
/* io.regen.Device's replies as structs: the device list that Status,
 * Generation, Release, Reset and Restart answer with, and Watch's events,
 * each encoded and decoded in one place.
 *
 * Encoders return a new cJSON object, NULL on ENOMEM. Decoders check every
 * field the IDL declares: present, of its type (integers exact, states one
 * of io.regen.Device.State), else org.varlink.service.InvalidParameter
 * {parameter} naming it ("devices[1].state"). Fields they do not know are
 * ignored: a newer daemon may add some. Decoded strings point into the
 * cJSON they came from. */
#pragma once

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <cjson/cJSON.h>
#include "job.h"
#include "message.h"

#define RP_DEVICE_STATUS      "io.regen.Device.Status"
#define RP_DEVICE_GENERATION  "io.regen.Device.Generation"
#define RP_DEVICE_WATCH       "io.regen.Device.Watch"
#define RP_DEVICE_RELEASE     "io.regen.Device.Release"
#define RP_DEVICE_RESET       "io.regen.Device.Reset"
#define RP_DEVICE_RESTART     "io.regen.Device.Restart"
#define RP_DEVICE_INJECT_FAULT "io.regen.Device.InjectFault"

/* io.regen.Device.State, in the IDL's order: the one device-state enum of
 * regend (the supervisor holds each device's; docs/lifecycle.md draws the
 * transitions) and of libregen. */
enum rp_state {
	RP_STATE_READY = 0,     /* serving */
	RP_STATE_DRAINING,      /* a Release/Restart refuses new work and waits for the calls in flight */
	RP_STATE_RELEASED,      /* the worker destroys its resources properly (CUDA usable) */
	RP_STATE_FAULTED,       /* the worker reported a lost context; a reset follows */
	RP_STATE_RESETTING,     /* the context is thrown away and rebuilt in process */
	RP_STATE_RESPAWNING,    /* the worker process is being replaced, or starts for the first time */
	RP_STATE_UNRESPONSIVE,  /* the worker answers no heartbeat: it is killed and respawned */
	RP_STATE_FAILED,        /* the GPU needs a reset or fell off the bus: no worker until a later try */
	RP_STATE_DETACHED,      /* an admin took it out (Detach): no worker, no handle, until Attach */
	RP_STATE_UNSUPPORTED,   /* the node's software cannot drive it (driver, CUDA backend): no worker until a later try */
	RP_STATE_COUNT,
};

/* "ready", "draining", ...; NULL out of range. */
const char *rp_state_name(enum rp_state state);
/* The state of that name, -1 when there is none. */
int rp_state_from_name(const char *name);

/* The most MIG devices one GPU holds (7 on A100, H100, B200), with room. */
#define RP_MIG_DEVICES_MAX 8

/* io.regen.Device.Health: what the worker's backend knows of the GPU. For
 * the encoder a NULL string is ""; -1 is unknown (left out on the wire). */
struct rp_device_health {
	const char *source;             /* "nvml", "simulated", "unavailable" */
	const char *detail;
	const char *uuid;
	const char *pci_bus_id;
	uint32_t last_xid;              /* 0: none seen */
	int64_t last_xid_unix_ms;
	const char *last_xid_text;
	int64_t ecc_dbe_volatile, ecc_dbe_aggregate;
	int retired_pages_pending, remap_pending, remap_failed;   /* 1, 0, -1 unknown */
	bool has_minor_number;          /* the GPU's device node is /dev/nvidia<minor_number> */
	uint32_t minor_number;
	size_t nmig;                    /* its MIG devices' UUIDs (MIG on); 0: none, or not known */
	const char *mig_devices[RP_MIG_DEVICES_MAX];
};

/* io.regen.Device.Sharing: how the worker's context shares its GPU with
 * other processes' (the ranks'). For the encoder a NULL string is "";
 * mps_clients -1 and compute_mode "" are unknown (left out on the wire). */
struct rp_device_sharing {
	bool mps;                       /* the context is an MPS client */
	const char *mps_pipe_directory; /* the worker's CUDA_MPS_PIPE_DIRECTORY; "" unset */
	const char *compute_mode;       /* NVML's: "default", "exclusive_process", ...; "" unknown */
	int64_t mps_clients;            /* NVML's count of MPS clients on the GPU; -1 unknown */
	const char *reason;             /* what it means, in words */
};

/* io.regen.Device.Counters: what a device counted since regend started,
 * over all its workers (counters only go up), and what its worker holds
 * now. */
struct rp_device_counters {
	uint64_t releases, resets, restarts;   /* lifecycle operations that completed, by verb */
	uint64_t faults;                        /* faults its workers reported */
	uint64_t calls, call_errors, call_us;   /* compute calls finished, those that failed, µs in the backend */
	uint64_t in_flight, buffers, events, connections;   /* the worker's now */
};

/* io.regen.Device.Job: one job's use of a device's worker now. */
struct rp_device_job {
	const char *job;                /* "" for sources none and other */
	enum rp_job_source source;
	bool has_uid;                   /* source client: the uid that stated it */
	uint32_t uid;
	uint64_t sessions, buffers, buffer_bytes, events, in_flight;   /* now */
	uint64_t calls, call_errors;    /* while the job was listed */
};

/* io.regen.Device.DeviceInfo. For the encoder a NULL string is "". */
struct rp_device_info {
	uint32_t index;
	uint64_t generation;
	enum rp_state state;
	const char *backend;
	const char *worker_socket;
	int64_t worker_pid;
	uint64_t respawns;
	uint64_t memory_used, memory_baseline;
	const char *reason;
	bool has_health;                /* optional on the wire */
	struct rp_device_health health;
	bool has_sharing;               /* optional on the wire */
	struct rp_device_sharing sharing;
	bool has_counters;              /* optional on the wire; the decoder leaves it out */
	struct rp_device_counters counters;
	bool has_jobs;                  /* optional on the wire; the decoder leaves it out */
	const struct rp_device_job *jobs;
	size_t njobs;
};

/* The reply of Status, Generation, Release, Reset and Restart: the node
 * epoch and the devices, and for Restart the time it took. */
struct rp_status {
	uint64_t epoch;
	struct rp_device_info *devices;
	size_t ndevices;
	bool has_elapsed_us;
	uint64_t elapsed_us;
};

/* One Health object, as DeviceInfo and io.regen.Worker carry it. */
cJSON *rp_device_health_encode(const struct rp_device_health *health);
int rp_device_health_decode(const cJSON *o, struct rp_device_health *out, struct rp_error *err);

/* One Sharing object, as DeviceInfo and io.regen.Worker carry it. */
cJSON *rp_device_sharing_encode(const struct rp_device_sharing *sharing);
int rp_device_sharing_decode(const cJSON *o, struct rp_device_sharing *out, struct rp_error *err);
/* An array of Job, as DeviceInfo and io.regen.Worker.Stats carry it. */
cJSON *rp_device_jobs_encode(const struct rp_device_job *jobs, size_t n);
/* At most `max` entries, each checked (a job at most RP_JOB_MAX bytes);
 * *out is malloc'ed (free(); NULL for an empty array) and its strings
 * point into `array`. On failure *out is NULL and *n 0. */
int rp_device_jobs_decode(const cJSON *array, size_t max, struct rp_device_job **out, size_t *n,
			  struct rp_error *err);

cJSON *rp_status_encode(const struct rp_status *status);
/* On success out->devices is malloc'ed (rp_status_finish frees it); on
 * failure *out is left empty. */
int rp_status_decode(const cJSON *params, struct rp_status *out, struct rp_error *err);
/* Frees what rp_status_decode allocated. Accepts NULL. */
void rp_status_finish(struct rp_status *status);

/* One reply of Watch: a device's generation and state after a change (or,
 * first, with reason "subscribed", as it stands). */
struct rp_watch_event {
	uint64_t epoch;
	uint32_t device;
	uint64_t generation;
	enum rp_state state;
	const char *reason;
};

cJSON *rp_watch_event_encode(const struct rp_watch_event *event);
int rp_watch_event_decode(const cJSON *params, struct rp_watch_event *out, struct rp_error *err);
