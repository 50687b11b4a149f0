/* SPDX-License-Identifier: Apache-2.0 */
/* Shared by the fuzz targets that reach the daemon (objects, resolution,
 * dispatch, lifecycle): a reader of fuzz bytes, the stub backend
 * (fuzz_backend.c), the check that a reply is what the IDL promises
 * (fuzz_daemon.c), and the stand-in for the supervisor's worker processes
 * (fuzz_worker_process.c). */
#pragma once

#include <stdbool.h>
#include <stdint.h>
#include "fuzz_common.h"
#include "daemon/backend/backend.h"
#include "daemon/supervisor/worker_process.h"

/* ---- Fuzz bytes as a stream of small numbers ---- */

struct fz_bytes {
	const uint8_t *data;
	size_t size, pos;
};

static inline bool fz_more(const struct fz_bytes *b)
{
	return b->pos < b->size;
}

/* Past the end, every read is 0. */
static inline uint8_t fz_u8(struct fz_bytes *b)
{
	return b->pos < b->size ? b->data[b->pos++] : 0;
}

static inline uint32_t fz_u32(struct fz_bytes *b)
{
	uint32_t v = 0;

	for (int i = 0; i < 4; i++)
		v = v << 8 | fz_u8(b);
	return v;
}

static inline uint64_t fz_u64(struct fz_bytes *b)
{
	return (uint64_t)fz_u32(b) << 32 | fz_u32(b);
}

/* ---- The stub backend (fuzz_backend.c) ----
 *
 * Buffers and events are plain allocations of the size asked (no memory
 * behind them: ptr stays NULL), lanes too; submit records the op and
 * completes it when the harness says (fz_backend_complete_all), as a
 * backend thread would some time later. Every
 * allocation and close is counted, so a harness can hold the core to "every
 * object it made is closed once". */

struct fz_backend_stats {
	unsigned buffers_open, events_open, lanes_open;
	unsigned ops_pending;           /* submitted, not yet completed */
	unsigned long long buffers_made, buffers_closed, events_made, events_closed, ops_submitted, ops_completed;
};

extern struct fz_backend_stats fz_backend_stats;
extern const struct rd_backend_ops fz_backend;
/* Called (when set) for each buffer or event the core closes, before it is
 * freed; the harness checks its own model there. */
extern void (*fz_backend_on_close)(struct rd_object *o);

/* The device the stub backend serves: index 0, generation 1; a finished
 * op's done runs inside fz_backend_complete_all, on the caller's thread (as
 * the worker runs it on its loop thread). */
void fz_device_init(struct rd_device *dev);
/* Completes every op submitted so far, oldest first; returns how many. */
unsigned fz_backend_complete_all(void);
/* While set (the default, and again at each fz_inproc_start), the stub
 * refuses a submit (BackendError) when the op's first operand's offset, in
 * elements, is 7 modulo 13, and fails the completed op when it is 11: both
 * error paths of a compute call, reachable from the bytes. */
extern bool fz_backend_outcomes;

/* ---- Replies as the IDL promises them (fuzz_daemon.c) ---- */

/* Reads the error declarations of io.regen and org.varlink.service from
 * the embedded IDL (once). */
void fz_idl_errors_load(void);
/* One reply's text as the daemon sent it (without its NUL): valid UTF-8
 * that parses as a Varlink reply (no method); an error is one the IDL
 * declares, with every parameter the IDL gives it, of the IDL's type, and
 * no other. The parsed reply is left in *out (rp_call_finish it). */
void fz_check_reply(const char *text, size_t len, struct rp_call *out, const char *where);
/* Whether error `name` is declared by the IDL. */
bool fz_idl_error_known(const char *name);

/* ---- The supervisor's worker processes, replaced (fuzz_worker_process.c) ----
 *
 * fuzz_worker_process.c defines the rd_sv_worker_* functions of
 * daemon/supervisor/worker_process.h, so device.c runs unchanged with no
 * process and no socket: a spawn, a kill and a call on the control channel
 * are recorded, and the harness plays the worker (Ready, Faulted, replies,
 * exit) through the functions below. */

/* A call the device made on the control channel, not yet answered. */
struct fz_ctl_call {
	unsigned serial;                /* calls are numbered from 1, across workers */
	char method[64];
	cJSON *params;
	rd_reply_cb cb;
	void *userdata;
	struct fz_ctl_call *next;
};

struct fz_worker {
	struct rd_sv_worker *w;
	bool running;                   /* spawned and not yet exited */
	bool channel;                   /* its control channel is open */
	bool ready;                     /* it said Ready since it was spawned */
	int killed;                     /* the last signal sent, 0 none */
	unsigned spawns, kills;
	struct fz_ctl_call *calls;      /* oldest first */
	unsigned ncalls;
	unsigned oneway_calls;          /* Epoch and the like: no reply expected */
};

/* The stand-in of the worker whose rd_sv_worker is w (NULL if none). */
struct fz_worker *fz_worker_of(struct rd_sv_worker *w);
/* Spawning fails (the worker's rd_sv_worker_spawn returns -EAGAIN) while set. */
extern bool fz_worker_spawn_fails;
/* The serial the next call will get. */
unsigned fz_ctl_next_serial(void);
/* The worker says Ready / Faulted on its channel (no-op without one);
 * health: its io.regen.Device.Health, or NULL. */
void fz_worker_ready(struct fz_worker *fw, const cJSON *health);
void fz_worker_faulted(struct fz_worker *fw, enum rd_sv_fault kind, const char *reason, const cJSON *health,
		       int64_t uid);
/* The oldest call gets reply (NULL: as if the channel closed); returns
 * false when none waits. reply is borrowed. */
bool fz_worker_answer(struct fz_worker *fw, const struct rp_call *reply);
/* Answers the oldest call as a healthy worker would. */
bool fz_worker_answer_ok(struct fz_worker *fw);
/* The control channel closes (calls waiting get NULL), the process lives. */
void fz_worker_channel_lost(struct fz_worker *fw);
/* The process exits (the channel closes first): of signal, or (0) with a
 * status, RD_WORKER_EXIT_DEVICE_FAILED when device_failed; no-op when not
 * running. */
void fz_worker_exit(struct fz_worker *fw, int signal, bool device_failed);
/* Forgets every worker stand-in (between inputs); their calls are freed
 * unanswered. */
void fz_workers_reset(void);

/* ---- regend's endpoints in process (fuzz_inproc.c) ---- */

enum fz_endpoint { FZ_NONE = 0, FZ_WORKER, FZ_MAIN };

/* The loop and the memfd the clients send: once, before counting fds. */
void fz_inproc_init(void);
/* Sets up a worker on the stub backend, or the supervisor's main socket
 * with two devices and healthy workers played by fuzz_worker_process.c. */
void fz_inproc_start(enum fz_endpoint which);
/* A client connection, accepted by the endpoint's own accept function (on
 * the main socket made admin). Returns the client's end, non-blocking. */
int fz_inproc_connect(void);
/* One turn: the loop without waiting, then the stub backend's completions
 * (worker) or the healthy workers' answers (main). Whether anything but
 * the loop moved. */
bool fz_inproc_pump(void);
/* After the client closed its end: waits for the connection to go, tears
 * everything down and checks that nothing is left. */
void fz_inproc_stop(void);
/* The supervisor moves the in-process worker to its next generation, as
 * device.c does: Drain on the worker's control channel, then Release (or
 * Reset), each once the one before answered. Queued; the pump sends. */
void fz_inproc_worker_lifecycle(bool reset);
/* No lifecycle verb runs or waits. */
bool fz_inproc_worker_idle(void);
/* The worker set up by fz_inproc_start(FZ_WORKER). */
struct rd_worker *fz_inproc_worker(void);
/* Open file descriptors of this process. */
unsigned fz_count_fds(void);

/* The client's end of a connection. */
struct fz_client {
	int fd;
	char *buf;                      /* bytes of a reply not yet ended */
	size_t len, cap;
	bool eof;
};

#define FZ_SEND_FDS_MAX 24
/* One sendmsg of buf with nfds fds (dups of one memfd) on its first byte.
 * Bytes sent; 0 when the socket is full, or (may_be_closed) when the
 * daemon closed its end. */
size_t fz_client_send(int fd, const char *buf, size_t len, unsigned nfds, bool may_be_closed);
/* Reads what has arrived; on_reply gets each whole reply (text without its
 * NUL). Bytes read. */
size_t fz_client_read(struct fz_client *c, void (*on_reply)(const char *text, size_t len, void *data), void *data);
void fz_client_finish(struct fz_client *c);
