/* SPDX-License-Identifier: Apache-2.0 */
/* bench_ring: compute calls over a lane's ring against the same calls over
 * Varlink and against the same math run in this process, on the host
 * backend (no GPU).
 *
 *   bench_ring REGEND_PATH [--iters N] [--seconds S] [--lanes L] [--window W]
 *
 * Starts its own regend (host backend, one device). Then:
 * - latency: one blocking f32 GEMM at a time (16^3 and 64^3) through
 *   libregen on each transport, and rd_host_run (regend's own host math)
 *   on the same memory in this process; p50/p99 and what regend adds;
 * - throughput: L lanes (threads, a client each) of tiny GEMMs (8^3 f32),
 *   for S seconds each way: queued W at a time (regen_gemm_submit, then
 *   regen_wait on the last), and one blocking call at a time;
 * - program Runs (io.regen.Program.Run) on each transport, a program of 2
 *   bindings and one of 142 bindings and scalars (a ring record and two
 *   continuations): this client's CPU per Run queued (regen_program_run_
 *   submit, 16 at a time: encoding and sending) and per blocking Run (the
 *   wait's spin included), and the blocking Run's wall time; transports in
 *   turns over 5 rounds, medians.
 * Prints markdown tables. Exit codes: 0 done, 1 failure, 2 usage. */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE
#endif
#include <errno.h>
#include <math.h>
#include <pthread.h>
#include <signal.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/resource.h>
#include <time.h>
#include <unistd.h>

#include "daemon/backend/host/math.h"
#include "proto/compute.h"
#include "regen.h"
#include "bench_daemon.h"

/* Dies with libregen's error where r < 0. */
static void check(regen_client *c, int r, const char *what)
{
	if (r < 0)
		bench_die_regen(c, what, r);
}

/* One memfd with A, B, D of an n^3 f32 GEMM, imported. */
struct mats {
	int n;
	size_t bytes;
	int fd;
	float *ptr;
	regen_buffer *buf;
	struct regen_gemm_args args;
};

static void tensor(struct regen_tensor *t, regen_buffer *b, uint64_t off, int n)
{
	memset(t, 0, sizeof(*t));
	t->buffer = b;
	t->offset = off;
	t->dtype = REGEN_F32;
	t->rank = 2;
	t->shape[0] = t->shape[1] = n;
}

static void mats_make(regen_client *c, struct mats *m, int n)
{
	size_t one = (size_t)n * n * sizeof(float);

	memset(m, 0, sizeof(*m));
	m->n = n;
	m->bytes = 3 * one;
	m->fd = memfd_create("bench-ring", MFD_CLOEXEC | MFD_ALLOW_SEALING);
	if (m->fd < 0 || ftruncate(m->fd, (off_t)m->bytes) < 0)
		bench_die("memfd: %s", strerror(errno));
	m->ptr = mmap(NULL, m->bytes, PROT_READ | PROT_WRITE, MAP_SHARED, m->fd, 0);
	if (m->ptr == MAP_FAILED)
		bench_die("mmap: %s", strerror(errno));
	for (size_t i = 0; i < 2 * (size_t)n * n; i++)
		m->ptr[i] = (float)((i * 7919) % 17) / 17.0f - 0.5f;
	check(c, regen_buffer_import_fd(c, 0, m->fd, m->bytes, &m->buf), "import");
	tensor(&m->args.a, m->buf, 0, n);
	tensor(&m->args.b, m->buf, one, n);
	tensor(&m->args.d, m->buf, 2 * one, n);
	m->args.alpha = 1.0;
	m->args.alpha_set = true;
}

static void mats_free(struct mats *m)
{
	regen_buffer_close(m->buf);
	munmap(m->ptr, m->bytes);
	close(m->fd);
}

/* rd_host_run on the same memory: what the work costs in this process. */
static struct bench_stats in_process(struct mats *m, long iters, double *us)
{
	struct rp_compute c = { .spec = &rp_op_gemm };
	struct rp_error err = { 0 };
	void *ptr[RP_OP_OPERANDS_MAX] = { 0 };
	size_t one = (size_t)m->n * m->n * sizeof(float);
	static char scratch[1 << 20];

	for (int s = 0; s < 4; s++) {
		if (s == RP_GEMM_C)
			continue;
		struct rp_operand *o = &c.operands[s];
		o->buffer = (struct rp_id){ .kind = RP_ID_BUFFER, .generation = 1, .serial = 1 };
		o->offset = s == RP_GEMM_A ? 0 : s == RP_GEMM_B ? one : 2 * one;
		o->dtype = RP_DTYPE_F32;
		o->rank = 2;
		o->shape[0] = o->shape[1] = m->n;
		o->strides[0] = m->n;
		o->strides[1] = 1;
		c.present[s] = true;
		ptr[s] = (char *)m->ptr + o->offset;
	}
	c.gemm.alpha = 1.0;
	if (rp_compute_check(&c, &err) < 0)
		bench_die("in-process descriptor refused");
	for (long i = 0; i < iters + 200; i++) {
		double t0 = bench_now_s();
		if (rd_host_run(&c, ptr, scratch, sizeof(scratch)) < 0)
			bench_die("rd_host_run failed");
		if (i >= 200)
			us[i - 200] = (bench_now_s() - t0) * 1e6;
	}
	return bench_summarize(us, (size_t)iters);
}

static struct bench_stats through_regend(regen_client *c, struct mats *m, long iters, double *us)
{
	for (long i = 0; i < iters + 200; i++) {
		double t0 = bench_now_s();
		check(c, regen_gemm(c, &m->args), "regen_gemm");
		if (i >= 200)
			us[i - 200] = (bench_now_s() - t0) * 1e6;
	}
	return bench_summarize(us, (size_t)iters);
}

/* ---- throughput ---- */

struct lane_run {
	pthread_t thread;
	enum regen_transport transport;
	int window;                 /* 0: blocking calls */
	double seconds;
	long calls;
	regen_client *c;
	struct mats m;
};

static pthread_barrier_t start_line;

static void *lane_main(void *arg)
{
	struct lane_run *l = arg;
	uint64_t t = 0;
	double until;

	pthread_barrier_wait(&start_line);
	until = bench_now_s() + l->seconds;
	while (bench_now_s() < until) {
		if (l->window == 0) {
			check(l->c, regen_gemm(l->c, &l->m.args), "regen_gemm");
			l->calls++;
			continue;
		}
		for (int i = 0; i < l->window; i++)
			check(l->c, regen_gemm_submit(l->c, &l->m.args, &t), "regen_gemm_submit");
		check(l->c, regen_wait(l->c, 0, t), "regen_wait");
		l->calls += l->window;
	}
	return NULL;
}

/* CPU seconds a process used so far (utime + stime from /proc). */
static double process_cpu(pid_t pid)
{
	char path[64], buf[1024], *p;
	unsigned long ut = 0, st = 0;
	FILE *f;

	snprintf(path, sizeof(path), "/proc/%d/stat", (int)pid);
	f = fopen(path, "r");
	if (!f)
		return 0;
	if (!fgets(buf, sizeof(buf), f))
		buf[0] = '\0';
	fclose(f);
	p = strrchr(buf, ')');
	if (!p || sscanf(p + 2, "%*c %*d %*d %*d %*d %*d %*u %*u %*u %*u %*u %lu %lu", &ut, &st) != 2)
		return 0;
	return (double)(ut + st) / (double)sysconf(_SC_CLK_TCK);
}

static double self_cpu(void)
{
	struct rusage ru;

	getrusage(RUSAGE_SELF, &ru);
	return (double)ru.ru_utime.tv_sec + ru.ru_utime.tv_usec * 1e-6 + ru.ru_stime.tv_sec + ru.ru_stime.tv_usec * 1e-6;
}

static pid_t worker_pid;
static double cpu_per_call_us;

static double throughput(int lanes, enum regen_transport transport, int window, double seconds)
{
	double cpu0, cpu1;
	struct lane_run *runs = calloc((size_t)lanes, sizeof(*runs));
	long total = 0;
	double t0, t1;

	pthread_barrier_init(&start_line, NULL, (unsigned)lanes + 1);
	for (int i = 0; i < lanes; i++) {
		runs[i].transport = transport;
		runs[i].window = window;
		runs[i].seconds = seconds;
		check(NULL, regen_client_connect(bench_socket(), &runs[i].c), "connect");
		regen_client_set_transport(runs[i].c, transport);
		mats_make(runs[i].c, &runs[i].m, 8);
		check(runs[i].c, regen_gemm(runs[i].c, &runs[i].m.args), "warm-up");
		if (regen_client_transport(runs[i].c, 0) != transport)
			bench_die("lane %d did not get the transport asked for", i);
		pthread_create(&runs[i].thread, NULL, lane_main, &runs[i]);
	}
	cpu0 = self_cpu() + process_cpu(worker_pid);
	pthread_barrier_wait(&start_line);
	t0 = bench_now_s();
	for (int i = 0; i < lanes; i++) {
		pthread_join(runs[i].thread, NULL);
		total += runs[i].calls;
	}
	t1 = bench_now_s();
	cpu1 = self_cpu() + process_cpu(worker_pid);
	cpu_per_call_us = (cpu1 - cpu0) / (double)total * 1e6;
	for (int i = 0; i < lanes; i++) {
		mats_free(&runs[i].m);
		regen_client_destroy(runs[i].c);
	}
	pthread_barrier_destroy(&start_line);
	free(runs);
	return (double)total / (t1 - t0);
}

/* ---- program Runs ---- */

#define WIDE_PAIRS 70
#define RUN_ROUNDS 5
#define RUN_BATCH 16

/* The calling thread's CPU seconds. */
static double thread_cpu(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
	return (double)ts.tv_sec + ts.tv_nsec * 1e-9;
}

/* A program of `pairs` pairs y<i> = -x<i> (f32 [16]), or with scalars
 * y<i> = x<i> * a + b, as Define's JSON. */
static char *run_program_text(int pairs, bool scalars)
{
	size_t size = 256 + (size_t)pairs * 400, n = 0;
	char *t = malloc(size);

	n += (size_t)snprintf(t + n, size - n, "{\"tensors\":[");
	for (int i = 0; i < pairs; i++)
		n += (size_t)snprintf(t + n, size - n,
				      "%s{\"name\":\"x%d\",\"kind\":\"input\",\"dtype\":\"f32\",\"shape\":[16]},"
				      "{\"name\":\"y%d\",\"kind\":\"output\",\"dtype\":\"f32\",\"shape\":[16]}",
				      i ? "," : "", i, i);
	if (scalars) {
		for (int i = 0; i < pairs; i++)
			n += (size_t)snprintf(t + n, size - n,
					      ",{\"name\":\"t%d\",\"kind\":\"intermediate\",\"dtype\":\"f32\",\"shape\":[16]}",
					      i);
		n += (size_t)snprintf(t + n, size - n,
				      ",{\"name\":\"a\",\"kind\":\"scalar\"},{\"name\":\"b\",\"kind\":\"scalar\"}");
	}
	n += (size_t)snprintf(t + n, size - n, "],\"nodes\":[");
	for (int i = 0; i < pairs; i++) {
		if (scalars)
			n += (size_t)snprintf(t + n, size - n,
					      "%s{\"op\":\"mul\",\"inputs\":[\"x%d\",\"a\"],\"outputs\":[\"t%d\"]},"
					      "{\"op\":\"add\",\"inputs\":[\"t%d\",\"b\"],\"outputs\":[\"y%d\"]}",
					      i ? "," : "", i, i, i, i);
		else
			n += (size_t)snprintf(t + n, size - n,
					      "%s{\"op\":\"neg\",\"inputs\":[\"x%d\"],\"outputs\":[\"y%d\"]}",
					      i ? "," : "", i, i);
	}
	snprintf(t + n, size - n, "]}");
	return t;
}

static int cmp_double(const void *a, const void *b)
{
	double x = *(const double *)a, y = *(const double *)b;

	return (x > y) - (x < y);
}

static double median(double *v, int n)
{
	qsort(v, (size_t)n, sizeof(*v), cmp_double);
	return n % 2 ? v[n / 2] : (v[n / 2 - 1] + v[n / 2]) / 2;
}

static void program_runs(regen_client *c, long iters, double *us)
{
	static const struct {
		const char *name;
		int pairs;
		bool scalars;
	} cases[] = { { "1 node, 2 bindings", 1, false }, { "140 nodes, 142 bindings and scalars", WIDE_PAIRS, true } };
	static const enum regen_transport transports[2] = { REGEN_TRANSPORT_RING, REGEN_TRANSPORT_VARLINK };
	long per_round = iters / RUN_ROUNDS;

	printf("\nprogram Runs, one client; %d rounds of %ld Runs each way, the transports in turns; medians of the "
	       "rounds (CPU: this thread's)\n\n", RUN_ROUNDS, per_round);
	printf("| program | transport | CPU µs per Run queued | CPU µs per blocking Run | blocking Run p50 µs | p99 µs |\n"
	       "|---|---|---:|---:|---:|---:|\n");
	for (size_t k = 0; k < sizeof(cases) / sizeof(cases[0]); k++) {
		char *def = run_program_text(cases[k].pairs, cases[k].scalars);
		struct regen_program_binding bind[2 * WIDE_PAIRS];
		char names[2 * WIDE_PAIRS][8];
		struct regen_program_scalar sc[2] = { { "a", 1.5 }, { "b", -0.5 } };
		regen_buffer *xb, *yb;
		regen_program *prog;
		double queued[2][RUN_ROUNDS], blocking[2][RUN_ROUNDS];
		double *walls[2] = { malloc(sizeof(double) * (size_t)iters), malloc(sizeof(double) * (size_t)iters) };
		struct bench_stats st[2];
		int fx = memfd_create("bench-x", MFD_CLOEXEC | MFD_ALLOW_SEALING);
		int fy = memfd_create("bench-y", MFD_CLOEXEC | MFD_ALLOW_SEALING);

		if (fx < 0 || fy < 0 || ftruncate(fx, 1 << 16) < 0 || ftruncate(fy, 1 << 16) < 0)
			bench_die("memfd: %s", strerror(errno));
		check(c, regen_buffer_import_fd(c, 0, fx, 1 << 16, &xb), "import");
		check(c, regen_buffer_import_fd(c, 0, fy, 1 << 16, &yb), "import");
		check(c, regen_program_define(c, 0, def, &prog), "regen_program_define");
		for (int i = 0; i < cases[k].pairs; i++) {
			snprintf(names[2 * i], sizeof(names[0]), "x%d", i);
			snprintf(names[2 * i + 1], sizeof(names[0]), "y%d", i);
			bind[2 * i] = (struct regen_program_binding){ names[2 * i], xb, 64u * (unsigned)i };
			bind[2 * i + 1] = (struct regen_program_binding){ names[2 * i + 1], yb, 64u * (unsigned)i };
		}
		struct regen_program_run_args a = {
			.program = prog, .bind = bind, .nbind = 2 * (size_t)cases[k].pairs,
			.scalars = cases[k].scalars ? sc : NULL, .nscalars = cases[k].scalars ? 2 : 0,
		};
		for (int r = 0; r < RUN_ROUNDS; r++) {
			for (int t = 0; t < 2; t++) {
				uint64_t ticket = 0;
				double cpu0, cpu;

				regen_client_set_transport(c, transports[t]);
				for (int w = 0; w < (r ? 2 : 200); w++)
					check(c, regen_program_run(c, &a), "warm-up Run");
				if (regen_client_transport(c, 0) != transports[t])
					bench_die("the lane did not take the transport asked for");
				cpu = 0;
				for (long done = 0; done < per_round; done += RUN_BATCH) {
					cpu0 = thread_cpu();
					for (int q = 0; q < RUN_BATCH; q++)
						check(c, regen_program_run_submit(c, &a, &ticket), "regen_program_run_submit");
					cpu += thread_cpu() - cpu0;
					check(c, regen_wait(c, 0, ticket), "regen_wait");
				}
				queued[t][r] = cpu / (double)((per_round + RUN_BATCH - 1) / RUN_BATCH * RUN_BATCH) * 1e6;
				cpu0 = thread_cpu();
				for (long i = 0; i < per_round; i++) {
					double t0 = bench_now_s();
					check(c, regen_program_run(c, &a), "regen_program_run");
					walls[t][r * per_round + i] = (bench_now_s() - t0) * 1e6;
				}
				blocking[t][r] = (thread_cpu() - cpu0) / (double)per_round * 1e6;
			}
		}
		for (int t = 0; t < 2; t++) {
			memcpy(us, walls[t], sizeof(double) * (size_t)(RUN_ROUNDS * per_round));
			st[t] = bench_summarize(us, (size_t)(RUN_ROUNDS * per_round));
			printf("| %s | %s | %.1f | %.1f | %.1f | %.1f |\n", cases[k].name, t ? "Varlink" : "ring",
			       median(queued[t], RUN_ROUNDS), median(blocking[t], RUN_ROUNDS), st[t].p50, st[t].p99);
			free(walls[t]);
		}
		fflush(stdout);
		check(c, regen_program_drop(prog), "regen_program_drop");
		regen_buffer_close(xb);
		regen_buffer_close(yb);
		close(fx);
		close(fy);
		free(def);
	}
}

int main(int argc, char **argv)
{
	const char *regend = NULL;
	long iters = 5000;
	double seconds = 3;
	int lanes = 4, window = 128;
	double *us;
	regen_client *c;

	for (int i = 1; i < argc; i++) {
		if (strcmp(argv[i], "--iters") == 0 && i + 1 < argc)
			iters = strtol(argv[++i], NULL, 10);
		else if (strcmp(argv[i], "--seconds") == 0 && i + 1 < argc)
			seconds = strtod(argv[++i], NULL);
		else if (strcmp(argv[i], "--lanes") == 0 && i + 1 < argc)
			lanes = atoi(argv[++i]);
		else if (strcmp(argv[i], "--window") == 0 && i + 1 < argc)
			window = atoi(argv[++i]);
		else if (argv[i][0] != '-' && !regend)
			regend = argv[i];
		else
			regend = NULL;
	}
	if (!regend || iters < 100 || lanes < 1 || lanes > 64 || window < 1 || window > 4096 || !(seconds > 0)) {
		fprintf(stderr, "usage: bench_ring REGEND_PATH [--iters N] [--seconds S] [--lanes L] [--window W]\n");
		return 2;
	}
	bench_init("bench_ring");
	signal(SIGPIPE, SIG_IGN);
	bench_start_regend(regend, "host");
	c = bench_wait_ready(30);
	us = malloc(sizeof(double) * (size_t)iters);

	printf("host backend, one blocking f32 GEMM at a time, %ld calls after 200 warm-up:\n\n", iters);
	printf("| shape | path | p50 µs | p99 µs | added p50 µs | added p99 µs |\n|---|---|---:|---:|---:|---:|\n");
	for (int n = 16; n <= 64; n *= 4) {
		struct mats m;
		struct bench_stats local, ring, var;

		mats_make(c, &m, n);
		local = in_process(&m, iters, us);
		regen_client_set_transport(c, REGEN_TRANSPORT_RING);
		ring = through_regend(c, &m, iters, us);
		regen_client_set_transport(c, REGEN_TRANSPORT_VARLINK);
		var = through_regend(c, &m, iters, us);
		printf("| %d^3 | in process (rd_host_run) | %.1f | %.1f | | |\n", n, local.p50, local.p99);
		printf("| %d^3 | regend, ring | %.1f | %.1f | %.1f | %.1f |\n", n, ring.p50, ring.p99, ring.p50 - local.p50,
		       ring.p99 - local.p99);
		printf("| %d^3 | regend, Varlink | %.1f | %.1f | %.1f | %.1f |\n", n, var.p50, var.p99,
		       var.p50 - local.p50, var.p99 - local.p99);
		mats_free(&m);
	}
	fflush(stdout);

	printf("\n8^3 f32 GEMMs on %d lanes (a thread and a client each), %.0f s each way:\n\n", lanes, seconds);
	{
		char cmd[64], line[32];
		FILE *f;
		snprintf(cmd, sizeof(cmd), "pgrep -P %d", (int)bench_regend_pid());
		f = popen(cmd, "r");
		if (f && fgets(line, sizeof(line), f))
			worker_pid = (pid_t)atoi(line);
		if (f)
			pclose(f);
	}
	printf("(CPU per call: this process and the worker, user + system, over the run: what the calls cost the "
	       "machine whatever else runs on it)\n\n");
	printf("| transport | calls | calls/s | CPU µs per call |\n|---|---|---:|---:|\n");
	static const struct {
		enum regen_transport t;
		const char *name;
		bool queued;
	} runs[] = { { REGEN_TRANSPORT_RING, "ring", true }, { REGEN_TRANSPORT_VARLINK, "Varlink", true },
		     { REGEN_TRANSPORT_RING, "ring", false }, { REGEN_TRANSPORT_VARLINK, "Varlink", false } };
	for (size_t i = 0; i < sizeof(runs) / sizeof(runs[0]); i++) {
		double rate = throughput(lanes, runs[i].t, runs[i].queued ? window : 0, seconds);
		char what[48];
		snprintf(what, sizeof(what), runs[i].queued ? "queued, %d at a time" : "blocking", window);
		printf("| %s | %s | %.0f | %.1f |\n", runs[i].name, what, rate, cpu_per_call_us);
		fflush(stdout);
	}
	program_runs(c, iters, us);
	free(us);
	regen_client_destroy(c);
	return 0;
}
