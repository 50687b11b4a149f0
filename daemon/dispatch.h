/* SPDX-License-Identifier: Apache-2.0 */
/* Method tables: one per endpoint (the main socket, a worker socket, the
 * worker's control channel). Dispatch answers org.varlink.service itself,
 * sends a method another socket serves to `elsewhere`, and
 * refuses, with their named errors, unknown interfaces and methods, admin
 * methods from non-admins, and "more"-only methods called without it.
 * Before any method runs, the fds that came with a call are closed unless
 * its method takes fds: a call that waits (behind a long one on a lane)
 * holds no fd it will never use. */
#pragma once

#include <stdbool.h>
#include "daemon/conn.h"
#include "daemon/peer.h"

struct rd_method {
	const char *name;                 /* "io.regen.Device.Status" */
	void (*fn)(struct rd_call *call);
	bool admin;
	bool needs_more;
	bool takes_fds;                   /* reads call->raw.fds; for every other method they are closed first */
};

struct rd_endpoint {
	const struct rd_method *methods;  /* NULL-name terminated */
	const char *const *interfaces;    /* served here, for GetInfo; NULL terminated */
	/* Methods that another table names (the compute ops of
	 * proto/compute.h): the handler for one that is not in `methods`,
	 * or NULL. Such methods need no admin and no "more", and take no fds. */
	void (*(*find)(const char *method))(struct rd_call *call);
	/* Answers a method that the IDL (proto/idl.h) declares for another
	 * public socket, in an interface this endpoint does not serve: says
	 * where it is served (io.regen.WrongEndpoint). NULL: such a method is
	 * InterfaceNotFound here, as any other. */
	void (*elsewhere)(struct rd_call *call);
};

void rd_dispatch(const struct rd_endpoint *ep, struct rd_call *call);

