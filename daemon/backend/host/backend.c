/* The host backend: buffers are client memfds mapped into the worker, compute
 * is the reference math in math.c on one thread per lane. It is the
 * default without a GPU, so that the whole control plane, lifecycle and
 * bad-input behaviour run and are tested anywhere; it proves nothing about
 * a GPU. Its "context" can be lost by fault injection, so reset runs for real. */
#include <errno.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>
#include "daemon/backend/backend.h"
#include "daemon/backend/host/math.h"
#include "proto/errors.h"

struct host_device {
	struct rd_resource context;    /* the simulated context: lost by fault injection */
	atomic_bool lost;
	atomic_bool hang;
	atomic_uint_fast64_t mapped_bytes;
	atomic_uint_fast64_t scratch_bytes;
	uint64_t baseline;
};

struct host_buffer {
	struct rd_buffer base;
	void *map;
	size_t map_len;
	size_t map_delta;              /* offset of the buffer inside the mapping */
	int fd;
	uint64_t offset;
};

struct host_lane {
	struct rd_lane base;
	pthread_t thread;
	pthread_mutex_t lock;
	pthread_cond_t cond;
	struct rd_op *head, *tail;
	bool stop;
	void *scratch;                 /* grows to the largest call's need */
	size_t scratch_size;
};

static struct host_device *hd(struct rd_device *dev)
{
	return dev->backend_data;
}

static uint64_t now_us(void)
{
	struct timespec ts;
	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (uint64_t)ts.tv_sec * 1000000u + (uint64_t)ts.tv_nsec / 1000u;
}

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

/* ---- Buffers ---- */

static int buffer_init(struct rd_resource *res)
{
	struct host_buffer *b = (struct host_buffer *)res;
	long page = sysconf(_SC_PAGESIZE);
	uint64_t start = b->offset & ~(uint64_t)(page - 1);

	if (b->fd < 0)
		return -EBADF;   /* released buffers are never rebuilt: their ids are stale */
	b->map_delta = (size_t)(b->offset - start);
	b->map_len = (size_t)(b->base.size + b->map_delta);
	b->map = mmap(NULL, b->map_len, PROT_READ | PROT_WRITE, MAP_SHARED, b->fd, (off_t)start);
	if (b->map == MAP_FAILED) {
		b->map = NULL;
		return -errno;
	}
	b->base.ptr = (char *)b->map + b->map_delta;
	atomic_fetch_add(&hd(b->base.device)->mapped_bytes, b->map_len);
	return 0;
}

static void buffer_release(struct rd_resource *res)
{
	struct host_buffer *b = (struct host_buffer *)res;

	if (b->map) {
		munmap(b->map, b->map_len);
		atomic_fetch_sub(&hd(b->base.device)->mapped_bytes, b->map_len);
	}
	b->map = NULL;
	b->base.ptr = NULL;
	if (b->fd >= 0)
		close(b->fd);
	b->fd = -1;
}

static const struct rd_resource_ops buffer_ops = {
	.kind = "host_mapping", .init = buffer_init, .release = buffer_release,
	/* Host mappings outlive any context: forgetting them is unmapping them. */
	.invalidate = buffer_release,
};

static int host_import_buffer(struct rd_device *dev, struct rd_import *req, struct rd_buffer **out, struct rp_error *err)
{
	struct host_buffer *b;
	struct stat st;
	uint64_t end;
	int r;

	if (req->kind != RD_BUFFER_HOST_FD) {
		rp_error_set(err, RP_ERR_IMPORT_FAILED, "the host backend imports host_fd buffers only, not %s",
			     req->kind == RD_BUFFER_CUDA_IPC ? "cuda_ipc" : "cuda_fd");
		rp_error_add_str(err, "kind", req->kind == RD_BUFFER_CUDA_IPC ? "cuda_ipc" : "cuda_fd");
		return -ENOTSUP;
	}
	if (fstat(req->fd, &st) < 0 || !S_ISREG(st.st_mode)) {
		rp_error_set(err, RP_ERR_IMPORT_FAILED, "the fd passed is not a memfd or regular file");
		rp_error_add_str(err, "kind", "host_fd");
		return -EINVAL;
	}
	if (__builtin_add_overflow(req->offset, req->size, &end) || end > (uint64_t)st.st_size) {
		rp_error_set(err, RP_ERR_IMPORT_FAILED, "offset %llu + size %llu is past the end of the file (%lld bytes)",
			     (unsigned long long)req->offset, (unsigned long long)req->size, (long long)st.st_size);
		rp_error_add_str(err, "kind", "host_fd");
		return -EINVAL;
	}
	b = calloc(1, sizeof(*b));
	if (!b)
		return -ENOMEM;
	b->fd = req->fd;
	b->offset = req->offset;
	b->base.size = req->size;
	b->base.device = dev;
	rd_resource_register(&dev->registry, &b->base.res, &buffer_ops);
	r = rd_resource_ensure_valid(&b->base.res);
	if (r < 0) {
		b->fd = -1;   /* the caller still owns it on failure */
		rd_resource_unregister(&b->base.res);
		free(b);
		rp_error_set(err, RP_ERR_IMPORT_FAILED, "mmap failed: %s", strerror(-r));
		rp_error_add_str(err, "kind", "host_fd");
		return r;
	}
	*out = &b->base;
	return 0;
}

static void host_close_buffer(struct rd_buffer *buf)
{
	rd_resource_unregister(&buf->res);
	free(buf);
}

/* ---- Lanes ---- */

static int run_op(struct host_lane *lane, struct rd_op *op)
{
	const struct rp_compute *c = &op->compute;
	void *ptr[RP_OP_OPERANDS_MAX] = { 0 };
	size_t need = rd_host_scratch_size(c);

	for (unsigned i = 0; i < c->spec->noperands; i++)
		if (op->buffers[i])
			ptr[i] = (char *)op->buffers[i]->ptr + c->operands[i].offset;
	if (need > lane->scratch_size) {
		void *s = realloc(lane->scratch, need);
		if (!s)
			return -ENOMEM;
		atomic_fetch_add(&hd(lane->base.device)->scratch_bytes, need - lane->scratch_size);
		lane->scratch = s;
		lane->scratch_size = need;
	}
	return rd_host_run(c, ptr, lane->scratch, lane->scratch_size);
}

static void *lane_thread(void *arg)
{
	struct host_lane *lane = arg;
	struct rd_device *dev = lane->base.device;

	for (;;) {
		struct rd_op *op;

		pthread_mutex_lock(&lane->lock);
		while (!lane->head && !lane->stop)
			pthread_cond_wait(&lane->cond, &lane->lock);
		op = lane->head;
		if (!op) {
			pthread_mutex_unlock(&lane->lock);
			break;
		}
		lane->head = op->next;
		if (!lane->head)
			lane->tail = NULL;
		pthread_mutex_unlock(&lane->lock);

		/* A hung kernel: nothing but the process's death ends it. */
		while (atomic_load(&hd(dev)->hang))
			sleep(1);
		uint64_t t0 = now_us();
		if (atomic_load(&hd(dev)->lost)) {
			rp_error_set(&op->err, RP_ERR_DEVICE_LOST, "device %d lost its context before the call ran",
				     dev->index);
			rp_error_add_int(&op->err, "device", dev->index);
			rp_error_add_int(&op->err, "generation", (long long)atomic_load(&dev->generation));
		} else {
			int r = run_op(lane, op);
			if (r < 0) {
				rp_error_set(&op->err, r == -ENOMEM ? RP_ERR_OUT_OF_MEMORY : RP_ERR_BACKEND,
					     "host compute failed: %s", strerror(-r));
				rp_error_add_int(&op->err, "device", dev->index);
			}
		}
		op->elapsed_us = now_us() - t0;
		rd_op_complete(op);
	}
	return NULL;
}

static int lane_init(struct rd_resource *res)
{
	struct host_lane *lane = (struct host_lane *)res;

	lane->stop = false;
	return -pthread_create(&lane->thread, NULL, lane_thread, lane);
}

/* Called with no op queued (the core drains first). */
static void lane_release(struct rd_resource *res)
{
	struct host_lane *lane = (struct host_lane *)res;

	pthread_mutex_lock(&lane->lock);
	lane->stop = true;
	pthread_cond_signal(&lane->cond);
	pthread_mutex_unlock(&lane->lock);
	pthread_join(lane->thread, NULL);
	if (lane->scratch_size)
		atomic_fetch_sub(&hd(lane->base.device)->scratch_bytes, lane->scratch_size);
	free(lane->scratch);
	lane->scratch = NULL;
	lane->scratch_size = 0;
}

static const struct rd_resource_ops lane_ops = {
	.kind = "host_lane", .init = lane_init, .release = lane_release, .invalidate = lane_release,
};

static struct rd_lane *host_lane_create(struct rd_device *dev, unsigned index, struct rp_error *err)
{
	struct host_lane *lane = calloc(1, sizeof(*lane));

	if (!lane) {
		rp_error_set(err, RP_ERR_OUT_OF_MEMORY, "no memory for a lane");
		return NULL;
	}
	lane->base.device = dev;
	lane->base.index = index;
	pthread_mutex_init(&lane->lock, NULL);
	pthread_cond_init(&lane->cond, NULL);
	rd_resource_register(&dev->registry, &lane->base.res, &lane_ops);
	return &lane->base;
}

static void host_lane_destroy(struct rd_lane *base)
{
	struct host_lane *lane = (struct host_lane *)base;

	rd_resource_unregister(&base->res);
	pthread_mutex_destroy(&lane->lock);
	pthread_cond_destroy(&lane->cond);
	free(lane);
}

static int host_submit(struct rd_lane *base, struct rd_op *op)
{
	struct host_lane *lane = (struct host_lane *)base;
	int r = rd_resource_ensure_valid(&base->res);

	if (r < 0) {
		rp_error_set(&op->err, RP_ERR_BACKEND, "cannot start the lane: %s", strerror(-r));
		return r;
	}
	op->next = NULL;
	pthread_mutex_lock(&lane->lock);
	if (lane->tail)
		lane->tail->next = op;
	else
		lane->head = op;
	lane->tail = op;
	pthread_cond_signal(&lane->cond);
	pthread_mutex_unlock(&lane->lock);
	return 0;
}

/* ---- Device and lifecycle ---- */

static void host_memory(struct rd_device *dev, uint64_t *used, uint64_t *baseline)
{
	*used = atomic_load(&hd(dev)->mapped_bytes) + atomic_load(&hd(dev)->scratch_bytes);
	*baseline = hd(dev)->baseline;
}

static int host_open(struct rd_device *dev, struct rp_error *err)
{
	struct host_device *h = calloc(1, sizeof(*h));

	if (!h) {
		rp_error_set(err, RP_ERR_OUT_OF_MEMORY, "no memory for the device");
		return -ENOMEM;
	}
	dev->backend_data = h;
	rd_resource_register(&dev->registry, &h->context, &context_ops);
	rd_resource_ensure_valid(&h->context);
	h->baseline = 0;
	return 0;
}

static void host_close(struct rd_device *dev)
{
	rd_registry_release(&dev->registry);
}

static int host_release(struct rd_device *dev, struct rp_error *err)
{
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
	atomic_store(&hd(dev)->lost, false);
	if (rd_resource_ensure_valid(&hd(dev)->context) < 0 || canary() < 0) {
		rp_error_set(err, RP_ERR_DEVICE_LOST, "canary failed after reset");
		return -EIO;
	}
	return 0;
}

static int host_inject_fault(struct rd_device *dev, const char *kind, struct rp_error *err)
{
	if (strcmp(kind, "device_lost") == 0) {
		atomic_store(&hd(dev)->lost, true);
		if (dev->on_fault)
			dev->on_fault(dev, "injected device_lost");
		return 0;
	}
	if (strcmp(kind, "hang") == 0) {
		atomic_store(&hd(dev)->hang, true);
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
	.memory = host_memory,
	.inject_fault = host_inject_fault,
};
