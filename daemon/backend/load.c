/* SPDX-License-Identifier: Apache-2.0 */
/* The CUDA backend is a module, backend-cuda.so, that only a worker whose
 * backend is cuda loads (as PipeWire loads its plugins): the supervisor
 * and host workers then never map the CUDA libraries (~150 MB resident
 * each), and a broken CUDA install fails the CUDA worker with a log line
 * naming the library, not the control plane. The module exports one
 * function, rd_backend_cuda_entry (an rd_backend_entry_fn).
 *
 * Where the module is looked for: only in $REGEN_BACKEND_DIR when that is
 * set (a test knob, env.h); else in backend/cuda/ beside the running executable, which
 * is where the build tree has it, and then in REGEN_BACKEND_MODULE_DIR,
 * where meson installs it (<prefix>/<libdir>/regen). */
#include "regen-config.h"

#include <dlfcn.h>
#include <errno.h>
#include <limits.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include "daemon/backend/load.h"
#include "daemon/env.h"
#include "daemon/log.h"

#if REGEN_HAVE_CUDA

/* The directories to try, in order; returns how many. */
static int module_dirs(char dirs[][PATH_MAX])
{
	const char *env = rd_env(RD_ENV_BACKEND_DIR);
	char exe[PATH_MAX];
	int n = 0;

	if (env) {
		snprintf(dirs[n++], PATH_MAX, "%s", env);
		return n;
	}
	ssize_t len = readlink("/proc/self/exe", exe, sizeof(exe) - 1);
	if (len > 0) {
		exe[len] = '\0';
		char *slash = strrchr(exe, '/');
		if (slash) {
			*slash = '\0';
			if (snprintf(dirs[n], PATH_MAX, "%s/backend/cuda", exe) < PATH_MAX)
				n++;
		}
	}
	snprintf(dirs[n++], PATH_MAX, "%s", REGEN_BACKEND_MODULE_DIR);
	return n;
}

static int load_cuda(struct rd_device *dev, char *why, size_t size)
{
	char dirs[2][PATH_MAX], path[PATH_MAX + 32];
	int n = module_dirs(dirs);
	int i;

	for (i = 0; i < n; i++) {
		snprintf(path, sizeof(path), "%s/backend-cuda.so", dirs[i]);
		if (access(path, F_OK) == 0)
			break;
	}
	if (i == n) {
		/* Installed from packages, the module is a package of its own,
		 * so that a node without CUDA installs the rest. */
		snprintf(why, size,
			 "the CUDA backend is not installed: no backend-cuda.so in %s%s%s (install the regen-cuda package, "
			 "or build regen where the CUDA toolkit is)",
			 dirs[0], n > 1 ? " or " : "", n > 1 ? dirs[1] : "");
		return -ENOENT;
	}
	/* Never closed: the CUDA libraries it brings do not unload cleanly,
	 * and the worker exits when it is done with the device. */
	void *module = dlopen(path, RTLD_NOW | RTLD_LOCAL);
	if (!module) {
		/* dlerror() names the library that failed, the module itself or
		 * one it needs (libcudart, libcublasLt...), and why. */
		snprintf(why, size, "cannot load the CUDA backend %s: %s (the CUDA 13 runtime, cuBLASLt, cuDNN 9 and NVRTC "
			 "must be installed: README, Platforms)", path, dlerror());
		return -ELIBACC;
	}
	rd_backend_entry_fn *entry = (rd_backend_entry_fn *)dlsym(module, "rd_backend_cuda_entry");
	if (!entry) {
		snprintf(why, size, "cannot load the CUDA backend: %s has no rd_backend_cuda_entry", path);
		return -ELIBBAD;
	}
	const struct rd_backend_ops *ops = entry(REGEN_VERSION);
	if (!ops) {
		snprintf(why, size, "cannot load the CUDA backend: %s was built for another regen version than %s "
			 "(install regen and regen-cuda of the same version)", path, REGEN_VERSION);
		return -ELIBBAD;
	}
	rd_debug("worker", dev->index, (uint64_t)atomic_load(&dev->generation), 0, "cuda backend from %s", path);
	dev->backend = ops;
	return 0;
}
#endif

int rd_backend_load(struct rd_device *dev, const char *name, char *why, size_t size)
{
#if REGEN_HAVE_CUDA
	if (strcmp(name, "cuda") == 0)
		return load_cuda(dev, why, size);
#endif
	dev->backend = &rd_backend_host;
	return 0;
}
