/* SPDX-License-Identifier: Apache-2.0 */
#include <errno.h>
#include <pthread.h>
#include <setjmp.h>
#include <signal.h>
#include <stdbool.h>
#include <string.h>
#include "daemon/backend/host/guard.h"

struct guard {
	sigjmp_buf jmp;
	volatile uintptr_t addr;
};

/* The thread's guard while one is up; NULL elsewhere. */
static __thread struct guard *volatile current;
static struct sigaction previous;
static pthread_once_t once = PTHREAD_ONCE_INIT;
static int install_error;

static void on_sigbus(int sig, siginfo_t *info, void *ctx)
{
	struct guard *g = current;

	if (g) {
		g->addr = (uintptr_t)info->si_addr;
		current = NULL;
		siglongjmp(g->jmp, 1);
	}
	/* Not ours: what would have happened without us. */
	sigaction(SIGBUS, &previous, NULL);
	raise(SIGBUS);
}

static void install(void)
{
	struct sigaction sa;

	memset(&sa, 0, sizeof(sa));
	sa.sa_sigaction = on_sigbus;
	sa.sa_flags = SA_SIGINFO | SA_NODEFER;
	sigemptyset(&sa.sa_mask);
	if (sigaction(SIGBUS, &sa, &previous) < 0)
		install_error = -errno;
}

int rd_host_guard_install(void)
{
	pthread_once(&once, install);
	return install_error;
}

int rd_host_guarded(int (*fn)(void *arg), void *arg, uintptr_t *fault_addr)
{
	struct guard g = { .addr = 0 };
	int r;

	if (sigsetjmp(g.jmp, 1)) {
		*fault_addr = g.addr;
		return -EFAULT;
	}
	current = &g;
	r = fn(arg);
	current = NULL;
	return r;
}
