#include "regen-config.h"
#include <errno.h>
#include <pthread.h>
#include <signal.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <unistd.h>
#include <uv.h>
#include "daemon/backend/backend.h"
#include "daemon/conn.h"
#include "daemon/dispatch.h"
#include "daemon/listen.h"
#include "daemon/log.h"
#include "daemon/worker/objects.h"
#include "proto/errors.h"
#include "proto/params.h"
#include "daemon/worker/worker.h"

enum wk_state { WK_READY = 0, WK_DRAINING, WK_LOST, WK_STOPPING };

/* One connection to the worker socket: one lane. */
struct wk_session {
	struct wk_session *next;
	struct rd_conn *conn;
	struct rd_client *client;
	struct rd_lane *lane;
	unsigned in_flight;
	bool closed;
};

static struct {
	uv_loop_t *loop;
	const struct rd_options *opts;
	struct rd_device dev;
	struct rd_objects objects;
	struct rd_listener listener;
	struct rd_conn *ctl;
	enum wk_state state;
	unsigned in_flight;
	unsigned sessions;
	struct wk_session *session_list;
	unsigned next_lane;
	struct rd_call *drain_call;
	uv_timer_t drain_timer;
	uv_timer_t stop_timer;
	uv_signal_t sigterm;
	/* Completions and faults posted from backend threads. */
	uv_async_t wakeup;
	pthread_mutex_t lock;
	struct rd_op *done_head, *done_tail;
	char fault_reason[128];
	bool fault_pending, fault_reported;
	char socket_path[108];
	uint64_t epoch;          /* the node's, as the supervisor last said: answered in Generation */
} wk;

#define GEN() ((uint64_t)atomic_load(&wk.dev.generation))

/* ---- Completions from backend threads ---- */

static void post_completion(struct rd_device *dev, struct rd_op *op)
{
	pthread_mutex_lock(&wk.lock);
	op->next = NULL;
	if (wk.done_tail)
		wk.done_tail->next = op;
	else
		wk.done_head = op;
	wk.done_tail = op;
	pthread_mutex_unlock(&wk.lock);
	uv_async_send(&wk.wakeup);
}

static void on_fault(struct rd_device *dev, const char *reason)
{
	pthread_mutex_lock(&wk.lock);
	if (!wk.fault_pending && !wk.fault_reported) {
		snprintf(wk.fault_reason, sizeof(wk.fault_reason), "%s", reason);
		wk.fault_pending = true;
	}
	pthread_mutex_unlock(&wk.lock);
	uv_async_send(&wk.wakeup);
}

static void maybe_finish_drain(void);
static void maybe_stop(void);

static void on_wakeup(uv_async_t *a)
{
	struct rd_op *op;
	char reason[128];
	bool fault = false;

	pthread_mutex_lock(&wk.lock);
	op = wk.done_head;
	wk.done_head = wk.done_tail = NULL;
	if (wk.fault_pending) {
		wk.fault_pending = false;
		wk.fault_reported = true;
		fault = true;
		snprintf(reason, sizeof(reason), "%s", wk.fault_reason);
	}
	pthread_mutex_unlock(&wk.lock);

	if (fault) {
		/* New work fails fast until the supervisor resets us. */
		if (wk.state == WK_READY || wk.state == WK_DRAINING)
			wk.state = WK_LOST;
		rd_err("worker", wk.dev.index, GEN(), 0, "device fault: %s", reason);
		if (wk.ctl) {
			cJSON *p = cJSON_CreateObject();
			cJSON_AddStringToObject(p, "reason", reason);
			rd_conn_call(wk.ctl, "io.regen.Worker.Faulted", p, true, NULL, NULL);
		}
	}
	while (op) {
		struct rd_op *next = op->next;
		op->done(op);
		op = next;
	}
}

/* ---- Sessions ---- */

static void session_maybe_free(struct wk_session *s)
{
	if (!s->closed || s->in_flight)
		return;
	if (s->lane)
		wk.dev.backend->lane_destroy(s->lane);
	if (s->client)
		rd_objects_client_put(&wk.objects, s->client);
	for (struct wk_session **p = &wk.session_list; *p; p = &(*p)->next) {
		if (*p == s) {
			*p = s->next;
			break;
		}
	}
	free(s);
	wk.sessions--;
}

static struct rd_lane *session_lane(struct wk_session *s, struct rp_error *err)
{
	if (!s->lane)
		s->lane = wk.dev.backend->lane_create(&wk.dev, wk.next_lane++, err);
	return s->lane;
}

static int refuse_if_not_ready(struct rp_error *err)
{
	switch (wk.state) {
	case WK_READY:
		return 0;
	case WK_LOST:
		rp_error_set(err, RP_ERR_DEVICE_LOST, "device %d lost its context (%s); wait for the next generation",
			     wk.dev.index, wk.fault_reason);
		break;
	case WK_DRAINING:
	case WK_STOPPING:
		rp_error_set(err, RP_ERR_DRAINING, "device %d is draining for a lifecycle change; retry after it",
			     wk.dev.index);
		break;
	}
	rp_error_add_int(err, "device", wk.dev.index);
	rp_error_add_int(err, "generation", (long long)GEN());
	return -EAGAIN;
}

/* ---- io.regen.Memory ---- */

static int check_device_param(const cJSON *params, struct rp_error *err)
{
	uint64_t device;
	int r = rp_params_uint(params, "device", UINT32_MAX, 0, &device, err);

	if (r < 0)
		return r;
	if (device != (uint64_t)wk.dev.index) {
		rp_error_set(err, RP_ERR_NO_SUCH_DEVICE, "this socket serves device %d, not %llu", wk.dev.index,
			     (unsigned long long)device);
		rp_error_add_int(err, "device", (long long)device);
		return -EINVAL;
	}
	return 0;
}

static int parse_hex64(const char *hex, unsigned char out[64])
{
	if (strlen(hex) != 128)
		return -EINVAL;
	for (int i = 0; i < 64; i++) {
		unsigned v;
		if (sscanf(hex + 2 * i, "%2x", &v) != 1 || !((hex[2 * i] >= '0' && hex[2 * i] <= '9') ||
							     (hex[2 * i] >= 'a' && hex[2 * i] <= 'f') ||
							     (hex[2 * i] >= 'A' && hex[2 * i] <= 'F')))
			return -EINVAL;
		out[i] = (unsigned char)v;
	}
	return 0;
}

static void method_import_buffer(struct rd_call *call)
{
	static const struct rp_field fields[] = {
		{ "device", RP_T_INT, true },
		{ "kind", RP_T_STRING, true },
		{ "size", RP_T_INT, true },
		{ "offset", RP_T_INT, false },
		{ "fd", RP_T_INT, false },
		{ "handle", RP_T_STRING, false },
		{ NULL },
	};
	static const char *const kinds[] = { "host_fd", "cuda_ipc", "cuda_fd", NULL };
	struct wk_session *s = call->conn->data;
	struct rp_error err = { 0 };
	struct rd_import req = { .fd = -1 };
	struct rd_buffer *buf = NULL;
	const char *handle = NULL;
	uint64_t fd_index = 0;
	int kind, r, has_fd;
	char id[RP_ID_MAX];

	if (rp_params_check(call->msg.params, fields, &err) < 0 || check_device_param(call->msg.params, &err) < 0 ||
	    rp_params_enum(call->msg.params, "kind", kinds, -1, &kind, &err) < 0 ||
	    rp_params_uint(call->msg.params, "size", UINT64_C(1) << 48, 0, &req.size, &err) < 0 ||
	    rp_params_uint(call->msg.params, "offset", UINT64_C(1) << 48, 0, &req.offset, &err) < 0 ||
	    (has_fd = rp_params_uint(call->msg.params, "fd", RP_FDS_MAX - 1, 0, &fd_index, &err)) < 0 ||
	    rp_params_string(call->msg.params, "handle", 128, NULL, &handle, &err) < 0)
		goto fail;
	if (req.size == 0) {
		rp_error_invalid_parameter(&err, "size");
		goto fail;
	}
	/* Each kind takes its own field; the other one is a mistake, not noise. */
	if (kind == RD_BUFFER_CUDA_IPC && has_fd == 0) {
		rp_error_invalid_parameter(&err, "fd");
		goto fail;
	}
	if (kind != RD_BUFFER_CUDA_IPC && handle) {
		rp_error_invalid_parameter(&err, "handle");
		goto fail;
	}
	req.kind = (enum rd_buffer_kind)kind;
	if (refuse_if_not_ready(&err) < 0)
		goto fail;
	if (s->client->buffers >= wk.opts->max_buffers) {
		rp_error_set(&err, RP_ERR_LIMIT_EXCEEDED, "process %d already has %u buffers on device %d",
			     (int)s->client->pid, s->client->buffers, wk.dev.index);
		rp_error_add_str(&err, "resource", "buffers");
		rp_error_add_int(&err, "limit", wk.opts->max_buffers);
		goto fail;
	}
	if (req.kind == RD_BUFFER_CUDA_IPC) {
		if (!handle || parse_hex64(handle, req.handle) < 0) {
			rp_error_set(&err, RP_ERR_IMPORT_FAILED,
				     "cuda_ipc needs 'handle': the 64-byte cudaIpcMemHandle_t as 128 hex digits");
			rp_error_add_str(&err, "kind", "cuda_ipc");
			goto fail;
		}
	} else {
		if (has_fd == 1 || fd_index >= call->raw.nfds || call->raw.fds[fd_index] < 0) {
			rp_error_set(&err, RP_ERR_IMPORT_FAILED,
				     "%s needs 'fd': the index of a file descriptor passed with this message (%zu passed)",
				     kinds[kind], call->raw.nfds);
			rp_error_add_str(&err, "kind", kinds[kind]);
			goto fail;
		}
		req.fd = call->raw.fds[fd_index];
	}
	r = wk.dev.backend->import_buffer(&wk.dev, &req, &buf, &err);
	if (r < 0) {
		if (!err.name) {
			rp_error_set(&err, RP_ERR_IMPORT_FAILED, "%s import failed: %s", kinds[kind], strerror(-r));
			rp_error_add_str(&err, "kind", kinds[kind]);
		}
		goto fail;
	}
	if (req.kind != RD_BUFFER_CUDA_IPC)
		call->raw.fds[fd_index] = -1;   /* the backend owns it now */
	buf->device = &wk.dev;
	buf->kind = req.kind;
	rd_objects_add_buffer(&wk.objects, buf, s->client);
	rd_debug("memory", wk.dev.index, GEN(), s->client->pid, "imported %s %s, %llu bytes", kinds[kind],
		 rp_id_format(&buf->id, id), (unsigned long long)buf->size);
	cJSON *reply = cJSON_CreateObject();
	cJSON_AddStringToObject(reply, "buffer", rp_id_format(&buf->id, id));
	cJSON_AddNumberToObject(reply, "generation", (double)buf->id.generation);
	cJSON_AddNumberToObject(reply, "size", (double)buf->size);
	rd_call_reply(call, reply, false);
	return;
fail:
	rd_call_fail(call, &err);
}

static int parse_id_param(const cJSON *params, const char *name, struct rp_id *id, struct rp_error *err)
{
	const char *text;
	int r = rp_params_string(params, name, RP_ID_MAX - 1, NULL, &text, err);

	if (r < 0)
		return r;
	if (r == 1 || rp_id_parse(text, id) < 0)
		return rp_error_invalid_parameter(err, name);
	return 0;
}

/* CloseBuffer and CloseEvent: the id must name an object of the caller's
 * process in the current generation. */
static void close_object(struct rd_call *call, bool event)
{
	static const struct rp_field buffer_fields[] = { { "buffer", RP_T_STRING, true }, { NULL } };
	static const struct rp_field event_fields[] = { { "event", RP_T_STRING, true }, { NULL } };
	const char *param = event ? "event" : "buffer";
	struct wk_session *s = call->conn->data;
	struct rp_error err = { 0 };
	struct rd_buffer *buf = NULL;
	struct rd_event *ev = NULL;
	struct rp_id id;

	if (rp_params_check(call->msg.params, event ? event_fields : buffer_fields, &err) < 0 ||
	    parse_id_param(call->msg.params, param, &id, &err) < 0 ||
	    (event ? rd_objects_find_event(&wk.objects, &id, s->client->pid, param, &ev, &err)
		   : rd_objects_find_buffer(&wk.objects, &id, s->client->pid, param, &buf, &err)) < 0) {
		rd_call_fail(call, &err);
		return;
	}
	if (event)
		rd_objects_close_event(&wk.objects, ev);
	else
		rd_objects_close_buffer(&wk.objects, buf);
	rd_call_reply(call, NULL, false);
}

static void method_close_buffer(struct rd_call *call)
{
	close_object(call, false);
}

static void method_import_event(struct rd_call *call)
{
	static const struct rp_field fields[] = {
		{ "device", RP_T_INT, true },
		{ "handle", RP_T_STRING, true },
		{ NULL },
	};
	struct wk_session *s = call->conn->data;
	struct rp_error err = { 0 };
	unsigned char handle[64];
	const char *hex;
	struct rd_event *ev;
	char id[RP_ID_MAX];

	if (rp_params_check(call->msg.params, fields, &err) < 0 || check_device_param(call->msg.params, &err) < 0 ||
	    rp_params_string(call->msg.params, "handle", 128, NULL, &hex, &err) < 0)
		goto fail;
	if (parse_hex64(hex, handle) < 0) {
		rp_error_invalid_parameter(&err, "handle");
		goto fail;
	}
	if (!wk.dev.backend->import_event) {
		rp_error_set(&err, RP_ERR_METHOD_NOT_IMPLEMENTED, "%s", "");
		cJSON_DeleteItemFromObject(err.params, "message");
		rp_error_add_str(&err, "method", call->msg.method);
		goto fail;
	}
	if (refuse_if_not_ready(&err) < 0 || wk.dev.backend->import_event(&wk.dev, handle, &ev, &err) < 0)
		goto fail;
	ev->device = &wk.dev;
	rd_objects_add_event(&wk.objects, ev, s->client);
	cJSON *reply = cJSON_CreateObject();
	cJSON_AddStringToObject(reply, "event", rp_id_format(&ev->id, id));
	cJSON_AddNumberToObject(reply, "generation", (double)ev->id.generation);
	rd_call_reply(call, reply, false);
	return;
fail:
	rd_call_fail(call, &err);
}

static void method_close_event(struct rd_call *call)
{
	close_object(call, true);
}

/* ---- io.regen.Compute ---- */

static void op_release_refs(struct rd_op *op)
{
	for (int i = 0; i < RD_OP_OPERANDS_MAX; i++)
		if (op->buffers[i])
			rd_objects_buffer_unref(&wk.objects, op->buffers[i]);
	if (op->wait_event)
		rd_objects_event_unref(&wk.objects, op->wait_event);
	if (op->signal_event)
		rd_objects_event_unref(&wk.objects, op->signal_event);
}

static void on_op_done(struct rd_op *op)
{
	struct rd_call *call = op->userdata;
	struct wk_session *s = call->conn->data;

	op_release_refs(op);
	if (op->err.name) {
		rd_call_fail(call, &op->err);
	} else {
		cJSON *reply = cJSON_CreateObject();
		cJSON_AddNumberToObject(reply, "elapsed_us", (double)op->elapsed_us);
		rd_call_reply(call, reply, false);
	}
	free(op);
	wk.in_flight--;
	s->in_flight--;
	session_maybe_free(s);
	maybe_finish_drain();
	maybe_stop();
}

static int resolve_operand(struct rd_op *op, int slot, const struct rp_operand *operand, bool present,
			   const char *name, pid_t pid, struct rp_error *err)
{
	struct rd_buffer *buf;
	int r;

	if (!present)
		return 0;
	r = rd_objects_find_buffer(&wk.objects, &operand->buffer, pid, name, &buf, err);
	if (r < 0)
		return r;
	r = rp_operand_check_bounds(operand, name, buf->size, err);
	if (r < 0)
		return r;
	rd_objects_buffer_ref(buf);
	op->buffers[slot] = buf;
	return 0;
}

static int resolve_events(struct rd_op *op, const struct rp_event_ref *wait, const struct rp_event_ref *signal,
			  pid_t pid, struct rp_error *err)
{
	int r;

	if (wait->present) {
		r = rd_objects_find_event(&wk.objects, &wait->id, pid, "wait_event", &op->wait_event, err);
		if (r < 0)
			return r;
		rd_objects_event_ref(op->wait_event);
	}
	if (signal->present) {
		r = rd_objects_find_event(&wk.objects, &signal->id, pid, "signal_event", &op->signal_event, err);
		if (r < 0)
			return r;
		rd_objects_event_ref(op->signal_event);
	}
	return 0;
}

static int resolve_gemm(struct rd_op *op, pid_t pid, struct rp_error *err)
{
	struct rp_gemm *g = &op->gemm;

	if (resolve_operand(op, RD_GEMM_A, &g->a, true, "a", pid, err) < 0 ||
	    resolve_operand(op, RD_GEMM_B, &g->b, true, "b", pid, err) < 0 ||
	    resolve_operand(op, RD_GEMM_C, &g->c, g->has_c, "c", pid, err) < 0 ||
	    resolve_operand(op, RD_GEMM_D, &g->d, true, "d", pid, err) < 0 ||
	    resolve_operand(op, RD_GEMM_BIAS, &g->bias, g->has_bias, "bias", pid, err) < 0)
		return -EINVAL;
	return resolve_events(op, &g->wait_event, &g->signal_event, pid, err);
}

static int resolve_attention(struct rd_op *op, pid_t pid, struct rp_error *err)
{
	struct rp_attention *a = &op->attention;

	if (resolve_operand(op, RD_ATT_Q, &a->q, true, "q", pid, err) < 0 ||
	    resolve_operand(op, RD_ATT_K, &a->k, true, "k", pid, err) < 0 ||
	    resolve_operand(op, RD_ATT_V, &a->v, true, "v", pid, err) < 0 ||
	    resolve_operand(op, RD_ATT_O, &a->o, true, "o", pid, err) < 0 ||
	    resolve_operand(op, RD_ATT_STATS, &a->stats, a->has_stats, "stats", pid, err) < 0)
		return -EINVAL;
	return resolve_events(op, &a->wait_event, &a->signal_event, pid, err);
}

static int resolve_attention_backward(struct rd_op *op, pid_t pid, struct rp_error *err)
{
	struct rp_attention_backward *a = &op->attention_backward;

	if (resolve_operand(op, RD_ATB_Q, &a->q, true, "q", pid, err) < 0 ||
	    resolve_operand(op, RD_ATB_K, &a->k, true, "k", pid, err) < 0 ||
	    resolve_operand(op, RD_ATB_V, &a->v, true, "v", pid, err) < 0 ||
	    resolve_operand(op, RD_ATB_O, &a->o, true, "o", pid, err) < 0 ||
	    resolve_operand(op, RD_ATB_DO, &a->d_o, true, "d_o", pid, err) < 0 ||
	    resolve_operand(op, RD_ATB_STATS, &a->stats, true, "stats", pid, err) < 0 ||
	    resolve_operand(op, RD_ATB_DQ, &a->d_q, true, "d_q", pid, err) < 0 ||
	    resolve_operand(op, RD_ATB_DK, &a->d_k, true, "d_k", pid, err) < 0 ||
	    resolve_operand(op, RD_ATB_DV, &a->d_v, true, "d_v", pid, err) < 0)
		return -EINVAL;
	return resolve_events(op, &a->wait_event, &a->signal_event, pid, err);
}

static void compute_method(struct rd_call *call, enum rd_op_kind kind)
{
	struct wk_session *s = call->conn->data;
	struct rp_error err = { 0 };
	struct rd_op *op = calloc(1, sizeof(*op));
	pid_t pid = s->client->pid;
	int r;

	if (!op) {
		rd_call_failf(call, RP_ERR_OUT_OF_MEMORY, "no host memory for the call");
		return;
	}
	op->kind = kind;
	switch (kind) {
	case RD_OP_GEMM:
		r = rp_gemm_parse(call->msg.params, &op->gemm, &err);
		if (r == 0)
			r = refuse_if_not_ready(&err);
		if (r == 0)
			r = resolve_gemm(op, pid, &err);
		break;
	case RD_OP_ATTENTION:
		r = rp_attention_parse(call->msg.params, &op->attention, &err);
		if (r == 0)
			r = refuse_if_not_ready(&err);
		if (r == 0)
			r = resolve_attention(op, pid, &err);
		break;
	default:
		r = rp_attention_backward_parse(call->msg.params, &op->attention_backward, &err);
		if (r == 0)
			r = refuse_if_not_ready(&err);
		if (r == 0)
			r = resolve_attention_backward(op, pid, &err);
		break;
	}
	if (r == 0) {
		op->lane = session_lane(s, &err);
		if (!op->lane)
			r = -ENOMEM;
	}
	if (r < 0)
		goto fail;
	op->done = on_op_done;
	op->userdata = call;
	op->submitted_ns = uv_hrtime();
	wk.in_flight++;
	s->in_flight++;
	r = wk.dev.backend->submit(op->lane, op);
	if (r < 0) {
		wk.in_flight--;
		s->in_flight--;
		rp_error_move(&err, &op->err);
		if (!err.name) {
			rp_error_set(&err, RP_ERR_BACKEND, "submit failed: %s", strerror(-r));
			rp_error_add_int(&err, "device", wk.dev.index);
		}
		goto fail;
	}
	return;
fail:
	op_release_refs(op);
	free(op);
	rd_call_fail(call, &err);
}

static void method_gemm(struct rd_call *call) { compute_method(call, RD_OP_GEMM); }
static void method_attention(struct rd_call *call) { compute_method(call, RD_OP_ATTENTION); }
static void method_attention_backward(struct rd_call *call) { compute_method(call, RD_OP_ATTENTION_BACKWARD); }

static void method_generation(struct rd_call *call)
{
	cJSON *reply = cJSON_CreateObject();
	cJSON *devices = cJSON_AddArrayToObject(reply, "devices");
	cJSON *d = cJSON_CreateObject();

	/* The worker knows only its own device, and the node's epoch as the
	 * supervisor last told it. */
	cJSON_AddNumberToObject(reply, "epoch", (double)wk.epoch);
	cJSON_AddNumberToObject(d, "index", wk.dev.index);
	cJSON_AddNumberToObject(d, "generation", (double)GEN());
	cJSON_AddStringToObject(d, "state", wk.state == WK_READY ? "ready" : wk.state == WK_LOST ? "faulted" : "draining");
	cJSON_AddStringToObject(d, "backend", wk.dev.backend->name);
	cJSON_AddItemToArray(devices, d);
	rd_call_reply(call, reply, false);
}

/* Lifecycle verbs belong on the main socket: say where. */
static void method_main_endpoint(struct rd_call *call)
{
	struct rp_error err = { 0 };

	rp_error_set(&err, RP_ERR_WRONG_ENDPOINT, "%s is served on regend's main socket %s, not on a worker socket",
		     call->msg.method, wk.opts->socket_path);
	rp_error_add_str(&err, "method", call->msg.method);
	rp_error_add_str(&err, "socket", wk.opts->socket_path);
	rd_call_fail(call, &err);
}

static const struct rd_method data_methods[] = {
	{ "io.regen.Memory.ImportBuffer", method_import_buffer },
	{ "io.regen.Memory.CloseBuffer", method_close_buffer },
	{ "io.regen.Memory.ImportEvent", method_import_event },
	{ "io.regen.Memory.CloseEvent", method_close_event },
	{ "io.regen.Compute.Gemm", method_gemm },
	{ "io.regen.Compute.Attention", method_attention },
	{ "io.regen.Compute.AttentionBackward", method_attention_backward },
	{ "io.regen.Device.Generation", method_generation },
	{ "io.regen.Device.Status", method_main_endpoint },
	{ "io.regen.Device.Watch", method_main_endpoint },
	{ "io.regen.Device.Release", method_main_endpoint },
	{ "io.regen.Device.Reset", method_main_endpoint },
	{ "io.regen.Device.Restart", method_main_endpoint },
	{ "io.regen.Device.InjectFault", method_main_endpoint },
	{ NULL },
};
/* io.regen.Device is the main socket's: the worker answers only Generation of it
 * (and points the rest there), so it does not claim the interface. */
static const char *const data_interfaces[] = { "io.regen", "io.regen.Memory", "io.regen.Compute", NULL };
static const struct rd_endpoint data_endpoint = { data_methods, data_interfaces };

static void data_on_call(struct rd_conn *conn, struct rd_call *call)
{
	rd_dispatch(&data_endpoint, call);
}

static void data_on_close(struct rd_conn *conn)
{
	struct wk_session *s = conn->data;

	s->closed = true;
	rd_debug("conn", wk.dev.index, GEN(), conn->peer.pid, "client gone");
	session_maybe_free(s);
}

static const struct rd_conn_ops data_ops = { data_on_call, data_on_close };

static void on_accept(int fd, void *data)
{
	struct wk_session *s = calloc(1, sizeof(*s));
	struct rd_conn *conn;

	if (!s) {
		close(fd);
		return;
	}
	if (rd_conn_new(wk.loop, fd, &data_ops, s, &conn) < 0) {
		free(s);
		return;
	}
	s->conn = conn;
	wk.sessions++;
	s->next = wk.session_list;
	wk.session_list = s;
	s->client = rd_objects_client_get(&wk.objects, conn->peer.pid);
	if (!s->client) {
		s->closed = true;
		rd_conn_close(conn);
		return;
	}
	if (s->client->connections > wk.opts->max_connections) {
		rd_conn_refuse(conn, "connections", wk.opts->max_connections);
		return;
	}
	rd_debug("conn", wk.dev.index, GEN(), conn->peer.pid, "client connected");
}

/* ---- Control channel: the supervisor's verbs ---- */

static void reply_memory(struct rd_call *call, bool healthy)
{
	uint64_t used = 0, base = 0;
	cJSON *reply = cJSON_CreateObject();

	wk.dev.backend->memory(&wk.dev, &used, &base);
	cJSON_AddBoolToObject(reply, "healthy", healthy);
	cJSON_AddNumberToObject(reply, "memory_used", (double)used);
	cJSON_AddNumberToObject(reply, "memory_baseline", (double)base);
	rd_call_reply(call, reply, false);
}

static void drain_reply(bool drained)
{
	cJSON *reply = cJSON_CreateObject();

	cJSON_AddBoolToObject(reply, "drained", drained);
	cJSON_AddNumberToObject(reply, "in_flight", wk.in_flight);
	uv_timer_stop(&wk.drain_timer);
	rd_call_reply(wk.drain_call, reply, false);
	wk.drain_call = NULL;
}

static void maybe_finish_drain(void)
{
	if (wk.drain_call && wk.in_flight == 0)
		drain_reply(true);
}

static void on_drain_deadline(uv_timer_t *t)
{
	if (wk.drain_call) {
		rd_warn("lifecycle", wk.dev.index, GEN(), 0, "drain deadline passed with %u call(s) in flight", wk.in_flight);
		drain_reply(false);
	}
}

static void ctl_drain(struct rd_call *call)
{
	struct rp_error err = { 0 };
	uint64_t deadline;

	if (rp_params_uint(call->msg.params, "deadline_ms", 3600000, wk.opts->drain_deadline_ms, &deadline, &err) < 0) {
		rd_call_fail(call, &err);
		return;
	}
	if (wk.drain_call) {
		rd_call_failf(call, RP_ERR_DRAINING, "a drain is already in progress");
		return;
	}
	if (wk.state == WK_READY)
		wk.state = WK_DRAINING;
	rd_info("lifecycle", wk.dev.index, GEN(), 0, "draining %u call(s), deadline %llu ms", wk.in_flight,
		(unsigned long long)deadline);
	wk.drain_call = call;
	if (wk.in_flight == 0) {
		drain_reply(true);
		return;
	}
	uv_timer_start(&wk.drain_timer, on_drain_deadline, deadline, 0);
}

/* The supervisor's epoch only goes up: a late word never takes it back. */
static void take_epoch(const cJSON *params)
{
	struct rp_error err = { 0 };
	uint64_t epoch;

	if (rp_params_uint(params, "epoch", UINT64_MAX, 0, &epoch, &err) == 0 && epoch > wk.epoch)
		wk.epoch = epoch;
	rp_error_clear(&err);
}

static void ctl_epoch(struct rd_call *call)
{
	take_epoch(call->msg.params);
	rd_call_reply(call, NULL, false);
}

static int lifecycle_generation(struct rd_call *call, uint64_t *gen)
{
	struct rp_error err = { 0 };

	if (rp_params_uint(call->msg.params, "generation", UINT64_MAX, 0, gen, &err) < 0 || *gen <= GEN()) {
		rp_error_clear(&err);
		rd_call_failf(call, RP_ERR_BACKEND, "a lifecycle verb needs a generation above %llu",
			      (unsigned long long)GEN());
		return -EINVAL;
	}
	if (wk.in_flight) {
		rd_call_failf(call, RP_ERR_DRAINING, "%u call(s) still in flight: drain first", wk.in_flight);
		return -EBUSY;
	}
	take_epoch(call->msg.params);
	return 0;
}

static void ctl_release(struct rd_call *call)
{
	struct rp_error err = { 0 };
	uint64_t gen;
	unsigned n;
	int r;

	if (lifecycle_generation(call, &gen) < 0)
		return;
	uint64_t t0 = uv_hrtime();
	/* Every id goes stale with the generation, so every mapping goes now. */
	rd_objects_close_all(&wk.objects);
	n = rd_registry_release(&wk.dev.registry);
	r = wk.dev.backend->release(&wk.dev, &err);
	atomic_store(&wk.dev.generation, gen);
	wk.state = WK_READY;
	rd_info("lifecycle", wk.dev.index, gen, 0, "released %u resource(s) in %.1f ms%s%s", n,
		(double)(uv_hrtime() - t0) / 1e6, r < 0 ? "; backend: " : "",
		r < 0 && err.params ? cJSON_GetStringValue(cJSON_GetObjectItem(err.params, "message")) : "");
	rp_error_clear(&err);
	reply_memory(call, r == 0);
}

static void ctl_reset(struct rd_call *call)
{
	struct rp_error err = { 0 };
	uint64_t gen;
	unsigned n;
	int r;

	if (lifecycle_generation(call, &gen) < 0)
		return;
	uint64_t t0 = uv_hrtime();
	/* The context may be dead: forget every native handle without calling
	 * into it, then drop the ids (their resources are already invalid). */
	n = rd_registry_invalidate(&wk.dev.registry);
	rd_objects_close_all(&wk.objects);
	r = wk.dev.backend->reset(&wk.dev, &err);
	atomic_store(&wk.dev.generation, gen);
	pthread_mutex_lock(&wk.lock);
	wk.fault_reported = false;
	wk.fault_pending = false;
	pthread_mutex_unlock(&wk.lock);
	wk.state = r == 0 ? WK_READY : WK_LOST;
	rd_info("lifecycle", wk.dev.index, gen, 0, "reset: invalidated %u resource(s) in %.1f ms; %s", n,
		(double)(uv_hrtime() - t0) / 1e6, r == 0 ? "canary passed" : "canary FAILED");
	rp_error_clear(&err);
	reply_memory(call, r == 0);
}

static void ctl_stats(struct rd_call *call)
{
	uint64_t used = 0, base = 0;
	cJSON *reply = cJSON_CreateObject();

	wk.dev.backend->memory(&wk.dev, &used, &base);
	cJSON_AddNumberToObject(reply, "memory_used", (double)used);
	cJSON_AddNumberToObject(reply, "memory_baseline", (double)base);
	cJSON_AddNumberToObject(reply, "in_flight", wk.in_flight);
	cJSON_AddNumberToObject(reply, "buffers", wk.objects.nbuffers);
	cJSON_AddNumberToObject(reply, "connections", wk.sessions);
	rd_call_reply(call, reply, false);
}

static void ctl_inject_fault(struct rd_call *call)
{
	struct rp_error err = { 0 };
	const char *kind = NULL;

	if (!wk.opts->fault_injection) {
		rd_call_failf(call, RP_ERR_FAULT_INJECTION_DISABLED, "fault injection is disabled");
		return;
	}
	if (rp_params_string(call->msg.params, "kind", 32, NULL, &kind, &err) < 0 || !kind) {
		rp_error_clear(&err);
		rd_call_fail(call, (rp_error_invalid_parameter(&err, "kind"), &err));
		return;
	}
	if (strcmp(kind, "crash") == 0) {
		rd_warn("lifecycle", wk.dev.index, GEN(), 0, "injected crash");
		abort();
	}
	if (!wk.dev.backend->inject_fault || wk.dev.backend->inject_fault(&wk.dev, kind, &err) < 0) {
		if (!err.name)
			rp_error_set(&err, RP_ERR_BACKEND, "the %s backend cannot inject '%s'", wk.dev.backend->name, kind);
		rd_call_fail(call, &err);
		return;
	}
	rd_call_reply(call, NULL, false);
}

static const struct rd_method ctl_methods[] = {
	{ "io.regen.Worker.Drain", ctl_drain },
	{ "io.regen.Worker.Release", ctl_release },
	{ "io.regen.Worker.Reset", ctl_reset },
	{ "io.regen.Worker.Stats", ctl_stats },
	{ "io.regen.Worker.InjectFault", ctl_inject_fault },
	{ "io.regen.Worker.Epoch", ctl_epoch },
	{ NULL },
};
static const char *const ctl_interfaces[] = { "io.regen.Worker", NULL };
static const struct rd_endpoint ctl_endpoint = { ctl_methods, ctl_interfaces };

static void ctl_on_call(struct rd_conn *conn, struct rd_call *call)
{
	rd_dispatch(&ctl_endpoint, call);
}

static void begin_stop(const char *why);

static void ctl_on_close(struct rd_conn *conn)
{
	wk.ctl = NULL;
	/* Without a supervisor nobody would restart or reset us: go. */
	begin_stop("the supervisor is gone");
}

static const struct rd_conn_ops ctl_ops = { ctl_on_call, ctl_on_close };

/* ---- Start and stop ---- */

static void walk_close(uv_handle_t *h, void *arg)
{
	if (!uv_is_closing(h))
		uv_close(h, NULL);
}

static void maybe_stop(void)
{
	if (wk.state != WK_STOPPING || wk.in_flight)
		return;
	uv_stop(wk.loop);
}

static void on_stop_deadline(uv_timer_t *t)
{
	struct rp_error err = { 0 };

	rd_warn("worker", wk.dev.index, GEN(), 0, "stopping with %u call(s) still in flight: failing them", wk.in_flight);
	rp_error_set(&err, RP_ERR_DRAINING,
		     "regend is stopping and the call did not finish within the drain deadline; it may or may not have run");
	rp_error_add_int(&err, "device", wk.dev.index);
	rp_error_add_int(&err, "generation", (long long)GEN());
	for (struct wk_session *s = wk.session_list; s; s = s->next)
		rd_conn_fail_unfinished(s->conn, &err, 200);
	rp_error_clear(&err);
	/* The calls still run on backend threads: leave without unwinding. */
	_exit(0);
}

static void begin_stop(const char *why)
{
	if (wk.state == WK_STOPPING)
		return;
	rd_info("worker", wk.dev.index, GEN(), 0, "stopping: %s", why);
	wk.state = WK_STOPPING;
	rd_listener_close(&wk.listener);
	uv_timer_start(&wk.stop_timer, on_stop_deadline, wk.opts->drain_deadline_ms + 1000, 0);
	maybe_stop();
}

static void on_sigterm(uv_signal_t *s, int signum)
{
	begin_stop("SIGTERM");
}

int rd_worker_run(const struct rd_options *opts)
{
	struct rp_error err = { 0 };
	uint64_t used = 0, base = 0;
	int r;

	memset(&wk, 0, sizeof(wk));
	wk.opts = opts;
	wk.loop = uv_default_loop();
	signal(SIGPIPE, SIG_IGN);
	prctl(PR_SET_PDEATHSIG, SIGTERM);
	pthread_mutex_init(&wk.lock, NULL);

	wk.dev.index = opts->worker_device;
	atomic_init(&wk.dev.generation, opts->worker_generation ? opts->worker_generation : 1);
	wk.epoch = opts->worker_epoch;
	rd_registry_init(&wk.dev.registry, wk.dev.index);
	wk.dev.on_fault = on_fault;
	wk.dev.post_completion = post_completion;
	wk.dev.backend = &rd_backend_host;
#if REGEN_HAVE_CUDA
	if (strcmp(opts->backend, "cuda") == 0)
		wk.dev.backend = &rd_backend_cuda;
#endif
	rd_objects_init(&wk.objects, &wk.dev);

	uv_async_init(wk.loop, &wk.wakeup, on_wakeup);
	uv_timer_init(wk.loop, &wk.drain_timer);
	uv_timer_init(wk.loop, &wk.stop_timer);
	uv_signal_init(wk.loop, &wk.sigterm);
	uv_signal_start(&wk.sigterm, on_sigterm, SIGTERM);

	if (opts->ctl_fd < 0 || rd_conn_new(wk.loop, opts->ctl_fd, &ctl_ops, NULL, &wk.ctl) < 0) {
		rd_err("worker", wk.dev.index, GEN(), 0, "no control channel");
		return 1;
	}
	r = wk.dev.backend->open(&wk.dev, &err);
	if (r < 0) {
		cJSON *m = err.params ? cJSON_GetObjectItem(err.params, "message") : NULL;
		rd_err("worker", wk.dev.index, GEN(), 0, "cannot open the %s backend: %s", wk.dev.backend->name,
		       cJSON_IsString(m) ? m->valuestring : strerror(-r));
		rp_error_clear(&err);
		return 1;
	}
	rd_worker_socket_path(opts, wk.dev.index, wk.socket_path, sizeof(wk.socket_path));
	r = rd_listener_open(&wk.listener, wk.loop, wk.socket_path, opts->socket_mode,
			     opts->have_socket_gid ? opts->socket_gid : (gid_t)-1, -1, on_accept, NULL);
	if (r < 0) {
		rd_err("worker", wk.dev.index, GEN(), 0, "cannot listen on %s: %s", wk.socket_path, strerror(-r));
		return 1;
	}
	wk.dev.backend->memory(&wk.dev, &used, &base);
	cJSON *p = cJSON_CreateObject();
	cJSON_AddNumberToObject(p, "pid", getpid());
	cJSON_AddStringToObject(p, "worker_socket", wk.socket_path);
	cJSON_AddStringToObject(p, "backend", wk.dev.backend->name);
	cJSON_AddNumberToObject(p, "memory_used", (double)used);
	cJSON_AddNumberToObject(p, "memory_baseline", (double)base);
	rd_conn_call(wk.ctl, "io.regen.Worker.Ready", p, true, NULL, NULL);
	rd_info("worker", wk.dev.index, GEN(), 0, "serving on %s", wk.socket_path);

	uv_run(wk.loop, UV_RUN_DEFAULT);

	rd_listener_close(&wk.listener);
	wk.dev.backend->close(&wk.dev);
	uv_walk(wk.loop, walk_close, NULL);
	uv_run(wk.loop, UV_RUN_DEFAULT);
	return 0;
}
