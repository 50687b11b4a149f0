/* SPDX-License-Identifier: Apache-2.0 */
/* libregen: the client library of regend.
 *
 * A regen_client holds one connection to regend's main socket (control:
 * Status, Release/Reset/Restart) and, on first use of a device, one to that
 * device's worker socket (data: buffers, events, GEMM, attention), found
 * through Status. Calls block until their reply. A client is not
 * thread-safe: use one per thread (each is its own lane, so threads run
 * concurrently).
 *
 * Errors: functions return 0 or a negative errno. -EREMOTE means regend
 * answered with a named Varlink error: regen_client_error_name() gives the
 * name (one of the REGEN_ERROR_* below) and regen_client_error_message()
 * its message. -ECONNRESET means the connection broke with the call in
 * flight; the next call reconnects. -EPROTO means a reply did not follow
 * the protocol (the message says how).
 *
 * Structures that libregen hands out and may grow (struct
 * regen_device_info, struct regen_watch_event) begin with their size, so
 * a program built against a newer header can tell which fields the library
 * it runs with filled in: REGEN_HAS_FIELD(info, field). */
#pragma once

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

#if defined(__GNUC__)
#define REGEN_EXPORT __attribute__((visibility("default")))
#else
#define REGEN_EXPORT
#endif

/* The errors regend sends (proto/idl/io.regen.varlink, and Varlink's own
 * org.varlink.service errors), as regen_client_error_name() returns them. */
#define REGEN_ERROR_STALE_GENERATION         "io.regen.StaleGeneration"
#define REGEN_ERROR_DEVICE_LOST              "io.regen.DeviceLost"
#define REGEN_ERROR_DRAINING                 "io.regen.Draining"
#define REGEN_ERROR_NOT_PERMITTED            "io.regen.NotPermitted"
#define REGEN_ERROR_OUT_OF_MEMORY            "io.regen.OutOfMemory"
#define REGEN_ERROR_INVALID_OPERAND          "io.regen.InvalidOperand"
#define REGEN_ERROR_NO_SUCH_DEVICE           "io.regen.NoSuchDevice"
#define REGEN_ERROR_NO_SUCH_OBJECT           "io.regen.NoSuchObject"
#define REGEN_ERROR_IMPORT_FAILED            "io.regen.ImportFailed"
#define REGEN_ERROR_INVALID_MESSAGE          "io.regen.InvalidMessage"
#define REGEN_ERROR_MESSAGE_TOO_LARGE        "io.regen.MessageTooLarge"
#define REGEN_ERROR_LIMIT_EXCEEDED           "io.regen.LimitExceeded"
#define REGEN_ERROR_TIMEOUT                  "io.regen.Timeout"
#define REGEN_ERROR_FAULT_INJECTION_DISABLED "io.regen.FaultInjectionDisabled"
#define REGEN_ERROR_WRONG_ENDPOINT           "io.regen.WrongEndpoint"
#define REGEN_ERROR_DETACHED                 "io.regen.Detached"
#define REGEN_ERROR_BACKEND_ERROR            "io.regen.BackendError"
#define REGEN_ERROR_COMM_FAILED              "io.regen.CommFailed"
#define REGEN_ERROR_COMM_TIMEOUT             "io.regen.CommTimeout"
#define REGEN_ERROR_COMM_IN_FLIGHT           "io.regen.CommInFlight"
#define REGEN_ERROR_INVALID_JOB              "io.regen.InvalidJob"
#define REGEN_ERROR_INVALID_PROGRAM          "io.regen.InvalidProgram"
#define REGEN_ERROR_RUN_TORN                 "io.regen.RunTorn"
#define REGEN_ERROR_INTERFACE_NOT_FOUND      "org.varlink.service.InterfaceNotFound"
#define REGEN_ERROR_METHOD_NOT_FOUND         "org.varlink.service.MethodNotFound"
#define REGEN_ERROR_METHOD_NOT_IMPLEMENTED   "org.varlink.service.MethodNotImplemented"
#define REGEN_ERROR_INVALID_PARAMETER        "org.varlink.service.InvalidParameter"
#define REGEN_ERROR_PERMISSION_DENIED        "org.varlink.service.PermissionDenied"
#define REGEN_ERROR_EXPECTED_MORE            "org.varlink.service.ExpectedMore"

/* True when the structure *s (which begins with its size) has `field`. */
#define REGEN_HAS_FIELD(s, field) \
	(offsetof(__typeof__(*(s)), field) + sizeof((s)->field) <= (s)->size)

typedef struct regen_client regen_client;
typedef struct regen_buffer regen_buffer;
typedef struct regen_event regen_event;
typedef struct regen_status regen_status;
typedef struct regen_watcher regen_watcher;

/* Devices libregen reaches: indexes 0 .. REGEN_DEVICES_MAX - 1. */
#define REGEN_DEVICES_MAX 64

/* REGEN_I32 only where a call says so (attention's sequence lengths, a
 * communicator's); REGEN_F64, REGEN_I64 and REGEN_U8 a communicator's only
 * (programs take them too). REGEN_E4M3 and REGEN_E5M2 are the FP8 formats
 * (one byte; E4M3 as torch's float8_e4m3fn, largest 448, no infinities;
 * E5M2 as float8_e5m2, largest 57344), where a call says so: regen_gemm's
 * a, b and d, the quantize calls' outputs. */
enum regen_dtype {
	REGEN_F32 = 0, REGEN_F16, REGEN_BF16, REGEN_I32, REGEN_F64, REGEN_I64, REGEN_U8, REGEN_E4M3 = 7, REGEN_E5M2 = 8
};

/* socket_path NULL: $REGEN_SOCKET, else the built-in default. When
 * $REGEN_JOB is set, the client states it as its job (regen_client_set_job);
 * a $REGEN_JOB that regend would refuse fails the connect with -EINVAL. */
REGEN_EXPORT int regen_client_connect(const char *socket_path, regen_client **out);
/* Closes the connections; buffers and events still open are closed by
 * regend once this process has no connection left to their device's
 * worker (another client of this process keeps them open: its ids are the
 * process's), and only freed by their close here. Close every watcher
 * first. Accepts NULL. */
REGEN_EXPORT void regen_client_destroy(regen_client *c);
/* fork(): a client made before a fork stays the parent's. In the child its
 * first use (a call, a wait, a close) lets go of the parent's part without
 * a word to it: it closes the child's copies of the connections and unmaps
 * its view of each ring, so nothing is written into the parent's streams
 * or rings and nothing of the parent's is read; the calls the parent had
 * queued answer regen_wait with -ECONNRESET there (their answers go to the
 * parent); the parent's buffers, events and communicators become bare ids
 * (regend ties them to the process that made them): a call naming one is
 * refused with -EINVAL, a close frees it without a call. The client then
 * connects afresh, as the child, on its next call: what the child imports
 * is its own. A watcher opened before the fork answers -ECONNRESET in the
 * child (open another). The parent's client goes on as before. (The pool
 * starts afresh in a child too: see client/pool.c.) */
/* The last named error (NULL after a success). */
REGEN_EXPORT const char *regen_client_error_name(const regen_client *c);
REGEN_EXPORT const char *regen_client_error_message(const regen_client *c);
/* The last named error's parameters as JSON text (e.g. StaleGeneration's
 * {"device":0,"generation":4,"message":"..."}), NULL when there is none. */
REGEN_EXPORT const char *regen_client_error_parameters(const regen_client *c);
/* The main socket's path this client uses. */
REGEN_EXPORT const char *regen_client_socket_path(const regen_client *c);
/* Seconds a call may take before it fails with -ETIMEDOUT (default 60;
 * 0 = forever). */
REGEN_EXPORT void regen_client_set_timeout(regen_client *c, double seconds);
/* The job this client works for, in its own words (io.regen.SetJob): 1 to
 * 64 bytes of A-Z a-z 0-9 and . _ - : / @ + =, the first a letter or a
 * digit. Stated at once on the main connection, then on every connection
 * the client has or opens; job NULL or "" stops stating one. regend names
 * the client's work by it in Status, metrics, lifecycle reasons and logs
 * where the client's cgroup names no job (the cgroup's wins; both are
 * shown where they differ), and never grants anything for it. A job regend
 * refuses: -EREMOTE with REGEN_ERROR_INVALID_JOB, and the client keeps the
 * job it had. A regend without SetJob: a job is not stated (no error). */
REGEN_EXPORT int regen_client_set_job(regen_client *c, const char *job);
/* The job the client states; "" for none. */
REGEN_EXPORT const char *regen_client_job(const regen_client *c);

struct regen_info {
	char vendor[64];
	char product[64];
	char version[32];
};

/* The handshake: org.varlink.service.GetInfo on the main socket. Says who
 * answers, and fails with -EPROTONOSUPPORT when the peer does not serve
 * io.regen.Device (a socket of something else). */
REGEN_EXPORT int regen_hello(regen_client *c, struct regen_info *out);

/* One device as Status (and Generation, Release, Reset, Restart) reports
 * it. The strings live as long as the regen_status they came from. */
struct regen_device_info {
	size_t size;               /* sizeof the struct as this library fills it */
	int index;
	uint64_t generation;
	const char *state;         /* "ready", "draining", ... (io.regen.Device.State) */
	const char *backend;       /* "cuda", "host"; "" until the worker is up */
	const char *worker_socket; /* where Memory and Compute calls for the device go */
	int64_t worker_pid;
	uint64_t respawns;         /* times the worker process was replaced */
	uint64_t memory_used, memory_baseline;   /* bytes: now, and right after the worker started */
	const char *reason;        /* why the device is in its state */
	/* io.regen.Device.Health: has_health is false until a worker said it;
	 * unknown numbers are -1 (the bools too: -1 unknown, 0 no, 1 yes). */
	bool has_health;
	const char *health_source; /* "nvml", "simulated", "unavailable" */
	const char *health_detail;
	const char *uuid;
	const char *pci_bus_id;
	uint32_t last_xid;         /* 0: none seen */
	int64_t last_xid_unix_ms;
	const char *last_xid_text;
	int64_t ecc_dbe_volatile, ecc_dbe_aggregate;
	int retired_pages_pending, remap_pending, remap_failed;
	/* io.regen.Device.Sharing: has_sharing is false until a worker said
	 * it. mps: the worker's context is an MPS client (a fatal fault in any
	 * client of the GPU reaches every client). mps_clients is -1 and
	 * compute_mode "" where NVML cannot say. */
	bool has_sharing;
	bool mps;
	const char *mps_pipe_directory; /* the worker's CUDA_MPS_PIPE_DIRECTORY; "" unset */
	const char *compute_mode;       /* "default", "exclusive_process", ...; "" unknown */
	int64_t mps_clients;
	const char *sharing_reason;
};

/* The node and its devices: io.regen.Device.Status (fresh memory numbers)
 * or Generation (cheap). *out is freed with regen_status_free. */
REGEN_EXPORT int regen_status_get(regen_client *c, regen_status **out);
REGEN_EXPORT int regen_generation_get(regen_client *c, regen_status **out);
REGEN_EXPORT uint64_t regen_status_epoch(const regen_status *st);
REGEN_EXPORT int regen_status_device_count(const regen_status *st);
/* The i-th device of the reply (0 .. count - 1), NULL out of range. */
REGEN_EXPORT const struct regen_device_info *regen_status_device(const regen_status *st, int i);
/* The device with this index, NULL when the reply has none. */
REGEN_EXPORT const struct regen_device_info *regen_status_find_device(const regen_status *st, int index);
/* Restart's duration; 0 for the other replies. */
REGEN_EXPORT uint64_t regen_status_elapsed_us(const regen_status *st);
/* The reply as regend sent it, as JSON text (malloc'ed, free()); NULL on
 * ENOMEM. */
REGEN_EXPORT char *regen_status_to_json(const regen_status *st);
/* Accepts NULL. */
REGEN_EXPORT void regen_status_free(regen_status *st);

/* Lifecycle (admin). device < 0 = all devices. reason may be NULL.
 * deadline_ms <= 0 = the daemon's default. `out` may be NULL; else it
 * receives the reply (regen_status_free). */
REGEN_EXPORT int regen_release(regen_client *c, int device, const char *reason, regen_status **out);
REGEN_EXPORT int regen_reset(regen_client *c, int device, const char *reason, regen_status **out);
REGEN_EXPORT int regen_restart(regen_client *c, int device, const char *reason, int deadline_ms, regen_status **out);
/* kind: "crash", "device_lost", "hang". */
REGEN_EXPORT int regen_inject_fault(regen_client *c, int device, const char *kind);

/* One io.regen.Device.Watch reply: a device's generation and state after a
 * change, or as it stands when subscribing (reason "subscribed"). */
struct regen_watch_event {
	size_t size;               /* sizeof the struct as this library fills it */
	uint64_t epoch;
	int device;
	uint64_t generation;
	const char *state;
	const char *reason;
};

/* A Watch subscription on a connection of its own, so that it may stay
 * open while the client makes other calls. The client must outlive it (its
 * errors are the client's). regen_watcher_next waits up to timeout_s
 * (<= 0: forever) for the next event: 0 with *ev set (valid until the next
 * call), -ETIMEDOUT (the subscription stays), -ECONNRESET when the
 * connection ended (or in a forked child, when the watcher is the
 * parent's), -ENODATA after the daemon ended the stream. The first events
 * are the current state of every device. */
REGEN_EXPORT int regen_watcher_open(regen_client *c, regen_watcher **out);
REGEN_EXPORT int regen_watcher_next(regen_watcher *w, double timeout_s, const struct regen_watch_event **ev);
/* Accepts NULL. */
REGEN_EXPORT void regen_watcher_close(regen_watcher *w);

/* Subscribes and calls cb for the current state, then once per change,
 * until cb returns non-zero (then returns 0), the timeout passes between
 * two events (-ETIMEDOUT; timeout_s <= 0 = forever) or the connection ends.
 * Uses its own connection, so cb may make calls on this client. */
typedef int (*regen_watch_cb)(const struct regen_watch_event *ev, void *userdata);
REGEN_EXPORT int regen_watch(regen_client *c, double timeout_s, regen_watch_cb cb, void *userdata);
/* As regen_watch, and returns -ETIMEDOUT once total_s have passed in all
 * (total_s <= 0 = no overall limit). */
REGEN_EXPORT int regen_watch_full(regen_client *c, double timeout_s, double total_s, regen_watch_cb cb, void *userdata);

/* Buffers: memory the caller owns, mapped by the device's worker. A passed
 * fd is sent to the worker, which maps it; the caller keeps its own fd and
 * memory. */
/* host_fd: a memfd of at least `size` bytes, made with MFD_ALLOW_SEALING:
 * libregen seals it against shrinking (F_SEAL_SHRINK), which regend
 * requires, so that its memory cannot vanish under a call. */
REGEN_EXPORT int regen_buffer_import_fd(regen_client *c, int device, int fd, uint64_t size, regen_buffer **out);
/* cuda_ipc: handle is the 64-byte cudaIpcMemHandle_t; the buffer covers
 * [offset, offset + size) of its allocation. */
REGEN_EXPORT int regen_buffer_import_cuda_ipc(regen_client *c, int device, const void *handle, uint64_t offset,
					      uint64_t size, regen_buffer **out);
/* cuda_fd: a CUDA VMM allocation exported as a POSIX file descriptor
 * (cuMemExportToShareableHandle); the buffer covers [offset, offset + size). */
REGEN_EXPORT int regen_buffer_import_cuda_fd(regen_client *c, int device, int fd, uint64_t offset, uint64_t size,
					     regen_buffer **out);
/* Closes it in the worker (unless its generation is gone) and frees it.
 * Accepts NULL. */
REGEN_EXPORT int regen_buffer_close(regen_buffer *buf);
REGEN_EXPORT const char *regen_buffer_id(const regen_buffer *buf);
REGEN_EXPORT uint64_t regen_buffer_generation(const regen_buffer *buf);
REGEN_EXPORT int regen_buffer_device(const regen_buffer *buf);
/* The size the worker mapped. */
REGEN_EXPORT uint64_t regen_buffer_size(const regen_buffer *buf);

/* Events: a cudaIpcEventHandle_t (64 bytes) of an event created with
 * cudaEventInterprocess | cudaEventDisableTiming, for the wait_event and
 * signal_event of compute calls. Closing works as for buffers. */
REGEN_EXPORT int regen_event_import_cuda_ipc(regen_client *c, int device, const void *handle, regen_event **out);
REGEN_EXPORT int regen_event_close(regen_event *ev);
REGEN_EXPORT const char *regen_event_id(const regen_event *ev);
REGEN_EXPORT uint64_t regen_event_generation(const regen_event *ev);
REGEN_EXPORT int regen_event_device(const regen_event *ev);

struct regen_tensor {
	regen_buffer *buffer;
	uint64_t offset;         /* bytes */
	enum regen_dtype dtype;
	int rank;
	int64_t shape[4];
	int64_t strides[4];      /* elements; all zero = contiguous */
};

/* GELU is the tanh approximation. DGELU is a GELU layer's backward:
 * D = (alpha op(A) op(B) + beta C) * GELU'(aux), aux the forward's
 * pre-activation ([M, N], D's dtype); it takes no bias. GELU_AUX and
 * GELU_AUX_BIAS are GELU and GELU_BIAS that also write that pre-activation
 * to aux_out ([M, N], D's dtype), for the DGELU of the backward pass. */
enum regen_epilogue {
	REGEN_EPILOGUE_NONE = 0, REGEN_EPILOGUE_BIAS, REGEN_EPILOGUE_GELU, REGEN_EPILOGUE_GELU_BIAS,
	REGEN_EPILOGUE_DGELU, REGEN_EPILOGUE_GELU_AUX, REGEN_EPILOGUE_GELU_AUX_BIAS
};

/* Every compute call may name, on the operands' device: wait_event, which
 * the work waits for before it starts, and signal_event, which it records
 * when done; the call then returns once the work is enqueued. NULL: none.
 * deadline_ms: how long the call may run before it is answered
 * io.regen.Timeout; past regend's own --call-deadline-ms too, regend reports
 * the device hung and recovers it (a Watch event `hung`, then a reset or
 * respawn), while a shorter deadline ends only this call; 0: regend's
 * default (--call-deadline-ms), at most a day. */
struct regen_gemm_args {
	struct regen_tensor a, b, d;
	const struct regen_tensor *c;      /* NULL: none */
	const struct regen_tensor *bias;   /* NULL: none */
	bool trans_a, trans_b;
	double alpha, beta;                /* finite (else -EINVAL, unsent); alpha 0 is taken as 1 only when alpha_set is false */
	bool alpha_set;
	enum regen_epilogue epilogue;
	bool tf32;
	const regen_event *wait_event, *signal_event;
	const struct regen_tensor *aux;    /* NULL: none; REGEN_EPILOGUE_DGELU's pre-activation */
	uint32_t deadline_ms;              /* 0: regend's default */
	const struct regen_tensor *aux_out;   /* NULL: none; written by REGEN_EPILOGUE_GELU_AUX(_BIAS) */
	/* FP8 (docs/protocol.md, io.regen.Compute.Gemm): a and b in REGEN_E4M3
	 * or REGEN_E5M2 (not both E5M2), a [M, K] and b [N, K] both
	 * K-contiguous (trans_a false, trans_b true: the one FP8 layout of
	 * cuBLASLt), each with its scale: REGEN_F32 [1] tensors in the rank's
	 * memory that turn stored values into real ones (1 / the scale they
	 * were quantized with: regen_scale_update's scale_inv). op(A) op(B) is
	 * then of those real values, accumulated in f32 (FP8's partial sums
	 * narrower first: docs/protocol.md). d in bf16, f16 or f32, or in FP8
	 * with d_scale (F32 [1]; E5M2 only from an E5M2 input): d =
	 * fp8(d_scale * result),
	 * and amax_d (F32 [1]) receives max |result| before d_scale, written by
	 * the GEMM itself. Epilogues none, bias, gelu, gelu_bias (a bias only
	 * into a bf16 or f16 d, of its dtype); no c into an FP8 d. A scale
	 * missing, not [1], or given where no FP8 operand needs it is refused
	 * with REGEN_ERROR_INVALID_OPERAND naming it; the host backend also
	 * refuses a scale that is 0, negative, infinite or NaN (the CUDA
	 * backend does not read scales before the GEMM runs). All NULL: none. */
	const struct regen_tensor *a_scale, *b_scale, *d_scale, *amax_d;
	/* FP8 inputs only: their partial sums never promoted to f32 midway
	 * (cuBLASLt's fast accumulation, Transformer Engine's forward GEMMs):
	 * faster, less exact. Refused (compute) without FP8 inputs. */
	bool fp8_fast_accum;
};
REGEN_EXPORT int regen_gemm(regen_client *c, const struct regen_gemm_args *args);

/* Where a causal mask's diagonal starts: top_left (query i sees keys 0..i,
 * torch's is_causal) or bottom_right (query i sees keys 0..i + Skv - Sq). */
enum regen_causal_alignment { REGEN_CAUSAL_TOP_LEFT = 0, REGEN_CAUSAL_BOTTOM_RIGHT };

/* q [B, H, Sq, D], k [B, Hkv, Skv, D], v [B, Hkv, Skv, Dv], o [B, H, Sq, Dv],
 * H a multiple of Hkv (grouped-query attention). seq_len_q and seq_len_kv,
 * REGEN_I32 [B], both or neither: each batch entry's sequence lengths, the
 * rows past them padding (io.regen.Compute.Attention says what is written
 * there and which values are taken). */
struct regen_attention_args {
	struct regen_tensor q, k, v, o;
	const struct regen_tensor *stats;  /* NULL: not wanted */
	double scale;                      /* 0: 1/sqrt(D); else > 0 (not finite: -EINVAL, unsent) */
	bool causal;
	const regen_event *wait_event, *signal_event;
	enum regen_causal_alignment causal_alignment;
	const struct regen_tensor *seq_len_q, *seq_len_kv;   /* NULL: every sequence full */
	uint32_t deadline_ms;              /* 0: regend's default */
};
REGEN_EXPORT int regen_attention(regen_client *c, const struct regen_attention_args *args);

struct regen_attention_backward_args {
	struct regen_tensor q, k, v, o, d_o, stats, d_q, d_k, d_v;
	double scale;                      /* as the forward's */
	bool causal;
	const regen_event *wait_event, *signal_event;
	enum regen_causal_alignment causal_alignment;
	const struct regen_tensor *seq_len_q, *seq_len_kv;   /* the forward's */
	uint32_t deadline_ms;              /* 0: regend's default */
};
REGEN_EXPORT int regen_attention_backward(regen_client *c, const struct regen_attention_backward_args *args);

/* LayerNorm over the last dimension (torch's F.layer_norm(x, [n], weight,
 * bias, eps)): y = (x - mean) * rstd * weight + bias row by row, the
 * statistics in f32. x and y [rows, n] (rows may be padded: strides
 * {ld, 1}, ld >= n), weight and bias [n] of x's dtype, mean and rstd
 * REGEN_F32 [rows] (each row's, for the backward). n <= 65536. */
struct regen_layer_norm_args {
	struct regen_tensor x, weight, y;
	const struct regen_tensor *bias;           /* NULL: none */
	const struct regen_tensor *mean, *rstd;    /* NULL: not wanted */
	double eps;                                /* 0: 1e-5; else > 0 (not finite: -EINVAL here) */
	const regen_event *wait_event, *signal_event;
	uint32_t deadline_ms;                      /* 0: regend's default */
};
REGEN_EXPORT int regen_layer_norm(regen_client *c, const struct regen_layer_norm_args *args);

/* LayerNorm's gradients from the forward's x, weight, mean and rstd and the
 * incoming d_y: d_x (+ d_residual when given: the gradient arriving
 * through a residual connection; d_x may be d_residual itself), and when
 * given d_weight = sum over rows of d_y * (x - mean) * rstd and d_bias =
 * sum over rows of d_y ([n], weight's dtype, summed in f32). */
struct regen_layer_norm_backward_args {
	struct regen_tensor d_y, x, weight, mean, rstd, d_x;
	const struct regen_tensor *d_weight, *d_bias;   /* NULL: not wanted */
	const struct regen_tensor *d_residual;          /* NULL: none */
	const regen_event *wait_event, *signal_event;
	uint32_t deadline_ms;                           /* 0: regend's default */
};
REGEN_EXPORT int regen_layer_norm_backward(regen_client *c, const struct regen_layer_norm_backward_args *args);

/* FP8 quantization (io.regen.Compute.Quantize): y = fp8(x * scale), the
 * f32 product rounded to nearest even and saturated to y's largest finite
 * value (448 for E4M3, 57344 for E5M2), NaN kept. x [rows, cols] in f32,
 * f16 or bf16 (rows may be padded: strides {ld, 1}); scale REGEN_F32 [1]
 * (stored = real * scale, Transformer Engine's scale); y [rows, cols] in
 * REGEN_E4M3 or REGEN_E5M2. amax (REGEN_F32 [1]) receives max |x| (NaN
 * ignored): point it at row 0 of the tensor's column of an amax history
 * (regen_scale_update). The host backend refuses a scale that is 0,
 * negative, infinite or NaN (REGEN_ERROR_INVALID_OPERAND naming it). */
struct regen_quantize_args {
	struct regen_tensor x, scale, y;
	const struct regen_tensor *amax;           /* NULL: not wanted */
	const regen_event *wait_event, *signal_event;
	uint32_t deadline_ms;                      /* 0: regend's default */
};
REGEN_EXPORT int regen_quantize(regen_client *c, const struct regen_quantize_args *args);

/* Quantize that writes y_t [cols, rows], y transposed, and y itself when
 * given (io.regen.Compute.TransposeQuantize): the two layouts an FP8 GEMM's
 * operand may be needed in, since FP8 GEMMs take only K-contiguous
 * operands (a weight [N, K] is b of the forward GEMM and, as y_t [K, N],
 * b of the input gradient's). y and y_t share a dtype. */
struct regen_transpose_quantize_args {
	struct regen_tensor x, scale, y_t;
	const struct regen_tensor *y;              /* NULL: only the transpose */
	const struct regen_tensor *amax;           /* NULL: not wanted */
	const regen_event *wait_event, *signal_event;
	uint32_t deadline_ms;                      /* 0: regend's default */
};
REGEN_EXPORT int regen_transpose_quantize(regen_client *c, const struct regen_transpose_quantize_args *args);

/* Which amax of a history decides the next scale: its largest, or its
 * newest (row 0). */
enum regen_amax_compute { REGEN_AMAX_COMPUTE_MAX = 0, REGEN_AMAX_COMPUTE_MOST_RECENT };
/* The FP8 format whose largest value a scale aims at. */
enum regen_fp8_format { REGEN_FP8_E4M3 = 0, REGEN_FP8_E5M2 };

/* Transformer Engine's delayed-scaling update over N tensors' scaling
 * state at once (io.regen.Compute.ScaleUpdate). amax_history REGEN_F32
 * [H, N] (rows may be padded): column i is tensor i's last H amaxes, row 0
 * the newest (this step's, written by the quantize calls or regen_gemm's
 * amax_d); scale REGEN_F32 [N]. Per column: amax = its largest value
 * (REGEN_AMAX_COMPUTE_MAX) or its row 0 (MOST_RECENT); the column rolled
 * into amax_history_out (row i takes row i + 1, the last row the old row
 * 0, row 0 zeroed for the next amax); scale_out = fp8_max * 2^-margin /
 * amax where amax is finite and positive, else the old scale (FLT_MAX
 * where the quotient overflows); scale_inv (optional) = 1 / scale_out,
 * what regen_gemm's a_scale and b_scale take. fp8_max: 448 (E4M3) or
 * 57344 (E5M2; Transformer Engine's HYBRID updates its gradients' scales
 * so). amax_history_out may be amax_history and scale_out scale, exactly
 * (the same buffer, offset, shape and strides): the update in place. The
 * state is tensors in the rank's memory, so a restart or a respawn of
 * regend's worker loses none of it; an update in place is not safe to run
 * twice (a retry after a fault would roll the history again): run it out
 * of place, or as a program node with a journal (regen_program_run). */
struct regen_scale_update_args {
	struct regen_tensor amax_history, scale, amax_history_out, scale_out;
	const struct regen_tensor *scale_inv;      /* NULL: not wanted */
	enum regen_fp8_format fp8_format;          /* 0: E4M3 */
	enum regen_amax_compute amax_compute;      /* 0: max */
	double margin;                             /* |margin| <= 126 (regend refuses others); not finite: -EINVAL here */
	const regen_event *wait_event, *signal_event;
	uint32_t deadline_ms;                      /* 0: regend's default */
};
REGEN_EXPORT int regen_scale_update(regen_client *c, const struct regen_scale_update_args *args);

/* Queued calls: each returns once the call is on its way, with a ticket
 * that names it on its device's lane; regen_wait(c, device, ticket) then
 * waits until it and every call queued before it on that lane are
 * answered, and returns 0, or the first error among them (named as a
 * blocking call's would be). The blocking calls above are a submit and a
 * wait. */
REGEN_EXPORT int regen_gemm_submit(regen_client *c, const struct regen_gemm_args *args, uint64_t *ticket);
REGEN_EXPORT int regen_attention_submit(regen_client *c, const struct regen_attention_args *args, uint64_t *ticket);
REGEN_EXPORT int regen_attention_backward_submit(regen_client *c, const struct regen_attention_backward_args *args,
						 uint64_t *ticket);
REGEN_EXPORT int regen_layer_norm_submit(regen_client *c, const struct regen_layer_norm_args *args, uint64_t *ticket);
REGEN_EXPORT int regen_layer_norm_backward_submit(regen_client *c, const struct regen_layer_norm_backward_args *args,
						  uint64_t *ticket);
REGEN_EXPORT int regen_quantize_submit(regen_client *c, const struct regen_quantize_args *args, uint64_t *ticket);
REGEN_EXPORT int regen_transpose_quantize_submit(regen_client *c, const struct regen_transpose_quantize_args *args,
						 uint64_t *ticket);
REGEN_EXPORT int regen_scale_update_submit(regen_client *c, const struct regen_scale_update_args *args,
					   uint64_t *ticket);
REGEN_EXPORT int regen_wait(regen_client *c, int device, uint64_t ticket);
/* The elapsed_us regend gave the device's last answered call. */
REGEN_EXPORT uint64_t regen_client_last_elapsed_us(const regen_client *c, int device);
/* Where the device's last answered call spent its time, as moments of
 * CLOCK_MONOTONIC in nanoseconds (one clock for every process of the
 * machine): this client wrote it, the worker took it, handed its work to
 * the GPU, found it finished and published its answer, and this client
 * read the answer. Over the ring every stage is known (the worker's are 0
 * for a record refused before it ran; finished_ns is 0 for one answered
 * before its work ended, an io.regen.Timeout); as a Varlink call only
 * completed_ns. For benchmarks: the differences say which hand-off costs
 * what. -EINVAL for a bad device. */
struct regen_call_timing {
	uint64_t submitted_ns, taken_ns, launched_ns, finished_ns, published_ns, completed_ns;
};
REGEN_EXPORT int regen_client_last_timing(const regen_client *c, int device, struct regen_call_timing *timing);

/* Programs (io.regen.Program; docs/protocol.md): a DAG of operations over
 * named tensors, defined once and run per step by one call on the device's
 * lane, in order with its other calls. `definition` is Define's parameters
 * as JSON text ({"name", "tensors": [...], "nodes": [...]}); regend checks
 * it whole and refuses a wrong one with REGEN_ERROR_INVALID_PROGRAM, which
 * names the node and why. A program is this process's, like a buffer, and
 * outlives generations. Drop forgets it in regend (after the lane's queued
 * calls) and frees it; NULL is fine. */
typedef struct regen_program regen_program;
REGEN_EXPORT int regen_program_define(regen_client *c, int device, const char *definition, regen_program **out);
REGEN_EXPORT int regen_program_drop(regen_program *p);
REGEN_EXPORT const char *regen_program_id(const regen_program *p);
REGEN_EXPORT int regen_program_device(const regen_program *p);
/* Bytes of the copy journal a retried Run of it needs (0: it updates
 * nothing in place, and a plain Run may simply run again after a fault). A
 * journal of marks only needs REGEN_PROGRAM_JOURNAL_MARKS_BYTES. */
REGEN_EXPORT uint64_t regen_program_journal_bytes(const regen_program *p);
#define REGEN_PROGRAM_JOURNAL_MARKS_BYTES 32

/* A Run: every input, output and inout bound by name to a buffer of this
 * client on the program's device and a byte offset (a multiple of the
 * tensor's element size), every scalar given a finite value; events and
 * deadline_ms as the compute calls'. A program that updates in place is
 * retried after a fault exactly once with journal (at least
 * regen_program_journal_bytes, 8-byte aligned at journal_offset), seq (the
 * caller's number for the Run, the same on its retry) and, on the retry,
 * retry = true; journal NULL: none (seq 0, retry false). journal_marks:
 * the journal holds the Run's marks only (REGEN_PROGRAM_JOURNAL_MARKS_BYTES,
 * no copy of the inouts a step); the retry of such a Run that a fault cut
 * after it began runs nothing and fails with REGEN_ERROR_RUN_TORN
 * (proto/program_journal.h). Names the program
 * does not bind, objects of another client or device, offsets or seq past
 * 2^53 and values not finite are refused here (-EINVAL, unsent); the rest
 * regend checks, on either transport alike. A Run takes the ring's record
 * and, past 60 bindings and scalars, continuation records after it: its
 * ticket is that of its last record. */
struct regen_program_binding {
	const char *name;
	regen_buffer *buffer;
	uint64_t offset;                   /* bytes */
};
struct regen_program_scalar {
	const char *name;
	double value;
};
struct regen_program_run_args {
	regen_program *program;
	const struct regen_program_binding *bind;
	size_t nbind;
	const struct regen_program_scalar *scalars;
	size_t nscalars;
	const regen_event *wait_event, *signal_event;
	uint32_t deadline_ms;              /* 0: regend's default */
	regen_buffer *journal;             /* NULL: none */
	uint64_t journal_offset;
	uint64_t seq;
	bool retry;
	bool journal_marks;                /* with a journal: marks only, no copies */
};
REGEN_EXPORT int regen_program_run(regen_client *c, const struct regen_program_run_args *args);
REGEN_EXPORT int regen_program_run_submit(regen_client *c, const struct regen_program_run_args *args,
					  uint64_t *ticket);

/* How compute calls reach a worker: over the lane's shared-memory ring
 * (io.regen.Lane) where the worker offers it, else as Varlink calls
 * (auto, the default); or forced to one (ring fails with -EPROTONOSUPPORT
 * where no ring is offered). The environment variable REGEN_TRANSPORT
 * (auto, varlink, ring) sets the default for new clients. */
enum regen_transport { REGEN_TRANSPORT_AUTO = 0, REGEN_TRANSPORT_VARLINK, REGEN_TRANSPORT_RING };
REGEN_EXPORT int regen_client_set_transport(regen_client *c, enum regen_transport t);
/* What the device's lane uses now: RING or VARLINK, AUTO before its first
 * compute call. */
REGEN_EXPORT enum regen_transport regen_client_transport(const regen_client *c, int device);

/* Calls and Runs in the ring record's terms (proto/ring.h), their
 * buffers, events and programs named by id: for a binding of another
 * language that makes a record's fields itself and keeps its objects as
 * ids (the Python client's regen._accel). libregen binds the ids on the
 * device's lane as for the calls above and queues the call or Run there
 * (the ring's records, or the Varlink call: the same descriptor either
 * way); regend checks every field. What a record cannot say is refused
 * here, unsent, with the error regend names it by (regen_client_error_name:
 * InvalidParameter naming the field, InvalidOperand for an id that names no
 * buffer) and -EINVAL. Objects of another device are regend's to refuse. */
#define REGEN_RECORD_OPERANDS 11

struct regen_record_operand {
	const char *buffer;                /* the buffer's id ("b0.3.17"); NULL: the slot is empty */
	enum regen_dtype dtype;
	uint32_t rank;                     /* 1 to 4 */
	uint64_t offset;                   /* bytes */
	int64_t shape[4];
	int64_t strides[4];                /* elements, as given (no contiguous default) */
};

struct regen_record_call {
	uint32_t op;                       /* 0 Gemm, 1 Attention, 2 AttentionBackward, 3 LayerNorm, 4 LayerNormBackward,
					    * 5 Quantize, 6 TransposeQuantize, 7 ScaleUpdate */
	uint32_t flags;                    /* Gemm: 1 trans_a, 2 trans_b; attention: 4 causal */
	uint32_t epilogue;                 /* Gemm: enum regen_epilogue; ScaleUpdate: enum regen_fp8_format */
	uint32_t compute;                  /* Gemm: 0 f32, 1 tf32, 2 fp8_fast_accum; ScaleUpdate: enum regen_amax_compute */
	uint32_t alignment;                /* attention: enum regen_causal_alignment */
	double alpha, beta;                /* Gemm (no defaults: 1 and 0 are given) */
	double scale;                      /* attention: 0 = 1/sqrt(D); LayerNorm: eps, 0 = 1e-5; ScaleUpdate: margin */
	uint32_t deadline_ms;              /* 0: regend's default */
	const char *wait_event, *signal_event;   /* ids; NULL: none */
	struct regen_record_operand operands[REGEN_RECORD_OPERANDS];   /* by the op's slots */
};
REGEN_EXPORT int regen_record_submit(regen_client *c, int device, const struct regen_record_call *call,
				     uint64_t *ticket);

/* A Run's bindings and scalars by their position in the program's binding
 * order (Define's `bound`) and by name (a Varlink call names them). */
struct regen_record_binding {
	uint32_t bound;
	const char *name;
	const char *buffer;                /* id */
	uint64_t offset;                   /* bytes */
};
struct regen_record_scalar {
	uint32_t bound;
	const char *name;
	double value;                      /* finite */
};
struct regen_record_run {
	const char *program;               /* id ("p0.0.4") */
	const struct regen_record_binding *bind;
	size_t nbind;
	const struct regen_record_scalar *scalars;
	size_t nscalars;
	const char *wait_event, *signal_event;   /* ids; NULL: none */
	uint32_t deadline_ms;              /* 0: regend's default */
	const char *journal;               /* a buffer's id; NULL: none (seq 0, retry false) */
	uint64_t journal_offset, seq;
	bool retry;
	bool journal_marks;                /* with a journal: marks only, no copies */
};
REGEN_EXPORT int regen_record_run_submit(regen_client *c, int device, const struct regen_record_run *run,
					 uint64_t *ticket);

/* The ticket of the call whose error the last regen_wait returned: the
 * first among the calls it waited for, which need not be the one it named
 * (0 after a wait that returned no call's error). */
REGEN_EXPORT uint64_t regen_client_error_ticket(const regen_client *c);
/* The device's lane: tickets handed out, and answers read (its calls
 * answered so far, in order). -EINVAL for a bad device. */
REGEN_EXPORT int regen_client_tickets(const regen_client *c, int device, uint64_t *submitted, uint64_t *completed);
/* Doorbells this client rang on its lanes' rings: records that found the
 * worker asleep (each a system call here and a wake-up there). */
REGEN_EXPORT uint64_t regen_client_doorbells(const regen_client *c);

/* The pool: memory that regend maps once per chunk (client/pool.c).
 *
 * Chunks are CUDA VMM allocations exported as POSIX fds (or, for the host
 * backend, memfds); allocations are carved out of them. regen_pool_lookup
 * imports a pointer's chunk into regend once per generation, on the pool's
 * own connection, and names the buffer and the offset: memory from the pool
 * needs no import of its own. A chunk whose last allocation is freed is
 * closed in regend and given back. The pool is one per process and
 * thread-safe. libregen loads the CUDA driver at run time (it does not link
 * it); without one the CUDA calls fail and say why (regen_pool_error).
 *
 * regen_pool_alloc and regen_pool_free have the signatures of torch's
 * CUDAPluggableAllocator: torch.cuda.MemPool(CUDAPluggableAllocator(
 * "libregen.so.0", "regen_pool_alloc", "regen_pool_free").allocator()).
 * Chunks are $REGEN_POOL_CHUNK_MB MiB (default 256); a request over half a
 * chunk gets a chunk of its own. A request over 256 TiB, or one the driver
 * or the kernel refuses, returns NULL (regen_pool_error says why). A free of
 * anything the pool did not hand out by that function (another pointer, one
 * inside an allocation, a second free) is ignored. */
REGEN_EXPORT void *regen_pool_alloc(size_t size, int device, void *stream);
REGEN_EXPORT void regen_pool_free(void *ptr, size_t size, int device, void *stream);
/* on: the pool is the process's whole CUDA allocator (torch's current
 * allocator through torch.cuda.memory.change_current_allocator, no caching
 * allocator above it), and does that one's work: empty CUDA chunks are kept
 * for the next allocations, and memory freed on a stream (torch passes the
 * stream it was allocated on) is taken again only by an allocation on that
 * stream, until a synchronisation (regen_pool_trim, or an allocation the
 * driver refuses) settles it. torch's record_stream does not reach the
 * pool: memory used on another stream must outlive that use. off (the
 * default, under a MemPool): empty chunks go at once, frees are not
 * ordered; switching off trims first. 0, or -errno from the trim. */
REGEN_EXPORT int regen_pool_set_process_allocator(int on);
/* Synchronises the devices that have CUDA chunks, settles every pending
 * free and gives the empty chunks back to the driver (closed in regend).
 * 0, or -errno (regen_pool_error says why) when a device could not be
 * synchronised: its chunks stay as they were. */
REGEN_EXPORT int regen_pool_trim(void);
/* Host memory (memfd chunks) for regend's host backend. */
REGEN_EXPORT void *regen_pool_alloc_host(size_t size);
REGEN_EXPORT void regen_pool_free_host(void *ptr);
/* socket_path NULL: unchanged ($REGEN_SOCKET, else the default); another
 * path closes the imports into the old regend first.
 * chunk_bytes 0: unchanged; else a multiple of 1 MiB, at least 2 MiB. */
REGEN_EXPORT int regen_pool_configure(const char *socket_path, uint64_t chunk_bytes);
/* regend's index of this process's CUDA device `local_device` (they differ
 * when CUDA_VISIBLE_DEVICES differs); -1: the same index (the default). */
REGEN_EXPORT int regen_pool_map_device(int local_device, int regend_device);

struct regen_pool_ref {
	size_t size;               /* set by the caller: sizeof(struct regen_pool_ref) */
	char buffer[64];           /* the chunk's buffer id in regend */
	int device;                /* regend's index */
	uint64_t generation;       /* of the import */
	uint64_t offset;           /* of the pointer in the buffer, bytes */
	uint64_t extent;           /* bytes from the pointer to the end of the chunk */
	uint64_t chunk;            /* the chunk's serial in this process */
	uint64_t chunk_size;
};
/* The buffer and offset of `ptr`, importing its chunk first when it is not
 * imported in the current generation. host_device: regend's device for host
 * memory (CUDA memory goes to its own device). -ENOENT: not pool memory;
 * -EREMOTE: regend refused the import (regen_pool_error_name says how);
 * -ECONNREFUSED, -ECONNRESET, -ETIMEDOUT: regend (or the device's worker)
 * cannot be reached now. */
REGEN_EXPORT int regen_pool_lookup(const void *ptr, int host_device, struct regen_pool_ref *out);
/* regend's `device` reached `generation`: imports of older generations are
 * gone, and the next lookup imports again. */
REGEN_EXPORT void regen_pool_note_generation(int device, uint64_t generation);
/* A counter that changes whenever an answer of regen_pool_lookup may no
 * longer hold: a chunk's import closed (the chunk freed, or its generation
 * gone) or a device mapping changed. A caller may keep lookup's answers
 * (per chunk: the pointer minus its offset, up to its extent) while the
 * counter stays where it was when it asked; reading it takes no lock. */
REGEN_EXPORT uint64_t regen_pool_epoch(void);

struct regen_pool_stats {
	size_t size;               /* set by the caller: sizeof(struct regen_pool_stats) */
	uint64_t chunks, chunk_bytes;   /* held now */
	uint64_t used_bytes;       /* handed out now */
	uint64_t imports;          /* chunks imported into regend now */
	uint64_t allocs, frees, import_calls;   /* since the start */
	/* Imports of freed chunks whose close got no answer (the connection
	 * broke, the time ran out), now: regend may still map them. Each is
	 * closed again whenever the pool next calls regend (an import, a
	 * chunk's close, regen_pool_trim), and forgotten once its generation
	 * is gone. */
	uint64_t unclosed;
	/* Imports sent that got no answer, since the start: regend may have
	 * made one, under an id the pool never learnt, and maps it until the
	 * device's generation ends or this process's last connection to its
	 * worker closes. */
	uint64_t imports_unanswered;
};
REGEN_EXPORT int regen_pool_stats_get(struct regen_pool_stats *out);
/* The last failure's message ("" if none) and regend's error name (NULL if
 * the failure was not regend's). Not thread-safe: for diagnostics. */
REGEN_EXPORT const char *regen_pool_error(void);
REGEN_EXPORT const char *regen_pool_error_name(void);
/* 0 when the CUDA driver is there with the VMM calls the pool needs, else
 * -ENODEV or -ENOTSUP (regen_pool_error says why). */
REGEN_EXPORT int regen_pool_cuda_available(void);
/* The CUDA allocation that holds `ptr` (cuMemGetAddressRange): its base
 * and size. For importing a cudaMalloc block once, whatever part of it a
 * tensor uses. */
REGEN_EXPORT int regen_cuda_address_range(const void *ptr, uint64_t *base, uint64_t *size);

/* Kept state (io.regen.Keep): memory regend holds for a rank, so that a new
 * process of the same job and rank takes it back after the rank's process
 * died, and resumes from it instead of from a checkpoint. The memory is the
 * rank's own (a memfd, or a CUDA VMM allocation exported as a POSIX fd):
 * regend holds its fd under a key (job, rank, name) of the caller's uid.
 * The set of a job and rank is held while the process that last kept,
 * committed or took back in it has this client's main connection (or
 * another of its own) open; when the process goes, a lease of lease_ms
 * starts, and at its end regend lets the memory go. docs/protocol.md, "Kept
 * state", says it all. job NULL: the job that names the connection (its
 * cgroup's, or the one it stated; REGEN_ERROR_INVALID_JOB when there is
 * none). */
enum regen_memory_kind { REGEN_MEMORY_HOST_FD = 0, REGEN_MEMORY_CUDA_FD };

/* One kept name, as regend lists it. */
struct regen_kept {
	size_t size;               /* sizeof the struct: set by the caller where it passes one */
	char job[65];
	uint32_t rank;
	char name[65];
	uint32_t uid;
	enum regen_memory_kind kind;
	int device;                /* cuda_fd: regend's device; -1 for host_fd */
	uint64_t bytes;
	bool has_step;             /* a step was committed (regen_keep_commit) */
	uint64_t step;
	bool held;                 /* a live process holds the set */
	int64_t holder_pid;        /* as regend sees it; 0: none, or unseen */
	uint32_t lease_ms;
	int64_t expires_unix_ms;   /* when the lease ends; -1 while held */
	int64_t kept_unix_ms;
};

struct regen_keep_args {
	const char *job;           /* NULL: the connection's job */
	uint32_t rank;
	const char *name;          /* 1 to 64 bytes of A-Z a-z 0-9 _ . : - */
	enum regen_memory_kind kind;
	/* host_fd: a memfd made with MFD_ALLOW_SEALING, exactly `bytes` long
	 * (regend seals it against shrinking and growing); cuda_fd: a VMM
	 * export of exactly `bytes` on regend's `device`. The caller keeps its
	 * own fd. */
	int fd;
	uint64_t bytes;
	int device;                /* cuda_fd: regend's device; host_fd: -1 */
	uint32_t lease_ms;         /* 0: regend's keep_lease_ms (also the most) */
};
/* Keeps the memory (a name kept before in the set is replaced). out (may
 * be NULL; set its size) receives what regend lists. */
REGEN_EXPORT int regen_keep(regen_client *c, const struct regen_keep_args *args, struct regen_kept *out);
/* Records `step` as the set's last completed step, once its writes are
 * done (the stream synchronised): for a rank that updates its state with
 * its own kernels. A Run of io.regen.Program with a journal records its
 * own (docs/protocol.md). */
REGEN_EXPORT int regen_keep_commit(regen_client *c, const char *job, uint32_t rank, uint64_t step);
/* Takes back one name of the caller's uid's set: *fd is the memory's fd
 * (the caller's to map and close), out (may be NULL; set its size) what
 * regend lists of it. The name stays kept, and this process holds the set
 * from now on. REGEN_ERROR_NO_SUCH_OBJECT when nothing is kept under it. */
REGEN_EXPORT int regen_keep_take_back(regen_client *c, const char *job, uint32_t rank, const char *name,
				      struct regen_kept *out, int *fd);
/* Frees kept memory now: the name, the set (name NULL), or every set of
 * the job (rank < 0, name NULL). *names and *bytes (may be NULL): what was
 * dropped. */
REGEN_EXPORT int regen_keep_drop(regen_client *c, const char *job, int64_t rank, const char *name, uint64_t *names,
				 uint64_t *bytes);
/* Every name kept on the node (job NULL) or of the job. */
typedef struct regen_kept_list regen_kept_list;
REGEN_EXPORT int regen_keep_list(regen_client *c, const char *job, regen_kept_list **out);
REGEN_EXPORT size_t regen_kept_list_count(const regen_kept_list *l);
REGEN_EXPORT const struct regen_kept *regen_kept_list_get(const regen_kept_list *l, size_t i);
/* Accepts NULL. */
REGEN_EXPORT void regen_kept_list_free(regen_kept_list *l);

/* The pool's side of kept state. regen_pool_chunk_of says which chunk holds
 * ptr: its serial (for a caller that keeps each chunk once), ptr's offset
 * in it, its size and device (the local CUDA ordinal; -1 for host memory).
 * regen_pool_keep keeps that whole chunk under (job, rank, name) on the
 * pool's own connection. regen_pool_adopt maps memory taken back
 * (regen_keep_take_back) as a chunk of this process's pool, and takes the
 * fd: *base is its address, tensors are found at their offsets from it,
 * and regen_pool_lookup imports it into regend as any chunk. device: the
 * local CUDA ordinal (-1: host memory); kind: how the fd maps (a host_fd
 * with a device is a chunk of $REGEN_POOL_FAKE_CUDA's memfd CUDA). On
 * failure the fd stays the caller's. The chunk stays until the process
 * exits: nothing is carved from it, no free reaches it. */
struct regen_pool_chunk {
	size_t size;               /* set by the caller: sizeof(struct regen_pool_chunk) */
	uint64_t chunk;
	uint64_t offset;
	uint64_t bytes;
	int device;
	enum regen_memory_kind kind;   /* what regen_pool_keep keeps it as */
};
REGEN_EXPORT int regen_pool_chunk_of(const void *ptr, struct regen_pool_chunk *out);
REGEN_EXPORT int regen_pool_keep(const void *ptr, const char *job, uint32_t rank, const char *name,
				 uint32_t lease_ms);
REGEN_EXPORT int regen_pool_adopt(int fd, enum regen_memory_kind kind, int device, uint64_t bytes, void **base);

/* Communicators (io.regen.Comm): NCCL on the CUDA backend; on the host
 * backend the ranks are connections to the workers of one regend (tests
 * the control plane, not the GPU path). */
typedef struct regen_comm regen_comm;

#define REGEN_COMM_UNIQUE_ID_BYTES 128

/* avg: floating-point dtypes only. */
enum regen_reduce_op { REGEN_REDUCE_SUM = 0, REGEN_REDUCE_MAX, REGEN_REDUCE_AVG, REGEN_REDUCE_MIN, REGEN_REDUCE_PROD };

/* A new unique id for rank 0 to hand to the other ranks. */
REGEN_EXPORT int regen_comm_unique_id(regen_client *c, int device, unsigned char id[REGEN_COMM_UNIQUE_ID_BYTES]);

struct regen_comm_init_args {
	int device;
	const unsigned char *unique_id;    /* REGEN_COMM_UNIQUE_ID_BYTES */
	uint32_t rank, nranks;
	const char *key;                   /* NULL: not re-attachable */
	uint32_t deadline_ms;              /* 0: regend's default */
};
/* Joins; returns once every rank joined (REGEN_ERROR_COMM_TIMEOUT past the
 * deadline). */
REGEN_EXPORT int regen_comm_init(regen_client *c, const struct regen_comm_init_args *args, regen_comm **out);
/* Takes back the detached communicator `key` names (its process gone). */
REGEN_EXPORT int regen_comm_attach(regen_client *c, int device, const char *key, regen_comm **out);

/* send and recv: rank-1 contiguous tensors (strides ignored) of one dtype
 * on the communicator's device (Send takes send alone, Recv recv alone). */
struct regen_collective_args {
	regen_comm *comm;
	struct regen_tensor send, recv;
	enum regen_reduce_op op;           /* AllReduce, ReduceScatter */
	uint32_t root;                     /* Broadcast */
	uint32_t peer;                     /* Send, Recv: the other rank */
	uint32_t deadline_ms;              /* 0: regend's default */
	const regen_event *wait_event, *signal_event;
};
REGEN_EXPORT int regen_comm_all_reduce(regen_client *c, const struct regen_collective_args *args);
REGEN_EXPORT int regen_comm_all_gather(regen_client *c, const struct regen_collective_args *args);
REGEN_EXPORT int regen_comm_reduce_scatter(regen_client *c, const struct regen_collective_args *args);
REGEN_EXPORT int regen_comm_broadcast(regen_client *c, const struct regen_collective_args *args);
/* recv [nranks * n]: block k is rank k's block `rank` of its send. */
REGEN_EXPORT int regen_comm_all_to_all(regen_client *c, const struct regen_collective_args *args);
/* send to rank `peer`; its k-th Recv from this rank takes this rank's k-th
 * Send to it (same length and dtype). */
REGEN_EXPORT int regen_comm_send(regen_client *c, const struct regen_collective_args *args);
REGEN_EXPORT int regen_comm_recv(regen_client *c, const struct regen_collective_args *args);
/* Stops it now: calls in flight and later ones fail with CommFailed. */
REGEN_EXPORT int regen_comm_abort(regen_comm *comm);
/* Ends it in the worker (finalize + destroy, or with `abort` an abort even
 * with calls in flight; unless its generation is gone) and frees the
 * handle, also when the call failed. Accepts NULL. */
REGEN_EXPORT int regen_comm_destroy(regen_comm *comm, bool abort, uint32_t deadline_ms);
REGEN_EXPORT const char *regen_comm_id(const regen_comm *comm);
REGEN_EXPORT uint64_t regen_comm_generation(const regen_comm *comm);
REGEN_EXPORT int regen_comm_device(const regen_comm *comm);
REGEN_EXPORT uint32_t regen_comm_rank(const regen_comm *comm);
REGEN_EXPORT uint32_t regen_comm_nranks(const regen_comm *comm);
/* Collectives it ran, as Attach reported (0 after Init). */
REGEN_EXPORT uint64_t regen_comm_collectives(const regen_comm *comm);

/* Any method, parameters as JSON text (NULL = {}). device >= 0 sends it to
 * that device's worker socket, < 0 to the main socket. On success *reply
 * (malloc'ed JSON of the reply's parameters, free()) is set. fds (may be
 * NULL) travel with the call. */
REGEN_EXPORT int regen_call(regen_client *c, int device, const char *method, const char *params_json, const int *fds, size_t nfds, char **reply);

#ifdef __cplusplus
}
#endif
