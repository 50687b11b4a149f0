/* SPDX-License-Identifier: Apache-2.0 */
/* The Varlink interface definitions (the .varlink files in proto/idl), embedded at build
 * time (proto/embed_idl.py) for org.varlink.service.GetInterfaceDescription, with what
 * the daemon's method tables read from them: each interface's methods, and where it
 * is served (each file's opening comment says so: "Served on the worker socket"). */
#pragma once

#include <stddef.h>

/* Where an interface is served. */
enum rp_served {
	RP_SERVED_MAIN = 1 << 0,     /* regend's main socket (the supervisor) */
	RP_SERVED_WORKER = 1 << 1,   /* each device's worker socket */
	RP_SERVED_CONTROL = 1 << 2,  /* the supervisor's control channel to a worker: not for clients */
};

struct rp_interface {
	const char *name;
	const char *description;
	unsigned served;              /* enum rp_served; 0 for org.varlink.service, every endpoint's own */
	const char *const *methods;   /* full names ("io.regen.Compute.Gemm"), NULL terminated */
};

extern const struct rp_interface rp_interfaces[];
extern const size_t rp_interfaces_count;

/* The interfaces served on each kind of endpoint, NULL terminated: what its
 * GetInfo lists. */
extern const char *const rp_main_interfaces[];
extern const char *const rp_worker_interfaces[];
extern const char *const rp_control_interfaces[];

/* NULL when unknown. */
const char *rp_interface_description(const char *name);
/* The interface that declares `method` (a full name), or NULL when no
 * interface does. */
const struct rp_interface *rp_method_interface(const char *method);
