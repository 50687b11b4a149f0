/* SPDX-License-Identifier: Apache-2.0 */
/* The kernels regend writes for programs (daemon/program/codegen.c),
 * compiled with NVRTC and loaded with the driver API, as registry
 * resources (common.h, struct cuda_rtc_module).
 *
 * Only source that daemon/program/ wrote from a checked program reaches
 * NVRTC: never a client's text.
 *
 * The image (a CUBIN for the device's architecture; PTX for the newest
 * architecture NVRTC knows when the device is newer still, which the
 * driver then compiles) is host memory and outlives generations: a reset
 * costs a cuModuleLoadData per module, not a compile. With rtc_cache_dir
 * set, images are also kept on disk between processes, one file per
 * (source, architecture, NVRTC version), written atomically (an O_EXCL
 * temporary renamed into place) and read back only when its header and the
 * source it holds match exactly: a hash collision or a torn file costs a
 * compile, never a wrong kernel. The directory must be the daemon's own
 * (owned by its user, writable by nobody else), since what it holds runs
 * in the daemon's context; otherwise it is not used.
 *
 * What compiles cost is bounded per uid (daemon/program/compile_budget.h):
 * NVRTC's time, charged as it runs and stopped where the owner's budget
 * runs out (rtc_compile.c), and the images the uid's programs hold, an
 * image from the disk cache included. */
#include "regen-config.h"

#include <dlfcn.h>
#include <errno.h>
#include <fcntl.h>
#include <libgen.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>
#include <nvrtc.h>
#include "daemon/backend/cuda/common.h"
#include "daemon/backend/cuda/rtc_compile.h"
#include "proto/errors.h"

/* What NVRTC is, found once: its version, the architectures it compiles
 * for, and where cuda_fp16.h and cuda_bf16.h are (NVRTC 13 has none of
 * its own). */
static struct {
	int major, minor;
	int *archs;
	int narchs;
	char include[PATH_MAX + 64];  /* "-I<dir>", "" when none was found */
} nvrtc_info;
static pthread_once_t nvrtc_once = PTHREAD_ONCE_INIT;

static bool has_bf16_header(const char *dir)
{
	char probe[PATH_MAX + 64];

	snprintf(probe, sizeof(probe), "%s/cuda_bf16.h", dir);
	return access(probe, R_OK) == 0;
}

static void nvrtc_probe(void)
{
	char lib[PATH_MAX], dir[PATH_MAX + 32];
	Dl_info info;

	nvrtcVersion(&nvrtc_info.major, &nvrtc_info.minor);
	if (nvrtcGetNumSupportedArchs(&nvrtc_info.narchs) == NVRTC_SUCCESS && nvrtc_info.narchs > 0) {
		nvrtc_info.archs = calloc((size_t)nvrtc_info.narchs, sizeof(int));
		if (!nvrtc_info.archs || nvrtcGetSupportedArchs(nvrtc_info.archs) != NVRTC_SUCCESS)
			nvrtc_info.narchs = 0;
	}
	/* The toolkit NVRTC came from first (lib64/ or
	 * targets/<arch>/lib/ beside include/), then the one regend was
	 * built against. */
	if (dladdr((void *)nvrtcVersion, &info) && info.dli_fname) {
		snprintf(lib, sizeof(lib), "%s", info.dli_fname);
		snprintf(dir, sizeof(dir), "%s/../include", dirname(lib));
		if (has_bf16_header(dir)) {
			snprintf(nvrtc_info.include, sizeof(nvrtc_info.include), "-I%s", dir);
			return;
		}
	}
	if (has_bf16_header(REGEN_CUDA_INCLUDE_DIR))
		snprintf(nvrtc_info.include, sizeof(nvrtc_info.include), "-I%s", REGEN_CUDA_INCLUDE_DIR);
}

/* The architecture to compile for on a device of compute capability
 * `arch` (90 for 9.0): itself when NVRTC knows it, else the newest one
 * below as PTX. 0 when NVRTC knows none at or below it. */
static int pick_arch(int arch, bool *ptx)
{
	int best = 0;

	*ptx = false;
	for (int i = 0; i < nvrtc_info.narchs; i++) {
		if (nvrtc_info.archs[i] == arch)
			return arch;
		if (nvrtc_info.archs[i] < arch && nvrtc_info.archs[i] > best)
			best = nvrtc_info.archs[i];
	}
	*ptx = best > 0;
	return best;
}

/* ---- the on-disk cache ------------------------------------------------- */

#define RTC_CACHE_MAGIC "REGENRTC"
#define RTC_CACHE_VERSION 1

struct rtc_cache_header {
	char magic[8];
	uint32_t version;
	uint32_t arch;
	uint32_t is_ptx;
	uint32_t nvrtc_major, nvrtc_minor;
	uint32_t pad;
	uint64_t source_hash;
	uint64_t source_len;
	uint64_t image_len;
};

/* The cache directory when it is safe to load from: a directory of the
 * daemon's own user that nobody else may write (made, 0700, where its
 * parent is and it is not: a container's cache volume). NULL otherwise
 * (told once). */
static const char *cache_dir(const struct cuda_dev *cd)
{
	static _Atomic bool warned;
	const char *dir = cd->dev->rtc_cache_dir;
	struct stat st;

	if (!dir[0])
		return NULL;
	if (stat(dir, &st) != 0 && errno == ENOENT)
		(void)mkdir(dir, 0700);
	if (stat(dir, &st) != 0 || !S_ISDIR(st.st_mode) || st.st_uid != geteuid() || (st.st_mode & 022)) {
		if (!atomic_exchange(&warned, true))
			fprintf(stderr,
				"regend: cuda: rtc_cache_dir %s is not a directory of this user that only it may write: "
				"compiled kernels are not cached on disk\n",
				dir);
		return NULL;
	}
	return dir;
}

static void cache_path(char *buf, size_t size, const char *dir, const struct cuda_rtc_module *m)
{
	snprintf(buf, size, "%s/%016llx-%s%d-nvrtc%d.%d.%s", dir, (unsigned long long)m->step->source_hash,
		 m->image_is_ptx ? "compute" : "sm", m->arch, nvrtc_info.major, nvrtc_info.minor,
		 m->image_is_ptx ? "ptx" : "cubin");
}

static bool read_all(int fd, void *buf, size_t n)
{
	char *p = buf;

	while (n) {
		ssize_t r = read(fd, p, n);
		if (r <= 0) {
			if (r < 0 && errno == EINTR)
				continue;
			return false;
		}
		p += r;
		n -= (size_t)r;
	}
	return true;
}

static bool write_all(int fd, const void *buf, size_t n)
{
	const char *p = buf;

	while (n) {
		ssize_t r = write(fd, p, n);
		if (r <= 0) {
			if (r < 0 && errno == EINTR)
				continue;
			return false;
		}
		p += r;
		n -= (size_t)r;
	}
	return true;
}

/* The image for m from the cache, if a file there holds exactly m's
 * source for m's architecture and this NVRTC. */
static bool cache_load(struct cuda_rtc_module *m, const char *dir)
{
	const struct rd_prog_step *st = m->step;
	struct rtc_cache_header h;
	char path[PATH_MAX];
	struct stat sb;
	char *src = NULL;
	void *img = NULL;
	bool ok = false;
	int fd;

	cache_path(path, sizeof(path), dir, m);
	fd = open(path, O_RDONLY | O_CLOEXEC | O_NOFOLLOW);
	if (fd < 0)
		return false;
	if (fstat(fd, &sb) != 0 || !S_ISREG(sb.st_mode) || sb.st_uid != geteuid() || !read_all(fd, &h, sizeof(h)))
		goto out;
	if (memcmp(h.magic, RTC_CACHE_MAGIC, 8) != 0 || h.version != RTC_CACHE_VERSION || h.arch != (uint32_t)m->arch ||
	    h.is_ptx != (uint32_t)m->image_is_ptx || h.nvrtc_major != (uint32_t)nvrtc_info.major ||
	    h.nvrtc_minor != (uint32_t)nvrtc_info.minor || h.source_hash != st->source_hash ||
	    h.source_len != st->source_len || h.image_len == 0 ||
	    (uint64_t)sb.st_size != sizeof(h) + h.source_len + h.image_len)
		goto out;
	src = malloc(h.source_len ? h.source_len : 1);
	img = malloc(h.image_len);
	if (!src || !img || !read_all(fd, src, h.source_len) || memcmp(src, st->source, h.source_len) != 0 ||
	    !read_all(fd, img, h.image_len))
		goto out;
	m->image = img;
	m->image_size = h.image_len;
	img = NULL;
	ok = true;
out:
	free(src);
	free(img);
	close(fd);
	return ok;
}

/* Best effort: a cache that cannot be written costs the next process a
 * compile. */
static void cache_store(const struct cuda_rtc_module *m, const char *dir)
{
	static _Atomic unsigned counter;
	const struct rd_prog_step *st = m->step;
	struct rtc_cache_header h;
	char path[PATH_MAX], tmp[PATH_MAX + 64];
	int fd;

	memset(&h, 0, sizeof(h));
	memcpy(h.magic, RTC_CACHE_MAGIC, 8);
	h.version = RTC_CACHE_VERSION;
	h.arch = (uint32_t)m->arch;
	h.is_ptx = m->image_is_ptx;
	h.nvrtc_major = (uint32_t)nvrtc_info.major;
	h.nvrtc_minor = (uint32_t)nvrtc_info.minor;
	h.source_hash = st->source_hash;
	h.source_len = st->source_len;
	h.image_len = m->image_size;
	cache_path(path, sizeof(path), dir, m);
	snprintf(tmp, sizeof(tmp), "%s.%d.%u.tmp", path, (int)getpid(), atomic_fetch_add(&counter, 1));
	fd = open(tmp, O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC | O_NOFOLLOW, 0644);
	if (fd < 0)
		return;
	bool ok = write_all(fd, &h, sizeof(h)) && write_all(fd, st->source, st->source_len) &&
		  write_all(fd, m->image, m->image_size);
	if (close(fd) != 0)
		ok = false;
	if (!ok || rename(tmp, path) != 0)
		unlink(tmp);
}

/* ---- compiling ---------------------------------------------------------- */

/* NVRTC on m's source, for m->arch, charged to its program's owner:
 * m->image. 0, or -errno with the status set. */
static int rtc_compile(struct cuda_rtc_module *m)
{
	struct rd_compile_account *account = m->prog ? m->prog->compile : NULL;
	struct rp_error err = { 0 };
	uint64_t spent_ns = 0;
	int r;

	r = cuda_rtc_compile(m->step, m->arch, m->image_is_ptx, nvrtc_info.include, account, &m->image,
			     &m->image_size, &spent_ns, &err);
	if (m->prog)
		m->prog->compile_us += spent_ns / 1000;
	if (r < 0)
		return cuda_status_keep(&err);
	return 0;
}

/* m->image, from memory, the disk cache or NVRTC. Called with res.lock
 * held. 0 or -errno with the status set. */
static int image_ensure(struct cuda_rtc_module *m)
{
	const char *dir;
	int cc_major = 0, cc_minor = 0;
	bool ptx;

	if (m->image)
		return 0;
	pthread_once(&nvrtc_once, nvrtc_probe);
	/* A device attribute: no context needed. */
	cudaError_t e_ = cudaDeviceGetAttribute(&cc_major, cudaDevAttrComputeCapabilityMajor, m->cd->dev->index);
	if (e_ == cudaSuccess)
		e_ = cudaDeviceGetAttribute(&cc_minor, cudaDevAttrComputeCapabilityMinor, m->cd->dev->index);
	if (e_ != cudaSuccess)
		return STATUS_CUDA("cudaDeviceGetAttribute(compute capability)");
	m->arch = pick_arch(cc_major * 10 + cc_minor, &ptx);
	m->image_is_ptx = ptx;
	if (!m->arch)
		return cuda_status_set(RP_ERR_BACKEND, "NVRTC %d.%d compiles for no architecture up to the device's sm_%d%d",
				       nvrtc_info.major, nvrtc_info.minor, cc_major, cc_minor);
	dir = cache_dir(m->cd);
	bool cached = dir && cache_load(m, dir);
	int r = cached ? 0 : rtc_compile(m);
	if (r < 0)
		return r;
	/* Held against the owner's uid while the program keeps it. */
	struct rp_error err = { 0 };
	if (rd_compile_hold(m->prog ? m->prog->compile : NULL, m->image_size, &err) < 0) {
		free(m->image);
		m->image = NULL;
		m->image_size = 0;
		return cuda_status_keep(&err);
	}
	m->held = m->prog ? m->prog->compile : NULL;
	if (m->prog)
		m->prog->module_bytes += m->image_size;
	if (!cached && dir)
		cache_store(m, dir);
	return 0;
}

/* ---- the resource ------------------------------------------------------- */

static const char *cu_error_name(CUresult r)
{
	return r == CUDA_ERROR_OUT_OF_MEMORY ? RP_ERR_OUT_OF_MEMORY : RP_ERR_BACKEND;
}

static const char *cu_error_string(CUresult r)
{
	const char *s = NULL;

	if (cuda_drv.GetErrorString)
		cuda_drv.GetErrorString(r, &s);
	return s ? s : "unknown driver error";
}

static void forget(struct cuda_rtc_module *m)
{
	m->module = NULL;
	if (m->fn)
		memset(m->fn, 0, (size_t)m->step->nkernels * sizeof(*m->fn));
}

static int module_init(struct rd_resource *res)
{
	struct cuda_rtc_module *m = (struct cuda_rtc_module *)res;
	const struct rd_prog_step *st = m->step;
	struct rp_error err = { 0 };
	int sms = 0, r;

	r = image_ensure(m);
	if (r < 0)
		return r;
	if (!m->fn && !(m->fn = calloc((size_t)st->nkernels + 1, sizeof(*m->fn))))
		return cuda_status_set(RP_ERR_OUT_OF_MEMORY, "no host memory for %s's functions", st->kernels[0].name);
	if (cuda_driver_load(&err) < 0) {
		const char *msg = err.params ? cJSON_GetStringValue(cJSON_GetObjectItem(err.params, "message")) : NULL;
		r = cuda_status_set(RP_ERR_BACKEND, "%s", msg ? msg : "the driver's entry points could not be loaded");
		rp_error_clear(&err);
		return r;
	}
	cudaError_t e_ = cudaSetDevice(m->cd->dev->index);
	if (e_ == cudaSuccess)
		e_ = cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, m->cd->dev->index);
	if (e_ != cudaSuccess)
		return STATUS_CUDA("cudaSetDevice");
	m->sm_count = (unsigned)sms;
	CUresult cr = cuda_drv.ModuleLoadData(&m->module, m->image);
	if (cr != CUDA_SUCCESS) {
		m->module = NULL;
		return cuda_status_set(cu_error_name(cr), "cuModuleLoadData(%s, %s_%d): %s", st->kernels[0].name,
				       m->image_is_ptx ? "compute" : "sm", m->arch, cu_error_string(cr));
	}
	for (int k = 0; k < st->nkernels; k++) {
		cr = cuda_drv.ModuleGetFunction(&m->fn[k], m->module, st->kernels[k].name);
		if (cr != CUDA_SUCCESS) {
			cuda_drv.ModuleUnload(m->module);
			forget(m);
			return cuda_status_set(RP_ERR_BACKEND, "cuModuleGetFunction(%s): %s", st->kernels[k].name,
					       cu_error_string(cr));
		}
	}
	return 0;
}

static void module_release(struct rd_resource *res)
{
	struct cuda_rtc_module *m = (struct cuda_rtc_module *)res;

	cudaSetDevice(m->cd->dev->index);
	if (m->module)
		cuda_drv.ModuleUnload(m->module);
	forget(m);
}

static void module_invalidate(struct rd_resource *res)
{
	/* The module went with the context; the image stays. */
	forget((struct cuda_rtc_module *)res);
}

static const struct rd_resource_ops module_ops = {
	.kind = "cuda_rtc_module", .init = module_init, .release = module_release, .invalidate = module_invalidate,
};

void cuda_rtc_module_init(struct cuda_dev *cd, struct cuda_rtc_module *m, const struct rd_prog_step *step)
{
	memset(m, 0, sizeof(*m));
	m->cd = cd;
	m->step = step;
	rd_resource_register(&cd->dev->registry, &m->res, &module_ops);
}

void cuda_rtc_module_finish(struct cuda_rtc_module *m)
{
	if (!m->cd)
		return;
	rd_resource_unregister(&m->res);
	if (m->image) {
		rd_compile_release(m->held, m->image_size);
		if (m->prog)
			m->prog->module_bytes -= m->image_size;
	}
	free(m->image);
	free(m->fn);
	m->image = NULL;
	m->fn = NULL;
	m->cd = NULL;
}

int cuda_rtc_module_compile(struct cuda_rtc_module *m, struct rp_error *err)
{
	int r;

	pthread_mutex_lock(&m->res.lock);
	r = image_ensure(m);
	pthread_mutex_unlock(&m->res.lock);
	if (r < 0)
		return cuda_status_to_error(err, "compiling a program's kernels");
	return 0;
}

int cuda_rtc_module_get(struct cuda_rtc_module *m, struct rp_error *err)
{
	if (rd_resource_ensure_valid(&m->res) < 0)
		return cuda_status_to_error(err, "loading a program's kernels");
	return 0;
}

int cuda_rtc_launch(struct cuda_rtc_module *m, int k, cudaStream_t stream, const void *args_dev, struct rp_error *err)
{
	const struct rd_prog_kernel *kern = &m->step->kernels[k];
	unsigned grid = rd_prog_kernel_grid(kern, m->sm_count);
	void *params[] = { (void *)&args_dev };

	if (grid == 0)
		return 0;
	CUresult cr = cuda_drv.LaunchKernel(m->fn[k], grid, 1, 1, kern->block, 1, 1, 0, (CUstream)stream, params, NULL);
	if (cr != CUDA_SUCCESS) {
		rp_error_set(err, cu_error_name(cr), "cuLaunchKernel(%s, %u blocks of %u): %s", kern->name, grid,
			     kern->block, cu_error_string(cr));
		return -EIO;
	}
	return 0;
}
