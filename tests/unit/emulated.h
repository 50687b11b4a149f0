/* SPDX-License-Identifier: Apache-2.0 */
/* CUDA C run on the host for the unit tests: compiled as C++ behind
 * tests/unit/program_emulator.hpp (the host playing the GPU) into a shared
 * object the test loads; the compiler, the toolkit's headers and the
 * emulator named by meson (REGEN_TEST_CXX, REGEN_TEST_CUDA_INCLUDE,
 * REGEN_TEST_EMULATOR), each object in a folder of the test's own. */
#pragma once

#include <stddef.h>

struct tl_emulated {
	const char *cxx, *cuda_include, *emulator;
	char workdir[64];
};

/* 0, or the test's exit status: 77 (printed why: AddressSanitizer, which
 * does not follow the emulator's stack switches; no compiler, headers or
 * emulator; no <cuda_include>/<header>), 1 (no folder). */
int tl_emulated_open(struct tl_emulated *e, const char *header);
/* `text` (CUDA C, then whatever the test calls: RG_EMULATOR_LAUNCHER)
 * compiled into <workdir>/<stem>.so, once, with -I<include> besides the
 * toolkit's where include is not NULL; dlopen's handle. A compiler's
 * failure fails the test. */
void *tl_emulated_load(const struct tl_emulated *e, const char *stem, const char *text, const char *include);
void tl_emulated_close(struct tl_emulated *e);
