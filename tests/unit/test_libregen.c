/* SPDX-License-Identifier: Apache-2.0 */
/* libregen against a fake regend (a thread serving one socket as main and
 * worker socket, recording every call): what each call puts on the wire
 * (events, cuda_fd imports, wait/signal events on compute calls), what it
 * makes of the replies (the status object and its accessors, watch
 * events), what it refuses on this side, and that the library exports
 * exactly the functions regen.h declares. */
#include <check.h>
#include <dlfcn.h>
#include <errno.h>
#include <math.h>
#include <fcntl.h>
#include <poll.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <unistd.h>
#include <cjson/cJSON.h>

#include "client/include/regen.h"
#include "proto/frame.h"
#include "proto/message.h"

#define MAX_CONNS 8
#define MAX_CALLS 32

/* How the fake answers; set before the first call. */
enum quirk {
	QUIRK_NONE = 0,
	QUIRK_BAD_STATE,        /* Status: a device in a state the IDL lacks */
	QUIRK_BAD_IMPORT,       /* ImportBuffer/ImportEvent: a reply without an id */
	QUIRK_BAD_WATCH,        /* Watch: an event without a generation */
};

struct call {
	char method[64];
	cJSON *params;
	int nfds;
	struct stat fd_stat;    /* of the first fd */
};

static struct {
	char dir[64];
	char sock[96];
	int listen_fd;
	int stop[2];
	pthread_t thread;
	enum quirk quirk;
	uint64_t generation;    /* of every device; ids are made in it */
	pthread_mutex_t lock;
	struct call calls[MAX_CALLS];
	int ncalls;
	unsigned serial;
} fake;

static cJSON *status_reply(void)
{
	cJSON *p = cJSON_CreateObject(), *devs = cJSON_AddArrayToObject(p, "devices");

	cJSON_AddNumberToObject(p, "epoch", 5);
	for (int i = 0; i < 2; i++) {
		cJSON *d = cJSON_CreateObject();

		cJSON_AddNumberToObject(d, "index", i);
		cJSON_AddNumberToObject(d, "generation", (double)fake.generation);
		cJSON_AddStringToObject(d, "state", fake.quirk == QUIRK_BAD_STATE && i == 1 ? "sleeping" : "ready");
		cJSON_AddStringToObject(d, "backend", "fake");
		cJSON_AddStringToObject(d, "worker_socket", fake.sock);
		cJSON_AddNumberToObject(d, "worker_pid", 4200 + i);
		cJSON_AddNumberToObject(d, "respawns", i);
		cJSON_AddNumberToObject(d, "memory_used", 1000);
		cJSON_AddNumberToObject(d, "memory_baseline", 10);
		cJSON_AddStringToObject(d, "reason", "started");
		/* What a newer daemon may add: ignored, and kept in the JSON. */
		cJSON_AddNumberToObject(d, "temperature", 40);
		cJSON_AddItemToArray(devs, d);
	}
	return p;
}

static cJSON *watch_event(int device, uint64_t generation, const char *state, const char *reason)
{
	cJSON *p = cJSON_CreateObject();

	cJSON_AddNumberToObject(p, "epoch", 5 + (double)generation);
	cJSON_AddNumberToObject(p, "device", device);
	if (fake.quirk != QUIRK_BAD_WATCH)
		cJSON_AddNumberToObject(p, "generation", (double)generation);
	cJSON_AddStringToObject(p, "state", state);
	cJSON_AddStringToObject(p, "reason", reason);
	return p;
}

static void send_text(int fd, char *text)
{
	struct rp_tx tx;

	ck_assert_ptr_nonnull(text);
	rp_tx_init(&tx);
	ck_assert_int_eq(rp_tx_push(&tx, text, strlen(text), NULL, 0), 0);
	while (rp_tx_flush(&tx, fd) == -EAGAIN)
		;
	rp_tx_finish(&tx);
	free(text);
}

static void reply(int fd, cJSON *params, bool continues)
{
	send_text(fd, rp_build_reply(params, continues));
	cJSON_Delete(params);
}

/* "b0.<generation>.<serial>" for the device the call names. */
static cJSON *import_reply(const cJSON *params, char kind)
{
	cJSON *p = cJSON_CreateObject(), *size = cJSON_GetObjectItem(params, "size");
	char id[64];

	snprintf(id, sizeof(id), "%c%d.%llu.%u", kind, (int)cJSON_GetObjectItem(params, "device")->valuedouble,
		 (unsigned long long)fake.generation, ++fake.serial);
	if (fake.quirk != QUIRK_BAD_IMPORT)
		cJSON_AddStringToObject(p, kind == 'b' ? "buffer" : "event", id);
	cJSON_AddNumberToObject(p, "generation", (double)fake.generation);
	if (kind == 'b')
		cJSON_AddNumberToObject(p, "size", size->valuedouble);
	return p;
}

static void serve(int fd, struct rp_msg *msg)
{
	struct rp_call call = { 0 };
	struct rp_error err = { 0 };
	struct call *rec;

	ck_assert_int_eq(rp_call_parse(msg->text, msg->len, &call, &err), 0);
	pthread_mutex_lock(&fake.lock);
	ck_assert_int_lt(fake.ncalls, MAX_CALLS);
	rec = &fake.calls[fake.ncalls];
	snprintf(rec->method, sizeof(rec->method), "%s", call.method);
	rec->params = cJSON_Duplicate(call.params, true);
	rec->nfds = (int)msg->nfds;
	if (msg->nfds > 0)
		ck_assert_int_eq(fstat(msg->fds[0], &rec->fd_stat), 0);
	fake.ncalls++;
	pthread_mutex_unlock(&fake.lock);

	if (strcmp(call.method, "io.regen.Device.Status") == 0 || strcmp(call.method, "io.regen.Device.Generation") == 0) {
		reply(fd, status_reply(), false);
	} else if (strcmp(call.method, "io.regen.Device.Release") == 0) {
		cJSON *p = status_reply();

		cJSON_AddNumberToObject(p, "elapsed_us", 1234);
		reply(fd, p, false);
	} else if (strcmp(call.method, "io.regen.Device.Watch") == 0) {
		reply(fd, watch_event(0, fake.generation, "ready", "subscribed"), true);
		reply(fd, watch_event(0, fake.generation + 1, "ready", "restart by pid 1: test"), false);
	} else if (strcmp(call.method, "io.regen.Memory.ImportBuffer") == 0) {
		reply(fd, import_reply(call.params, 'b'), false);
	} else if (strcmp(call.method, "io.regen.Memory.ImportEvent") == 0) {
		reply(fd, import_reply(call.params, 'e'), false);
	} else if (strncmp(call.method, "io.regen.Memory.Close", 21) == 0) {
		reply(fd, NULL, false);
	} else if (strncmp(call.method, "io.regen.Compute.", 17) == 0) {
		cJSON *p = cJSON_CreateObject();

		cJSON_AddNumberToObject(p, "elapsed_us", 1);
		reply(fd, p, false);
	} else {
		rp_error_set(&err, REGEN_ERROR_METHOD_NOT_FOUND, "no %s here", call.method);
		send_text(fd, rp_build_error(&err));
		rp_error_clear(&err);
	}
	rp_call_finish(&call);
}

static void *fake_main(void *arg)
{
	struct pollfd pfd[MAX_CONNS + 2];
	struct rp_rx rx[MAX_CONNS];
	int conns[MAX_CONNS], i;

	for (i = 0; i < MAX_CONNS; i++) {
		conns[i] = -1;
		rp_rx_init(&rx[i]);
	}
	for (;;) {
		pfd[0] = (struct pollfd){ .fd = fake.stop[0], .events = POLLIN };
		pfd[1] = (struct pollfd){ .fd = fake.listen_fd, .events = POLLIN };
		for (i = 0; i < MAX_CONNS; i++)
			pfd[i + 2] = (struct pollfd){ .fd = conns[i], .events = POLLIN };
		if (poll(pfd, MAX_CONNS + 2, -1) < 0)
			continue;
		if (pfd[0].revents)
			break;
		if (pfd[1].revents & POLLIN) {
			int fd = accept4(fake.listen_fd, NULL, NULL, SOCK_CLOEXEC);

			for (i = 0; i < MAX_CONNS && fd >= 0; i++) {
				if (conns[i] < 0) {
					conns[i] = fd;
					fd = -1;
				}
			}
			ck_assert_int_eq(fd, -1);
		}
		for (i = 0; i < MAX_CONNS; i++) {
			struct rp_msg msg;

			if (conns[i] < 0 || !(pfd[i + 2].revents & (POLLIN | POLLHUP)))
				continue;
			if (rp_rx_read(&rx[i], conns[i]) <= 0) {
				close(conns[i]);
				conns[i] = -1;
				rp_rx_finish(&rx[i]);
				rp_rx_init(&rx[i]);
				continue;
			}
			while (rp_rx_next(&rx[i], &msg) == RP_RX_MESSAGE) {
				serve(conns[i], &msg);
				rp_msg_finish(&msg);
			}
		}
	}
	for (i = 0; i < MAX_CONNS; i++) {
		if (conns[i] >= 0)
			close(conns[i]);
		rp_rx_finish(&rx[i]);
	}
	return NULL;
}

static void fake_start(enum quirk quirk)
{
	struct sockaddr_un sa = { .sun_family = AF_UNIX };

	memset(&fake, 0, sizeof(fake));
	fake.quirk = quirk;
	fake.generation = 3;
	pthread_mutex_init(&fake.lock, NULL);
	snprintf(fake.dir, sizeof(fake.dir), "/tmp/regen-libtest-XXXXXX");
	ck_assert_ptr_nonnull(mkdtemp(fake.dir));
	snprintf(fake.sock, sizeof(fake.sock), "%s/sock", fake.dir);
	snprintf(sa.sun_path, sizeof(sa.sun_path), "%s", fake.sock);
	fake.listen_fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
	ck_assert_int_ge(fake.listen_fd, 0);
	ck_assert_int_eq(bind(fake.listen_fd, (struct sockaddr *)&sa, sizeof(sa)), 0);
	ck_assert_int_eq(listen(fake.listen_fd, 16), 0);
	ck_assert_int_eq(pipe(fake.stop), 0);
	ck_assert_int_eq(pthread_create(&fake.thread, NULL, fake_main, NULL), 0);
}

static void fake_stop(void)
{
	ck_assert_int_eq(write(fake.stop[1], "x", 1), 1);
	pthread_join(fake.thread, NULL);
	close(fake.listen_fd);
	close(fake.stop[0]);
	close(fake.stop[1]);
	unlink(fake.sock);
	rmdir(fake.dir);
	for (int i = 0; i < fake.ncalls; i++)
		cJSON_Delete(fake.calls[i].params);
}

/* The last call of `method` the fake saw; fails when there is none. */
static const struct call *last_call(const char *method)
{
	const struct call *found = NULL;

	pthread_mutex_lock(&fake.lock);
	for (int i = 0; i < fake.ncalls; i++) {
		if (strcmp(fake.calls[i].method, method) == 0)
			found = &fake.calls[i];
	}
	pthread_mutex_unlock(&fake.lock);
	ck_assert_msg(found != NULL, "the fake saw no %s", method);
	return found;
}

static int count_calls(void)
{
	int n;

	pthread_mutex_lock(&fake.lock);
	n = fake.ncalls;
	pthread_mutex_unlock(&fake.lock);
	return n;
}

static const char *param_str(const struct call *call, const char *key)
{
	const cJSON *it = cJSON_GetObjectItemCaseSensitive(call->params, key);

	return cJSON_IsString(it) ? it->valuestring : NULL;
}

static double param_num(const struct call *call, const char *key)
{
	const cJSON *it = cJSON_GetObjectItemCaseSensitive(call->params, key);

	ck_assert_msg(cJSON_IsNumber(it), "%s has no number %s", call->method, key);
	return it->valuedouble;
}

/* A small memfd to import as host memory. */
static int memfd(void)
{
	int fd = memfd_create("regen-test", MFD_CLOEXEC);

	ck_assert_int_ge(fd, 0);
	ck_assert_int_eq(ftruncate(fd, 1 << 20), 0);
	return fd;
}

static regen_client *connect_fake(void)
{
	regen_client *c = NULL;

	ck_assert_int_eq(regen_client_connect(fake.sock, &c), 0);
	regen_client_set_timeout(c, 10);
	return c;
}

START_TEST(status_object)
{
	const struct regen_device_info *d;
	regen_status *st = NULL;
	regen_client *c;
	char *json;

	fake_start(QUIRK_NONE);
	c = connect_fake();
	ck_assert_int_eq(regen_status_get(c, &st), 0);
	ck_assert_uint_eq(regen_status_epoch(st), 5);
	ck_assert_int_eq(regen_status_device_count(st), 2);
	ck_assert_uint_eq(regen_status_elapsed_us(st), 0);
	d = regen_status_device(st, 1);
	ck_assert_ptr_nonnull(d);
	ck_assert_uint_eq(d->size, sizeof(*d));
	ck_assert(REGEN_HAS_FIELD(d, reason));
	ck_assert_int_eq(d->index, 1);
	ck_assert_uint_eq(d->generation, 3);
	ck_assert_str_eq(d->state, "ready");
	ck_assert_str_eq(d->backend, "fake");
	ck_assert_str_eq(d->worker_socket, fake.sock);
	ck_assert_int_eq(d->worker_pid, 4201);
	ck_assert_uint_eq(d->respawns, 1);
	ck_assert_uint_eq(d->memory_used, 1000);
	ck_assert_uint_eq(d->memory_baseline, 10);
	ck_assert_str_eq(d->reason, "started");
	ck_assert_ptr_eq(regen_status_find_device(st, 1), d);
	ck_assert_ptr_null(regen_status_find_device(st, 2));
	ck_assert_ptr_null(regen_status_find_device(st, -1));
	ck_assert_ptr_null(regen_status_device(st, 2));
	ck_assert_ptr_null(regen_status_device(st, -1));
	/* The reply as it came, with what this library does not know. */
	json = regen_status_to_json(st);
	ck_assert_ptr_nonnull(strstr(json, "\"temperature\":40"));
	free(json);
	regen_status_free(st);
	regen_status_free(NULL);
	ck_assert_int_eq(regen_status_get(c, NULL), -EINVAL);

	/* Lifecycle: the parameters given, and Restart's elapsed_us read. */
	ck_assert_int_eq(regen_release(c, -1, "why not", &st), 0);
	ck_assert_uint_eq(regen_status_elapsed_us(st), 1234);
	ck_assert_str_eq(param_str(last_call("io.regen.Device.Release"), "reason"), "why not");
	ck_assert_ptr_null(cJSON_GetObjectItem(last_call("io.regen.Device.Release")->params, "device"));
	regen_status_free(st);
	ck_assert_int_eq(regen_release(c, 1, NULL, NULL), 0);
	ck_assert_int_eq((int)param_num(last_call("io.regen.Device.Release"), "device"), 1);
	regen_client_destroy(c);
	fake_stop();
}
END_TEST

START_TEST(malformed_status_is_refused)
{
	regen_status *st = (regen_status *)1;
	regen_client *c;

	fake_start(QUIRK_BAD_STATE);
	c = connect_fake();
	ck_assert_int_eq(regen_status_get(c, &st), -EPROTO);
	ck_assert_ptr_null(st);
	ck_assert_ptr_null(regen_client_error_name(c));
	ck_assert_ptr_nonnull(strstr(regen_client_error_message(c), "devices[1].state"));
	ck_assert_int_eq(regen_generation_get(c, &st), -EPROTO);
	regen_client_destroy(c);
	fake_stop();
}
END_TEST

static void sample_handle(unsigned char h[64], char hex[129], unsigned char seed)
{
	static const char digits[] = "0123456789abcdef";

	for (int i = 0; i < 64; i++) {
		h[i] = (unsigned char)(seed + i * 7);
		hex[2 * i] = digits[h[i] >> 4];
		hex[2 * i + 1] = digits[h[i] & 15];
	}
	hex[128] = '\0';
}

static void tensor(struct regen_tensor *t, regen_buffer *b, int64_t n)
{
	memset(t, 0, sizeof(*t));
	t->buffer = b;
	t->dtype = REGEN_F32;
	t->rank = 2;
	t->shape[0] = n;
	t->shape[1] = n;
}

static void tensor4(struct regen_tensor *t, regen_buffer *b)
{
	memset(t, 0, sizeof(*t));
	t->buffer = b;
	t->dtype = REGEN_F32;
	t->rank = 4;
	t->shape[0] = t->shape[1] = t->shape[2] = t->shape[3] = 2;
}

START_TEST(events_on_the_wire)
{
	unsigned char h1[64], h2[64];
	char hex1[129], hex2[129];
	struct regen_gemm_args g = { 0 };
	struct regen_attention_args a = { 0 };
	struct regen_attention_backward_args ab = { 0 };
	regen_event *wait = NULL, *signal = NULL;
	regen_buffer *buf = NULL;
	const struct call *call;
	regen_client *c;

	fake_start(QUIRK_NONE);
	c = connect_fake();
	sample_handle(h1, hex1, 1);
	sample_handle(h2, hex2, 2);
	ck_assert_int_eq(regen_event_import_cuda_ipc(c, 0, h1, &wait), 0);
	call = last_call("io.regen.Memory.ImportEvent");
	ck_assert_str_eq(param_str(call, "handle"), hex1);
	ck_assert_int_eq((int)param_num(call, "device"), 0);
	ck_assert_int_eq(cJSON_GetArraySize(call->params), 2);
	ck_assert_int_eq(regen_event_import_cuda_ipc(c, 0, h2, &signal), 0);
	ck_assert_str_eq(param_str(last_call("io.regen.Memory.ImportEvent"), "handle"), hex2);
	ck_assert_str_eq(regen_event_id(wait), "e0.3.1");
	ck_assert_str_eq(regen_event_id(signal), "e0.3.2");
	ck_assert_uint_eq(regen_event_generation(wait), 3);
	ck_assert_int_eq(regen_event_device(signal), 0);

	ck_assert_int_eq(regen_buffer_import_fd(c, 0, memfd(), 1 << 20, &buf), 0);
	tensor(&g.a, buf, 4);
	tensor(&g.b, buf, 4);
	tensor(&g.d, buf, 4);
	g.d.offset = 4096;
	g.wait_event = wait;
	g.signal_event = signal;
	ck_assert_int_eq(regen_gemm(c, &g), 0);
	call = last_call("io.regen.Compute.Gemm");
	ck_assert_str_eq(param_str(call, "wait_event"), "e0.3.1");
	ck_assert_str_eq(param_str(call, "signal_event"), "e0.3.2");

	tensor4(&a.q, buf);
	tensor4(&a.k, buf);
	tensor4(&a.v, buf);
	tensor4(&a.o, buf);
	a.signal_event = signal;
	ck_assert_int_eq(regen_attention(c, &a), 0);
	call = last_call("io.regen.Compute.Attention");
	ck_assert_ptr_null(param_str(call, "wait_event"));
	ck_assert_str_eq(param_str(call, "signal_event"), "e0.3.2");

	ab.q = ab.k = ab.v = ab.o = ab.d_o = ab.d_q = ab.d_k = ab.d_v = a.q;
	ab.stats = a.q;
	ab.stats.rank = 3;
	ab.wait_event = wait;
	ck_assert_int_eq(regen_attention_backward(c, &ab), 0);
	call = last_call("io.regen.Compute.AttentionBackward");
	ck_assert_str_eq(param_str(call, "wait_event"), "e0.3.1");
	ck_assert_ptr_null(param_str(call, "signal_event"));

	/* Without events the calls carry none. */
	g.wait_event = g.signal_event = NULL;
	ck_assert_int_eq(regen_gemm(c, &g), 0);
	call = last_call("io.regen.Compute.Gemm");
	ck_assert_ptr_null(param_str(call, "wait_event"));
	ck_assert_ptr_null(param_str(call, "signal_event"));

	ck_assert_int_eq(regen_event_close(wait), 0);
	call = last_call("io.regen.Memory.CloseEvent");
	ck_assert_str_eq(param_str(call, "event"), "e0.3.1");
	ck_assert_int_eq(cJSON_GetArraySize(call->params), 1);
	ck_assert_int_eq(regen_event_close(NULL), 0);
	ck_assert_int_eq(regen_event_close(signal), 0);
	ck_assert_int_eq(regen_buffer_close(buf), 0);
	ck_assert_str_eq(param_str(last_call("io.regen.Memory.CloseBuffer"), "buffer"), "b0.3.3");
	regen_client_destroy(c);
	fake_stop();
}
END_TEST

/* LayerNorm's calls carry the table's operands, eps only when given, and
 * the common fields; an eps JSON cannot say is refused here, unsent. */
START_TEST(layer_norm_on_the_wire)
{
	struct regen_layer_norm_args f = { 0 };
	struct regen_layer_norm_backward_args b = { 0 };
	struct regen_tensor stats = { 0 }, vec = { 0 };
	regen_event *wait = NULL;
	regen_buffer *buf = NULL;
	unsigned char h[64];
	char hex[129];
	const struct call *call;
	regen_client *c;
	int before;

	fake_start(QUIRK_NONE);
	c = connect_fake();
	sample_handle(h, hex, 5);
	ck_assert_int_eq(regen_event_import_cuda_ipc(c, 0, h, &wait), 0);
	ck_assert_int_eq(regen_buffer_import_fd(c, 0, memfd(), 1 << 20, &buf), 0);
	tensor(&f.x, buf, 4);
	tensor(&f.y, buf, 4);
	f.y.offset = 4096;
	vec = (struct regen_tensor){ .buffer = buf, .offset = 8192, .dtype = REGEN_F32, .rank = 1, .shape = { 4 } };
	stats = vec;
	stats.offset = 12288;
	f.weight = vec;
	f.rstd = &stats;
	f.eps = 0.5;
	f.deadline_ms = 900;
	f.wait_event = wait;
	ck_assert_int_eq(regen_layer_norm(c, &f), 0);
	call = last_call("io.regen.Compute.LayerNorm");
	ck_assert(param_num(call, "eps") == 0.5);
	ck_assert_int_eq((int)param_num(call, "deadline_ms"), 900);
	ck_assert_str_eq(param_str(call, "wait_event"), regen_event_id(wait));
	ck_assert_ptr_nonnull(cJSON_GetObjectItemCaseSensitive(call->params, "rstd"));
	ck_assert_ptr_null(cJSON_GetObjectItemCaseSensitive(call->params, "mean"));
	ck_assert_ptr_null(cJSON_GetObjectItemCaseSensitive(call->params, "bias"));
	ck_assert_int_eq(cJSON_GetArraySize(call->params), 7);

	/* eps 0 is regend's default: not sent. */
	f.eps = 0;
	f.wait_event = NULL;
	f.deadline_ms = 0;
	ck_assert_int_eq(regen_layer_norm(c, &f), 0);
	call = last_call("io.regen.Compute.LayerNorm");
	ck_assert_ptr_null(cJSON_GetObjectItemCaseSensitive(call->params, "eps"));
	ck_assert_int_eq(cJSON_GetArraySize(call->params), 4);

	before = count_calls();
	f.eps = NAN;
	ck_assert_int_eq(regen_layer_norm(c, &f), -EINVAL);
	ck_assert_ptr_nonnull(strstr(regen_client_error_message(c), "eps"));
	f.eps = INFINITY;
	ck_assert_int_eq(regen_layer_norm(c, &f), -EINVAL);
	ck_assert_int_eq(count_calls(), before);

	b.d_y = b.x = b.d_x = f.x;
	b.d_x.offset = 16384;
	b.weight = vec;
	b.mean = b.rstd = stats;
	b.d_residual = &f.y;
	ck_assert_int_eq(regen_layer_norm_backward(c, &b), 0);
	call = last_call("io.regen.Compute.LayerNormBackward");
	ck_assert_ptr_nonnull(cJSON_GetObjectItemCaseSensitive(call->params, "d_residual"));
	ck_assert_ptr_null(cJSON_GetObjectItemCaseSensitive(call->params, "d_weight"));
	ck_assert_ptr_null(cJSON_GetObjectItemCaseSensitive(call->params, "eps"));
	ck_assert_int_eq(cJSON_GetArraySize(call->params), 7);

	ck_assert_int_eq(regen_layer_norm(NULL, &f), -EINVAL);
	ck_assert_int_eq(regen_layer_norm_backward(c, NULL), -EINVAL);
	ck_assert_int_eq(regen_layer_norm_submit(c, &f, NULL), -EINVAL);
	regen_event_close(wait);
	regen_buffer_close(buf);
	regen_client_destroy(c);
	fake_stop();
}
END_TEST

/* FP8 on the wire: Gemm's scale and amax operands by name with FP8
 * dtypes, Quantize's and TransposeQuantize's operands (y optional in the
 * latter), ScaleUpdate's scalars only where they are not regend's defaults;
 * a margin JSON cannot say, and a dtype no compute call takes (f64's code),
 * are refused here, unsent. */
START_TEST(fp8_on_the_wire)
{
	struct regen_gemm_args g = { 0 };
	struct regen_quantize_args q = { 0 };
	struct regen_transpose_quantize_args t = { 0 };
	struct regen_scale_update_args u = { 0 };
	struct regen_tensor one = { 0 }, vec = { 0 }, hist = { 0 };
	regen_buffer *buf = NULL;
	const struct call *call;
	const cJSON *operand;
	regen_client *c;
	int before;

	fake_start(QUIRK_NONE);
	c = connect_fake();
	ck_assert_int_eq(regen_buffer_import_fd(c, 0, memfd(), 1 << 20, &buf), 0);
	one = (struct regen_tensor){ .buffer = buf, .offset = 65536, .dtype = REGEN_F32, .rank = 1, .shape = { 1 } };
	tensor(&g.a, buf, 16);
	g.a.dtype = REGEN_E4M3;
	tensor(&g.b, buf, 16);
	g.b.dtype = REGEN_E5M2;
	g.b.offset = 4096;
	g.trans_b = true;
	tensor(&g.d, buf, 16);
	g.d.dtype = REGEN_E4M3;
	g.d.offset = 8192;
	g.a_scale = g.b_scale = g.d_scale = g.amax_d = &one;
	ck_assert_int_eq(regen_gemm(c, &g), 0);
	call = last_call("io.regen.Compute.Gemm");
	ck_assert_str_eq(cJSON_GetObjectItemCaseSensitive(cJSON_GetObjectItemCaseSensitive(call->params, "a"), "dtype")
				 ->valuestring, "e4m3");
	ck_assert_str_eq(cJSON_GetObjectItemCaseSensitive(cJSON_GetObjectItemCaseSensitive(call->params, "b"), "dtype")
				 ->valuestring, "e5m2");
	for (int i = 0; i < 4; i++) {
		static const char *const names[] = { "a_scale", "b_scale", "d_scale", "amax_d" };

		operand = cJSON_GetObjectItemCaseSensitive(call->params, names[i]);
		ck_assert_msg(operand != NULL, "%s not sent", names[i]);
		ck_assert_int_eq((int)cJSON_GetObjectItemCaseSensitive(operand, "offset")->valuedouble, 65536);
	}

	tensor(&q.x, buf, 8);
	tensor(&q.y, buf, 8);
	q.y.dtype = REGEN_E4M3;
	q.y.offset = 4096;
	q.scale = one;
	ck_assert_int_eq(regen_quantize(c, &q), 0);
	call = last_call("io.regen.Compute.Quantize");
	ck_assert_ptr_null(cJSON_GetObjectItemCaseSensitive(call->params, "amax"));
	ck_assert_int_eq(cJSON_GetArraySize(call->params), 3);

	t.x = q.x;
	t.y_t = q.y;
	t.scale = one;
	t.amax = &one;
	ck_assert_int_eq(regen_transpose_quantize(c, &t), 0);
	call = last_call("io.regen.Compute.TransposeQuantize");
	ck_assert_ptr_nonnull(cJSON_GetObjectItemCaseSensitive(call->params, "y_t"));
	ck_assert_ptr_nonnull(cJSON_GetObjectItemCaseSensitive(call->params, "amax"));
	ck_assert_ptr_null(cJSON_GetObjectItemCaseSensitive(call->params, "y"));

	hist = (struct regen_tensor){ .buffer = buf, .dtype = REGEN_F32, .rank = 2, .shape = { 4, 3 } };
	vec = (struct regen_tensor){ .buffer = buf, .offset = 1024, .dtype = REGEN_F32, .rank = 1, .shape = { 3 } };
	u.amax_history = u.amax_history_out = hist;
	u.scale = u.scale_out = vec;
	ck_assert_int_eq(regen_scale_update(c, &u), 0);
	call = last_call("io.regen.Compute.ScaleUpdate");
	/* e4m3, max and margin 0 are regend's defaults: not sent. */
	ck_assert_ptr_null(cJSON_GetObjectItemCaseSensitive(call->params, "fp8_dtype"));
	ck_assert_ptr_null(cJSON_GetObjectItemCaseSensitive(call->params, "amax_compute"));
	ck_assert_ptr_null(cJSON_GetObjectItemCaseSensitive(call->params, "margin"));
	ck_assert_int_eq(cJSON_GetArraySize(call->params), 4);
	u.fp8_format = REGEN_FP8_E5M2;
	u.amax_compute = REGEN_AMAX_COMPUTE_MOST_RECENT;
	u.margin = -2;
	u.scale_inv = &vec;
	ck_assert_int_eq(regen_scale_update(c, &u), 0);
	call = last_call("io.regen.Compute.ScaleUpdate");
	ck_assert_str_eq(param_str(call, "fp8_dtype"), "e5m2");
	ck_assert_str_eq(param_str(call, "amax_compute"), "most_recent");
	ck_assert(param_num(call, "margin") == -2);
	ck_assert_ptr_nonnull(cJSON_GetObjectItemCaseSensitive(call->params, "scale_inv"));

	before = count_calls();
	u.margin = NAN;
	ck_assert_int_eq(regen_scale_update(c, &u), -EINVAL);
	ck_assert_ptr_nonnull(strstr(regen_client_error_message(c), "margin"));
	u.margin = 0;
	q.y.dtype = (enum regen_dtype)4;   /* f64: programs' alone */
	ck_assert_int_eq(regen_quantize(c, &q), -EINVAL);
	ck_assert_ptr_nonnull(strstr(regen_client_error_message(c), "operand y"));
	ck_assert_int_eq(count_calls(), before);
	ck_assert_int_eq(regen_scale_update_submit(c, &u, NULL), -EINVAL);
	ck_assert_int_eq(regen_quantize(c, NULL), -EINVAL);
	ck_assert_int_eq(regen_transpose_quantize(NULL, &t), -EINVAL);
	regen_buffer_close(buf);
	regen_client_destroy(c);
	fake_stop();
}
END_TEST

/* Scalars JSON cannot say (NaN, infinities) are refused here, unsent: over
 * Varlink they would arrive as absent and take the default. A negative
 * attention scale is sent, for regend to refuse by name. */
START_TEST(scalars_json_cannot_say_are_refused)
{
	static const double bad[] = { NAN, INFINITY, -INFINITY };
	struct regen_gemm_args g = { 0 };
	struct regen_attention_args a = { 0 };
	struct regen_attention_backward_args ab = { 0 };
	regen_buffer *buf = NULL;
	const struct call *call;
	regen_client *c;
	int before;

	fake_start(QUIRK_NONE);
	c = connect_fake();
	ck_assert_int_eq(regen_buffer_import_fd(c, 0, memfd(), 1 << 20, &buf), 0);
	tensor(&g.a, buf, 4);
	tensor(&g.b, buf, 4);
	tensor(&g.d, buf, 4);
	g.d.offset = 4096;
	tensor4(&a.q, buf);
	a.k = a.v = a.o = a.q;
	a.o.offset = 8192;
	ab.q = ab.k = ab.v = ab.o = ab.d_o = a.q;
	ab.d_q = ab.d_k = ab.d_v = a.o;
	tensor(&ab.stats, buf, 4);
	before = count_calls();
	for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
		g.alpha = bad[i];
		g.alpha_set = true;
		ck_assert_int_eq(regen_gemm(c, &g), -EINVAL);
		ck_assert_ptr_nonnull(strstr(regen_client_error_message(c), "alpha"));
		g.alpha = 1;
		g.beta = bad[i];
		ck_assert_int_eq(regen_gemm(c, &g), -EINVAL);
		g.beta = 0;
		a.scale = ab.scale = bad[i];
		ck_assert_int_eq(regen_attention(c, &a), -EINVAL);
		ck_assert_ptr_nonnull(strstr(regen_client_error_message(c), "scale"));
		ck_assert_int_eq(regen_attention_backward(c, &ab), -EINVAL);
	}
	/* Two compute modes at once: neither is sent. */
	g.tf32 = g.fp8_fast_accum = true;
	ck_assert_int_eq(regen_gemm(c, &g), -EINVAL);
	g.tf32 = false;
	ck_assert_int_eq(count_calls(), before);
	/* fp8_fast_accum alone is sent as the compute mode (regend refuses it
	 * by name for these f32 inputs). */
	ck_assert_int_eq(regen_gemm(c, &g), 0);
	call = last_call("io.regen.Compute.Gemm");
	ck_assert_str_eq(cJSON_GetStringValue(cJSON_GetObjectItemCaseSensitive(call->params, "compute")),
			 "fp8_fast_accum");
	g.fp8_fast_accum = false;
	before = count_calls();

	a.scale = -0.5;
	ck_assert_int_eq(regen_attention(c, &a), 0);
	call = last_call("io.regen.Compute.Attention");
	ck_assert(param_num(call, "scale") == -0.5);
	a.scale = 0;
	ck_assert_int_eq(regen_attention(c, &a), 0);
	call = last_call("io.regen.Compute.Attention");
	ck_assert_ptr_null(cJSON_GetObjectItemCaseSensitive(call->params, "scale"));
	regen_buffer_close(buf);
	regen_client_destroy(c);
	fake_stop();
}
END_TEST

START_TEST(events_refused_on_this_side)
{
	unsigned char h[64];
	char hex[129];
	struct regen_gemm_args g = { 0 };
	regen_event *other_client = NULL, *other_device = NULL;
	regen_buffer *buf = NULL;
	regen_client *c, *c2;
	int before;

	fake_start(QUIRK_NONE);
	c = connect_fake();
	c2 = connect_fake();
	sample_handle(h, hex, 9);
	ck_assert_int_eq(regen_buffer_import_fd(c, 0, memfd(), 1 << 20, &buf), 0);
	ck_assert_int_eq(regen_event_import_cuda_ipc(c2, 0, h, &other_client), 0);
	ck_assert_int_eq(regen_event_import_cuda_ipc(c, 1, h, &other_device), 0);
	ck_assert_str_eq(regen_event_id(other_device), "e1.3.3");
	tensor(&g.a, buf, 4);
	tensor(&g.b, buf, 4);
	tensor(&g.d, buf, 4);
	before = count_calls();

	g.wait_event = other_client;
	ck_assert_int_eq(regen_gemm(c, &g), -EINVAL);
	ck_assert_ptr_nonnull(strstr(regen_client_error_message(c), "another client"));
	g.wait_event = NULL;
	g.signal_event = other_device;
	ck_assert_int_eq(regen_gemm(c, &g), -EINVAL);
	ck_assert_ptr_nonnull(strstr(regen_client_error_message(c), "device 1"));
	ck_assert_int_eq(count_calls(), before);

	/* Refused imports set their out pointer to NULL: not the live ones'. */
	regen_event *refused = (regen_event *)1;
	ck_assert_int_eq(regen_event_import_cuda_ipc(c, 0, NULL, &refused), -EINVAL);
	ck_assert_ptr_null(refused);
	ck_assert_int_eq(regen_event_import_cuda_ipc(c, REGEN_DEVICES_MAX, h, &refused), -EINVAL);
	ck_assert_int_eq(regen_event_import_cuda_ipc(c, -1, h, &refused), -EINVAL);
	ck_assert_int_eq(count_calls(), before);

	/* An event outliving its client is only freed. */
	regen_client_destroy(c2);
	ck_assert_int_eq(regen_event_close(other_client), 0);
	ck_assert_int_eq(count_calls(), before);
	regen_event_close(other_device);
	regen_buffer_close(buf);
	regen_client_destroy(c);
	fake_stop();
}
END_TEST

START_TEST(cuda_fd_import)
{
	const struct call *call;
	regen_buffer *buf = NULL;
	regen_client *c;
	struct stat st;
	int fd;

	fake_start(QUIRK_NONE);
	c = connect_fake();
	fd = memfd();
	ck_assert_int_eq(fstat(fd, &st), 0);
	ck_assert_int_eq(regen_buffer_import_cuda_fd(c, 1, fd, 4096, 8192, &buf), 0);
	call = last_call("io.regen.Memory.ImportBuffer");
	ck_assert_str_eq(param_str(call, "kind"), "cuda_fd");
	ck_assert_int_eq((int)param_num(call, "device"), 1);
	ck_assert_int_eq((int)param_num(call, "offset"), 4096);
	ck_assert_int_eq((int)param_num(call, "size"), 8192);
	ck_assert_int_eq((int)param_num(call, "fd"), 0);
	ck_assert_ptr_null(param_str(call, "handle"));
	/* The fd that arrived is the caller's file, and the caller keeps its own. */
	ck_assert_int_eq(call->nfds, 1);
	ck_assert(call->fd_stat.st_ino == st.st_ino && call->fd_stat.st_dev == st.st_dev);
	ck_assert_int_eq(fcntl(fd, F_GETFD), FD_CLOEXEC);
	ck_assert_str_eq(regen_buffer_id(buf), "b1.3.1");
	ck_assert_uint_eq(regen_buffer_size(buf), 8192);
	ck_assert_int_eq(regen_buffer_device(buf), 1);
	regen_buffer *refused = (regen_buffer *)1;
	ck_assert_int_eq(regen_buffer_import_cuda_fd(c, 0, -1, 0, 8192, &refused), -EINVAL);
	ck_assert_ptr_null(refused);
	regen_buffer_close(buf);
	close(fd);
	regen_client_destroy(c);
	fake_stop();
}
END_TEST

START_TEST(malformed_import_reply_is_refused)
{
	unsigned char h[64];
	char hex[129];
	regen_buffer *buf = (regen_buffer *)1;
	regen_event *ev = (regen_event *)1;
	regen_client *c;

	fake_start(QUIRK_BAD_IMPORT);
	c = connect_fake();
	sample_handle(h, hex, 3);
	ck_assert_int_eq(regen_buffer_import_cuda_ipc(c, 0, h, 0, 4096, &buf), -EPROTO);
	ck_assert_ptr_null(buf);
	ck_assert_ptr_nonnull(strstr(regen_client_error_message(c), "ImportBuffer: malformed reply (buffer)"));
	ck_assert_str_eq(param_str(last_call("io.regen.Memory.ImportBuffer"), "handle"), hex);
	ck_assert_int_eq(regen_event_import_cuda_ipc(c, 0, h, &ev), -EPROTO);
	ck_assert_ptr_null(ev);
	ck_assert_ptr_nonnull(strstr(regen_client_error_message(c), "(event)"));
	regen_client_destroy(c);
	fake_stop();
}
END_TEST

static int stop_at_second(const struct regen_watch_event *ev, void *userdata)
{
	int *n = userdata;

	ck_assert_uint_eq(ev->size, sizeof(*ev));
	return ++*n == 2;
}

START_TEST(watcher)
{
	const struct regen_watch_event *ev;
	regen_watcher *w = NULL;
	regen_client *c;
	int n = 0;

	fake_start(QUIRK_NONE);
	c = connect_fake();
	ck_assert_int_eq(regen_watcher_open(c, &w), 0);
	ck_assert_int_eq(regen_watcher_next(w, 5, &ev), 0);
	ck_assert_uint_eq(ev->size, sizeof(*ev));
	ck_assert(REGEN_HAS_FIELD(ev, reason));
	ck_assert_int_eq(ev->device, 0);
	ck_assert_uint_eq(ev->generation, 3);
	ck_assert_uint_eq(ev->epoch, 8);
	ck_assert_str_eq(ev->state, "ready");
	ck_assert_str_eq(ev->reason, "subscribed");
	ck_assert_int_eq(regen_watcher_next(w, 5, &ev), 0);
	ck_assert_uint_eq(ev->generation, 4);
	ck_assert_str_eq(ev->reason, "restart by pid 1: test");
	/* The fake ended the stream with that reply. */
	ck_assert_int_eq(regen_watcher_next(w, 5, &ev), -ENODATA);
	ck_assert_ptr_null(ev);
	regen_watcher_close(w);
	regen_watcher_close(NULL);
	ck_assert_int_eq(regen_watch(c, 5, stop_at_second, &n), 0);
	ck_assert_int_eq(n, 2);
	regen_client_destroy(c);
	fake_stop();
}
END_TEST

START_TEST(malformed_watch_event_is_refused)
{
	const struct regen_watch_event *ev;
	regen_watcher *w = NULL;
	regen_client *c;

	fake_start(QUIRK_BAD_WATCH);
	c = connect_fake();
	ck_assert_int_eq(regen_watcher_open(c, &w), 0);
	ck_assert_int_eq(regen_watcher_next(w, 5, &ev), -EPROTO);
	ck_assert_ptr_nonnull(strstr(regen_client_error_message(c), "Watch: malformed reply (generation)"));
	regen_watcher_close(w);
	regen_client_destroy(c);
	fake_stop();
}
END_TEST

/* A close after the generation changed needs no call: the worker dropped
 * the object with its generation. */
START_TEST(close_of_an_old_generation_is_local)
{
	regen_buffer *buf = NULL;
	regen_status *st = NULL;
	regen_client *c;
	int before;

	fake_start(QUIRK_NONE);
	c = connect_fake();
	ck_assert_int_eq(regen_buffer_import_fd(c, 0, memfd(), 4096, &buf), 0);
	ck_assert_uint_eq(regen_buffer_generation(buf), 3);
	fake.generation = 4;
	ck_assert_int_eq(regen_status_get(c, &st), 0);
	regen_status_free(st);
	before = count_calls();
	ck_assert_int_eq(regen_buffer_close(buf), 0);
	ck_assert_int_eq(count_calls(), before);
	regen_client_destroy(c);
	fake_stop();
}
END_TEST

/* Every REGEN_EXPORT function of regen.h, and nothing else, is in the
 * library's dynamic symbol table. */
START_TEST(exports_are_the_header)
{
	const char *root = getenv("REGEN_TEST_SOURCE_ROOT");
	char path[1024], cmd[1200], line[512], name[128];
	char declared[128][128], exported[128][128];
	int ndeclared = 0, nexported = 0, i, j;
	Dl_info info;
	FILE *f;

	ck_assert_ptr_nonnull(root);
	snprintf(path, sizeof(path), "%s/client/include/regen.h", root);
	f = fopen(path, "r");
	ck_assert_ptr_nonnull(f);
	while (fgets(line, sizeof(line), f) != NULL) {
		char *p = strstr(line, "regen_"), *q;

		if (strncmp(line, "REGEN_EXPORT ", 13) != 0)
			continue;
		/* The function's name is the regen_ word right before '('. */
		q = strchr(line, '(');
		ck_assert_ptr_nonnull(q);
		for (p = q; p > line && (p[-1] == '_' || (p[-1] >= 'a' && p[-1] <= 'z') || (p[-1] >= '0' && p[-1] <= '9'));
		     p--)
			;
		snprintf(declared[ndeclared++], 128, "%.*s", (int)(q - p), p);
	}
	fclose(f);
	ck_assert_int_ge(ndeclared, 40);

	ck_assert(dladdr((void *)regen_client_connect, &info) != 0);
	snprintf(cmd, sizeof(cmd), "nm -D --defined-only '%s' 2>/dev/null", info.dli_fname);
	f = popen(cmd, "r");
	ck_assert_ptr_nonnull(f);
	while (fgets(line, sizeof(line), f) != NULL) {
		if (sscanf(line, "%*s %*s %127s", name) == 1 && strncmp(name, "REGEN_", 6) != 0) {
			*strchrnul(name, '@') = '\0';
			snprintf(exported[nexported++], 128, "%s", name);
		}
	}
	pclose(f);
	if (nexported == 0)
		return;   /* no nm here: nothing to compare */
	for (i = 0; i < ndeclared; i++) {
		for (j = 0; j < nexported && strcmp(declared[i], exported[j]) != 0; j++)
			;
		ck_assert_msg(j < nexported, "%s is declared but not exported", declared[i]);
	}
	for (j = 0; j < nexported; j++) {
		for (i = 0; i < ndeclared && strcmp(declared[i], exported[j]) != 0; i++)
			;
		ck_assert_msg(i < ndeclared, "%s is exported but not declared in regen.h", exported[j]);
	}
}
END_TEST

static Suite *libregen_suite(void)
{
	Suite *s = suite_create("libregen");
	TCase *tc = tcase_create("fake regend");

	tcase_add_test(tc, status_object);
	tcase_add_test(tc, malformed_status_is_refused);
	tcase_add_test(tc, events_on_the_wire);
	tcase_add_test(tc, events_refused_on_this_side);
	tcase_add_test(tc, layer_norm_on_the_wire);
	tcase_add_test(tc, fp8_on_the_wire);
	tcase_add_test(tc, scalars_json_cannot_say_are_refused);
	tcase_add_test(tc, cuda_fd_import);
	tcase_add_test(tc, malformed_import_reply_is_refused);
	tcase_add_test(tc, watcher);
	tcase_add_test(tc, malformed_watch_event_is_refused);
	tcase_add_test(tc, close_of_an_old_generation_is_local);
	suite_add_tcase(s, tc);

	tc = tcase_create("library");
	tcase_add_test(tc, exports_are_the_header);
	suite_add_tcase(s, tc);
	return s;
}

int main(void)
{
	SRunner *sr = srunner_create(libregen_suite());
	int failed;

	srunner_run_all(sr, CK_NORMAL);
	failed = srunner_ntests_failed(sr);
	srunner_free(sr);
	return failed == 0 ? EXIT_SUCCESS : EXIT_FAILURE;
}
