/* SPDX-License-Identifier: Apache-2.0 */
/* libregen: a memory pool that regend maps once per chunk.
 *
 * Chunks are CUDA VMM allocations (cuMemCreate) exportable as POSIX file
 * descriptors, or, for the host backend, memfds. Allocations are carved out
 * of chunks (first fit, coalesced on free); a request larger than half a
 * chunk gets a chunk of its own. regend sees a chunk, never an allocation:
 * regen_pool_lookup imports the chunk once per generation (cuda_fd or
 * host_fd) on the pool's own connection and answers with the buffer id and
 * the pointer's offset in it, so a tensor in the pool costs no import at
 * all. A CUDA chunk whose last allocation is freed is closed in regend and
 * given back to the driver at once: torch's caching allocator, which sits
 * on top through a MemPool, already caches, and frees only what it means to
 * give back (one empty host chunk is kept: see keep_empty).
 *
 * regen_pool_alloc and regen_pool_free have the signatures of torch's
 * CUDAPluggableAllocator, so a torch.cuda.MemPool can allocate through them.
 *
 * As the process's whole CUDA allocator (regen_pool_set_process_allocator:
 * torch's current allocator, with no caching allocator above) the pool does
 * what that one would: it keeps empty CUDA chunks for the next allocations
 * and carves any request from them where it fits (regen_pool_trim, or an
 * allocation the driver refuses, gives them back after a synchronisation),
 * and orders frees by stream: memory freed on a
 * stream may still be used by work queued there, so only an allocation on
 * the same stream, whose work runs after it, takes it again until a
 * synchronisation settles it.
 *
 * libregen does not link libcuda: the driver's entry points are looked up at
 * run time (dlopen of libcuda.so.1, cuGetProcAddress), so libregen loads and
 * works without a GPU, and the pool says why it cannot allocate. */
#include "regen-config.h"

#include <dlfcn.h>
#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>
#include "private.h"

#ifdef REGEN_POOL_CUDA
#include <cuda.h>
#else
typedef unsigned long long CUdeviceptr;
typedef unsigned long long CUmemGenericAllocationHandle;
#endif

#define MIB (UINT64_C(1) << 20)
#define DEFAULT_CHUNK_BYTES (256 * MIB)
/* Every allocation is aligned so: more than cudaMalloc's 256 bytes, so that
 * vectorised kernels on any dtype see what they expect. */
#define ALIGN 512
/* The largest request taken: no GPU or host has 256 TiB, and below it the
 * rounding to ALIGN, the page or the VMM granularity cannot wrap around. */
#define REQUEST_MAX (UINT64_C(1) << 48)

enum chunk_kind { CHUNK_CUDA, CHUNK_HOST };

/* A piece of a chunk, used or free; the pieces tile the chunk in address
 * order. */
struct piece {
	struct piece *prev, *next;
	uint64_t offset, size;
	bool used;
	/* Free, but freed on `stream` (process allocator only) and perhaps
	 * still used by work queued there: only an allocation on that stream
	 * takes it, until a synchronisation settles it. */
	bool pending;
	void *stream;
};

struct chunk {
	struct chunk *next;
	enum chunk_kind kind;
	int device;                      /* CUDA: the local ordinal; host: -1 */
	uint64_t serial;
	char *base;
	uint64_t size;
	uint64_t used;
	int fd;                          /* the export (CUDA) or the memfd (host) */
	CUmemGenericAllocationHandle handle;
	struct piece *pieces;
	regen_buffer *import;            /* NULL until imported in the device's current generation */
	int import_device;               /* regend's index of the import */
	/* Memory taken back (regen_pool_adopt): all of it in use, for good. */
	bool adopted;
};

#ifdef REGEN_POOL_CUDA
struct driver {
	__typeof__(cuInit) *Init;
	__typeof__(cuGetErrorString) *GetErrorString;
	__typeof__(cuMemCreate) *MemCreate;
	__typeof__(cuMemRelease) *MemRelease;
	__typeof__(cuMemAddressReserve) *MemAddressReserve;
	__typeof__(cuMemAddressFree) *MemAddressFree;
	__typeof__(cuMemMap) *MemMap;
	__typeof__(cuMemUnmap) *MemUnmap;
	__typeof__(cuMemSetAccess) *MemSetAccess;
	__typeof__(cuMemGetAllocationGranularity) *MemGetAllocationGranularity;
	__typeof__(cuMemExportToShareableHandle) *MemExportToShareableHandle;
	__typeof__(cuMemImportFromShareableHandle) *MemImportFromShareableHandle;
	__typeof__(cuMemGetAddressRange) *MemGetAddressRange;
	__typeof__(cuCtxGetCurrent) *CtxGetCurrent;
	__typeof__(cuCtxPushCurrent) *CtxPushCurrent;
	__typeof__(cuCtxPopCurrent) *CtxPopCurrent;
	__typeof__(cuDeviceGetCount) *DeviceGetCount;
	__typeof__(cuDeviceGet) *DeviceGet;
	__typeof__(cuDevicePrimaryCtxRetain) *DevicePrimaryCtxRetain;
	__typeof__(cuDevicePrimaryCtxRelease) *DevicePrimaryCtxRelease;
	__typeof__(cuCtxSynchronize) *CtxSynchronize;
};
#endif

static struct {
	pthread_mutex_t lock;
#ifdef REGEN_POOL_CUDA
	pthread_once_t driver_once;
	struct driver drv;
	bool driver_ok;
#endif
	char driver_error[256];
	struct chunk *chunks;
	uint64_t next_serial;
	/* Bumped whenever an answer regen_pool_lookup gave may no longer hold
	 * (an import closed or forgotten, a device mapping changed): callers
	 * that cache answers check it (regen_pool_epoch). */
	uint64_t epoch;
	uint64_t chunk_bytes;
	char socket_path[108];
	regen_client *client;
	int device_map[REGEN_DEVICES_MAX];   /* local CUDA ordinal -> regend's index + 1; 0 = the same */
	/* The pool is the process's CUDA allocator: it caches and orders frees
	 * by stream itself (regen_pool_set_process_allocator). */
	bool process;
	/* Tests without a GPU: CUDA chunks are memfds and a synchronisation is
	 * a no-op ($REGEN_POOL_FAKE_CUDA=1, read once). */
	int fake_cuda;                       /* -1 not read yet, 0, 1 */
	/* This process is a fork of the one that made the chunks (set in the
	 * child, then acted on under the lock: adopt_fork). */
	bool forked;
	/* Imports of chunks gone whose close got no answer (the connection
	 * broke, the time ran out): regend may still map each for this
	 * process, until its last connection to the worker closes. Closed
	 * again, oldest first, whenever the pool next calls regend
	 * (retry_unclosed); forgotten with their generation. */
	regen_buffer **unclosed;
	size_t nunclosed, unclosed_cap;
	struct regen_pool_stats stats;
} pool = {
	.lock = PTHREAD_MUTEX_INITIALIZER,
#ifdef REGEN_POOL_CUDA
	.driver_once = PTHREAD_ONCE_INIT,
#endif
	.next_serial = 1,
	.fake_cuda = -1,
};

static void chunk_free(struct chunk *ch);
static void drop_unclosed(void);

/* ---- fork() ------------------------------------------------------------------
 *
 * A forked child (a DataLoader worker, say) shares the host chunks' pages
 * with its parent (MAP_SHARED memfds) and inherits the allocator's state
 * as it was: left alone, it would carve pieces the parent has since taken,
 * and free the parent's, and close the parent's imports over the parent's
 * connection (regend sees the parent's pid on it). The child starts from an
 * empty pool instead: the chunks it inherited stay mapped for the tensors
 * it inherited, are the parent's to free (a free of one is left alone), and
 * its own allocations come from chunks of its own, imported on a connection
 * of its own. The lock is taken around fork() so the child never inherits
 * it held by a thread that does not exist there. */
static void fork_prepare(void)
{
	pthread_mutex_lock(&pool.lock);
}

static void fork_parent(void)
{
	pthread_mutex_unlock(&pool.lock);
}

static void fork_child(void)
{
	pool.forked = true;
	pthread_mutex_unlock(&pool.lock);
}

__attribute__((constructor)) static void pool_watch_forks(void)
{
	pthread_atfork(fork_prepare, fork_parent, fork_child);
}

/* Under the lock: forgets what the parent's pool held (no call to regend:
 * the imports and the connection are the parent's), keeping the mappings. */
static void adopt_fork(void)
{
	struct chunk *ch, *next;

	if (!pool.forked)
		return;
	pool.forked = false;
	/* The client's sockets are the parent's connections: closed here (the
	 * parent's stay open), and the imports become bare ids, freed without
	 * a call. */
	regen_client_destroy(pool.client);
	pool.client = NULL;
	for (ch = pool.chunks; ch != NULL; ch = next) {
		next = ch->next;
		if (ch->import != NULL)
			(void)regen_buffer_close(ch->import);
		chunk_free(ch);
	}
	pool.chunks = NULL;
	drop_unclosed();
	memset(&pool.stats, 0, sizeof(pool.stats));
	pool.stats.size = sizeof(pool.stats);
	__atomic_add_fetch(&pool.epoch, 1, __ATOMIC_RELEASE);
}

static void lock_pool(void)
{
	pthread_mutex_lock(&pool.lock);
	adopt_fork();
}

/* The last failure of this thread's pool calls, for regen_pool_error, and
 * regend's error name when it was a failed import: per thread, as errno,
 * since the caller reads them after the lock is gone and torch calls the
 * pool from several threads (a failure of one would otherwise name
 * another's, and a StaleGeneration read as a plain failure is not retried). */
static __thread char pool_error[256];
static __thread char pool_error_name[128];

static void set_error(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
static void set_error(const char *fmt, ...)
{
	va_list ap;

	pool_error_name[0] = '\0';
	va_start(ap, fmt);
	vsnprintf(pool_error, sizeof(pool_error), fmt, ap);
	va_end(ap);
}

static uint64_t round_up(uint64_t x, uint64_t to)
{
	return (x + to - 1) / to * to;
}

static uint64_t chunk_bytes(void)
{
	const char *env;
	unsigned long long mb;

	if (pool.chunk_bytes == 0) {
		pool.chunk_bytes = DEFAULT_CHUNK_BYTES;
		env = getenv("REGEN_POOL_CHUNK_MB");
		if (env != NULL && sscanf(env, "%llu", &mb) == 1 && mb >= 2 && mb <= 1024 * 1024) {
			pool.chunk_bytes = mb * MIB;
		}
	}
	return pool.chunk_bytes;
}

/* ---- The driver, found at run time -------------------------------------- */

#ifdef REGEN_POOL_CUDA
typedef CUresult (*get_proc_v2_fn)(const char *, void **, int, cuuint64_t, CUdriverProcAddressQueryResult *);
typedef CUresult (*get_proc_v1_fn)(const char *, void **, int, cuuint64_t);

static void driver_load_once(void)
{
	static const struct {
		const char *name;
		size_t offset;
	} fns[] = {
#define FN(x) { "cu" #x, offsetof(struct driver, x) }
		FN(Init), FN(GetErrorString), FN(MemCreate), FN(MemRelease), FN(MemAddressReserve), FN(MemAddressFree),
		FN(MemMap), FN(MemUnmap), FN(MemSetAccess), FN(MemGetAllocationGranularity),
		FN(MemExportToShareableHandle), FN(MemImportFromShareableHandle), FN(MemGetAddressRange), FN(CtxGetCurrent), FN(CtxPushCurrent),
		FN(CtxPopCurrent), FN(DeviceGetCount), FN(DeviceGet), FN(DevicePrimaryCtxRetain),
		FN(DevicePrimaryCtxRelease), FN(CtxSynchronize),
#undef FN
	};
	get_proc_v2_fn get_v2;
	get_proc_v1_fn get_v1;
	void *lib;

	/* The process that uses the pool (torch) has loaded the driver already;
	 * this finds that copy. */
	lib = dlopen("libcuda.so.1", RTLD_NOW | RTLD_LOCAL);
	if (lib == NULL) {
		snprintf(pool.driver_error, sizeof(pool.driver_error), "no CUDA driver: %s", dlerror());
		return;
	}
	get_v2 = (get_proc_v2_fn)dlsym(lib, "cuGetProcAddress_v2");
	get_v1 = get_v2 == NULL ? (get_proc_v1_fn)dlsym(lib, "cuGetProcAddress") : NULL;
	if (get_v2 == NULL && get_v1 == NULL) {
		snprintf(pool.driver_error, sizeof(pool.driver_error), "the CUDA driver has no cuGetProcAddress (older than 11.3)");
		return;
	}
	for (size_t i = 0; i < sizeof(fns) / sizeof(fns[0]); i++) {
		CUdriverProcAddressQueryResult q = CU_GET_PROC_ADDRESS_SUCCESS;
		void *p = NULL;
		/* 12000: the ABI of CUDA 12.0 (cuMemGetAddressRange is its _v2). */
		CUresult r = get_v2 != NULL ? get_v2(fns[i].name, &p, 12000, CU_GET_PROC_ADDRESS_DEFAULT, &q)
					    : get_v1(fns[i].name, &p, 12000, CU_GET_PROC_ADDRESS_DEFAULT);
		if (r != CUDA_SUCCESS || q != CU_GET_PROC_ADDRESS_SUCCESS || p == NULL) {
			snprintf(pool.driver_error, sizeof(pool.driver_error),
				 "the CUDA driver has no entry point %s (error %d)", fns[i].name, (int)r);
			return;
		}
		memcpy((char *)&pool.drv + fns[i].offset, &p, sizeof(p));
	}
	if (pool.drv.Init(0) != CUDA_SUCCESS) {
		snprintf(pool.driver_error, sizeof(pool.driver_error), "cuInit failed: no usable GPU");
		return;
	}
	pool.driver_ok = true;
}

static bool driver_load(void)
{
	pthread_once(&pool.driver_once, driver_load_once);
	if (!pool.driver_ok) {
		set_error("%s", pool.driver_error);
	}
	return pool.driver_ok;
}

static const char *cu_error(CUresult r)
{
	const char *s = NULL;

	if (pool.drv.GetErrorString == NULL || pool.drv.GetErrorString(r, &s) != CUDA_SUCCESS || s == NULL) {
		return "unknown CUDA driver error";
	}
	return s;
}

static void prop_for(CUmemAllocationProp *prop, int device)
{
	memset(prop, 0, sizeof(*prop));
	prop->type = CU_MEM_ALLOCATION_TYPE_PINNED;
	prop->location.type = CU_MEM_LOCATION_TYPE_DEVICE;
	prop->location.id = device;
	prop->requestedHandleTypes = CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR;
}

/* Reserves ch->size bytes of address space aligned to gran, maps ch->handle
 * there and makes it read/write for `device`: the base, or 0 with nothing
 * left reserved or mapped (the handle stays the caller's). */
static CUdeviceptr map_for_device(struct chunk *ch, int device, size_t gran)
{
	CUmemAccessDesc access;
	CUdeviceptr base = 0;
	CUresult r;

	r = pool.drv.MemAddressReserve(&base, ch->size, gran, 0, 0);
	if (r != CUDA_SUCCESS) {
		set_error("cuMemAddressReserve of %llu bytes: %s", (unsigned long long)ch->size, cu_error(r));
		return 0;
	}
	r = pool.drv.MemMap(base, ch->size, 0, ch->handle, 0);
	if (r != CUDA_SUCCESS) {
		set_error("cuMemMap of %llu bytes: %s", (unsigned long long)ch->size, cu_error(r));
		goto fail_free;
	}
	memset(&access, 0, sizeof(access));
	access.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
	access.location.id = device;
	access.flags = CU_MEM_ACCESS_FLAGS_PROT_READWRITE;
	r = pool.drv.MemSetAccess(base, ch->size, &access, 1);
	if (r != CUDA_SUCCESS) {
		set_error("cuMemSetAccess: %s", cu_error(r));
		pool.drv.MemUnmap(base, ch->size);
		goto fail_free;
	}
	return base;

fail_free:
	pool.drv.MemAddressFree(base, ch->size);
	return 0;
}

/* A VMM allocation of at least `want` bytes on `device`, mapped read/write
 * for it and exported as an fd. */
static int cuda_chunk_init(struct chunk *ch, int device, uint64_t want)
{
	CUmemAllocationProp prop;
	size_t gran = 0;
	CUdeviceptr base;
	int fd = -1;
	CUresult r;

	if (!driver_load()) {
		return -ENODEV;
	}
	prop_for(&prop, device);
	r = pool.drv.MemGetAllocationGranularity(&gran, &prop, CU_MEM_ALLOC_GRANULARITY_RECOMMENDED);
	if (r != CUDA_SUCCESS || gran == 0) {
		set_error("cuMemGetAllocationGranularity on device %d: %s", device, cu_error(r));
		return -EIO;
	}
	ch->size = round_up(want, gran);
	r = pool.drv.MemCreate(&ch->handle, ch->size, &prop, 0);
	if (r != CUDA_SUCCESS) {
		set_error("cuMemCreate of %llu bytes on device %d: %s", (unsigned long long)ch->size, device, cu_error(r));
		return r == CUDA_ERROR_OUT_OF_MEMORY ? -ENOMEM : -EIO;
	}
	base = map_for_device(ch, device, gran);
	if (!base) {
		goto fail_release;
	}
	r = pool.drv.MemExportToShareableHandle(&fd, ch->handle, CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR, 0);
	if (r != CUDA_SUCCESS || fd < 0) {
		set_error("cuMemExportToShareableHandle: %s", cu_error(r));
		pool.drv.MemUnmap(base, ch->size);
		pool.drv.MemAddressFree(base, ch->size);
		goto fail_release;
	}
	(void)fcntl(fd, F_SETFD, FD_CLOEXEC);
	ch->kind = CHUNK_CUDA;
	ch->device = device;
	ch->base = (char *)(uintptr_t)base;
	ch->fd = fd;
	return 0;

fail_release:
	pool.drv.MemRelease(ch->handle);
	return -EIO;
}

/* Memory a dead process kept (its VMM export, taken back from regend),
 * mapped read/write for `device` at a new address. Takes fd on success. */
static int cuda_chunk_adopt(struct chunk *ch, int device, int fd, uint64_t bytes)
{
	CUmemAllocationProp prop;
	size_t gran = 0;
	CUdeviceptr base;
	CUresult r;

	if (!driver_load()) {
		return -ENODEV;
	}
	r = pool.drv.MemImportFromShareableHandle(&ch->handle, (void *)(uintptr_t)fd,
						  CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR);
	if (r != CUDA_SUCCESS) {
		set_error("cuMemImportFromShareableHandle: %s (is the fd a CUDA VMM export?)", cu_error(r));
		return -EINVAL;
	}
	prop_for(&prop, device);
	r = pool.drv.MemGetAllocationGranularity(&gran, &prop, CU_MEM_ALLOC_GRANULARITY_MINIMUM);
	if (r != CUDA_SUCCESS || gran == 0) {
		set_error("cuMemGetAllocationGranularity on device %d: %s", device, cu_error(r));
		goto fail_release;
	}
	ch->size = round_up(bytes, gran);
	base = map_for_device(ch, device, gran);
	if (!base) {
		goto fail_release;
	}
	ch->kind = CHUNK_CUDA;
	ch->device = device;
	ch->base = (char *)(uintptr_t)base;
	ch->fd = fd;
	return 0;

fail_release:
	pool.drv.MemRelease(ch->handle);
	return -EIO;
}

static void cuda_chunk_finish(struct chunk *ch)
{
	CUdeviceptr base = (CUdeviceptr)(uintptr_t)ch->base;

	pool.drv.MemUnmap(base, ch->size);
	pool.drv.MemAddressFree(base, ch->size);
	pool.drv.MemRelease(ch->handle);
}
#else
static int cuda_chunk_init(struct chunk *ch, int device, uint64_t want)
{
	(void)ch;
	(void)want;
	set_error("libregen was built without the CUDA headers: no CUDA pool (device %d)", device);
	return -ENOTSUP;
}

static int cuda_chunk_adopt(struct chunk *ch, int device, int fd, uint64_t bytes)
{
	(void)ch;
	(void)fd;
	(void)bytes;
	set_error("libregen was built without the CUDA headers: no CUDA pool (device %d)", device);
	return -ENOTSUP;
}

static void cuda_chunk_finish(struct chunk *ch)
{
	(void)ch;
}
#endif

/* ---- Host chunks: memfds for the host backend --------------------------- */

static int host_chunk_init(struct chunk *ch, uint64_t want)
{
	long page = sysconf(_SC_PAGESIZE);
	void *p;
	int fd;

	ch->size = round_up(want, page > 0 ? (uint64_t)page : 4096);
	fd = memfd_create("regen-pool", MFD_CLOEXEC | MFD_ALLOW_SEALING);
	if (fd < 0) {
		set_error("memfd_create: %s", strerror(errno));
		return -errno;
	}
	if (ftruncate(fd, (off_t)ch->size) < 0 || fcntl(fd, F_ADD_SEALS, F_SEAL_SHRINK) < 0) {
		set_error("sizing the memfd to %llu bytes: %s", (unsigned long long)ch->size, strerror(errno));
		close(fd);
		return -ENOMEM;
	}
	p = mmap(NULL, ch->size, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
	if (p == MAP_FAILED) {
		set_error("mapping the memfd: %s", strerror(errno));
		close(fd);
		return -ENOMEM;
	}
	ch->kind = CHUNK_HOST;
	ch->device = -1;
	ch->base = p;
	ch->fd = fd;
	return 0;
}

/* ---- Chunks and pieces --------------------------------------------------- */

/* Frees the imports still on the unclosed list without a call: their
 * client is gone (closing a bare id only frees it). */
static void drop_unclosed(void)
{
	for (size_t i = 0; i < pool.nunclosed; i++)
		(void)regen_buffer_close(pool.unclosed[i]);
	free(pool.unclosed);
	pool.unclosed = NULL;
	pool.nunclosed = pool.unclosed_cap = 0;
	pool.stats.unclosed = 0;
}

/* Tries the closes that got no answer before, oldest first, until one
 * gets none again: regend is still out of reach, and the rest wait for
 * the next try rather than each for its own timeout. */
static void retry_unclosed(void)
{
	size_t done = 0;

	while (done < pool.nunclosed && rc_buffer_close_or_keep(pool.unclosed[done]) == 0)
		done++;
	if (done == 0)
		return;
	memmove(pool.unclosed, pool.unclosed + done, (pool.nunclosed - done) * sizeof(*pool.unclosed));
	pool.nunclosed -= done;
	pool.stats.unclosed = pool.nunclosed;
}

/* Closes the chunk's import in regend. An import of a generation that is
 * gone needs no call (regen_buffer_close knows). A close that got no answer
 * goes on the unclosed list. Whether regend answered (a close, or no call
 * needed). */
static bool chunk_unimport(struct chunk *ch)
{
	regen_buffer *b = ch->import;

	if (b == NULL)
		return true;
	ch->import = NULL;
	pool.stats.imports--;
	__atomic_add_fetch(&pool.epoch, 1, __ATOMIC_RELEASE);
	if (rc_buffer_close_or_keep(b) == 0)
		return true;
	if (pool.nunclosed == pool.unclosed_cap) {
		size_t cap = pool.unclosed_cap ? 2 * pool.unclosed_cap : 8;
		regen_buffer **grown = realloc(pool.unclosed, cap * sizeof(*grown));
		if (grown == NULL) {
			/* One more try, then it is forgotten. */
			(void)regen_buffer_close(b);
			return false;
		}
		pool.unclosed = grown;
		pool.unclosed_cap = cap;
	}
	pool.unclosed[pool.nunclosed++] = b;
	pool.stats.unclosed = pool.nunclosed;
	return false;
}

static bool fake_cuda(void)
{
	if (pool.fake_cuda < 0) {
		const char *env = getenv("REGEN_POOL_FAKE_CUDA");
		pool.fake_cuda = env != NULL && strcmp(env, "1") == 0;
	}
	return pool.fake_cuda == 1;
}

/* The chunk's fd and bookkeeping; its memory and import are the caller's. */
static void chunk_free(struct chunk *ch)
{
	struct piece *p, *next;

	if (ch->fd >= 0) {
		close(ch->fd);
	}
	for (p = ch->pieces; p != NULL; p = next) {
		next = p->next;
		free(p);
	}
	free(ch);
}

static void chunk_destroy(struct chunk *ch)
{
	/* Where regend answered, the closes it did not answer before go
	 * too. */
	if (chunk_unimport(ch))
		retry_unclosed();
	if (ch->kind == CHUNK_CUDA && !fake_cuda()) {
		cuda_chunk_finish(ch);
	} else {
		munmap(ch->base, ch->size);
	}
	pool.stats.chunks--;
	pool.stats.chunk_bytes -= ch->size;
	chunk_free(ch);
}

static struct chunk *chunk_create(enum chunk_kind kind, int device, uint64_t want)
{
	struct chunk *ch;
	int r;

	ch = calloc(1, sizeof(*ch));
	if (ch == NULL) {
		goto fail;
	}
	ch->pieces = calloc(1, sizeof(*ch->pieces));
	if (ch->pieces == NULL) {
		goto fail_chunk;
	}
	ch->fd = -1;
	ch->import_device = -1;
	if (kind == CHUNK_CUDA && fake_cuda()) {
		r = host_chunk_init(ch, want);
		ch->kind = CHUNK_CUDA;
		ch->device = device;
	} else {
		r = kind == CHUNK_CUDA ? cuda_chunk_init(ch, device, want) : host_chunk_init(ch, want);
	}
	if (r < 0) {
		free(ch->pieces);
		free(ch);
		return NULL;   /* the init said why */
	}
	ch->pieces->size = ch->size;
	ch->serial = pool.next_serial++;
	ch->next = pool.chunks;
	pool.chunks = ch;
	pool.stats.chunks++;
	pool.stats.chunk_bytes += ch->size;
	return ch;

fail_chunk:
	free(ch);
fail:
	set_error("out of host memory");
	return NULL;
}

/* Whether piece p may serve an allocation on `stream`: free, and not
 * pending on another stream. */
static bool piece_serves(const struct piece *p, uint64_t size, void *stream)
{
	return !p->used && p->size >= size && (!p->pending || p->stream == stream);
}

/* Takes `size` bytes at the start of free piece p (the rest stays free as
 * p was): the offset, or -1 without host memory for the rest. */
static int64_t piece_take(struct chunk *ch, struct piece *p, uint64_t size)
{
	struct piece *rest;

	if (p->size > size) {
		rest = calloc(1, sizeof(*rest));
		if (rest == NULL) {
			return -1;
		}
		rest->offset = p->offset + size;
		rest->size = p->size - size;
		rest->pending = p->pending;
		rest->stream = p->stream;
		rest->prev = p;
		rest->next = p->next;
		if (p->next != NULL) {
			p->next->prev = rest;
		}
		p->next = rest;
		p->size = size;
	}
	p->used = true;
	p->pending = false;
	ch->used += size;
	return (int64_t)p->offset;
}

/* Merges piece b (which follows a) into a. */
static void piece_merge(struct piece *a, struct piece *b)
{
	a->size += b->size;
	a->next = b->next;
	if (b->next != NULL) {
		b->next->prev = a;
	}
	free(b);
}

/* Free pieces side by side become one where the same allocations may
 * take them: both settled, or both pending on the same stream. */
static bool mergeable(const struct piece *a, const struct piece *b)
{
	return !a->used && !b->used && a->pending == b->pending && (!a->pending || a->stream == b->stream);
}

/* Frees the used piece at `offset`, pending on `stream` for the process
 * allocator; false when there is none. */
static bool chunk_return(struct chunk *ch, uint64_t offset, void *stream)
{
	struct piece *p;

	for (p = ch->pieces; p != NULL && p->offset != offset; p = p->next) {
	}
	if (p == NULL || !p->used) {
		return false;
	}
	p->used = false;
	p->pending = pool.process && ch->kind == CHUNK_CUDA;
	p->stream = p->pending ? stream : NULL;
	ch->used -= p->size;
	if (p->next != NULL && mergeable(p, p->next)) {
		piece_merge(p, p->next);
	}
	if (p->prev != NULL && mergeable(p->prev, p)) {
		piece_merge(p->prev, p);
	}
	return true;
}

static struct chunk *chunk_of(const void *ptr, struct chunk ***link)
{
	struct chunk **pp;

	for (pp = &pool.chunks; *pp != NULL; pp = &(*pp)->next) {
		struct chunk *ch = *pp;
		if ((const char *)ptr >= ch->base && (const char *)ptr < ch->base + ch->size) {
			if (link != NULL) {
				*link = pp;
			}
			return ch;
		}
	}
	return NULL;
}

static int trim_locked(void);

/* Where an allocation of `want` bytes on `stream` goes among the chunks
 * of `kind` on `device`: the smallest free piece that serves it (best fit,
 * as torch's caching allocator does), its chunk returned and its offset in
 * *off; NULL if none. First fit fragments a training loop's memory without
 * bound: the small allocations at the start of a step would carve up the
 * chunk that last step's largest tensor left free, and that tensor would
 * need a new chunk each step. For the same reason a small request never
 * splits a chunk made for a big one. */
static struct chunk *carve_any(enum chunk_kind kind, int device, uint64_t want, void *stream, int64_t *off)
{
	const bool small = want <= chunk_bytes() / 2;
	struct chunk *ch, *best_ch = NULL;
	struct piece *p, *best = NULL;

	for (ch = pool.chunks; ch != NULL; ch = ch->next) {
		if (ch->kind != kind || ch->device != device || ch->size - ch->used < want ||
		    (small && ch->size != chunk_bytes())) {
			continue;
		}
		for (p = ch->pieces; p != NULL; p = p->next) {
			if (piece_serves(p, want, stream) && (best == NULL || p->size < best->size)) {
				best = p;
				best_ch = ch;
				if (p->size == want) {
					goto found;
				}
			}
		}
	}
	if (best == NULL) {
		return NULL;
	}
found:
	*off = piece_take(best_ch, best, want);
	return *off >= 0 ? best_ch : NULL;
}

static void *pool_alloc(enum chunk_kind kind, int device, uint64_t size, void *stream)
{
	uint64_t want, big = chunk_bytes();
	struct chunk *ch = NULL;
	int64_t off = -1;
	bool process = pool.process && kind == CHUNK_CUDA;

	if (size > REQUEST_MAX) {
		set_error("a request of %llu bytes is larger than any device (at most %llu)", (unsigned long long)size,
			  (unsigned long long)REQUEST_MAX);
		return NULL;
	}
	want = round_up(size > 0 ? size : 1, ALIGN);
	/* A request over half a chunk gets a chunk of its own: carving it out of
	 * a shared one would strand the rest. The process allocator keeps the
	 * chunks of big requests too, so they are searched for any request. */
	if (want > big / 2) {
		big = want;
	}
	if (want <= chunk_bytes() / 2 || process) {
		ch = carve_any(kind, device, want, stream, &off);
	}
	if (ch == NULL) {
		ch = chunk_create(kind, device, big);
		if (ch == NULL && process) {
			/* As torch's caching allocator does on OOM: synchronise, give
			 * back the kept chunks, and try again. */
			trim_locked();
			ch = carve_any(kind, device, want, stream, &off);
			if (ch != NULL) {
				goto carved;
			}
			ch = chunk_create(kind, device, big);
		}
		if (ch == NULL) {
			return NULL;
		}
		/* A fresh chunk: one free piece, at least `want` bytes. */
		off = piece_take(ch, ch->pieces, want);
		if (off < 0) {
			pool.chunks = ch->next;   /* chunk_create put it first */
			chunk_destroy(ch);
			set_error("out of host memory");
			return NULL;
		}
	}
carved:
	pool.stats.allocs++;
	pool.stats.used_bytes += want;
	return ch->base + off;
}

/* Whether an empty chunk stays. A CUDA chunk goes at once: torch's caching
 * allocator on top frees only what it means to give back. The host pool
 * has no cache above it (a CPU operation allocates and frees its buffers
 * each time): one empty host chunk stays, so that a loop of operations does
 * not make, import and close a chunk each time. */
static bool keep_empty(const struct chunk *ch)
{
	const struct chunk *other;

	/* The process allocator is the cache: its CUDA chunks stay until a
	 * trim (which synchronises first, so no work still uses them). */
	if (ch->kind == CHUNK_CUDA) {
		return pool.process;
	}
	if (ch->size != chunk_bytes()) {
		return false;
	}
	for (other = pool.chunks; other != NULL; other = other->next) {
		if (other != ch && other->kind == CHUNK_HOST && other->used == 0) {
			return false;
		}
	}
	return true;
}

/* Frees what the pool gave as `kind`; anything else (a pointer it never
 * gave, one inside an allocation, one freed already, host memory given to
 * the CUDA free or the other way) is left alone. */
static void pool_free(const void *ptr, enum chunk_kind kind, void *stream)
{
	struct chunk **link = NULL;
	struct chunk *ch;
	uint64_t offset, before;

	if (ptr == NULL) {
		return;
	}
	ch = chunk_of(ptr, &link);
	if (ch == NULL || ch->kind != kind || ch->adopted) {
		return;
	}
	offset = (uint64_t)((const char *)ptr - ch->base);
	before = ch->used;
	if (!chunk_return(ch, offset, stream)) {
		return;
	}
	pool.stats.frees++;
	pool.stats.used_bytes -= before - ch->used;
	if (ch->used == 0 && !keep_empty(ch)) {
		*link = ch->next;
		chunk_destroy(ch);
	}
}

/* ---- The process allocator's cache ------------------------------------------ */

/* Waits for the work of the device's primary context (torch's): after it no
 * work uses memory freed before. 0 or -errno with the error set. */
static int device_sync(int device)
{
#ifdef REGEN_POOL_CUDA
	CUdevice dev;
	CUcontext ctx;
	CUresult r;

	if (fake_cuda()) {
		return 0;
	}
	if (!driver_load()) {
		return -ENODEV;
	}
	r = pool.drv.DeviceGet(&dev, device);
	if (r == CUDA_SUCCESS) {
		r = pool.drv.DevicePrimaryCtxRetain(&ctx, dev);
	}
	if (r != CUDA_SUCCESS) {
		set_error("the primary context of device %d: %s", device, cu_error(r));
		return -EIO;
	}
	r = pool.drv.CtxPushCurrent(ctx);
	if (r == CUDA_SUCCESS) {
		r = pool.drv.CtxSynchronize();
		pool.drv.CtxPopCurrent(&ctx);
	}
	pool.drv.DevicePrimaryCtxRelease(dev);
	if (r != CUDA_SUCCESS) {
		set_error("synchronising device %d: %s", device, cu_error(r));
		return -EIO;
	}
	return 0;
#else
	return fake_cuda() ? 0 : -ENOTSUP;
#endif
}

/* Settles the pending pieces of the CUDA chunks (once their devices are
 * synchronised: nothing queued before uses them) and gives back the empty
 * chunks. A device that cannot be synchronised keeps its chunks as they
 * are. 0, or the first error. */
static int trim_locked(void)
{
	bool synced[REGEN_DEVICES_MAX] = { false }, failed[REGEN_DEVICES_MAX] = { false };
	struct chunk **link = &pool.chunks, *ch;
	struct piece *p;
	int r = 0;

	while ((ch = *link) != NULL) {
		if (ch->kind != CHUNK_CUDA || ch->adopted || ch->device < 0 || ch->device >= REGEN_DEVICES_MAX) {
			link = &ch->next;
			continue;
		}
		if (!synced[ch->device] && !failed[ch->device]) {
			int e = device_sync(ch->device);
			synced[ch->device] = e == 0;
			failed[ch->device] = e != 0;
			if (e < 0 && r == 0) {
				r = e;
			}
		}
		if (failed[ch->device]) {
			link = &ch->next;
			continue;
		}
		for (p = ch->pieces; p != NULL; p = p->next) {
			p->pending = false;
			p->stream = NULL;
		}
		for (p = ch->pieces; p != NULL && p->next != NULL;) {
			if (mergeable(p, p->next)) {
				piece_merge(p, p->next);
			} else {
				p = p->next;
			}
		}
		if (ch->used == 0) {
			*link = ch->next;
			chunk_destroy(ch);
		} else {
			link = &ch->next;
		}
	}
	return r;
}

/* ---- The public face ------------------------------------------------------ */

REGEN_EXPORT void *regen_pool_alloc(size_t size, int device, void *stream)
{
	void *p;

	/* Under a MemPool, torch's caching allocator orders allocations by
	 * stream; as the process allocator the pool does (pieces pending on
	 * the stream that freed them). */
	if (device < 0 || device >= REGEN_DEVICES_MAX) {
		set_error("CUDA device %d is not one of the %d the pool serves", device, REGEN_DEVICES_MAX);
		errno = EINVAL;
		return NULL;
	}
	lock_pool();
	p = pool_alloc(CHUNK_CUDA, device, size, stream);
	pthread_mutex_unlock(&pool.lock);
	return p;
}

REGEN_EXPORT void regen_pool_free(void *ptr, size_t size, int device, void *stream)
{
	(void)size;
	(void)device;
	lock_pool();
	/* torch passes the stream the memory was allocated on. */
	pool_free(ptr, CHUNK_CUDA, stream);
	pthread_mutex_unlock(&pool.lock);
}

REGEN_EXPORT void *regen_pool_alloc_host(size_t size)
{
	void *p;

	lock_pool();
	p = pool_alloc(CHUNK_HOST, -1, size, NULL);
	pthread_mutex_unlock(&pool.lock);
	return p;
}

REGEN_EXPORT void regen_pool_free_host(void *ptr)
{
	lock_pool();
	pool_free(ptr, CHUNK_HOST, NULL);
	pthread_mutex_unlock(&pool.lock);
}

REGEN_EXPORT int regen_pool_configure(const char *socket_path, uint64_t chunk_bytes_)
{
	struct chunk *ch;

	lock_pool();
	if (chunk_bytes_ != 0 && (chunk_bytes_ < 2 * MIB || chunk_bytes_ % MIB != 0)) {
		set_error("chunk size %llu is not a multiple of 1 MiB of at least 2 MiB", (unsigned long long)chunk_bytes_);
		pthread_mutex_unlock(&pool.lock);
		return -EINVAL;
	}
	if (socket_path != NULL && strlen(socket_path) >= sizeof(pool.socket_path)) {
		set_error("socket path too long: %s", socket_path);
		pthread_mutex_unlock(&pool.lock);
		return -ENAMETOOLONG;
	}
	if (chunk_bytes_ != 0) {
		pool.chunk_bytes = chunk_bytes_;
	}
	if (socket_path != NULL && strcmp(socket_path, pool.socket_path) != 0) {
		/* Another regend: the imports into the old one are closed there,
		 * and the next lookups import into the new one. */
		for (ch = pool.chunks; ch != NULL; ch = ch->next) {
			chunk_unimport(ch);
		}
		retry_unclosed();
		/* What the old regend still did not answer stays there until
		 * this process's last connection to it closes. */
		regen_client_destroy(pool.client);
		pool.client = NULL;
		drop_unclosed();
		snprintf(pool.socket_path, sizeof(pool.socket_path), "%s", socket_path);
	}
	pthread_mutex_unlock(&pool.lock);
	return 0;
}

REGEN_EXPORT int regen_pool_set_process_allocator(int on)
{
	int r = 0;

	lock_pool();
	if (pool.process && !on) {
		/* What it kept goes, and no piece stays pending: a MemPool's
		 * caching allocator above orders its own frees. */
		r = trim_locked();
	}
	if (r == 0) {
		pool.process = on != 0;
	}
	pthread_mutex_unlock(&pool.lock);
	return r;
}

REGEN_EXPORT int regen_pool_trim(void)
{
	int r;

	lock_pool();
	retry_unclosed();
	r = trim_locked();
	pthread_mutex_unlock(&pool.lock);
	return r;
}

REGEN_EXPORT int regen_pool_map_device(int local_device, int regend_device)
{
	lock_pool();
	if (local_device < 0 || local_device >= REGEN_DEVICES_MAX || regend_device < -1 ||
	    regend_device >= REGEN_DEVICES_MAX) {
		set_error("no device mapping %d -> %d (devices are 0 .. %d)", local_device, regend_device,
			  REGEN_DEVICES_MAX - 1);
		pthread_mutex_unlock(&pool.lock);
		return -EINVAL;
	}
	pool.device_map[local_device] = regend_device < 0 ? 0 : regend_device + 1;
	__atomic_add_fetch(&pool.epoch, 1, __ATOMIC_RELEASE);
	pthread_mutex_unlock(&pool.lock);
	return 0;
}

REGEN_EXPORT uint64_t regen_pool_epoch(void)
{
	return __atomic_load_n(&pool.epoch, __ATOMIC_ACQUIRE);
}

static int regend_device_of(const struct chunk *ch, int host_device)
{
	if (ch->kind == CHUNK_HOST) {
		return host_device;
	}
	return pool.device_map[ch->device] > 0 ? pool.device_map[ch->device] - 1 : ch->device;
}

/* The pool's own client, connected on first use. */
static int pool_client(void)
{
	int r;

	if (pool.client != NULL)
		return 0;
	r = regen_client_connect(pool.socket_path[0] != '\0' ? pool.socket_path : NULL, &pool.client);
	if (r < 0) {
		set_error("connecting to regend at %s: %s",
			  pool.socket_path[0] != '\0' ? pool.socket_path : "the default socket", strerror(-r));
		/* Not -ENOENT, which a lookup returns for memory not in the
		 * pool: regend is not there (yet). */
		return r == -ENOENT ? -ECONNREFUSED : r;
	}
	/* The pool calls regend from inside torch's allocator (a free that
	 * closes a chunk): never for long. */
	regen_client_set_timeout(pool.client, 10.0);
	return 0;
}

/* Imports the chunk into regend's `device` (its whole extent, from the
 * kept fd). */
static int chunk_import(struct chunk *ch, int device)
{
	int r = pool_client();

	if (r < 0)
		return r;
	retry_unclosed();
	if (ch->kind == CHUNK_HOST) {
		r = regen_buffer_import_fd(pool.client, device, ch->fd, ch->size, &ch->import);
	} else {
		r = regen_buffer_import_cuda_fd(pool.client, device, ch->fd, 0, ch->size, &ch->import);
	}
	if (r < 0) {
		if (r == -EREMOTE) {
			set_error("%s", regen_client_error_message(pool.client));
			snprintf(pool_error_name, sizeof(pool_error_name), "%s", regen_client_error_name(pool.client));
		} else {
			set_error("importing pool chunk %llu: %s", (unsigned long long)ch->serial, strerror(-r));
		}
		/* Sent, perhaps made, and never answered: regend may map it
		 * under an id nobody knows until the generation ends or this
		 * process's last connection to the worker closes. */
		if (r == -ECONNRESET || r == -ETIMEDOUT)
			pool.stats.imports_unanswered++;
		ch->import = NULL;
		return r == -ENOENT ? -ECONNREFUSED : r;
	}
	ch->import_device = device;
	pool.stats.imports++;
	pool.stats.import_calls++;
	return 0;
}

REGEN_EXPORT int regen_pool_lookup(const void *ptr, int host_device, struct regen_pool_ref *out)
{
	struct chunk *ch;
	int device, r = 0;

	if (out == NULL || out->size < sizeof(*out)) {
		return -EINVAL;
	}
	lock_pool();
	ch = chunk_of(ptr, NULL);
	if (ch == NULL) {
		r = -ENOENT;
		goto out;
	}
	device = regend_device_of(ch, host_device);
	if (device < 0 || device >= REGEN_DEVICES_MAX) {
		set_error("pool chunk %llu: no regend device given for host memory", (unsigned long long)ch->serial);
		r = -EINVAL;
		goto out;
	}
	if (ch->import != NULL && ch->import_device != device) {
		set_error("pool chunk %llu is imported into device %d, not %d", (unsigned long long)ch->serial,
			  ch->import_device, device);
		r = -EXDEV;
		goto out;
	}
	if (ch->import == NULL) {
		r = chunk_import(ch, device);
		if (r < 0) {
			goto out;
		}
	}
	snprintf(out->buffer, sizeof(out->buffer), "%s", regen_buffer_id(ch->import));
	out->device = device;
	out->generation = regen_buffer_generation(ch->import);
	out->offset = (uint64_t)((const char *)ptr - ch->base);
	out->extent = ch->size - out->offset;
	out->chunk = ch->serial;
	out->chunk_size = ch->size;
out:
	pthread_mutex_unlock(&pool.lock);
	return r;
}

REGEN_EXPORT void regen_pool_note_generation(int regend_device, uint64_t generation)
{
	struct chunk *ch;

	if (regend_device < 0 || regend_device >= REGEN_DEVICES_MAX) {
		return;
	}
	lock_pool();
	if (pool.client != NULL) {
		rc_note_generation(pool.client, regend_device, generation);
	}
	/* Imports of an older generation are gone in regend: forget them (no
	 * call), and the next lookup imports again from the kept fd. */
	for (ch = pool.chunks; ch != NULL; ch = ch->next) {
		if (ch->import != NULL && ch->import_device == regend_device &&
		    regen_buffer_generation(ch->import) < generation) {
			chunk_unimport(ch);
		}
	}
	/* Unclosed imports of that generation went with it. */
	size_t kept = 0;
	for (size_t i = 0; i < pool.nunclosed; i++) {
		regen_buffer *b = pool.unclosed[i];
		if (regen_buffer_device(b) != regend_device || regen_buffer_generation(b) >= generation ||
		    rc_buffer_close_or_keep(b) < 0)
			pool.unclosed[kept++] = b;
	}
	pool.nunclosed = kept;
	pool.stats.unclosed = pool.nunclosed;
	pthread_mutex_unlock(&pool.lock);
}

REGEN_EXPORT int regen_pool_stats_get(struct regen_pool_stats *out)
{
	size_t size;

	if (out == NULL || out->size < sizeof(size_t)) {
		return -EINVAL;
	}
	size = out->size < sizeof(*out) ? out->size : sizeof(*out);
	lock_pool();
	pool.stats.size = size;
	memcpy(out, &pool.stats, size);
	pthread_mutex_unlock(&pool.lock);
	return 0;
}

REGEN_EXPORT const char *regen_pool_error(void)
{
	return pool_error;
}

REGEN_EXPORT const char *regen_pool_error_name(void)
{
	return pool_error_name[0] != '\0' ? pool_error_name : NULL;
}

REGEN_EXPORT int regen_pool_cuda_available(void)
{
#ifdef REGEN_POOL_CUDA
	int r;

	lock_pool();
	r = driver_load() ? 0 : -ENODEV;
	pthread_mutex_unlock(&pool.lock);
	return r;
#else
	lock_pool();
	set_error("libregen was built without the CUDA headers: no CUDA pool");
	pthread_mutex_unlock(&pool.lock);
	return -ENOTSUP;
#endif
}

#ifdef REGEN_POOL_CUDA
/* cuMemGetAddressRange needs a current context, and a thread that never
 * used CUDA itself (a rank's helper thread, say) has none: seen on the H200
 * as "invalid device context". An allocation's range is the same from any
 * context of the process, so a device's primary context answers for it,
 * made current for the one query. */
static CUresult address_range(CUdeviceptr *b, size_t *s, CUdeviceptr p)
{
	CUresult cr = pool.drv.MemGetAddressRange(b, s, p);
	CUcontext current = NULL;
	int n = 0;

	if (cr != CUDA_ERROR_INVALID_CONTEXT || pool.drv.CtxGetCurrent(&current) != CUDA_SUCCESS || current != NULL ||
	    pool.drv.DeviceGetCount(&n) != CUDA_SUCCESS)
		return cr;
	for (int i = 0; i < n && cr != CUDA_SUCCESS; i++) {
		CUdevice dev;
		CUcontext ctx;

		if (pool.drv.DeviceGet(&dev, i) != CUDA_SUCCESS || pool.drv.DevicePrimaryCtxRetain(&ctx, dev) != CUDA_SUCCESS)
			continue;
		if (pool.drv.CtxPushCurrent(ctx) == CUDA_SUCCESS) {
			cr = pool.drv.MemGetAddressRange(b, s, p);
			pool.drv.CtxPopCurrent(&ctx);
		}
		pool.drv.DevicePrimaryCtxRelease(dev);
	}
	return cr;
}
#endif

REGEN_EXPORT int regen_cuda_address_range(const void *ptr, uint64_t *base, uint64_t *size)
{
#ifdef REGEN_POOL_CUDA
	CUdeviceptr b = 0;
	size_t s = 0;
	CUresult cr;
	int r = 0;

	if (base == NULL || size == NULL) {
		return -EINVAL;
	}
	lock_pool();
	if (!driver_load()) {
		r = -ENODEV;
	} else if ((cr = address_range(&b, &s, (CUdeviceptr)(uintptr_t)ptr)) != CUDA_SUCCESS) {
		set_error("cuMemGetAddressRange(%p): %s", ptr, cu_error(cr));
		r = -ENOENT;
	} else {
		*base = (uint64_t)b;
		*size = (uint64_t)s;
	}
	pthread_mutex_unlock(&pool.lock);
	return r;
#else
	(void)ptr;
	(void)base;
	(void)size;
	return -ENOTSUP;
#endif
}

/* ---- Kept state ---------------------------------------------------------- */

/* How regend keeps the chunk's memory: a memfd (the host's, or a fake CUDA
 * chunk's) as host_fd; a VMM export as cuda_fd. */
static enum regen_memory_kind chunk_memory_kind(const struct chunk *ch)
{
	return ch->kind == CHUNK_CUDA && !fake_cuda() ? REGEN_MEMORY_CUDA_FD : REGEN_MEMORY_HOST_FD;
}

REGEN_EXPORT int regen_pool_chunk_of(const void *ptr, struct regen_pool_chunk *out)
{
	struct chunk *ch;
	int r = 0;

	if (out == NULL || out->size < sizeof(*out)) {
		return -EINVAL;
	}
	lock_pool();
	ch = chunk_of(ptr, NULL);
	if (ch == NULL) {
		r = -ENOENT;
	} else {
		out->chunk = ch->serial;
		out->offset = (uint64_t)((const char *)ptr - ch->base);
		out->bytes = ch->size;
		out->device = ch->kind == CHUNK_CUDA ? ch->device : -1;
		out->kind = chunk_memory_kind(ch);
	}
	pthread_mutex_unlock(&pool.lock);
	return r;
}

REGEN_EXPORT int regen_pool_keep(const void *ptr, const char *job, uint32_t rank, const char *name,
				 uint32_t lease_ms)
{
	struct regen_keep_args args = { .job = job, .rank = rank, .name = name, .lease_ms = lease_ms };
	struct chunk *ch;
	int r;

	lock_pool();
	ch = chunk_of(ptr, NULL);
	if (ch == NULL) {
		set_error("%p is not memory of the pool", ptr);
		r = -ENOENT;
		goto out;
	}
	r = pool_client();
	if (r < 0) {
		goto out;
	}
	args.kind = chunk_memory_kind(ch);
	args.fd = ch->fd;
	args.bytes = ch->size;
	args.device = args.kind == REGEN_MEMORY_CUDA_FD ? regend_device_of(ch, -1) : -1;
	r = regen_keep(pool.client, &args, NULL);
	if (r == -EREMOTE) {
		set_error("%s", regen_client_error_message(pool.client));
		snprintf(pool_error_name, sizeof(pool_error_name), "%s", regen_client_error_name(pool.client));
	} else if (r < 0) {
		set_error("keeping pool chunk %llu: %s", (unsigned long long)ch->serial,
			  regen_client_error_message(pool.client) ? regen_client_error_message(pool.client)
								    : strerror(-r));
	}
out:
	pthread_mutex_unlock(&pool.lock);
	return r;
}

REGEN_EXPORT int regen_pool_adopt(int fd, enum regen_memory_kind kind, int device, uint64_t bytes, void **base)
{
	struct chunk *ch;
	int r;

	if (fd < 0 || base == NULL || bytes == 0 || bytes > REQUEST_MAX || device >= REGEN_DEVICES_MAX ||
	    (kind != REGEN_MEMORY_HOST_FD && kind != REGEN_MEMORY_CUDA_FD) ||
	    (kind == REGEN_MEMORY_CUDA_FD && device < 0)) {
		return -EINVAL;
	}
	lock_pool();
	ch = calloc(1, sizeof(*ch));
	if (ch == NULL || (ch->pieces = calloc(1, sizeof(*ch->pieces))) == NULL) {
		free(ch);
		set_error("out of host memory");
		r = -ENOMEM;
		goto out;
	}
	ch->fd = -1;
	ch->import_device = -1;
	if (kind == REGEN_MEMORY_CUDA_FD) {
		r = cuda_chunk_adopt(ch, device, fd, bytes);
	} else if (device >= 0 && !fake_cuda()) {
		set_error("host memory (a memfd) for CUDA device %d: only with REGEN_POOL_FAKE_CUDA=1", device);
		r = -EINVAL;
	} else {
		void *p = mmap(NULL, bytes, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
		r = p == MAP_FAILED ? -errno : 0;
		if (r < 0) {
			set_error("mapping the kept memfd: %s", strerror(-r));
		} else {
			ch->kind = device >= 0 ? CHUNK_CUDA : CHUNK_HOST;
			ch->device = device;
			ch->base = p;
			ch->size = bytes;
			ch->fd = fd;
		}
	}
	if (r < 0) {
		free(ch->pieces);
		free(ch);
		goto out;
	}
	ch->adopted = true;
	ch->pieces->size = ch->size;
	ch->pieces->used = true;
	ch->used = ch->size;
	ch->serial = pool.next_serial++;
	ch->next = pool.chunks;
	pool.chunks = ch;
	pool.stats.chunks++;
	pool.stats.chunk_bytes += ch->size;
	*base = ch->base;
out:
	pthread_mutex_unlock(&pool.lock);
	return r;
}
