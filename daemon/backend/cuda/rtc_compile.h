/* SPDX-License-Identifier: Apache-2.0 */
/* NVRTC on one step's source (daemon/program/codegen.c), its time charged
 * to the program owner's uid and stopped where that uid's budget runs out
 * (daemon/program/compile_budget.h): nvrtcSetFlowCallback asks the
 * account as NVRTC runs, some fifty times in a 0.1 s compile but the first
 * only tens of ms in (NVRTC 13), so a compile may pass the budget by that
 * much before it stops; the next one does not start. Needs
 * NVRTC alone, no CUDA runtime and no GPU: rtc.c calls it, and
 * tests/unit/test_rtc_compile runs it on the host. */
#pragma once

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include "daemon/program/compile_budget.h"
#include "daemon/program/plan.h"
#include "proto/message.h"

/* The step's image for `arch` (90 for sm_90; ptx: PTX for compute_<arch>,
 * else a CUBIN), with include_opt ("-I<dir>" holding cuda_bf16.h, or ""
 * when none was found). account NULL: nothing charged, nothing stopped.
 * 0 with *image (malloc'ed) and *size, or -errno with err set:
 * LimitExceeded (compile time per uid: nothing compiled, or NVRTC
 * stopped), BackendError (NVRTC refused the source: the first lines of its
 * log), OutOfMemory. *spent_ns (may be NULL): NVRTC's time, either way. */
int cuda_rtc_compile(const struct rd_prog_step *st, int arch, bool ptx, const char *include_opt,
		     struct rd_compile_account *account, void **image, size_t *size, uint64_t *spent_ns,
		     struct rp_error *err);
