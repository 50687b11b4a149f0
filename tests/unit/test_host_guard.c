/* SPDX-License-Identifier: Apache-2.0 */
/* The host backend's second line against client memory that vanishes:
 * SIGBUS on a guarded access returns to the guard, names the address, and
 * leaves the process and the next guarded call fine; outside a guard
 * SIGBUS still ends the process as it would without the handler. */
#include <check.h>
#include <errno.h>
#include <signal.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>
#include <stdlib.h>
#include <sys/mman.h>
#include <sys/wait.h>
#include <unistd.h>

#include "daemon/backend/host/guard.h"

static volatile unsigned char *page;
static long page_size;

static int touch(void *arg)
{
	volatile unsigned char *p = arg;
	unsigned sum = 0;

	for (long i = 0; i < 2 * page_size; i += 64)
		sum += p[i];
	return (int)(sum & 1);
}

/* Two pages of a memfd, mapped, then the file cut to nothing. */
static void *vanishing_map(void)
{
	int fd = memfd_create("guard", MFD_CLOEXEC);
	void *m;

	ck_assert_int_ge(fd, 0);
	ck_assert_int_eq(ftruncate(fd, 2 * page_size), 0);
	m = mmap(NULL, 2 * page_size, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
	ck_assert_ptr_ne(m, MAP_FAILED);
	ck_assert_int_eq(ftruncate(fd, 0), 0);
	close(fd);
	return m;
}

START_TEST(sigbus_inside_a_guard_returns_to_it)
{
	uintptr_t addr = 0;
	void *m;

	page_size = sysconf(_SC_PAGESIZE);
	ck_assert_int_eq(rd_host_guard_install(), 0);
	m = vanishing_map();
	for (int round = 0; round < 3; round++) {
		addr = 0;
		ck_assert_int_eq(rd_host_guarded(touch, m, &addr), -EFAULT);
		ck_assert_msg(addr >= (uintptr_t)m && addr < (uintptr_t)m + 2 * page_size, "fault at %#lx, map at %p",
			      (unsigned long)addr, m);
	}
	/* Memory that is there is fine, through the same guard. */
	page = calloc(2, (size_t)page_size);
	ck_assert_int_eq(rd_host_guarded(touch, (void *)page, &addr), 0);
	free((void *)page);
	munmap(m, 2 * page_size);
}
END_TEST

/* Without a sanitizer's handler before ours, the process dies of SIGBUS
 * itself. */
static bool sanitizer_absent(void)
{
	char line[512];
	bool found = false;
	FILE *f = fopen("/proc/self/maps", "r");

	while (f && fgets(line, sizeof(line), f))
		found = found || strstr(line, "libasan") != NULL;
	if (f)
		fclose(f);
	return !found;
}

START_TEST(sigbus_outside_a_guard_still_kills)
{
	int status;
	pid_t pid;

	/* Under AddressSanitizer its handler came first and reports the fault
	 * as an error of its own: what this case proves is for the plain build. */
	if (!sanitizer_absent())
		return;
	page_size = sysconf(_SC_PAGESIZE);
	ck_assert_int_eq(rd_host_guard_install(), 0);
	pid = fork();
	ck_assert_int_ge(pid, 0);
	if (pid == 0) {
		touch(vanishing_map());
		_exit(0);
	}
	ck_assert_int_eq(waitpid(pid, &status, 0), pid);
	ck_assert_msg(WIFSIGNALED(status) && WTERMSIG(status) == SIGBUS, "status %#x", status);
}
END_TEST

int main(void)
{
	Suite *s = suite_create("host_guard");
	TCase *tc = tcase_create("guard");
	SRunner *sr;
	int failed;

	tcase_add_test(tc, sigbus_inside_a_guard_returns_to_it);
	tcase_add_test(tc, sigbus_outside_a_guard_still_kills);
	suite_add_tcase(s, tc);
	sr = srunner_create(s);
	srunner_run_all(sr, CK_NORMAL);
	failed = srunner_ntests_failed(sr);
	srunner_free(sr);
	return failed == 0 ? EXIT_SUCCESS : EXIT_FAILURE;
}
