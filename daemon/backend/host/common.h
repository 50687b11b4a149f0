/* What the files of daemon/backend/host/ share: the device state, and each
 * file's functions that backend.c puts in the ops table. */
#pragma once

#include <stdatomic.h>
#include <stdint.h>
#include "daemon/backend/backend.h"

struct host_device {
	struct rd_resource context;    /* the simulated context: lost by fault injection */
	atomic_bool lost;
	atomic_bool hang;
	atomic_uint_fast64_t mapped_bytes;
	atomic_uint_fast64_t scratch_bytes;
};

static inline struct host_device *hd(struct rd_device *dev)
{
	return dev->backend_data;
}

/* buffer.c */
int host_import_buffer(struct rd_device *dev, struct rd_import *req, struct rd_buffer **out, struct rp_error *err);
void host_close_buffer(struct rd_buffer *buf);

/* lane.c */
struct rd_lane *host_lane_create(struct rd_device *dev, unsigned index, struct rp_error *err);
void host_lane_destroy(struct rd_lane *base);
int host_submit(struct rd_lane *base, struct rd_op *op);
