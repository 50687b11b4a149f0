/* SPDX-License-Identifier: Apache-2.0 */
/* A flood of cheap calls from a second uid must not take the node down.
 *
 * regend runs under a stand-in for systemd's notify socket with a watchdog
 * (WATCHDOG_USEC 2 s: WATCHDOG=1 every second). As uid `nobody` (the
 * sockets opened to every uid), FLOOD_CONNS connections pipeline
 * io.regen.Device.Generation as fast as their sockets take it and never
 * read a reply; beside them READERS connections of the same uid pipeline
 * the same calls and read their replies, so that regend has work on every
 * turn of its loop. First on the main socket, then on device 0's worker
 * socket. For FLOOD_S seconds meanwhile root, another uid, calls
 * Generation on the main socket and on both worker sockets every 50 ms.
 *
 * - Every device keeps its worker (pid), its generation and its respawn
 *   count: the supervisor's heartbeat never judged a worker on a clock its
 *   own loop let lapse, and the workers answered it.
 * - Each of root's calls is answered within VICTIM_MAX_S: one uid gets its
 *   share of a loop's turns, not all of them.
 * - WATCHDOG=1 keeps coming: no gap over WATCHDOG_GAP_MAX_S.
 * - The supervisor and the worker grow by less than GROWTH_MAX_KB: what
 *   one uid's connections hold (messages received and not handled,
 *   replies not sent) is bounded per uid, not per connection.
 *
 * Last, the supervisor itself is stopped (SIGSTOP) for 3 s, longer than
 * heartbeat_ms (2 s): its workers answered all along and keep their pids
 * and generations once it runs again.
 *
 * Before the loop's budgets (issue 30) one turn served every connection's
 * reads in full and answered every message in them: the supervisor's loop
 * stalled for seconds, the heartbeat took the stall for the workers'
 * silence and killed them all (new generations), and WATCHDOG=1 stopped. */
#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

#include "tests/lib/asserts.h"
#include "tests/lib/daemon.h"
#include "tests/lib/proc.h"
#include "tests/lib/varlink.h"

#define FLOOD_CONNS 64
#define READERS 8
#define READER_WINDOW 256
#define FLOOD_S 8.0
#define VICTIM_MAX_S 1.0
#define WATCHDOG_USEC 2000000ul
#define WATCHDOG_GAP_MAX_S 1.5
#define GROWTH_MAX_KB (64 * 1024)

static const char call[] = "{\"method\":\"io.regen.Device.Generation\",\"parameters\":{}}";

static struct tl_daemon daemon_;
static char notify_dir[32], notify_path[64];
static int notify_fd = -1;

static int connect_nonblocking(const char *path)
{
	struct tl_conn c;

	ASSERT_OK(tl_conn_open(&c, path), "connect %s", path);
	fcntl(c.fd, F_SETFL, fcntl(c.fd, F_GETFL) | O_NONBLOCK);
	return c.fd;
}

/* The calls as one endless stream: a buffer of whole copies, sent from
 * where each connection's stream is. */
static char stream[65536 + sizeof(call)];

static ssize_t send_stream(int fd, uint64_t *offset)
{
	size_t at = (size_t)(*offset % sizeof(call));
	ssize_t n = send(fd, stream + at, sizeof(stream) - sizeof(call), MSG_NOSIGNAL);

	if (n > 0)
		*offset += (uint64_t)n;
	return n;
}

/* Writes calls on every connection as long as its socket takes them; never
 * reads. Runs until killed. */
static int flood_never_reading(void *arg)
{
	const char *path = arg;
	struct pollfd p[FLOOD_CONNS];
	uint64_t offset[FLOOD_CONNS] = { 0 };

	tl_become_nobody(0, false);
	for (int i = 0; i < FLOOD_CONNS; i++)
		p[i] = (struct pollfd){ .fd = connect_nonblocking(path), .events = POLLOUT };
	for (;;) {
		poll(p, FLOOD_CONNS, 100);
		for (int i = 0; i < FLOOD_CONNS; i++)
			if (p[i].revents & POLLOUT)
				send_stream(p[i].fd, &offset[i]);
	}
	return 0;
}

/* Keeps READER_WINDOW calls outstanding on each connection and reads the
 * replies: regend always has work from this uid. Runs until killed. */
static int flood_reading(void *arg)
{
	const char *path = arg;
	struct pollfd p[READERS];
	uint64_t sent[READERS] = { 0 }, answered[READERS] = { 0 };
	char buf[65536];

	tl_become_nobody(0, false);
	for (int i = 0; i < READERS; i++)
		p[i] = (struct pollfd){ .fd = connect_nonblocking(path), .events = POLLIN | POLLOUT };
	for (;;) {
		poll(p, READERS, 100);
		for (int i = 0; i < READERS; i++) {
			ssize_t n;

			while ((n = recv(p[i].fd, buf, sizeof(buf), 0)) > 0)
				for (ssize_t k = 0; k < n; k++)
					answered[i] += buf[k] == '\0';
			if (sent[i] / sizeof(call) < answered[i] + READER_WINDOW)
				send_stream(p[i].fd, &sent[i]);
		}
	}
	return 0;
}

struct snapshot {
	struct tl_device dev[2];
};

static void snapshot(struct snapshot *s)
{
	struct tl_conn c;

	ASSERT_OK(tl_conn_open(&c, daemon_.sock), "connect");
	for (int i = 0; i < 2; i++)
		tl_device_status(&c, i, &s->dev[i]);
	tl_conn_close(&c);
}

static double last_watchdog;
static double watchdog_gap_max;

/* Reads the notifications that came; each WATCHDOG=1 ends a gap. */
static void read_notifications(void)
{
	char buf[4096];
	ssize_t n;

	while ((n = recv(notify_fd, buf, sizeof(buf) - 1, MSG_DONTWAIT)) > 0) {
		buf[n] = '\0';
		if (strstr(buf, "WATCHDOG=1") == NULL)
			continue;
		double now = tl_now();
		if (last_watchdog > 0 && now - last_watchdog > watchdog_gap_max)
			watchdog_gap_max = now - last_watchdog;
		last_watchdog = now;
	}
}

static double timed_generation(struct tl_conn *c, const char *where)
{
	struct tl_reply r;
	double t0 = tl_now();

	ASSERT_EQ(tl_send(c, "io.regen.Device.Generation", NULL, 0, NULL), 0, "send to %s", where);
	int e = tl_recv(c, &r, VICTIM_MAX_S * 10);
	double took = tl_now() - t0;
	ASSERT_EQ(e, 0, "another uid's Generation on %s: no reply within %.0f s (%s)", where, VICTIM_MAX_S * 10,
		  strerror(-e));
	ASSERT_REPLY_OK(&r, "Generation on %s", where);
	tl_reply_finish(&r);
	return took;
}

static long rss_kb(pid_t pid)
{
	struct tl_proc p;

	tl_proc_read(pid, &p);
	return p.asan ? 0 : p.rss_kb;
}

static void flood(const char *path, const char *what)
{
	struct snapshot before, after;
	struct tl_conn victim[3];
	const char *where[3] = { "the main socket", "device 0's worker socket", "device 1's worker socket" };
	double worst[3] = { 0 };
	long calls = 0;
	pid_t pids[2];

	snapshot(&before);
	ASSERT_OK(tl_conn_open(&victim[0], daemon_.sock), "connect");
	ASSERT_OK(tl_conn_open(&victim[1], tl_daemon_worker_socket(&daemon_, 0)), "connect");
	ASSERT_OK(tl_conn_open(&victim[2], tl_daemon_worker_socket(&daemon_, 1)), "connect");
	pid_t judged = strcmp(path, daemon_.sock) == 0 ? daemon_.pid : (pid_t)before.dev[0].worker_pid;
	long rss0 = rss_kb(judged);

	read_notifications();
	watchdog_gap_max = 0;
	pids[0] = tl_fork(flood_never_reading, (void *)path, 0);
	pids[1] = tl_fork(flood_reading, (void *)path, 0);
	double t0 = tl_now();
	while (tl_now() - t0 < FLOOD_S) {
		for (int i = 0; i < 3; i++) {
			double took = timed_generation(&victim[i], where[i]);
			if (took > worst[i])
				worst[i] = took;
			calls++;
		}
		read_notifications();
		usleep(50000);
	}
	long rss1 = rss_kb(judged);
	read_notifications();
	if (tl_now() - last_watchdog > watchdog_gap_max)
		watchdog_gap_max = tl_now() - last_watchdog;
	for (int i = 0; i < 2; i++) {
		kill(pids[i], SIGKILL);
		tl_wait(pids[i], 10);
	}
	snapshot(&after);
	tl_log("flood of %s by uid nobody (%d connections never reading, %d reading) for %.0f s: another uid's "
	       "%ld calls answered within %.1f / %.1f / %.1f ms (main / worker 0 / worker 1); longest WATCHDOG=1 gap "
	       "%.2f s; %s RSS %ld -> %ld kB",
	       what, FLOOD_CONNS, READERS, FLOOD_S, calls, worst[0] * 1e3, worst[1] * 1e3, worst[2] * 1e3,
	       watchdog_gap_max, judged == daemon_.pid ? "supervisor" : "worker", rss0, rss1);
	for (int i = 0; i < 2; i++) {
		ASSERT_EQ(after.dev[i].worker_pid, before.dev[i].worker_pid, "device %d's worker was replaced under a flood "
			  "of %s (state %s)", i, what, after.dev[i].state);
		ASSERT_EQ(after.dev[i].generation, before.dev[i].generation, "device %d's generation changed under a flood of %s",
			  i, what);
		ASSERT_EQ(after.dev[i].respawns, before.dev[i].respawns, "device %d respawned under a flood of %s", i, what);
	}
	for (int i = 0; i < 3; i++)
		ASSERT_DOUBLE_LT(worst[i], tl_timeout(VICTIM_MAX_S), "another uid waited %.2f s for Generation on %s during a flood of %s",
				 worst[i], where[i], what);
	ASSERT_DOUBLE_LT(watchdog_gap_max, WATCHDOG_GAP_MAX_S, "no WATCHDOG=1 for %.2f s during a flood of %s",
			 watchdog_gap_max, what);
	ASSERT_LT(rss1 - rss0, GROWTH_MAX_KB, "a flood of %s grew the %s by %ld kB", what,
		  judged == daemon_.pid ? "supervisor" : "worker", rss1 - rss0);
	for (int i = 0; i < 3; i++)
		tl_conn_close(&victim[i]);
}

/* The supervisor itself stalls (SIGSTOP) for longer than heartbeat_ms:
 * its workers answered all along, and must not be judged on the time the
 * supervisor was not there to hear them. */
static void stalled_supervisor(void)
{
	struct snapshot before, after;

	snapshot(&before);
	ASSERT_EQ(kill(daemon_.pid, SIGSTOP), 0, "SIGSTOP");
	usleep(3000000);
	ASSERT_EQ(kill(daemon_.pid, SIGCONT), 0, "SIGCONT");
	/* Past a heartbeat's verdict after the stall. */
	usleep(1500000);
	snapshot(&after);
	tl_log("the supervisor stopped for 3 s (heartbeat_ms 2000): workers %lld, %lld -> %lld, %lld", (long long)before.dev[0].worker_pid,
	       (long long)before.dev[1].worker_pid, (long long)after.dev[0].worker_pid, (long long)after.dev[1].worker_pid);
	for (int i = 0; i < 2; i++) {
		ASSERT_EQ(after.dev[i].worker_pid, before.dev[i].worker_pid,
			  "device %d's worker was killed after the supervisor itself stalled (state %s)", i, after.dev[i].state);
		ASSERT_EQ(after.dev[i].generation, before.dev[i].generation,
			  "device %d's generation changed after the supervisor itself stalled", i);
	}
}

int main(void)
{
	static const char *const extra[] = { "--socket-mode", "0666", NULL };
	struct sockaddr_un addr = { .sun_family = AF_UNIX };

	tl_init(240);
	if (geteuid() != 0)
		tl_skip("needs root, to flood as a second uid");
	for (size_t i = 0; i < sizeof(stream); i++)
		stream[i] = call[i % sizeof(call)];
	snprintf(notify_dir, sizeof(notify_dir), "/tmp/regen-notify-XXXXXX");
	ASSERT_NOT_NULL(mkdtemp(notify_dir), "mkdtemp: %s", strerror(errno));
	snprintf(notify_path, sizeof(notify_path), "%s/notify", notify_dir);
	snprintf(addr.sun_path, sizeof(addr.sun_path), "%s", notify_path);
	notify_fd = socket(AF_UNIX, SOCK_DGRAM | SOCK_CLOEXEC, 0);
	ASSERT(notify_fd >= 0 && bind(notify_fd, (struct sockaddr *)&addr, sizeof(addr)) == 0, "bind %s: %s",
	       notify_path, strerror(errno));
	tl_daemon_start(&daemon_, &(struct tl_daemon_opts){
		.extra = extra, .debug = "W", .notify_socket = notify_path, .watchdog_usec = WATCHDOG_USEC });
	flood(daemon_.sock, "the main socket");
	flood(tl_daemon_worker_socket(&daemon_, 0), "device 0's worker socket");
	stalled_supervisor();
	unlink(notify_path);
	rmdir(notify_dir);
	tl_log("PASS");
	return 0;
}
