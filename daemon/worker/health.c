/* SPDX-License-Identifier: Apache-2.0 */
/* The worker's health monitor: faults found without waiting for a call.
 *
 * - The backend's health watch (a thread of its own: on CUDA a query of the
 *   context every few milliseconds and NVML's XID and ECC events; on the
 *   host backend the simulated context) reports through dev->on_fault, and
 *   worker.c hands it to the supervisor as io.regen.Worker.Faulted.
 * - Hangs: every compute call has a deadline (its deadline_ms, else the
 *   default). One timer, aimed at the earliest deadline of the calls in
 *   flight, finds a call past it: the call is answered at once with
 *   io.regen.Timeout (its client waits no longer), the device takes no new
 *   work, and the worker reports the hang (kind "hung", naming the call).
 *   The call stays in flight inside the worker, holding its buffers, until
 *   the backend lets it go or the process ends: no kernel is known to stop
 *   short of the process's exit, so a hang ends in a respawn.
 * - A call on a communicator (io.regen.Comm) past its deadline is answered
 *   with io.regen.CommTimeout and aborts the communicator, not the device
 *   (comm.c): it waits for peers, and a peer that never calls is the usual
 *   cause.
 * - What the backend knows of the device's health (UUID, PCI bus id, the
 *   last XID, ECC counts, pending retirement and remapping) goes to the
 *   supervisor with Ready and every Stats, for Status; so does how the
 *   worker's context shares the GPU (MPS or not), with the MPS pipe
 *   directory the worker was started with (regend's environment). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "daemon/backend/health.h"
#include "daemon/log.h"
#include "daemon/worker/session.h"
#include "proto/device.h"
#include "proto/errors.h"

/* When cc is next due: its deadline until it is answered; past its
 * caller's deadline, regend's (the hang); 0: nothing more. */
static uint64_t due_of(const struct rd_compute_call *cc)
{
	if (!cc->answered)
		return cc->deadline_ns;
	return cc->timed_out ? cc->hang_ns : 0;
}

static uint64_t earliest_deadline(const struct rd_worker *w)
{
	uint64_t due = 0;

	for (const struct rd_compute_call *cc = w->running; cc; cc = cc->next) {
		uint64_t at = due_of(cc);
		if (at && (!due || at < due))
			due = at;
	}
	return due;
}

/* Answers cc with err (a Timeout) now: nobody waits for what its work
 * says later. */
static void answer_timeout(struct rd_worker *w, struct rd_compute_call *cc, struct rp_error *err)
{
	cc->answered = true;
	if (cc->call)
		rd_call_fail(cc->call, err);
	else if (cc->answer_early)
		cc->answer_early(cc, err);
	rp_error_clear(err);
	cc->call = NULL;
	w->abandoned++;
}

/* The caller's deadline passed, regend's not yet: its call ends with
 * Timeout; the work runs on (a kernel cannot be taken back), later calls
 * of its lane wait behind it, and the device counts as hung only if it is
 * still running at regend's deadline. */
static void timed_out(struct rd_worker *w, struct rd_compute_call *cc, uint64_t now)
{
	const struct rp_op_spec *spec = cc->op.compute.spec;
	uint64_t elapsed_ms = (now - cc->op.submitted_ns) / 1000000u;
	uint64_t limit_ms = (cc->deadline_ns - cc->op.submitted_ns) / 1000000u;
	int pid = cc->session && cc->session->client ? (int)cc->session->client->peer.pid : 0;
	struct rp_error err = { 0 };

	rd_debug("health", w->dev.index, rd_worker_generation(w), pid, "%s passed its caller's deadline of %llu ms",
		 spec->method, (unsigned long long)limit_ms);
	rp_err_timeout(&err, w->dev.index, (long long)elapsed_ms,
		       "%s did not finish within its deadline of %llu ms; its work still runs on device %d, whose "
		       "lane takes the next calls after it",
		       spec->method, (unsigned long long)limit_ms, w->dev.index);
	answer_timeout(w, cc, &err);
	cc->timed_out = true;
}

static void hung(struct rd_worker *w, struct rd_compute_call *cc, uint64_t now)
{
	const struct rp_op_spec *spec = cc->op.compute.spec;
	uint64_t elapsed_ms = (now - cc->op.submitted_ns) / 1000000u;
	uint64_t limit_ms = (cc->hang_ns - cc->op.submitted_ns) / 1000000u;
	unsigned lane = cc->op.lane ? cc->op.lane->index : 0;
	int pid = cc->session && cc->session->client ? (int)cc->session->client->peer.pid : 0;
	struct rp_error err = { 0 };
	char reason[160];

	/* A communicator's call waits for its peers: one that never calls is
	 * the usual cause, not the device. */
	if (cc->op.comm) {
		rd_comm_deadline(w, cc, now);
		return;
	}
	rd_warn("health", w->dev.index, rd_worker_generation(w), pid,
		"%s on lane %u passed its deadline of %llu ms (%llu ms in flight): the device is hung", spec->method,
		lane, (unsigned long long)limit_ms, (unsigned long long)elapsed_ms);
	if (!cc->answered) {
		rp_err_timeout(&err, w->dev.index, (long long)elapsed_ms,
			       "%s did not finish within its deadline of %llu ms; device %d is being reset: wait for the "
			       "next generation (Watch), re-import and retry",
			       spec->method, (unsigned long long)limit_ms, w->dev.index);
		answer_timeout(w, cc, &err);
	}
	cc->timed_out = false;
	snprintf(reason, sizeof(reason), "hung: %s from pid %d on lane %u passed its deadline of %llu ms",
		 spec->name, pid, lane, (unsigned long long)limit_ms);
	/* Charged to the uid whose call it was (daemon/hang_charge.h), unless
	 * a fault injected on purpose made it hang. */
	rd_worker_fault_hung(w, reason,
			     !w->hang_injected && cc->session && cc->session->client ?
				     (int64_t)cc->session->client->peer.uid : -1);
}

static void on_deadline(uv_timer_t *t)
{
	struct rd_worker *w = t->data;
	uint64_t now = uv_hrtime(), due;

	for (struct rd_compute_call *cc = w->running; cc; cc = cc->next) {
		uint64_t at = due_of(cc);

		if (!at || now < at)
			continue;
		if (!cc->answered && now < cc->hang_ns && !cc->op.comm)
			timed_out(w, cc, now);
		else
			hung(w, cc, now);
	}
	due = earliest_deadline(w);
	if (due)
		uv_timer_start(&w->deadline_timer, on_deadline, (due - now + 999999) / 1000000, 0);
}

/* Milliseconds, rounded up: the timer never fires before the deadline. */
static void aim(struct rd_worker *w, uint64_t due)
{
	uint64_t now = uv_hrtime();

	uv_timer_start(&w->deadline_timer, on_deadline, due > now ? (due - now + 999999) / 1000000 : 0, 0);
}

void rd_health_init(struct rd_worker *w)
{
	uv_timer_init(w->loop, &w->deadline_timer);
	w->deadline_timer.data = w;
}

void rd_health_start(struct rd_worker *w)
{
	struct rp_error err = { 0 };

	if (w->health_started || !w->dev.backend->health_start)
		return;
	if (w->dev.backend->health_start(&w->dev, w->opts->health_period_ms, &err) < 0) {
		const char *m = err.params ? cJSON_GetStringValue(cJSON_GetObjectItem(err.params, "message")) : NULL;
		rd_warn("health", w->dev.index, rd_worker_generation(w), 0, "no health watch: %s", m ? m : "?");
		rp_error_clear(&err);
		return;
	}
	w->health_started = true;
	rd_debug("health", w->dev.index, rd_worker_generation(w), 0, "health watch every %u ms", w->opts->health_period_ms);
}

void rd_health_stop(struct rd_worker *w)
{
	uv_timer_stop(&w->deadline_timer);
	if (w->health_started && w->dev.backend->health_stop)
		w->dev.backend->health_stop(&w->dev);
	w->health_started = false;
}

void rd_health_call_started(struct rd_worker *w, struct rd_compute_call *cc)
{
	/* The timer is aimed at the earliest deadline (rounded up to a
	 * millisecond) whenever a call runs: a call due no sooner leaves it,
	 * with no walk of the calls in flight (a lane's ring may hold a
	 * thousand). */
	bool armed = uv_is_active((uv_handle_t *)&w->deadline_timer);
	uint64_t due_before = armed ? uv_now(w->loop) * 1000000u + uv_timer_get_due_in(&w->deadline_timer) * 1000000u
				    : earliest_deadline(w);

	cc->prev = w->running_tail;
	cc->next = NULL;
	if (w->running_tail)
		w->running_tail->next = cc;
	else
		w->running = cc;
	w->running_tail = cc;
	/* Calls mostly share the default deadline, so a later call's is later:
	 * the timer moves only for one that is due sooner. */
	if (cc->deadline_ns && (!due_before || cc->deadline_ns < due_before))
		aim(w, cc->deadline_ns);
}

void rd_health_call_finished(struct rd_worker *w, struct rd_compute_call *cc)
{
	if (cc->prev)
		cc->prev->next = cc->next;
	else
		w->running = cc->next;
	if (cc->next)
		cc->next->prev = cc->prev;
	else
		w->running_tail = cc->prev;
	cc->prev = cc->next = NULL;
	if (cc->answered && w->abandoned)
		w->abandoned--;
	if (!w->running)
		uv_timer_stop(&w->deadline_timer);
}

cJSON *rd_health_json(struct rd_worker *w)
{
	struct rd_health h;

	if (w->dev.backend->health)
		w->dev.backend->health(&w->dev, &h);
	else
		rd_health_unknown(&h);
	struct rp_device_health out = {
		.source = h.source,
		.detail = h.detail,
		.uuid = h.uuid,
		.pci_bus_id = h.pci_bus_id,
		.last_xid = h.last_xid,
		.last_xid_unix_ms = h.last_xid_unix_ms,
		.last_xid_text = h.last_xid_text,
		.ecc_dbe_volatile = h.ecc_dbe_volatile,
		.ecc_dbe_aggregate = h.ecc_dbe_aggregate,
		.retired_pages_pending = h.retired_pages_pending,
		.remap_pending = h.remap_pending,
		.remap_failed = h.remap_failed,
		.has_minor_number = h.minor_number >= 0,
		.minor_number = h.minor_number >= 0 ? (uint32_t)h.minor_number : 0,
		.nmig = h.nmig < RP_MIG_DEVICES_MAX ? h.nmig : RP_MIG_DEVICES_MAX,
	};
	for (size_t i = 0; i < out.nmig; i++)
		out.mig_devices[i] = h.mig_devices[i];
	return rp_device_health_encode(&out);
}

cJSON *rd_sharing_json(struct rd_worker *w)
{
	struct rd_health h;

	if (!w->dev.backend->health)
		return NULL;
	w->dev.backend->health(&w->dev, &h);
	if (!h.sharing.known)
		return NULL;
	/* The worker inherits regend's environment: what the operator named
	 * is what CUDA saw. */
	const char *pipe = getenv("CUDA_MPS_PIPE_DIRECTORY");
	struct rp_device_sharing out = {
		.mps = h.sharing.mps,
		.mps_pipe_directory = pipe ? pipe : "",
		.compute_mode = h.sharing.compute_mode,
		.mps_clients = h.sharing.mps_clients,
		.reason = h.sharing.reason,
	};
	return rp_device_sharing_encode(&out);
}
