/* SPDX-License-Identifier: Apache-2.0 */
/* The main socket's sessions: a connection accepted is a session, admin or
 * not by its peer's credentials (decided at accept, and again on SIGHUP),
 * and refused when its uid already holds max_connections. Calls go to the
 * io.regen.Device methods (methods.c). A session's data is the supervisor. */
#pragma once

#include "daemon/supervisor/supervisor.h"

/* The listener's on_accept; data is the struct rd_supervisor. */
void rd_sv_session_accept(int fd, void *data);
/* Decides admin rights again for every session (the admin group changed). */
void rd_sv_sessions_readmit(struct rd_supervisor *sv);
/* Closes every session (regend stops). */
void rd_sv_sessions_close(struct rd_supervisor *sv);
