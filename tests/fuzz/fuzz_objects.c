/* SPDX-License-Identifier: Apache-2.0 */
/* The worker's object table (daemon/worker/objects.c): a sequence of
 * operations decoded from the bytes on one struct rd_objects, over the stub
 * backend, beside a model of what it should hold.
 *
 * Each operation is one byte (its low nibble picks the operation, the high
 * nibble its client or kind), then its arguments:
 *   add buffer / add event for client A or B;
 *   find object i by its id, as client A or B, as a buffer or an event;
 *   find an id made up of the bytes;
 *   ref, unref, close object i; close_all; a client's connection put and
 *   got again; a second connection of a client got and put; the
 *   generation bumped.
 * Invariants: an id is found only by its owner, as its own kind, in its own
 * generation, and only while it is open; a refusal is NoSuchObject, or
 * StaleGeneration exactly when the id's generation is not the device's,
 * naming the id; a closed object is never found; the backend closes each
 * object exactly once, only once it is closed and its last reference went;
 * the counts per kind, overall and per client, match the model; at the end
 * everything is closed and freed (ASan's leak check). */
#include "fuzz_daemon.h"
#include "daemon/log.h"
#include "daemon/worker/objects.h"
#include "proto/errors.h"

#define OBJECTS_MAX 48

struct model_object {
	struct rd_object *o;            /* valid until backend_closed */
	struct rp_id id;
	enum rd_object_kind kind;
	int owner;                      /* 0 (A) or 1 (B) */
	bool closed;                    /* closed in the table */
	unsigned refs;                  /* the references calls hold (the table's not counted) */
	unsigned backend_closes;
};

static struct {
	struct rd_device dev;
	struct rd_objects table;
	struct rd_client *client[2];
	struct rd_peer peer[2];
	unsigned connections[2];
	struct model_object obj[OBJECTS_MAX];
	unsigned nobj;
} S;

int LLVMFuzzerInitialize(int *argc, char ***argv);
int LLVMFuzzerInitialize(int *argc, char ***argv)
{
	rd_log_init("fuzz", getenv("REGEN_DEBUG") ? getenv("REGEN_DEBUG") : "E");
	return 0;
}

static struct model_object *model_of(const struct rd_object *o)
{
	for (unsigned i = 0; i < S.nobj; i++)
		if (S.obj[i].o == o && S.obj[i].backend_closes == 0)
			return &S.obj[i];
	return NULL;
}

static void on_backend_close(struct rd_object *o)
{
	struct model_object *m = model_of(o);

	FZ_CHECK(m != NULL, "the backend closed an object the model does not know");
	FZ_CHECK(m->closed && m->refs == 0, "backend close of %c%u.%llu.%llu (closed %d, refs %u)", m->id.kind,
		 m->id.device, (unsigned long long)m->id.generation, (unsigned long long)m->id.serial, m->closed, m->refs);
	m->backend_closes++;
}

static void add(enum rd_object_kind kind, int owner)
{
	struct rp_error err = { 0 };
	struct model_object *m;
	struct rd_object *o;

	if (S.nobj == OBJECTS_MAX)
		return;
	if (kind == RD_OBJECT_BUFFER) {
		struct rd_import imp = { .kind = RD_BUFFER_CUDA_IPC, .size = 64, .fd = -1 };
		struct rd_buffer *b;
		FZ_CHECK(fz_backend.import_buffer(&S.dev, &imp, &b, &err) == 0, "stub import failed");
		o = rd_buffer_object(b);
	} else {
		struct rd_event *e;
		unsigned char handle[64] = { 0 };
		FZ_CHECK(fz_backend.import_event(&S.dev, handle, &e, &err) == 0, "stub import failed");
		o = rd_event_object(e);
	}
	rd_objects_add(&S.table, o, kind, S.client[owner]);
	m = &S.obj[S.nobj++];
	*m = (struct model_object){ .o = o, .id = o->id, .kind = kind, .owner = owner };
	FZ_CHECK(o->owner == S.client[owner], "added object has another owner");
	FZ_CHECK(o->id.kind == (kind == RD_OBJECT_BUFFER ? RP_ID_BUFFER : RP_ID_EVENT), "added object has kind %c",
		 o->id.kind);
	FZ_CHECK(o->id.generation == atomic_load(&S.dev.generation), "added object in generation %llu",
		 (unsigned long long)o->id.generation);
	for (unsigned i = 0; i + 1 < S.nobj; i++)
		FZ_CHECK(S.obj[i].id.serial != o->id.serial, "two objects share serial %llu",
			 (unsigned long long)o->id.serial);
}

/* The model's answer: the object `who` finds under id as kind, or NULL. */
static struct model_object *model_find(const struct rp_id *id, enum rd_object_kind kind, int who)
{
	uint64_t gen = atomic_load(&S.dev.generation);

	if (id->kind != (kind == RD_OBJECT_BUFFER ? RP_ID_BUFFER : RP_ID_EVENT) || id->device != 0 ||
	    id->generation != gen)
		return NULL;
	for (unsigned i = 0; i < S.nobj; i++) {
		struct model_object *m = &S.obj[i];
		if (!m->closed && m->owner == who && m->id.serial == id->serial && m->id.kind == id->kind &&
		    m->id.generation == id->generation)
			return m;
	}
	return NULL;
}

static void find(const struct rp_id *id, enum rd_object_kind kind, int who)
{
	struct rp_error err = { 0 };
	struct rd_object *o = NULL;
	struct model_object *want = model_find(id, kind, who);
	char text[RP_ID_MAX];
	int r = rd_objects_find(&S.table, id, kind, S.client[who], "x", &o, &err);

	rp_id_format(id, text);
	if (want) {
		FZ_CHECK(r == 0 && o == want->o, "%s not found by its owner (%d, %s)", text, r, err.name ? err.name : "");
		FZ_CHECK(!o->closing && o->owner == S.client[who], "found %s closing or owned by another", text);
		return;
	}
	FZ_CHECK(r < 0, "%s found by client %c, which must not see it", text, 'A' + who);
	fz_check_error(r, &err, "rd_objects_find");
	/* The kind is judged first, then the device, then the generation. */
	bool right_kind = id->kind == (kind == RD_OBJECT_BUFFER ? RP_ID_BUFFER : RP_ID_EVENT);
	bool stale = right_kind && id->device == 0 && id->generation != atomic_load(&S.dev.generation);
	FZ_CHECK(strcmp(err.name, stale ? RP_ERR_STALE_GENERATION : RP_ERR_NO_SUCH_OBJECT) == 0, "%s: %s where %s was due",
		 text, err.name, stale ? RP_ERR_STALE_GENERATION : RP_ERR_NO_SUCH_OBJECT);
	if (!stale) {
		const cJSON *named = cJSON_GetObjectItemCaseSensitive(err.params, "id");
		FZ_CHECK(cJSON_IsString(named) && strcmp(named->valuestring, text) == 0, "NoSuchObject names %s, not %s",
			 cJSON_IsString(named) ? named->valuestring : "nothing", text);
	} else {
		const cJSON *g = cJSON_GetObjectItemCaseSensitive(err.params, "generation");
		FZ_CHECK(cJSON_IsNumber(g) && (uint64_t)g->valuedouble == atomic_load(&S.dev.generation),
			 "StaleGeneration without the device's generation");
	}
	rp_error_clear(&err);
}

static void check_counts(void)
{
	unsigned count[2] = { 0 }, per[2][2] = { { 0 } };

	for (unsigned i = 0; i < S.nobj; i++) {
		struct model_object *m = &S.obj[i];
		if (!m->closed) {
			count[m->kind]++;
			per[m->owner][m->kind]++;
		}
		FZ_CHECK(m->backend_closes == (m->closed && m->refs == 0 ? 1u : 0u),
			 "object %u closed by the backend %u times (closed %d, refs %u)", i, m->backend_closes, m->closed,
			 m->refs);
	}
	for (int k = 0; k < 2; k++) {
		FZ_CHECK(S.table.count[k] == count[k], "table holds %u of kind %d; the model %u", S.table.count[k], k,
			 count[k]);
		for (int c = 0; c < 2; c++)
			FZ_CHECK(S.client[c]->count[k] == per[c][k], "client %c holds %u of kind %d; the model %u", 'A' + c,
				 S.client[c]->count[k], k, per[c][k]);
	}
	FZ_CHECK(rd_objects_connections_of_uid(&S.table, 1000) == S.connections[0] + S.connections[1],
		 "uid 1000 has %u connections; the model %u", rd_objects_connections_of_uid(&S.table, 1000),
		 S.connections[0] + S.connections[1]);
}

/* An object the model may still name in the table (open), picked by a byte. */
static struct model_object *pick(struct fz_bytes *b, bool open_only)
{
	unsigned i = fz_u8(b);

	for (unsigned tries = 0; tries < S.nobj; tries++, i++) {
		struct model_object *m = &S.obj[i % S.nobj];
		if (!open_only || !m->closed)
			return m;
	}
	return NULL;
}

static void close_model(struct model_object *m)
{
	m->closed = true;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
	struct fz_bytes b = { data, size, 0 };

	memset(&S, 0, sizeof(S));
	memset(&fz_backend_stats, 0, sizeof(fz_backend_stats));
	fz_backend_on_close = on_backend_close;
	fz_device_init(&S.dev);
	rd_objects_init(&S.table, &S.dev);
	/* Two processes of one uid: ids are per process, not per user. */
	S.peer[0] = (struct rd_peer){ .pid = 100, .uid = 1000, .gid = 1000, .start_time = 5 };
	S.peer[1] = (struct rd_peer){ .pid = 101, .uid = 1000, .gid = 1000, .start_time = 5 };
	for (int c = 0; c < 2; c++) {
		S.client[c] = rd_objects_client_get(&S.table, &S.peer[c]);
		S.connections[c] = 1;
	}
	FZ_CHECK(S.client[0] != S.client[1], "two processes share a client");

	for (unsigned steps = 0; fz_more(&b) && steps < 512; steps++) {
		uint8_t op = fz_u8(&b);
		int who = (op >> 4) & 1;
		enum rd_object_kind kind = (op >> 5) & 1 ? RD_OBJECT_EVENT : RD_OBJECT_BUFFER;
		struct model_object *m;

		switch (op & 0xf) {
		case 0:
		case 1:
			add(kind, who);
			break;
		case 2:
		case 3:
			if ((m = pick(&b, false)))
				find(&m->id, kind, who);
			break;
		case 4: {
			struct rp_id id = { .kind = (op >> 6) & 1 ? RP_ID_EVENT : RP_ID_BUFFER };
			id.device = fz_u8(&b) & 1;
			id.generation = fz_u8(&b) % 4;
			uint8_t s = fz_u8(&b);
			/* Near a real serial, or any. */
			id.serial = S.nobj && s < 128 ? S.obj[s % S.nobj].id.serial + (s >> 5) : fz_u64(&b);
			find(&id, kind, who);
			break;
		}
		case 5:
			/* A call holds an object it found: only an open one. */
			if ((m = pick(&b, true))) {
				rd_objects_ref(m->o);
				m->refs++;
			}
			break;
		case 6:
			if ((m = pick(&b, false)) && m->refs) {
				m->refs--;
				rd_objects_unref(&S.table, m->o);
			}
			break;
		case 7:
			if ((m = pick(&b, true))) {
				close_model(m);
				rd_objects_close(&S.table, m->o);
			}
			break;
		case 8:
			for (unsigned i = 0; i < S.nobj; i++)
				close_model(&S.obj[i]);
			rd_objects_close_all(&S.table);
			break;
		case 9:
			/* A client's last connection goes: its objects close; it
			 * connects again as a new client of the same process. */
			if (S.connections[who] == 1) {
				for (unsigned i = 0; i < S.nobj; i++)
					if (S.obj[i].owner == who)
						close_model(&S.obj[i]);
				rd_objects_client_put(&S.table, S.client[who]);
				S.client[who] = rd_objects_client_get(&S.table, &S.peer[who]);
				FZ_CHECK(S.client[who] != S.client[!who], "a process reconnected as the other one");
			} else {
				rd_objects_client_put(&S.table, S.client[who]);
				S.connections[who]--;
			}
			break;
		case 10:
			/* Another connection of the same process: the same client. */
			if (S.connections[who] < 4) {
				struct rd_client *c = rd_objects_client_get(&S.table, &S.peer[who]);
				FZ_CHECK(c == S.client[who], "a second connection of a process is another client");
				S.connections[who]++;
			}
			break;
		case 11:
			/* A generation change: the worker closes every object with it
			 * (control.c); a bump alone leaves them stale. */
			if (op & 0x40) {
				for (unsigned i = 0; i < S.nobj; i++)
					close_model(&S.obj[i]);
				rd_objects_close_all(&S.table);
			}
			atomic_fetch_add(&S.dev.generation, 1);
			break;
		default:
			break;
		}
		check_counts();
	}

	/* Teardown as the worker does it: calls finish, clients leave. */
	for (unsigned i = 0; i < S.nobj; i++) {
		while (S.obj[i].refs) {
			S.obj[i].refs--;
			rd_objects_unref(&S.table, S.obj[i].o);
		}
	}
	for (int c = 0; c < 2; c++) {
		for (unsigned i = 0; i < S.nobj; i++)
			if (S.obj[i].owner == c)
				close_model(&S.obj[i]);
		while (S.connections[c]--)
			rd_objects_client_put(&S.table, S.client[c]);
	}
	for (unsigned i = 0; i < S.nobj; i++)
		FZ_CHECK(S.obj[i].backend_closes == 1, "object %u closed by the backend %u times at the end", i,
			 S.obj[i].backend_closes);
	FZ_CHECK(S.table.clients == NULL && S.table.count[0] == 0 && S.table.count[1] == 0, "table not empty at the end");
	for (unsigned bkt = 0; bkt < RD_OBJECT_BUCKETS; bkt++)
		FZ_CHECK(S.table.table[bkt] == NULL, "bucket %u not empty at the end", bkt);
	FZ_CHECK(fz_backend_stats.buffers_open == 0 && fz_backend_stats.events_open == 0, "backend objects still open");
	fz_backend_on_close = NULL;
	return 0;
}
