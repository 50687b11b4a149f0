/* SPDX-License-Identifier: Apache-2.0 */
/* regend's socket directory is regend's: it uses one only when nobody else
 * can change what is in it, and refuses to start, saying why, otherwise.
 *
 * Each case runs regend (host backend, one device) on a socket in a
 * directory that the test prepares as another user could have:
 * - owned by another uid (nobody), mode 0755: refused, naming the uid; no
 *   socket is made in it. (Before issue 30 regend bound its sockets there:
 *   their owner could replace a worker's socket and receive clients'
 *   memfds, or swap a socket for a symlink between bind() and chmod() and
 *   have regend chmod any file.)
 * - writable by every user (0777, and 1777 as /tmp is), and by its group
 *   (0775): refused, naming the mode.
 * - a symbolic link to a good directory: refused.
 * - missing, in a parent every user may write: regend makes it, its own,
 *   0755, and serves; the sockets have the mode asked for from the start.
 * - a FIFO where the file of generations goes (<socket>.generations):
 *   refused within seconds, naming the FIFO. (Before, regend's start
 *   waited for ever on the FIFO's open.)
 * - a leftover <socket>.generations.new that is a symlink to a file of
 *   root's: regend's write of its generations goes to a file of its own;
 *   the target is untouched. A FIFO there: regend serves. (Before, its
 *   start waited for ever on the FIFO's open.) */
#include <errno.h>
#include <fcntl.h>
#include <pwd.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include "tests/lib/asserts.h"
#include "tests/lib/varlink.h"

static char base[64], regend[512], config[128];

static void path_in(char *buf, size_t size, const char *name)
{
	snprintf(buf, size, "%s/%s", base, name);
}

/* Runs regend on sock; it must exit 1 within 10 s with `reason` in its
 * log. */
static void refused(const char *sock, const char *reason, const char *what)
{
	char *argv[] = { regend, "--socket", (char *)sock, "--config", config, "--backend", "host", "--devices", "1", NULL };
	char *out = NULL, *err = NULL;
	double t0 = tl_now();
	int rc = tl_run(argv, &out, &err, 10, -1, -1);

	tl_log("%s: regend exited %d after %.2f s: %s", what, rc, tl_now() - t0, err);
	ASSERT_EQ(rc, 1, "%s: regend did not refuse to start (exit %d; -1: still running after 10 s)", what, rc);
	ASSERT(strstr(err, "refusing to start") && strstr(err, reason), "%s: the refusal does not say \"%s\": %s", what,
	       reason, err);
	ASSERT(access(sock, F_OK) != 0, "%s: regend made its socket %s before it refused", what, sock);
	free(out);
	free(err);
}

static volatile pid_t running = -1;

/* The test failed or timed out: regend and its worker go with it. */
static void kill_running(void)
{
	if (running > 0) {
		kill(-running, SIGKILL);
		kill(running, SIGKILL);
	}
}

/* Starts regend on sock and waits until its device serves; returns its
 * pid. */
static pid_t serving(const char *sock)
{
	char log[128];
	pid_t pid;

	path_in(log, sizeof(log), "serving.log");
	fflush(NULL);
	pid = fork();
	ASSERT(pid >= 0, "fork");
	if (pid == 0) {
		int fd = open(log, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
		dup2(fd, 1);
		dup2(fd, 2);
		setpgid(0, 0);
		execl(regend, regend, "--socket", sock, "--config", config, "--backend", "host", "--devices", "1",
		      "--socket-mode", "0660", (char *)NULL);
		_exit(127);
	}
	setpgid(pid, pid);
	running = pid;
	for (double t0 = tl_now();; usleep(20000)) {
		struct tl_conn c;
		struct tl_device d;

		if (tl_conn_open(&c, sock) == 0) {
			tl_device_status(&c, 0, &d);
			tl_conn_close(&c);
			if (strcmp(d.state, "ready") == 0)
				return pid;
		} else {
			tl_conn_close(&c);
		}
		ASSERT(waitpid(pid, NULL, WNOHANG) == 0, "regend on %s exited before it served (log %s)", sock, log);
		ASSERT_DOUBLE_LT(tl_now() - t0, tl_timeout(20), "regend on %s did not serve within 20 s", sock);
	}
}

static void stop(pid_t pid)
{
	kill(pid, SIGTERM);
	ASSERT_EQ(tl_wait(pid, 20), 0, "regend did not stop cleanly");
	kill(-pid, SIGKILL);
	running = -1;
}

static void other_uids_directory(void)
{
	struct passwd *pw = getpwnam("nobody");
	char dir[128], sock[192];

	ASSERT_NOT_NULL(pw, "no user nobody");
	path_in(dir, sizeof(dir), "nobodys");
	ASSERT_EQ(mkdir(dir, 0755), 0, "mkdir %s", dir);
	ASSERT_EQ(chown(dir, pw->pw_uid, pw->pw_gid), 0, "chown %s", dir);
	snprintf(sock, sizeof(sock), "%s/regend.sock", dir);
	refused(sock, "belongs to uid 65534", "a directory of uid nobody's");
}

static void writable_directory(const char *name, mode_t mode, const char *reason)
{
	char dir[128], sock[192], what[64];

	path_in(dir, sizeof(dir), name);
	ASSERT_EQ(mkdir(dir, 0700), 0, "mkdir %s", dir);
	ASSERT_EQ(chmod(dir, mode), 0, "chmod %s", dir);
	snprintf(sock, sizeof(sock), "%s/regend.sock", dir);
	snprintf(what, sizeof(what), "a directory of mode %04o", (unsigned)mode);
	refused(sock, reason, what);
}

static void symlinked_directory(void)
{
	char dir[128], link[128], sock[192];

	path_in(dir, sizeof(dir), "real");
	path_in(link, sizeof(link), "link");
	ASSERT_EQ(mkdir(dir, 0755), 0, "mkdir %s", dir);
	ASSERT_EQ(symlink(dir, link), 0, "symlink %s", link);
	snprintf(sock, sizeof(sock), "%s/regend.sock", link);
	refused(sock, "symbolic link", "a symbolic link to a directory");
}

static void made_in_a_shared_parent(void)
{
	char parent[128], dir[160], sock[192], worker[200];
	struct stat st;

	path_in(parent, sizeof(parent), "shared");
	ASSERT_EQ(mkdir(parent, 0700), 0, "mkdir %s", parent);
	ASSERT_EQ(chmod(parent, 01777), 0, "chmod %s", parent);
	snprintf(dir, sizeof(dir), "%s/run", parent);
	snprintf(sock, sizeof(sock), "%s/regend.sock", dir);
	pid_t pid = serving(sock);
	ASSERT_EQ(lstat(dir, &st), 0, "stat %s", dir);
	ASSERT(S_ISDIR(st.st_mode) && st.st_uid == geteuid() && (st.st_mode & 0777) == 0755,
	       "regend made %s uid %u mode %04o", dir, (unsigned)st.st_uid, (unsigned)(st.st_mode & 07777));
	snprintf(worker, sizeof(worker), "%s.dev0", sock);
	ASSERT_EQ(stat(worker, &st), 0, "stat %s", worker);
	ASSERT(S_ISSOCK(st.st_mode) && (st.st_mode & 0777) == 0660, "the worker's socket has mode %04o",
	       (unsigned)(st.st_mode & 07777));
	ASSERT_EQ(stat(sock, &st), 0, "stat %s", sock);
	ASSERT((st.st_mode & 0777) == 0660, "the main socket has mode %04o", (unsigned)(st.st_mode & 07777));
	stop(pid);
	tl_log("a missing directory in a parent of mode 1777: regend made it 0755, its own, and served (sockets 0660)");
}

static void fifo_for_generations(void)
{
	char dir[128], sock[192], fifo[220];

	path_in(dir, sizeof(dir), "fifo");
	ASSERT_EQ(mkdir(dir, 0755), 0, "mkdir %s", dir);
	snprintf(sock, sizeof(sock), "%s/regend.sock", dir);
	snprintf(fifo, sizeof(fifo), "%s.generations", sock);
	ASSERT_EQ(mkfifo(fifo, 0600), 0, "mkfifo %s", fifo);
	refused(sock, "a FIFO", "a FIFO where the generations go");
}

static void symlink_for_new_generations(void)
{
	char dir[128], sock[192], tmp[220], target[128], gens[220], buf[64] = "";
	struct stat st;
	int fd;

	path_in(dir, sizeof(dir), "newlink");
	path_in(target, sizeof(target), "roots-file");
	ASSERT_EQ(mkdir(dir, 0755), 0, "mkdir %s", dir);
	fd = open(target, O_WRONLY | O_CREAT | O_EXCL, 0600);
	ASSERT(fd >= 0 && write(fd, "root's\n", 7) == 7, "write %s", target);
	close(fd);
	snprintf(sock, sizeof(sock), "%s/regend.sock", dir);
	snprintf(tmp, sizeof(tmp), "%s.generations.new", sock);
	snprintf(gens, sizeof(gens), "%s.generations", sock);
	ASSERT_EQ(symlink(target, tmp), 0, "symlink %s", tmp);
	pid_t pid = serving(sock);
	stop(pid);
	fd = open(target, O_RDONLY);
	ASSERT(fd >= 0 && read(fd, buf, sizeof(buf) - 1) == 7 && strcmp(buf, "root's\n") == 0,
	       "regend wrote through the symlink at %s into %s: \"%s\"", tmp, target, buf);
	close(fd);
	ASSERT(lstat(gens, &st) == 0 && S_ISREG(st.st_mode), "no file of generations at %s", gens);
	tl_log("a symlink at %s: regend wrote its generations into a file of its own; %s untouched", tmp, target);
}

/* A FIFO where regend makes its new file of generations: its start must
 * not wait on it. */
static void fifo_for_new_generations(void)
{
	char dir[128], sock[192], tmp[220];

	path_in(dir, sizeof(dir), "newfifo");
	ASSERT_EQ(mkdir(dir, 0755), 0, "mkdir %s", dir);
	snprintf(sock, sizeof(sock), "%s/regend.sock", dir);
	snprintf(tmp, sizeof(tmp), "%s.generations.new", sock);
	ASSERT_EQ(mkfifo(tmp, 0600), 0, "mkfifo %s", tmp);
	stop(serving(sock));
	tl_log("a FIFO at %s: regend made its file of generations beside it and served", tmp);
}

int main(void)
{
	tl_init(180);
	tl_on_failure(kill_running);
	tl_on_alarm(kill_running);
	if (geteuid() != 0)
		tl_skip("needs root, to make directories of other users");
	snprintf(regend, sizeof(regend), "%s/daemon/regend", tl_build_root());
	if (access(regend, X_OK) != 0)
		tl_skip("%s has not been built", regend);
	snprintf(base, sizeof(base), "/tmp/regen-sockdir-XXXXXX");
	ASSERT_NOT_NULL(mkdtemp(base), "mkdtemp: %s", strerror(errno));
	chmod(base, 0755);
	path_in(config, sizeof(config), "regend.conf");
	FILE *f = fopen(config, "w");
	ASSERT_NOT_NULL(f, "%s", config);
	fclose(f);

	other_uids_directory();
	writable_directory("open", 0777, "writable by every user (mode 0777)");
	writable_directory("sticky", 01777, "writable by every user (mode 1777)");
	writable_directory("group", 0775, "writable by its group (mode 0775)");
	symlinked_directory();
	fifo_for_generations();
	made_in_a_shared_parent();
	symlink_for_new_generations();
	fifo_for_new_generations();

	char cmd[128];
	snprintf(cmd, sizeof(cmd), "rm -rf '%s'", base);
	if (system(cmd) != 0)
		tl_log("could not remove %s", base);
	tl_log("PASS");
	return 0;
}
