/* SPDX-License-Identifier: Apache-2.0 */
/* The deadline's budget on a GPU (the host backend's is host/lane.c's).
 *
 * regend counts the device as hung when a call is still running
 * call_deadline_ms after it was submitted, and respawns the worker, every
 * user's ids and calls with it. Memory bounds most calls' work, not all:
 * attention over long sequences of few heads, or a GEMM of long K, can
 * need minutes on a GPU with memory to spare. So each call's least time is
 * found as it is submitted: its tensor-core multiply-adds at the device's
 * peak (its SMs at their highest clock, each doing the architecture's
 * dense FP8 rate, the fastest it has, and that twice over), behind the
 * least time of the calls queued on its lane (they run first). A call that
 * cannot finish within half of call_deadline_ms even so is refused
 * (io.regen.LimitExceeded {resource: "work", limit: call_deadline_ms}), as
 * the host backend refuses one: only calls that no GPU of this kind could
 * run in time, never one a real model makes. What this cannot see (an
 * attention's lengths in device memory, a client's kernel it waits on) is
 * left to the deadline, and a hang is charged to its uid
 * (daemon/hang_charge.h). */
#include <errno.h>
#include "daemon/backend/cuda/common.h"
#include "proto/errors.h"

/* Dense FP8 multiply-adds an SM does in a clock: Hopper's (sm_90), twice
 * Ampere's and Ada's FP16 rate where the architecture has no faster
 * type; newer architectures are taken at twice Hopper's. */
static double macs_per_sm_clock(int major)
{
	return major >= 10 ? 8192.0 : major >= 9 ? 4096.0 : 2048.0;
}

void cuda_work_open(struct cuda_dev *cd)
{
	int sms = 0, khz = 0, major = 0;

	if (cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, cd->dev->index) != cudaSuccess ||
	    cudaDeviceGetAttribute(&khz, cudaDevAttrClockRate, cd->dev->index) != cudaSuccess ||
	    cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, cd->dev->index) != cudaSuccess ||
	    sms <= 0 || khz <= 0) {
		cd->peak_macs_per_ns = 0.0;   /* unknown: nothing refused by its estimate */
		return;
	}
	cd->peak_macs_per_ns = 2.0 * (double)sms * ((double)khz * 1e-6) * macs_per_sm_clock(major);
}

double cuda_work_macs(const struct rp_compute *c)
{
	switch (c->spec->id) {
	case RP_OP_GEMM:
		return (double)c->gemm.m * (double)c->gemm.n * (double)c->gemm.k;
	case RP_OP_ATTENTION:
	case RP_OP_ATTENTION_BACKWARD: {
		const struct rp_attention *a = &c->attention;
		/* The padded lengths bound the work from above only: the real
		 * ones are in device memory. */
		if (a->padded)
			return 0.0;
		double scores = (double)a->batch * (double)a->heads * (double)a->seq_q * (double)a->seq_kv;
		if (a->causal)
			scores /= 2.0;
		double fwd = scores * (double)(a->head_dim + a->head_dim_v);
		return c->spec->id == RP_OP_ATTENTION ? fwd : 2.0 * fwd;
	}
	default:
		/* The rest read and write their operands once or so: memory
		 * regend checked bounds them to milliseconds. */
		return 0.0;
	}
}

uint64_t cuda_work_least_ns(const struct cuda_dev *cd, const struct rp_compute *c)
{
	if (cd->peak_macs_per_ns <= 0.0)
		return 0;
	double ns = cuda_work_macs(c) / cd->peak_macs_per_ns;
	return ns >= 1.8e19 ? UINT64_MAX : (uint64_t)ns;
}

int cuda_work_take(struct cuda_lane *l, struct rd_op *op)
{
	const struct rd_device *dev = l->cd->dev;
	const uint64_t budget_ns = (uint64_t)dev->call_deadline_ms * 1000000u / 2;

	op->work_ns = op->run ? 0 : cuda_work_least_ns(l->cd, &op->compute);
	if (!op->work_ns)
		return 0;
	uint64_t ahead = atomic_load(&l->backlog_ns);
	if (dev->call_deadline_ms && (op->work_ns > budget_ns || ahead > budget_ns - op->work_ns)) {
		rp_err_limit_exceeded(&op->err, "work", dev->call_deadline_ms,
				      "%s needs %.3g multiply-adds: at least %.0f s on device %d at its peak, behind at "
				      "least %.0f s queued on its lane, past half of the %u ms within which every "
				      "call must finish (call_deadline_ms); split it into smaller calls",
				      op->compute.spec->method, cuda_work_macs(&op->compute), (double)op->work_ns / 1e9,
				      dev->index, (double)ahead / 1e9, dev->call_deadline_ms);
		op->work_ns = 0;
		return -E2BIG;
	}
	atomic_fetch_add(&l->backlog_ns, op->work_ns);
	return 0;
}

void cuda_work_return(struct cuda_lane *l, struct rd_op *op)
{
	if (!op->work_ns)
		return;
	atomic_fetch_sub(&l->backlog_ns, op->work_ns);
	op->work_ns = 0;
}
