/* SPDX-License-Identifier: Apache-2.0 */
/* A job is bound to the uids entitled to it: another user can neither put
 * its work under someone's job nor push someone's job out of the table,
 * nor restart a job's devices.
 *
 * regend --socket-mode 0666, the host backend, device 0's worker:
 * - Stated jobs: root states "train-7" and imports a buffer; uid nobody
 *   states "train-7" too and imports one. Status lists two jobs
 *   "train-7" (source client), root's with uid 0 and 1 buffer, nobody's
 *   with uid 65534 and 1. (Before: one job of 2 buffers: nobody's work
 *   counted as root's.)
 * - A job from a cgroup nobody made: in a cgroup v1 hierarchy (pids), root
 *   delegates a directory to nobody (chown), nobody makes job_4242 in it
 *   and moves itself there; its connection's job (SetJob's reply) is its
 *   own stated one, not "slurm:4242"; a root process in a job_4242 that
 *   root made is "slurm:4242". (Before: nobody's connection was named
 *   slurm:4242 by the kernel's word, and its work counted in that job.)
 *   Skipped where no v1 hierarchy lets the test make cgroups.
 * - The jobs table: nobody states 70 jobs on 70 connections; root's job
 *   stated after them is listed as its own, and nobody has 8 entries, the
 *   rest "other". (Before: nobody's first 64 filled the table; root's
 *   counted as "other".)
 * - `regenctl restart --job` as nobody, its job's GPU in SLURM_JOB_GPUS:
 *   exit 4 (not permitted), device 0's generation unchanged: a job's GPUs
 *   are restarted by an admin (the scheduler's prolog), whoever names
 *   them. (This held before too.) */
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "tests/lib/asserts.h"
#include "tests/lib/daemon.h"
#include "tests/lib/memfd.h"
#include "tests/lib/proc.h"
#include "tests/lib/varlink.h"

#define NOBODY 65534
#define MANY 70

static struct tl_daemon daemon_;
/* The test's cgroups: <root>/regen-test-PID/{slurm/job_4242, nobody/}. */
static char cg_top[128], cg_job[192], cg_delegated[192];

/* Status's jobs of device 0 (a copy, to cJSON_Delete). */
static cJSON *jobs_of_device_0(void)
{
	struct tl_conn c;
	struct tl_reply r;
	cJSON *devices, *jobs;

	ASSERT_OK(tl_conn_open(&c, daemon_.sock), "connect");
	tl_call_ok(&c, &r, "io.regen.Device.Status", NULL);
	devices = cJSON_GetObjectItem(r.params, "devices");
	jobs = cJSON_Duplicate(cJSON_GetObjectItem(cJSON_GetArrayItem(devices, 0), "jobs"), true);
	tl_reply_finish(&r);
	tl_conn_close(&c);
	ASSERT(cJSON_IsArray(jobs), "Status has no jobs for device 0");
	return jobs;
}

static const cJSON *job_entry(const cJSON *jobs, const char *job, const char *source, long uid)
{
	const cJSON *j;

	cJSON_ArrayForEach(j, jobs) {
		const cJSON *u = cJSON_GetObjectItem(j, "uid");

		if (strcmp(cJSON_GetStringValue(cJSON_GetObjectItem(j, "job")), job) == 0 &&
		    strcmp(cJSON_GetStringValue(cJSON_GetObjectItem(j, "source")), source) == 0 &&
		    (uid < 0 ? !u : (cJSON_IsNumber(u) && (long)u->valuedouble == uid)))
			return j;
	}
	return NULL;
}

static long count_of(const cJSON *entry, const char *key)
{
	const cJSON *v = entry ? cJSON_GetObjectItem(entry, key) : NULL;

	return cJSON_IsNumber(v) ? (long)v->valuedouble : -1;
}

/* SetJob on c: the job that names the connection now, and its source. */
static void set_job(struct tl_conn *c, const char *job, char *named, size_t size, char *source, size_t ssize)
{
	struct tl_reply r;

	tl_call_ok(c, &r, "io.regen.SetJob", "{\"job\":\"%s\"}", job);
	snprintf(named, size, "%s", tl_reply_str(&r, "job"));
	snprintf(source, ssize, "%s", tl_reply_str(&r, "source"));
	tl_reply_finish(&r);
}

/* ---- A stated job is its uid's ---- */

static int pipe_go[2], pipe_done[2];

static int nobody_states_train_7(void *arg)
{
	struct tl_conn c;
	struct tl_reply r;
	char id[64], named[80], source[16];
	char go;

	tl_become_nobody(0, false);
	ASSERT_OK(tl_conn_open(&c, tl_daemon_worker_socket(&daemon_, 0)), "connect");
	set_job(&c, "train-7", named, sizeof(named), source, sizeof(source));
	ASSERT_EQ(tl_import_memfd(&c, 0, tl_memfd_open(4096), 4096, id, &r), 0, "import: %s", tl_reply_describe(&r));
	tl_reply_finish(&r);
	ASSERT_EQ(write(pipe_done[1], "x", 1), 1, "done");
	ASSERT_EQ(read(pipe_go[0], &go, 1), 1, "wait");
	tl_conn_close(&c);
	return 0;
}

static void stated_jobs(void)
{
	struct tl_conn c;
	struct tl_reply r;
	char id[64], named[80], source[16], x;
	const cJSON *mine, *theirs;
	cJSON *jobs;
	pid_t nobody;

	ASSERT_OK(tl_conn_open(&c, tl_daemon_worker_socket(&daemon_, 0)), "connect");
	set_job(&c, "train-7", named, sizeof(named), source, sizeof(source));
	ASSERT_EQ(tl_import_memfd(&c, 0, tl_memfd_open(4096), 4096, id, &r), 0, "import: %s", tl_reply_describe(&r));
	tl_reply_finish(&r);
	ASSERT(pipe(pipe_go) == 0 && pipe(pipe_done) == 0, "pipes");
	nobody = tl_fork(nobody_states_train_7, NULL, 0);
	ASSERT_EQ(read(pipe_done[0], &x, 1), 1, "nobody's import");
	jobs = jobs_of_device_0();
	mine = job_entry(jobs, "train-7", "client", 0);
	theirs = job_entry(jobs, "train-7", "client", NOBODY);
	char *text = cJSON_PrintUnformatted(jobs);
	tl_log("device 0's jobs: %s", text ? text : "?");
	free(text);
	ASSERT(mine && count_of(mine, "buffers") == 1 && count_of(mine, "sessions") == 1,
	       "root's train-7 counts %ld buffers and %ld sessions (nobody's work counted as root's job?)",
	       count_of(mine, "buffers"), count_of(mine, "sessions"));
	ASSERT(theirs && count_of(theirs, "buffers") == 1, "nobody's train-7 is not a job of its own");
	cJSON_Delete(jobs);
	ASSERT_EQ(write(pipe_go[1], "x", 1), 1, "go");
	ASSERT_EQ(tl_wait(nobody, 30), 0, "nobody");
	tl_conn_close(&c);
}

/* ---- A job from a cgroup is the scheduler's, not a user's ---- */

static bool enter_cgroup(const char *dir)
{
	char path[256], pid[32];
	int fd;
	bool ok;

	snprintf(path, sizeof(path), "%s/cgroup.procs", dir);
	fd = open(path, O_WRONLY | O_CLOEXEC);
	if (fd < 0)
		return false;
	snprintf(pid, sizeof(pid), "%d\n", (int)getpid());
	ok = write(fd, pid, strlen(pid)) == (ssize_t)strlen(pid);
	close(fd);
	return ok;
}

static void remove_cgroups(void);

static bool make_cgroups(void)
{
	char slurm[160];

	snprintf(cg_top, sizeof(cg_top), "/sys/fs/cgroup/pids/regen-test-%d", (int)getpid());
	snprintf(slurm, sizeof(slurm), "%s/slurm", cg_top);
	snprintf(cg_job, sizeof(cg_job), "%s/job_4242", slurm);
	snprintf(cg_delegated, sizeof(cg_delegated), "%s/nobody", cg_top);
	if (mkdir(cg_top, 0755) < 0)
		return false;
	tl_on_failure(remove_cgroups);
	ASSERT(mkdir(slurm, 0755) == 0 && mkdir(cg_job, 0755) == 0 && mkdir(cg_delegated, 0755) == 0, "cgroups");
	/* Delegation as systemd does it: the directory and its files. */
	ASSERT(chown(cg_delegated, NOBODY, NOBODY) == 0, "chown");
	for (const char *f = "cgroup.procs\0tasks\0"; *f; f += strlen(f) + 1) {
		char path[256];

		snprintf(path, sizeof(path), "%s/%s", cg_delegated, f);
		if (chown(path, NOBODY, NOBODY) < 0 && errno != ENOENT)
			return false;
	}
	return true;
}

static void remove_cgroups(void)
{
	char path[256];

	snprintf(path, sizeof(path), "%s/job_4242", cg_delegated);
	rmdir(path);
	rmdir(cg_delegated);
	rmdir(cg_job);
	snprintf(path, sizeof(path), "%s/slurm", cg_top);
	rmdir(path);
	rmdir(cg_top);
}

static int nobody_in_its_own_job_4242(void *arg)
{
	struct tl_conn c;
	char dir[256], named[80], source[16];

	tl_become_nobody(0, false);
	snprintf(dir, sizeof(dir), "%s/job_4242", cg_delegated);
	ASSERT_EQ(mkdir(dir, 0755), 0, "nobody's mkdir in its delegated cgroup: %s", strerror(errno));
	ASSERT(enter_cgroup(dir), "nobody moves itself into %s: %s", dir, strerror(errno));
	ASSERT_OK(tl_conn_open(&c, tl_daemon_worker_socket(&daemon_, 0)), "connect");
	set_job(&c, "nobody-own", named, sizeof(named), source, sizeof(source));
	tl_log("uid nobody in %s: its connection's job is %s (%s)", dir, named, source);
	ASSERT(strcmp(named, "nobody-own") == 0 && strcmp(source, "client") == 0,
	       "uid nobody's own cgroup named job_4242 made its connection \"%s\" (%s)", named, source);
	tl_conn_close(&c);
	return 0;
}

static int root_in_job_4242(void *arg)
{
	struct tl_conn c;
	char named[80], source[16];

	ASSERT(enter_cgroup(cg_job), "enter %s", cg_job);
	ASSERT_OK(tl_conn_open(&c, tl_daemon_worker_socket(&daemon_, 0)), "connect");
	set_job(&c, "rank-0", named, sizeof(named), source, sizeof(source));
	tl_log("root in %s: its connection's job is %s (%s)", cg_job, named, source);
	ASSERT(strcmp(named, "slurm:4242") == 0 && strcmp(source, "cgroup") == 0,
	       "a process in the scheduler's job_4242 is \"%s\" (%s)", named, source);
	tl_conn_close(&c);
	return 0;
}

static void cgroup_jobs(void)
{
	if (!make_cgroups()) {
		tl_log("cgroup part skipped: cannot make a cgroup v1 pids hierarchy here (%s)", strerror(errno));
		remove_cgroups();
		return;
	}
	ASSERT_EQ(tl_wait(tl_fork(root_in_job_4242, NULL, 0), 30), 0, "root in the scheduler's job");
	ASSERT_EQ(tl_wait(tl_fork(nobody_in_its_own_job_4242, NULL, 0), 30), 0, "nobody in a job_4242 of its own");
	remove_cgroups();
}

/* ---- The jobs table: a uid's share ---- */

static int nobody_fills_the_table(void *arg)
{
	static struct tl_conn conns[MANY];
	char job[32], named[80], source[16], go;

	tl_become_nobody(0, false);
	for (int i = 0; i < MANY; i++) {
		ASSERT_OK(tl_conn_open(&conns[i], tl_daemon_worker_socket(&daemon_, 0)), "connect %d", i);
		snprintf(job, sizeof(job), "squat-%d", i);
		set_job(&conns[i], job, named, sizeof(named), source, sizeof(source));
	}
	ASSERT_EQ(write(pipe_done[1], "x", 1), 1, "done");
	ASSERT_EQ(read(pipe_go[0], &go, 1), 1, "wait");
	for (int i = 0; i < MANY; i++)
		tl_conn_close(&conns[i]);
	return 0;
}

static void jobs_table(void)
{
	struct tl_conn c;
	char named[80], source[16], x;
	const cJSON *j, *mine;
	cJSON *jobs;
	int nobodys = 0;
	pid_t nobody;

	nobody = tl_fork(nobody_fills_the_table, NULL, 0);
	ASSERT_EQ(read(pipe_done[0], &x, 1), 1, "nobody's jobs");
	ASSERT_OK(tl_conn_open(&c, tl_daemon_worker_socket(&daemon_, 0)), "connect");
	set_job(&c, "victim", named, sizeof(named), source, sizeof(source));
	jobs = jobs_of_device_0();
	cJSON_ArrayForEach(j, jobs)
		nobodys += count_of(j, "uid") == NOBODY;
	mine = job_entry(jobs, "victim", "client", 0);
	tl_log("after nobody's %d jobs: nobody has %d entries, other %ld sessions; root's victim: %s", MANY, nobodys,
	       count_of(job_entry(jobs, "", "other", -1), "sessions"), mine ? "listed" : "NOT listed");
	ASSERT(mine && count_of(mine, "sessions") == 1, "root's job is not listed beside nobody's %d", MANY);
	ASSERT_EQ(nobodys, 8, "uid nobody's entries");
	ASSERT_EQ(count_of(job_entry(jobs, "", "other", -1), "sessions"), MANY - 8, "other's sessions");
	cJSON_Delete(jobs);
	tl_conn_close(&c);
	ASSERT_EQ(write(pipe_go[1], "x", 1), 1, "go");
	ASSERT_EQ(tl_wait(nobody, 30), 0, "nobody");
}

/* ---- regenctl restart --job ---- */

static void restart_job(void)
{
	struct tl_conn c;
	struct tl_device before, after;
	char *argv[] = { daemon_.regenctl, "--socket", daemon_.sock, "restart", "--job", "--wait", "--timeout", "10",
			 NULL };
	char *out = NULL, *err = NULL;
	int rc;

	ASSERT_OK(tl_conn_open(&c, daemon_.sock), "connect");
	tl_device_status(&c, 0, &before);
	setenv("SLURM_JOB_GPUS", "0", 1);
	rc = tl_run(argv, &out, &err, 30, NOBODY, NOBODY);
	unsetenv("SLURM_JOB_GPUS");
	tl_log("regenctl restart --job as nobody (SLURM_JOB_GPUS=0): exit %d: %s", rc, err);
	ASSERT_EQ(rc, 4, "regenctl restart --job as uid nobody: %s%s", out, err);
	tl_device_status(&c, 0, &after);
	ASSERT_EQ(after.generation, before.generation, "device 0's generation");
	ASSERT_EQ(after.worker_pid, before.worker_pid, "device 0's worker");
	free(out);
	free(err);
	tl_conn_close(&c);
}

int main(void)
{
	static const char *const extra[] = { "--socket-mode", "0666", NULL };

	tl_init(180);
	if (geteuid() != 0)
		tl_skip("needs root, to call as a second uid");
	tl_daemon_start(&daemon_, &(struct tl_daemon_opts){ .extra = extra });
	stated_jobs();
	cgroup_jobs();
	jobs_table();
	restart_job();
	tl_log("PASS");
	return 0;
}
