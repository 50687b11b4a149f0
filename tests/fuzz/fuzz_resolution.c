/* SPDX-License-Identifier: Apache-2.0 */
/* Operand resolution: one compute call, its parameters from the bytes, sent
 * on a real connection to a worker set up in this process (fuzz_inproc.c),
 * so that the worker's own path runs it: rp_compute_parse, then
 * compute.c's resolution of every operand and event against the object
 * table, the bounds check, the lane and the stub backend. The table is
 * populated first from the first bytes:
 *
 *   byte 0: the op (Gemm, Attention, AttentionBackward, LayerNorm,
 *           LayerNormBackward: low four bits, modulo the ops, so up to
 *           sixteen ops are each reached), and
 *           how many of the objects are made before a generation change
 *           (bits 4..6; 0: no change);
 *   byte 1: how many objects (1 + low three bits);
 *   then a byte per object: its size (low nibble, from a table of sizes
 *   from 1 byte to 2^48), an event instead of a buffer (bit 4), owned by
 *   another process of the same uid (bit 5), closed before the call (bit 6);
 *   the rest: the call's parameters as JSON.
 *
 * Objects get serials 1, 2, ... in order, so the bytes can name them
 * ("b0.1.1", "e0.2.3"); a generation change closes every object and bumps
 * the generation, as the worker's Release does.
 *
 * Invariants: the call is accepted exactly when the parser accepts it and
 * every operand names a buffer of the caller's process in the current
 * generation and lies within it, and each event named is an event of the
 * caller in the current generation; otherwise the reply is the parser's
 * error or the first failing operand's, in the table's order: StaleGeneration
 * for an id of another generation, NoSuchObject naming the id for one that
 * names nothing of the caller's (another process's, closed, the wrong kind,
 * another device), InvalidOperand naming the operand when it reaches past
 * its buffer. The backend sees only held, in-bounds buffers; afterwards
 * every object is back to the table's one reference. */
#include "fuzz_daemon.h"
#include "daemon/log.h"
#include "daemon/worker/session.h"
#include "daemon/worker/worker.h"
#include "proto/errors.h"

#define OBJECTS_MAX 8

struct object {
	struct rd_object *o;            /* NULL once closed */
	struct rp_id id;
	bool event;
	bool other;                     /* owned by the other process */
	bool closed;
	uint64_t size;
};

static struct object objects[OBJECTS_MAX];
static unsigned nobjects;
static bool verbose;

int LLVMFuzzerInitialize(int *argc, char ***argv);
int LLVMFuzzerInitialize(int *argc, char ***argv)
{
	rd_log_init("fuzz", getenv("REGEN_DEBUG") ? getenv("REGEN_DEBUG") : "E");
	fz_idl_errors_load();
	fz_inproc_init();
	verbose = getenv("FUZZ_VERBOSE") != NULL;
	return 0;
}

static const uint64_t sizes[16] = {
	1, 2, 16, 64, 255, 256, 1024, 4096, 4097, 65536, 1u << 20, UINT64_C(1) << 31, UINT64_C(1) << 32,
	UINT64_C(1) << 40, UINT64_C(1) << 48, 8190,
};

static void make_objects(struct rd_worker *w, struct rd_client *mine, struct rd_client *other, struct fz_bytes *b,
			 unsigned n, unsigned before_bump)
{
	struct rp_error err = { 0 };

	nobjects = 0;
	for (unsigned i = 0; i < n; i++) {
		uint8_t spec = fz_u8(b);
		struct object *obj = &objects[nobjects++];

		if (before_bump && i == before_bump) {
			/* As ctl_release: every id goes stale with the generation. */
			for (unsigned j = 0; j < i; j++) {
				objects[j].closed = true;
				objects[j].o = NULL;
			}
			rd_objects_close_all(&w->objects);
			atomic_fetch_add(&w->dev.generation, 1);
		}
		memset(obj, 0, sizeof(*obj));
		obj->event = spec & 0x10;
		obj->other = spec & 0x20;
		obj->size = sizes[spec & 15];
		if (obj->event) {
			struct rd_event *ev;
			unsigned char handle[64] = { 0 };
			FZ_CHECK(fz_backend.import_event(&w->dev, handle, &ev, &err) == 0, "stub import failed");
			ev->device = &w->dev;
			obj->o = &ev->obj;
			rd_objects_add(&w->objects, obj->o, RD_OBJECT_EVENT, obj->other ? other : mine);
		} else {
			struct rd_import imp = { .kind = RD_BUFFER_CUDA_IPC, .size = obj->size, .fd = -1 };
			struct rd_buffer *buf;
			FZ_CHECK(fz_backend.import_buffer(&w->dev, &imp, &buf, &err) == 0, "stub import failed");
			buf->device = &w->dev;
			buf->kind = RD_BUFFER_CUDA_IPC;
			obj->o = &buf->obj;
			rd_objects_add(&w->objects, obj->o, RD_OBJECT_BUFFER, obj->other ? other : mine);
		}
		obj->id = obj->o->id;
		FZ_CHECK(obj->id.serial == i + 1, "object %u got serial %llu", i, (unsigned long long)obj->id.serial);
		if (spec & 0x40) {
			/* As CloseBuffer / CloseEvent. */
			rd_objects_close(&w->objects, obj->o);
			obj->closed = true;
			obj->o = NULL;
		}
	}
}

/* The model's verdict on one id: NULL when it resolves, else the error
 * name; *found the object. */
static const char *model_resolve(const struct rp_id *id, bool event, uint64_t generation, struct object **found)
{
	*found = NULL;
	if (id->kind != (event ? RP_ID_EVENT : RP_ID_BUFFER) || id->device != 0)
		return RP_ERR_NO_SUCH_OBJECT;
	if (id->generation != generation)
		return RP_ERR_STALE_GENERATION;
	for (unsigned i = 0; i < nobjects; i++) {
		struct object *obj = &objects[i];
		if (obj->id.serial == id->serial && obj->id.generation == id->generation && obj->event == event &&
		    !obj->other && !obj->closed) {
			*found = obj;
			return NULL;
		}
	}
	return RP_ERR_NO_SUCH_OBJECT;
}

struct outcome {
	const char *error;              /* NULL: accepted */
	char operand[32];               /* the operand (or event parameter) it names */
	char id[RP_ID_MAX];
};

static void model_call(const struct rp_compute *c, uint64_t generation, struct outcome *out)
{
	struct object *obj;

	for (unsigned i = 0; i < c->spec->noperands; i++) {
		const struct rp_operand *op = &c->operands[i];
		uint64_t begin, end;

		if (!c->present[i])
			continue;
		snprintf(out->operand, sizeof(out->operand), "%s", c->spec->operands[i].name);
		rp_id_format(&op->buffer, out->id);
		out->error = model_resolve(&op->buffer, false, generation, &obj);
		if (out->error)
			return;
		if (rp_operand_extent(op, &begin, &end) < 0 || end > obj->size) {
			out->error = RP_ERR_INVALID_OPERAND;
			return;
		}
	}
	const struct rp_event_ref *events[2] = { &c->wait_event, &c->signal_event };
	static const char *const names[2] = { "wait_event", "signal_event" };
	for (int i = 0; i < 2; i++) {
		if (!events[i]->present)
			continue;
		snprintf(out->operand, sizeof(out->operand), "%s", names[i]);
		rp_id_format(&events[i]->id, out->id);
		out->error = model_resolve(&events[i]->id, true, generation, &obj);
		if (out->error)
			return;
	}
	out->error = NULL;
}

struct answer {
	struct rp_call reply;
	bool got;
};

static void on_reply(const char *text, size_t len, void *data)
{
	struct answer *a = data;

	if (verbose)
		fprintf(stderr, "reply: %.*s\n", (int)len, text);
	FZ_CHECK(!a->got, "two replies to one call");
	fz_check_reply(text, len, &a->reply, "compute call");
	a->got = true;
}

static void check_reply(const struct answer *a, const char *parse_error, const cJSON *parse_params,
			const struct outcome *want)
{
	const cJSON *p = a->reply.params;

	if (parse_error) {
		FZ_CHECK(a->reply.error && strcmp(a->reply.error, parse_error) == 0, "parser said %s, the worker %s",
			 parse_error, a->reply.error ? a->reply.error : "yes");
		/* The worker adds nothing to a parse error: it is the parser's
		 * error as it goes on the wire. */
		struct rp_error e = { .name = parse_error, .params = (cJSON *)parse_params };
		struct rp_error perr = { 0 };
		struct rp_call wire;
		char *text = rp_build_error(&e);
		FZ_CHECK(text && rp_call_parse(text, strlen(text), &wire, &perr) == 0, "the parser's error does not build");
		FZ_CHECK(cJSON_Compare(p, wire.params, true), "the worker changed the parser's error");
		rp_call_finish(&wire);
		free(text);
		return;
	}
	if (!want->error) {
		FZ_CHECK(!a->reply.error, "a call the model accepts was refused: %s (%s)", a->reply.error,
			 cJSON_GetStringValue(cJSON_GetObjectItem(p, "message")));
		FZ_CHECK(cJSON_IsNumber(cJSON_GetObjectItemCaseSensitive(p, "elapsed_us")), "success without elapsed_us");
		return;
	}
	FZ_CHECK(a->reply.error && strcmp(a->reply.error, want->error) == 0, "%s (%s): %s due, the worker said %s (%s)",
		 want->operand, want->id, want->error, a->reply.error ? a->reply.error : "yes",
		 a->reply.error ? cJSON_GetStringValue(cJSON_GetObjectItem(p, "message")) : "");
	const char *message = cJSON_GetStringValue(cJSON_GetObjectItemCaseSensitive(p, "message"));
	if (strcmp(want->error, RP_ERR_INVALID_OPERAND) == 0) {
		FZ_CHECK(strcmp(cJSON_GetStringValue(cJSON_GetObjectItemCaseSensitive(p, "operand")), want->operand) == 0,
			 "InvalidOperand names %s, not %s", cJSON_GetStringValue(cJSON_GetObjectItem(p, "operand")),
			 want->operand);
	} else if (strcmp(want->error, RP_ERR_NO_SUCH_OBJECT) == 0) {
		FZ_CHECK(strcmp(cJSON_GetStringValue(cJSON_GetObjectItemCaseSensitive(p, "id")), want->id) == 0,
			 "NoSuchObject names %s, not %s", cJSON_GetStringValue(cJSON_GetObjectItem(p, "id")), want->id);
	}
	if (strcmp(want->error, RP_ERR_INVALID_OPERAND) != 0)
		FZ_CHECK(message && strncmp(message, want->operand, strlen(want->operand)) == 0 &&
				 message[strlen(want->operand)] == ':',
			 "%s does not name the operand %s: %s", want->error, want->operand, message ? message : "");
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
	struct fz_bytes b = { data, size, 0 };
	struct rp_error perr = { 0 };
	struct rp_compute c;
	struct outcome want = { 0 };
	struct answer answer = { 0 };
	struct rp_call sent;
	struct fz_client client = { .fd = -1 };
	const struct rp_op_spec *spec;
	struct rd_worker *w;
	struct rd_client *mine, *other;
	struct rd_peer other_peer;
	unsigned n, before_bump, fds_before;
	uint8_t head;
	cJSON *params;
	char *text;
	int r;

	if (size < 3)
		return 0;
	head = fz_u8(&b);
	_Static_assert(RP_OP_COUNT <= 16, "byte 0's four op bits reach sixteen ops");
	spec = rp_op_get((enum rp_op_id)((head & 15) % RP_OP_COUNT));
	n = 1 + (fz_u8(&b) & 7);
	before_bump = (head >> 4) & 7;
	if (b.pos + n > size)
		return 0;
	params = fz_json(data + b.pos + n, size - b.pos - n);
	if (!params)
		return 0;
	if (!cJSON_IsObject(params)) {
		cJSON_Delete(params);
		return 0;
	}

	fds_before = fz_count_fds();
	fz_inproc_start(FZ_WORKER);
	fz_backend_outcomes = false;
	w = fz_inproc_worker();
	client.fd = fz_inproc_connect();
	mine = w->sessions->client;
	/* Another process of the same user. */
	other_peer = mine->peer;
	other_peer.pid++;
	other = rd_objects_client_get(&w->objects, &other_peer);
	make_objects(w, mine, other, &b, n, before_bump < n ? before_bump : 0);

	/* The model reads the parameters as the worker will: from the text
	 * that goes on the wire (cJSON writes an infinity as null, say). */
	text = rp_build_call(spec->method, params, false, false);
	FZ_CHECK(text != NULL, "cannot build the call");
	FZ_CHECK(rp_call_parse(text, strlen(text), &sent, &perr) == 0, "the call does not parse back: %s", text);
	r = rp_compute_parse(spec, sent.params, &c, &perr);
	if (r == 0)
		model_call(&c, atomic_load(&w->dev.generation), &want);
	FZ_CHECK(fz_client_send(client.fd, text, strlen(text) + 1, 0, false) == strlen(text) + 1, "the call did not go out whole");
	free(text);
	for (unsigned idle = 0; !answer.got && idle < 4;) {
		bool progress = fz_inproc_pump();
		progress |= fz_client_read(&client, on_reply, &answer) > 0;
		idle = progress ? 0 : idle + 1;
	}
	FZ_CHECK(answer.got, "the call got no reply");
	check_reply(&answer, r < 0 ? perr.name : NULL, perr.params, &want);

	/* The call let go of everything it held. */
	for (unsigned i = 0; i < nobjects; i++)
		if (objects[i].o)
			FZ_CHECK(objects[i].o->core_refs == 1, "object %u holds %u references after the call", i,
				 objects[i].o->core_refs);
	FZ_CHECK(w->in_flight == 0, "calls in flight after the reply");

	rp_call_finish(&answer.reply);
	rp_call_finish(&sent);
	rp_error_clear(&perr);
	cJSON_Delete(params);
	rd_objects_client_put(&w->objects, other);
	fz_client_finish(&client);
	fz_inproc_stop();
	FZ_CHECK(fz_count_fds() == fds_before, "%u fds before, %u after", fds_before, fz_count_fds());
	return 0;
}
