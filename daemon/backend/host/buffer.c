/* SPDX-License-Identifier: Apache-2.0 */
/* Host buffers: client memfds (or regular files) mapped into the worker. A
 * buffer owns its fd, so a release unmaps it for good; its id is stale
 * afterwards. */
#include <errno.h>
#include <fcntl.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>
#include "daemon/backend/host/common.h"
#include "proto/errors.h"

struct host_buffer {
	struct rd_buffer base;
	void *map;
	size_t map_len;
	size_t map_delta;              /* offset of the buffer inside the mapping */
	int fd;
	uint64_t offset;
};

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

int host_import_buffer(struct rd_device *dev, struct rd_import *req, struct rd_buffer **out, struct rp_error *err)
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
		rp_err_import_failed(err, "host_fd", "the fd passed is not a memfd");
		return -EINVAL;
	}
	/* A file that can shrink could take the memory from under a call. */
	int seals = fcntl(req->fd, F_GET_SEALS);
	if (seals < 0 || !(seals & F_SEAL_SHRINK)) {
		rp_err_import_failed(err, "host_fd",
				     "the fd can be shrunk, which would take its memory from under a call: pass a memfd "
				     "made with MFD_ALLOW_SEALING and sealed with fcntl(fd, F_ADD_SEALS, F_SEAL_SHRINK) "
				     "(libregen and the Python client seal for you)");
		return -EPERM;
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

void host_close_buffer(struct rd_buffer *buf)
{
	rd_resource_unregister(&buf->res);
	free(buf);
}
