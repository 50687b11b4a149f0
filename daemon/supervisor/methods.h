/* SPDX-License-Identifier: Apache-2.0 */
/* io.regen.Device on the main socket: Status, Generation, Watch, and for
 * admins Release, Reset, Restart and InjectFault; io.regen.Keep (keep.c);
 * Memory and Compute calls
 * are answered with where they belong (io.regen.WrongEndpoint). A client's
 * Release/Reset/Restart is a request over one or every device, answered
 * when each device's part has finished. */
#pragma once

#include "daemon/dispatch.h"
#include "daemon/supervisor/supervisor.h"

extern const struct rd_endpoint rd_sv_main_endpoint;

/* A device's part of a request ended (rd_sv_device_events.request_finished;
 * data is the struct rd_supervisor). */
void rd_sv_request_finished(struct rd_sv_device *d, void *request, const char *failure, void *data);
