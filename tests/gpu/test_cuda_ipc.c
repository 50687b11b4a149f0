/* SPDX-License-Identifier: Apache-2.0 */
/* Imports through rd_backend_cuda from another process. A child forked
 * before the parent touches CUDA allocates and fills memory, exports it as a
 * cudaIpcMemHandle_t and as a CUDA VMM POSIX fd (sent with SCM_RIGHTS), and
 * an interprocess event. The parent imports all three, checks the bytes are
 * the child's, runs a GEMM on them, then makes bad imports (garbage handle
 * bytes, a size past the allocation, a plain memfd as cuda_fd, a VMM fd with
 * too large a size, a handle whose exporter exited, a garbage event handle):
 * each must be io.regen.ImportFailed and the backend must keep working.
 * Importing one handle twice must share one mapping. */
#include "gpu_common.h"

#include <cuda.h>
#include <errno.h>
#include <fcntl.h>
#include <math.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>
#include "proto/errors.h"

#define M 96
#define K 160
#define N 128
#define A_OFFSET 4096

struct export_msg {
	int status;                 /* 0 ok, GT_SKIP no GPU, 1 failure */
	cudaIpcMemHandle_t mem;
	cudaIpcEventHandle_t event;
	uint64_t alloc_bytes, vmm_bytes;
	uint64_t seed_a, seed_b;
	int has_fd;
};

static int send_msg(int sock, const struct export_msg *msg, int fd)
{
	struct iovec iov = { .iov_base = (void *)msg, .iov_len = sizeof(*msg) };
	union {
		char buf[CMSG_SPACE(sizeof(int))];
		struct cmsghdr align;
	} u;
	struct msghdr mh = { .msg_iov = &iov, .msg_iovlen = 1 };
	if (fd >= 0) {
		memset(&u, 0, sizeof(u));
		mh.msg_control = u.buf;
		mh.msg_controllen = sizeof(u.buf);
		struct cmsghdr *c = CMSG_FIRSTHDR(&mh);
		c->cmsg_level = SOL_SOCKET;
		c->cmsg_type = SCM_RIGHTS;
		c->cmsg_len = CMSG_LEN(sizeof(int));
		memcpy(CMSG_DATA(c), &fd, sizeof(int));
	}
	return sendmsg(sock, &mh, 0) == (ssize_t)sizeof(*msg) ? 0 : -1;
}

static int recv_msg(int sock, struct export_msg *msg, int *fd)
{
	struct iovec iov = { .iov_base = msg, .iov_len = sizeof(*msg) };
	union {
		char buf[CMSG_SPACE(sizeof(int))];
		struct cmsghdr align;
	} u;
	struct msghdr mh = { .msg_iov = &iov, .msg_iovlen = 1, .msg_control = u.buf, .msg_controllen = sizeof(u.buf) };
	*fd = -1;
	if (recvmsg(sock, &mh, MSG_WAITALL) != (ssize_t)sizeof(*msg))
		return -1;
	for (struct cmsghdr *c = CMSG_FIRSTHDR(&mh); c; c = CMSG_NXTHDR(&mh, c)) {
		if (c->cmsg_level == SOL_SOCKET && c->cmsg_type == SCM_RIGHTS)
			memcpy(fd, CMSG_DATA(c), sizeof(int));
	}
	return 0;
}

#define CU_CHILD(call)                                                                               \
	do {                                                                                         \
		CUresult r_ = (call);                                                                \
		if (r_ != CUDA_SUCCESS) {                                                            \
			fprintf(stderr, "child: %s failed: %d\n", #call, (int)r_);                  \
			msg.status = 1;                                                              \
			send_msg(sock, &msg, -1);                                                    \
			_exit(1);                                                                    \
		}                                                                                    \
	} while (0)

/* The exporter. exit_early: export the handle and exit at once. */
static int child_main(int sock, bool exit_early, uint64_t seed)
{
	struct export_msg msg;
	memset(&msg, 0, sizeof(msg));
	int n = 0;
	if (cudaGetDeviceCount(&n) != cudaSuccess || n == 0) {
		msg.status = GT_SKIP;
		send_msg(sock, &msg, -1);
		return 0;
	}
	CUDA_OK(cudaSetDevice(0));
	msg.seed_a = seed;
	msg.seed_b = seed + 1;
	msg.alloc_bytes = A_OFFSET + (uint64_t)M * K * sizeof(float);
	void *pa = NULL;
	CUDA_OK(cudaMalloc(&pa, msg.alloc_bytes));
	CUDA_OK(rk_fill_uniform(pa, msg.alloc_bytes / sizeof(float), RK_F32, msg.seed_a, 0, 0));
	CUDA_OK(cudaDeviceSynchronize());
	CUDA_OK(cudaIpcGetMemHandle(&msg.mem, pa));
	if (exit_early) {
		send_msg(sock, &msg, -1);
		_exit(0);
	}

	/* A VMM allocation exportable as a POSIX fd. */
	CUmemAllocationProp prop;
	memset(&prop, 0, sizeof(prop));
	prop.type = CU_MEM_ALLOCATION_TYPE_PINNED;
	prop.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
	prop.location.id = 0;
	prop.requestedHandleTypes = CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR;
	size_t gran = 0;
	CU_CHILD(DRV(cuMemGetAllocationGranularity)(&gran, &prop, CU_MEM_ALLOC_GRANULARITY_MINIMUM));
	size_t want = (size_t)K * N * sizeof(float);
	msg.vmm_bytes = (want + gran - 1) / gran * gran;
	CUmemGenericAllocationHandle h;
	CU_CHILD(DRV(cuMemCreate)(&h, msg.vmm_bytes, &prop, 0));
	CUdeviceptr vb;
	CU_CHILD(DRV(cuMemAddressReserve)(&vb, msg.vmm_bytes, gran, 0, 0));
	CU_CHILD(DRV(cuMemMap)(vb, msg.vmm_bytes, 0, h, 0));
	CUmemAccessDesc acc;
	memset(&acc, 0, sizeof(acc));
	acc.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
	acc.location.id = 0;
	acc.flags = CU_MEM_ACCESS_FLAGS_PROT_READWRITE;
	CU_CHILD(DRV(cuMemSetAccess)(vb, msg.vmm_bytes, &acc, 1));
	CUDA_OK(rk_fill_uniform((void *)(uintptr_t)vb, msg.vmm_bytes / sizeof(float), RK_F32, msg.seed_b, 0, 0));
	CUDA_OK(cudaDeviceSynchronize());
	int fd = -1;
	CU_CHILD(DRV(cuMemExportToShareableHandle)(&fd, h, CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR, 0));

	cudaEvent_t ev;
	CUDA_OK(cudaEventCreateWithFlags(&ev, cudaEventInterprocess | cudaEventDisableTiming));
	CUDA_OK(cudaEventRecord(ev, 0));
	CUDA_OK(cudaDeviceSynchronize());
	CUDA_OK(cudaIpcGetEventHandle(&msg.event, ev));
	msg.has_fd = 1;
	send_msg(sock, &msg, fd);
	close(fd);

	/* Keep everything alive until the parent is done. */
	char c;
	while (read(sock, &c, 1) < 0 && errno == EINTR)
		;
	DRV(cuMemUnmap)(vb, msg.vmm_bytes);
	DRV(cuMemAddressFree)(vb, msg.vmm_bytes);
	DRV(cuMemRelease)(h);
	cudaFree(pa);
	return 0;
}

static int try_import(struct gt *t, struct rd_import *req, struct rd_buffer **out, const char *what, bool expect_ok)
{
	struct rp_error err = { 0 };
	int r = t->dev.backend->import_buffer(&t->dev, req, out, &err);
	if (expect_ok)
		GT_CHECK(r == 0, "%s imports%s%s", what, r ? ": " : "", r ? gt_err_message(&err) : "");
	else
		GT_CHECK(r < 0 && err.name && strcmp(err.name, RP_ERR_IMPORT_FAILED) == 0, "%s -> %s: %s", what,
		      err.name ? err.name : "(success!)", gt_err_message(&err));
	rp_error_clear(&err);
	return r;
}

/* D = A[M,K] (imported) x B[K,N] (imported), checked against float64. */
static void gemm_on_imports(struct gt *t, struct rd_lane *lane, struct rd_buffer *abuf, struct rd_buffer *bbuf,
			    struct rd_event *wait, const char *what)
{
	struct gt_mat a = { .dt = RP_DTYPE_F32, .rows = M, .cols = K, .ld = K, .bytes = (size_t)M * K * 4,
			    .ptr = abuf->ptr, .buf = abuf };
	struct gt_mat b = { .dt = RP_DTYPE_F32, .rows = K, .cols = N, .ld = N, .bytes = (size_t)K * N * 4,
			    .ptr = bbuf->ptr, .buf = bbuf };
	struct gt_mat d;
	gt_mat_alloc(t, &d, RP_DTYPE_F32, M, N, N);
	gt_mat_poison(&d);
	struct rd_op op;
	gt_gemm(&op, &a, &b, NULL, &d, NULL, false, false, 1.0, 0.0, RP_EPILOGUE_NONE, RP_COMPUTE_F32);
	op.wait_event = wait;
	int r = gt_run(t, lane, &op, 60);
	double rel = INFINITY;
	unsigned long nans = 0, pad = 0;
	/* The op restored the mappings if a release had dropped them. */
	a.ptr = abuf->ptr;
	b.ptr = bbuf->ptr;
	if (r == 0) {
		double *ref = malloc(sizeof(double) * M * N);
		gt_gemm_reference(&op, &a, &b, NULL, NULL, ref, false);
		rel = gt_rel_error(&d, ref, &nans, &pad);
		free(ref);
	}
	GT_CHECK(r == 0 && rel < 1e-5 && nans == 0, "%s: GEMM on imported memory: %s rel error %.3g (%lu NaN), %llu us",
	      what, gt_err_name(&op), rel, nans, (unsigned long long)op.elapsed_us);
	rp_error_clear(&op.err);
	gt_mat_free(t, &d);
}

static bool check_contents(void *devptr, uint64_t bytes, uint64_t seed, uint64_t first_index)
{
	size_t n = bytes / sizeof(float);
	float *h = malloc(bytes);
	CUDA_OK(cudaMemcpy(h, devptr, bytes, cudaMemcpyDeviceToHost));
	bool ok = true;
	for (size_t i = 0; i < n && ok; i++)
		ok = h[i] == rk_uniform_value(seed, first_index + i, 0);
	free(h);
	return ok;
}

int main(void)
{
	uint64_t seed = gt_seed();
	int sv1[2], sv2[2];
	if (socketpair(AF_UNIX, SOCK_STREAM, 0, sv1) || socketpair(AF_UNIX, SOCK_STREAM, 0, sv2)) {
		perror("socketpair");
		return 1;
	}
	/* Fork before this process touches CUDA. */
	pid_t c1 = fork();
	if (c1 == 0) {
		close(sv1[0]);
		_exit(child_main(sv1[1], false, seed));
	}
	pid_t c2 = fork();
	if (c2 == 0) {
		close(sv2[0]);
		_exit(child_main(sv2[1], true, seed + 100));
	}
	close(sv1[1]);
	close(sv2[1]);
	struct export_msg m1, m2;
	int fd = -1, fd2 = -1;
	if (recv_msg(sv1[0], &m1, &fd) < 0 || recv_msg(sv2[0], &m2, &fd2) < 0) {
		printf("FAIL: no message from the exporters\n");
		return 1;
	}
	if (m1.status == GT_SKIP) {
		printf("SKIP: no CUDA device\n");
		return GT_SKIP;
	}
	if (m1.status || m2.status || fd < 0) {
		printf("FAIL: exporter failed (status %d/%d, fd %d)\n", m1.status, m2.status, fd);
		return 1;
	}
	int st;
	waitpid(c2, &st, 0);
	printf("test_cuda_ipc: seed %llu; exporter %d holds %llu B (cudaMalloc) and %llu B (VMM); exporter %d exited\n",
	       (unsigned long long)seed, (int)c1, (unsigned long long)m1.alloc_bytes, (unsigned long long)m1.vmm_bytes,
	       (int)c2);

	struct gt t;
	gt_open(&t);
	struct rp_error err = { 0 };
	struct rd_lane *lane = t.dev.backend->lane_create(&t.dev, 0, &err);
	if (!lane) {
		printf("FAIL: lane_create: %s\n", gt_err_message(&err));
		return 1;
	}

	/* Good imports. */
	struct rd_import req;
	struct rd_buffer *abuf = NULL, *bbuf = NULL, *again = NULL, *tmp = NULL;
	memset(&req, 0, sizeof(req));
	req.kind = RD_BUFFER_CUDA_IPC;
	memcpy(req.handle, &m1.mem, 64);
	req.offset = A_OFFSET;
	req.size = (uint64_t)M * K * 4;
	req.fd = -1;
	if (try_import(&t, &req, &abuf, "cuda_ipc handle (offset 4096)", true) < 0)
		return 1;
	memset(&req, 0, sizeof(req));
	req.kind = RD_BUFFER_CUDA_FD;
	req.fd = fd;
	req.offset = 0;
	req.size = (uint64_t)K * N * 4;
	if (try_import(&t, &req, &bbuf, "cuda_fd VMM export", true) < 0)
		return 1;
	GT_CHECK(check_contents(abuf->ptr, (uint64_t)M * K * 4, m1.seed_a, A_OFFSET / 4),
	      "cuda_ipc buffer holds the exporter's bytes (at base + offset)");
	GT_CHECK(check_contents(bbuf->ptr, (uint64_t)K * N * 4, m1.seed_b, 0), "cuda_fd buffer holds the exporter's bytes");
	GT_CHECK(rd_cuda_mapping_count(&t.dev) == 2, "2 mappings held (%u)", rd_cuda_mapping_count(&t.dev));

	struct rd_event *ev = NULL;
	int r = t.dev.backend->import_event(&t.dev, (const unsigned char *)&m1.event, &ev, &err);
	GT_CHECK(r == 0, "cudaIpcEventHandle_t imports%s%s", r ? ": " : "", r ? gt_err_message(&err) : "");
	rp_error_clear(&err);
	gemm_on_imports(&t, lane, abuf, bbuf, ev, "first");

	/* The same handle again shares the mapping. */
	memset(&req, 0, sizeof(req));
	req.kind = RD_BUFFER_CUDA_IPC;
	memcpy(req.handle, &m1.mem, 64);
	req.offset = 0;
	req.size = 4096;
	req.fd = -1;
	if (try_import(&t, &req, &again, "the same cuda_ipc handle again (offset 0)", true) == 0) {
		GT_CHECK(rd_cuda_mapping_count(&t.dev) == 2, "still 2 mappings after importing the handle twice (%u)",
		      rd_cuda_mapping_count(&t.dev));
		GT_CHECK((char *)again->ptr + A_OFFSET == (char *)abuf->ptr, "both buffers lie in one mapping (%p + 4096 == %p)",
		      again->ptr, abuf->ptr);
		t.dev.backend->close_buffer(again);
		GT_CHECK(rd_cuda_mapping_count(&t.dev) == 2, "closing one of them keeps the shared mapping (%u)",
		      rd_cuda_mapping_count(&t.dev));
	}

	/* Bad imports. */
	unsigned char garbage[64];
	for (int i = 0; i < 64; i++)
		garbage[i] = (unsigned char)(rk_uniform_value(seed, (uint64_t)i, 7) * 1.0f + 128.0f);
	memset(&req, 0, sizeof(req));
	req.kind = RD_BUFFER_CUDA_IPC;
	memcpy(req.handle, garbage, 64);
	req.size = 4096;
	req.fd = -1;
	try_import(&t, &req, &tmp, "garbage cudaIpcMemHandle_t bytes", false);

	memcpy(req.handle, &m1.mem, 64);
	req.offset = 0;
	req.size = m1.alloc_bytes + 1;
	try_import(&t, &req, &tmp, "cuda_ipc size one byte past the allocation", false);
	req.offset = m1.alloc_bytes - 16;
	req.size = 32;
	try_import(&t, &req, &tmp, "cuda_ipc offset+size straddling the allocation's end", false);
	GT_CHECK(rd_cuda_mapping_count(&t.dev) == 2, "refused imports left no mapping behind (%u)",
	      rd_cuda_mapping_count(&t.dev));

	memcpy(req.handle, &m2.mem, 64);
	req.offset = 0;
	req.size = 4096;
	try_import(&t, &req, &tmp, "cuda_ipc handle whose exporter exited", false);

	int mfd = memfd_create("regen-not-cuda", MFD_CLOEXEC);
	if (mfd >= 0 && ftruncate(mfd, 1 << 21) == 0) {
		memset(&req, 0, sizeof(req));
		req.kind = RD_BUFFER_CUDA_FD;
		req.fd = mfd;
		req.size = 4096;
		try_import(&t, &req, &tmp, "a plain memfd as cuda_fd", false);
		GT_CHECK(fcntl(mfd, F_GETFD) >= 0, "the refused fd was left to the caller (still open)");
		close(mfd);
	}
	int dupfd = dup(fd);
	memset(&req, 0, sizeof(req));
	req.kind = RD_BUFFER_CUDA_FD;
	req.fd = dupfd;
	req.size = m1.vmm_bytes * 2;
	try_import(&t, &req, &tmp, "cuda_fd with size past the VMM allocation", false);
	close(dupfd);

	unsigned char bad_event[64];
	memcpy(bad_event, garbage, 64);
	struct rd_event *bev = NULL;
	r = t.dev.backend->import_event(&t.dev, bad_event, &bev, &err);
	GT_CHECK(r < 0 && err.name && strcmp(err.name, RP_ERR_IMPORT_FAILED) == 0, "garbage cudaIpcEventHandle_t -> %s: %s",
	      err.name ? err.name : "(success!)", gt_err_message(&err));
	rp_error_clear(&err);

	gemm_on_imports(&t, lane, abuf, bbuf, NULL, "after the refused imports");
	GT_CHECK(rd_cuda_mapping_count(&t.dev) == 2, "2 mappings (%u)", rd_cuda_mapping_count(&t.dev));

	/* Release drops the mappings; they come back lazily. */
	uint64_t used, base;
	t.dev.backend->memory(&t.dev, &used, &base);
	printf("  memory(): used %llu B with the imports mapped (baseline %llu B)\n", (unsigned long long)used,
	       (unsigned long long)base);
	unsigned n = rd_registry_release(&t.dev.registry);
	r = t.dev.backend->release(&t.dev, &err);
	t.dev.backend->memory(&t.dev, &used, &base);
	GT_CHECK(r == 0 && abuf->ptr == NULL, "release tore down %u resources; buffers unmapped; memory() used %llu B", n,
	      (unsigned long long)used);
	rp_error_clear(&err);
	gemm_on_imports(&t, lane, abuf, bbuf, NULL, "after release (mappings rebuilt lazily)");

	if (ev)
		t.dev.backend->close_event(ev);
	t.dev.backend->close_buffer(abuf);
	t.dev.backend->close_buffer(bbuf);
	GT_CHECK(rd_cuda_mapping_count(&t.dev) == 0, "no mapping after closing the buffers (%u)", rd_cuda_mapping_count(&t.dev));
	t.dev.backend->lane_destroy(lane);
	gt_close(&t);

	if (write(sv1[0], "x", 1) != 1)
		perror("write");
	waitpid(c1, &st, 0);
	printf("%s: test_cuda_ipc (%d failures)\n", gt_failures ? "FAIL" : "PASS", gt_failures);
	return gt_failures ? 1 : 0;
}
