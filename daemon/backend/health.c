/* SPDX-License-Identifier: Apache-2.0 */
/* The XID table and the health record every backend fills. Meanings follow
 * NVIDIA's XID catalog; the action is regend's: an XID that may be another
 * process's own error is recorded only, one that spoils every context on
 * the GPU resets ours, one after which only a GPU reset (or a technician)
 * helps fails the device. */
#include <stdio.h>
#include <string.h>
#include <time.h>
#include "daemon/backend/health.h"

static const struct rd_xid xids[] = {
	{ 13, RD_XID_RECORD, "graphics engine exception" },
	{ 31, RD_XID_RECORD, "GPU memory page fault" },
	{ 32, RD_XID_RECORD, "invalid or corrupted push buffer stream" },
	{ 43, RD_XID_RECORD, "GPU stopped processing" },
	{ 45, RD_XID_RECORD, "preemptive cleanup, due to previous errors" },
	{ 48, RD_XID_LOST, "double-bit ECC error" },
	{ 61, RD_XID_FAILED, "internal micro-controller breakpoint/warning" },
	{ 62, RD_XID_FAILED, "internal micro-controller halt" },
	{ 63, RD_XID_RECORD, "ECC page retirement or row remapping recording event" },
	{ 64, RD_XID_FAILED, "ECC page retirement or row remapper recording failure" },
	{ 69, RD_XID_RECORD, "graphics engine class error" },
	{ 74, RD_XID_LOST, "NVLink error" },
	{ 79, RD_XID_FAILED, "GPU has fallen off the bus" },
	{ 92, RD_XID_RECORD, "high single-bit ECC error rate" },
	{ 94, RD_XID_LOST, "contained ECC error" },
	{ 95, RD_XID_FAILED, "uncontained ECC error" },
	{ 109, RD_XID_RECORD, "context switch timeout" },
	{ 119, RD_XID_FAILED, "GSP RPC timeout" },
	{ 120, RD_XID_FAILED, "GSP error" },
	{ 140, RD_XID_FAILED, "unrecovered ECC error" },
	{ 154, RD_XID_RECORD, "GPU recovery action changed" },
};

const struct rd_xid *rd_xid_lookup(unsigned xid)
{
	static __thread struct rd_xid unknown;

	for (size_t i = 0; i < sizeof(xids) / sizeof(xids[0]); i++)
		if (xids[i].xid == xid)
			return &xids[i];
	unknown = (struct rd_xid){ xid, RD_XID_RECORD, "unknown XID" };
	return &unknown;
}

void rd_health_unknown(struct rd_health *h)
{
	memset(h, 0, sizeof(*h));
	snprintf(h->source, sizeof(h->source), "unavailable");
	h->ecc_dbe_volatile = h->ecc_dbe_aggregate = -1;
	h->retired_pages_pending = h->remap_pending = h->remap_failed = -1;
	h->minor_number = -1;
	h->sharing.mps_clients = -1;
}

void rd_health_note_xid(struct rd_health *h, const struct rd_xid *x, char *reason, size_t size)
{
	struct timespec ts;

	clock_gettime(CLOCK_REALTIME, &ts);
	h->last_xid = x->xid;
	h->last_xid_unix_ms = (int64_t)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
	snprintf(h->last_xid_text, sizeof(h->last_xid_text), "%s", x->meaning);
	if (reason)
		snprintf(reason, size, "XID %u: %s", x->xid, x->meaning);
}

const char *rd_fault_kind_name(enum rd_fault_kind kind)
{
	switch (kind) {
	case RD_FAULT_HUNG:
		return "hung";
	case RD_FAULT_FAILED:
		return "failed";
	default:
		return "lost";
	}
}
