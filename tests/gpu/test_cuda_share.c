/* SPDX-License-Identifier: Apache-2.0 */
/* The GPU shared among uids, not lanes (daemon/backend/share.h, issue 30).
 *
 * Eight lanes of one uid keep four GEMMs each in flight (8192 x 8192 x
 * 2048 bf16, about half a millisecond each on an H100); a lane of another
 * uid (root's) then runs 21 of the same one after another. Root's first
 * GEMM waits for what the other uid launched while alone; of the GEMMs
 * done while root's last 20 ran, root's share. Both are measured twice in
 * the same run: with the share lifted (every lane keeps its four on the
 * GPU, as before: root's first call waits behind up to 32 of the other
 * uid's, then has a lane's share) and as the backend sets it (alone, the
 * other uid keeps a window of GEMMs that finish within cuda_share_alone_us of entering;
 * beside root's calls, and for 2 ms after each, two). The test asks, as
 * set, that root's first GEMM wait for no more of the other's than fit in
 * that time and four more (those the capacity lets run beside it), and for
 * at least 0.2 of the GEMMs after, where a share among the nine lanes
 * would give root about a ninth and launch order a thirty-third. Then the
 * same with each of the other uid's GEMMs waiting on a client's event (a
 * process forked for it, the event recorded long before): root's share
 * holds. */
#include "gpu_common.h"
#include "daemon/backend/cuda/common.h"

#include <errno.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#define OTHER_LANES 8
#define OTHER_DEPTH 4
#define ROOT_GEMMS 20
#define M 8192
#define N 8192
#define K 2048

static struct gt t;
static struct rd_lane *lanes[OTHER_LANES + 1];   /* [0]: root's */
/* Where set, each of the other uid's GEMMs waits on this client's event
 * (recorded long before: it waits for nothing). */
static struct rd_event *theirs_wait;
static struct gt_mat a, b, d[OTHER_LANES + 1];
static struct rd_op ops[OTHER_LANES + 1][OTHER_DEPTH];

static void submit(int lane, int slot)
{
	struct rd_op *op = &ops[lane][slot];

	memset(op, 0, sizeof(*op));
	gt_gemm(op, &a, &b, NULL, &d[lane], NULL, false, false, 1.0, 0.0, RP_EPILOGUE_NONE, RP_COMPUTE_F32);
	op->lane = lanes[lane];
	if (lane > 0)
		op->wait_event = theirs_wait;
	if (t.dev.backend->submit(lanes[lane], op) < 0) {
		printf("FAIL: submit on lane %d: %s\n", lane, gt_err_message(&op->err));
		exit(1);
	}
}

static bool done(int lane, int slot)
{
	pthread_mutex_lock(&t.lock);
	bool d_ = ops[lane][slot].userdata != NULL;
	pthread_mutex_unlock(&t.lock);
	return d_;
}

struct measured {
	double share;           /* root's of the GEMMs done while its last ROOT_GEMMS ran */
	unsigned long backlog;  /* the other uid's GEMMs done while root's first waited */
	double gemm_s;          /* the time a GEMM took, all of them together meanwhile */
};

/* The other uid's GEMMs done since the last look, each submitted again:
 * its lanes stay full. */
static unsigned long resubmit_theirs(const char *how)
{
	unsigned long n = 0;

	for (int l = 1; l <= OTHER_LANES; l++) {
		for (int s = 0; s < OTHER_DEPTH; s++) {
			if (done(l, s)) {
				/* Checked where it failed only: thousands are done. */
				if (ops[l][s].err.name)
					GT_CHECK(false, "%s: the other uid's GEMM: %s", how, gt_err_name(&ops[l][s]));
				n++;
				submit(l, s);
			}
		}
	}
	return n;
}

/* Keeps the other uid's lanes full while root's GEMMs run one after
 * another. */
static struct measured measure(const char *how)
{
	unsigned long theirs = 0;
	int root_done = 0;

	for (int l = 1; l <= OTHER_LANES; l++)
		for (int s = 0; s < OTHER_DEPTH; s++)
			submit(l, s);
	/* The other uid alone for 50 ms, its lanes kept full: what it has
	 * launched when root comes is what a uid alone keeps on the GPU (the
	 * 32 first ones are done long before: counting them would count
	 * nothing of the share). */
	double until = gt_now() + 0.05;
	while (gt_now() < until)
		(void)resubmit_theirs(how);
	/* Root's first GEMM waits for what the other uid launched while it
	 * was alone (up to its 32): the share bounds what comes after. The
	 * count starts once it is done. */
	double t0 = gt_now();
	bool counting = false;
	unsigned long backlog = 0;
	submit(0, 0);
	while (root_done < ROOT_GEMMS) {
		if (gt_now() - t0 > 120) {
			printf("FAIL: %s: root's GEMMs took over 120 s\n", how);
			exit(1);
		}
		theirs += resubmit_theirs(how);
		if (done(0, 0)) {
			GT_CHECK(!ops[0][0].err.name, "%s: root's GEMM: %s", how, gt_err_name(&ops[0][0]));
			if (!counting) {
				counting = true;
				backlog = theirs;
				theirs = 0;
				t0 = gt_now();
			} else {
				root_done++;
			}
			if (root_done < ROOT_GEMMS)
				submit(0, 0);
		}
	}
	double took = gt_now() - t0;
	/* Drain the other uid's. */
	for (int l = 1; l <= OTHER_LANES; l++)
		for (int s = 0; s < OTHER_DEPTH; s++)
			while (!done(l, s))
				;
	struct measured m = { .share = (double)ROOT_GEMMS / (double)(ROOT_GEMMS + theirs),
			      .backlog = backlog, .gemm_s = took / (double)(ROOT_GEMMS + theirs) };
	printf("%s: root's first GEMM waited for %lu of the other uid's; its next %d took %.1f ms beside %d lanes of "
	       "that uid with %d each in flight, which had %lu done meanwhile (%.3f ms a GEMM): root's share %.3f\n",
	       how, backlog, ROOT_GEMMS, took * 1e3, OTHER_LANES, OTHER_DEPTH, theirs, m.gemm_s * 1e3, m.share);
	return m;
}

/* The client whose event the other uid's GEMMs wait on: a process of its
 * own (CUDA opens no IPC event of the process that made it), forked before
 * this one touches CUDA. It records the event, sends its handle, and keeps
 * it until the test closes the socket. */
struct event_msg {
	int status;    /* 0, or GT_SKIP: no device */
	cudaIpcEventHandle_t handle;
};

static int event_client(int sock)
{
	struct event_msg m = { .status = GT_SKIP };
	int n = 0;
	cudaEvent_t ev;

	if (cudaGetDeviceCount(&n) == cudaSuccess && n > 0 &&
	    cudaEventCreateWithFlags(&ev, cudaEventInterprocess | cudaEventDisableTiming) == cudaSuccess &&
	    cudaEventRecord(ev, 0) == cudaSuccess && cudaDeviceSynchronize() == cudaSuccess &&
	    cudaIpcGetEventHandle(&m.handle, ev) == cudaSuccess)
		m.status = 0;
	if (write(sock, &m, sizeof(m)) != (ssize_t)sizeof(m))
		return 1;
	char c;
	while (read(sock, &c, 1) < 0 && errno == EINTR)
		;
	return 0;
}

int main(void)
{
	uint64_t seed;
	struct rp_error err = { 0 };
	int sv[2];

	if (socketpair(AF_UNIX, SOCK_STREAM, 0, sv)) {
		perror("socketpair");
		return 1;
	}
	pid_t client = fork();
	if (client == 0) {
		close(sv[0]);
		_exit(event_client(sv[1]));
	}
	close(sv[1]);
	struct event_msg from_client;
	if (read(sv[0], &from_client, sizeof(from_client)) != (ssize_t)sizeof(from_client)) {
		printf("FAIL: no event from the client process\n");
		return 1;
	}
	if (gt_have_gpu() != 0 || from_client.status == GT_SKIP)
		return GT_SKIP;
	lanes[0] = gt_start(&t, "test_cuda_share", &seed);
	lanes[0]->uid = 0;
	for (int l = 1; l <= OTHER_LANES; l++) {
		lanes[l] = t.dev.backend->lane_create(&t.dev, (unsigned)l, &err);
		if (!lanes[l]) {
			printf("FAIL: lane_create: %s\n", gt_err_message(&err));
			return 1;
		}
		lanes[l]->uid = 65534;
	}
	gt_mat_alloc(&t, &a, RP_DTYPE_BF16, M, K, K);
	gt_mat_alloc(&t, &b, RP_DTYPE_BF16, K, N, N);
	gt_mat_fill(&a, seed, -4);
	gt_mat_fill(&b, seed + 1, -4);
	for (int l = 0; l <= OTHER_LANES; l++)
		gt_mat_alloc(&t, &d[l], RP_DTYPE_BF16, M, N, N);

	struct rd_share *share = &cuda_dev_of(&t.dev)->share;
	unsigned capacity = share->capacity;
	uint64_t alone_ns = share->alone_ns;
	/* Warm: plans and the lanes' scratch. */
	for (int l = 0; l <= OTHER_LANES; l++) {
		submit(l, 0);
		while (!done(l, 0))
			;
	}
	pthread_mutex_lock(&share->lock);
	share->capacity = UINT32_MAX;
	share->alone_ns = UINT64_MAX;
	pthread_mutex_unlock(&share->lock);
	struct measured by_lane = measure("share lifted (a share a lane)");
	pthread_mutex_lock(&share->lock);
	share->capacity = capacity;
	share->alone_ns = alone_ns;
	pthread_mutex_unlock(&share->lock);
	struct measured uids = measure("share as set (a share a uid)");
	GT_CHECK(uids.share >= 0.2, "root's share %.3f with the share set, %.3f without: the GPU went round the lanes, "
		 "not the uids", uids.share, by_lane.share);
	double fit = alone_ns == UINT64_MAX ? (double)(OTHER_LANES * OTHER_DEPTH) : (double)alone_ns * 1e-9 / uids.gemm_s;
	GT_CHECK((double)uids.backlog <= fit + capacity, "root's first GEMM waited for %lu of the other uid's, past the %.1f "
		 "that fit in its %.1f ms alone and %u more (%lu with the share lifted)", uids.backlog, fit,
		 (double)alone_ns * 1e-6, capacity, by_lane.backlog);
	/* The other uid's GEMMs each wait on a client's event: they take part
	 * in the share all the same (they took none before: an event on every
	 * call took the GPU from root, a share a lane again). */
	struct rd_event *ev = NULL;
	GT_CHECK(t.dev.backend->import_event(&t.dev, (const unsigned char *)&from_client.handle, &ev, &err) == 0,
		 "importing the client's event: %s", gt_err_message(&err));
	if (ev) {
		theirs_wait = ev;
		struct measured waiting = measure("share as set, the other uid's GEMMs each waiting on a client's event");
		theirs_wait = NULL;
		GT_CHECK(waiting.share >= 0.2, "root's share %.3f beside GEMMs that wait on a client's event (%.3f "
			 "beside those that wait on none): a wait took them out of the share", waiting.share, uids.share);
		t.dev.backend->close_event(ev);
	}
	close(sv[0]);
	waitpid(client, NULL, 0);
	printf("%s\n", gt_failures ? "FAIL" : "PASS");
	return gt_failures ? 1 : 0;
}
