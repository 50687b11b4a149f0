/* SPDX-License-Identifier: Apache-2.0 */
/* What every backend shares about a device's health: the XID table (what an
 * XID means and what regend does about it) and the health record's
 * defaults. No CUDA here: the host backend simulates XIDs through the same
 * table, so the supervisor's handling of each outcome is tested without a
 * GPU. */
#pragma once

#include <stdint.h>
#include "daemon/backend/backend.h"

/* What an XID asks of regend. */
enum rd_xid_action {
	/* Recorded and shown in Status, nothing else: it may be another
	 * process's error (an XID names no process through NVML); a fault of
	 * our own context shows up in the context check anyway. */
	RD_XID_RECORD = 0,
	/* Every context on the GPU is suspect: ours is reset (or the worker
	 * respawned). */
	RD_XID_LOST,
	/* The GPU needs a reset or is gone: state `failed`, no respawn loop. */
	RD_XID_FAILED,
};

struct rd_xid {
	unsigned xid;
	enum rd_xid_action action;
	const char *meaning;
};

/* The entry for xid; an unknown one gets RD_XID_RECORD and "unknown XID". */
const struct rd_xid *rd_xid_lookup(unsigned xid);

/* The fault kind an XID's action reports, and whether it reports one. */
static inline bool rd_xid_is_fault(const struct rd_xid *x, enum rd_fault_kind *kind)
{
	if (x->action == RD_XID_RECORD)
		return false;
	*kind = x->action == RD_XID_FAILED ? RD_FAULT_FAILED : RD_FAULT_LOST;
	return true;
}

/* Records an XID in h (number, meaning, now) and writes the reason a fault
 * for it carries: "XID 79: GPU has fallen off the bus". */
void rd_health_note_xid(struct rd_health *h, const struct rd_xid *x, char *reason, size_t size);

/* "lost", "hung", "failed": as io.regen.Worker.Faulted names them. */
const char *rd_fault_kind_name(enum rd_fault_kind kind);
