/* SPDX-License-Identifier: Apache-2.0 */
/* Client memory can vanish under a mapping (a file truncated behind our
 * back): touching it then raises SIGBUS, which would kill the worker and
 * every client of its device. Accesses to client memory run inside a
 * guard: SIGBUS there returns to the guard's recovery point on the same
 * thread, as Wayland compositors do for client shared memory. Imports
 * refuse files that can shrink (buffer.c), so this is the second line. */
#pragma once

#include <stdint.h>

/* Installs the SIGBUS handler, once per process. 0 or -errno. */
int rd_host_guard_install(void);

/* Runs fn(arg) with the guard up. Returns fn's value, or -EFAULT when a
 * SIGBUS ended it early; *fault_addr then holds the address it touched.
 * What fn allocated before the fault is lost: fn must not hold locks. */
int rd_host_guarded(int (*fn)(void *arg), void *arg, uintptr_t *fault_addr);
