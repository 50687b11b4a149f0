/* SPDX-License-Identifier: Apache-2.0 */
#include <errno.h>
#include <stddef.h>
#include <stdlib.h>
#include <string.h>
#include <sys/random.h>
#include <time.h>
#include "daemon/worker/objects.h"
#include "daemon/worker/usage.h"
#include "proto/errors.h"

static const char id_kinds[RD_OBJECT_KINDS] = {
	[RD_OBJECT_BUFFER] = RP_ID_BUFFER, [RD_OBJECT_EVENT] = RP_ID_EVENT, [RD_OBJECT_COMM] = RP_ID_COMM,
	[RD_OBJECT_PROGRAM] = RP_ID_PROGRAM,
};
static const char *const kind_names[RD_OBJECT_KINDS] = {
	[RD_OBJECT_BUFFER] = "buffer", [RD_OBJECT_EVENT] = "event", [RD_OBJECT_COMM] = "communicator",
	[RD_OBJECT_PROGRAM] = "program",
};
static const char *const kind_articles[RD_OBJECT_KINDS] = {
	[RD_OBJECT_BUFFER] = "a buffer", [RD_OBJECT_EVENT] = "an event", [RD_OBJECT_COMM] = "a communicator",
	[RD_OBJECT_PROGRAM] = "a program",
};

enum rd_object_kind rd_object_kind_of(const struct rd_object *o)
{
	switch (o->id.kind) {
	case RP_ID_EVENT:
		return RD_OBJECT_EVENT;
	case RP_ID_COMM:
		return RD_OBJECT_COMM;
	case RP_ID_PROGRAM:
		return RD_OBJECT_PROGRAM;
	default:
		return RD_OBJECT_BUFFER;
	}
}

static enum rd_object_kind kind_of(const struct rd_object *o)
{
	return rd_object_kind_of(o);
}

struct rd_buffer *rd_object_buffer(struct rd_object *o)
{
	return (struct rd_buffer *)((char *)o - offsetof(struct rd_buffer, obj));
}

struct rd_event *rd_object_event(struct rd_object *o)
{
	return (struct rd_event *)((char *)o - offsetof(struct rd_event, obj));
}

struct rd_comm *rd_object_comm(struct rd_object *o)
{
	return (struct rd_comm *)((char *)o - offsetof(struct rd_comm, obj));
}

struct rd_program *rd_object_program(struct rd_object *o)
{
	return (struct rd_program *)((char *)o - offsetof(struct rd_program, obj));
}

/* A program's id is stamped with generation 0 and never goes stale. */
static uint64_t generation_of(const struct rd_objects *t, enum rd_object_kind kind)
{
	return kind == RD_OBJECT_PROGRAM ? 0 : atomic_load(&t->device->generation);
}

void rd_objects_init(struct rd_objects *t, struct rd_device *dev)
{
	uint64_t base = 0;

	memset(t, 0, sizeof(*t));
	t->device = dev;
	/* Generations start again at 1 when regend itself restarts: serials
	 * start at a random point so that an id a client kept from an earlier
	 * regend does not name a new buffer by accident. */
	if (getrandom(&base, sizeof(base), 0) != sizeof(base))
		base = (uint64_t)time(NULL) << 20;
	t->next_serial = 1 + (base & ((UINT64_C(1) << 40) - 1));
}

static struct rd_client *client_find(struct rd_objects *t, const struct rd_peer *peer)
{
	for (struct rd_client *c = t->clients; c; c = c->next)
		if (rd_peer_same_process(&c->peer, peer))
			return c;
	return NULL;
}

struct rd_client *rd_objects_client_keep(struct rd_objects *t, const struct rd_peer *peer)
{
	struct rd_client *c = client_find(t, peer);

	if (!c) {
		c = calloc(1, sizeof(*c));
		if (!c)
			return NULL;
		c->peer = *peer;
		c->next = t->clients;
		t->clients = c;
	}
	return c;
}

struct rd_client *rd_objects_client_get(struct rd_objects *t, const struct rd_peer *peer)
{
	struct rd_client *c = rd_objects_client_keep(t, peer);

	if (!c)
		return NULL;
	/* A client kept for it holds the identity an earlier worker read:
	 * this connection's says the rest (its groups, its job). */
	if (c->connections == 0)
		c->peer = *peer;
	c->connections++;
	return c;
}

void rd_objects_client_gone(struct rd_objects *t, const struct rd_peer *peer)
{
	struct rd_client *c = client_find(t, peer);

	if (c && c->connections == 0) {
		c->connections = 1;
		rd_objects_client_put(t, c);
	}
}

struct rd_uid_use rd_objects_use_of_uid(const struct rd_objects *t, uid_t uid)
{
	struct rd_uid_use use = { 0 };

	for (const struct rd_client *c = t->clients; c; c = c->next) {
		if (c->peer.uid != uid)
			continue;
		use.connections += c->connections;
		use.import_bytes += c->import_bytes;
		use.ring_entries += c->ring_entries;
		use.programs += c->count[RD_OBJECT_PROGRAM];
		use.program_nodes += c->program_nodes;
	}
	return use;
}

void rd_objects_client_put(struct rd_objects *t, struct rd_client *c)
{
	if (--c->connections)
		return;
	for (unsigned b = 0; b < RD_OBJECT_BUCKETS; b++) {
		for (struct rd_object *o = t->table[b], *next; o; o = next) {
			next = o->next_in_table;
			if (o->owner != c)
				continue;
			if (t->keep && kind_of(o) == RD_OBJECT_COMM && t->keep(o, t->keep_data)) {
				c->count[RD_OBJECT_COMM]--;
				o->owner = NULL;
				continue;
			}
			rd_objects_close(t, o);
		}
	}
	for (struct rd_client **p = &t->clients; *p; p = &(*p)->next) {
		if (*p == c) {
			*p = c->next;
			break;
		}
	}
	free(c);
}

static unsigned bucket(uint64_t serial)
{
	return (unsigned)(serial % RD_OBJECT_BUCKETS);
}

void rd_objects_add(struct rd_objects *t, struct rd_object *o, enum rd_object_kind kind, struct rd_client *owner)
{
	rd_objects_add_as(t, o, kind, owner, t->next_serial);
}

void rd_objects_add_as(struct rd_objects *t, struct rd_object *o, enum rd_object_kind kind, struct rd_client *owner,
		       uint64_t serial)
{
	unsigned b;

	o->id.kind = id_kinds[kind];
	o->id.device = (uint32_t)t->device->index;
	o->id.generation = generation_of(t, kind);
	o->id.serial = serial;
	if (serial >= t->next_serial)
		t->next_serial = serial + 1;
	o->owner = owner;
	o->usage = NULL;
	o->core_refs = 1;   /* the table's */
	o->closing = false;
	b = bucket(o->id.serial);
	o->next_in_table = t->table[b];
	t->table[b] = o;
	t->count[kind]++;
	owner->count[kind]++;
	if (kind == RD_OBJECT_PROGRAM)
		owner->program_nodes += (uint64_t)rd_object_program(o)->def->nnodes;
	if (kind == RD_OBJECT_BUFFER)
		owner->import_bytes += rd_object_buffer(o)->size;
}

static int check_id(struct rd_objects *t, const struct rp_id *id, enum rd_object_kind kind, const char *what,
		    struct rp_error *err)
{
	char text[RP_ID_MAX];
	uint64_t generation = generation_of(t, kind);

	/* Formatted only for an error: every record of a ring comes here. */
	if (id->kind == id_kinds[kind] && id->device == (uint32_t)t->device->index && id->generation == generation)
		return 0;
	rp_id_format(id, text);
	if (id->kind != id_kinds[kind]) {
		rp_err_no_such_object(err, text, "%s: %s is not %s id", what, text, kind_articles[kind]);
		return -EINVAL;
	}
	if (id->device != (uint32_t)t->device->index) {
		rp_err_no_such_object(err, text, "%s: %s belongs to device %u; this is device %d's worker", what, text,
				      id->device, t->device->index);
		return -ENOENT;
	}
	if (id->generation != generation) {
		rp_err_stale_generation(err, t->device->index, (long long)generation,
					"%s: %s was made in generation %llu; device %d is in generation %llu: import again",
					what, text, (unsigned long long)id->generation, t->device->index,
					(unsigned long long)generation);
		return -ESTALE;
	}
	return 0;
}

int rd_objects_find(struct rd_objects *t, const struct rp_id *id, enum rd_object_kind kind,
		    const struct rd_client *who, const char *what, struct rd_object **out, struct rp_error *err)
{
	char text[RP_ID_MAX];
	int r = check_id(t, id, kind, what, err);

	if (r < 0)
		return r;
	/* The whole id must match: an object of an earlier generation left in
	 * the table is not named by the same serial in this one. */
	for (struct rd_object *o = t->table[bucket(id->serial)]; o; o = o->next_in_table) {
		if (o->id.serial == id->serial && o->id.kind == id->kind && o->id.generation == id->generation &&
		    o->owner == who && !o->closing) {
			*out = o;
			return 0;
		}
	}
	rp_id_format(id, text);
	rp_err_no_such_object(err, text, "%s: no %s %s is open for this process", what, kind_names[kind], text);
	return -ENOENT;
}

void rd_objects_ref(struct rd_object *o)
{
	o->core_refs++;
}

void rd_objects_unref(struct rd_objects *t, struct rd_object *o)
{
	const struct rd_backend_ops *backend = t->device->backend;

	if (--o->core_refs)
		return;
	switch (kind_of(o)) {
	case RD_OBJECT_BUFFER:
		backend->close_buffer(rd_object_buffer(o));
		break;
	case RD_OBJECT_EVENT:
		if (backend->close_event)
			backend->close_event(rd_object_event(o));
		break;
	case RD_OBJECT_PROGRAM: {
		struct rd_program *p = rd_object_program(o);
		struct rp_program *def = p->def;

		backend->program_destroy(p);
		rp_program_finish(def);
		free(def);
		break;
	}
	default:
		if (backend->comm_close)
			backend->comm_close(rd_object_comm(o));
		break;
	}
}

void rd_objects_adopt(struct rd_objects *t, struct rd_object *o, struct rd_client *owner)
{
	o->owner = owner;
	owner->count[kind_of(o)]++;
	if (kind_of(o) == RD_OBJECT_BUFFER)
		owner->import_bytes += rd_object_buffer(o)->size;
}

void rd_objects_close(struct rd_objects *t, struct rd_object *o)
{
	enum rd_object_kind kind = kind_of(o);

	for (struct rd_object **p = &t->table[bucket(o->id.serial)]; *p; p = &(*p)->next_in_table) {
		if (*p == o) {
			*p = o->next_in_table;
			break;
		}
	}
	o->closing = true;
	rd_usage_object_closed(o, kind, kind == RD_OBJECT_BUFFER ? rd_object_buffer(o)->size : 0);
	t->count[kind]--;
	if (o->owner) {
		o->owner->count[kind]--;
		if (kind == RD_OBJECT_PROGRAM)
			o->owner->program_nodes -= (uint64_t)rd_object_program(o)->def->nnodes;
		if (kind == RD_OBJECT_BUFFER)
			o->owner->import_bytes -= rd_object_buffer(o)->size;
	}
	o->owner = NULL;
	if (t->closed)
		t->closed(o, t->closed_data);
	rd_objects_unref(t, o);
}

void rd_objects_close_all(struct rd_objects *t)
{
	for (unsigned b = 0; b < RD_OBJECT_BUCKETS; b++) {
		for (struct rd_object *o = t->table[b], *next; o; o = next) {
			next = o->next_in_table;
			if (kind_of(o) != RD_OBJECT_PROGRAM)
				rd_objects_close(t, o);
		}
	}
}
