/* SPDX-License-Identifier: Apache-2.0 */
/* A raw Varlink peer for tests: calls written as JSON text, replies read
 * with proto/'s framing (fds as SCM_RIGHTS), and bytes sent exactly as given
 * where a test means to be malformed. Every wait has a deadline (scaled,
 * harness.h). */
#pragma once

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <cjson/cJSON.h>
#include "proto/frame.h"
#include "tests/lib/asserts.h"

struct tl_conn {
	int fd;
	struct rp_rx rx;
	/* Called while a receive waits, for a peer that runs on this thread
	 * (a unit test's event loop). */
	void (*pump)(void *data);
	void *pump_data;
};

/* 0 or -errno (the connect's). */
int tl_conn_open(struct tl_conn *c, const char *path);
/* Wraps a connected socket (a socketpair's end); takes it. */
void tl_conn_adopt(struct tl_conn *c, int fd);
void tl_conn_close(struct tl_conn *c);

/* Sends a call; params_fmt is the JSON text of "parameters", printf-style
 * (NULL: {}). 0, or the -errno of a peer that closed (-EPIPE...). */
int tl_send(struct tl_conn *c, const char *method, const int *fds, size_t nfds, const char *params_fmt, ...)
	__attribute__((format(printf, 5, 6)));
/* Sends text and its NUL in one write, fds with it. 0 or -errno. */
int tl_send_text(struct tl_conn *c, const char *text, const int *fds, size_t nfds);
/* Sends exactly len bytes (a NUL only if they hold one): for malformed and
 * oversized messages; fds go with the first write. 0 or -errno. */
int tl_send_bytes(struct tl_conn *c, const void *data, size_t len, const int *fds, size_t nfds);

/* The next message's text (malloc'ed), NULL at the end of the stream or
 * after timeout_s. */
char *tl_recv_text(struct tl_conn *c, double timeout_s);

struct tl_reply {
	char *error;            /* NULL on success */
	cJSON *params;          /* the reply's parameters (owned) */
	bool continues;
};
/* The next reply: 0, -ETIMEDOUT, or -ECONNRESET when the connection ended.
 * A message that is not a reply fails the test. */
int tl_recv(struct tl_conn *c, struct tl_reply *r, double timeout_s);
void tl_reply_finish(struct tl_reply *r);
/* A parameter (NULL / -1 when absent or of another type). */
const char *tl_reply_str(const struct tl_reply *r, const char *key);
int64_t tl_reply_int(const struct tl_reply *r, const char *key);
/* The parameters as JSON text, for messages (a static buffer per thread). */
const char *tl_reply_text(const struct tl_reply *r);

/* Send and receive; fails the test when no reply comes within timeout_s. */
void tl_call(struct tl_conn *c, struct tl_reply *r, double timeout_s, const int *fds, size_t nfds, const char *method,
	     const char *params_fmt, ...) __attribute__((format(printf, 7, 8)));
/* The same with 60 s, and the call must succeed. */
void tl_call_ok(struct tl_conn *c, struct tl_reply *r, const char *method, const char *params_fmt, ...)
	__attribute__((format(printf, 4, 5)));

/* A reply that is not an error / is the error `name`. */
#define ASSERT_REPLY_OK(r, ...)                                                                         \
	do {                                                                                            \
		if ((r)->error != NULL) {                                                               \
			tl_fail_values(__FILE__, __LINE__, #r " succeeded", tl_reply_describe(r),       \
				       TL_MSG(__VA_ARGS__));                                            \
		}                                                                                       \
	} while (0)
#define ASSERT_REPLY_ERROR(r, name, ...)                                                                \
	do {                                                                                            \
		if (!tl_str_eq((r)->error, (name))) {                                                   \
			tl_fail_values(__FILE__, __LINE__, #r " failed with " #name, tl_reply_describe(r), \
				       TL_MSG(__VA_ARGS__));                                            \
		}                                                                                       \
	} while (0)
/* "io.regen.X {...}" or "success {...}" (a static buffer per thread). */
const char *tl_reply_describe(const struct tl_reply *r);

/* io.regen.Device.Status of one device, on a main-socket connection. */
struct tl_device {
	int64_t generation, worker_pid, memory_used, memory_baseline, respawns;
	char state[16];
	char worker_socket[256];
};
void tl_device_status(struct tl_conn *main_conn, int device, struct tl_device *out);

/* io.regen.Memory.ImportBuffer of a whole memfd (host_fd) on a worker-socket
 * connection: 0 with the id in id_out (RP_ID_MAX bytes), or -1 with the
 * error in *r. *r is always filled; the caller finishes it. */
int tl_import_memfd(struct tl_conn *c, int device, int fd, size_t size, char *id_out, struct tl_reply *r);
