/* SPDX-License-Identifier: Apache-2.0 */
/* Load benchmark: N client processes x M mixed calls against a running
 * regend (host backend), with io.regen.Device.Restart of every device once
 * a second from another process.
 *
 *   regen-load --socket PATH [--clients 64] [--calls 10000]
 *              [--restart-interval 1.0] [--devices 2] [--crash-every K]
 *
 * --crash-every K: every K-th tick injects a `crash` into one device (in
 * turn) instead of the Restart, so the worker is respawned under load and
 * its clients see their connections reset.
 * Calls, per client, in a fixed mix: Gemm 16x16x16 f32 (50%), Generation
 * on the main socket (20%), ImportBuffer and CloseBuffer of a small memfd
 * (15% each), one call at a time over raw Varlink sockets. Every call must
 * get exactly one reply: a reply is matched to the one call outstanding,
 * and any message beyond it (a duplicate) is counted. A failure must be
 * one a restart explains: io.regen.Draining, io.regen.StaleGeneration
 * (the client then imports again), io.regen.DeviceLost, or the connection
 * reset around a respawn (the client reconnects and imports again).
 * Anything else, a call without a reply within 30 s, or a duplicate fails
 * the run (exit 1). Prints a table: per kind, calls, ok, each failure,
 * p50/p99 latency and calls/s. */
#include <errno.h>
#include <fcntl.h>
#include <getopt.h>
#include <math.h>
#include <poll.h>
#include <signal.h>
#include <stdbool.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "client/include/regen.h"
#include "proto/frame.h"
#include "proto/message.h"

enum kind { K_GEMM, K_GENERATION, K_IMPORT, K_CLOSE, K_COUNT };
static const char *const kind_names[K_COUNT] = { "Gemm", "Generation", "ImportBuffer", "CloseBuffer" };
/* The mix, one entry per call slot. */
static const enum kind mix[20] = { K_GEMM, K_GENERATION, K_GEMM, K_IMPORT, K_GEMM, K_CLOSE, K_GEMM, K_GENERATION,
				   K_GEMM, K_IMPORT, K_GEMM, K_CLOSE, K_GEMM, K_GENERATION, K_GEMM, K_IMPORT,
				   K_GEMM, K_CLOSE, K_GENERATION, K_GEMM };

enum outcome { O_OK, O_DRAINING, O_STALE, O_LOST, O_RESET, O_OTHER, O_COUNT };

#define REPLY_TIMEOUT_S 30.0

/* Shared with the children (MAP_SHARED before fork). */
struct call_rec {
	float latency_us;
	uint8_t kind, outcome;
};
struct client_result {
	uint64_t counts[K_COUNT][O_COUNT];
	uint64_t duplicates, timeouts, reconnects, reimports;
	char other[160];      /* the first unexpected error */
	int done;
};

static struct {
	const char *socket;
	int clients, calls, devices;
	double restart_interval;
	int crash_every;
} opt = { NULL, 64, 10000, 2, 1.0, 0 };

static double now(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (double)ts.tv_sec + (double)ts.tv_nsec / 1e9;
}

/* ---- A raw connection ---- */

struct conn {
	int fd;
	struct rp_rx rx;
};

static int conn_open(struct conn *c, const char *path)
{
	struct sockaddr_un sa = { .sun_family = AF_UNIX };

	rp_rx_init(&c->rx);
	c->fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
	if (c->fd < 0)
		return -errno;
	snprintf(sa.sun_path, sizeof(sa.sun_path), "%s", path);
	if (connect(c->fd, (struct sockaddr *)&sa, sizeof(sa)) < 0) {
		int e = -errno;
		close(c->fd);
		c->fd = -1;
		return e;
	}
	return 0;
}

static void conn_close(struct conn *c)
{
	if (c->fd >= 0)
		close(c->fd);
	c->fd = -1;
	rp_rx_finish(&c->rx);
}

static int conn_send(struct conn *c, const char *text, const int *fds, size_t nfds)
{
	struct rp_tx tx;
	int r;

	rp_tx_init(&tx);
	r = rp_tx_push(&tx, text, strlen(text), fds, nfds);
	while (r == 0 || r == -EAGAIN) {
		r = rp_tx_flush(&tx, c->fd);
		if (r == 0)
			break;
		if (r == -EAGAIN) {
			struct pollfd p = { .fd = c->fd, .events = POLLOUT };
			poll(&p, 1, 1000);
		}
	}
	rp_tx_finish(&tx);
	return r;
}

/* The one reply to the call outstanding: 0 with *call filled, -ETIMEDOUT,
 * -ECONNRESET. */
static int conn_recv(struct conn *c, struct rp_call *call, double timeout_s)
{
	double deadline = now() + timeout_s;

	for (;;) {
		struct rp_msg msg;
		int r = rp_rx_next(&c->rx, &msg);

		if (r == RP_RX_MESSAGE) {
			struct rp_error err = { 0 };
			r = rp_call_parse(msg.text, msg.len, call, &err);
			rp_msg_finish(&msg);
			rp_error_clear(&err);
			return r < 0 ? -EPROTO : 0;
		}
		if (r != RP_RX_NONE)
			return -EPROTO;
		double left = deadline - now();
		if (left <= 0)
			return -ETIMEDOUT;
		struct pollfd p = { .fd = c->fd, .events = POLLIN };
		if (poll(&p, 1, (int)(left * 1000) + 1) == 0)
			return -ETIMEDOUT;
		ssize_t n = rp_rx_read(&c->rx, c->fd);
		if (n == -EAGAIN || n == -EINTR)
			continue;
		if (n <= 0)
			return -ECONNRESET;
	}
}

/* A message waiting when no call is outstanding is a duplicate reply. */
static int conn_extra(struct conn *c)
{
	struct pollfd p = { .fd = c->fd, .events = POLLIN };
	struct rp_msg msg;
	int n = 0;

	if (c->rx.head == NULL && poll(&p, 1, 0) == 1 && (p.revents & POLLIN)) {
		if (rp_rx_read(&c->rx, c->fd) <= 0)
			return 0;   /* end of stream: seen by the next call */
	}
	while (rp_rx_next(&c->rx, &msg) == RP_RX_MESSAGE) {
		rp_msg_finish(&msg);
		n++;
	}
	return n;
}

/* ---- A client ---- */

struct client {
	int index, device;
	char worker_socket[160];
	struct conn main, data;
	int memfd, tmpfd;
	char buf[64], tmp[64];
	bool had_buf;            /* imported once already: the next import is a re-import */
	struct client_result *res;
	struct call_rec *recs;
};

static enum outcome classify(const char *error, struct client *cl)
{
	if (!error)
		return O_OK;
	if (strcmp(error, REGEN_ERROR_DRAINING) == 0)
		return O_DRAINING;
	if (strcmp(error, REGEN_ERROR_STALE_GENERATION) == 0)
		return O_STALE;
	if (strcmp(error, REGEN_ERROR_DEVICE_LOST) == 0)
		return O_LOST;
	if (!cl->res->other[0])
		snprintf(cl->res->other, sizeof(cl->res->other), "%s", error);
	return O_OTHER;
}

/* One call and its one reply. *reply_out (may be NULL) gets the reply's
 * parameters' "buffer". */
static enum outcome call(struct client *cl, struct conn *c, enum kind k, const char *text, const int *fds, size_t nfds,
			 char *buffer_out)
{
	struct rp_call reply;
	enum outcome o;
	int r;

	if (c->fd < 0)
		return O_RESET;
	if (conn_send(c, text, fds, nfds) < 0) {
		conn_close(c);
		return O_RESET;
	}
	r = conn_recv(c, &reply, REPLY_TIMEOUT_S);
	if (r == -ETIMEDOUT) {
		cl->res->timeouts++;
		conn_close(c);
		return O_OTHER;
	}
	if (r < 0) {
		conn_close(c);
		return O_RESET;
	}
	o = classify(reply.error, cl);
	if (o == O_OK && buffer_out) {
		const char *b = cJSON_GetStringValue(cJSON_GetObjectItem(reply.params, "buffer"));
		snprintf(buffer_out, 64, "%s", b ? b : "");
	}
	rp_call_finish(&reply);
	cl->res->duplicates += (uint64_t)conn_extra(c);
	(void)k;
	return o;
}

static void reconnect(struct client *cl, struct conn *c, const char *path)
{
	double deadline = now() + 30;

	conn_close(c);
	while (conn_open(c, path) < 0) {
		if (now() > deadline) {
			snprintf(cl->res->other, sizeof(cl->res->other), "cannot reconnect to %s for 30 s", path);
			return;
		}
		usleep(10000);
	}
	cl->res->reconnects++;
}

static enum outcome import(struct client *cl, int fd, size_t size, char *id_out)
{
	char text[256];

	snprintf(text, sizeof(text),
		 "{\"method\":\"io.regen.Memory.ImportBuffer\",\"parameters\":{\"device\":%d,\"kind\":\"host_fd\",\"size\":%zu,\"fd\":0}}",
		 cl->device, size);
	return call(cl, &cl->data, K_IMPORT, text, &fd, 1, id_out);
}

static int client_main(struct client *cl)
{
	const size_t mat = 16 * 16 * 4;
	char text[1024];

	cl->main.fd = cl->data.fd = -1;
	reconnect(cl, &cl->main, opt.socket);
	reconnect(cl, &cl->data, cl->worker_socket);
	cl->res->reconnects = 0;
	cl->memfd = memfd_create("load", MFD_CLOEXEC | MFD_ALLOW_SEALING);
	cl->tmpfd = memfd_create("load-tmp", MFD_CLOEXEC | MFD_ALLOW_SEALING);
	if (cl->memfd < 0 || cl->tmpfd < 0 || ftruncate(cl->memfd, 3 * mat) < 0 || ftruncate(cl->tmpfd, 4096) < 0 ||
	    fcntl(cl->memfd, F_ADD_SEALS, F_SEAL_SHRINK) < 0 || fcntl(cl->tmpfd, F_ADD_SEALS, F_SEAL_SHRINK) < 0)
		return 1;
	cl->buf[0] = cl->tmp[0] = '\0';

	for (int i = 0; i < opt.calls; i++) {
		enum kind k = mix[(i + cl->index) % 20];
		enum outcome o;
		double t0;

		/* Without a buffer (a new generation, a reset) the GEMM becomes
		 * the import that brings it back. */
		if (k == K_GEMM && !cl->buf[0])
			k = K_IMPORT;
		t0 = now();
		switch (k) {
		case K_GEMM:
			snprintf(text, sizeof(text),
				 "{\"method\":\"io.regen.Compute.Gemm\",\"parameters\":{"
				 "\"a\":{\"buffer\":\"%s\",\"dtype\":\"f32\",\"shape\":[16,16]},"
				 "\"b\":{\"buffer\":\"%s\",\"offset\":%zu,\"dtype\":\"f32\",\"shape\":[16,16]},"
				 "\"d\":{\"buffer\":\"%s\",\"offset\":%zu,\"dtype\":\"f32\",\"shape\":[16,16]}}}",
				 cl->buf, cl->buf, mat, cl->buf, 2 * mat);
			o = call(cl, &cl->data, k, text, NULL, 0, NULL);
			if (o == O_STALE || o == O_LOST)
				cl->buf[0] = '\0';
			break;
		case K_GENERATION:
			o = call(cl, &cl->main, k, "{\"method\":\"io.regen.Device.Generation\",\"parameters\":{}}", NULL, 0,
				 NULL);
			break;
		case K_IMPORT:
			if (!cl->buf[0]) {
				o = import(cl, cl->memfd, 3 * mat, cl->buf);
				if (o == O_OK)
					cl->res->reimports += cl->had_buf;
				cl->had_buf = cl->had_buf || o == O_OK;
			} else if (!cl->tmp[0]) {
				o = import(cl, cl->tmpfd, 4096, cl->tmp);
			} else {
				/* Already holds one: close it first, as its own call. */
				k = K_CLOSE;
				goto close_tmp;
			}
			break;
		case K_CLOSE:
		close_tmp:
			if (!cl->tmp[0]) {
				o = import(cl, cl->tmpfd, 4096, cl->tmp);
				k = K_IMPORT;
				break;
			}
			snprintf(text, sizeof(text), "{\"method\":\"io.regen.Memory.CloseBuffer\",\"parameters\":{\"buffer\":\"%s\"}}",
				 cl->tmp);
			o = call(cl, &cl->data, k, text, NULL, 0, NULL);
			/* Closed, or gone with its generation: either way not ours now. */
			if (o == O_OK || o == O_STALE || o == O_LOST || o == O_RESET)
				cl->tmp[0] = '\0';
			break;
		default:
			o = O_OTHER;
		}
		cl->recs[i].latency_us = (float)((now() - t0) * 1e6);
		cl->recs[i].kind = (uint8_t)k;
		cl->recs[i].outcome = (uint8_t)o;
		cl->res->counts[k][o]++;
		if (o == O_RESET) {
			/* A respawn: everything on that worker is gone. */
			if (cl->main.fd < 0)
				reconnect(cl, &cl->main, opt.socket);
			if (cl->data.fd < 0) {
				reconnect(cl, &cl->data, cl->worker_socket);
				cl->buf[0] = cl->tmp[0] = '\0';
			}
		}
		if (o == O_OTHER && cl->res->other[0] && cl->res->timeouts)
			break;
	}
	/* Nothing more may arrive once every call is answered. */
	usleep(100000);
	cl->res->duplicates += (uint64_t)conn_extra(&cl->main) + (uint64_t)conn_extra(&cl->data);
	cl->res->done = 1;
	return 0;
}

/* ---- The restarter ---- */

struct restart_stats {
	uint64_t ok, failed, crashes;
	double total_s, max_s;
	char error[128];
};

static volatile sig_atomic_t stop_restarts;
static void on_term(int sig) { stop_restarts = 1; }

static int restarter_main(struct restart_stats *st)
{
	struct conn c = { .fd = -1 };
	struct sigaction sa = { .sa_handler = on_term };

	uint64_t tick = 0;

	sigaction(SIGTERM, &sa, NULL);
	if (conn_open(&c, opt.socket) < 0)
		return 1;
	double next = now() + opt.restart_interval;
	while (!stop_restarts) {
		while (!stop_restarts && now() < next)
			usleep(10000);
		if (stop_restarts)
			break;
		double t0 = now();
		struct rp_call reply;
		char text[160];
		bool crash = opt.crash_every > 0 && ++tick % opt.crash_every == 0;
		if (crash)
			snprintf(text, sizeof(text),
				 "{\"method\":\"io.regen.Device.InjectFault\",\"parameters\":{\"device\":%d,\"kind\":\"crash\"}}",
				 (int)(st->crashes++ % (uint64_t)opt.devices));
		else
			snprintf(text, sizeof(text), "{\"method\":\"io.regen.Device.Restart\",\"parameters\":{\"reason\":\"load benchmark\"}}");
		int r = conn_send(&c, text, NULL, 0);
		if (r == 0)
			r = conn_recv(&c, &reply, 60);
		double dt = now() - t0;
		if (crash) {
			/* A crash while a Restart of that device is still settling is
			 * refused with Draining: fine, try again at the next tick. */
		} else if (r == 0 && !reply.error) {
			st->ok++;
			st->total_s += dt;
			if (dt > st->max_s)
				st->max_s = dt;
		} else {
			st->failed++;
			if (!st->error[0])
				snprintf(st->error, sizeof(st->error), "%s", r < 0 ? strerror(-r) : reply.error);
		}
		if (r == 0)
			rp_call_finish(&reply);
		next += opt.restart_interval;
		if (next < now())
			next = now();
	}
	conn_close(&c);
	return 0;
}

/* ---- Main ---- */

static int cmp_float(const void *a, const void *b)
{
	float x = *(const float *)a, y = *(const float *)b;

	return x < y ? -1 : x > y;
}

static void usage(void)
{
	fprintf(stderr, "usage: regen-load --socket PATH [--clients N] [--calls N] [--restart-interval S] [--devices N] [--crash-every K]\n");
	exit(2);
}

int main(int argc, char **argv)
{
	static const struct option longopts[] = {
		{ "socket", required_argument, NULL, 's' },
		{ "clients", required_argument, NULL, 'c' },
		{ "calls", required_argument, NULL, 'n' },
		{ "restart-interval", required_argument, NULL, 'r' },
		{ "devices", required_argument, NULL, 'd' },
		{ "crash-every", required_argument, NULL, 'k' },
		{ NULL, 0, NULL, 0 },
	};
	int ch;

	while ((ch = getopt_long(argc, argv, "", longopts, NULL)) != -1) {
		switch (ch) {
		case 's': opt.socket = optarg; break;
		case 'c': opt.clients = atoi(optarg); break;
		case 'n': opt.calls = atoi(optarg); break;
		case 'r': opt.restart_interval = atof(optarg); break;
		case 'd': opt.devices = atoi(optarg); break;
		case 'k': opt.crash_every = atoi(optarg); break;
		default: usage();
		}
	}
	if (!opt.socket || opt.clients < 1 || opt.calls < 1 || opt.devices < 1)
		usage();
	signal(SIGPIPE, SIG_IGN);

	size_t res_size = sizeof(struct client_result) * (size_t)opt.clients + sizeof(struct restart_stats);
	size_t rec_size = sizeof(struct call_rec) * (size_t)opt.clients * (size_t)opt.calls;
	struct client_result *res = mmap(NULL, res_size, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
	struct call_rec *recs = mmap(NULL, rec_size, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
	if (res == MAP_FAILED || recs == MAP_FAILED) {
		perror("mmap");
		return 1;
	}
	struct restart_stats *rst = (struct restart_stats *)(res + opt.clients);
	pid_t *pids = calloc((size_t)opt.clients, sizeof(pid_t));

	double t0 = now();
	pid_t restarter = -1;
	if (opt.restart_interval > 0) {
		restarter = fork();
		if (restarter == 0)
			_exit(restarter_main(rst));
	}
	for (int i = 0; i < opt.clients; i++) {
		pids[i] = fork();
		if (pids[i] == 0) {
			struct client cl = { .index = i, .device = i % opt.devices, .res = &res[i],
					     .recs = recs + (size_t)i * (size_t)opt.calls };
			snprintf(cl.worker_socket, sizeof(cl.worker_socket), "%s.dev%d", opt.socket, cl.device);
			_exit(client_main(&cl));
		}
	}
	int failed_clients = 0;
	for (int i = 0; i < opt.clients; i++) {
		int st;
		waitpid(pids[i], &st, 0);
		failed_clients += !(WIFEXITED(st) && WEXITSTATUS(st) == 0 && res[i].done);
	}
	double wall = now() - t0;
	if (restarter > 0) {
		kill(restarter, SIGTERM);
		waitpid(restarter, NULL, 0);
	}

	/* ---- The table ---- */
	uint64_t total[K_COUNT][O_COUNT] = { { 0 } }, dup = 0, timeouts = 0, reconnects = 0, reimports = 0;
	const char *other = NULL;
	for (int i = 0; i < opt.clients; i++) {
		for (int k = 0; k < K_COUNT; k++)
			for (int o = 0; o < O_COUNT; o++)
				total[k][o] += res[i].counts[k][o];
		dup += res[i].duplicates;
		timeouts += res[i].timeouts;
		reconnects += res[i].reconnects;
		reimports += res[i].reimports;
		if (!other && res[i].other[0])
			other = res[i].other;
	}
	float *lat = malloc(sizeof(float) * (size_t)opt.clients * (size_t)opt.calls);
	uint64_t answered_all = 0, calls_all = 0;
	printf("regen-load: %d clients x %d calls, %d device(s), Restart every %.1f s; %.1f s wall\n", opt.clients, opt.calls,
	       opt.devices, opt.restart_interval, wall);
	printf("%-13s %8s %8s %8s %8s %8s %6s %6s %10s %10s %9s\n", "kind", "calls", "ok", "Draining", "Stale", "DevLost",
	       "reset", "other", "p50 us", "p99 us", "calls/s");
	for (int k = 0; k < K_COUNT; k++) {
		size_t n = 0;
		uint64_t calls = 0;
		for (int o = 0; o < O_COUNT; o++)
			calls += total[k][o];
		/* Latency of the calls that got a reply (a reset has none). */
		for (size_t j = 0; j < (size_t)opt.clients * (size_t)opt.calls; j++)
			if (recs[j].kind == k && recs[j].outcome != O_RESET && recs[j].latency_us > 0)
				lat[n++] = recs[j].latency_us;
		qsort(lat, n, sizeof(float), cmp_float);
		double p50 = n ? lat[n / 2] : 0, p99 = n ? lat[(size_t)((double)n * 0.99)] : 0;
		printf("%-13s %8llu %8llu %8llu %8llu %8llu %6llu %6llu %10.0f %10.0f %9.0f\n", kind_names[k],
		       (unsigned long long)calls, (unsigned long long)total[k][O_OK], (unsigned long long)total[k][O_DRAINING],
		       (unsigned long long)total[k][O_STALE], (unsigned long long)total[k][O_LOST],
		       (unsigned long long)total[k][O_RESET], (unsigned long long)total[k][O_OTHER], p50, p99,
		       (double)calls / wall);
		calls_all += calls;
		answered_all += calls - total[k][O_RESET];
	}
	printf("all: %llu calls, %llu answered (each exactly once), %llu lost to a connection reset; %.0f calls/s\n",
	       (unsigned long long)calls_all, (unsigned long long)answered_all,
	       (unsigned long long)(calls_all - answered_all), (double)calls_all / wall);
	printf("duplicates %llu, timeouts %llu, reconnects %llu, re-imports after a generation change %llu\n",
	       (unsigned long long)dup, (unsigned long long)timeouts, (unsigned long long)reconnects,
	       (unsigned long long)reimports);
	if (opt.restart_interval > 0)
		printf("restarts: %llu ok (mean %.0f ms, max %.0f ms), %llu failed%s%s; %llu crash(es) injected\n",
		       (unsigned long long)rst->ok, rst->ok ? rst->total_s * 1000 / (double)rst->ok : 0, rst->max_s * 1000,
		       (unsigned long long)rst->failed, rst->error[0] ? ": " : "", rst->error, (unsigned long long)rst->crashes);

	uint64_t others = 0;
	for (int k = 0; k < K_COUNT; k++)
		others += total[k][O_OTHER];
	bool ok = failed_clients == 0 && dup == 0 && timeouts == 0 && others == 0 && calls_all == (uint64_t)opt.clients * (uint64_t)opt.calls;
	if (!ok)
		printf("FAILED: %d client(s) failed, %llu unexpected error(s)%s%s\n", failed_clients, (unsigned long long)others,
		       other ? ", first: " : "", other ? other : "");
	else
		printf("PASS: every call got exactly one reply or a connection reset; every failure a named one\n");
	return ok ? 0 : 1;
}
