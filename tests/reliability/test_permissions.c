/* Who may do what, and what the sockets let through.
 *
 * - The sockets get the mode and group regend was told (--socket-mode 0660
 *   --socket-group S --admin-group A): the main socket and every worker
 *   socket; a user outside S cannot even connect.
 * - A user in S but neither root nor in A (nobody with gid S) is refused
 *   Release, Reset, Restart and InjectFault with io.regen.NotPermitted
 *   naming the method, the device is untouched, and it can still call
 *   Status, Generation and GetInfo and import on a worker.
 * - With the sockets open to everyone (0666), plain nobody is refused the
 *   same way, and a user whose group is A may Release.
 * Needs root (to become nobody); exits 77 otherwise. */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "rtest.h"

static struct rt_daemon daemon_;
static gid_t admin_gid, socket_gid;

static void check_socket(const char *path, unsigned mode, gid_t gid)
{
	struct stat st;

	RT_CHECK(stat(path, &st) == 0, "stat %s: %s", path, strerror(errno));
	RT_CHECK(S_ISSOCK(st.st_mode), "%s is not a socket", path);
	RT_CHECK((st.st_mode & 07777) == mode, "%s has mode %04o, expected %04o", path, st.st_mode & 07777, mode);
	RT_CHECK(st.st_gid == gid, "%s has group %u, expected %u", path, (unsigned)st.st_gid, (unsigned)gid);
	rt_log("%s: mode %04o group %u as configured", path, st.st_mode & 07777, (unsigned)st.st_gid);
}

static int nobody_cannot_connect(void *arg)
{
	struct rt_conn c;

	rt_become_nobody(0, false);
	for (int i = -1; i < daemon_.ndevices; i++) {
		const char *path = i < 0 ? daemon_.sock : rt_worker_socket(&daemon_, i);
		int r = rt_connect(&c, path);

		RT_CHECK(r == -EACCES, "nobody connected to %s (mode 0660, other group): %s", path, r == 0 ? "yes" : strerror(-r));
		rt_log("nobody -> %s: %s, as it should", path, strerror(-r));
	}
	return 0;
}

/* arg: the gid to run with (NULL: nobody's own). */
static int nobody_is_refused(void *arg)
{
	static const struct {
		const char *method, *params;
	} admin_calls[] = {
		{ "io.regen.Device.Release", "{\"device\":0}" },
		{ "io.regen.Device.Reset", "{\"device\":0}" },
		{ "io.regen.Device.Restart", "{\"device\":0,\"deadline_ms\":100}" },
		{ "io.regen.Device.InjectFault", "{\"device\":0,\"kind\":\"crash\"}" },
		{ "io.regen.Device.Release", "{}" },
		{ "io.regen.Device.Restart", "{}" },
	};
	struct rt_conn c;
	struct rt_reply r;
	struct rt_device before, after;

	rt_become_nobody(arg ? *(gid_t *)arg : 0, arg != NULL);
	RT_CHECK(rt_connect(&c, daemon_.sock) == 0, "nobody (gid %u) cannot connect", (unsigned)getgid());
	rt_status(&c, 0, &before);
	for (size_t i = 0; i < sizeof(admin_calls) / sizeof(admin_calls[0]); i++) {
		rt_call(&c, &r, 30, NULL, 0, admin_calls[i].method, "%s", admin_calls[i].params);
		RT_CHECK(r.error && strcmp(r.error, "io.regen.NotPermitted") == 0, "nobody's %s got %s",
			 admin_calls[i].method, r.error ? r.error : "success");
		RT_CHECK(rt_reply_str(&r, "method") && strcmp(rt_reply_str(&r, "method"), admin_calls[i].method) == 0,
			 "NotPermitted names method %s", rt_reply_str(&r, "method") ? rt_reply_str(&r, "method") : "(none)");
		RT_CHECK(rt_reply_str(&r, "message") != NULL, "NotPermitted without a message");
		rt_log("nobody (gid %u) %s %s -> %s", (unsigned)getgid(), admin_calls[i].method, admin_calls[i].params, r.error);
		rt_reply_finish(&r);
	}
	/* Still served, and nothing happened to the device. */
	rt_call_ok(&c, &r, "io.regen.Device.Generation", NULL);
	rt_reply_finish(&r);
	rt_call_ok(&c, &r, "org.varlink.service.GetInfo", NULL);
	rt_reply_finish(&r);
	rt_status(&c, 0, &after);
	RT_CHECK(after.generation == before.generation && after.worker_pid == before.worker_pid &&
		 strcmp(after.state, "ready") == 0, "a refused call changed device 0 (generation %lld -> %lld, worker %lld -> %lld)",
		 (long long)before.generation, (long long)after.generation, (long long)before.worker_pid,
		 (long long)after.worker_pid);
	rt_close(&c);

	/* The data plane is not an admin's: nobody imports on a worker. */
	RT_CHECK(rt_connect(&c, rt_worker_socket(&daemon_, 0)) == 0, "nobody cannot reach the worker socket");
	int fd = rt_memfd(4096);
	char id[64];
	RT_CHECK(rt_import(&c, 0, fd, 4096, id, &r) == 0, "nobody's import failed: %s", r.error);
	rt_reply_finish(&r);
	rt_close(&c);
	return 0;
}

static int group_member_may(void *arg)
{
	struct rt_conn c;
	struct rt_reply r;
	struct rt_device before, after;

	rt_become_nobody(admin_gid, true);
	RT_CHECK(rt_connect(&c, daemon_.sock) == 0, "connect");
	rt_status(&c, 1, &before);
	rt_call_ok(&c, &r, "io.regen.Device.Release", "{\"device\":1,\"reason\":\"admin group member\"}");
	rt_reply_finish(&r);
	rt_status(&c, 1, &after);
	RT_CHECK(after.generation == before.generation + 1, "Release by the admin group: generation %lld -> %lld",
		 (long long)before.generation, (long long)after.generation);
	rt_log("uid nobody, gid %u (admin group): Release device 1 -> generation %lld", (unsigned)admin_gid,
	       (long long)after.generation);
	rt_close(&c);
	return 0;
}

int main(void)
{
	const char *group, *sgroup;

	if (geteuid() != 0)
		rt_skip("needs root to become nobody");
	group = rt_group_without_nobody((gid_t)-1, &admin_gid);
	sgroup = group ? rt_group_without_nobody(admin_gid, &socket_gid) : NULL;
	if (!group || !sgroup)
		rt_skip("no two groups that nobody is not in");
	rt_log("admin group %s (%u), socket group %s (%u)", group, (unsigned)admin_gid, sgroup, (unsigned)socket_gid);

	const char *closed[] = { "--socket-mode", "0660", "--socket-group", sgroup, "--admin-group", group, NULL };
	rt_daemon_start(&daemon_, closed, 120);
	check_socket(daemon_.sock, 0660, socket_gid);
	for (int i = 0; i < daemon_.ndevices; i++)
		check_socket(rt_worker_socket(&daemon_, i), 0660, socket_gid);
	RT_CHECK(rt_wait(rt_fork(nobody_cannot_connect, NULL), 30) == 0, "nobody_cannot_connect failed");
	RT_CHECK(rt_wait(rt_fork(nobody_is_refused, &socket_gid), 60) == 0, "nobody in the socket group: not refused");
	rt_daemon_stop(&daemon_);

	const char *open_[] = { "--socket-mode", "0666", "--admin-group", group, NULL };
	rt_daemon_start(&daemon_, open_, 120);
	check_socket(daemon_.sock, 0666, getgid());
	for (int i = 0; i < daemon_.ndevices; i++)
		check_socket(rt_worker_socket(&daemon_, i), 0666, getgid());
	RT_CHECK(rt_wait(rt_fork(nobody_is_refused, NULL), 60) == 0, "nobody_is_refused failed");
	RT_CHECK(rt_wait(rt_fork(group_member_may, NULL), 60) == 0, "group_member_may failed");
	rt_daemon_stop(&daemon_);
	rt_log("PASS");
	return 0;
}
