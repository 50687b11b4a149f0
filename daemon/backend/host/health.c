/* SPDX-License-Identifier: Apache-2.0 */
/* The host backend's health watch: what the CUDA backend's is on a GPU,
 * over the simulated context. A thread looks every period_ms, without
 * waiting for a call, for a lost context (InjectFault device_lost) and for
 * an injected XID, which goes through the same XID table as NVML's would:
 * so the supervisor's handling of faults found without a call, critical
 * XIDs and failed GPUs runs and is tested without a GPU. */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include "daemon/backend/health.h"
#include "daemon/backend/host/common.h"
#include "daemon/env.h"
#include "proto/errors.h"

void host_report_lost(struct rd_device *dev, enum rd_fault_kind kind, const char *reason)
{
	struct host_device *h = hd(dev);

	atomic_store(&h->lost, true);
	/* A failed GPU is worse news than a lost context: it is told even
	 * after the loss was. */
	if ((!atomic_exchange(&h->lost_reported, true) || kind == RD_FAULT_FAILED) && dev->on_fault)
		dev->on_fault(dev, kind, reason);
}

static void look(struct rd_device *dev)
{
	struct host_device *h = hd(dev);
	unsigned xid = atomic_exchange(&h->pending_xid, 0);
	char reason[160];

	if (xid) {
		const struct rd_xid *x = rd_xid_lookup(xid);
		enum rd_fault_kind kind;

		pthread_mutex_lock(&h->health.lock);
		rd_health_note_xid(&h->health.info, x, reason, sizeof(reason));
		pthread_mutex_unlock(&h->health.lock);
		if (rd_xid_is_fault(x, &kind))
			host_report_lost(dev, kind, reason);
	}
	if (atomic_load(&h->lost) && !atomic_load(&h->lost_reported))
		host_report_lost(dev, RD_FAULT_LOST, "health watch: the simulated context is lost (injected device_lost)");
}

static void *health_main(void *arg)
{
	struct rd_device *dev = arg;
	struct host_health *hh = &hd(dev)->health;

	pthread_mutex_lock(&hh->lock);
	while (!hh->stop) {
		struct timespec until;

		clock_gettime(CLOCK_MONOTONIC, &until);
		until.tv_nsec += (long)hh->period_ms * 1000000L;
		until.tv_sec += until.tv_nsec / 1000000000L;
		until.tv_nsec %= 1000000000L;
		pthread_cond_timedwait(&hh->cond, &hh->lock, &until);
		if (hh->stop)
			break;
		pthread_mutex_unlock(&hh->lock);
		look(dev);
		pthread_mutex_lock(&hh->lock);
	}
	pthread_mutex_unlock(&hh->lock);
	return NULL;
}

void host_health_init(struct rd_device *dev)
{
	struct host_health *hh = &hd(dev)->health;
	pthread_condattr_t ca;

	pthread_mutex_init(&hh->lock, NULL);
	pthread_condattr_init(&ca);
	pthread_condattr_setclock(&ca, CLOCK_MONOTONIC);
	pthread_cond_init(&hh->cond, &ca);
	pthread_condattr_destroy(&ca);
	rd_health_unknown(&hh->info);
	snprintf(hh->info.source, sizeof(hh->info.source), "simulated");
	snprintf(hh->info.detail, sizeof(hh->info.detail), "the host backend has no GPU; XIDs come from InjectFault");
	snprintf(hh->info.uuid, sizeof(hh->info.uuid), "HOST-%d", dev->index);
	/* A bus id no real device has (domain 0xffff, beyond the 0x0000-0x00ff
	 * that host bridges use), so that tools which name GPUs by bus id can
	 * be tried on the host backend. */
	snprintf(hh->info.pci_bus_id, sizeof(hh->info.pci_bus_id), "0000FFFF:%02X:00.0", dev->index & 0xff);
	hh->info.ecc_dbe_volatile = hh->info.ecc_dbe_aggregate = 0;
	hh->info.retired_pages_pending = hh->info.remap_pending = hh->info.remap_failed = 0;
	/* Its "device node" is its index, as /dev/nvidiaN's minor is a GPU's. */
	hh->info.minor_number = dev->index;
	/* MIG devices, for tests of what names a GPU through one
	 * (REGEN_HOST_MIG_DEVICES=N, a test knob: N per simulated GPU,
	 * MIG-HOST-<index>-<k>). */
	long nmig = (long)rd_env_number(RD_ENV_HOST_MIG_DEVICES, 0, RP_MIG_DEVICES_MAX, 0);
	for (long k = 0; k < nmig && k < RP_MIG_DEVICES_MAX; k++)
		snprintf(hh->info.mig_devices[hh->info.nmig++], sizeof(hh->info.mig_devices[0]), "MIG-HOST-%d-%ld",
			 dev->index, k);
	/* No GPU context, so nothing to share: an MPS pipe directory in the
	 * environment (which Status shows beside this) changes nothing here. */
	hh->info.sharing.known = true;
	hh->info.sharing.mps = false;
	snprintf(hh->info.sharing.reason, sizeof(hh->info.sharing.reason),
		 "the host backend has no GPU context: nothing is shared with other processes, MPS does not apply");
}

void host_health_finish(struct rd_device *dev)
{
	struct host_health *hh = &hd(dev)->health;

	host_health_stop(dev);
	pthread_cond_destroy(&hh->cond);
	pthread_mutex_destroy(&hh->lock);
}

int host_health_start(struct rd_device *dev, unsigned period_ms, struct rp_error *err)
{
	struct host_health *hh = &hd(dev)->health;
	int r;

	if (hh->running)
		return 0;
	hh->period_ms = period_ms ? period_ms : 5;
	hh->stop = false;
	r = pthread_create(&hh->thread, NULL, health_main, dev);
	if (r) {
		rp_error_set(err, RP_ERR_BACKEND, "cannot start the health watch: %s", strerror(r));
		return -EIO;
	}
	hh->running = true;
	return 0;
}

void host_health_stop(struct rd_device *dev)
{
	struct host_health *hh = &hd(dev)->health;

	if (!hh->running)
		return;
	pthread_mutex_lock(&hh->lock);
	hh->stop = true;
	pthread_cond_broadcast(&hh->cond);
	pthread_mutex_unlock(&hh->lock);
	pthread_join(hh->thread, NULL);
	hh->running = false;
}

void host_health_info(struct rd_device *dev, struct rd_health *out)
{
	struct host_health *hh = &hd(dev)->health;

	pthread_mutex_lock(&hh->lock);
	*out = hh->info;
	pthread_mutex_unlock(&hh->lock);
}
