/* SPDX-License-Identifier: Apache-2.0 */
/* The supervisor: the process systemd starts. It never touches CUDA. It owns
 * the main socket and its sessions (session.c), the io.regen.Device methods
 * served there (methods.c), the node epoch and the Watch subscribers
 * (watch.c), the memory kept for ranks (keep.c), and one device per GPU
 * (device.c), each with its worker process (worker_process.c). This file starts and stops them, handles the
 * signals, and hears what the devices report. */
#pragma once

#include <limits.h>
#include <stdbool.h>
#include <uv.h>
#include "daemon/conn.h"
#include "daemon/listen.h"
#include "daemon/notify.h"
#include "daemon/options.h"
#include "daemon/supervisor/device.h"
#include "daemon/supervisor/keep.h"
#include "daemon/supervisor/watch.h"

struct rd_supervisor {
	uv_loop_t *loop;
	struct rd_options opts;             /* live: SIGHUP changes the reloadable ones */
	int argc;                           /* the command line, read again on SIGHUP */
	char **argv;
	char exe[PATH_MAX];
	int socket_dir;                     /* the sockets' checked directory (daemon/socket_dir.h) */
	struct rd_listener listener;
	struct rd_conn *sessions;           /* the main socket's connections */
	struct rd_sv_device devices[RD_DEVICES_MAX];
	int ndevices;
	struct rd_sv_device_env device_env;
	struct rd_sv_watch watch;           /* the epoch and the Watch subscribers */
	struct rd_hang_charges hang_charges;  /* uids whose calls hung a device (daemon/hang_charge.h) */
	struct rd_comm_owners comm_owners;    /* whose each communicator unique id is (daemon/comm_owners.h) */
	struct rd_sv_keep keep;             /* memory kept for ranks (io.regen.Keep) */
	uv_signal_t sigterm, sigint, sighup;
	uv_timer_t stop_timer;
	bool stopping;
};

/* Runs until SIGTERM/SIGINT. passed: what the service manager passed (an
 * already listening socket of socket activation; what the fd store kept),
 * taken. argv is kept to re-read the configuration on SIGHUP with the same
 * command-line overrides. Returns the process exit code. */
int rd_supervisor_run(const struct rd_options *opts, struct rd_passed_fds *passed, int argc, char **argv);
