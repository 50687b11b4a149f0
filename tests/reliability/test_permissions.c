/* SPDX-License-Identifier: Apache-2.0 */
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
 * - Admin rights come from the caller's own credentials (SO_PEERGROUPS),
 *   not from /etc/group: nobody with A only among its supplementary groups
 *   (which /etc/group does not list) may Release; the same process that
 *   dropped them may not.
 * - However many groups it has: nobody with 300 supplementary groups, the
 *   admin gid the last, may Release (regend read 64 and found none when
 *   there were more); with the same 299 and not the admin gid it may not.
 * Needs root (to become nobody); exits 77 otherwise. */
#include <errno.h>
#include <grp.h>
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

static struct tl_daemon daemon_;
static gid_t admin_gid, socket_gid;

static void check_socket(const char *path, unsigned mode, gid_t gid)
{
	struct stat st;

	ASSERT(stat(path, &st) == 0, "stat %s: %s", path, strerror(errno));
	ASSERT(S_ISSOCK(st.st_mode), "%s is not a socket", path);
	ASSERT_EQ((st.st_mode & 07777), mode, "%s has mode %04o, expected %04o", path, st.st_mode & 07777, mode);
	ASSERT_UINT_EQ(st.st_gid, gid, "%s has group %u, expected %u", path, (unsigned)st.st_gid, (unsigned)gid);
	tl_log("%s: mode %04o group %u as configured", path, st.st_mode & 07777, (unsigned)st.st_gid);
}

static int nobody_cannot_connect(void *arg)
{
	struct tl_conn c;

	tl_become_nobody(0, false);
	for (int i = -1; i < daemon_.ndevices; i++) {
		const char *path = i < 0 ? daemon_.sock : tl_daemon_worker_socket(&daemon_, i);
		int r = tl_conn_open(&c, path);

		ASSERT_EQ(r, -EACCES, "nobody connected to %s (mode 0660, other group)", path);
		tl_log("nobody -> %s: %s, as it should", path, strerror(-r));
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
	struct tl_conn c;
	struct tl_reply r;
	struct tl_device before, after;

	tl_become_nobody(arg ? *(gid_t *)arg : 0, arg != NULL);
	ASSERT_OK(tl_conn_open(&c, daemon_.sock), "nobody (gid %u) cannot connect", (unsigned)getgid());
	tl_device_status(&c, 0, &before);
	for (size_t i = 0; i < sizeof(admin_calls) / sizeof(admin_calls[0]); i++) {
		tl_call(&c, &r, 30, NULL, 0, admin_calls[i].method, "%s", admin_calls[i].params);
		ASSERT_REPLY_ERROR(&r, "io.regen.NotPermitted", "nobody's %s got %s",
		                   admin_calls[i].method, r.error ? r.error : "success");
		ASSERT(tl_reply_str(&r, "method") && strcmp(tl_reply_str(&r, "method"), admin_calls[i].method) == 0,
		       "NotPermitted names method %s", tl_reply_str(&r, "method") ? tl_reply_str(&r, "method") : "(none)");
		ASSERT_NOT_NULL(tl_reply_str(&r, "message"), "NotPermitted without a message");
		tl_log("nobody (gid %u) %s %s -> %s", (unsigned)getgid(), admin_calls[i].method, admin_calls[i].params, r.error);
		tl_reply_finish(&r);
	}
	/* Still served, and nothing happened to the device. */
	tl_call_ok(&c, &r, "io.regen.Device.Generation", NULL);
	tl_reply_finish(&r);
	tl_call_ok(&c, &r, "org.varlink.service.GetInfo", NULL);
	tl_reply_finish(&r);
	tl_device_status(&c, 0, &after);
	ASSERT_EQ(after.generation, before.generation, "a refused call changed device 0's generation");
	ASSERT_EQ(after.worker_pid, before.worker_pid, "a refused call changed device 0's worker");
	ASSERT_STR_EQ(after.state, "ready", "a refused call changed device 0's state");
	tl_conn_close(&c);

	/* The data plane is not an admin's: nobody imports on a worker. */
	ASSERT_OK(tl_conn_open(&c, tl_daemon_worker_socket(&daemon_, 0)), "nobody cannot reach the worker socket");
	int fd = tl_memfd_open(4096);
	char id[64];
	ASSERT_EQ(tl_import_memfd(&c, 0, fd, 4096, id, &r), 0, "nobody's import failed: %s", r.error);
	tl_reply_finish(&r);
	tl_conn_close(&c);
	return 0;
}

static int group_member_may(void *arg)
{
	struct tl_conn c;
	struct tl_reply r;
	struct tl_device before, after;

	tl_become_nobody(admin_gid, true);
	ASSERT_OK(tl_conn_open(&c, daemon_.sock), "connect");
	tl_device_status(&c, 1, &before);
	tl_call_ok(&c, &r, "io.regen.Device.Release", "{\"device\":1,\"reason\":\"admin group member\"}");
	tl_reply_finish(&r);
	tl_device_status(&c, 1, &after);
	ASSERT_EQ(after.generation, before.generation + 1, "Release by the admin group: generation %lld -> %lld",
	          (long long)before.generation, (long long)after.generation);
	tl_log("uid nobody, gid %u (admin group): Release device 1 -> generation %lld", (unsigned)admin_gid,
	       (long long)after.generation);
	tl_conn_close(&c);
	return 0;
}

/* nobody whose primary group is nobody's and whose supplementary groups
 * are `groups` (none: dropped). */
static void become_nobody_with_groups(const gid_t *groups, size_t n)
{
	ASSERT(setgroups(n, groups) == 0, "setgroups: %s", strerror(errno));
	ASSERT(setgid(65534) == 0 && setuid(65534) == 0, "become nobody: %s", strerror(errno));
}

static int supplementary_member_may(void *arg)
{
	struct tl_conn c;
	struct tl_reply r;
	struct tl_device before, after;

	become_nobody_with_groups(&admin_gid, 1);
	ASSERT_OK(tl_conn_open(&c, daemon_.sock), "connect");
	tl_device_status(&c, 0, &before);
	tl_call_ok(&c, &r, "io.regen.Device.Release", "{\"device\":0,\"reason\":\"supplementary admin group\"}");
	tl_reply_finish(&r);
	tl_device_status(&c, 0, &after);
	ASSERT_EQ(after.generation, before.generation + 1, "Release by a supplementary member: generation %lld -> %lld",
	          (long long)before.generation, (long long)after.generation);
	tl_log("nobody with admin gid %u as a supplementary group (not in /etc/group): Release -> generation %lld",
	       (unsigned)admin_gid, (long long)after.generation);
	tl_conn_close(&c);
	return 0;
}

/* More supplementary groups than fit in struct rd_peer (64), that no group
 * file names, and the admin gid last when asked. */
#define MANY_GROUPS 300

static size_t many_groups(gid_t *groups, bool with_admin)
{
	size_t n = 0;

	for (gid_t g = 70000; n < MANY_GROUPS - 1; g++)
		if (g != admin_gid && g != socket_gid)
			groups[n++] = g;
	if (with_admin)
		groups[n++] = admin_gid;
	return n;
}

static int many_groups_member_may(void *arg)
{
	gid_t groups[MANY_GROUPS];
	struct tl_conn c;
	struct tl_reply r;
	struct tl_device before, after;

	become_nobody_with_groups(groups, many_groups(groups, true));
	ASSERT_EQ(getgroups(0, NULL), MANY_GROUPS, "the child has %d groups", getgroups(0, NULL));
	ASSERT_OK(tl_conn_open(&c, daemon_.sock), "connect");
	tl_device_status(&c, 1, &before);
	tl_call(&c, &r, 30, NULL, 0, "io.regen.Device.Release", "{\"device\":1,\"reason\":\"admin gid 300th\"}");
	ASSERT(r.error == NULL, "nobody with the admin gid as its %dth group got %s", MANY_GROUPS, r.error);
	tl_reply_finish(&r);
	tl_device_status(&c, 1, &after);
	ASSERT_EQ(after.generation, before.generation + 1, "Release by a member with %d groups: generation %lld -> %lld",
	          MANY_GROUPS, (long long)before.generation, (long long)after.generation);
	tl_log("nobody with %d supplementary groups, admin gid %u the last: Release -> generation %lld", MANY_GROUPS,
	       (unsigned)admin_gid, (long long)after.generation);
	tl_conn_close(&c);
	return 0;
}

static int many_groups_non_member_may_not(void *arg)
{
	gid_t groups[MANY_GROUPS];
	struct tl_conn c;
	struct tl_reply r;

	become_nobody_with_groups(groups, many_groups(groups, false));
	ASSERT_OK(tl_conn_open(&c, daemon_.sock), "connect");
	tl_call(&c, &r, 30, NULL, 0, "io.regen.Device.Release", "{\"device\":1}");
	ASSERT_REPLY_ERROR(&r, "io.regen.NotPermitted", "nobody with %d groups, none the admin gid, got %s",
			   MANY_GROUPS - 1, r.error ? r.error : "success");
	tl_reply_finish(&r);
	tl_log("nobody with %d supplementary groups, none the admin gid: Release -> NotPermitted", MANY_GROUPS - 1);
	tl_conn_close(&c);
	return 0;
}

static int dropped_groups_may_not(void *arg)
{
	struct tl_conn c;
	struct tl_reply r;

	become_nobody_with_groups(NULL, 0);
	ASSERT_OK(tl_conn_open(&c, daemon_.sock), "connect");
	tl_call(&c, &r, 30, NULL, 0, "io.regen.Device.Release", "{\"device\":0}");
	ASSERT_REPLY_ERROR(&r, "io.regen.NotPermitted", "nobody with no groups got %s", r.error ? r.error : "success");
	tl_reply_finish(&r);
	tl_log("nobody with its groups dropped: Release -> NotPermitted");
	tl_conn_close(&c);
	return 0;
}

int main(void)
{
	const char *group, *sgroup;

	tl_init(120);
	if (geteuid() != 0)
		tl_skip("needs root to become nobody");
	group = tl_group_without_nobody((gid_t)-1, &admin_gid);
	sgroup = group ? tl_group_without_nobody(admin_gid, &socket_gid) : NULL;
	if (!group || !sgroup)
		tl_skip("no two groups that nobody is not in");
	tl_log("admin group %s (%u), socket group %s (%u)", group, (unsigned)admin_gid, sgroup, (unsigned)socket_gid);

	const char *closed[] = { "--socket-mode", "0660", "--socket-group", sgroup, "--admin-group", group, NULL };
	tl_daemon_start(&daemon_, &(struct tl_daemon_opts){ .extra = closed });
	check_socket(daemon_.sock, 0660, socket_gid);
	for (int i = 0; i < daemon_.ndevices; i++)
		check_socket(tl_daemon_worker_socket(&daemon_, i), 0660, socket_gid);
	ASSERT_EQ(tl_wait(tl_fork(nobody_cannot_connect, NULL, 0), 30), 0, "nobody_cannot_connect failed");
	ASSERT_EQ(tl_wait(tl_fork(nobody_is_refused, &socket_gid, 0), 60), 0, "nobody in the socket group: not refused");
	tl_daemon_stop(&daemon_);

	const char *open_[] = { "--socket-mode", "0666", "--admin-group", group, NULL };
	tl_daemon_start(&daemon_, &(struct tl_daemon_opts){ .extra = open_ });
	check_socket(daemon_.sock, 0666, getgid());
	for (int i = 0; i < daemon_.ndevices; i++)
		check_socket(tl_daemon_worker_socket(&daemon_, i), 0666, getgid());
	ASSERT_EQ(tl_wait(tl_fork(nobody_is_refused, NULL, 0), 60), 0, "nobody_is_refused failed");
	ASSERT_EQ(tl_wait(tl_fork(group_member_may, NULL, 0), 60), 0, "group_member_may failed");
	ASSERT_EQ(tl_wait(tl_fork(supplementary_member_may, NULL, 0), 60), 0, "supplementary_member_may failed");
	ASSERT_EQ(tl_wait(tl_fork(dropped_groups_may_not, NULL, 0), 60), 0, "dropped_groups_may_not failed");
	ASSERT_EQ(tl_wait(tl_fork(many_groups_member_may, NULL, 0), 60), 0, "many_groups_member_may failed");
	ASSERT_EQ(tl_wait(tl_fork(many_groups_non_member_may_not, NULL, 0), 60), 0,
		  "many_groups_non_member_may_not failed");
	tl_daemon_stop(&daemon_);
	tl_log("PASS");
	return 0;
}
