/* Restart during traffic. Six client processes loop on checked GEMMs on
 * both devices while `regenctl restart --all --wait` (and then a restart of
 * one device with a short drain deadline) runs in another process. Every
 * call either succeeds with the right answer or fails with
 * io.regen.Draining, io.regen.StaleGeneration, io.regen.DeviceLost or
 * -ECONNRESET; none hangs (each call has a timeout); a Watch subscriber sees
 * the new generation of every device with the restart's reason; after the
 * restart the clients re-import and succeed. */
#include <errno.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>
#include <cjson/cJSON.h>
#include "itest.h"

#define NTRAFFIC 6

static struct it_daemon daemon_;

struct shared {
	atomic_int stop;
	atomic_int traffic_started;
	uint64_t gen_before[2];
	char token[64];
};
static struct shared *sh;

struct traffic_stats {
	long ok, ok_after, draining, stale, lost, reset;
};

static int traffic_main(void *arg)
{
	int idx = (int)(long)arg, device = idx % 2, r;
	regen_client *c = it_connect(&daemon_);
	struct traffic_stats s = { 0 };
	struct it_gemm_case gc;
	struct it_mem m;
	double deadline = it_now() + 120;
	char why[512], desc[256];
	bool have_buf = false, counted = false;
	const char *name;

	regen_client_set_timeout(c, 20);
	it_mem_alloc(1 << 17, &m);
	while (it_now() < deadline) {
		if (atomic_load(&sh->stop) && s.ok_after >= 3) {
			break;
		}
		if (!have_buf) {
			r = it_mem_import(c, device, &m);
			if (r == 0) {
				have_buf = true;
			}
		} else {
			it_gemm_random_case(&gc, 32);
			r = it_gemm_run(c, &m, 0, &gc, why, sizeof(why));
			if (r == 1) {
				it_gemm_describe(&gc, desc, sizeof(desc));
				it_log("FAIL traffic %d: wrong result for %s: %s", idx, desc, why);
				return 1;
			}
			if (r == 0) {
				s.ok++;
				if (regen_buffer_generation(m.buf) > sh->gen_before[device]) {
					s.ok_after++;
				}
				if (!counted && s.ok >= 3) {
					counted = true;
					atomic_fetch_add(&sh->traffic_started, 1);
				}
			}
		}
		if (r == 0) {
			continue;
		}
		have_buf = false;
		name = regen_client_error_name(c);
		if (r == -ECONNRESET) {
			s.reset++;
		} else if (r == -EREMOTE && strcmp(name, REGEN_ERROR_DRAINING) == 0) {
			s.draining++;
		} else if (r == -EREMOTE && strcmp(name, REGEN_ERROR_STALE_GENERATION) == 0) {
			s.stale++;
		} else if (r == -EREMOTE && strcmp(name, REGEN_ERROR_DEVICE_LOST) == 0) {
			s.lost++;
		} else {
			it_log("FAIL traffic %d: call failed with %d (%s) %s: %s", idx, r, strerror(-r), name ? name : "",
			       regen_client_error_message(c) ? regen_client_error_message(c) : "");
			return 1;
		}
		usleep(5000);
	}
	it_log("traffic %d (device %d): ok %ld (after restart %ld), Draining %ld, StaleGeneration %ld, DeviceLost %ld, "
	       "ECONNRESET %ld", idx, device, s.ok, s.ok_after, s.draining, s.stale, s.lost, s.reset);
	it_mem_free(&m);
	regen_client_destroy(c);
	CHECK(s.ok_after >= 3, "traffic %d: only %ld successes after the restart", idx, s.ok_after);
	return 0;
}

struct watch_state {
	int ready_fd;
	int subscribed;
	bool seen[2];
	bool signalled;
};

static int on_event(const struct regen_watch_event *ev, void *userdata)
{
	struct watch_state *ws = userdata;

	it_log("watch: epoch %llu device %d generation %llu state %s reason '%s'", (unsigned long long)ev->epoch,
	       ev->device, (unsigned long long)ev->generation, ev->state, ev->reason);
	if (strcmp(ev->reason, "subscribed") == 0) {
		ws->subscribed++;
	}
	if (!ws->signalled && ws->subscribed >= 2) {
		ws->signalled = true;
		CHECK(write(ws->ready_fd, "S", 1) == 1, "pipe");
	}
	if (ev->device >= 0 && ev->device < 2 && ev->generation > sh->gen_before[ev->device] &&
	    strstr(ev->reason, sh->token) != NULL) {
		ws->seen[ev->device] = true;
	}
	return ws->seen[0] && ws->seen[1];
}

static int watcher_main(void *arg)
{
	struct watch_state ws = { .ready_fd = (int)(long)arg };
	regen_client *c = it_connect(&daemon_);
	int r;

	r = regen_watch_full(c, 60, 90, on_event, &ws);
	CHECK(r == 0, "watch ended with %d (%s) %s before seeing both devices restart (seen %d %d)", r, strerror(-r),
	      regen_client_error_message(c) ? regen_client_error_message(c) : "", ws.seen[0], ws.seen[1]);
	regen_client_destroy(c);
	return 0;
}

int main(void)
{
	pid_t traffic[NTRAFFIC], watcher;
	const struct regen_device_info *d;
	regen_status *st;
	regen_client *c;
	char *out = NULL, *err = NULL, reason[128], cmd_timeout[] = "60";
	int pipefd[2], i, rc, failed;
	char ch;
	double t0;

	it_daemon_start(&daemon_, NULL, 290);
	sh = mmap(NULL, sizeof(*sh), PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
	CHECK(sh != MAP_FAILED, "mmap");
	memset(sh, 0, sizeof(*sh));
	snprintf(sh->token, sizeof(sh->token), "it-restart-%d", (int)getpid());
	c = it_connect(&daemon_);
	st = it_status(c);
	sh->gen_before[0] = it_device(st, 0)->generation;
	sh->gen_before[1] = it_device(st, 1)->generation;
	regen_status_free(st);

	CHECK(pipe(pipefd) == 0, "pipe");
	watcher = it_fork(watcher_main, (void *)(long)pipefd[1], 120);
	CHECK(read(pipefd[0], &ch, 1) == 1, "watcher never subscribed");
	for (i = 0; i < NTRAFFIC; i++) {
		traffic[i] = it_fork(traffic_main, (void *)(long)i, 150);
	}
	t0 = it_now();
	while (atomic_load(&sh->traffic_started) < NTRAFFIC && it_now() - t0 < 30) {
		usleep(10000);
	}
	CHECK(atomic_load(&sh->traffic_started) == NTRAFFIC, "traffic did not start");

	snprintf(reason, sizeof(reason), "%s", sh->token);
	{
		char *argv[] = { daemon_.regenctl, "--socket", daemon_.sock, "restart", "--all", "--reason", reason,
				 "--wait", "--timeout", cmd_timeout, NULL };

		t0 = it_now();
		rc = it_run(argv, &out, &err, 90, -1, -1);
		it_log("regenctl restart --all --wait: exit %d after %.2f s\nstdout:\n%sstderr:\n%s", rc, it_now() - t0, out,
		       err);
		CHECK(rc == 0, "regenctl restart --wait exited %d", rc);
		CHECK(strstr(out, "device 0: ready in generation") && strstr(out, "device 1: ready in generation") &&
		      strstr(out, "elapsed"), "regenctl --wait output lacks the new generations");
		free(out);
		free(err);
	}
	st = it_status(c);
	CHECK(it_device(st, 0)->generation > sh->gen_before[0] && it_device(st, 1)->generation > sh->gen_before[1],
	      "generations %llu %llu after restart", (unsigned long long)it_device(st, 0)->generation,
	      (unsigned long long)it_device(st, 1)->generation);
	regen_status_free(st);

	/* A second restart, of device 0 alone, with a short drain deadline
	 * and JSON output. */
	usleep(300000);
	{
		char *argv[] = { daemon_.regenctl, "--socket", daemon_.sock, "--json", "restart", "--device", "0",
				 "--deadline-ms", "200", "--reason", "second", "--wait", "--timeout", cmd_timeout, NULL };
		cJSON *j1, *j2;
		char *nl;

		rc = it_run(argv, &out, &err, 90, -1, -1);
		it_log("regenctl --json restart --device 0 --deadline-ms 200 --wait: exit %d\n%s%s", rc, out, err);
		CHECK(rc == 0, "second restart exited %d", rc);
		nl = strchr(out, '\n');
		CHECK(nl != NULL, "no JSON lines");
		*nl = '\0';
		j1 = cJSON_Parse(out);
		j2 = cJSON_Parse(nl + 1);
		CHECK(j1 != NULL && cJSON_GetObjectItem(j1, "devices") != NULL &&
		      cJSON_GetObjectItem(j1, "elapsed_us") != NULL, "Restart reply JSON: %s", out);
		CHECK(j2 != NULL && cJSON_IsTrue(cJSON_GetObjectItem(j2, "ready")) &&
		      cJSON_GetArraySize(cJSON_GetObjectItem(j2, "devices")) == 1, "--wait JSON: %s", nl + 1);
		cJSON_Delete(j1);
		cJSON_Delete(j2);
		free(out);
		free(err);
	}

	usleep(300000);
	atomic_store(&sh->stop, 1);
	failed = it_wait_children(traffic, NTRAFFIC, 100);
	failed += it_wait_children(&watcher, 1, 60);
	CHECK(it_daemon_alive(&daemon_), "regend died");
	st = it_status(c);
	for (i = 0; i < regen_status_device_count(st); i++) {
		d = regen_status_device(st, i);
		CHECK(strcmp(d->state, "ready") == 0, "device %d %s", d->index, d->state);
	}
	regen_status_free(st);
	regen_client_destroy(c);
	if (failed) {
		it_daemon_dump_log(&daemon_);
	}
	CHECK(failed == 0, "%d processes failed", failed);
	it_log("PASS");
	return 0;
}
