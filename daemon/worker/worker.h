/* A worker process: owns one device (its backend context and resource
 * registry), serves Memory and Compute on its own socket, and obeys the
 * supervisor's lifecycle verbs on the control channel (fd --ctl-fd). */
#pragma once

#include "daemon/options.h"

int rd_worker_run(const struct rd_options *opts);
