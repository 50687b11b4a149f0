/* SPDX-License-Identifier: Apache-2.0 */
/* The Varlink interface definitions (the .varlink files in proto/idl), embedded at build
 * time for org.varlink.service.GetInterfaceDescription. */
#pragma once

#include <stddef.h>

struct rp_interface {
	const char *name;
	const char *description;
};

extern const struct rp_interface rp_interfaces[];
extern const size_t rp_interfaces_count;

/* NULL when unknown. */
const char *rp_interface_description(const char *name);
