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
 * would give root about a ninth and launch order a thirty-third. */
#include "gpu_common.h"
#include "daemon/backend/cuda/common.h"

#include <string.h>

#define OTHER_LANES 8
#define OTHER_DEPTH 4
#define ROOT_GEMMS 20
#define M 8192
#define N 8192
#define K 2048

static struct gt t;
static struct rd_lane *lanes[OTHER_LANES + 1];   /* [0]: root's */
static struct gt_mat a, b, d[OTHER_LANES + 1];
static struct rd_op ops[OTHER_LANES + 1][OTHER_DEPTH];

static void submit(int lane, int slot)
{
	struct rd_op *op = &ops[lane][slot];

	memset(op, 0, sizeof(*op));
	gt_gemm(op, &a, &b, NULL, &d[lane], NULL, false, false, 1.0, 0.0, RP_EPILOGUE_NONE, RP_COMPUTE_F32);
	op->lane = lanes[lane];
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

int main(void)
{
	uint64_t seed;
	struct rp_error err = { 0 };

	if (gt_have_gpu() != 0)
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
	printf("%s\n", gt_failures ? "FAIL" : "PASS");
	return gt_failures ? 1 : 0;
}
