/* SPDX-License-Identifier: Apache-2.0 */
#include <errno.h>
#include <signal.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <unistd.h>
#include "daemon/dispatch.h"
#include "daemon/log.h"
#include "daemon/supervisor/worker_process.h"
#include "daemon/worker/worker.h"
#include "proto/comm.h"
#include "proto/errors.h"
#include "proto/frame.h"
#include "proto/idl.h"
#include "proto/params.h"

/* The worker's end of the control channel, and the programs it defines
 * before it serves: stdio[3] and stdio[4] below. */
#define WORKER_CTL_FD 3
#define WORKER_PROGRAMS_FD 4

void rd_sv_worker_init(struct rd_sv_worker *w, uv_loop_t *loop, int device, const struct rd_sv_worker_events *events,
		       void *data)
{
	memset(w, 0, sizeof(*w));
	w->loop = loop;
	w->device = device;
	w->events = events;
	w->data = data;
}

/* ---- What the worker calls: Ready, Faulted, CannotServe, CommOwner, KeepProgram, ForgetProgram ---- */

static void ctl_ready(struct rd_call *call)
{
	struct rd_sv_worker *w = call->conn->data;
	cJSON *p = call->msg.params;
	struct rd_sv_worker_ready ready = { 0 };
	struct rp_error err = { 0 };

	/* The worker is ours: what it leaves out stays empty or zero. */
	rp_params_string(p, "backend", 15, "", &ready.backend, &err);
	rp_params_string(p, "worker_socket", 107, "", &ready.worker_socket, &err);
	rp_params_uint(p, "memory_used", UINT64_MAX, 0, &ready.memory_used, &err);
	rp_params_uint(p, "memory_baseline", UINT64_MAX, 0, &ready.memory_baseline, &err);
	rp_error_clear(&err);
	ready.health = cJSON_GetObjectItemCaseSensitive(p, "health");
	ready.sharing = cJSON_GetObjectItemCaseSensitive(p, "sharing");
	if (!ready.backend)
		ready.backend = "";
	if (!ready.worker_socket)
		ready.worker_socket = "";
	/* The strings live in the call: the owner copies them before it ends. */
	w->events->ready(w->data, &ready);
	rd_call_reply(call, NULL, false);
}

static void ctl_faulted(struct rd_call *call)
{
	static const char *const kinds[] = { "lost", "hung", "failed", NULL };
	struct rd_sv_worker *w = call->conn->data;
	const char *reason = NULL;
	struct rp_error err = { 0 };
	int kind = RD_SV_FAULT_LOST;
	uint64_t uid;
	int has_uid;

	rp_params_string(call->msg.params, "reason", 200, "device fault", &reason, &err);
	rp_error_clear(&err);
	rp_params_enum(call->msg.params, "kind", kinds, RD_SV_FAULT_LOST, &kind, &err);
	rp_error_clear(&err);
	has_uid = rp_params_uint(call->msg.params, "uid", UINT32_MAX, 0, &uid, &err);
	rp_error_clear(&err);
	w->events->faulted(w->data, (enum rd_sv_fault)kind, reason ? reason : "device fault",
			   cJSON_GetObjectItemCaseSensitive(call->msg.params, "health"), has_uid == 0 ? (int64_t)uid : -1);
	rd_call_reply(call, NULL, false);
}

static void ctl_cannot_serve(struct rd_call *call)
{
	static const char *const kinds[] = { "unsupported", "failed", NULL };
	struct rd_sv_worker *w = call->conn->data;
	const char *reason = NULL;
	struct rp_error err = { 0 };
	int kind = 0;

	rp_params_string(call->msg.params, "reason", 300, "", &reason, &err);
	rp_error_clear(&err);
	rp_params_enum(call->msg.params, "kind", kinds, 0, &kind, &err);
	rp_error_clear(&err);
	if (w->events->cannot_serve && reason && reason[0])
		w->events->cannot_serve(w->data, kind == 0 ? RD_SV_EXIT_UNSUPPORTED : RD_SV_EXIT_DEVICE_FAILED, reason,
					cJSON_GetObjectItemCaseSensitive(call->msg.params, "health"));
	rd_call_reply(call, NULL, false);
}

static void ctl_comm_owner(struct rd_call *call)
{
	struct rd_sv_worker *w = call->conn->data;
	unsigned char id[RP_COMM_ID_SIZE];
	struct rp_error err = { 0 };
	const char *hex = NULL;
	uint64_t uid;
	cJSON *reply;

	if (rp_params_string(call->msg.params, "unique_id", RP_COMM_ID_HEX_LEN, NULL, &hex, &err) < 0 ||
	    rp_comm_id_from_hex(hex, id) < 0 || rp_params_uint(call->msg.params, "uid", UINT32_MAX, 0, &uid, &err) != 0) {
		rp_error_clear(&err);
		rd_call_failf(call, RP_ERR_INVALID_PARAMETER, "CommOwner needs a unique_id and a uid");
		return;
	}
	if (!w->events->comm_owner) {
		rd_call_failf(call, RP_ERR_NOT_PERMITTED, "the supervisor keeps no communicator ids");
		return;
	}
	reply = cJSON_CreateObject();
	cJSON_AddNumberToObject(reply, "uid", (double)w->events->comm_owner(w->data, (uid_t)uid, id));
	rd_call_reply(call, reply, false);
}

/* A 64-bit number the worker sends as decimal text (past 2^53, where a
 * JSON number would round). */
static uint64_t decimal(const cJSON *params, const char *name)
{
	const char *text = cJSON_GetStringValue(cJSON_GetObjectItemCaseSensitive(params, name));
	char *end;

	if (!text || !*text)
		return 0;
	errno = 0;
	unsigned long long v = strtoull(text, &end, 10);
	return errno || *end ? 0 : (uint64_t)v;
}

/* The Define call's text, from the sealed memfd the worker sent: at most
 * a message's size, no NUL inside. NULL when it is not that. */
static char *read_message(int fd, size_t *len)
{
	struct stat st;
	char *text;

	if (fd < 0 || fstat(fd, &st) < 0 || st.st_size <= 0 || (uint64_t)st.st_size > RP_MESSAGE_MAX)
		return NULL;
	text = malloc((size_t)st.st_size + 1);
	if (!text)
		return NULL;
	if (pread(fd, text, (size_t)st.st_size, 0) != st.st_size || memchr(text, '\0', (size_t)st.st_size)) {
		free(text);
		return NULL;
	}
	text[st.st_size] = '\0';
	*len = (size_t)st.st_size;
	return text;
}

static void ctl_keep_program(struct rd_call *call)
{
	struct rd_sv_worker *w = call->conn->data;
	const cJSON *p = call->msg.params;
	struct rd_sv_program_kept kept = { 0 };
	struct rp_error err = { 0 };
	uint64_t pid = 0, uid = 0, gid = 0, nodes = 0;
	char *message;

	rp_params_string(p, "program", RP_ID_MAX - 1, NULL, &kept.id, &err);
	rp_params_uint(p, "pid", INT32_MAX, 0, &pid, &err);
	rp_params_uint(p, "uid", UINT32_MAX, 0, &uid, &err);
	rp_params_uint(p, "gid", UINT32_MAX, 0, &gid, &err);
	rp_params_uint(p, "nodes", UINT32_MAX, 0, &nodes, &err);
	message = read_message(call->raw.nfds == 1 ? call->raw.fds[0] : -1, &kept.len);
	if (err.name || !kept.id || !message || pid == 0) {
		rd_warn("lifecycle", w->device, 0, 0, "a KeepProgram without its program, owner or message: not kept");
		rp_error_clear(&err);
		free(message);
		rd_call_reply(call, NULL, false);
		return;
	}
	kept.owner = (struct rd_sv_program_owner){ (pid_t)pid, (uid_t)uid, (gid_t)gid, decimal(p, "start_time"),
						   decimal(p, "pidfs_inode") };
	kept.nodes = (unsigned)nodes;
	kept.message = message;
	if (w->events->program_kept)
		w->events->program_kept(w->data, &kept);
	free(message);
	rd_call_reply(call, NULL, false);
}

static void ctl_forget_program(struct rd_call *call)
{
	struct rd_sv_worker *w = call->conn->data;
	const char *id = cJSON_GetStringValue(cJSON_GetObjectItemCaseSensitive(call->msg.params, "program"));

	if (id && w->events->program_forgotten)
		w->events->program_forgotten(w->data, id);
	rd_call_reply(call, NULL, false);
}

static const struct rd_method ctl_methods[] = {
	{ "io.regen.Worker.Ready", ctl_ready },
	{ "io.regen.Worker.CommOwner", ctl_comm_owner },
	{ "io.regen.Worker.Faulted", ctl_faulted },
	{ "io.regen.Worker.CannotServe", ctl_cannot_serve },
	{ "io.regen.Worker.KeepProgram", ctl_keep_program, .takes_fds = true },
	{ "io.regen.Worker.ForgetProgram", ctl_forget_program },
	{ NULL },
};
static const struct rd_endpoint ctl_endpoint = { ctl_methods, rp_control_interfaces };

static void ctl_on_call(struct rd_conn *conn, struct rd_call *call)
{
	rd_dispatch(&ctl_endpoint, call);
}

static void ctl_on_close(struct rd_conn *conn)
{
	struct rd_sv_worker *w = conn->data;

	if (w->ctl == conn)
		w->ctl = NULL;
}

static const struct rd_conn_ops ctl_ops = { ctl_on_call, ctl_on_close };

/* ---- The process ---- */

static void free_process(uv_handle_t *h)
{
	free(h);
}

static void on_process_exit(uv_process_t *proc, int64_t status, int signal)
{
	struct rd_sv_worker *w = proc->data;
	enum rd_sv_exit how = RD_SV_EXIT_OTHER;
	char why[96];

	if (w->proc == proc)
		w->proc = NULL;
	uv_close((uv_handle_t *)proc, free_process);
	/* What it wrote before it died is heard first (a KeepProgram whose
	 * Define its caller saw answered). */
	if (w->ctl)
		rd_conn_read_rest(w->ctl);
	if (w->ctl)
		rd_conn_close(w->ctl);
	if (!signal && status == RD_WORKER_EXIT_DEVICE_FAILED)
		how = RD_SV_EXIT_DEVICE_FAILED;
	else if (!signal && status == RD_WORKER_EXIT_UNSUPPORTED)
		how = RD_SV_EXIT_UNSUPPORTED;
	if (signal)
		snprintf(why, sizeof(why), "worker exited (signal %d)", signal);
	else if (how == RD_SV_EXIT_DEVICE_FAILED)
		snprintf(why, sizeof(why), "worker exited: its device is unusable");
	else if (how == RD_SV_EXIT_UNSUPPORTED)
		snprintf(why, sizeof(why), "worker exited: the node's software cannot drive its device");
	else
		snprintf(why, sizeof(why), "worker exited (status %lld)", (long long)status);
	w->events->exited(w->data, why, how);
}

int rd_sv_worker_spawn(struct rd_sv_worker *w, const char *exe, const struct rd_options *wopts, int programs_fd)
{
	struct rd_options o = *wopts;
	struct rd_argv args;
	uv_process_t *proc;
	int pair[2], r;

	o.ctl_fd = WORKER_CTL_FD;
	o.programs_fd = programs_fd >= 0 ? WORKER_PROGRAMS_FD : -1;
	r = rd_options_worker_argv(&o, exe, &args);
	if (r < 0) {
		rd_err("lifecycle", w->device, 0, 0, "the worker's command line does not fit");
		return r;
	}
	if (socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0, pair) < 0) {
		r = -errno;
		rd_err("lifecycle", w->device, 0, 0, "socketpair: %s", strerror(-r));
		return r;
	}
	uv_stdio_container_t stdio[WORKER_PROGRAMS_FD + 1] = {
		{ .flags = UV_IGNORE },
		{ .flags = UV_INHERIT_FD, .data.fd = STDOUT_FILENO },
		{ .flags = UV_INHERIT_FD, .data.fd = STDERR_FILENO },
		{ .flags = UV_INHERIT_FD, .data.fd = pair[1] },
		{ .flags = UV_INHERIT_FD, .data.fd = programs_fd },
	};
	uv_process_options_t po = {
		.exit_cb = on_process_exit,
		.file = exe,
		.args = args.argv,
		.stdio_count = programs_fd >= 0 ? WORKER_PROGRAMS_FD + 1 : WORKER_CTL_FD + 1,
		.stdio = stdio,
	};
	proc = calloc(1, sizeof(*proc));
	if (!proc) {
		close(pair[0]);
		close(pair[1]);
		return -ENOMEM;
	}
	proc->data = w;
	r = uv_spawn(w->loop, proc, &po);
	close(pair[1]);
	if (r < 0) {
		rd_err("lifecycle", w->device, 0, 0, "cannot start worker: %s", uv_strerror(r));
		close(pair[0]);
		uv_close((uv_handle_t *)proc, free_process);
		return r;
	}
	w->proc = proc;
	w->pid = proc->pid;
	if (rd_conn_new(w->loop, pair[0], &ctl_ops, w, &w->ctl) < 0) {
		/* A worker nobody can talk to is no worker: its exit brings the next. */
		w->ctl = NULL;
		rd_warn("lifecycle", w->device, 0, 0, "killing worker %d: cannot watch its control channel", w->pid);
		uv_process_kill(proc, SIGKILL);
		return 0;
	}
	w->ctl->admin = true;
	rd_conn_make_control(w->ctl);
	rd_debug("lifecycle", w->device, 0, 0, "started worker %d", w->pid);
	return 0;
}

bool rd_sv_worker_running(const struct rd_sv_worker *w)
{
	return w->proc != NULL;
}

void rd_sv_worker_kill(struct rd_sv_worker *w, int signum)
{
	if (w->proc)
		uv_process_kill(w->proc, signum);
}

int rd_sv_worker_call(struct rd_sv_worker *w, const char *method, cJSON *params, bool oneway, rd_reply_cb cb,
		      void *userdata)
{
	if (!w->ctl) {
		cJSON_Delete(params);
		return -ENOTCONN;
	}
	return rd_conn_call(w->ctl, method, params, oneway, cb, userdata);
}
