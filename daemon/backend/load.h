/* SPDX-License-Identifier: Apache-2.0 */
/* Gives a worker's device its backend by name. */
#pragma once

#include "daemon/backend/backend.h"

/* "cuda": loads the CUDA backend's module (where regend was built with it);
 * anything else: the host backend, which is part of regend. Sets
 * dev->backend; 0, or -errno with why (which file or library failed, and
 * what installs it) in `why`. */
int rd_backend_load(struct rd_device *dev, const char *name, char *why, size_t size);
