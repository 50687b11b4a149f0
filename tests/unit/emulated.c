/* SPDX-License-Identifier: Apache-2.0 */
#include "tests/unit/emulated.h"

#include <check.h>
#include <dlfcn.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

int tl_emulated_open(struct tl_emulated *e, const char *header)
{
	char probe[4200];

#if defined(__SANITIZE_ADDRESS__)
	(void)e;
	(void)header;
	(void)probe;
	/* The emulator's threads are ucontexts (makecontext/swapcontext),
	 * whose stack switches AddressSanitizer cannot follow: it aborts. */
	printf("skipped: built with AddressSanitizer, which does not follow the emulator's stack switches\n");
	return 77;
#else
	e->cxx = getenv("REGEN_TEST_CXX");
	e->cuda_include = getenv("REGEN_TEST_CUDA_INCLUDE");
	e->emulator = getenv("REGEN_TEST_EMULATOR");
	if (!e->cxx || !*e->cxx || !e->cuda_include || !e->emulator) {
		printf("skipped: no C++ compiler, toolkit include folder or emulator named (REGEN_TEST_CXX, "
		       "REGEN_TEST_CUDA_INCLUDE, REGEN_TEST_EMULATOR; meson sets them)\n");
		return 77;
	}
	snprintf(probe, sizeof(probe), "%s/%s", e->cuda_include, header);
	if (access(probe, R_OK) != 0) {
		printf("skipped: no %s\n", probe);
		return 77;
	}
	snprintf(e->workdir, sizeof(e->workdir), "/tmp/regen-emulated-XXXXXX");
	if (!mkdtemp(e->workdir)) {
		perror("mkdtemp");
		return 1;
	}
	return 0;
#endif
}

void *tl_emulated_load(const struct tl_emulated *e, const char *stem, const char *text, const char *include)
{
	char src[4200], so[4200], *cmd = NULL;
	FILE *f;

	snprintf(src, sizeof(src), "%s/%s.cpp", e->workdir, stem);
	snprintf(so, sizeof(so), "%s/%s.so", e->workdir, stem);
	if (access(so, R_OK) != 0) {
		f = fopen(src, "w");
		ck_assert_ptr_nonnull(f);
		fprintf(f, "#include \"%s\"\n%s", e->emulator, text);
		fclose(f);
		ck_assert_int_ge(asprintf(&cmd, "'%s' -std=c++17 -O1 -w -U_FORTIFY_SOURCE -fPIC -shared -I'%s'%s%s%s '%s' "
					  "-o '%s' 2>&1",
					  e->cxx, e->cuda_include, include ? " -I'" : "", include ? include : "",
					  include ? "'" : "", src, so), 0);
		int r = system(cmd);
		ck_assert_msg(r == 0, "%s does not compile on the host (%d): %s", stem, r, cmd);
		free(cmd);
	}
	void *h = dlopen(so, RTLD_NOW | RTLD_LOCAL);
	ck_assert_msg(h != NULL, "dlopen: %s", dlerror());
	return h;
}

void tl_emulated_close(struct tl_emulated *e)
{
	char cmd[200];

	snprintf(cmd, sizeof(cmd), "rm -rf '%s'", e->workdir);
	if (system(cmd) != 0)
		fprintf(stderr, "could not remove %s\n", e->workdir);
}
