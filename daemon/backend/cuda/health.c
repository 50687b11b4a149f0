/* SPDX-License-Identifier: Apache-2.0 */
/* The CUDA backend's health watch: faults found without waiting for a call.
 *
 * The context check: a thread asks the context every period_ms whether it
 * took a sticky error (cuda_context_check(): a query on the host, no GPU
 * work, so the rank's context is never switched out for it). A fault while
 * no call is in flight (an injected one, a kernel of a call already
 * answered with its signal_event, an ECC error) is so reported within a
 * period, not at the next call's synchronisation.
 *
 * NVML (libnvidia-ml.so.1, which comes with the driver, opened with dlopen
 * so that nothing links it): a second thread waits for the GPU's XID and
 * double-bit ECC events and reads, every second, the ECC counts and the
 * pending page retirement and row remapping. An XID goes through the XID
 * table (daemon/backend/health.c); NVML answering that the GPU is lost or
 * needs a reset fails the device. Without NVML (CI, a container without
 * the driver's library) the health source reads "unavailable", with why,
 * and the context check works alone.
 *
 * Sharing (io.regen.Device.Sharing): whether the worker's context is an
 * MPS client, as the driver says of the context it made (the device
 * attribute MPS_ENABLED, read once the context exists), with the reason
 * Status shows: under MPS a fatal fault in any client reaches every client
 * of the GPU. NVML adds, where it can, the GPU's compute mode and how many
 * MPS clients it counts on the GPU, as a cross-check a person can read.
 *
 * The NVML declarations below are the few this file uses, as nvml.h has
 * them (its ABI is stable across drivers): the toolkit's nvml.h is not
 * needed to build. */
#include "regen-config.h"

#include <dlfcn.h>
#include <errno.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include "daemon/backend/cuda/common.h"
#include "daemon/backend/health.h"
#include "proto/errors.h"

/* ---- NVML, as nvml.h declares it ------------------------------------------ */

typedef unsigned nv_return;
typedef struct nv_device_st *nv_device;
typedef struct nv_event_set_st *nv_event_set;
struct nv_event_data {
	nv_device device;
	unsigned long long event_type;
	unsigned long long event_data;
	unsigned gpu_instance_id;
	unsigned compute_instance_id;
};
enum {
	NV_SUCCESS = 0,
	NV_ERROR_NOT_SUPPORTED = 3,
	NV_ERROR_INSUFFICIENT_SIZE = 7,
	NV_ERROR_TIMEOUT = 10,
	NV_ERROR_GPU_IS_LOST = 15,
	NV_ERROR_RESET_REQUIRED = 16,
};
#define NV_EVENT_DOUBLE_BIT_ECC 0x2ULL
#define NV_EVENT_XID_CRITICAL 0x8ULL
#define NV_MEMORY_ERROR_UNCORRECTED 1
#define NV_ECC_VOLATILE 0
#define NV_ECC_AGGREGATE 1

struct nv_api {
	nv_return (*Init_v2)(void);
	nv_return (*Shutdown)(void);
	const char *(*ErrorString)(nv_return r);
	nv_return (*DeviceGetHandleByPciBusId_v2)(const char *bus_id, nv_device *dev);
	nv_return (*DeviceGetUUID)(nv_device dev, char *uuid, unsigned length);
	nv_return (*DeviceGetTotalEccErrors)(nv_device dev, int type, int counter, unsigned long long *count);
	nv_return (*DeviceGetRetiredPagesPendingStatus)(nv_device dev, int *pending);
	nv_return (*DeviceGetRemappedRows)(nv_device dev, unsigned *corr, unsigned *unc, unsigned *pending,
					   unsigned *failed);
	nv_return (*DeviceGetSupportedEventTypes)(nv_device dev, unsigned long long *types);
	nv_return (*EventSetCreate)(nv_event_set *set);
	nv_return (*DeviceRegisterEvents)(nv_device dev, unsigned long long types, nv_event_set set);
	nv_return (*EventSetWait_v2)(nv_event_set set, struct nv_event_data *data, unsigned timeout_ms);
	nv_return (*EventSetFree)(nv_event_set set);
	/* Optional (an older NVML may lack them): the cross-check of sharing. */
	nv_return (*DeviceGetComputeMode)(nv_device dev, int *mode);
	/* With *count 0 and infos NULL it only counts (nvml.h says so), so
	 * the layout of nvmlProcessInfo_t, which changed between versions,
	 * is not needed. */
	nv_return (*DeviceGetMPSComputeRunningProcesses_v3)(nv_device dev, unsigned *count, void *infos);
	/* Optional too: what names the GPU in a container (its device node's
	 * minor number, its MIG devices' UUIDs). */
	nv_return (*DeviceGetMinorNumber)(nv_device dev, unsigned *minor);
	nv_return (*DeviceGetMigMode)(nv_device dev, unsigned *current, unsigned *pending);
	nv_return (*DeviceGetMaxMigDeviceCount)(nv_device dev, unsigned *count);
	nv_return (*DeviceGetMigDeviceHandleByIndex)(nv_device dev, unsigned index, nv_device *mig);
};

/* ---- State ------------------------------------------------------------------ */

/* How long NVML's event wait blocks before the thread looks at its stop
 * flag, and how often the counters are read. */
#define NVML_WAIT_MS 100
#define NVML_REFRESH_MS 1000
/* A context fault found within this long after an XID names the XID. */
#define XID_NEARBY_MS 2000

struct cuda_health {
	struct cuda_dev *cd;
	unsigned period_ms;

	pthread_mutex_t lock;
	pthread_cond_t cond;           /* CLOCK_MONOTONIC */
	bool stop;
	bool paused;                   /* a reset is under way */
	bool busy;                     /* the checker is inside a CUDA call */
	bool checker_running, nvml_running;
	pthread_t checker, nvml_thread;
	struct rd_health info;         /* under lock */
	uint64_t last_xid_mono_ms;

	void *lib;
	struct nv_api nv;
	nv_device nvdev;
	nv_event_set events;
};

static uint64_t mono_ms(void)
{
	return rd_now_ns() / 1000000u;
}

static void set_detail(struct cuda_health *h, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static void set_detail(struct cuda_health *h, const char *fmt, ...)
{
	va_list ap;
	pthread_mutex_lock(&h->lock);
	va_start(ap, fmt);
	vsnprintf(h->info.detail, sizeof(h->info.detail), fmt, ap);
	va_end(ap);
	pthread_mutex_unlock(&h->lock);
}

static void wait_period(struct cuda_health *h, unsigned ms)
{
	struct timespec until;
	clock_gettime(CLOCK_MONOTONIC, &until);
	until.tv_nsec += (long)ms * 1000000L;
	until.tv_sec += until.tv_nsec / 1000000000L;
	until.tv_nsec %= 1000000000L;
	pthread_cond_timedwait(&h->cond, &h->lock, &until);
}

/* ---- The context check -------------------------------------------------------- */

static void context_fault(struct cuda_health *h, cudaError_t e)
{
	char reason[256];
	int n = snprintf(reason, sizeof(reason), "health watch: the context reports %s (%s)", cudaGetErrorString(e),
			 cudaGetErrorName(e));
	pthread_mutex_lock(&h->lock);
	if (h->info.last_xid && mono_ms() - h->last_xid_mono_ms <= XID_NEARBY_MS && n > 0 && (size_t)n < sizeof(reason))
		snprintf(reason + n, sizeof(reason) - (size_t)n, " after XID %u: %s", h->info.last_xid,
			 h->info.last_xid_text);
	pthread_mutex_unlock(&h->lock);
	cuda_mark_lost(h->cd, reason);
}

static void *checker_main(void *arg)
{
	struct cuda_health *h = arg;
	struct cuda_dev *cd = h->cd;
	bool bound = false;

	pthread_mutex_lock(&h->lock);
	while (!h->stop) {
		wait_period(h, h->period_ms);
		if (h->stop)
			break;
		if (h->paused || atomic_load(&cd->lost))
			continue;
		h->busy = true;
		pthread_mutex_unlock(&h->lock);
		/* Bound once: a reset makes the device's primary context
		 * again, and the binding stays. */
		cudaError_t e = bound ? cudaSuccess : cudaSetDevice(cd->dev->index);
		if (e == cudaSuccess) {
			bound = true;
			e = cuda_context_check();
		}
		if (cuda_error_is_sticky(e))
			context_fault(h, e);
		pthread_mutex_lock(&h->lock);
		h->busy = false;
		pthread_cond_broadcast(&h->cond);
	}
	pthread_mutex_unlock(&h->lock);
	return NULL;
}

void cuda_health_pause(struct cuda_dev *cd)
{
	struct cuda_health *h = cd->health;
	if (!h)
		return;
	pthread_mutex_lock(&h->lock);
	h->paused = true;
	while (h->busy)
		pthread_cond_wait(&h->cond, &h->lock);
	pthread_mutex_unlock(&h->lock);
}

void cuda_health_resume(struct cuda_dev *cd)
{
	struct cuda_health *h = cd->health;
	if (!h)
		return;
	pthread_mutex_lock(&h->lock);
	h->paused = false;
	pthread_mutex_unlock(&h->lock);
}

/* ---- NVML ------------------------------------------------------------------------ */

static const char *nv_error(struct cuda_health *h, nv_return r)
{
	const char *s = h->nv.ErrorString ? h->nv.ErrorString(r) : NULL;
	return s ? s : "unknown NVML error";
}

/* NVML says the GPU itself is gone or needs a reset: no new context helps. */
static bool nv_gpu_failed(struct cuda_health *h, nv_return r, const char *what)
{
	char reason[192];
	if (r != NV_ERROR_GPU_IS_LOST && r != NV_ERROR_RESET_REQUIRED)
		return false;
	snprintf(reason, sizeof(reason), "NVML %s: %s (%s)", what, nv_error(h, r),
		 r == NV_ERROR_GPU_IS_LOST ? "the GPU fell off the bus" : "the GPU needs a reset");
	cuda_report_fault(h->cd, RD_FAULT_FAILED, reason);
	return true;
}

static int nvml_load(struct cuda_health *h, char *why, size_t size)
{
	static const struct {
		const char *name;
		size_t offset;
	} fns[] = {
#define FN(x) { "nvml" #x, offsetof(struct nv_api, x) }
		FN(Init_v2), FN(Shutdown), FN(ErrorString), FN(DeviceGetHandleByPciBusId_v2), FN(DeviceGetUUID),
		FN(DeviceGetTotalEccErrors), FN(DeviceGetRetiredPagesPendingStatus), FN(DeviceGetRemappedRows),
		FN(DeviceGetSupportedEventTypes), FN(EventSetCreate), FN(DeviceRegisterEvents), FN(EventSetWait_v2),
		FN(EventSetFree),
#undef FN
	};
	h->lib = dlopen("libnvidia-ml.so.1", RTLD_NOW | RTLD_LOCAL);
	if (!h->lib) {
		snprintf(why, size, "%s", dlerror());
		return -ENOENT;
	}
	for (size_t i = 0; i < sizeof(fns) / sizeof(fns[0]); i++) {
		void *p = dlsym(h->lib, fns[i].name);
		if (!p) {
			snprintf(why, size, "libnvidia-ml.so.1 has no %s", fns[i].name);
			dlclose(h->lib);
			h->lib = NULL;
			return -ENOENT;
		}
		memcpy((char *)&h->nv + fns[i].offset, &p, sizeof(p));
	}
	/* Optional ones stay NULL where this NVML lacks them. */
	void *p = dlsym(h->lib, "nvmlDeviceGetComputeMode");
	memcpy(&h->nv.DeviceGetComputeMode, &p, sizeof(p));
	p = dlsym(h->lib, "nvmlDeviceGetMPSComputeRunningProcesses_v3");
	memcpy(&h->nv.DeviceGetMPSComputeRunningProcesses_v3, &p, sizeof(p));
	p = dlsym(h->lib, "nvmlDeviceGetMinorNumber");
	memcpy(&h->nv.DeviceGetMinorNumber, &p, sizeof(p));
	p = dlsym(h->lib, "nvmlDeviceGetMigMode");
	memcpy(&h->nv.DeviceGetMigMode, &p, sizeof(p));
	p = dlsym(h->lib, "nvmlDeviceGetMaxMigDeviceCount");
	memcpy(&h->nv.DeviceGetMaxMigDeviceCount, &p, sizeof(p));
	p = dlsym(h->lib, "nvmlDeviceGetMigDeviceHandleByIndex");
	memcpy(&h->nv.DeviceGetMigDeviceHandleByIndex, &p, sizeof(p));
	nv_return r = h->nv.Init_v2();
	if (r != NV_SUCCESS) {
		snprintf(why, size, "nvmlInit: %s", nv_error(h, r));
		dlclose(h->lib);
		h->lib = NULL;
		return -EIO;
	}
	return 0;
}

static void nvml_unload(struct cuda_health *h)
{
	if (!h->lib)
		return;
	if (h->events)
		h->nv.EventSetFree(h->events);
	h->events = NULL;
	h->nv.Shutdown();
	/* Not dlclose'd: NVML's own threads may outlive Shutdown briefly. */
	h->lib = NULL;
}

/* NVML's view of how the GPU is shared: its compute mode, and the MPS
 * clients it counts (the worker among them when it is one). Left unknown
 * where NVML cannot say. */
static void nvml_sharing(struct cuda_health *h)
{
	static const char *const modes[] = { "default", "exclusive_thread", "prohibited", "exclusive_process" };
	int mode = -1;
	unsigned count = 0;
	int64_t clients = -1;

	if (h->nv.DeviceGetComputeMode && h->nv.DeviceGetComputeMode(h->nvdev, &mode) != NV_SUCCESS)
		mode = -1;
	if (h->nv.DeviceGetMPSComputeRunningProcesses_v3) {
		nv_return r = h->nv.DeviceGetMPSComputeRunningProcesses_v3(h->nvdev, &count, NULL);
		if (r == NV_SUCCESS)
			clients = 0;
		else if (r == NV_ERROR_INSUFFICIENT_SIZE)
			clients = count;
	}
	pthread_mutex_lock(&h->lock);
	snprintf(h->info.sharing.compute_mode, sizeof(h->info.sharing.compute_mode), "%s",
		 mode >= 0 && (size_t)mode < sizeof(modes) / sizeof(modes[0]) ? modes[mode] : "");
	h->info.sharing.mps_clients = clients;
	pthread_mutex_unlock(&h->lock);
}

/* The counters Status shows. */
static void nvml_refresh(struct cuda_health *h)
{
	unsigned long long vol = 0, agg = 0;
	int pages = 0;
	unsigned corr = 0, unc = 0, pending = 0, failed = 0;
	nv_return rv = h->nv.DeviceGetTotalEccErrors(h->nvdev, NV_MEMORY_ERROR_UNCORRECTED, NV_ECC_VOLATILE, &vol);
	nv_return ra = h->nv.DeviceGetTotalEccErrors(h->nvdev, NV_MEMORY_ERROR_UNCORRECTED, NV_ECC_AGGREGATE, &agg);
	nv_return rp = h->nv.DeviceGetRetiredPagesPendingStatus(h->nvdev, &pages);
	nv_return rr = h->nv.DeviceGetRemappedRows(h->nvdev, &corr, &unc, &pending, &failed);
	if (nv_gpu_failed(h, rv, "ECC counts") || nv_gpu_failed(h, rp, "page retirement") ||
	    nv_gpu_failed(h, rr, "row remapping"))
		return;
	pthread_mutex_lock(&h->lock);
	h->info.ecc_dbe_volatile = rv == NV_SUCCESS ? (int64_t)vol : -1;
	h->info.ecc_dbe_aggregate = ra == NV_SUCCESS ? (int64_t)agg : -1;
	h->info.retired_pages_pending = rp == NV_SUCCESS ? pages != 0 : -1;
	h->info.remap_pending = rr == NV_SUCCESS ? pending != 0 : -1;
	h->info.remap_failed = rr == NV_SUCCESS ? failed != 0 : -1;
	pthread_mutex_unlock(&h->lock);
	if (rr == NV_SUCCESS && failed)
		cuda_report_fault(h->cd, RD_FAULT_FAILED, "NVML: a row remapping failed; the GPU needs service");
	nvml_sharing(h);
}

static void nvml_event(struct cuda_health *h, const struct nv_event_data *ev)
{
	char reason[192];
	enum rd_fault_kind kind;

	if (ev->event_type & NV_EVENT_XID_CRITICAL) {
		const struct rd_xid *x = rd_xid_lookup((unsigned)ev->event_data);
		pthread_mutex_lock(&h->lock);
		rd_health_note_xid(&h->info, x, reason, sizeof(reason));
		h->last_xid_mono_ms = mono_ms();
		pthread_mutex_unlock(&h->lock);
		fprintf(stderr, "regend: cuda: device %d: %s\n", h->cd->dev->index, reason);
		if (rd_xid_is_fault(x, &kind))
			cuda_report_fault(h->cd, kind, reason);
	}
	if (ev->event_type & NV_EVENT_DOUBLE_BIT_ECC) {
		cuda_report_fault(h->cd, RD_FAULT_LOST, "NVML: double-bit ECC error");
		nvml_refresh(h);
	}
}

/* What a container sees of the GPU, for `regenctl restart --job` in one:
 * its device node's minor number (CDI gives a container /dev/nvidia<minor>)
 * and, with MIG on, its MIG devices' UUIDs (the device plugin names MIG
 * devices). Left unknown where this NVML cannot say. */
static void nvml_names(struct cuda_health *h)
{
	unsigned minor = 0, current = 0, pending = 0, max = 0;
	bool has_minor = h->nv.DeviceGetMinorNumber && h->nv.DeviceGetMinorNumber(h->nvdev, &minor) == NV_SUCCESS;
	char mig[RP_MIG_DEVICES_MAX][96];
	unsigned nmig = 0;

	if (h->nv.DeviceGetMigMode && h->nv.DeviceGetMaxMigDeviceCount && h->nv.DeviceGetMigDeviceHandleByIndex &&
	    h->nv.DeviceGetMigMode(h->nvdev, &current, &pending) == NV_SUCCESS && current == 1 &&
	    h->nv.DeviceGetMaxMigDeviceCount(h->nvdev, &max) == NV_SUCCESS) {
		for (unsigned i = 0; i < max && nmig < RP_MIG_DEVICES_MAX; i++) {
			nv_device m;

			/* An index without a MIG device answers NOT_FOUND: skipped. */
			if (h->nv.DeviceGetMigDeviceHandleByIndex(h->nvdev, i, &m) == NV_SUCCESS &&
			    h->nv.DeviceGetUUID(m, mig[nmig], sizeof(mig[nmig])) == NV_SUCCESS && mig[nmig][0])
				nmig++;
		}
	}
	pthread_mutex_lock(&h->lock);
	h->info.minor_number = has_minor ? (int)minor : -1;
	h->info.nmig = nmig;
	memcpy(h->info.mig_devices, mig, sizeof(mig[0]) * nmig);
	pthread_mutex_unlock(&h->lock);
}

/* Finds the device NVML's way (by PCI bus id: NVML's indices need not be
 * CUDA's) and subscribes to its events. */
static int nvml_attach(struct cuda_health *h, char *why, size_t size)
{
	char bus[32];
	pthread_mutex_lock(&h->lock);
	snprintf(bus, sizeof(bus), "%s", h->info.pci_bus_id);
	pthread_mutex_unlock(&h->lock);
	nv_return r = h->nv.DeviceGetHandleByPciBusId_v2(bus, &h->nvdev);
	if (r != NV_SUCCESS) {
		nv_gpu_failed(h, r, "device lookup");
		snprintf(why, size, "no NVML device at PCI %s: %s", bus, nv_error(h, r));
		return -ENODEV;
	}
	char uuid[96] = "";
	if (h->nv.DeviceGetUUID(h->nvdev, uuid, sizeof(uuid)) == NV_SUCCESS && uuid[0]) {
		pthread_mutex_lock(&h->lock);
		snprintf(h->info.uuid, sizeof(h->info.uuid), "%s", uuid);
		pthread_mutex_unlock(&h->lock);
	}
	nvml_names(h);
	unsigned long long supported = 0, want = NV_EVENT_XID_CRITICAL | NV_EVENT_DOUBLE_BIT_ECC;
	r = h->nv.DeviceGetSupportedEventTypes(h->nvdev, &supported);
	if (r == NV_SUCCESS)
		r = h->nv.EventSetCreate(&h->events);
	if (r == NV_SUCCESS && (supported & want))
		r = h->nv.DeviceRegisterEvents(h->nvdev, supported & want, h->events);
	if (r != NV_SUCCESS || !(supported & NV_EVENT_XID_CRITICAL)) {
		/* Counters still work (containers often refuse events). */
		snprintf(why, size, "no XID events: %s", r != NV_SUCCESS ? nv_error(h, r) : "not supported");
		if (h->events)
			h->nv.EventSetFree(h->events);
		h->events = NULL;
	}
	return 0;
}

static void *nvml_main(void *arg)
{
	struct cuda_health *h = arg;
	char why[128] = "";
	uint64_t next_refresh = 0;

	if (nvml_load(h, why, sizeof(why)) < 0 || nvml_attach(h, why, sizeof(why)) < 0) {
		pthread_mutex_lock(&h->lock);
		snprintf(h->info.source, sizeof(h->info.source), "unavailable");
		snprintf(h->info.detail, sizeof(h->info.detail), "%s", why);
		pthread_mutex_unlock(&h->lock);
		nvml_unload(h);
		return NULL;
	}
	pthread_mutex_lock(&h->lock);
	snprintf(h->info.source, sizeof(h->info.source), "nvml");
	snprintf(h->info.detail, sizeof(h->info.detail), "%s", why);
	pthread_mutex_unlock(&h->lock);
	for (;;) {
		pthread_mutex_lock(&h->lock);
		bool stop = h->stop;
		if (!stop && !h->events)
			wait_period(h, NVML_WAIT_MS);
		stop = h->stop;
		pthread_mutex_unlock(&h->lock);
		if (stop)
			break;
		if (h->events) {
			struct nv_event_data ev;
			memset(&ev, 0, sizeof(ev));
			nv_return r = h->nv.EventSetWait_v2(h->events, &ev, NVML_WAIT_MS);
			if (r == NV_SUCCESS)
				nvml_event(h, &ev);
			else if (r != NV_ERROR_TIMEOUT && nv_gpu_failed(h, r, "event wait"))
				break;
		}
		if (mono_ms() >= next_refresh) {
			nvml_refresh(h);
			next_refresh = mono_ms() + NVML_REFRESH_MS;
		}
	}
	nvml_unload(h);
	return NULL;
}

/* ---- Sharing ------------------------------------------------------------------------ */

/* Whether the context the driver made for the worker is an MPS client:
 * asked of the context itself, since CUDA joins an MPS control daemon it
 * finds (CUDA_MPS_PIPE_DIRECTORY, else /tmp/nvidia-mps) and runs without
 * one, silently, when none answers. */
static void sharing_open(struct rd_sharing *s, int index)
{
	const char *pipe = getenv("CUDA_MPS_PIPE_DIRECTORY");
	int enabled = 0;
	cudaError_t e = cudaDeviceGetAttribute(&enabled, cudaDevAttrMpsEnabled, index);

	s->known = true;
	s->mps = e == cudaSuccess && enabled;
	if (e != cudaSuccess)
		snprintf(s->reason, sizeof(s->reason),
			 "CUDA cannot say whether the context is an MPS client (%s); taken as isolated",
			 cudaGetErrorString(e));
	else if (s->mps)
		snprintf(s->reason, sizeof(s->reason),
			 "MPS client: context switches between the ranks and the worker are cheap, but a fatal fault in "
			 "any MPS client of this GPU (a rank or the worker) reaches every client: no isolation");
	else if (pipe && *pipe)
		snprintf(s->reason, sizeof(s->reason),
			 "isolated, although CUDA_MPS_PIPE_DIRECTORY=%.80s is set: no MPS control daemon of this "
			 "user answered there, so CUDA made a context of its own",
			 pipe);
	else
		snprintf(s->reason, sizeof(s->reason),
			 "isolated: the worker's context is its own, time-sliced with the ranks'; a fatal fault stays "
			 "in the context that took it");
	cudaGetLastError();
}

/* ---- The backend's hooks ------------------------------------------------------------ */

int cuda_health_open(struct cuda_dev *cd)
{
	struct cuda_health *h = calloc(1, sizeof(*h));
	if (!h)
		return -ENOMEM;
	h->cd = cd;
	pthread_mutex_init(&h->lock, NULL);
	pthread_condattr_t ca;
	pthread_condattr_init(&ca);
	pthread_condattr_setclock(&ca, CLOCK_MONOTONIC);
	pthread_cond_init(&h->cond, &ca);
	pthread_condattr_destroy(&ca);
	rd_health_unknown(&h->info);
	snprintf(h->info.detail, sizeof(h->info.detail), "the health watch has not started");
	/* What CUDA knows needs no NVML. */
	cudaDeviceGetPCIBusId(h->info.pci_bus_id, sizeof(h->info.pci_bus_id), cd->dev->index);
	struct cudaDeviceProp prop;
	if (cudaGetDeviceProperties(&prop, cd->dev->index) == cudaSuccess) {
		const unsigned char *u = (const unsigned char *)prop.uuid.bytes;
		snprintf(h->info.uuid, sizeof(h->info.uuid),
			 "GPU-%02x%02x%02x%02x-%02x%02x-%02x%02x-%02x%02x-%02x%02x%02x%02x%02x%02x", u[0], u[1], u[2],
			 u[3], u[4], u[5], u[6], u[7], u[8], u[9], u[10], u[11], u[12], u[13], u[14], u[15]);
	}
	cudaGetLastError();
	/* The context exists by now (cuda_open made it). */
	sharing_open(&h->info.sharing, cd->dev->index);
	cd->health = h;
	return 0;
}

void cuda_health_close(struct cuda_dev *cd)
{
	struct cuda_health *h = cd->health;
	if (!h)
		return;
	cuda_health_stop(cd->dev);
	pthread_cond_destroy(&h->cond);
	pthread_mutex_destroy(&h->lock);
	free(h);
	cd->health = NULL;
}

int cuda_health_start(struct rd_device *dev, unsigned period_ms, struct rp_error *err)
{
	struct cuda_health *h = cuda_dev_of(dev)->health;
	if (!h) {
		rp_error_set(err, RP_ERR_BACKEND, "no health state");
		return -EIO;
	}
	if (h->checker_running)
		return 0;
	h->period_ms = period_ms ? period_ms : 5;
	h->stop = false;
	int r = pthread_create(&h->checker, NULL, checker_main, h);
	if (r) {
		rp_error_set(err, RP_ERR_BACKEND, "cannot start the context check: %s", strerror(r));
		return -EIO;
	}
	h->checker_running = true;
	set_detail(h, "NVML is being loaded");
	/* NVML is optional: without its thread the context check still runs. */
	if (!cuda_dev_of(dev)->tuning.nvml) {
		set_detail(h, "nvml = false in regend's options");
	} else if ((r = pthread_create(&h->nvml_thread, NULL, nvml_main, h)) == 0) {
		h->nvml_running = true;
	} else {
		set_detail(h, "cannot start the NVML thread: %s", strerror(r));
	}
	return 0;
}

void cuda_health_stop(struct rd_device *dev)
{
	struct cuda_dev *cd = cuda_dev_of(dev);
	struct cuda_health *h = cd ? cd->health : NULL;
	if (!h || (!h->checker_running && !h->nvml_running))
		return;
	pthread_mutex_lock(&h->lock);
	h->stop = true;
	pthread_cond_broadcast(&h->cond);
	pthread_mutex_unlock(&h->lock);
	if (h->checker_running)
		pthread_join(h->checker, NULL);
	if (h->nvml_running)
		pthread_join(h->nvml_thread, NULL);
	h->checker_running = h->nvml_running = false;
}

void cuda_health_info(struct rd_device *dev, struct rd_health *out)
{
	struct cuda_health *h = cuda_dev_of(dev)->health;
	if (!h) {
		rd_health_unknown(out);
		return;
	}
	pthread_mutex_lock(&h->lock);
	*out = h->info;
	pthread_mutex_unlock(&h->lock);
}
