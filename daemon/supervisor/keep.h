/* SPDX-License-Identifier: Apache-2.0 */
/* Kept state (io.regen.Keep): the memory ranks asked regend to hold, as the
 * file descriptors that keep it alive (a memfd, a CUDA VMM export), in the
 * supervisor, which never maps or touches it: a worker's respawn, reset or
 * release cannot lose it, and no worker's address space holds it.
 *
 * The table is of sets, one per (uid, job, rank), each with its names (one
 * fd each), its last committed step and its lease. A set is held by the
 * process that last kept, committed or took back in it while that process
 * has a connection to the main socket; when its last one closes, the lease
 * runs, and at its end the set is dropped (its fds closed: the memory goes
 * with the last holder of it). What a uid keeps, held or leased, counts
 * against max_kept_gib and max_kept on the whole node.
 *
 * On the loop thread. The methods are the io.regen.Keep entries of the main
 * socket's table (methods.c). */
#pragma once

#include <stdbool.h>
#include <stdint.h>
#include <sys/types.h>
#include <uv.h>
#include "daemon/conn.h"
#include "daemon/notify.h"
#include "daemon/options.h"
#include "daemon/supervisor/keep_store.h"
#include "proto/keep.h"

struct kept_set;

struct rd_sv_keep {
	uv_loop_t *loop;
	const struct rd_options *opts;   /* live: SIGHUP changes the limits and the lease */
	struct kept_set *sets;
	uv_timer_t lease_timer;          /* the soonest lease end */
	struct rd_keep_store store;      /* the service manager's copy, for regend's restart */
	int ndevices;
	bool closed;
};

void rd_sv_keep_init(struct rd_sv_keep *k, uv_loop_t *loop, const struct rd_options *opts);
/* Before the main socket serves: opens the fd store (keep_store.h) and
 * keeps again what regend's last run left there, each record and fd
 * checked (a host_fd's size and seals now, a cuda_fd's by its device's
 * worker at its first TakeBack); what fails is freed, and the log says
 * why. Sets held when regend stopped start their lease now (their
 * holders' connections went with it), leased ones keep their end. */
void rd_sv_keep_restore(struct rd_sv_keep *k, struct rd_passed_fds *passed, int ndevices);
/* regend stops: every fd is closed (the memory is freed unless a process
 * still maps it, or the service manager's fd store keeps it for the next
 * start). */
void rd_sv_keep_close(struct rd_sv_keep *k);

/* A main-socket connection closed: the sets its process held, if the
 * process has no other connection among `sessions` (linked by next, this
 * one no longer among them), start their leases. */
void rd_sv_keep_connection_closed(struct rd_sv_keep *k, const struct rd_conn *conn, const struct rd_conn *sessions);

/* Every name kept, or those of job (NULL: any) and uid (NULL: any), as
 * io.regen.Keep.Kept objects. NULL on ENOMEM. */
cJSON *rd_sv_keep_list_json(const struct rd_sv_keep *k, const char *job, const uid_t *uid);

/* What a uid keeps now, held or leased (its limits' counts). */
void rd_sv_keep_use_of_uid(const struct rd_sv_keep *k, uid_t uid, uint64_t *bytes, unsigned *names);

/* The io.regen.Keep methods. call->conn->data is the struct rd_supervisor. */
void rd_sv_keep_keep(struct rd_call *call);
void rd_sv_keep_commit(struct rd_call *call);
void rd_sv_keep_take_back(struct rd_call *call);
void rd_sv_keep_drop(struct rd_call *call);
void rd_sv_keep_list(struct rd_call *call);
