/* SPDX-License-Identifier: Apache-2.0 */
/* What the files of daemon/backend/cuda/ share: the device and lane structs,
 * the error mapping and the thread-local status of init callbacks, binding,
 * the driver entry points, and each file's functions that another calls.
 *
 * One worker process owns device dev->index through its primary context.
 * Every native object (lane streams, the cuBLASLt handle, GEMM plans, the
 * scratch pool, imported mappings, events) is a registry resource of
 * dev->registry.
 *
 * Who calls whom, downwards only (a layer calls the ones below it, never
 * one above; up the stack only through the pointers the core set, such as
 * rd_device.on_fault):
 *   backend.c   the ops table and the lifecycle hooks: calls the rest;
 *   lane.c      lanes: each call's enqueue function through
 *               cuda_dev.enqueue, then the completion hooks of comm.c and
 *               program.c, and scratch.c's kept blocks;
 *   gemm.c attention.c layernorm.c fp8.c comm.c program.c
 *               the operations: attention.c calls cudnn_graph.c, program.c
 *               rtc.c, gemm.c attention.c and layernorm.c scratch.c (a
 *               launch's phases are marked in the lane's own struct,
 *               cuda_launch_mark);
 *   health.c ipc.c device.c
 *               the context check and NVML (threads of their own), imports,
 *               device-level resources: for backend.c;
 *   cudnn_graph.c rtc.c (over rtc_compile.c: NVRTC) scratch.c, and
 *               common.c under everything.
 *
 * Faults: every failed path (an import, a lane, a plan or handle, an
 * allocation, a call's completion) ends in cuda_check_failure(), which
 * marks the device lost when the error is the context's, so a sticky error
 * starts the recovery wherever it shows first. */
#pragma once

#include <pthread.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <time.h>
#include "regen-config.h"
#include <cuda.h>
#include <cuda_runtime_api.h>
#include <cublasLt.h>
#include "daemon/backend/backend.h"
#include "daemon/backend/share.h"
#include "daemon/backend/plan_cache.h"
#include "daemon/backend/cuda/cuda.h"
#include "daemon/program/compile_budget.h"
#include "daemon/program/plan.h"

/* The scratch size the heuristic is asked with. */
#define RD_CUDA_WORKSPACE_BYTES ((size_t)32 << 20)

struct cuda_dev;
struct cuda_lane;

/* A resource with a CUDA state: what init last failed with. */
struct cuda_status {
	const char *name;     /* RP_ERR_* */
	char message[256];
	struct rp_error whole;   /* an error kept with its parameters (cuda_status_keep), else empty */
};

struct cuda_pool {
	struct rd_resource res;
	struct cuda_dev *cd;
	cudaMemPool_t pool;
};

struct cuda_handle {
	struct rd_resource res;
	struct cuda_dev *cd;
	cublasLtHandle_t lt;
};

/* One buffer every GEMM shares: -Ddebug_shared_workspace=true only. */
struct cuda_shared_ws {
	struct rd_resource res;
	struct cuda_dev *cd;
	void *ptr;
};

/* Fault injection: a stream for the kernels, an event lanes wait on, and
 * the host-mapped flag that ends a "hang". */
struct cuda_fault {
	struct rd_resource res;
	struct cuda_dev *cd;
	cudaStream_t stream;        /* hang */
	cudaStream_t lost_stream;   /* device_lost */
	cudaEvent_t event;
	int *flag_host;
	int *flag_dev;
};

/* Enqueues one operation's work on the lane's stream. 0 or -errno with
 * op->err set; nothing to wait for beyond the stream. */
typedef int cuda_enqueue_fn(struct cuda_lane *lane, struct rd_op *op);

/* The enqueue table is indexed by the op table's id (proto/compute.h),
 * io.regen.Comm's work (RP_OP_COMM) and io.regen.Program.Run's
 * (RP_OP_PROGRAM) last: here and in cuda_enqueue_of()
 * only, and filled by backend.c. */
#define CUDA_OP_KINDS (RP_OP_PROGRAM + 1)

struct cuda_gemm_plan;
struct cuda_mapping;
struct cuda_health;
struct cuda_attention;
struct cuda_comms;

struct cuda_dev {
	struct rd_device *dev;
	struct cuda_pool pool;
	struct cuda_handle handle;
	struct cuda_shared_ws shared_ws;
	struct cuda_fault fault;
	enum rd_cuda_algo_policy policy;
	/* Set at open: what each operation's enqueue function is. */
	cuda_enqueue_fn *const *enqueue;
	/* work.c: tensor-core multiply-adds a ns at the device's peak, twice
	 * over (read at open; 0: unknown). */
	double peak_macs_per_ns;
	/* The tuning options (rd_device.options, or their defaults where a
	 * test drives the backend itself), read at open. */
	struct cuda_tuning {
		uint64_t spin_ns;            /* cuda_spin_us */
		uint64_t share_alone_ns;     /* cuda_share_alone_us; UINT64_MAX: unbounded */
		bool wake_at_launch;         /* cuda_wake = launch */
		bool inline_launch;          /* cuda_inline_launch */
		bool host_client_waits;      /* cuda_client_wait = host */
		bool launch_profile;         /* cuda_launch_profile */
		int reset_retry_ms;          /* reset_retry_ms; -1: auto */
		unsigned attention_autotune; /* attention_autotune */
		bool program_gemm_slots;     /* program_gemm_slots */
		bool nvml;                   /* nvml */
	} tuning;

	/* gemm.c's plans: bounded (gemm_plans_max), hashed, LRU. */
	pthread_mutex_t plans_lock;
	struct rd_plan_cache plans;

	pthread_mutex_t maps_lock;
	struct cuda_mapping *maps;
	unsigned map_count;

	/* comm.c: the communicators and their watch, made on first use. */
	struct cuda_comms *comms;

	/* attention.c: the cuDNN handle and plans, made on first use. */
	_Atomic(struct cuda_attention *) attention;

	/* Bumped (and broadcast) by a host function each lane enqueues after a
	 * call: completers sleep on it instead of polling at a coarse period. */
	pthread_mutex_t done_lock;
	pthread_cond_t done_cond;
	uint64_t done_seq;

	/* Bumped when a fault kernel was enqueued; lanes whose seen value is
	 * older make their next op wait on fault.event first. */
	pthread_mutex_t fault_lock;
	uint64_t fault_seq;

	uint64_t baseline;
	/* health.c's: the context check and NVML. */
	struct cuda_health *health;
	/* Set once a sticky error was seen, until reset. */
	_Atomic bool lost;
	/* Calls submitted that wait on a client's event and have not
	 * completed (lane.c): while any does, no call is launched inline on
	 * the worker's loop (a kernel's first load waits for the context). */
	_Atomic unsigned client_waits;
	/* The GPU shared among uids, not lanes (../share.h): beside other
	 * uids' calls, a uid keeps at most its part of RD_CUDA_SHARE_CAPACITY
	 * calls launched and not completed; alone, as many as its lanes hold. */
	struct rd_share share;
	/* The GPU failed (needs a reset, fell off the bus): told even after
	 * the loss was. */
	_Atomic bool failed;
	/* Bumped when a reset starts: an op that began before it and fails
	 * afterwards does not mark the new context lost. */
	_Atomic uint64_t resets;
	/* Launches in progress on the device's lanes (lane.c): completers hold
	 * their event queries back meanwhile, since each query contends with
	 * the launch for the context's lock. */
	_Atomic unsigned launching;
	/* Device memory programs hold (program.c: arenas, argument blocks). */
	_Atomic uint64_t program_bytes;
};

/* Calls a lane may have launched and not yet seen complete. A rank that
 * queues a run of calls (regen.torch's transformer stack: 56 going forward,
 * about 130 back) waits for their launch, not their end ("events"): with 8 in
 * flight the launcher kept within 8 calls of the GPU, so the rank waited
 * for nearly all of the run's GPU work and could not queue its next one
 * meanwhile. Each call's scratch is freed stream-ordered at launch, so a
 * deeper lane holds no more device memory, only an event and a pending
 * entry per call. */
#define RD_CUDA_LANE_DEPTH 64
/* The calls in flight the GPU's share divides among the uids beside each
 * other (../share.h): two uids keep two each, one running on the GPU and
 * the next launched behind it, so that the GPU never waits for a launch
 * while they alternate; more uids, one each. */
#define RD_CUDA_SHARE_CAPACITY 4
/* How long a uid counts in it after its last call ended: its client's
 * next call comes a round trip later (tens of microseconds to a
 * millisecond; the worker's loop does not share a CPU with the GPU's
 * work). */
#define RD_CUDA_SHARE_LINGER_NS (2 * 1000000ull)

/* A lane's stream state; its threads and queue are lane.c's own. */
/* The phases of a launch that cuda_launch_profile times (a lane's
 * enqueue function marks its own with cuda_launch_mark). */
enum cuda_launch_phase {
	CUDA_PHASE_BIND,        /* refusal check, cudaSetDevice */
	CUDA_PHASE_PREPARE,     /* the lane's, buffers' and events' resources, waits */
	CUDA_PHASE_PLAN,        /* the op's plan (lookup, or building it) */
	CUDA_PHASE_SCRATCH,     /* the call's scratch allocation */
	CUDA_PHASE_KERNEL,      /* the library call that enqueues the work */
	CUDA_PHASE_FREE,        /* the scratch's stream-ordered free */
	CUDA_PHASE_RECORD,      /* signal and completion events */
	CUDA_LAUNCH_PHASES
};
static const char *const cuda_launch_phase_names[CUDA_LAUNCH_PHASES] = {
	"bind", "prepare", "plan", "scratch", "kernel", "free", "record",
};

struct cuda_lane {
	struct rd_lane base;
	struct cuda_dev *cd;
	cudaStream_t stream;
	/* cuda_client_wait = host: set (after abandoned_why) once the lane's
	 * client is gone with a call waiting on its work that will never be
	 * done; that call and every later one fail unlaunched. */
	atomic_bool abandoned;
	char abandoned_why[192];
	/* Waits for each call's completion event and then runs the host
	 * function that wakes the completer: on a stream of its own, since a
	 * host function in `stream` would stall the next call's kernels. */
	cudaStream_t notify;
	cudaEvent_t done[RD_CUDA_LANE_DEPTH];
	unsigned next_done;
	/* By done[] slot: where a program Run's kernels report a bad index
	 * (host memory the device maps; read once the call's event fired). */
	struct rd_prog_fault *faults, *faults_dev;
	uint64_t fault_seen;
	uint64_t op_resets;                /* cd->resets when the op being launched started */
	/* work.c: the least time of the calls submitted and not yet
	 * completed, ns. */
	_Atomic uint64_t backlog_ns;
	void *last_workspace;
	/* scratch.c: the block the lane's calls reuse while it is busy. */
	pthread_mutex_t scratch_lock;
	void *scratch_kept;
	size_t scratch_kept_bytes;
	uint64_t scratch_kept_allocs;
	/* While a program's steps are enqueued (program.c): the program's own
	 * workspace, which every call of those steps takes instead of the
	 * pool's, so that a captured graph holds no block of the lane's
	 * (seed 001: a graph's scratch is its own). NULL otherwise. */
	void *scratch_fixed;
	size_t scratch_fixed_bytes;
	size_t scratch_fixed_wanted;   /* what a call found scratch_fixed too small for */
	/* A program's steps are being captured into a graph: the enqueue
	 * functions do nothing that a capture cannot hold (timing a tuning
	 * candidate, noting a plan's use by an event queried later). */
	bool capturing;
	/* cuda_launch_profile: where a launch's time goes, summed over
	 * the lane's calls by the launching thread (one at a time) and
	 * printed when the lane goes. */
	struct cuda_launch_profile {
		uint64_t calls, slow, last_ns;
		uint64_t ns[CUDA_LAUNCH_PHASES];   /* sums over the calls counted */
		uint64_t cur[CUDA_LAUNCH_PHASES];  /* the launch under way */
		/* The completer's side, summed by it over the calls it waited
		 * for: from the launch's end to its wait's start (the hand-off),
		 * the wait itself, and the event queries the wait made. */
		uint64_t completions, handoff_ns, wait_ns, queries;
	} profile;
};

/* scratch.c: a call's scratch, the lane's kept block or (larger) its own. */
struct cuda_scratch {
	void *ptr;
	bool owned;   /* the call's own: given back to the pool after it */
};
/* `call` names the call in the error a failure sets ("GEMM"). */
int cuda_scratch_take(struct cuda_lane *l, size_t bytes, struct cuda_scratch *s, const char *call,
		      struct rp_error *err);
/* Stream-ordered after the call's work: enqueue it after that work. */
cudaError_t cuda_scratch_give(struct cuda_lane *l, struct cuda_scratch *s);
/* Gives the kept block back to the pool (stream-ordered): with no launch
 * on the lane under way, or from the lane's release. */
void cuda_scratch_drop_kept(struct cuda_lane *l);
/* The context went: the block went with it. */
void cuda_scratch_forget_kept(struct cuda_lane *l);

struct cuda_mapping {
	struct rd_resource res;
	struct cuda_dev *cd;
	enum rd_buffer_kind kind;
	unsigned char handle[64];          /* cuda_ipc */
	int fd;                            /* cuda_fd, owned */
	uint64_t want;                     /* cuda_fd: bytes to map (offset + size) */
	CUdeviceptr base;
	size_t size;                       /* bytes mapped (ipc: the allocation's) */
	CUmemGenericAllocationHandle alloc;
	unsigned refs;                     /* buffers on it, under cd->maps_lock */
	struct cuda_mapping *next;
};

struct cuda_buffer {
	struct rd_buffer base;
	struct cuda_dev *cd;
	struct cuda_mapping *map;          /* NULL for wrapped local memory */
	uint64_t offset;
	void *local;
};

struct cuda_event {
	struct rd_event base;
	struct cuda_dev *cd;
	cudaIpcEventHandle_t handle;
	cudaEvent_t ev;
};

static inline struct cuda_dev *cuda_dev_of(struct rd_device *dev)
{
	return dev->backend_data;
}

/* The enqueue function for op's kind, NULL for a kind the backend lacks. */
static inline cuda_enqueue_fn *cuda_enqueue_of(const struct cuda_dev *cd, const struct rd_op *op)
{
	unsigned id = (unsigned)op->compute.spec->id;

	return id < CUDA_OP_KINDS ? cd->enqueue[id] : NULL;
}

/* Adds the time since the last mark to `phase` (cuda_launch_profile only). */
static inline void cuda_launch_mark(struct cuda_lane *l, enum cuda_launch_phase phase)
{
	if (!l->cd->tuning.launch_profile)
		return;
	uint64_t now = rd_now_ns();
	l->profile.cur[phase] += now - l->profile.last_ns;
	l->profile.last_ns = now;
}

/* ---- common.c -------------------------------------------------------- */

/* Thread-local record of the last failure an init callback saw, since
 * rd_resource_ensure_valid() can only return -errno. */
int cuda_status_set(const char *name, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
/* Keeps err whole (its parameters too: a LimitExceeded's resource and
 * limit) as the status; err is left empty. Returns -EIO (-ENOMEM for
 * OutOfMemory, -EDQUOT for LimitExceeded). */
int cuda_status_keep(struct rp_error *err);
/* err from the last status, prefixed with what was being done (a status
 * kept whole is given as it is). */
int cuda_status_to_error(struct rp_error *err, const char *what);
/* The status of a failed runtime call, from a local `e_` of the caller. */
#define STATUS_CUDA(call) cuda_status_set(cuda_error_name(e_), "%s: %s", call, cudaGetErrorString(e_))

/* Error name for a CUDA runtime error: DeviceLost for sticky errors,
 * OutOfMemory, else BackendError. */
const char *cuda_error_name(cudaError_t e);
bool cuda_error_is_sticky(cudaError_t e);
const char *cublas_error_name(cublasStatus_t s);
/* What a person should know of an MPS error, as text to append to its
 * message ("" for any other error). */
const char *cuda_mps_hint(cudaError_t e);

/* The few driver-API entry points imports need, fetched through the
 * runtime (cudaGetDriverEntryPointByVersion) so that nothing links
 * libcuda.so.1 directly: the module and the GPU tests then load on a
 * machine without the driver, and fail (or skip) with a clear error. */
struct cuda_driver_api {
	__typeof__(cuGetErrorString) *GetErrorString;
	__typeof__(cuGetErrorName) *GetErrorName;
	__typeof__(cuMemGetAddressRange) *MemGetAddressRange;
	__typeof__(cuMemImportFromShareableHandle) *MemImportFromShareableHandle;
	__typeof__(cuMemGetAllocationPropertiesFromHandle) *MemGetAllocationPropertiesFromHandle;
	__typeof__(cuMemGetAllocationGranularity) *MemGetAllocationGranularity;
	__typeof__(cuMemAddressReserve) *MemAddressReserve;
	__typeof__(cuMemAddressFree) *MemAddressFree;
	__typeof__(cuMemMap) *MemMap;
	__typeof__(cuMemUnmap) *MemUnmap;
	__typeof__(cuMemSetAccess) *MemSetAccess;
	__typeof__(cuMemRelease) *MemRelease;
	/* rtc.c: the modules NVRTC compiled. */
	__typeof__(cuModuleLoadData) *ModuleLoadData;
	__typeof__(cuModuleGetFunction) *ModuleGetFunction;
	__typeof__(cuModuleUnload) *ModuleUnload;
	__typeof__(cuLaunchKernel) *LaunchKernel;
};
extern struct cuda_driver_api cuda_drv;
/* Fills cuda_drv once; 0 or -errno with err set. */
int cuda_driver_load(struct rp_error *err);

/* Makes dev->index current on the calling thread. */
int cuda_bind(struct cuda_dev *cd, struct rp_error *err);

/* Marks the device lost and tells whoever drives it, once per loss. */
void cuda_mark_lost(struct cuda_dev *cd, const char *reason);
/* As cuda_mark_lost, with the kind: RD_FAULT_FAILED is told even after a
 * loss was (once). */
void cuda_report_fault(struct cuda_dev *cd, enum rd_fault_kind kind, const char *reason);

/* Whether the context took a sticky error, without waiting for anything:
 * a query on the calling thread (bound to the device). cudaSuccess or the
 * sticky error; any other answer counts as healthy. */
cudaError_t cuda_context_check(void);

/* The one check every failed path makes, with err as the path set it: an
 * error that is the context's marks the device lost (once), whether its
 * name says so (DeviceLost: a sticky CUDA error) or a library's own failure
 * (BackendError, ImportFailed, OutOfMemory) turns out to be one when the
 * context is checked; err is then renamed DeviceLost. `resets`: the
 * device's reset count when the work began, so a failure caused by a reset
 * in between does not mark the new context lost. Returns -EIO. */
int cuda_check_failure(struct cuda_dev *cd, struct rp_error *err, uint64_t resets);

/* A device whose context is lost takes no new work until its reset: -EIO
 * with err set to DeviceLost, or 0. */
int cuda_refuse_if_lost(struct cuda_dev *cd, struct rp_error *err);

/* Each present operand's device address (its buffer's mapping plus its
 * offset) into ptr[slot], NULL for an absent one, each checked aligned to
 * its element's size as a kernel's loads need (a misaligned load would cost
 * the context). 0, or -EINVAL with InvalidOperand naming the operand, or
 * -EIO with BackendError for a buffer not mapped. */
int cuda_operand_pointers(const struct rd_op *op, void *ptr[RP_OP_OPERANDS_MAX], struct rp_error *err);

/* ---- device.c: the device-level resources ------------------------------- */

/* Registers the scratch pool, the cuBLASLt handle, the debug shared
 * workspace and the fault-injection state, in that order (release walks
 * the registry backwards). */
void cuda_device_resources_register(struct cuda_dev *cd);
void cuda_device_resources_unregister(struct cuda_dev *cd);

/* ---- health.c: the context check and NVML --------------------------------- */

/* At open: what CUDA says of the device (UUID, PCI bus id). */
int cuda_health_open(struct cuda_dev *cd);
void cuda_health_close(struct cuda_dev *cd);
int cuda_health_start(struct rd_device *dev, unsigned period_ms, struct rp_error *err);
void cuda_health_stop(struct rd_device *dev);
void cuda_health_info(struct rd_device *dev, struct rd_health *out);
/* Around a reset: the context check makes no CUDA call while the primary
 * context is thrown away and made again. */
void cuda_health_pause(struct cuda_dev *cd);
void cuda_health_resume(struct cuda_dev *cd);

/* ---- lane.c ------------------------------------------------------------ */

struct rd_lane *cuda_lane_create(struct rd_device *dev, unsigned index, struct rp_error *err);
/* rd_backend.abandon_client_waits: cuda_client_wait = host only. */
int cuda_lane_abandon_client_waits(struct rd_lane *lane, const char *why);
void cuda_lane_destroy(struct rd_lane *lane);
int cuda_submit(struct rd_lane *lane, struct rd_op *op);

/* work.c: the deadline's budget. A call's tensor-core multiply-adds, and
 * the least time they take at the device's peak (0 where unknown); take
 * refuses op (-E2BIG, op->err LimitExceeded {resource: "work"}) when it
 * could not finish within half of call_deadline_ms behind its lane's
 * calls, else counts it in until return (its completion). */
void cuda_work_open(struct cuda_dev *cd);
double cuda_work_macs(const struct rp_compute *c);
uint64_t cuda_work_least_ns(const struct cuda_dev *cd, const struct rp_compute *c);
int cuda_work_take(struct cuda_lane *l, struct rd_op *op);
void cuda_work_return(struct cuda_lane *l, struct rd_op *op);

/* ---- gemm.c ------------------------------------------------------------ */

void cuda_gemm_plans_init(struct cuda_dev *cd);
void cuda_gemm_plans_finish(struct cuda_dev *cd);
int cuda_gemm_enqueue(struct cuda_lane *lane, struct rd_op *op);
/* A GEMM whose A, B, C and D a captured graph reads from device memory
 * (cuBLASLt's pointer-array batch mode, a batch of one), so that the graph
 * replays on whatever addresses that memory holds: a program's library
 * step, its operands in the Run's argument block. The slots, in cuBLASLt's
 * order (its A is our B). */
enum { CUDA_GEMM_SLOT_B, CUDA_GEMM_SLOT_A, CUDA_GEMM_SLOT_C, CUDA_GEMM_SLOT_D, CUDA_GEMM_SLOTS };
/* The addresses op's slots take (host), its pointer-array plan made
 * (not captured: call before a capture begins). 1: not this call, an
 * operand under 16-byte alignment; -EOPNOTSUPP: never, FP8, no
 * pointer-array algorithm, or op invalid (cuda_gemm_enqueue then names
 * why). */
int cuda_gemm_slots(struct cuda_dev *cd, struct rd_op *op, void *slots[CUDA_GEMM_SLOTS]);
/* Enqueues op reading its operands from `slots` (device memory that
 * cuda_gemm_slots's addresses were copied to on the lane's stream). */
int cuda_gemm_enqueue_slots(struct cuda_lane *lane, struct rd_op *op, void *const *slots);

/* ---- program.c: io.regen.Program's Runs, as CUDA graphs ------------------ */

int cuda_program_create(struct rd_device *dev, const struct rp_program *def, struct rd_program **out,
			struct rp_error *err);
void cuda_program_destroy(struct rd_program *prog);
int cuda_program_enqueue(struct cuda_lane *lane, struct rd_op *op);
/* The completer's, once a Run's work finished: turns a bad index its
 * kernels reported into the call's error. */
void cuda_program_completed(struct rd_op *op);

/* ---- ipc.c ------------------------------------------------------------- */

void cuda_ipc_init(struct cuda_dev *cd);
int cuda_import_buffer(struct rd_device *dev, struct rd_import *req, struct rd_buffer **out, struct rp_error *err);
void cuda_close_buffer(struct rd_buffer *buf);
int cuda_check_export(struct rd_device *dev, int fd, uint64_t size, struct rp_error *err);
int cuda_import_event(struct rd_device *dev, const unsigned char handle[64], struct rd_event **out, struct rp_error *err);
void cuda_close_event(struct rd_event *ev);
bool cuda_event_done(struct rd_event *ev);
uint64_t cuda_ipc_mapped_bytes(struct cuda_dev *cd);

/* ---- comm.c: NCCL communicators (REGEN_HAVE_NCCL) ------------------------------ */

int cuda_comm_unique_id(struct rd_device *dev, unsigned char id[RP_COMM_ID_SIZE], struct rp_error *err);
int cuda_comm_create(struct rd_device *dev, const unsigned char id[RP_COMM_ID_SIZE], uint32_t rank, uint32_t nranks,
		     struct rd_comm **out, struct rp_error *err);
void cuda_comm_abort(struct rd_comm *comm, const char *why);
int cuda_comm_status(struct rd_comm *comm, struct rp_error *err);
void cuda_comm_close(struct rd_comm *comm);
/* Init, Destroy (both wait for peers, watching for an abort) or a
 * collective (enqueued on the lane's stream). */
int cuda_comm_enqueue(struct cuda_lane *lane, struct rd_op *op);
/* After the lane saw the op's work complete: a communicator aborted or
 * failed meanwhile makes it CommFailed. */
void cuda_comm_completed(struct rd_op *op);
/* Waits for every abort still running on an aborter thread: a release
 * and a reset call it first (the context must not be reset under an
 * ncclCommAbort; a release gives back what the aborts free). */
void cuda_comm_quiesce(struct cuda_dev *cd);
/* Waits for the aborts, then stops the watch (close: every communicator
 * is gone). */
void cuda_comm_finish(struct cuda_dev *cd);

/* ---- layernorm.c: LayerNorm and its backward (kernels/layernorm.cu) ------------ */

int cuda_layer_norm_enqueue(struct cuda_lane *lane, struct rd_op *op);

/* ---- fp8.c: Quantize, TransposeQuantize, ScaleUpdate (kernels/fp8.cu) ---------- */

int cuda_fp8_enqueue(struct cuda_lane *lane, struct rd_op *op);

/* ---- attention.c: forward and backward, through cuDNN ---------------------- */

int cuda_attention_enqueue(struct cuda_lane *lane, struct rd_op *op);
/* Unregisters and frees the attention state (close: device synchronized). */
void cuda_attention_finish(struct cuda_dev *cd);

/* ---- rtc.c: the kernels regend writes (daemon/program/), compiled with NVRTC ---- */

/* One step's compiled module (its FUSED, REDUCTION or GATHER kernels), a
 * registry resource of the device. Its init compiles the step's source for
 * the device's architecture (or takes the image kept from an earlier
 * generation, or the on-disk cache's: the device's rtc_cache_dir) and loads
 * it; release unloads it (cuModuleUnload); a reset forgets it. The image
 * (CUBIN, host memory) outlives generations; the loaded module never does. */
struct cuda_rtc_module {
	struct rd_resource res;
	struct cuda_dev *cd;
	const struct rd_prog_step *step;    /* source and kernels: the program's plan, outlives this */
	CUmodule module;
	CUfunction *fn;                     /* step->nkernels of them (made by the first init) */
	unsigned sm_count;                  /* the device's, for the grids */
	/* The program it is a step of: its compile account (its owner's
	 * uid's) and its counters. NULL: nothing charged or counted. */
	struct rd_program *prog;
	/* Under res.lock. */
	void *image;
	size_t image_size;
	struct rd_compile_account *held;    /* what the image's bytes are held against */
	int arch;                           /* what the image is for: 90 for sm_90 */
	bool image_is_ptx;                  /* the device is newer than NVRTC knows: PTX the driver compiles */
};

/* Registers m for step (nothing compiled or loaded yet). */
void cuda_rtc_module_init(struct cuda_dev *cd, struct cuda_rtc_module *m, const struct rd_prog_step *step);
/* Unregisters m (unloading it if loaded) and frees its image. */
void cuda_rtc_module_finish(struct cuda_rtc_module *m);
/* Compiles the image now, if it has none, without touching the context:
 * Define may call it so that a program's first Run does not wait for
 * NVRTC. 0, or -errno with err set (io.regen.BackendError with the first
 * lines of NVRTC's log). */
int cuda_rtc_module_compile(struct cuda_rtc_module *m, struct rp_error *err);
/* The module loaded in this generation (compiled first if need be):
 * m->fn[] valid. 0 or -errno with err set. */
int cuda_rtc_module_get(struct cuda_rtc_module *m, struct rp_error *err);
/* Enqueues the step's kernel k on stream, its one parameter args_dev (the
 * rg_args in device memory, rd_prog_args_fill's layout). Call
 * cuda_rtc_module_get first. 0 or -EIO with err set. */
int cuda_rtc_launch(struct cuda_rtc_module *m, int k, cudaStream_t stream, const void *args_dev, struct rp_error *err);
