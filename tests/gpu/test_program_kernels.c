/* SPDX-License-Identifier: Apache-2.0 */
/* The kernels daemon/program/ writes for a program's FUSED, REDUCTION and
 * GATHER steps, compiled and loaded by cuda/rtc.c and launched one after
 * the other as the executor launches them (the executor's own tests run
 * whole programs through Run and graphs; LIBRARY steps run here on the
 * host, with the reference's math, between the kernels), checked against the host
 * backend's reference (every node in double, rounded to each tensor's
 * dtype: daemon/backend/host/program_nodes.c) on fresh random inputs.
 *
 * Also: the same bits on a second run (no atomics anywhere), a module
 * across a release and a forgotten context (reloaded, not recompiled), the
 * on-disk cache (an image read back only for its own source), and the
 * memory bandwidth of large fused kernels against the GPU's peak (printed:
 * the target is 90%).
 *
 * Exit 0 pass, 1 fail, 77 without a GPU. */
#include <dirent.h>
#include <errno.h>
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>
#include <nvrtc.h>
#include "daemon/backend/cuda/common.h"
#include "daemon/backend/host/program_nodes.h"
#include "daemon/program/plan.h"
#include "tests/gpu/gpu_common.h"
#include "tests/lib/program_check.h"
#include "tests/lib/rand.h"

/* A program's device side: its bound roots, arena, rg_args and modules. */
struct run {
	struct tl_prog t;
	void **dev;              /* per bound root */
	void *arena, *args_dev;
	struct cuda_rtc_module *mods;
	cudaStream_t stream;
};

static bool bound_kind(enum rp_prog_tensor_kind k)
{
	return k == RP_PT_INPUT || k == RP_PT_OUTPUT || k == RP_PT_INOUT;
}

static int run_open(struct run *r, struct cuda_dev *cd, const struct tl_prog_case *c, uint64_t salt)
{
	char why[256];

	memset(r, 0, sizeof(*r));
	if (tl_prog_open(&r->t, c, salt, why, sizeof(why)) < 0) {
		printf("  FAIL: %s: %s\n", c->name, why);
		return -1;
	}
	r->dev = calloc((size_t)r->t.p.ntensors, sizeof(void *));
	r->mods = calloc((size_t)r->t.plan.nsteps + 1, sizeof(*r->mods));
	for (int i = 0; i < r->t.p.ntensors; i++) {
		const struct rp_prog_tensor *x = &r->t.p.tensors[i];
		if (x->root == i && bound_kind(x->kind))
			CUDA_OK(cudaMalloc(&r->dev[i], r->t.root_bytes[i] ? r->t.root_bytes[i] : 8));
	}
	CUDA_OK(cudaMalloc(&r->arena, r->t.plan.arena_bytes ? r->t.plan.arena_bytes : 256));
	CUDA_OK(cudaMalloc(&r->args_dev, rd_prog_args_size(&r->t.plan)));
	CUDA_OK(cudaStreamCreateWithFlags(&r->stream, cudaStreamNonBlocking));
	for (int s = 0; s < r->t.plan.nsteps; s++)
		if (r->t.plan.steps[s].kind != RD_STEP_LIBRARY)
			cuda_rtc_module_init(cd, &r->mods[s], &r->t.plan.steps[s]);
	return 0;
}

/* Library step s (a GEMM, an attention) on the host, with the reference's
 * math: the run's memory copied out, the node run over it, copied back.
 * The fused kernels around it are what this test checks. */
static int run_library_on_host(struct run *r, int s)
{
	int n = r->t.p.ntensors, rc;
	void **host = calloc((size_t)n, sizeof(void *)), **bound = calloc((size_t)r->t.p.nbound + 1, sizeof(void *));
	size_t arena_bytes = r->t.plan.arena_bytes ? r->t.plan.arena_bytes : 256;
	void *arena = malloc(arena_bytes);

	CUDA_OK(cudaStreamSynchronize(r->stream));
	CUDA_OK(cudaMemcpy(arena, r->arena, arena_bytes, cudaMemcpyDeviceToHost));
	for (int i = 0; i < n; i++) {
		if (!r->dev[i])
			continue;
		host[i] = malloc(r->t.root_bytes[i] ? r->t.root_bytes[i] : 8);
		CUDA_OK(cudaMemcpy(host[i], r->dev[i], r->t.root_bytes[i], cudaMemcpyDeviceToHost));
		bound[r->t.p.tensors[i].bind_index] = host[i];
	}
	rc = tl_prog_run_library(&r->t, s, bound, arena);
	CUDA_OK(cudaMemcpy(r->arena, arena, arena_bytes, cudaMemcpyHostToDevice));
	for (int i = 0; i < n; i++) {
		if (!host[i])
			continue;
		CUDA_OK(cudaMemcpy(r->dev[i], host[i], r->t.root_bytes[i], cudaMemcpyHostToDevice));
		free(host[i]);
	}
	free(host);
	free(bound);
	free(arena);
	return rc;
}

static void run_close(struct run *r)
{
	for (int s = 0; s < r->t.plan.nsteps && r->mods; s++)
		if (r->t.plan.steps[s].kind != RD_STEP_LIBRARY)
			cuda_rtc_module_finish(&r->mods[s]);
	for (int i = 0; i < r->t.p.ntensors && r->dev; i++)
		if (r->dev[i])
			cudaFree(r->dev[i]);
	if (r->arena)
		cudaFree(r->arena);
	if (r->args_dev)
		cudaFree(r->args_dev);
	if (r->stream)
		cudaStreamDestroy(r->stream);
	free(r->dev);
	free(r->mods);
	tl_prog_close(&r->t);
}

/* The generated kernels, step after step, from the initial values. */
static int run_device(struct run *r, struct rp_error *err)
{
	void **bound = calloc((size_t)r->t.p.nbound + 1, sizeof(void *));
	size_t args_size = rd_prog_args_size(&r->t.plan);
	void *args = malloc(args_size);
	int rc = 0;

	for (int i = 0; i < r->t.p.ntensors; i++) {
		if (!r->dev[i])
			continue;
		CUDA_OK(cudaMemcpy(r->dev[i], r->t.initial[i], r->t.root_bytes[i], cudaMemcpyHostToDevice));
		bound[r->t.p.tensors[i].bind_index] = r->dev[i];
	}
	rd_prog_args_fill(&r->t.plan, args, bound, r->arena, NULL, r->t.scalars);
	CUDA_OK(cudaMemcpy(r->args_dev, args, args_size, cudaMemcpyHostToDevice));
	for (int s = 0; s < r->t.plan.nsteps && rc == 0; s++) {
		if (r->t.plan.steps[s].kind == RD_STEP_LIBRARY) {
			rc = run_library_on_host(r, s);
			continue;
		}
		rc = cuda_rtc_module_get(&r->mods[s], err);
		for (int k = 0; k < r->t.plan.steps[s].nkernels && rc == 0; k++)
			rc = cuda_rtc_launch(&r->mods[s], k, r->stream, r->args_dev, err);
	}
	CUDA_OK(cudaStreamSynchronize(r->stream));
	free(bound);
	free(args);
	return rc;
}

/* Device results against the reference, each output and inout root. */
static bool compare(struct run *r, const char *name)
{
	bool ok = true;
	char msg[512];

	for (int i = 0; i < r->t.p.ntensors; i++) {
		if (!tl_prog_is_result(&r->t, i))
			continue;
		void *got = malloc(r->t.root_bytes[i]);
		CUDA_OK(cudaMemcpy(got, r->dev[i], r->t.root_bytes[i], cudaMemcpyDeviceToHost));
		bool good = tl_prog_compare(&r->t, i, got, msg, sizeof(msg));
		GT_CHECK(good, "%s: %s", name, msg);
		ok &= good;
		free(got);
	}
	return ok;
}

/* Every output's and inout's bytes, to compare two runs bit for bit. */
static void *snapshot(struct run *r, size_t *size)
{
	size_t total = 0, at = 0;

	for (int i = 0; i < r->t.p.ntensors; i++)
		if (tl_prog_is_result(&r->t, i))
			total += r->t.root_bytes[i];
	char *buf = malloc(total ? total : 1);
	for (int i = 0; i < r->t.p.ntensors; i++)
		if (tl_prog_is_result(&r->t, i)) {
			CUDA_OK(cudaMemcpy(buf + at, r->dev[i], r->t.root_bytes[i], cudaMemcpyDeviceToHost));
			at += r->t.root_bytes[i];
		}
	*size = total;
	return buf;
}

static void run_case(struct gt *t, const struct tl_prog_case *c, uint64_t salt)
{
	struct run r;
	struct rp_error err = { 0 };
	size_t n1, n2;

	printf("%s\n", c->name);
	if (run_open(&r, cuda_dev_of(&t->dev), c, salt) < 0) {
		gt_failures++;
		run_close(&r);
		return;
	}
	printf("  %d nodes in %d steps, %llu kernels, arena %llu bytes\n", r.t.p.nnodes, r.t.plan.nsteps,
	       (unsigned long long)r.t.plan.fused_kernels, (unsigned long long)r.t.plan.arena_bytes);
	GT_CHECK(!c->steps || r.t.plan.nsteps == c->steps, "%s: planned in %d steps (%d wanted)", c->name,
		 r.t.plan.nsteps, c->steps);
	int rc = tl_prog_reference(&r.t);
	GT_CHECK(rc == 0, "%s: the host reference ran (%d)", c->name, rc);
	rc = run_device(&r, &err);
	GT_CHECK(rc == 0, "%s: the kernels compiled, loaded and launched%s%s", c->name, rc ? ": " : "",
		 rc ? gt_err_message(&err) : "");
	if (rc == 0) {
		compare(&r, c->name);
		void *first = snapshot(&r, &n1);
		rc = run_device(&r, &err);
		void *second = snapshot(&r, &n2);
		GT_CHECK(rc == 0 && n1 == n2 && memcmp(first, second, n1) == 0, "%s: a second run gives the same bits",
			 c->name);
		free(first);
		free(second);
	}
	rp_error_clear(&err);
	run_close(&r);
}

/* A module across a release (unloaded, loaded again from the image kept)
 * and a forgotten context (the handle dropped, no CUDA call): the image
 * is compiled once. */
static void module_lifecycle(struct gt *t)
{
	struct run r;
	struct rp_error err = { 0 };

	printf("module lifecycle\n");
	if (run_open(&r, cuda_dev_of(&t->dev), &tl_prog_cases[0], 1000) < 0) {
		gt_failures++;
		run_close(&r);
		return;
	}
	tl_prog_reference(&r.t);
	int rc = run_device(&r, &err);
	void *image = r.mods[0].image;
	GT_CHECK(rc == 0 && r.mods[0].res.init_count == 1 && image, "first run: compiled and loaded once");
	rd_registry_release(&t->dev.registry);
	GT_CHECK(!rd_resource_is_valid(&r.mods[0].res) && r.mods[0].module == NULL, "release unloads the module");
	rc = run_device(&r, &err);
	GT_CHECK(rc == 0 && r.mods[0].res.init_count == 2 && r.mods[0].image == image,
		 "after a release: loaded again from the image kept (init %llu)",
		 (unsigned long long)r.mods[0].res.init_count);
	GT_CHECK(compare(&r, "after a release"), "after a release: the same results");
	rd_registry_invalidate(&t->dev.registry);
	GT_CHECK(!rd_resource_is_valid(&r.mods[0].res) && r.mods[0].module == NULL, "invalidate forgets the module");
	rc = run_device(&r, &err);
	GT_CHECK(rc == 0 && r.mods[0].res.init_count == 3 && r.mods[0].image == image,
		 "after an invalidate: loaded again from the image kept");
	GT_CHECK(compare(&r, "after an invalidate"), "after an invalidate: the same results");
	rp_error_clear(&err);
	run_close(&r);
}

static int count_files(const char *dir)
{
	DIR *d = opendir(dir);
	struct dirent *e;
	int n = 0;

	if (!d)
		return -1;
	while ((e = readdir(d)))
		n += e->d_name[0] != '.';
	closedir(d);
	return n;
}

static void *read_file(const char *path, size_t *size)
{
	FILE *f = fopen(path, "rb");
	char *buf;

	if (!f)
		return NULL;
	fseek(f, 0, SEEK_END);
	*size = (size_t)ftell(f);
	fseek(f, 0, SEEK_SET);
	buf = malloc(*size ? *size : 1);
	if (fread(buf, 1, *size, f) != *size) {
		free(buf);
		buf = NULL;
	}
	fclose(f);
	return buf;
}

/* The on-disk cache: a compile writes one file; a fresh module reads the
 * same image back; a file holding another source under this source's
 * name is not taken (the header and the source are checked). */
static void disk_cache(struct gt *t)
{
	char dir[] = "/tmp/regen-rtc-test-XXXXXX";
	struct cuda_dev *cd = cuda_dev_of(&t->dev);
	struct rp_error err = { 0 };
	struct run a, b;
	int major = 0, minor = 0;

	printf("on-disk cache\n");
	if (!mkdtemp(dir)) {
		GT_CHECK(false, "mkdtemp: %s", strerror(errno));
		return;
	}
	snprintf(t->dev.rtc_cache_dir, sizeof(t->dev.rtc_cache_dir), "%s", dir);
	if (run_open(&a, cd, &tl_prog_cases[0], 2000) < 0 || run_open(&b, cd, &tl_prog_cases[1], 2001) < 0) {
		gt_failures++;
		return;
	}
	int rc = cuda_rtc_module_compile(&a.mods[0], &err);
	GT_CHECK(rc == 0 && count_files(dir) == 1, "a compile leaves one file in the cache (%d)", count_files(dir));

	struct cuda_rtc_module again;
	cuda_rtc_module_init(cd, &again, &a.t.plan.steps[0]);
	rc = cuda_rtc_module_compile(&again, &err);
	GT_CHECK(rc == 0 && again.image_size == a.mods[0].image_size &&
			 memcmp(again.image, a.mods[0].image, again.image_size) == 0,
		 "a fresh module reads the same image back");
	cuda_rtc_module_finish(&again);

	/* b's file name, a's bytes. */
	char path_a[4096], path_b[4096];
	nvrtcVersion(&major, &minor);
	snprintf(path_a, sizeof(path_a), "%s/%016llx-%s%d-nvrtc%d.%d.%s", dir,
		 (unsigned long long)a.t.plan.steps[0].source_hash, a.mods[0].image_is_ptx ? "compute" : "sm",
		 a.mods[0].arch, major, minor, a.mods[0].image_is_ptx ? "ptx" : "cubin");
	snprintf(path_b, sizeof(path_b), "%s/%016llx-%s%d-nvrtc%d.%d.%s", dir,
		 (unsigned long long)b.t.plan.steps[0].source_hash, a.mods[0].image_is_ptx ? "compute" : "sm",
		 a.mods[0].arch, major, minor, a.mods[0].image_is_ptx ? "ptx" : "cubin");
	size_t size = 0;
	void *bytes = read_file(path_a, &size);
	GT_CHECK(bytes != NULL, "the cache file is named by the source's hash and the architecture: %s", path_a);
	FILE *f = bytes ? fopen(path_b, "wb") : NULL;
	if (f) {
		fwrite(bytes, 1, size, f);
		fclose(f);
	}
	free(bytes);
	rc = cuda_rtc_module_compile(&b.mods[0], &err);
	GT_CHECK(rc == 0 && (b.mods[0].image_size != a.mods[0].image_size ||
			     memcmp(b.mods[0].image, a.mods[0].image, a.mods[0].image_size) != 0),
		 "another source's file under this source's name is not taken");
	tl_prog_reference(&b.t);
	rc = run_device(&b, &err);
	GT_CHECK(rc == 0 && compare(&b, "after the cache refused a file"), "and the kernels compiled instead run right");

	t->dev.rtc_cache_dir[0] = '\0';
	rp_error_clear(&err);
	run_close(&a);
	run_close(&b);
	char cmd[128];
	snprintf(cmd, sizeof(cmd), "rm -rf %s", dir);
	if (system(cmd) != 0)
		printf("  (could not remove %s)\n", dir);
}

/* Bandwidth of a large fused kernel: bytes moved over time, against the
 * memory's peak (clock x bus width x 2). Printed, not asserted: timings on
 * a shared machine vary; the target is 90%. */
static void bandwidth(struct gt *t, const char *name, const char *json_text, double bytes_moved)
{
	struct tl_prog_case c = { name, json_text, -1, 1, 0 };
	struct rp_error err = { 0 };
	struct run r;
	cudaEvent_t e0, e1;
	int clock_khz = 0, bus_bits = 0;
	float ms = 0;
	enum { REPS = 20 };

	if (run_open(&r, cuda_dev_of(&t->dev), &c, 3000) < 0) {
		gt_failures++;
		run_close(&r);
		return;
	}
	if (run_device(&r, &err) < 0) {
		GT_CHECK(false, "%s: %s", name, gt_err_message(&err));
		run_close(&r);
		return;
	}
	cudaEventCreate(&e0);
	cudaEventCreate(&e1);
	cudaEventRecord(e0, r.stream);
	for (int i = 0; i < REPS; i++)
		for (int s = 0; s < r.t.plan.nsteps; s++)
			for (int k = 0; k < r.t.plan.steps[s].nkernels; k++)
				cuda_rtc_launch(&r.mods[s], k, r.stream, r.args_dev, &err);
	cudaEventRecord(e1, r.stream);
	CUDA_OK(cudaEventSynchronize(e1));
	cudaEventElapsedTime(&ms, e0, e1);
	cudaDeviceGetAttribute(&clock_khz, cudaDevAttrMemoryClockRate, 0);
	cudaDeviceGetAttribute(&bus_bits, cudaDevAttrGlobalMemoryBusWidth, 0);
	double gbs = bytes_moved * REPS / (ms * 1e-3) / 1e9;
	double peak = 2.0 * clock_khz * 1e3 * bus_bits / 8 / 1e9;
	printf("  bandwidth: %s: %.0f GB/s, %.0f%% of the memory's %.0f GB/s%s\n", name, gbs, 100 * gbs / peak, peak,
	       gbs < 0.9 * peak ? " (below the 90% target)" : "");
	cudaEventDestroy(e0);
	cudaEventDestroy(e1);
	rp_error_clear(&err);
	run_close(&r);
}

int main(void)
{
	struct gt t;

	if (gt_have_gpu())
		return GT_SKIP;
	tl_rand_init();
	gt_open(&t);
	for (size_t i = 0; i < tl_prog_ncases; i++)
		run_case(&t, &tl_prog_cases[i], i + 1);
	module_lifecycle(&t);
	disk_cache(&t);

	printf("bandwidth\n");
	/* 256 Mi bf16 elements: 512 MiB in twice, out once. */
	bandwidth(&t, "y = x * 2 + z, bf16",
		  "{'tensors':[{'name':'x','kind':'input','dtype':'bf16','shape':[16384,16384]},"
		  "{'name':'z','kind':'input','dtype':'bf16','shape':[16384,16384]},"
		  "{'name':'h','kind':'intermediate','dtype':'f32','shape':[16384,16384]},"
		  "{'name':'y','kind':'output','dtype':'bf16','shape':[16384,16384]}],"
		  "'nodes':[{'op':'mul','inputs':['x'],'outputs':['h'],'attrs':{'scalar':2}},"
		  "{'op':'add','inputs':['h','z'],'outputs':['y']}]}",
		  3.0 * 16384 * 16384 * 2);
	/* Dropout as a model writes it: a Philox draw per element (ten rounds
	 * of two 32x32 products) on top of the traffic, which may make the
	 * kernel bound by its arithmetic rather than its memory. */
	bandwidth(&t, "y = x * dropout_mask(p 0.1) / 0.9, the mask drawn inline, bf16",
		  "{'tensors':[{'name':'seed','kind':'scalar'},"
		  "{'name':'x','kind':'input','dtype':'bf16','shape':[16384,16384]},"
		  "{'name':'k','kind':'intermediate','dtype':'bf16','shape':[16384,16384]},"
		  "{'name':'h','kind':'intermediate','dtype':'f32','shape':[16384,16384]},"
		  "{'name':'y','kind':'output','dtype':'bf16','shape':[16384,16384]}],"
		  "'nodes':[{'op':'dropout_mask','inputs':['seed'],'outputs':['k'],'attrs':{'p':0.1}},"
		  "{'op':'mul','inputs':['x','k'],'outputs':['h']},"
		  "{'op':'mul','inputs':['h'],'outputs':['y'],'attrs':{'scalar':1.1111111111111112}}]}",
		  2.0 * 16384 * 16384 * 2);
	bandwidth(&t, "gelu, f32",
		  "{'tensors':[{'name':'x','kind':'input','dtype':'f32','shape':[8192,16384]},"
		  "{'name':'y','kind':'output','dtype':'f32','shape':[8192,16384]}],"
		  "'nodes':[{'op':'gelu','inputs':['x'],'outputs':['y']}]}",
		  2.0 * 8192 * 16384 * 4);
	bandwidth(&t, "row sums, bf16 [65536, 4096]",
		  "{'tensors':[{'name':'x','kind':'input','dtype':'bf16','shape':[65536,4096]},"
		  "{'name':'s','kind':'output','dtype':'f32','shape':[65536]}],"
		  "'nodes':[{'op':'sum','inputs':['x'],'outputs':['s']}]}",
		  65536.0 * 4096 * 2);
	bandwidth(&t, "column sums (a bias gradient), bf16 [65536, 4096]",
		  "{'tensors':[{'name':'x','kind':'input','dtype':'bf16','shape':[65536,4096]},"
		  "{'name':'s','kind':'output','dtype':'f32','shape':[4096]}],"
		  "'nodes':[{'op':'sum','inputs':['x'],'outputs':['s'],'attrs':{'axis':'leading'}}]}",
		  65536.0 * 4096 * 2);

	gt_close(&t);
	printf("%s: %d failure%s\n", gt_failures ? "FAIL" : "PASS", gt_failures, gt_failures == 1 ? "" : "s");
	return gt_failures ? 1 : 0;
}
