/* Integration test helpers: a real regend per test program, forked client
 * processes, memfd buffers, raw socket access, and double-precision
 * references for GEMM and attention. */
#pragma once

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <sys/types.h>
#include "regen.h"

/* Fails the current process (test program or forked client) with a message. */
#define CHECK(cond, ...) \
	do { \
		if (!(cond)) { \
			it_fail(__FILE__, __LINE__, #cond, __VA_ARGS__); \
		} \
	} while (0)
/* A libregen call that must succeed. */
#define CHECK_OK(c, expr) \
	do { \
		int _r = (expr); \
		if (_r < 0) { \
			it_fail_call(__FILE__, __LINE__, #expr, (c), _r); \
		} \
	} while (0)

void it_fail(const char *file, int line, const char *cond, const char *fmt, ...)
	__attribute__((format(printf, 4, 5), noreturn));
void it_fail_call(const char *file, int line, const char *expr, regen_client *c, int r) __attribute__((noreturn));
void it_log(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
double it_now(void);

/* The daemon under test. */
struct it_daemon {
	pid_t pid;
	char dir[128];
	char sock[256];
	char log[256];
	char regend[512];
	char regenctl[512];
	int ndevices;
};

struct it_daemon_opts {
	const char *admin_group;    /* NULL: none */
	bool no_fault_injection;
	const char *const *extra_args;   /* more regend arguments, NULL-terminated; NULL: none */
};

/* Starts <build>/daemon/regend in a fresh temp dir and waits until every
 * device is ready. Exits 77 (skipped) when regend has not been built. The
 * daemon is stopped at exit (and on SIGALRM: every test program has an
 * overall alarm of `limit_s`). */
void it_daemon_start(struct it_daemon *d, const struct it_daemon_opts *opts, unsigned limit_s);
void it_daemon_stop(struct it_daemon *d);
/* Stops regend (SIGTERM; fails after 10 s) and starts it again on the same
 * socket, waiting until it is ready. */
void it_daemon_restart(struct it_daemon *d, const struct it_daemon_opts *opts);
/* True while the daemon process is alive. */
bool it_daemon_alive(struct it_daemon *d);
void it_daemon_dump_log(const struct it_daemon *d);
regen_client *it_connect(const struct it_daemon *d);
/* Status, or dies (regen_status_free). */
regen_status *it_status(regen_client *c);
/* The device with this index in st, or dies. */
const struct regen_device_info *it_device(const regen_status *st, int index);
/* Polls Status until `device` is ready in a generation > `after`; returns
 * the new generation (dies after timeout_s). */
uint64_t it_wait_generation(regen_client *c, int device, uint64_t after, double timeout_s);

/* Forked helpers: fn's return value is the child's exit status. A child
 * never stops the daemon. */
pid_t it_fork(int (*fn)(void *), void *arg, unsigned limit_s);
/* Waits for the children; those still running after timeout_s are killed.
 * Returns how many failed (non-zero exit, signal or timeout). */
int it_wait_children(const pid_t *pids, int n, double timeout_s);

/* Runs argv[0] with the arguments, stdout and stderr captured (malloc'ed,
 * may be NULL). as_uid >= 0: drop to that uid/gid before exec. Returns the
 * exit status, or -1 for a signal or the timeout. */
int it_run(char *const argv[], char **out, char **err, double timeout_s, int as_uid, int as_gid);

/* Host memory shared with the worker. */
struct it_mem {
	int fd;
	size_t size;
	unsigned char *ptr;
	regen_buffer *buf;
};
/* Creates a memfd of `size`, maps it and imports it (dies on failure). */
void it_mem_create(regen_client *c, int device, size_t size, struct it_mem *m);
/* Creates and maps only. */
void it_mem_alloc(size_t size, struct it_mem *m);
/* Imports again (after a generation change); returns the libregen result. */
int it_mem_import(regen_client *c, int device, struct it_mem *m);
void it_mem_free(struct it_mem *m);

/* Random numbers: per process, seeded from pid and time (printed). */
void it_rand_seed(uint64_t seed);
uint64_t it_rand_seed_default(void);
double it_rand_uniform(double lo, double hi);
int it_rand_int(int lo, int hi);

/* Element storage. */
size_t it_dtype_size(enum regen_dtype dt);
const char *it_dtype_name(enum regen_dtype dt);
double it_load(enum regen_dtype dt, const void *base, size_t index);
/* Stores with round-to-nearest-even; returns the value as stored. */
double it_store(enum regen_dtype dt, void *base, size_t index, double v);
void it_poison(enum regen_dtype dt, void *base, size_t count);
/* Relative spacing of the type (2^-23, 2^-10, 2^-7). */
double it_dtype_eps(enum regen_dtype dt);

/* A GEMM case on one buffer: random inputs, poisoned output, reference. */
struct it_gemm_case {
	enum regen_dtype in, out;
	int m, n, k;
	bool trans_a, trans_b;
	double alpha, beta;
	bool with_c;
	bool with_bias;
	enum regen_epilogue epilogue;
	int pad;                    /* extra elements per row of A, B, C, D (strides) */
};
/* Bytes the case needs. */
size_t it_gemm_bytes(const struct it_gemm_case *gc);
/* Fills inputs at m->ptr + base, poisons D, runs regen_gemm, checks D
 * against a double reference. Returns the regen_gemm result; on success
 * a wrong result is reported in `why` (returns 1). */
int it_gemm_run(regen_client *c, struct it_mem *m, uint64_t base, const struct it_gemm_case *gc, char *why, size_t why_size);
void it_gemm_random_case(struct it_gemm_case *gc, int max_dim);
void it_gemm_describe(const struct it_gemm_case *gc, char *buf, size_t size);

/* Attention forward and backward on three buffers. */
struct it_attn_case {
	enum regen_dtype dt;
	int b, h, sq, skv, d, dv;
	bool causal;
	double scale;               /* 0: default */
};
int it_attention_run(regen_client *c, int device, const struct it_attn_case *ac, char *why, size_t why_size);
void it_attn_describe(const struct it_attn_case *ac, char *buf, size_t size);

/* Raw Varlink over a plain socket: bytes as given, replies split at NUL. */
struct it_raw {
	int fd;
	char *buf;
	size_t len, cap;
};
int it_raw_connect(struct it_raw *r, const char *path);
void it_raw_close(struct it_raw *r);
/* Sends exactly `len` bytes (include the NUL yourself) with fds. */
int it_raw_send(struct it_raw *r, const void *data, size_t len, const int *fds, size_t nfds);
/* Sends a string plus its NUL. */
int it_raw_send_str(struct it_raw *r, const char *text, const int *fds, size_t nfds);
/* Next NUL-terminated message (malloc'ed), NULL on end of stream/timeout. */
char *it_raw_recv(struct it_raw *r, double timeout_s);

/* The name of a group `nobody` is not a member of (NULL if none found). */
const char *it_group_without_nobody(void);
