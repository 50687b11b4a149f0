/* SPDX-License-Identifier: Apache-2.0 */
/* regenctl against a real regend: the status table and JSON, generation,
 * lifecycle verbs with --wait, watch, and the documented exit codes:
 * 0 ok, 1 error, 2 usage, 3 timeout, 4 not permitted, 5 unreachable. */
#include <errno.h>
#include <pwd.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>
#include <cjson/cJSON.h>
#include "tests/lib/client.h"
#include "tests/lib/proc.h"

static struct tl_daemon daemon_;
static char ctl[512];        /* a copy of regenctl any user can run */

#define MAXARGS 24

/* Runs regenctl --socket <sock> ARGS...; returns the exit status. */
static int ctl_run_as(int uid, int gid, char **out, char **err, const char *first, ...)
{
	char *argv[MAXARGS];
	const char *a;
	va_list ap;
	int n = 0, rc;
	char *o = NULL, *e = NULL;

	argv[n++] = ctl;
	if (first == NULL || strcmp(first, "--socket") != 0) {
		argv[n++] = "--socket";
		argv[n++] = daemon_.sock;
	}
	va_start(ap, first);
	for (a = first; a != NULL && n < MAXARGS - 1; a = va_arg(ap, const char *)) {
		argv[n++] = (char *)a;
	}
	va_end(ap);
	argv[n] = NULL;
	rc = tl_run(argv, &o, &e, 60, uid, gid);
	if (out) {
		*out = o;
	} else {
		free(o);
	}
	if (err) {
		*err = e;
	} else {
		free(e);
	}
	return rc;
}
#define ctl_run(out, err, ...) ctl_run_as(-1, -1, out, err, __VA_ARGS__, NULL)

static void expect_exit(int want, const char *what, int rc, const char *out, const char *err)
{
	ASSERT_EQ(rc, want, "%s: exit %d, want %d\nstdout: %s\nstderr: %s", what, rc, want, out ? out : "", err ? err : "");
	tl_log("ok  %s: exit %d", what, rc);
}

static void check_table(const regen_status *st)
{
	static const char *const cols[] = { "DEVICE", "GEN", "STATE", "BACKEND", "PID", "RESPAWNS", "MEM_USED",
					    "MEM_BASE", "WORKER_SOCKET" };
	char *out = NULL, *err = NULL, *line, *save = NULL, *lines[8];
	int rc, nlines = 0, i, j, pos[9];

	rc = ctl_run(&out, &err, "status");
	expect_exit(0, "status", rc, out, err);
	tl_log("status table:\n%s", out);
	for (line = strtok_r(out, "\n", &save); line && nlines < 8; line = strtok_r(NULL, "\n", &save)) {
		lines[nlines++] = line;
	}
	ASSERT_EQ(nlines, 1 + regen_status_device_count(st), "%d lines for %d devices", nlines,
	          regen_status_device_count(st));
	/* Header: the columns in order; their start offsets. */
	for (j = 0; j < 9; j++) {
		char *p = strstr(lines[0], cols[j]);

		ASSERT_NOT_NULL(p, "header lacks %s: %s", cols[j], lines[0]);
		pos[j] = (int)(p - lines[0]);
		ASSERT(j == 0 || pos[j] > pos[j - 1], "header column %s out of order", cols[j]);
	}
	for (i = 1; i < nlines; i++) {
		const struct regen_device_info *d = regen_status_device(st, i - 1);
		char want[9][128];

		snprintf(want[0], 128, "%d", d->index);
		snprintf(want[1], 128, "%llu", (unsigned long long)d->generation);
		snprintf(want[2], 128, "%s", d->state);
		snprintf(want[3], 128, "%s", d->backend);
		snprintf(want[4], 128, "%lld", (long long)d->worker_pid);
		snprintf(want[5], 128, "%llu", (unsigned long long)d->respawns);
		want[6][0] = want[7][0] = '\0';   /* memory moves; not compared */
		snprintf(want[8], 128, "%s", d->worker_socket);
		for (j = 0; j < 9; j++) {
			/* Aligned: every value starts under its header. */
			ASSERT((int)strlen(lines[i]) > pos[j] && lines[i][pos[j]] != ' ' &&
			       (pos[j] == 0 || lines[i][pos[j] - 1] == ' '), "row %d column %s not aligned:\n%s\n%s", i,
			       cols[j], lines[0], lines[i]);
			if (want[j][0] != '\0') {
				ASSERT(strncmp(lines[i] + pos[j], want[j], strlen(want[j])) == 0, "row %d column %s: want %s in\n%s", i,
				       cols[j], want[j], lines[i]);
			}
		}
	}
	free(out);
	free(err);
}

static void check_json_status(const regen_status *st)
{
	char *out = NULL, *err = NULL;
	const cJSON *devs, *d;
	cJSON *j;
	int rc, i = 0;

	rc = ctl_run(&out, &err, "--json", "status");
	expect_exit(0, "--json status", rc, out, err);
	j = cJSON_Parse(out);
	ASSERT_NOT_NULL(j, "status --json is not JSON: %s", out);
	ASSERT(cJSON_IsNumber(cJSON_GetObjectItem(j, "epoch")), "no epoch: %s", out);
	devs = cJSON_GetObjectItem(j, "devices");
	ASSERT_EQ(cJSON_GetArraySize(devs), regen_status_device_count(st), "devices: %s", out);
	cJSON_ArrayForEach(d, devs) {
		ASSERT(cJSON_GetObjectItem(d, "index")->valuedouble == regen_status_device(st, i)->index, "index");
		ASSERT_STR_EQ(cJSON_GetObjectItem(d, "worker_socket")->valuestring,
			      regen_status_device(st, i)->worker_socket, "worker_socket");
		ASSERT_STR_EQ(cJSON_GetObjectItem(d, "state")->valuestring, "ready", "state");
		i++;
	}
	cJSON_Delete(j);
	free(out);
	free(err);
}

static int watch_main(void *arg)
{
	char *out = NULL, *err = NULL, *line, *save = NULL;
	int rc, n = 0, changes = 0;

	rc = ctl_run(&out, &err, "--json", "watch", "--count", "1", "--timeout", "30");
	ASSERT_EQ(rc, 0, "watch --count 1: exit %d\n%s%s", rc, out, err);
	for (line = strtok_r(out, "\n", &save); line; line = strtok_r(NULL, "\n", &save)) {
		cJSON *j = cJSON_Parse(line);
		const cJSON *reason;

		ASSERT_NOT_NULL(j, "watch --json line is not JSON: %s", line);
		reason = cJSON_GetObjectItem(j, "reason");
		ASSERT(cJSON_IsString(reason) && cJSON_IsNumber(cJSON_GetObjectItem(j, "generation")) &&
		       cJSON_IsNumber(cJSON_GetObjectItem(j, "device")), "watch line: %s", line);
		if (strcmp(reason->valuestring, "subscribed") != 0) {
			ASSERT_NOT_NULL(strstr(reason->valuestring, "ctl-test"), "change without the reason: %s", line);
			changes++;
		}
		n++;
		cJSON_Delete(j);
	}
	ASSERT(n == 3 && changes == 1, "watch printed %d lines, %d changes:\n%s", n, changes, out);
	free(out);
	free(err);
	return 0;
}

static int hung_main(void *arg)
{
	regen_client *c = tl_client_connect(&daemon_);
	struct tl_buffer m;
	struct tl_gemm_case gc;
	char why[256];

	regen_client_set_timeout(c, 60);
	tl_buffer_create(c, 0, 1 << 16, &m);
	tl_gemm_random_case(&gc, 8);
	(void)tl_gemm_run(c, &m, 0, &gc, why, sizeof(why));
	return 0;
}

static void install_ctl(void)
{
	char cmd[2048], libdir[600];

	/* A copy beside libregen in the daemon's temp dir (0755), so that a
	 * user who cannot reach the build tree can run it. */
	snprintf(libdir, sizeof(libdir), "%s", daemon_.regenctl);
	*strrchr(libdir, '/') = '\0';
	snprintf(ctl, sizeof(ctl), "%s/bin/regenctl", daemon_.dir);
	snprintf(cmd, sizeof(cmd),
		 "mkdir -p '%s/bin' && cp '%s' '%s/bin/' && "
		 "find '%s' -maxdepth 1 -name 'libregen.so*' ! -type d -exec cp -P {} '%s/bin/' ';' && "
		 "chmod -R a+rX '%s/bin'",
		 daemon_.dir, daemon_.regenctl, daemon_.dir, libdir, daemon_.dir, daemon_.dir);
	ASSERT_EQ(system(cmd), 0, "%s", cmd);
}

int main(void)
{
	struct tl_daemon_opts opts = { 0 };
	regen_status *st, *st2;
	uint64_t gen0, gen1;
	struct passwd *nobody = getpwnam("nobody");
	const char *group = NULL;
	char *out = NULL, *err = NULL, missing[300];
	regen_client *c;
	pid_t watcher, hung;
	gid_t group_gid;
	int rc;

	tl_init(230);
	if (geteuid() == 0 && nobody != NULL) {
		group = tl_group_without_nobody((gid_t)-1, &group_gid);
	}
	opts.admin_group = group;
	tl_daemon_start(&daemon_, &opts);
	install_ctl();
	c = tl_client_connect(&daemon_);
	st = tl_status(c);
	gen0 = tl_status_device(st, 0)->generation;
	gen1 = tl_status_device(st, 1)->generation;

	/* Reading. */
	check_table(st);
	check_json_status(st);
	rc = ctl_run(&out, &err, "generation");
	expect_exit(0, "generation", rc, out, err);
	ASSERT(strstr(out, "EPOCH") && strstr(out, "DEVICE"), "generation output: %s", out);
	free(out);
	free(err);
	rc = ctl_run(&out, &err, "--json", "generation");
	expect_exit(0, "--json generation", rc, out, err);
	{
		cJSON *j = cJSON_Parse(out);

		ASSERT(j && cJSON_GetArraySize(cJSON_GetObjectItem(j, "devices")) == regen_status_device_count(st),
		       "generation json: %s", out);
		cJSON_Delete(j);
	}
	free(out);
	free(err);
	rc = ctl_run(&out, &err, "--help");
	expect_exit(0, "--help", rc, out, err);
	ASSERT(strstr(out, "Exit status") && strstr(out, "not permitted") && strstr(out, "unreachable"),
	       "--help lacks the exit codes");
	free(out);
	free(err);

	/* Usage errors: 2, with nothing sent. */
	expect_exit(2, "no command", ctl_run(NULL, NULL, "--json"), NULL, NULL);
	expect_exit(2, "unknown command", ctl_run(NULL, NULL, "frobnicate"), NULL, NULL);
	expect_exit(2, "unknown option", ctl_run(NULL, NULL, "status", "--frob"), NULL, NULL);
	expect_exit(2, "missing option value", ctl_run(NULL, NULL, "release", "--device"), NULL, NULL);
	expect_exit(2, "bad device", ctl_run(NULL, NULL, "release", "--device", "x"), NULL, NULL);
	expect_exit(2, "--device with --all", ctl_run(NULL, NULL, "restart", "--device", "0", "--all"), NULL, NULL);
	expect_exit(2, "--deadline-ms on release", ctl_run(NULL, NULL, "release", "--deadline-ms", "5"), NULL, NULL);
	expect_exit(2, "--count on status", ctl_run(NULL, NULL, "status", "--count", "2"), NULL, NULL);
	expect_exit(2, "bad --timeout", ctl_run(NULL, NULL, "release", "--timeout", "0"), NULL, NULL);
	expect_exit(2, "inject-fault without kind", ctl_run(NULL, NULL, "inject-fault"), NULL, NULL);
	expect_exit(2, "inject-fault unknown kind", ctl_run(NULL, NULL, "inject-fault", "meteor"), NULL, NULL);
	expect_exit(2, "extra argument", ctl_run(NULL, NULL, "status", "now"), NULL, NULL);
	st2 = tl_status(c);
	ASSERT_UINT_EQ(regen_status_epoch(st2), regen_status_epoch(st), "a usage error changed the epoch");
	regen_status_free(st2);

	/* Unreachable: 5. */
	snprintf(missing, sizeof(missing), "%s/nope.sock", daemon_.dir);
	rc = ctl_run_as(-1, -1, &out, &err, "--socket", missing, "status", NULL);
	expect_exit(5, "no daemon at the socket", rc, out, err);
	free(out);
	free(err);

	/* A named error: 1, with the name on stderr. */
	rc = ctl_run(&out, &err, "release", "--device", "7");
	expect_exit(1, "release of a device not served", rc, out, err);
	ASSERT_NOT_NULL(strstr(err, REGEN_ERROR_NO_SUCH_DEVICE), "stderr: %s", err);
	free(out);
	free(err);

	/* Lifecycle with --wait, and watch seeing it. */
	watcher = tl_fork(watch_main, NULL, 60);
	usleep(1000000);
	rc = ctl_run(&out, &err, "release", "--device", "1", "--reason", "ctl-test", "--wait", "--timeout", "30");
	expect_exit(0, "release --device 1 --wait", rc, out, err);
	ASSERT(strstr(out, "device 1: ready in generation") && strstr(out, "elapsed"), "release --wait: %s", out);
	ASSERT_NULL(strstr(out, "device 0"), "release --device 1 reported device 0: %s", out);
	free(out);
	free(err);
	ASSERT_EQ(tl_wait_children(&watcher, 1, 40), 0, "watch failed");
	st2 = tl_status(c);
	ASSERT(tl_status_device(st2, 1)->generation > gen1 && tl_status_device(st2, 0)->generation == gen0,
	       "generations after release of device 1");
	gen1 = tl_status_device(st2, 1)->generation;
	regen_status_free(st2);

	rc = ctl_run(&out, &err, "--json", "release", "--all", "--wait");
	expect_exit(0, "--json release --all --wait", rc, out, err);
	{
		char *nl = strchr(out, '\n');
		cJSON *j;

		ASSERT_NOT_NULL(nl, "release --json: %s", out);
		j = cJSON_Parse(nl + 1);
		ASSERT(j && cJSON_GetArraySize(cJSON_GetObjectItem(j, "devices")) == 2, "--wait json: %s", nl + 1);
		cJSON_Delete(j);
	}
	free(out);
	free(err);

	rc = ctl_run(&out, &err, "watch", "--timeout", "1");
	expect_exit(0, "watch --timeout 1 (no count)", rc, out, err);
	ASSERT_NOT_NULL(strstr(out, "subscribed"), "watch printed: %s", out);
	free(out);
	free(err);
	rc = ctl_run(&out, &err, "watch", "--count", "1", "--timeout", "1");
	expect_exit(3, "watch --count 1 --timeout 1 with nothing happening", rc, out, err);
	free(out);
	free(err);

	rc = ctl_run(&out, &err, "inject-fault", "--device", "1", "crash");
	expect_exit(0, "inject-fault crash", rc, out, err);
	free(out);
	free(err);
	tl_wait_generation(c, 1, gen1 + 1, 30);

	/* Not permitted: 4, as `nobody` when regend has an admin group
	 * nobody is not in. */
	if (group != NULL) {
		chmod(daemon_.sock, 0666);
		rc = ctl_run_as((int)nobody->pw_uid, (int)nobody->pw_gid, &out, &err, "status", NULL);
		if (rc == 126 || rc == 127) {
			tl_log("SKIP not-permitted case: nobody cannot run %s: %s", ctl, err);
		} else {
			expect_exit(0, "status as nobody", rc, out, err);
			free(out);
			free(err);
			rc = ctl_run_as((int)nobody->pw_uid, (int)nobody->pw_gid, &out, &err, "restart", "--device", "0",
					"--wait", NULL);
			expect_exit(4, "restart as nobody", rc, out, err);
			ASSERT_NOT_NULL(strstr(err, REGEN_ERROR_NOT_PERMITTED), "stderr: %s", err);
			rc = ctl_run_as((int)nobody->pw_uid, (int)nobody->pw_gid, NULL, NULL, "inject-fault", "crash", NULL);
			expect_exit(4, "inject-fault as nobody", rc, NULL, NULL);
		}
		free(out);
		free(err);
	} else {
		tl_log("SKIP not-permitted case: needs root and a user 'nobody' (euid %d)", (int)geteuid());
	}

	/* Timeout: 3. A hung call keeps the restart draining past --timeout. */
	ASSERT_REGEN_OK(c, regen_inject_fault(c, 0, "hang"));
	hung = tl_fork(hung_main, NULL, 60);
	usleep(300000);
	rc = ctl_run(&out, &err, "restart", "--device", "0", "--deadline-ms", "20000", "--wait", "--timeout", "1");
	expect_exit(3, "restart --timeout 1 while a call hangs", rc, out, err);
	free(out);
	free(err);
	(void)hung;

	regen_status_free(st);
	regen_client_destroy(c);
	ASSERT(tl_daemon_alive(&daemon_), "regend died");
	tl_log("PASS");
	return 0;
}
