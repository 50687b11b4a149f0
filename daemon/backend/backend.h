/* SPDX-License-Identifier: Apache-2.0 */
/* The ops table through which the worker core drives a backend (host or
 * cuda). The core knows nothing else about a backend; only daemon/backend/cuda/
 * include CUDA headers. */
#pragma once

#include <stdbool.h>
#include <stdint.h>
#include <sys/types.h>
#include <time.h>
#include "regen-config.h"
#include "proto/compute.h"
#include "proto/device.h"
#include "proto/program.h"
#include "proto/ids.h"
#include "proto/message.h"
#include "daemon/registry.h"

struct rd_compile_account;

struct rd_device;
struct rd_lane;
struct rd_op;
struct rd_options;

/* RD_BUFFER_LOCAL: memory the worker process allocated itself (tests). */
enum rd_buffer_kind { RD_BUFFER_HOST_FD = 0, RD_BUFFER_CUDA_IPC, RD_BUFFER_CUDA_FD, RD_BUFFER_LOCAL };

/* What the core keeps of an id it handed out (a buffer or an event, told
 * apart by id.kind): its owner, its place in the id table, and the calls
 * in flight that use it (a close waits for them). Backends leave it alone. */
struct rd_client;
struct rd_usage;

struct rd_object {
	struct rp_id id;
	struct rd_client *owner;        /* the process that imported it; NULL once closed */
	struct rd_usage *usage;         /* the job it counts in (worker/usage.h); NULL: none */
	struct rd_object *next_in_table;
	unsigned core_refs;
	bool closing;
};

/* A client's memory mapped into the worker. The backend allocates the
 * struct (embedding this one first), registers `res` with the device's
 * registry; the core fills obj. */
struct rd_buffer {
	struct rd_resource res;
	struct rd_device *device;
	struct rd_object obj;
	enum rd_buffer_kind kind;
	uint64_t size;
	/* ImportBuffer's offset: where the buffer starts in the memory it was
	 * imported from (set by the worker). That memory starts at least 256
	 * bytes aligned (an allocation, a VMM mapping, a page), so an element
	 * is aligned in memory as offset + its offset in the buffer is. */
	uint64_t offset;
	/* Address operands are offset from: host pointer (host backend) or
	 * device pointer (cuda). NULL while the mapping is released. */
	void *ptr;
};

struct rd_import {
	enum rd_buffer_kind kind;
	uint64_t size;
	uint64_t offset;
	int fd;                      /* host_fd / cuda_fd: owned by the backend after a successful import */
	unsigned char handle[64];    /* cuda_ipc */
};

/* A client's event (cudaIpcEventHandle_t) opened in the worker. */
struct rd_event {
	struct rd_resource res;
	struct rd_device *device;
	struct rd_object obj;
};

/* A communicator (io.regen.Comm): one rank of one NCCL communicator (on
 * the host backend, of a group of connections to this worker). The backend
 * allocates the struct (embedding this one first) and registers `res`,
 * whose release finalizes and destroys a healthy communicator (bounded:
 * peers that do not finalize get it aborted) and whose invalidate aborts it
 * (ncclCommAbort: safe when the context or the peers are gone). The core
 * fills obj and its own fields, on the loop thread. */
struct rd_comm {
	struct rd_resource res;
	struct rd_device *device;
	struct rd_object obj;
	uint32_t rank, nranks;
	/* The core's. */
	bool joined;                 /* Init completed */
	unsigned in_flight;          /* calls on it submitted and not finished */
	uint64_t collectives;        /* collectives it was handed */
	bool has_key;
	char key[129];
	uid_t key_uid;               /* whose it is: its ranks' uid, who may Attach */
	unsigned char unique_id[RP_COMM_ID_SIZE];  /* the id its Init named (daemon/comm_owners.h) */
};

/* A program (io.regen.Program, proto/program.h) as a backend keeps it:
 * made at Define from the checked definition, destroyed at Drop (or when
 * its owner went) with no Run in flight. What it compiles or captures for
 * a generation (the CUDA backend's fused modules, scratch, graph execs) is
 * the backend's, as registry resources of the device: released by
 * Release, forgotten by a reset, made again on the next Run. The backend
 * allocates the struct (embedding this one first); the core reads the
 * counters for Status. */
struct rd_program {
	struct rd_device *device;
	struct rd_object obj;           /* the core's: its id and owner */
	/* The checked definition: the core's, freed by the core after
	 * program_destroy. */
	struct rp_program *def;
	/* Counters, written by the backend's thread that runs the program,
	 * read by the loop thread for Status (a torn read of a counter is
	 * tolerable there). */
	uint64_t runs;                  /* Runs finished */
	uint64_t run_us;                /* their time in the backend, summed */
	uint64_t launch_ns;             /* CPU time the backend spent launching them, summed */
	uint64_t scratch_bytes;         /* device (or host) memory held for it now */
	uint64_t modules;               /* compiled modules it holds now */
	uint64_t kernels;               /* launches one Run makes (fused kernels and library calls) */
	uint64_t graph_captures;        /* captures (a generation's first Run, a new binding of a library's operand) */
	uint64_t graph_launches;        /* Runs launched as one graph */
	uint64_t stream_runs;           /* Runs launched node by node on the stream */
	/* Retries of Runs with a journal (proto/program_journal.h): those
	 * that found their Run applied whole, those that put the inouts back
	 * from the journal before running again, and those refused as torn
	 * (a marks journal's Run cut after it began). */
	uint64_t retries_applied, retries_restored, retries_torn;
	char not_captured[400];         /* why Runs are not captured ("" when they are, or nothing was tried) */
	/* What compiling its kernels is charged to: its owner's uid's account
	 * on this device (daemon/program/compile_budget.h), the core's, set
	 * before its first Run; NULL: nothing charged. A backend that compiles
	 * charges NVRTC's time and the images it keeps, and counts them: */
	struct rd_compile_account *compile;
	uint64_t compile_us;            /* compiling its kernels took, in this worker */
	uint64_t module_bytes;          /* compiled kernels it holds now */
};

/* A Run's bindings, resolved and checked by the core: by the program's
 * bind_index (proto/program.h), the buffer and the byte offset of each
 * input, output and inout (NULL for a scalar), and each scalar's value. */
struct rd_program_run {
	struct rd_program *prog;
	int nbound;
	struct rd_buffer **buffers;
	uint64_t *offsets;
	double *scalars;
	/* A Run with a journal (proto/program_journal.h): the rank's memory
	 * where the Run marks its progress (and, in mode copy, saves the
	 * inouts before they are written), its mode, the Run's seq, and
	 * whether it retries a Run a fault interrupted. NULL: none. */
	struct rd_buffer *journal;
	uint64_t journal_offset;
	enum rp_prog_journal_mode journal_mode;
	uint64_t seq;
	bool retry;
	/* Set by the backend: the retry found the Run applied already, and
	 * ran nothing. */
	bool already_done;
	/* The backend's: where the Run's kernels report a bad index (the
	 * cuda backend's struct rd_prog_fault). */
	void *fault;
};

/* One compute call in flight. The core fills it and calls submit; the
 * backend finishes it with rd_op_complete() from any thread. */
struct rd_op {
	/* What to run: compute.spec->id picks the kernel; operands and
	 * buffers[] are indexed by the op's slots (proto/compute.h). */
	struct rp_compute compute;
	struct rd_buffer *buffers[RP_OP_OPERANDS_MAX];  /* resolved, bounds-checked; NULL for absent optional operands */
	struct rd_event *wait_event, *signal_event;
	struct rd_lane *lane;
	/* io.regen.Comm's work (compute.spec->id RP_OP_COMM, compute.comm.kind
	 * saying which: Init, Destroy or a collective): the communicator. */
	struct rd_comm *comm;
	/* io.regen.Program.Run's work (compute.spec->id RP_OP_PROGRAM). */
	struct rd_program_run *run;

	/* Result, set by the backend before rd_op_complete(). */
	struct rp_error err;       /* err.name == NULL: success */
	uint64_t elapsed_us;
	/* rd_now_ns() when its work was handed to the device and when it was
	 * found finished (0: never got there); a ring reports them. Atomic:
	 * a call answered early (its deadline passed) reads launched_ns on
	 * the loop thread while the backend's may be writing it. */
	_Atomic uint64_t launched_ns;
	uint64_t finished_ns;

	/* Core's use. */
	void (*done)(struct rd_op *op);
	/* Optional: called on the completing thread as the op is handed back,
	 * before the loop thread's done (a ring publishes its completion from
	 * there: one thread hand-off less). */
	void (*completed)(struct rd_op *op);
	/* Optional, for an op with a signal_event: called by the backend on
	 * its thread once the op's work and the signal_event's record are
	 * enqueued (launched_ns set), before anything of its completion: the
	 * caller may be answered then (io.regen.Compute: "with signal_event,
	 * a reply means the work is enqueued"); done still follows. */
	void (*launched)(struct rd_op *op);
	struct rd_op *launched_next;   /* the core's list of launched ops */
	void *userdata;
	struct rd_op *next;
	uint64_t submitted_ns;
	uint64_t work_ns;          /* the backend's estimate of its work while it waits or runs (host) */
};

/* CLOCK_MONOTONIC in nanoseconds: comparable across the processes of the
 * machine (a ring's client reads the worker's stage times). */
static inline uint64_t rd_now_ns(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (uint64_t)ts.tv_sec * 1000000000u + (uint64_t)ts.tv_nsec;
}

/* Any thread: hands the finished op back to the worker's loop thread, which
 * calls op->done there (see rd_device.post_completion). */
static inline void rd_op_complete(struct rd_op *op);

/* A lane: one connection's ordered queue of work (a CUDA stream on the cuda
 * backend). Backends embed it and register `res`. */
struct rd_lane {
	struct rd_resource res;
	struct rd_device *device;
	unsigned index;
	uid_t uid;      /* whose calls it runs: a backend shares its device among uids by it */
};

/* What a backend found wrong with its device, from any thread. */
enum rd_fault_kind {
	/* The context is lost (a sticky error on any path, a critical XID):
	 * new work fails with DeviceLost until a reset or a respawn. */
	RD_FAULT_LOST = 0,
	/* A call passed its deadline (the core finds these). */
	RD_FAULT_HUNG,
	/* The GPU itself needs a reset or fell off the bus: no new context
	 * helps, so respawning onto it in a loop would not either. */
	RD_FAULT_FAILED,
};

/* How the worker's context shares the GPU with other processes' contexts
 * (io.regen.Device.Sharing): its own, time-sliced with the ranks', or a
 * client of an MPS server, where context switches are cheap but a fatal
 * fault in any client reaches every client of the GPU. */
struct rd_sharing {
	bool known;                    /* false: the backend has not looked yet (Sharing is left out) */
	bool mps;                      /* the context is an MPS client (CUDA's MPS_ENABLED attribute) */
	char compute_mode[24];         /* NVML's: "default", "exclusive_process", ...; "" unknown */
	int64_t mps_clients;           /* NVML: MPS client processes on the GPU; -1 unknown */
	char reason[256];              /* what it means, in words */
};

/* A device's health as its backend sees it, for Status. Text fields are
 * empty and numbers -1 where unknown. */
struct rd_health {
	/* "nvml", "simulated" (the host backend), or "unavailable" (no NVML:
	 * CI, a machine without the driver's library), with why in `detail`. */
	char source[16];
	char detail[128];
	char uuid[96];
	char pci_bus_id[32];
	unsigned last_xid;             /* 0: none seen since the worker started */
	int64_t last_xid_unix_ms;      /* when it came (CLOCK_REALTIME) */
	char last_xid_text[96];        /* its meaning */
	int64_t ecc_dbe_volatile;      /* double-bit (uncorrected) ECC errors since the driver loaded */
	int64_t ecc_dbe_aggregate;     /* ... over the GPU's lifetime */
	int retired_pages_pending;     /* 1 yes, 0 no, -1 unknown: page retirement waits for a GPU reset */
	int remap_pending;             /* row remapping waits for a GPU reset */
	int remap_failed;              /* a row could not be remapped: the GPU needs service */
	int minor_number;              /* /dev/nvidia<minor_number>; -1 unknown */
	unsigned nmig;                 /* MIG devices (MIG on), their UUIDs */
	char mig_devices[RP_MIG_DEVICES_MAX][96];
	struct rd_sharing sharing;     /* not health, but known to the same code and copied with it */
};

/* Fills h with "unknown" everywhere (sharing too). */
void rd_health_unknown(struct rd_health *h);

struct rd_backend_ops {
	const char *name;
	/* Once per worker process, before any other op. Registers the device-level
	 * resources. 0 or -errno with err set. -ENOTSUP: the node's software
	 * cannot drive the device (a driver missing or older than the runtime,
	 * a GPU older than regen supports), which err's message names: the
	 * device is unsupported, not failed. */
	int (*open)(struct rd_device *dev, struct rp_error *err);
	/* Process exit: release everything still held. */
	void (*close)(struct rd_device *dev);

	int (*import_buffer)(struct rd_device *dev, struct rd_import *req, struct rd_buffer **out, struct rp_error *err);
	/* Unregisters (releasing the mapping) and frees. */
	void (*close_buffer)(struct rd_buffer *buf);
	/* Whether fd is an export of exactly `size` bytes of this device's
	 * memory, in the backend's kind (io.regen.Keep's cuda_fd), without
	 * keeping anything of it. NULL: the backend has no such memory. 0, or
	 * -errno with err set (io.regen.ImportFailed). */
	int (*check_export)(struct rd_device *dev, int fd, uint64_t size, struct rp_error *err);
	/* NULL when the backend has no events: ImportEvent answers MethodNotImplemented. */
	int (*import_event)(struct rd_device *dev, const unsigned char handle[64], struct rd_event **out, struct rp_error *err);
	void (*close_event)(struct rd_event *ev);
	/* Whether the work the event's last record stands for is done (a
	 * stream waiting on it goes on); any thread. NULL with import_event. */
	bool (*event_done)(struct rd_event *ev);
	/* The lane's client is gone and a call of its waits on its work that
	 * will never be done (daemon/worker/orphan.c): where the backend waits
	 * for client events on the host, the waiting call and every call after
	 * it on the lane fail with `why`, none launched, and 0; -ENOTSUP where
	 * a stream of the device waits on the event (only a new context ends
	 * that wait), or NULL. Loop thread. */
	int (*abandon_client_waits)(struct rd_lane *lane, const char *why);

	struct rd_lane *(*lane_create)(struct rd_device *dev, unsigned index, struct rp_error *err);
	/* Waits for the lane's queued work, unregisters, frees. */
	void (*lane_destroy)(struct rd_lane *lane);
	/* Queue the op on its lane. 0: rd_op_complete() will be called exactly
	 * once. -errno with op->err set: refused, no completion follows. */
	int (*submit)(struct rd_lane *lane, struct rd_op *op);

	/* Lifecycle, called by the core with no op in flight (drained) and after
	 * it walked the registry. release: CUDA usable, trim pools. reset: context
	 * lost; make the device usable again and prove it with a canary. 0 when the
	 * device is healthy afterwards. */
	int (*release)(struct rd_device *dev, struct rp_error *err);
	int (*reset)(struct rd_device *dev, struct rp_error *err);

	/* Communicators; NULL when the backend has none (io.regen.Comm then
	 * answers MethodNotImplemented). Init, Destroy and the collectives are
	 * ops submitted on the caller's lane (op->comm set); the backend fails
	 * them with io.regen.CommFailed when the communicator failed or was
	 * aborted, and ends a wait for peers when it is aborted. */
	int (*comm_unique_id)(struct rd_device *dev, unsigned char id[RP_COMM_ID_SIZE], struct rp_error *err);
	/* Makes (and registers) rank `rank` of `nranks` of the communicator
	 * `id` names, not joined yet: its Init op joins it. */
	int (*comm_create)(struct rd_device *dev, const unsigned char id[RP_COMM_ID_SIZE], uint32_t rank,
			   uint32_t nranks, struct rd_comm **out, struct rp_error *err);
	/* Any thread, never blocks on a peer: the communicator stops; its
	 * calls in flight and later ones fail, and its peers learn of it. */
	void (*comm_abort)(struct rd_comm *comm, const char *why);
	/* 0 when healthy; -EIO with io.regen.CommFailed {reason} when it
	 * failed (NCCL's asynchronous error) or was aborted. Cheap. */
	int (*comm_status)(struct rd_comm *comm, struct rp_error *err);
	/* No call in flight: unregisters (so a valid communicator is released)
	 * and frees. */
	void (*comm_close)(struct rd_comm *comm);

	/* Programs (io.regen.Program): made at Define, destroyed with no Run
	 * in flight; a Run is an op (RP_OP_PROGRAM) submitted on a lane like
	 * any other. 0 or -errno with err set (create). */
	int (*program_create)(struct rd_device *dev, const struct rp_program *def, struct rd_program **out,
			      struct rp_error *err);
	void (*program_destroy)(struct rd_program *prog);

	/* Bytes the backend holds now, and right after open. */
	void (*memory)(struct rd_device *dev, uint64_t *used, uint64_t *baseline);

	/* "device_lost", "hang", "xid:N" (a simulated XID N; the host backend
	 * only). The core handles "crash". -ENOTSUP when the backend cannot. */
	int (*inject_fault)(struct rd_device *dev, const char *kind, struct rp_error *err);

	/* The health watch: the backend's own thread looks at the context every
	 * period_ms without waiting for a call, and at the GPU's error events,
	 * and calls dev->on_fault with what it finds. Started once the worker
	 * serves; NULL when the backend has none. 0 or -errno with err set. */
	int (*health_start)(struct rd_device *dev, unsigned period_ms, struct rp_error *err);
	void (*health_stop)(struct rd_device *dev);
	/* What the backend knows of the device's health now (any time after
	 * open; cheap: a copy). */
	void (*health)(struct rd_device *dev, struct rd_health *out);
};

extern const struct rd_backend_ops rd_backend_host;

/* A backend built as a module (the CUDA one: only a CUDA worker maps its
 * libraries) exports one function of this type, rd_backend_<name>_entry,
 * which daemon/backend/load.c looks up. It returns the ops table, or NULL
 * when `version` (the loader's REGEN_VERSION) is not the module's. */
typedef const struct rd_backend_ops *rd_backend_entry_fn(const char *version);

/* The device a worker owns. */
struct rd_device {
	int index;
	const struct rd_backend_ops *backend;
	void *backend_data;
	struct rd_registry registry;
	_Atomic uint64_t generation;
	/* The most scratch one call may take, bytes (--max-scratch-mib): a
	 * call that needs more fails with io.regen.LimitExceeded {resource:
	 * "scratch"} before it takes any. */
	uint64_t max_scratch;
	/* regend's own call deadline (call_deadline_ms): a call still running
	 * this long after it was submitted makes the device hung. A backend
	 * that can tell a call would not finish in it refuses the call. 0: no
	 * deadline. */
	unsigned call_deadline_ms;
	/* GEMM plans a backend that caches them keeps at most (gemm_plans_max;
	 * 0: the backend's default), read at open. The CUDA backend's
	 * cuBLASLt plans; the host backend plans nothing. */
	unsigned gemm_plans_max;
	/* Where a backend that compiles kernels (the CUDA backend's NVRTC
	 * modules of programs) keeps them between processes (rtc_cache_dir);
	 * "": nowhere. Read at open. */
	char rtc_cache_dir[256];
	/* regend's options (daemon/options.h), for the backend's tuning ones
	 * (cuda_spin_us, nvml, ...), read at open; NULL where a test drives
	 * the backend itself: every option's default. */
	const struct rd_options *options;
	/* Set by whoever drives the device; a backend calls it (any thread) when
	 * it finds the context lost or the GPU failed: the core then fails new
	 * work with DeviceLost and reports the fault to the supervisor. */
	void (*on_fault)(struct rd_device *dev, enum rd_fault_kind kind, const char *reason);
	/* Set by whoever drives the device (the worker core, or a test): takes a
	 * finished op from any thread. */
	void (*post_completion)(struct rd_device *dev, struct rd_op *op);
	void *core;
};

static inline void rd_op_complete(struct rd_op *op)
{
	struct rd_device *dev = op->lane->device;
	dev->post_completion(dev, op);
}
