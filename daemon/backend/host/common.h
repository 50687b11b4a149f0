/* SPDX-License-Identifier: Apache-2.0 */
/* What the files of daemon/backend/host/ share: the device state, and each
 * file's functions that backend.c puts in the ops table. */
#pragma once

#include <pthread.h>
#include <stdatomic.h>
#include <stdint.h>
#include "daemon/backend/backend.h"
#include "daemon/backend/share.h"

/* The health watch of the simulated GPU (health.c). */
struct host_health {
	pthread_t thread;
	bool running, stop;
	pthread_mutex_t lock;
	pthread_cond_t cond;
	unsigned period_ms;
	struct rd_health info;         /* under lock */
};

struct host_device {
	struct rd_resource context;    /* the simulated context: lost by fault injection */
	atomic_bool lost;
	atomic_bool lost_reported;     /* on_fault was called for this loss */
	atomic_bool hang;
	atomic_uint pending_xid;       /* an injected XID the health watch has not seen yet */
	atomic_uint_fast64_t mapped_bytes;
	atomic_uint_fast64_t scratch_bytes;
	struct host_health health;
	/* The deadline's budget (lane.c): the reference math's pace, measured
	 * at open, the CPUs the lanes share, and the work of every lane
	 * submitted and not finished, in nanoseconds at that pace (only the
	 * loop thread adds, lanes subtract). */
	double ns_per_mac;
	unsigned cpus;
	atomic_uint_fast64_t backlog_ns;
	/* Its CPUs shared among the uids of its lanes (../share.h): beside
	 * others, a uid runs at most its part of them at once. */
	struct rd_share share;
};

static inline struct host_device *hd(struct rd_device *dev)
{
	return dev->backend_data;
}

/* How long a uid counts in the share after its last call ended: its
 * client's next call comes a round trip later, read by the worker's loop,
 * which shares the CPUs with the lanes' threads and may wait a scheduler
 * slice or two for one (test_fair_share on one CPU: 2 ms let the other
 * uid take every lane back between a client's calls, 20 ms does not). */
#define HOST_SHARE_LINGER_NS (20 * 1000000ull)

/* Scratch a lane or an idle program keeps between calls; beyond it, a
 * call's goes when the call is done. */
#define HOST_SCRATCH_KEEP ((size_t)64 << 20)

/* buffer.c */
int host_import_buffer(struct rd_device *dev, struct rd_import *req, struct rd_buffer **out, struct rp_error *err);
void host_close_buffer(struct rd_buffer *buf);

/* lane.c */
struct rd_lane *host_lane_create(struct rd_device *dev, unsigned index, struct rp_error *err);
void host_lane_destroy(struct rd_lane *base);
int host_submit(struct rd_lane *base, struct rd_op *op);
/* Measures the reference math's pace for the deadline's budget (at open). */
void host_lane_calibrate(struct rd_device *dev);

/* comm.c: communicators among connections to this worker. */
int host_comm_unique_id(struct rd_device *dev, unsigned char id[RP_COMM_ID_SIZE], struct rp_error *err);
int host_comm_create(struct rd_device *dev, const unsigned char id[RP_COMM_ID_SIZE], uint32_t rank, uint32_t nranks,
		     struct rd_comm **out, struct rp_error *err);
void host_comm_abort(struct rd_comm *comm, const char *why);
int host_comm_status(struct rd_comm *comm, struct rp_error *err);
void host_comm_close(struct rd_comm *comm);
/* Init, Destroy or a collective, on the lane's thread: may wait for peers. */
void host_comm_run(struct rd_op *op);
/* Waits for every abort still running on an aborter thread (release,
 * reset, close). */
void host_comm_quiesce(void);

/* program.c: io.regen.Program on the host. */
int host_program_create(struct rd_device *dev, const struct rp_program *def, struct rd_program **out,
			struct rp_error *err);
void host_program_destroy(struct rd_program *prog);
/* A Run (op->run), on the lane's thread. */
void host_program_run(struct rd_op *op);

/* health.c */
void host_health_init(struct rd_device *dev);
void host_health_finish(struct rd_device *dev);
int host_health_start(struct rd_device *dev, unsigned period_ms, struct rp_error *err);
void host_health_stop(struct rd_device *dev);
void host_health_info(struct rd_device *dev, struct rd_health *out);
/* The simulated context is lost: reported once per loss, whoever finds it
 * (a lane at its next call, or the health watch without one). */
void host_report_lost(struct rd_device *dev, enum rd_fault_kind kind, const char *reason);
