/* SPDX-License-Identifier: Apache-2.0 */
/* The host backend: buffers are client memfds mapped into the worker, compute
 * is the reference math in math.c on one thread per lane. It is the
 * default without a GPU, so that the whole control plane, lifecycle and
 * bad-input behaviour run and are tested anywhere; it proves nothing about
 * a GPU. Its "context" can be lost by fault injection, so reset runs for real.
 *
 * This file: the ops table, the simulated context and the lifecycle hooks.
 * Buffers live in buffer.c, lanes in lane.c, communicators in comm.c,
 * programs in program.c (their nodes' math in program_nodes.c), the
 * health watch in health.c. */
#include <errno.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include "daemon/backend/host/comm_group.h"
#include "daemon/backend/host/common.h"
#include "daemon/backend/host/guard.h"
#include "daemon/backend/host/math.h"
#include "daemon/env.h"
#include "daemon/options.h"
#include "proto/errors.h"

/* ---- The simulated context ---- */

static int context_init(struct rd_resource *res)
{
	return 0;
}

static void context_release(struct rd_resource *res)
{
}

static const struct rd_resource_ops context_ops = {
	.kind = "host_context", .init = context_init, .release = context_release, .invalidate = context_release,
};

/* ---- Device and lifecycle ---- */

static void host_memory(struct rd_device *dev, uint64_t *used, uint64_t *baseline)
{
	*used = atomic_load(&hd(dev)->mapped_bytes) + atomic_load(&hd(dev)->scratch_bytes);
	*baseline = 0;   /* open holds nothing: every byte comes from an import or a call */
}

/* REGEN_HOST_OPEN_HANG_FILE (a test knob): device N's open waits while
 * the file named by it with ".N" appended exists, as a driver's init that
 * does not answer would: what worker_start_timeout_ms is for. */
static void wait_while_told_to_hang(const struct rd_device *dev)
{
	const char *base = rd_env(RD_ENV_HOST_OPEN_HANG_FILE);
	char path[4096];

	if (!base || snprintf(path, sizeof(path), "%s.%d", base, dev->index) >= (int)sizeof(path))
		return;
	while (access(path, F_OK) == 0)
		usleep(10000);
}

static int host_open(struct rd_device *dev, struct rp_error *err)
{
	struct host_device *h;
	int r;

	wait_while_told_to_hang(dev);
	r = rd_host_guard_install();

	if (r < 0) {
		rp_error_set(err, RP_ERR_BACKEND, "cannot install the SIGBUS guard: %s", strerror(-r));
		return -EIO;
	}
	/* Communicators' groups are shared with the other devices' workers
	 * through regend's socket directory; without regend's options (a
	 * test driving the backend) they stay in this process. */
	char why[256];
	r = host_groups_open(dev->options ? dev->options->socket_path : NULL, why, sizeof(why));
	if (r < 0) {
		rp_error_set(err, RP_ERR_BACKEND, "communicators: %s", why);
		return -EIO;
	}
	h = calloc(1, sizeof(*h));
	if (!h) {
		host_groups_close();
		rp_error_set(err, RP_ERR_OUT_OF_MEMORY, "no memory for the device");
		return -ENOMEM;
	}
	dev->backend_data = h;
	host_lane_calibrate(dev);
	rd_share_init(&h->share, h->cpus, HOST_SHARE_LINGER_NS, 0);
	host_health_init(dev);
	rd_resource_register(&dev->registry, &h->context, &context_ops);
	rd_resource_ensure_valid(&h->context);
	return 0;
}

static void host_close(struct rd_device *dev)
{
	host_health_finish(dev);
	rd_registry_release(&dev->registry);
	host_comm_quiesce();
	host_groups_close();
}

static int host_release(struct rd_device *dev, struct rp_error *err)
{
	host_comm_quiesce();
	return rd_resource_ensure_valid(&hd(dev)->context);
}

/* The canary: a small GEMM with a known answer on the "new context". */
static int canary(void)
{
	float a[4] = { 1, 2, 3, 4 }, b[4] = { 5, 6, 7, 8 }, d[4] = { 0 };
	const struct rp_operand m2 = { .dtype = RP_DTYPE_F32, .rank = 2, .shape = { 2, 2 }, .strides = { 2, 1 } };
	struct rp_compute c = {
		.spec = &rp_op_gemm,
		.operands = { [RP_GEMM_A] = m2, [RP_GEMM_B] = m2, [RP_GEMM_D] = m2 },
		.present = { [RP_GEMM_A] = true, [RP_GEMM_B] = true, [RP_GEMM_D] = true },
		.gemm = { .alpha = 1, .m = 2, .n = 2, .k = 2 },
	};
	void *ptr[RP_OP_OPERANDS_MAX] = { [RP_GEMM_A] = a, [RP_GEMM_B] = b, [RP_GEMM_D] = d };

	if (rd_host_run(&c, ptr, NULL, 0) < 0)
		return -EIO;
	return d[0] == 19 && d[1] == 22 && d[2] == 43 && d[3] == 50 ? 0 : -EIO;
}

static int host_reset(struct rd_device *dev, struct rp_error *err)
{
	host_comm_quiesce();
	atomic_store(&hd(dev)->lost, false);
	atomic_store(&hd(dev)->lost_reported, false);
	if (rd_resource_ensure_valid(&hd(dev)->context) < 0 || canary() < 0) {
		rp_error_set(err, RP_ERR_DEVICE_LOST, "canary failed after reset");
		return -EIO;
	}
	return 0;
}

static int host_inject_fault(struct rd_device *dev, const char *kind, struct rp_error *err)
{
	unsigned xid;
	int end = 0;

	/* Found as a GPU's would be: by the health watch without a call, or
	 * by the next call. */
	if (strcmp(kind, "device_lost") == 0) {
		atomic_store(&hd(dev)->lost, true);
		return 0;
	}
	if (strcmp(kind, "hang") == 0) {
		atomic_store(&hd(dev)->hang, true);
		return 0;
	}
	if (sscanf(kind, "xid:%u%n", &xid, &end) == 1 && kind[end] == '\0' && xid > 0) {
		atomic_store(&hd(dev)->pending_xid, xid);
		return 0;
	}
	rp_error_set(err, RP_ERR_BACKEND, "unknown fault kind '%s'", kind);
	return -EINVAL;
}

const struct rd_backend_ops rd_backend_host = {
	.name = "host",
	.open = host_open,
	.close = host_close,
	.import_buffer = host_import_buffer,
	.close_buffer = host_close_buffer,
	.lane_create = host_lane_create,
	.lane_destroy = host_lane_destroy,
	.submit = host_submit,
	.release = host_release,
	.reset = host_reset,
	.comm_unique_id = host_comm_unique_id,
	.comm_create = host_comm_create,
	.comm_abort = host_comm_abort,
	.comm_status = host_comm_status,
	.comm_close = host_comm_close,
	.program_create = host_program_create,
	.program_destroy = host_program_destroy,
	.memory = host_memory,
	.inject_fault = host_inject_fault,
	.health_start = host_health_start,
	.health_stop = host_health_stop,
	.health = host_health_info,
};
