/* SPDX-License-Identifier: Apache-2.0 */
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
#include "tests/lib/client.h"

#define NTRAFFIC 6

static struct tl_daemon daemon_;

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
	regen_client *c = tl_client_connect(&daemon_);
	struct traffic_stats s = { 0 };
	struct tl_gemm_case gc;
	struct tl_buffer m;
	double deadline = tl_now() + 120;
	char why[512], desc[256];
	bool have_buf = false, counted = false;
	const char *name;

	regen_client_set_timeout(c, 20);
	tl_buffer_alloc(1 << 17, &m);
	while (tl_now() < deadline) {
		if (atomic_load(&sh->stop) && s.ok_after >= 3) {
			break;
		}
		if (!have_buf) {
			r = tl_buffer_import(c, device, &m);
			if (r == 0) {
				have_buf = true;
			}
		} else {
			tl_gemm_random_case(&gc, 32);
			r = tl_gemm_run(c, &m, 0, &gc, why, sizeof(why));
			if (r == 1) {
				tl_gemm_describe(&gc, desc, sizeof(desc));
				tl_log("FAIL traffic %d: wrong result for %s: %s", idx, desc, why);
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
			tl_log("FAIL traffic %d: call failed with %d (%s) %s: %s", idx, r, strerror(-r), name ? name : "",
			       regen_client_error_message(c) ? regen_client_error_message(c) : "");
			return 1;
		}
		usleep(5000);
	}
	tl_log("traffic %d (device %d): ok %ld (after restart %ld), Draining %ld, StaleGeneration %ld, DeviceLost %ld, "
	       "ECONNRESET %ld", idx, device, s.ok, s.ok_after, s.draining, s.stale, s.lost, s.reset);
	tl_buffer_free(&m);
	regen_client_destroy(c);
	ASSERT_GE(s.ok_after, 3, "traffic %d: only %ld successes after the restart", idx, s.ok_after);
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

	tl_log("watch: epoch %llu device %d generation %llu state %s reason '%s'", (unsigned long long)ev->epoch,
	       ev->device, (unsigned long long)ev->generation, ev->state, ev->reason);
	if (strcmp(ev->reason, "subscribed") == 0) {
		ws->subscribed++;
	}
	if (!ws->signalled && ws->subscribed >= 2) {
		ws->signalled = true;
		ASSERT(write(ws->ready_fd, "S", 1) == 1, "pipe");
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
	regen_client *c = tl_client_connect(&daemon_);
	int r;

	r = regen_watch_full(c, 60, 90, on_event, &ws);
	ASSERT_EQ(r, 0, "watch ended with %d (%s) %s before seeing both devices restart (seen %d %d)", r, strerror(-r),
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

	tl_init(290);
	tl_daemon_start(&daemon_, NULL);
	sh = mmap(NULL, sizeof(*sh), PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
	ASSERT(sh != MAP_FAILED, "mmap");
	memset(sh, 0, sizeof(*sh));
	snprintf(sh->token, sizeof(sh->token), "it-restart-%d", (int)getpid());
	c = tl_client_connect(&daemon_);
	st = tl_status(c);
	sh->gen_before[0] = tl_status_device(st, 0)->generation;
	sh->gen_before[1] = tl_status_device(st, 1)->generation;
	regen_status_free(st);

	ASSERT(pipe(pipefd) == 0, "pipe");
	watcher = tl_fork(watcher_main, (void *)(long)pipefd[1], 120);
	ASSERT(read(pipefd[0], &ch, 1) == 1, "watcher never subscribed");
	for (i = 0; i < NTRAFFIC; i++) {
		traffic[i] = tl_fork(traffic_main, (void *)(long)i, 150);
	}
	t0 = tl_now();
	while (atomic_load(&sh->traffic_started) < NTRAFFIC && tl_now() - t0 < 30) {
		usleep(10000);
	}
	ASSERT_EQ(atomic_load(&sh->traffic_started), NTRAFFIC, "traffic did not start");

	snprintf(reason, sizeof(reason), "%s", sh->token);
	{
		char *argv[] = { daemon_.regenctl, "--socket", daemon_.sock, "restart", "--all", "--reason", reason,
				 "--wait", "--timeout", cmd_timeout, NULL };

		t0 = tl_now();
		rc = tl_run(argv, &out, &err, 90, -1, -1);
		tl_log("regenctl restart --all --wait: exit %d after %.2f s\nstdout:\n%sstderr:\n%s", rc, tl_now() - t0, out,
		       err);
		ASSERT_EQ(rc, 0, "regenctl restart --wait exited %d", rc);
		ASSERT(strstr(out, "device 0: ready in generation") && strstr(out, "device 1: ready in generation") &&
		       strstr(out, "elapsed"), "regenctl --wait output lacks the new generations");
		free(out);
		free(err);
	}
	st = tl_status(c);
	ASSERT_UINT_GT(tl_status_device(st, 0)->generation, sh->gen_before[0], "device 0 after the restart");
	ASSERT_UINT_GT(tl_status_device(st, 1)->generation, sh->gen_before[1], "device 1 after the restart");
	regen_status_free(st);

	/* A second restart, of device 0 alone, with a short drain deadline
	 * and JSON output. */
	usleep(300000);
	{
		char *argv[] = { daemon_.regenctl, "--socket", daemon_.sock, "--json", "restart", "--device", "0",
				 "--deadline-ms", "200", "--reason", "second", "--wait", "--timeout", cmd_timeout, NULL };
		cJSON *j1, *j2;
		char *nl;

		rc = tl_run(argv, &out, &err, 90, -1, -1);
		tl_log("regenctl --json restart --device 0 --deadline-ms 200 --wait: exit %d\n%s%s", rc, out, err);
		ASSERT_EQ(rc, 0, "second restart exited %d", rc);
		nl = strchr(out, '\n');
		ASSERT_NOT_NULL(nl, "no JSON lines");
		*nl = '\0';
		j1 = cJSON_Parse(out);
		j2 = cJSON_Parse(nl + 1);
		ASSERT(j1 != NULL && cJSON_GetObjectItem(j1, "devices") != NULL &&
		       cJSON_GetObjectItem(j1, "elapsed_us") != NULL, "Restart reply JSON: %s", out);
		ASSERT(j2 != NULL && cJSON_IsTrue(cJSON_GetObjectItem(j2, "ready")) &&
		       cJSON_GetArraySize(cJSON_GetObjectItem(j2, "devices")) == 1, "--wait JSON: %s", nl + 1);
		cJSON_Delete(j1);
		cJSON_Delete(j2);
		free(out);
		free(err);
	}

	usleep(300000);
	atomic_store(&sh->stop, 1);
	failed = tl_wait_children(traffic, NTRAFFIC, 100);
	failed += tl_wait_children(&watcher, 1, 60);
	ASSERT(tl_daemon_alive(&daemon_), "regend died");
	st = tl_status(c);
	for (i = 0; i < regen_status_device_count(st); i++) {
		d = regen_status_device(st, i);
		ASSERT_STR_EQ(d->state, "ready", "device %d %s", d->index, d->state);
	}
	regen_status_free(st);
	regen_client_destroy(c);
	if (failed) {
		tl_daemon_dump_log(&daemon_, 60);
	}
	ASSERT_EQ(failed, 0, "%d processes failed", failed);
	tl_log("PASS");
	return 0;
}
