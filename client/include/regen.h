/* libregen: the client library of regend.
 *
 * A regen_client holds one connection to regend's main socket (control:
 * Status, Watch, Release/Reset/Restart) and, on first use of a device, one to
 * that device's worker socket (data: buffers, GEMM, attention), found through
 * Status. Calls block until their reply. A client is not thread-safe: use one
 * per thread (each is its own lane, so threads run concurrently).
 *
 * Errors: functions return 0 or a negative errno. -EREMOTE means regend
 * answered with a named Varlink error: regen_client_error_name() gives the
 * name (e.g. "io.regen.StaleGeneration") and regen_client_error_message()
 * its message. -ECONNRESET means the connection broke with the call in
 * flight; the next call reconnects. */
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

typedef struct regen_client regen_client;
typedef struct regen_buffer regen_buffer;

#define REGEN_DEVICES_MAX 64

enum regen_dtype { REGEN_F32 = 0, REGEN_F16, REGEN_BF16 };

struct regen_device_info {
	int index;
	uint64_t generation;
	char state[16];          /* "ready", "draining", ... */
	char backend[16];
	char worker_socket[108];
	int64_t worker_pid;
	uint64_t respawns;
	uint64_t memory_used, memory_baseline;
	char reason[128];
};

struct regen_status {
	uint64_t epoch;
	int ndevices;
	struct regen_device_info devices[REGEN_DEVICES_MAX];
	uint64_t elapsed_us;     /* Restart only */
};

/* socket_path NULL: $REGEN_SOCKET, else the built-in default. */
REGEN_EXPORT int regen_client_connect(const char *socket_path, regen_client **out);
/* Closes the connections; buffers still open are closed by regend when it
 * sees the connection go. Accepts NULL. */
REGEN_EXPORT void regen_client_destroy(regen_client *c);
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

struct regen_info {
	char vendor[64];
	char product[64];
	char version[32];
};

/* The handshake: org.varlink.service.GetInfo on the main socket. Says who
 * answers, and fails with -EPROTONOSUPPORT when the peer does not serve
 * io.regen.Device (a socket of something else). */
REGEN_EXPORT int regen_hello(regen_client *c, struct regen_info *out);

REGEN_EXPORT int regen_status(regen_client *c, struct regen_status *out);
REGEN_EXPORT int regen_generation(regen_client *c, struct regen_status *out);

/* Lifecycle (admin). device < 0 = all devices. reason may be NULL.
 * deadline_ms <= 0 = the daemon's default. `out` may be NULL. */
REGEN_EXPORT int regen_release(regen_client *c, int device, const char *reason, struct regen_status *out);
REGEN_EXPORT int regen_reset(regen_client *c, int device, const char *reason, struct regen_status *out);
REGEN_EXPORT int regen_restart(regen_client *c, int device, const char *reason, int deadline_ms, struct regen_status *out);
/* kind: "crash", "device_lost", "hang". */
REGEN_EXPORT int regen_inject_fault(regen_client *c, int device, const char *kind);

struct regen_watch_event {
	uint64_t epoch;
	int device;
	uint64_t generation;
	char state[16];
	char reason[128];
};
/* Subscribes and calls cb for the current state, then once per change,
 * until cb returns non-zero (then returns 0), the timeout passes between
 * two events (-ETIMEDOUT; timeout_s <= 0 = forever) or the connection ends.
 * Uses its own connection, so it may run while this client is idle. */
typedef int (*regen_watch_cb)(const struct regen_watch_event *ev, void *userdata);
REGEN_EXPORT int regen_watch(regen_client *c, double timeout_s, regen_watch_cb cb, void *userdata);
/* As regen_watch, and returns -ETIMEDOUT once total_s have passed in all
 * (total_s <= 0 = no overall limit). */
REGEN_EXPORT int regen_watch_full(regen_client *c, double timeout_s, double total_s, regen_watch_cb cb, void *userdata);

/* Buffers. The fd is sent to the worker, which maps it; the caller keeps
 * its own fd and memory. */
REGEN_EXPORT int regen_buffer_import_fd(regen_client *c, int device, int fd, uint64_t size, regen_buffer **out);
/* handle: the 64-byte cudaIpcMemHandle_t. */
REGEN_EXPORT int regen_buffer_import_cuda_ipc(regen_client *c, int device, const void *handle, uint64_t offset, uint64_t size, regen_buffer **out);
/* Closes it in the worker (unless its generation is gone) and frees it. */
REGEN_EXPORT int regen_buffer_close(regen_buffer *buf);
REGEN_EXPORT const char *regen_buffer_id(const regen_buffer *buf);
REGEN_EXPORT uint64_t regen_buffer_generation(const regen_buffer *buf);
REGEN_EXPORT int regen_buffer_device(const regen_buffer *buf);

struct regen_tensor {
	regen_buffer *buffer;
	uint64_t offset;         /* bytes */
	enum regen_dtype dtype;
	int rank;
	int64_t shape[4];
	int64_t strides[4];      /* elements; all zero = contiguous */
};

enum regen_epilogue { REGEN_EPILOGUE_NONE = 0, REGEN_EPILOGUE_BIAS, REGEN_EPILOGUE_GELU, REGEN_EPILOGUE_GELU_BIAS };

struct regen_gemm_args {
	struct regen_tensor a, b, d;
	const struct regen_tensor *c;      /* NULL: none */
	const struct regen_tensor *bias;   /* NULL: none */
	bool trans_a, trans_b;
	double alpha, beta;                /* alpha 0 is taken as 1 only when alpha_set is false */
	bool alpha_set;
	enum regen_epilogue epilogue;
	bool tf32;
};
REGEN_EXPORT int regen_gemm(regen_client *c, const struct regen_gemm_args *args);

struct regen_attention_args {
	struct regen_tensor q, k, v, o;
	const struct regen_tensor *stats;  /* NULL: not wanted */
	double scale;                      /* 0: 1/sqrt(D) */
	bool causal;
};
REGEN_EXPORT int regen_attention(regen_client *c, const struct regen_attention_args *args);

struct regen_attention_backward_args {
	struct regen_tensor q, k, v, o, d_o, stats, d_q, d_k, d_v;
	double scale;
	bool causal;
};
REGEN_EXPORT int regen_attention_backward(regen_client *c, const struct regen_attention_backward_args *args);

/* Any method, parameters as JSON text (NULL = {}). device >= 0 sends it to
 * that device's worker socket, < 0 to the main socket. On success *reply
 * (malloc'ed JSON of the reply's parameters, free()) is set. fds (may be
 * NULL) travel with the call. */
REGEN_EXPORT int regen_call(regen_client *c, int device, const char *method, const char *params_json, const int *fds, size_t nfds, char **reply);

#ifdef __cplusplus
}
#endif
