/* SPDX-License-Identifier: Apache-2.0 */
#include "regen-config.h"
#include <errno.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <signal.h>
#include <string.h>
#include <unistd.h>
#include "daemon/log.h"
#include "daemon/notify.h"
#include "daemon/socket_dir.h"
#include "daemon/supervisor/generations.h"
#include "daemon/supervisor/methods.h"
#include "daemon/supervisor/session.h"
#include "daemon/supervisor/supervisor.h"

/* What a worker still draining at shutdown gets beyond the drain deadline
 * before SIGKILL. */
#define STOP_GRACE_MS 2000

/* ---- What the devices report ---- */

/* Before any client hears of a new generation, the file has it: a regend
 * started after this one begins past every generation a client saw. */
static void save_generations(struct rd_supervisor *sv)
{
	uint64_t g[RD_DEVICES_MAX];

	for (int i = 0; i < sv->ndevices; i++)
		g[i] = sv->devices[i].generation;
	rd_sv_generations_save(sv->socket_dir, rd_socket_dir_name(sv->opts.socket_path), sv->watch.epoch, g, sv->ndevices);
}

/* Every transition: a bump takes the node's epoch with it (and every worker
 * hears the new epoch); each watcher hears the transition once. */
static void on_state_changed(struct rd_sv_device *d, bool bumped, void *data)
{
	struct rd_supervisor *sv = data;

	if (bumped) {
		rd_sv_watch_bump(&sv->watch);
		save_generations(sv);
		for (int i = 0; i < sv->ndevices; i++)
			rd_sv_device_tell_epoch(&sv->devices[i]);
	}
	rd_sv_watch_announce(&sv->watch, d);
	rd_notify_statusf("%d device(s); device %d %s, generation %llu", sv->ndevices, d->index, rp_state_name(d->state),
			  (unsigned long long)d->generation);
}

/* READY=1 once the main socket serves and every device's start is over:
 * each device serves, or Status shows why it does not (a worker that
 * cannot start, a failed GPU) while it is tried again. Waiting until every
 * device serves held READY=1 back for as long as one could not: systemd
 * killed regend at its start timeout and restarted it, in a loop, the
 * devices that served with it. The STATUS= line beside it names the
 * devices that do not serve. */
static void on_start_settled(struct rd_sv_device *d, void *data)
{
	struct rd_supervisor *sv = data;
	const struct rd_sv_device *down = NULL;
	int ready = 0;

	if (sv->stopping)
		return;
	for (int i = 0; i < sv->ndevices; i++) {
		if (!sv->devices[i].start_settled)
			return;
		if (sv->devices[i].state == RP_STATE_READY)
			ready++;
		else if (!down)
			down = &sv->devices[i];
	}
	if (down) {
		rd_warn("supervisor", -1, 0, 0, "ready with %d of %d device(s) serving; device %d is %s: %s", ready,
			sv->ndevices, down->index, rp_state_name(down->state), down->reason);
		rd_notify_statusf("%d of %d device(s) ready; device %d %s: %.150s%s", ready, sv->ndevices, down->index,
				  rp_state_name(down->state), down->reason,
				  ready + 1 < sv->ndevices ? " (and more)" : "");
	} else {
		rd_notify_statusf("%d of %d device(s) ready", ready, sv->ndevices);
	}
	rd_notify_ready();
}

/* A call of uid's hung d: a strike, and its compute calls refused on every
 * device for the cool-down (daemon/hang_charge.h). */
static void on_hang_of_uid(struct rd_sv_device *d, uid_t uid, const char *reason, void *data)
{
	struct rd_supervisor *sv = data;
	const struct rd_hang_charge *c = rd_hang_charge(&sv->hang_charges, uid, sv->opts.hang_cooldown_ms, uv_hrtime());

	if (!c)
		return;
	rd_warn("lifecycle", d->index, d->generation, 0,
		"uid %u charged with the hang (%s): strike %u, its compute calls refused on every device for %llu ms",
		(unsigned)uid, reason, c->strikes, (unsigned long long)c->cooldown_ms);
	for (int i = 0; i < sv->ndevices; i++)
		rd_sv_device_tell_charges(&sv->devices[i]);
}

static const struct rd_sv_device_events device_events = {
	.state_changed = on_state_changed,
	.start_settled = on_start_settled,
	.request_finished = rd_sv_request_finished,
	.hang_of_uid = on_hang_of_uid,
};

/* ---- Signals ---- */

static void on_stop_deadline(uv_timer_t *t)
{
	struct rd_supervisor *sv = t->data;

	for (int i = 0; i < sv->ndevices; i++)
		rd_sv_device_kill(&sv->devices[i], "still running after the drain deadline at shutdown");
	uv_close((uv_handle_t *)t, NULL);
}

static void on_stop_signal(uv_signal_t *sig, int signum)
{
	struct rd_supervisor *sv = sig->data;

	if (sv->stopping)
		return;
	sv->stopping = true;
	rd_info("supervisor", -1, 0, 0, "signal %d: stopping", signum);
	rd_notify_stopping();
	rd_listener_close(&sv->listener);
	/* Every call still waiting gets its answer before the sessions go;
	 * each worker drains on SIGTERM and exits. */
	for (int i = 0; i < sv->ndevices; i++)
		rd_sv_device_stop(&sv->devices[i], "regend is stopping");
	rd_sv_watch_end(&sv->watch);
	/* Before the sessions: their close must not start the leases of
	 * the sets they hold in what the fd store keeps for the next start
	 * (a restart is not their holders' end). */
	rd_sv_keep_close(&sv->keep);
	rd_sv_sessions_close(sv);
	uv_close((uv_handle_t *)&sv->sigterm, NULL);
	uv_close((uv_handle_t *)&sv->sigint, NULL);
	uv_close((uv_handle_t *)&sv->sighup, NULL);
	rd_notify_close();
	/* A worker hung in a kernel never finishes its drain: it gets the
	 * drain deadline and a grace period, then SIGKILL. */
	uv_timer_init(sv->loop, &sv->stop_timer);
	sv->stop_timer.data = sv;
	uv_timer_start(&sv->stop_timer, on_stop_deadline, (uint64_t)sv->opts.drain_deadline_ms + STOP_GRACE_MS, 0);
	uv_unref((uv_handle_t *)&sv->stop_timer);
}

/* Applies what the option table marks reloadable; the rest waits for a
 * restart of regend. */
static void on_sighup(uv_signal_t *sig, int signum)
{
	struct rd_supervisor *sv = sig->data;
	struct rd_options fresh;
	char restart_only[256];

	if (rd_options_load(&fresh, sv->argc, sv->argv) != 0) {
		rd_warn("supervisor", -1, 0, 0, "SIGHUP: configuration has errors; keeping the running one");
		return;
	}
	rd_options_reload(&sv->opts, &fresh, restart_only, sizeof(restart_only));
	rd_log_set_default_level(sv->opts.log_level);
	/* Admin rights are decided per connection, at accept: re-decide. */
	rd_sv_sessions_readmit(sv);
	/* A worker applies some options itself (its socket's connection limit,
	 * its stop's drain deadline): the running ones are told; a worker
	 * started from now on has them on its command line. */
	for (int i = 0; i < sv->ndevices; i++)
		rd_sv_device_reload(&sv->devices[i]);
	if (restart_only[0])
		rd_warn("supervisor", -1, 0, 0, "SIGHUP: %s change only with a restart of regend", restart_only);
	rd_info("supervisor", -1, 0, 0, "SIGHUP: reloaded %s (log level %d, drain deadline %u ms, admin group '%s')",
		fresh.config_path[0] ? fresh.config_path : "(no file)", sv->opts.log_level, sv->opts.drain_deadline_ms,
		sv->opts.admin_group);
}

static void start_signal(struct rd_supervisor *sv, uv_signal_t *sig, uv_signal_cb cb, int signum)
{
	uv_signal_init(sv->loop, sig);
	sig->data = sv;
	uv_signal_start(sig, cb, signum);
}

/* ---- Start ---- */

static int count_devices(const struct rd_options *opts, const char **backend)
{
	*backend = opts->backend;
	if (strcmp(opts->backend, "auto") == 0) {
#if REGEN_HAVE_CUDA
		*backend = access("/dev/nvidiactl", F_OK) == 0 ? "cuda" : "host";
#else
		*backend = "host";
#endif
	}
	if (opts->devices > 0)
		return opts->devices;
	if (strcmp(*backend, "host") == 0)
		return 1;
	/* Without touching CUDA in this process: count the device nodes. */
	int n = 0;
	for (int i = 0; i < RD_DEVICES_MAX; i++) {
		char path[32];
		snprintf(path, sizeof(path), "/dev/nvidia%d", i);
		if (access(path, F_OK) == 0)
			n++;
	}
	return n ? n : 1;
}

static void take_activated_path(struct rd_supervisor *sv, int fd)
{
	struct sockaddr_un addr;
	socklen_t len = sizeof(addr);

	memset(&addr, 0, sizeof(addr));
	if (getsockname(fd, (struct sockaddr *)&addr, &len) < 0 || addr.sun_family != AF_UNIX || !addr.sun_path[0])
		return;
	addr.sun_path[sizeof(addr.sun_path) - 1] = '\0';
	if (strcmp(addr.sun_path, sv->opts.socket_path) != 0) {
		rd_warn("supervisor", -1, 0, 0, "the activated socket is %s, not %s as configured: worker sockets go beside it",
			addr.sun_path, sv->opts.socket_path);
		snprintf(sv->opts.socket_path, sizeof(sv->opts.socket_path), "%s", addr.sun_path);
	}
}

int rd_supervisor_run(const struct rd_options *opts, struct rd_passed_fds *passed, int argc, char **argv)
{
	/* The one supervisor: its handles live as long as the loop runs. */
	static struct rd_supervisor supervisor;
	struct rd_supervisor *sv = &supervisor;
	const char *backend;
	ssize_t len;
	int listen_fd, r;

	memset(sv, 0, sizeof(*sv));
	sv->opts = *opts;
	opts = &sv->opts;
	sv->argc = argc;
	sv->argv = argv;
	sv->loop = uv_default_loop();
	rd_sv_watch_init(&sv->watch);
	rd_sv_keep_init(&sv->keep, sv->loop, &sv->opts);
	len = readlink("/proc/self/exe", sv->exe, sizeof(sv->exe) - 1);
	if (len <= 0) {
		rd_err("supervisor", -1, 0, 0, "cannot find my own executable: %s", strerror(errno));
		return 1;
	}
	sv->exe[len] = '\0';
	signal(SIGPIPE, SIG_IGN);

	/* Socket activation: the socket is where the socket unit put it, which
	 * may not be where the configuration says. Workers put theirs beside
	 * the one clients connect to. */
	listen_fd = rd_passed_fds_listen_fd(passed);
	if (listen_fd >= 0)
		take_activated_path(sv, listen_fd);
	sv->ndevices = count_devices(opts, &backend);
#if !REGEN_HAVE_CUDA
	if (strcmp(backend, "cuda") == 0) {
		rd_err("supervisor", -1, 0, 0, "this regend was built without CUDA; use --backend host");
		return 1;
	}
#endif
	/* Its sockets and state go in a directory nobody else can change, or
	 * regend does not start. */
	char why[512];
	sv->socket_dir = rd_socket_dir_open(opts->socket_path, why, sizeof(why));
	if (sv->socket_dir < 0) {
		rd_err("supervisor", -1, 0, 0, "refusing to start: %s", why);
		return 1;
	}
	sv->device_env = (struct rd_sv_device_env){
		.loop = sv->loop,
		.socket_dir = sv->socket_dir,
		.exe = sv->exe,
		.opts = &sv->opts,
		.epoch = &sv->watch.epoch,
		.stopping = &sv->stopping,
		.hang_charges = &sv->hang_charges,
		.comm_owners = &sv->comm_owners,
		.events = &device_events,
		.data = sv,
	};
	uint64_t generations[RD_DEVICES_MAX];
	for (int i = 0; i < sv->ndevices; i++) {
		rd_sv_device_init(&sv->devices[i], &sv->device_env, i, backend);
		generations[i] = sv->devices[i].generation;
	}
	if (rd_sv_generations_load(sv->socket_dir, rd_socket_dir_name(sv->opts.socket_path), &sv->watch.epoch,
				   generations, sv->ndevices, why, sizeof(why)) < 0) {
		rd_err("supervisor", -1, 0, 0, "refusing to start: %s", why);
		return 1;
	}
	for (int i = 0; i < sv->ndevices; i++)
		sv->devices[i].generation = generations[i];
	/* What regend kept for ranks before its restart, before anyone can
	 * ask for it. */
	rd_sv_keep_restore(&sv->keep, passed, sv->ndevices);
	rd_passed_fds_close(passed);
	r = rd_listener_open(&sv->listener, sv->loop, sv->socket_dir, opts->socket_path, opts->socket_mode,
			     opts->have_socket_gid ? opts->socket_gid : (gid_t)-1, listen_fd, rd_sv_session_accept, sv);
	if (r < 0) {
		rd_err("supervisor", -1, 0, 0, "cannot listen on %s: %s", opts->socket_path, strerror(-r));
		return 1;
	}
	rd_info("supervisor", -1, 0, 0, "listening on %s; %d %s device(s)", opts->socket_path, sv->ndevices, backend);

	save_generations(sv);
	for (int i = 0; i < sv->ndevices; i++)
		rd_sv_device_start(&sv->devices[i]);
	start_signal(sv, &sv->sigterm, on_stop_signal, SIGTERM);
	start_signal(sv, &sv->sigint, on_stop_signal, SIGINT);
	start_signal(sv, &sv->sighup, on_sighup, SIGHUP);
	rd_notify_watchdog_start(sv->loop);

	uv_run(sv->loop, UV_RUN_DEFAULT);
	rd_info("supervisor", -1, 0, 0, "stopped");
	return 0;
}
