/* SPDX-License-Identifier: Apache-2.0 */
/* Imported memory and events.
 *
 * cuda_ipc: a cudaIpcMemHandle_t names one allocation of the exporting
 * process. It is opened once per allocation (the same handle imported again
 * shares the mapping, reference-counted by the buffers on it) and closed when
 * the last buffer goes, or on release. The allocation's extent comes from
 * cuMemGetAddressRange on the mapped base; a buffer past it is refused.
 *
 * cuda_fd: a CUDA VMM allocation exported as a POSIX fd. Imported with
 * cuMemImportFromShareableHandle and mapped (offset + size rounded up to the
 * granularity) into a reserved range with read/write access for this device.
 * The fd is kept so the mapping can be rebuilt after a release or reset.
 *
 * Mappings and buffers are registry resources: release unmaps, invalidate
 * forgets, ensure_valid maps again. */
#include "regen-config.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include "daemon/backend/cuda/common.h"
#include "proto/errors.h"

static const char *cu_error_string(CUresult r)
{
	const char *s = NULL;
	if (cuda_drv.GetErrorString(r, &s) != CUDA_SUCCESS || !s)
		return "unknown CUDA driver error";
	return s;
}

static int status_cu(const char *what, CUresult r)
{
	const char *name = NULL;
	cuda_drv.GetErrorName(r, &name);
	return cuda_status_set(RP_ERR_IMPORT_FAILED, "%s: %s (%s)", what, cu_error_string(r), name ? name : "?");
}

/* ---- Mappings ------------------------------------------------------------ */

static int mapping_init_ipc(struct cuda_mapping *m)
{
	cudaIpcMemHandle_t h;
	memcpy(&h, m->handle, sizeof(h));
	void *p = NULL;
	cudaError_t e = cudaIpcOpenMemHandle(&p, h, cudaIpcMemLazyEnablePeerAccess);
	if (e != cudaSuccess) {
		cudaGetLastError();
		return cuda_status_set(cuda_error_is_sticky(e) ? RP_ERR_DEVICE_LOST : RP_ERR_IMPORT_FAILED,
				       "cudaIpcOpenMemHandle: %s (%s)", cudaGetErrorString(e), cudaGetErrorName(e));
	}
	CUdeviceptr base = 0;
	size_t size = 0;
	CUresult r = cuda_drv.MemGetAddressRange(&base, &size, (CUdeviceptr)(uintptr_t)p);
	if (r != CUDA_SUCCESS) {
		cudaIpcCloseMemHandle(p);
		return status_cu("cuMemGetAddressRange on the imported allocation", r);
	}
	/* The handle names the allocation; the mapping starts at its base. */
	m->base = (CUdeviceptr)(uintptr_t)p;
	m->size = size - (size_t)(m->base - base);
	return 0;
}

static int mapping_init_fd(struct cuda_mapping *m)
{
	int idx = m->cd->dev->index;
	CUmemGenericAllocationHandle alloc = 0;
	CUresult r = cuda_drv.MemImportFromShareableHandle(&alloc, (void *)(uintptr_t)m->fd,
						    CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR);
	if (r != CUDA_SUCCESS)
		return status_cu("cuMemImportFromShareableHandle (is the fd a CUDA VMM export?)", r);
	CUmemAllocationProp prop;
	memset(&prop, 0, sizeof(prop));
	r = cuda_drv.MemGetAllocationPropertiesFromHandle(&prop, alloc);
	size_t gran = 0;
	if (r == CUDA_SUCCESS)
		r = cuda_drv.MemGetAllocationGranularity(&gran, &prop, CU_MEM_ALLOC_GRANULARITY_MINIMUM);
	if (r != CUDA_SUCCESS || gran == 0) {
		cuda_drv.MemRelease(alloc);
		return status_cu("cuMemGetAllocationPropertiesFromHandle/granularity", r);
	}
	if (prop.location.type != CU_MEM_LOCATION_TYPE_DEVICE || prop.location.id != idx) {
		cuda_drv.MemRelease(alloc);
		return cuda_status_set(RP_ERR_IMPORT_FAILED, "the fd's allocation lives on device %d, this worker serves %d",
				       prop.location.id, idx);
	}
	size_t size = (size_t)((m->want + gran - 1) / gran * gran);
	CUdeviceptr base = 0;
	r = cuda_drv.MemAddressReserve(&base, size, gran, 0, 0);
	if (r != CUDA_SUCCESS) {
		cuda_drv.MemRelease(alloc);
		return status_cu("cuMemAddressReserve", r);
	}
	/* Fails when offset + size lies past the allocation. */
	r = cuda_drv.MemMap(base, size, 0, alloc, 0);
	if (r != CUDA_SUCCESS) {
		cuda_drv.MemAddressFree(base, size);
		cuda_drv.MemRelease(alloc);
		char what[128];
		snprintf(what, sizeof(what), "cuMemMap of %zu bytes (offset + size past the allocation?)", size);
		return status_cu(what, r);
	}
	CUmemAccessDesc access;
	memset(&access, 0, sizeof(access));
	access.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
	access.location.id = idx;
	access.flags = CU_MEM_ACCESS_FLAGS_PROT_READWRITE;
	r = cuda_drv.MemSetAccess(base, size, &access, 1);
	if (r != CUDA_SUCCESS) {
		cuda_drv.MemUnmap(base, size);
		cuda_drv.MemAddressFree(base, size);
		cuda_drv.MemRelease(alloc);
		return status_cu("cuMemSetAccess", r);
	}
	m->alloc = alloc;
	m->base = base;
	m->size = size;
	return 0;
}

static int mapping_init(struct rd_resource *res)
{
	struct cuda_mapping *m = (struct cuda_mapping *)res;
	cudaError_t e = cudaSetDevice(m->cd->dev->index);
	if (e != cudaSuccess)
		return cuda_status_set(cuda_error_name(e), "cudaSetDevice: %s", cudaGetErrorString(e));
	return m->kind == RD_BUFFER_CUDA_FD ? mapping_init_fd(m) : mapping_init_ipc(m);
}

static void mapping_release(struct rd_resource *res)
{
	struct cuda_mapping *m = (struct cuda_mapping *)res;
	cudaSetDevice(m->cd->dev->index);
	if (m->kind == RD_BUFFER_CUDA_FD) {
		cuda_drv.MemUnmap(m->base, m->size);
		cuda_drv.MemAddressFree(m->base, m->size);
		cuda_drv.MemRelease(m->alloc);
		m->alloc = 0;
	} else {
		cudaIpcCloseMemHandle((void *)(uintptr_t)m->base);
	}
	m->base = 0;
	m->size = 0;
}

static void mapping_invalidate(struct rd_resource *res)
{
	struct cuda_mapping *m = (struct cuda_mapping *)res;
	m->base = 0;
	m->size = 0;
	m->alloc = 0;
}

static const struct rd_resource_ops mapping_ops = {
	.kind = "cuda_import_mapping", .init = mapping_init, .release = mapping_release, .invalidate = mapping_invalidate,
};

void cuda_ipc_init(struct cuda_dev *cd)
{
	pthread_mutex_init(&cd->maps_lock, NULL);
	cd->maps = NULL;
	cd->map_count = 0;
}

uint64_t cuda_ipc_mapped_bytes(struct cuda_dev *cd)
{
	uint64_t sum = 0;
	pthread_mutex_lock(&cd->maps_lock);
	for (struct cuda_mapping *m = cd->maps; m; m = m->next) {
		if (rd_resource_is_valid(&m->res))
			sum += m->size;
	}
	pthread_mutex_unlock(&cd->maps_lock);
	return sum;
}

unsigned rd_cuda_mapping_count(struct rd_device *dev)
{
	struct cuda_dev *cd = cuda_dev_of(dev);
	pthread_mutex_lock(&cd->maps_lock);
	unsigned n = cd->map_count;
	pthread_mutex_unlock(&cd->maps_lock);
	return n;
}

/* A new reference to the mapping for `req` (found or made, registered, not
 * necessarily valid yet). */
static struct cuda_mapping *mapping_get(struct cuda_dev *cd, const struct rd_import *req)
{
	pthread_mutex_lock(&cd->maps_lock);
	struct cuda_mapping *m = NULL;
	if (req->kind == RD_BUFFER_CUDA_IPC) {
		for (m = cd->maps; m; m = m->next) {
			if (m->kind == RD_BUFFER_CUDA_IPC && memcmp(m->handle, req->handle, sizeof(m->handle)) == 0)
				break;
		}
	}
	if (m) {
		m->refs++;
	} else if ((m = calloc(1, sizeof(*m)))) {
		m->cd = cd;
		m->kind = req->kind;
		m->fd = -1;
		if (req->kind == RD_BUFFER_CUDA_IPC) {
			memcpy(m->handle, req->handle, sizeof(m->handle));
		} else {
			m->fd = req->fd;
			m->want = req->offset + req->size;
		}
		m->refs = 1;
		rd_resource_register(&cd->dev->registry, &m->res, &mapping_ops);
		m->next = cd->maps;
		cd->maps = m;
		cd->map_count++;
	}
	pthread_mutex_unlock(&cd->maps_lock);
	return m;
}

/* Drops a reference; the last one unmaps and frees. keep_fd: the import
 * failed, so the caller still owns the fd. */
static void mapping_put(struct cuda_mapping *m, bool keep_fd)
{
	struct cuda_dev *cd = m->cd;
	pthread_mutex_lock(&cd->maps_lock);
	bool last = --m->refs == 0;
	if (last) {
		for (struct cuda_mapping **pp = &cd->maps; *pp; pp = &(*pp)->next) {
			if (*pp == m) {
				*pp = m->next;
				break;
			}
		}
		cd->map_count--;
	}
	pthread_mutex_unlock(&cd->maps_lock);
	if (!last)
		return;
	rd_resource_unregister(&m->res);
	if (m->fd >= 0 && !keep_fd)
		close(m->fd);
	free(m);
}

/* ---- Buffers --------------------------------------------------------------- */

static int buffer_init(struct rd_resource *res)
{
	struct cuda_buffer *b = (struct cuda_buffer *)res;
	if (!b->map) {
		b->base.ptr = b->local;
		return 0;
	}
	if (rd_resource_ensure_valid(&b->map->res))
		return -EIO;   /* the mapping's init left its status */
	b->base.ptr = (void *)(uintptr_t)(b->map->base + b->offset);
	return 0;
}

static void buffer_release(struct rd_resource *res)
{
	((struct cuda_buffer *)res)->base.ptr = NULL;
}

static const struct rd_resource_ops buffer_ops = {
	.kind = "cuda_buffer", .init = buffer_init, .release = buffer_release, .invalidate = buffer_release,
};

static struct cuda_buffer *buffer_new(struct cuda_dev *cd, enum rd_buffer_kind kind, uint64_t size)
{
	struct cuda_buffer *b = calloc(1, sizeof(*b));
	if (!b)
		return NULL;
	b->cd = cd;
	b->base.device = cd->dev;
	b->base.kind = kind;
	b->base.size = size;
	return b;
}

/* Kept memory's size counts against its uid, so it must be the size the
 * rank says. The driver gives no allocation's size from a handle; but a
 * mapping longer than the allocation fails, and allocations come in
 * granules: `size` maps and `size` plus one granule does not. */
int cuda_check_export(struct rd_device *dev, int fd, uint64_t size, struct rp_error *err)
{
	struct cuda_dev *cd = cuda_dev_of(dev);
	CUmemGenericAllocationHandle alloc = 0;
	CUmemAllocationProp prop;
	CUdeviceptr base = 0;
	size_t gran = 0;
	CUresult r;
	int ret = -EINVAL;

	if (cuda_refuse_if_lost(cd, err))
		return -EIO;
	if (cuda_bind(cd, err))
		return -EIO;
	r = cuda_drv.MemImportFromShareableHandle(&alloc, (void *)(uintptr_t)fd, CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR);
	if (r != CUDA_SUCCESS) {
		rp_err_import_failed(err, "cuda_fd", "cuMemImportFromShareableHandle: %s (is the fd a CUDA VMM export?)",
				     cu_error_string(r));
		return -EINVAL;
	}
	memset(&prop, 0, sizeof(prop));
	r = cuda_drv.MemGetAllocationPropertiesFromHandle(&prop, alloc);
	if (r == CUDA_SUCCESS)
		r = cuda_drv.MemGetAllocationGranularity(&gran, &prop, CU_MEM_ALLOC_GRANULARITY_MINIMUM);
	if (r != CUDA_SUCCESS || gran == 0) {
		rp_err_import_failed(err, "cuda_fd", "reading the allocation's properties: %s", cu_error_string(r));
		goto out_release;
	}
	if (prop.location.type != CU_MEM_LOCATION_TYPE_DEVICE || prop.location.id != dev->index) {
		rp_err_import_failed(err, "cuda_fd", "the allocation lives on device %d, not on device %d",
				     prop.location.id, dev->index);
		goto out_release;
	}
	if (size % gran != 0) {
		rp_err_import_failed(err, "cuda_fd", "%llu bytes is not a whole number of granules (%zu bytes): an "
				     "allocation's size is", (unsigned long long)size, gran);
		goto out_release;
	}
	r = cuda_drv.MemAddressReserve(&base, size + gran, gran, 0, 0);
	if (r != CUDA_SUCCESS) {
		rp_err_import_failed(err, "cuda_fd", "cuMemAddressReserve of %llu bytes: %s",
				     (unsigned long long)(size + gran), cu_error_string(r));
		goto out_release;
	}
	r = cuda_drv.MemMap(base, size, 0, alloc, 0);
	if (r != CUDA_SUCCESS) {
		rp_err_import_failed(err, "cuda_fd", "the allocation is smaller than %llu bytes (cuMemMap: %s)",
				     (unsigned long long)size, cu_error_string(r));
		goto out_free;
	}
	cuda_drv.MemUnmap(base, size);
	r = cuda_drv.MemMap(base, size + gran, 0, alloc, 0);
	if (r == CUDA_SUCCESS) {
		cuda_drv.MemUnmap(base, size + gran);
		rp_err_import_failed(err, "cuda_fd", "the allocation is larger than %llu bytes: keep it whole, with "
				     "its size", (unsigned long long)size);
		goto out_free;
	}
	ret = 0;
out_free:
	cuda_drv.MemAddressFree(base, size + gran);
out_release:
	cuda_drv.MemRelease(alloc);
	return ret;
}

int cuda_import_buffer(struct rd_device *dev, struct rd_import *req, struct rd_buffer **out, struct rp_error *err)
{
	struct cuda_dev *cd = cuda_dev_of(dev);
	if (req->kind != RD_BUFFER_CUDA_IPC && req->kind != RD_BUFFER_CUDA_FD) {
		rp_error_set(err, RP_ERR_IMPORT_FAILED, "the CUDA backend imports cuda_ipc and cuda_fd buffers only");
		return -EINVAL;
	}
	if (req->size == 0 || req->offset > UINT64_MAX - req->size) {
		rp_error_set(err, RP_ERR_IMPORT_FAILED, "offset %llu + size %llu is not a valid range",
			     (unsigned long long)req->offset, (unsigned long long)req->size);
		return -EINVAL;
	}
	if (req->kind == RD_BUFFER_CUDA_FD && req->fd < 0) {
		rp_error_set(err, RP_ERR_IMPORT_FAILED, "cuda_fd import without a file descriptor");
		return -EINVAL;
	}
	if (cuda_refuse_if_lost(cd, err))
		return -EIO;
	uint64_t resets = atomic_load(&cd->resets);
	if (cuda_bind(cd, err))
		return cuda_check_failure(cd, err, resets);

	struct cuda_mapping *m = mapping_get(cd, req);
	if (!m) {
		rp_error_set(err, RP_ERR_OUT_OF_MEMORY, "no memory for a mapping");
		return -ENOMEM;
	}
	if (rd_resource_ensure_valid(&m->res)) {
		cuda_status_to_error(err, req->kind == RD_BUFFER_CUDA_IPC ? "importing the cudaIpcMemHandle_t"
									   : "importing the CUDA VMM fd");
		mapping_put(m, true);
		/* A sticky error here is the device's, not the handle's: it
		 * starts the recovery as a call's would. */
		return cuda_check_failure(cd, err, resets);
	}
	if (req->offset + req->size > m->size) {
		rp_error_set(err, RP_ERR_IMPORT_FAILED,
			     "offset %llu + size %llu lies past the end of the imported allocation (%zu bytes)",
			     (unsigned long long)req->offset, (unsigned long long)req->size, m->size);
		mapping_put(m, true);
		return -EINVAL;
	}
	struct cuda_buffer *b = buffer_new(cd, req->kind, req->size);
	if (!b) {
		mapping_put(m, true);
		rp_error_set(err, RP_ERR_OUT_OF_MEMORY, "no memory for a buffer");
		return -ENOMEM;
	}
	b->map = m;
	b->offset = req->offset;
	rd_resource_register(&dev->registry, &b->base.res, &buffer_ops);
	if (rd_resource_ensure_valid(&b->base.res)) {
		cuda_status_to_error(err, "mapping the buffer");
		rd_resource_unregister(&b->base.res);
		free(b);
		mapping_put(m, true);
		return cuda_check_failure(cd, err, resets);
	}
	*out = &b->base;
	return 0;
}

int rd_cuda_buffer_wrap_local(struct rd_device *dev, void *devptr, uint64_t size, struct rd_buffer **out)
{
	struct cuda_dev *cd = cuda_dev_of(dev);
	struct cuda_buffer *b = buffer_new(cd, RD_BUFFER_LOCAL, size);
	if (!b)
		return -ENOMEM;
	b->local = devptr;
	rd_resource_register(&dev->registry, &b->base.res, &buffer_ops);
	rd_resource_ensure_valid(&b->base.res);
	*out = &b->base;
	return 0;
}

void cuda_close_buffer(struct rd_buffer *buf)
{
	if (!buf)
		return;
	struct cuda_buffer *b = (struct cuda_buffer *)buf;
	rd_resource_unregister(&b->base.res);
	if (b->map)
		mapping_put(b->map, false);
	free(b);
}

/* ---- Events ---------------------------------------------------------------- */

static int event_init(struct rd_resource *res)
{
	struct cuda_event *ev = (struct cuda_event *)res;
	cudaError_t e = cudaSetDevice(ev->cd->dev->index);
	if (e == cudaSuccess)
		e = cudaIpcOpenEventHandle(&ev->ev, ev->handle);
	if (e != cudaSuccess) {
		cudaGetLastError();
		return cuda_status_set(cuda_error_is_sticky(e) ? RP_ERR_DEVICE_LOST : RP_ERR_IMPORT_FAILED,
				       "cudaIpcOpenEventHandle: %s (%s)", cudaGetErrorString(e), cudaGetErrorName(e));
	}
	return 0;
}

static void event_release(struct rd_resource *res)
{
	struct cuda_event *ev = (struct cuda_event *)res;
	cudaSetDevice(ev->cd->dev->index);
	cudaEventDestroy(ev->ev);
	ev->ev = NULL;
}

static void event_invalidate(struct rd_resource *res)
{
	((struct cuda_event *)res)->ev = NULL;
}

static const struct rd_resource_ops event_ops = {
	.kind = "cuda_ipc_event", .init = event_init, .release = event_release, .invalidate = event_invalidate,
};

int cuda_import_event(struct rd_device *dev, const unsigned char handle[64], struct rd_event **out, struct rp_error *err)
{
	struct cuda_dev *cd = cuda_dev_of(dev);
	if (cuda_refuse_if_lost(cd, err))
		return -EIO;
	uint64_t resets = atomic_load(&cd->resets);
	if (cuda_bind(cd, err))
		return cuda_check_failure(cd, err, resets);
	struct cuda_event *ev = calloc(1, sizeof(*ev));
	if (!ev) {
		rp_error_set(err, RP_ERR_OUT_OF_MEMORY, "no memory for an event");
		return -ENOMEM;
	}
	ev->cd = cd;
	ev->base.device = dev;
	memcpy(&ev->handle, handle, sizeof(ev->handle));
	rd_resource_register(&dev->registry, &ev->base.res, &event_ops);
	if (rd_resource_ensure_valid(&ev->base.res)) {
		cuda_status_to_error(err, "importing the cudaIpcEventHandle_t");
		rd_resource_unregister(&ev->base.res);
		free(ev);
		return cuda_check_failure(cd, err, resets);
	}
	*out = &ev->base;
	return 0;
}

bool cuda_event_done(struct rd_event *event)
{
	struct cuda_event *ev = (struct cuda_event *)event;

	if (!ev->ev)
		return true;    /* invalidated: no stream waits on it any more */
	cudaSetDevice(ev->cd->dev->index);
	cudaError_t e = cudaEventQuery(ev->ev);
	if (e != cudaSuccess && e != cudaErrorNotReady && !cuda_error_is_sticky(e))
		cudaGetLastError();
	return e == cudaSuccess;
}

void cuda_close_event(struct rd_event *event)
{
	if (!event)
		return;
	rd_resource_unregister(&event->res);
	free(event);
}
