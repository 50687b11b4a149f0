/* SPDX-License-Identifier: Apache-2.0 */
#include <math.h>
#include <stdbool.h>
#include <stdlib.h>
#include <string.h>
#include "client/ctl/metrics.h"
#include "proto/text.h"

/* The states of io.regen.Device.State: each device has one series per
 * state, 1 for the one it is in, so that a query need not know them. */
static const char *const states[] = {
	"ready", "draining", "released", "faulted", "resetting", "respawning", "unresponsive", "failed", "detached",
	"unsupported",
};

/* A label value as the format wants it (backslash, double quote and line
 * feed escaped), and what a terminal would act on as the text escape's own
 * characters (proto/text.h): the file is read by people too. */
static void label_value(FILE *f, const char *s)
{
	char *escaped = rp_text_escape_dup(s, RP_TEXT_LABEL);

	if (escaped)
		fputs(escaped, f);
	free(escaped);
}

static const cJSON *field(const cJSON *o, const char *name)
{
	return cJSON_GetObjectItemCaseSensitive(o, name);
}

static void header(FILE *f, const char *name, const char *type, const char *help)
{
	fprintf(f, "# HELP %s %s\n# TYPE %s %s\n", name, help, name, type);
}

/* A device's labels, on every series of it: regend's index (device), and
 * the labels dcgm-exporter puts on the same GPU's series, named and
 * written as it writes them (gpu: the index nvidia-smi and DCGM give the
 * GPU, which regend's equals under the unit's CUDA_DEVICE_ORDER=PCI_BUS_ID;
 * UUID; pci_bus_id; Hostname), so that a query joins the two on any of
 * them. dcgm-exporter's own `device` label is the device node (nvidia0):
 * join on UUID or gpu, never on device. Empty where no worker said yet. */
static void device_labels(FILE *f, const cJSON *d, const char *hostname)
{
	const cJSON *h = field(d, "health");
	int index = (int)cJSON_GetNumberValue(field(d, "index"));

	fprintf(f, "device=\"%d\",gpu=\"%d\",UUID=\"", index, index);
	label_value(f, cJSON_GetStringValue(field(h, "uuid")));
	fputs("\",pci_bus_id=\"", f);
	label_value(f, cJSON_GetStringValue(field(h, "pci_bus_id")));
	fputs("\",Hostname=\"", f);
	label_value(f, hostname);
	fputc('"', f);
}

/* One sample per device that has the field (a number, or a bool as 0/1);
 * sub: the object inside DeviceInfo it lives in (NULL: DeviceInfo), scale
 * multiplies it (µs to seconds). */
static void per_device(FILE *f, const cJSON *devices, const char *hostname, const char *name, const char *type,
		       const char *help, const char *sub, const char *key, double scale)
{
	const cJSON *d;
	bool any = false;

	cJSON_ArrayForEach(d, devices) {
		const cJSON *o = sub ? field(d, sub) : d, *v = field(o, key), *index = field(d, "index");
		double x;

		if (!cJSON_IsNumber(index) || !(cJSON_IsNumber(v) || cJSON_IsBool(v)))
			continue;
		x = cJSON_IsNumber(v) ? v->valuedouble * scale : cJSON_IsTrue(v);
		if (!any && help) {
			/* A summary's _sum carries the family's header. */
			size_t len = strlen(name) - (strcmp(type, "summary") == 0 ? 4 : 0);
			fprintf(f, "# HELP %.*s %s\n# TYPE %.*s %s\n", (int)len, name, help, (int)len, name, type);
		}
		any = true;
		fprintf(f, "%s{", name);
		device_labels(f, d, hostname);
		fprintf(f, "} %.17g\n", x);
	}
}

/* One sample per job of each device (DeviceInfo.jobs), labelled with the
 * job and where it comes from, and a stated job with the uid that stated
 * it (the same words from two uids are two jobs). The label is client_job, not job: job is
 * the label Prometheus gives every series of a scrape (the scrape job's
 * name), and a series' own would be renamed exported_job. A job is any
 * string an older or another regend may send: label_value escapes it. */
static void per_job(FILE *f, const cJSON *devices, const char *hostname, const char *name, const char *type,
		    const char *help, const char *key)
{
	const cJSON *d, *j;
	bool any = false;

	cJSON_ArrayForEach(d, devices) {
		const cJSON *index = field(d, "index");

		if (!cJSON_IsNumber(index))
			continue;
		cJSON_ArrayForEach(j, field(d, "jobs")) {
			const cJSON *v = field(j, key), *uid = field(j, "uid");

			if (!cJSON_IsNumber(v))
				continue;
			if (!any)
				header(f, name, type, help);
			any = true;
			fprintf(f, "%s{", name);
			device_labels(f, d, hostname);
			fputs(",client_job=\"", f);
			label_value(f, cJSON_GetStringValue(field(j, "job")));
			fputs("\",job_source=\"", f);
			label_value(f, cJSON_GetStringValue(field(j, "source")));
			if (cJSON_IsNumber(uid))
				fprintf(f, "\",uid=\"%.0f", uid->valuedouble);
			fprintf(f, "\"} %.17g\n", v->valuedouble);
		}
	}
}

/* What regend keeps for one rank's set (io.regen.Keep: a uid's job and
 * rank), summed over its names. */
struct kept_set {
	const char *job;
	double rank, uid, bytes, names, step, expires_ms;
	bool has_step, held, has_expires;
};

enum kept_value { KEPT_BYTES, KEPT_NAMES, KEPT_HELD, KEPT_STEP, KEPT_EXPIRES };

/* The sets of Status's `kept`, one per (job, rank, uid): n of them into a
 * malloc'ed array (NULL when there is none). */
static struct kept_set *kept_sets(const cJSON *kept, size_t *n)
{
	size_t cap = (size_t)cJSON_GetArraySize(kept);
	struct kept_set *sets = cap ? calloc(cap, sizeof(*sets)) : NULL;
	const cJSON *k;

	*n = 0;
	if (sets == NULL)
		return NULL;
	cJSON_ArrayForEach(k, kept) {
		const char *job = cJSON_GetStringValue(field(k, "job"));
		const cJSON *rank = field(k, "rank"), *uid = field(k, "uid"), *size = field(k, "size");
		const cJSON *step = field(k, "step"), *expires = field(k, "expires_unix_ms");
		struct kept_set *s = NULL;

		if (job == NULL || !cJSON_IsNumber(rank) || !cJSON_IsNumber(uid) || !cJSON_IsNumber(size))
			continue;
		for (size_t i = 0; i < *n && s == NULL; i++)
			if (sets[i].rank == rank->valuedouble && sets[i].uid == uid->valuedouble && !strcmp(sets[i].job, job))
				s = &sets[i];
		if (s == NULL) {
			s = &sets[(*n)++];
			s->job = job;
			s->rank = rank->valuedouble;
			s->uid = uid->valuedouble;
		}
		s->bytes += size->valuedouble;
		s->names++;
		s->held = cJSON_IsTrue(field(k, "held"));
		s->has_step = cJSON_IsNumber(step);
		s->step = s->has_step ? step->valuedouble : 0;
		s->has_expires = cJSON_IsNumber(expires);
		s->expires_ms = s->has_expires ? expires->valuedouble : 0;
	}
	return sets;
}

/* One sample per kept set, labelled with its job (client_job, as per_job
 * says why), rank and uid; a set without the value (no step committed,
 * no lease running) has none. */
static void per_kept_set(FILE *f, const struct kept_set *sets, size_t n, const char *hostname, const char *name,
			 const char *help, enum kept_value what)
{
	bool any = false;

	for (size_t i = 0; i < n; i++) {
		const struct kept_set *s = &sets[i];
		double v;

		switch (what) {
		case KEPT_BYTES:
			v = s->bytes;
			break;
		case KEPT_NAMES:
			v = s->names;
			break;
		case KEPT_HELD:
			v = s->held;
			break;
		case KEPT_STEP:
			if (!s->has_step)
				continue;
			v = s->step;
			break;
		default:
			if (!s->has_expires)
				continue;
			v = s->expires_ms * 1e-3;
			break;
		}
		if (!any)
			header(f, name, "gauge", help);
		any = true;
		fprintf(f, "%s{client_job=\"", name);
		label_value(f, s->job);
		fprintf(f, "\",rank=\"%.0f\",uid=\"%.0f\",Hostname=\"", s->rank, s->uid);
		label_value(f, hostname);
		fprintf(f, "\"} %.17g\n", v);
	}
}

void ctl_metrics_write(FILE *f, const cJSON *status, const char *hostname)
{
	const cJSON *devices = field(status, "devices"), *epoch = field(status, "epoch"), *d;

	header(f, "regen_up", "gauge", "1: regend answered io.regen.Device.Status.");
	fprintf(f, "regen_up 1\n");
	if (cJSON_IsNumber(epoch)) {
		header(f, "regen_epoch", "gauge", "The node's epoch: up by one with every generation change.");
		fprintf(f, "regen_epoch %.17g\n", epoch->valuedouble);
	}
	header(f, "regen_device_info", "gauge", "1 per device, with its backend.");
	cJSON_ArrayForEach(d, devices) {
		fputs("regen_device_info{", f);
		device_labels(f, d, hostname);
		fputs(",backend=\"", f);
		label_value(f, cJSON_GetStringValue(field(d, "backend")));
		fputs("\"} 1\n", f);
	}
	header(f, "regen_device_state", "gauge", "1 for the state the device is in, 0 for the others.");
	cJSON_ArrayForEach(d, devices) {
		const char *state = cJSON_GetStringValue(field(d, "state"));

		for (size_t i = 0; i < sizeof(states) / sizeof(states[0]); i++) {
			fputs("regen_device_state{", f);
			device_labels(f, d, hostname);
			fprintf(f, ",state=\"%s\"} %d\n", states[i], state && !strcmp(state, states[i]));
		}
	}
	per_device(f, devices, hostname, "regen_device_generation", "gauge",
		   "The device's generation: up by one per release, reset, restart and respawn.", NULL, "generation", 1);
	per_device(f, devices, hostname, "regen_device_respawns_total", "counter", "Worker processes replaced.", NULL, "respawns", 1);
	per_device(f, devices, hostname, "regen_device_releases_total", "counter", "Releases that completed.", "counters",
		   "releases", 1);
	per_device(f, devices, hostname, "regen_device_resets_total", "counter",
		   "Resets that completed (a fault's own reset too).", "counters", "resets", 1);
	per_device(f, devices, hostname, "regen_device_restarts_total", "counter", "Restarts that completed.", "counters",
		   "restarts", 1);
	per_device(f, devices, hostname, "regen_device_faults_total", "counter",
		   "Faults: a lost context, a hung call, a failed GPU (as its workers reported them), a worker that "
		   "crashed or stopped answering.", "counters", "faults", 1);
	per_device(f, devices, hostname, "regen_device_last_xid", "gauge", "The last XID seen while regend watched (0: none).",
		   "health", "last_xid", 1);
	per_device(f, devices, hostname, "regen_device_last_xid_timestamp_seconds", "gauge",
		   "When the last XID came, in seconds since the Unix epoch (0: none).", "health", "last_xid_unix_ms",
		   1e-3);
	/* Counts that only go up (the volatile one starts again at 0 when the
	 * driver reloads, which rate() takes as a counter reset). */
	per_device(f, devices, hostname, "regen_device_ecc_dbe_volatile_total", "counter",
		   "Uncorrected ECC errors since the driver loaded.", "health", "ecc_dbe_volatile", 1);
	per_device(f, devices, hostname, "regen_device_ecc_dbe_aggregate_total", "counter",
		   "Uncorrected ECC errors over the GPU's life.", "health", "ecc_dbe_aggregate", 1);
	per_device(f, devices, hostname, "regen_device_remap_failed", "gauge", "1: a row remapping failed, the GPU needs service.",
		   "health", "remap_failed", 1);
	per_device(f, devices, hostname, "regen_device_mps", "gauge",
		   "1: the worker's context is an MPS client (a fatal fault in any client of the GPU reaches every "
		   "client); 0: isolated.",
		   "sharing", "mps", 1);
	per_device(f, devices, hostname, "regen_device_memory_used_bytes", "gauge", "Memory the worker holds now.", NULL,
		   "memory_used", 1);
	per_device(f, devices, hostname, "regen_device_memory_baseline_bytes", "gauge",
		   "Memory the worker held right after it started.", NULL, "memory_baseline", 1);
	per_device(f, devices, hostname, "regen_device_calls_total", "counter", "Compute calls finished.", "counters", "calls", 1);
	per_device(f, devices, hostname, "regen_device_call_errors_total", "counter",
		   "Compute calls that failed or passed their deadline.", "counters", "call_errors", 1);
	/* The latency as a summary without quantiles: _sum / _count over an
	 * interval is the mean time of the calls that finished in it. */
	per_device(f, devices, hostname, "regen_device_call_seconds_sum", "summary",
		   "Time the finished compute calls spent in the backend.", "counters", "call_us", 1e-6);
	per_device(f, devices, hostname, "regen_device_call_seconds_count", "", NULL, "counters", "calls", 1);
	per_device(f, devices, hostname, "regen_device_calls_in_flight", "gauge", "Compute calls in flight.", "counters",
		   "in_flight", 1);
	per_device(f, devices, hostname, "regen_device_buffers", "gauge", "Buffers imported now (live imports).", "counters",
		   "buffers", 1);
	per_device(f, devices, hostname, "regen_device_events", "gauge", "Events imported now.", "counters", "events", 1);
	per_device(f, devices, hostname, "regen_device_connections", "gauge", "Client connections to the worker.", "counters",
		   "connections", 1);
	/* Per job: bounded by the jobs with a live connection or import (a
	 * worker tells at most 64 apart; the rest are job_source "other"). */
	per_job(f, devices, hostname, "regen_job_sessions", "gauge",
		"Connections of the job's clients to the device's worker (the jobs attached to it).", "sessions");
	per_job(f, devices, hostname, "regen_job_buffers", "gauge", "Buffers the job's clients imported, now (live imports).",
		"buffers");
	per_job(f, devices, hostname, "regen_job_buffer_bytes", "gauge", "Bytes of the buffers the job's clients imported, now.",
		"buffer_bytes");
	per_job(f, devices, hostname, "regen_job_events", "gauge", "Events the job's clients imported, now.", "events");
	per_job(f, devices, hostname, "regen_job_calls_in_flight", "gauge", "The job's compute calls in flight.", "in_flight");
	per_job(f, devices, hostname, "regen_job_calls_total", "counter",
		"The job's compute calls finished since it was last seen on the device.", "calls");
	per_job(f, devices, hostname, "regen_job_call_errors_total", "counter",
		"The job's compute calls that failed or passed their deadline, since it was last seen on the device.",
		"call_errors");
	/* Kept state: per set, the node's (the supervisor holds it, no
	 * device's worker). */
	size_t nsets = 0;
	struct kept_set *sets = kept_sets(field(status, "kept"), &nsets);
	per_kept_set(f, sets, nsets, hostname, "regen_kept_bytes",
		     "Bytes regend keeps for the rank (io.regen.Keep), held or leased; counted against its uid.",
		     KEPT_BYTES);
	per_kept_set(f, sets, nsets, hostname, "regen_kept_names", "Names (memory fds) kept for the rank.", KEPT_NAMES);
	per_kept_set(f, sets, nsets, hostname, "regen_kept_held",
		     "1: a live process of the rank holds its kept memory; 0: its process is gone and the lease runs.",
		     KEPT_HELD);
	per_kept_set(f, sets, nsets, hostname, "regen_kept_step", "The last completed step the rank committed.",
		     KEPT_STEP);
	per_kept_set(f, sets, nsets, hostname, "regen_kept_lease_end_timestamp_seconds",
		     "When the lease of kept memory no process holds ends (it is freed then), in seconds since the Unix "
		     "epoch.",
		     KEPT_EXPIRES);
	free(sets);
}
