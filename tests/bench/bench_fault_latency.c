/* SPDX-License-Identifier: Apache-2.0 */
/* How long the driver takes to report a fault, with no regend in between:
 * the floor under issue 10's "fault -> Watch event" budget.
 *
 * For each kind of fault (kernels/fault.cu: a store to and a load from an
 * unmapped address, the trap instruction, a misaligned store), REPEAT
 * times, a fresh child process (a fault ends its context) launches a
 * kernel that first sets a host-mapped flag and then faults; the child
 * spins until it sees the flag (the kernel ran), then asks the context for
 * its sticky error the way the CUDA backend's health watch does (a query
 * of the legacy stream, which waits for nothing) until it gets one.
 * Printed per kind: launch -> flag seen, flag seen -> sticky error (min,
 * median, max), and the error.
 *
 * Usage: bench_fault_latency [REPEAT]. Exit 77 without a CUDA device. */
#include <cuda_runtime.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>
#include "kernels.h"

static double now_ms(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (double)ts.tv_sec * 1e3 + (double)ts.tv_nsec / 1e6;
}

struct sample {
	double launch_to_ran_ms, ran_to_error_ms;
	char error[64];
};

/* In the child: one fault, timed; the answer goes to `fd`. */
static int time_one_fault(enum rk_fault_kind kind, int fd)
{
	struct sample s = { .launch_to_ran_ms = -1, .ran_to_error_ms = -1 };
	volatile int *ran_host = NULL;
	int *ran_dev = NULL;
	void *mapped = NULL;
	cudaStream_t stream;
	cudaError_t e;
	double t_launch, t_ran, deadline;

	if (cudaSetDevice(0) != cudaSuccess || cudaFree(NULL) != cudaSuccess ||
	    cudaHostAlloc((void **)&ran_host, sizeof(int), cudaHostAllocMapped) != cudaSuccess ||
	    cudaHostGetDevicePointer((void **)&ran_dev, (void *)ran_host, 0) != cudaSuccess ||
	    cudaMalloc(&mapped, 4096) != cudaSuccess ||
	    cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking) != cudaSuccess) {
		snprintf(s.error, sizeof(s.error), "set-up: %s", cudaGetErrorName(cudaGetLastError()));
		goto out;
	}
	*ran_host = 0;
	t_launch = now_ms();
	e = rk_fault_after_flag(kind, ran_dev, mapped, stream);
	if (e != cudaSuccess) {
		snprintf(s.error, sizeof(s.error), "launch: %s", cudaGetErrorName(e));
		goto out;
	}
	deadline = t_launch + 10e3;
	while (!*ran_host && now_ms() < deadline)
		;
	t_ran = now_ms();
	if (!*ran_host) {
		snprintf(s.error, sizeof(s.error), "the kernel never ran");
		goto out;
	}
	s.launch_to_ran_ms = t_ran - t_launch;
	deadline = t_ran + 10e3;
	do {
		e = cudaStreamQuery(cudaStreamLegacy);
	} while ((e == cudaSuccess || e == cudaErrorNotReady) && now_ms() < deadline);
	s.ran_to_error_ms = now_ms() - t_ran;
	snprintf(s.error, sizeof(s.error), "%s", e == cudaSuccess || e == cudaErrorNotReady ? "none in 10 s"
											      : cudaGetErrorName(e));
out:
	return write(fd, &s, sizeof(s)) == (ssize_t)sizeof(s) ? 0 : 1;
}

static int cmp_double(const void *a, const void *b)
{
	double x = *(const double *)a, y = *(const double *)b;
	return (x > y) - (x < y);
}

int main(int argc, char **argv)
{
	static const struct {
		enum rk_fault_kind kind;
		const char *name;
	} kinds[] = {
		{ RK_FAULT_STORE_UNMAPPED, "store to an unmapped address" },
		{ RK_FAULT_LOAD_UNMAPPED, "load from an unmapped address" },
		{ RK_FAULT_TRAP, "trap instruction" },
		{ RK_FAULT_MISALIGNED, "misaligned store" },
	};
	int repeat = argc > 1 ? atoi(argv[1]) : 5, count = 0, failed = 0;

	if (repeat < 1 || repeat > 1000) {
		fprintf(stderr, "usage: %s [REPEAT (1..1000)]\n", argv[0]);
		return 2;
	}
	/* The parent never makes a context (a fork after one is unsafe):
	 * a child answers whether there is a device. */
	pid_t probe = fork();
	if (probe == 0)
		_exit(cudaGetDeviceCount(&count) == cudaSuccess && count > 0 ? 0 : 77);
	int status;
	if (probe < 0 || waitpid(probe, &status, 0) != probe || !WIFEXITED(status) || WEXITSTATUS(status) != 0) {
		printf("SKIP: no CUDA device\n");
		return 77;
	}
	printf("%-30s %-24s %-26s %s\n", "fault", "launch -> ran (ms)", "ran -> sticky error (ms)", "error");
	for (size_t k = 0; k < sizeof(kinds) / sizeof(kinds[0]); k++) {
		double launch[1000], found[1000];
		char error[64] = "";
		int n = 0;

		for (int i = 0; i < repeat; i++) {
			struct sample s;
			int fds[2];

			if (pipe(fds))
				return 1;
			pid_t pid = fork();
			if (pid == 0) {
				close(fds[0]);
				_exit(time_one_fault(kinds[k].kind, fds[1]));
			}
			close(fds[1]);
			ssize_t got = read(fds[0], &s, sizeof(s));
			close(fds[0]);
			waitpid(pid, &status, 0);
			if (got != (ssize_t)sizeof(s) || s.ran_to_error_ms < 0 || strcmp(s.error, "none in 10 s") == 0) {
				fprintf(stderr, "%s: %s\n", kinds[k].name, got == (ssize_t)sizeof(s) ? s.error : "no answer");
				failed = 1;
				continue;
			}
			launch[n] = s.launch_to_ran_ms;
			found[n++] = s.ran_to_error_ms;
			snprintf(error, sizeof(error), "%s", s.error);
		}
		if (n == 0)
			continue;
		qsort(launch, (size_t)n, sizeof(double), cmp_double);
		qsort(found, (size_t)n, sizeof(double), cmp_double);
		printf("%-30s %6.2f %6.2f %6.2f      %7.1f %7.1f %7.1f      %s\n", kinds[k].name, launch[0], launch[n / 2],
		       launch[n - 1], found[0], found[n / 2], found[n - 1], error);
	}
	return failed;
}
