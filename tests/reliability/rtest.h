/* Reliability test helpers: a real regend started with the options a test
 * needs, raw Varlink connections (proto/ framing, fds by SCM_RIGHTS),
 * memfd buffers, and /proc readings of a process. Every failure prints
 * where and why and exits 1; a test that cannot run here exits 77. */
#pragma once

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <sys/types.h>
#include <cjson/cJSON.h>
#include "proto/frame.h"

#define RT_CHECK(cond, ...) \
	do { \
		if (!(cond)) \
			rt_fail(__FILE__, __LINE__, #cond, __VA_ARGS__); \
	} while (0)

void rt_fail(const char *file, int line, const char *cond, const char *fmt, ...)
	__attribute__((format(printf, 4, 5), noreturn));
void rt_log(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
void rt_skip(const char *fmt, ...) __attribute__((format(printf, 1, 2), noreturn));
double rt_now(void);

struct rt_daemon {
	pid_t pid;
	char dir[64];
	char sock[128];
	char log[128];
	int ndevices;
};

/* Starts <build>/daemon/regend --socket <tmp>/s --backend host --devices 2
 * --enable-fault-injection plus `extra` (NULL-terminated, may be NULL) and
 * waits until every device is ready. "--pid-namespace" in extra is not
 * passed on: it runs regend in a pid namespace of its own, where every
 * client is pid 0. Stopped at exit; the whole test has an
 * alarm of limit_s seconds. */
void rt_daemon_start(struct rt_daemon *d, const char *const *extra, unsigned limit_s);
void rt_daemon_stop(struct rt_daemon *d);
/* "<sock>.dev<N>" */
const char *rt_worker_socket(const struct rt_daemon *d, int device);

/* One raw connection. */
struct rt_conn {
	int fd;
	struct rp_rx rx;
};

/* 0 or -errno (the connect's). */
int rt_connect(struct rt_conn *c, const char *path);
void rt_close(struct rt_conn *c);
/* Sends a call; params_fmt is JSON text for "parameters" (printf-style,
 * NULL = {}). Dies on a write error unless the peer closed (-EPIPE etc.
 * returned). */
int rt_send(struct rt_conn *c, const char *method, const int *fds, size_t nfds, const char *params_fmt, ...)
	__attribute__((format(printf, 5, 6)));

struct rt_reply {
	char *error;         /* NULL on success */
	cJSON *params;       /* the reply's parameters (owned) */
	bool continues;
};
/* Next reply: 0, -ETIMEDOUT, or -ECONNRESET when the connection ended. */
int rt_recv(struct rt_conn *c, struct rt_reply *r, double timeout_s);
void rt_reply_finish(struct rt_reply *r);
/* A parameter as text (NULL when absent or not a string/number). */
const char *rt_reply_str(const struct rt_reply *r, const char *key);
int64_t rt_reply_int(const struct rt_reply *r, const char *key);

/* Send + receive; dies when no reply comes within timeout_s. */
void rt_call(struct rt_conn *c, struct rt_reply *r, double timeout_s, const int *fds, size_t nfds, const char *method,
	     const char *params_fmt, ...) __attribute__((format(printf, 7, 8)));
/* The same, and the call must succeed. */
void rt_call_ok(struct rt_conn *c, struct rt_reply *r, const char *method, const char *params_fmt, ...)
	__attribute__((format(printf, 4, 5)));

/* A memfd of `size` bytes (zeroed). */
int rt_memfd(size_t size);
/* ImportBuffer host_fd of the whole memfd on `device`, on a worker-socket
 * connection: 0 with the id in id_out (64 bytes), or -1 with the error in
 * *r. *r is always filled; the caller finishes it. */
int rt_import(struct rt_conn *c, int device, int fd, size_t size, char *id_out, struct rt_reply *r);

/* Device info from io.regen.Device.Status on a main-socket connection. */
struct rt_device {
	int64_t generation, worker_pid, memory_used, memory_baseline, respawns;
	char state[16];
};
void rt_status(struct rt_conn *main_conn, int device, struct rt_device *out);

/* /proc readings of a process. */
struct rt_proc {
	long fds, rss_kb, maps, threads;
	bool asan;     /* AddressSanitizer is mapped: its quarantine holds freed memory */
};
void rt_proc_read(pid_t pid, struct rt_proc *p);

/* Drops to `nobody` (and the given gid, or nobody's group when gid < 0),
 * with no supplementary groups. Only root can; dies otherwise. */
void rt_become_nobody(gid_t gid, bool keep_gid);
/* The name and gid of a group that exists, that `nobody` is not in and
 * that is not `except` (NULL when there is none). */
const char *rt_group_without_nobody(gid_t except, gid_t *gid);

/* Forks fn in a child; returns its pid. The child exits with fn's value. */
pid_t rt_fork(int (*fn)(void *), void *arg);
/* Exit status of a child (dies after timeout_s). */
int rt_wait(pid_t pid, double timeout_s);
