/* SPDX-License-Identifier: Apache-2.0 */
/* The stub backend of the daemon fuzz targets: what the worker core asks of
 * a backend, with allocations in place of memory and a queue in place of a
 * device. It keeps counts the harnesses hold the core to. */
#include <errno.h>
#include <stdlib.h>
#include <unistd.h>
#include "fuzz_daemon.h"
#include "proto/errors.h"

struct fz_backend_stats fz_backend_stats;
void (*fz_backend_on_close)(struct rd_object *o);
bool fz_backend_outcomes = true;

static struct rd_op *pending_head, *pending_tail;

/* A buffer, and the fd it was imported from (host_fd, cuda_fd), which is
 * the backend's from a successful import until the buffer closes. */
struct stub_buffer {
	struct rd_buffer buf;
	int fd;
};

static int stub_open(struct rd_device *dev, struct rp_error *err)
{
	return 0;
}

static void stub_close(struct rd_device *dev)
{
}

/* A size of 13 bytes fails, so the failure path of an import is reachable. */
static int stub_import_buffer(struct rd_device *dev, struct rd_import *req, struct rd_buffer **out,
			      struct rp_error *err)
{
	struct stub_buffer *sb;

	if (req->size == 13) {
		rp_err_import_failed(err, "cuda_ipc", "the stub backend refuses 13-byte buffers");
		return -EINVAL;
	}
	sb = calloc(1, sizeof(*sb));
	if (!sb)
		return -ENOMEM;
	sb->buf.size = req->size;
	sb->fd = req->fd;
	fz_backend_stats.buffers_open++;
	fz_backend_stats.buffers_made++;
	*out = &sb->buf;
	return 0;
}

static void stub_close_buffer(struct rd_buffer *buf)
{
	FZ_CHECK(fz_backend_stats.buffers_open > 0, "a buffer closed that was never opened");
	FZ_CHECK(buf->obj.core_refs == 0 && buf->obj.closing && buf->obj.owner == NULL,
		 "backend close of a buffer still held (refs %u, closing %d)", buf->obj.core_refs, buf->obj.closing);
	if (fz_backend_on_close)
		fz_backend_on_close(&buf->obj);
	struct stub_buffer *sb = (struct stub_buffer *)buf;
	if (sb->fd >= 0)
		close(sb->fd);
	fz_backend_stats.buffers_open--;
	fz_backend_stats.buffers_closed++;
	free(sb);
}

static int stub_import_event(struct rd_device *dev, const unsigned char handle[64], struct rd_event **out,
			     struct rp_error *err)
{
	struct rd_event *ev = calloc(1, sizeof(*ev));

	if (!ev)
		return -ENOMEM;
	fz_backend_stats.events_open++;
	fz_backend_stats.events_made++;
	*out = ev;
	return 0;
}

static void stub_close_event(struct rd_event *ev)
{
	FZ_CHECK(fz_backend_stats.events_open > 0, "an event closed that was never opened");
	FZ_CHECK(ev->obj.core_refs == 0 && ev->obj.closing && ev->obj.owner == NULL,
		 "backend close of an event still held (refs %u, closing %d)", ev->obj.core_refs, ev->obj.closing);
	if (fz_backend_on_close)
		fz_backend_on_close(&ev->obj);
	fz_backend_stats.events_open--;
	fz_backend_stats.events_closed++;
	free(ev);
}

static struct rd_lane *stub_lane_create(struct rd_device *dev, unsigned index, struct rp_error *err)
{
	struct rd_lane *lane = calloc(1, sizeof(*lane));

	if (!lane) {
		rp_err_out_of_memory(err, dev->index, "no memory for a lane");
		return NULL;
	}
	lane->device = dev;
	lane->index = index;
	fz_backend_stats.lanes_open++;
	return lane;
}

/* The core destroys a lane only once its calls finished. */
static void stub_lane_destroy(struct rd_lane *lane)
{
	for (struct rd_op *op = pending_head; op; op = op->next)
		FZ_CHECK(op->lane != lane, "lane destroyed with a call still queued on it");
	fz_backend_stats.lanes_open--;
	free(lane);
}

/* The first operand's offset in elements picks an outcome: 7 (mod 13)
 * refuses, 11 fails later; anything else succeeds. */
static unsigned outcome_of(const struct rd_op *op)
{
	const struct rp_operand *first = &op->compute.operands[0];
	size_t elem = rp_dtype_size(first->dtype);

	return (unsigned)((first->offset / (elem ? elem : 1)) % 13);
}

static int stub_submit(struct rd_lane *lane, struct rd_op *op)
{
	FZ_CHECK(op->lane == lane && lane != NULL, "op submitted on another lane");
	for (unsigned i = 0; i < op->compute.spec->noperands; i++) {
		FZ_CHECK(op->compute.present[i] == (op->buffers[i] != NULL), "operand %s present %d with buffer %p",
			 op->compute.spec->operands[i].name, op->compute.present[i], (void *)op->buffers[i]);
		if (op->buffers[i]) {
			struct rd_object *o = &op->buffers[i]->obj;
			uint64_t begin, end;
			FZ_CHECK(!o->closing && o->core_refs >= 2, "operand %s names a buffer that is closing or not held",
				 op->compute.spec->operands[i].name);
			FZ_CHECK(rp_operand_extent(&op->compute.operands[i], &begin, &end) == 0 &&
					 end <= op->buffers[i]->size,
				 "operand %s reaches past its buffer", op->compute.spec->operands[i].name);
		}
	}
	if (fz_backend_outcomes && outcome_of(op) == 7) {
		rp_err_backend_error(&op->err, lane->device->index, "the stub backend refuses this call");
		return -EIO;
	}
	op->next = NULL;
	if (pending_tail)
		pending_tail->next = op;
	else
		pending_head = op;
	pending_tail = op;
	fz_backend_stats.ops_pending++;
	fz_backend_stats.ops_submitted++;
	return 0;
}

unsigned fz_backend_complete_all(void)
{
	struct rd_op *op = pending_head;
	unsigned n = 0;

	pending_head = pending_tail = NULL;
	while (op) {
		struct rd_op *next = op->next;
		if (fz_backend_outcomes && outcome_of(op) == 11)
			rp_err_backend_error(&op->err, op->lane->device->index, "the stub backend failed this call");
		op->elapsed_us = 1;
		fz_backend_stats.ops_pending--;
		fz_backend_stats.ops_completed++;
		rd_op_complete(op);
		op = next;
		n++;
	}
	return n;
}

static int stub_lifecycle(struct rd_device *dev, struct rp_error *err)
{
	return 0;
}

static void stub_memory(struct rd_device *dev, uint64_t *used, uint64_t *baseline)
{
	*used = 4096;
	*baseline = 4096;
}

static int stub_inject_fault(struct rd_device *dev, const char *kind, struct rp_error *err)
{
	return -ENOTSUP;
}

const struct rd_backend_ops fz_backend = {
	.name = "stub",
	.open = stub_open,
	.close = stub_close,
	.import_buffer = stub_import_buffer,
	.close_buffer = stub_close_buffer,
	.import_event = stub_import_event,
	.close_event = stub_close_event,
	.lane_create = stub_lane_create,
	.lane_destroy = stub_lane_destroy,
	.submit = stub_submit,
	.release = stub_lifecycle,
	.reset = stub_lifecycle,
	.memory = stub_memory,
	.inject_fault = stub_inject_fault,
};

/* The worker calls done on its loop thread after a backend thread posted
 * the op; here the harness's thread is that loop thread. */
static void post_direct(struct rd_device *dev, struct rd_op *op)
{
	op->done(op);
}

void fz_device_init(struct rd_device *dev)
{
	memset(dev, 0, sizeof(*dev));
	dev->index = 0;
	atomic_init(&dev->generation, 1);
	rd_registry_init(&dev->registry, 0);
	dev->backend = &fz_backend;
	dev->post_completion = post_direct;
	dev->max_scratch = 1u << 20;
}
