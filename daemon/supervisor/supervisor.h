/* The supervisor: the process systemd starts. It never touches CUDA. It owns
 * the main socket, sessions and their permissions, the node epoch, Watch
 * subscribers, and one worker process per device, which it starts, drives
 * through release/reset/restart, and respawns when it dies. */
#pragma once

#include "daemon/options.h"

/* Runs until SIGTERM/SIGINT. listen_fd >= 0: an already listening socket
 * (socket activation). argv is kept to re-read the configuration on SIGHUP
 * with the same command-line overrides. Returns the process exit code. */
int rd_supervisor_run(const struct rd_options *opts, int listen_fd, int argc, char **argv);
