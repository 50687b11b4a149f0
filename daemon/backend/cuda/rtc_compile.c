/* SPDX-License-Identifier: Apache-2.0 */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <nvrtc.h>
#include "daemon/backend/cuda/rtc_compile.h"
#include "proto/errors.h"

/* NVRTC's flow callback: 1 stops the compile (and keeps it stopped). */
static int on_flow(void *payload, void *reserved)
{
	return rd_compile_tick(payload, rd_compile_clock_ns()) ? 1 : 0;
}

/* The first lines of NVRTC's log, enough to act on, as one line each
 * separated by " | ". */
static void log_head(const char *log, char *buf, size_t size)
{
	size_t n = 0;
	int lines = 0;

	buf[0] = '\0';
	for (const char *p = log; *p && lines < 6 && n + 4 < size; lines++) {
		const char *e = strchr(p, '\n');
		size_t len = e ? (size_t)(e - p) : strlen(p);
		if (len == 0) {
			p = e ? e + 1 : p + len;
			continue;
		}
		n += (size_t)snprintf(buf + n, size - n, "%s%.*s", n ? " | " : "", (int)len, p);
		if (n >= size)
			break;
		p = e ? e + 1 : p + len;
	}
}

int cuda_rtc_compile(const struct rd_prog_step *st, int arch, bool ptx, const char *include_opt,
		     struct rd_compile_account *account, void **image, size_t *size, uint64_t *spent_ns,
		     struct rp_error *err)
{
	const char *name = st->kernels[0].name, *kind = ptx ? "compute" : "sm";
	char arch_opt[32], head[200];
	struct rd_compile compile;
	const char *opts[4];
	int major = 0, minor = 0, nopts = 0, r;
	nvrtcProgram prog;
	nvrtcResult nr;
	size_t n = 0;

	*image = NULL;
	*size = 0;
	if (spent_ns)
		*spent_ns = 0;
	nvrtcVersion(&major, &minor);
	snprintf(arch_opt, sizeof(arch_opt), "-arch=%s_%d", kind, arch);
	opts[nopts++] = arch_opt;
	opts[nopts++] = "-default-device";
	opts[nopts++] = "--std=c++17";
	if (include_opt && include_opt[0])
		opts[nopts++] = include_opt;
	nr = nvrtcCreateProgram(&prog, st->source, name, 0, NULL, NULL);
	if (nr != NVRTC_SUCCESS) {
		rp_error_set(err, nr == NVRTC_ERROR_OUT_OF_MEMORY ? RP_ERR_OUT_OF_MEMORY : RP_ERR_BACKEND,
			     "nvrtcCreateProgram(%s): %s", name, nvrtcGetErrorString(nr));
		return nr == NVRTC_ERROR_OUT_OF_MEMORY ? -ENOMEM : -EIO;
	}
	if (rd_compile_begin(&compile, account, rd_compile_clock_ns(), err) < 0) {
		nvrtcDestroyProgram(&prog);
		return -EDQUOT;
	}
	/* Where NVRTC cannot be told, the compile runs whole, still charged:
	 * the uid's next one does not start. */
	if (account)
		(void)nvrtcSetFlowCallback(prog, on_flow, &compile);
	nr = nvrtcCompileProgram(prog, nopts, opts);
	r = rd_compile_end(&compile, rd_compile_clock_ns(), spent_ns, err);
	if (r < 0) {
		nvrtcDestroyProgram(&prog);
		return r;
	}
	if (nr != NVRTC_SUCCESS) {
		char *log = NULL;
		if (nvrtcGetProgramLogSize(prog, &n) == NVRTC_SUCCESS && (log = calloc(1, n + 1)))
			nvrtcGetProgramLog(prog, log);
		log_head(log ? log : "", head, sizeof(head));
		free(log);
		nvrtcDestroyProgram(&prog);
		rp_error_set(err, RP_ERR_BACKEND, "NVRTC %d.%d could not compile %s for %s_%d (%s%s): %s", major, minor,
			     name, kind, arch, nvrtcGetErrorString(nr),
			     include_opt && include_opt[0] ? "" : "; no cuda_bf16.h was found beside NVRTC", head);
		return -EIO;
	}
	nr = ptx ? nvrtcGetPTXSize(prog, &n) : nvrtcGetCUBINSize(prog, &n);
	void *img = nr == NVRTC_SUCCESS && n ? malloc(n) : NULL;
	if (img)
		nr = ptx ? nvrtcGetPTX(prog, img) : nvrtcGetCUBIN(prog, img);
	nvrtcDestroyProgram(&prog);
	if (!img || nr != NVRTC_SUCCESS) {
		free(img);
		rp_error_set(err, img ? RP_ERR_BACKEND : RP_ERR_OUT_OF_MEMORY, "NVRTC's image of %s: %s", name,
			     nr != NVRTC_SUCCESS ? nvrtcGetErrorString(nr) : "no memory");
		return img ? -EIO : -ENOMEM;
	}
	*image = img;
	*size = n;
	return 0;
}
