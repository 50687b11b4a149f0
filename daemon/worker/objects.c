#include <errno.h>
#include <stdlib.h>
#include <sys/random.h>
#include <time.h>
#include <string.h>
#include "daemon/worker/objects.h"
#include "proto/errors.h"

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

struct rd_client *rd_objects_client_get(struct rd_objects *t, pid_t pid)
{
	struct rd_client *c;

	for (c = t->clients; c; c = c->next)
		if (c->pid == pid)
			break;
	if (!c) {
		c = calloc(1, sizeof(*c));
		if (!c)
			return NULL;
		c->pid = pid;
		c->next = t->clients;
		t->clients = c;
	}
	c->connections++;
	return c;
}

static void close_owned_by(struct rd_objects *t, pid_t pid)
{
	for (unsigned b = 0; b < RD_OBJECT_BUCKETS; b++) {
		struct rd_buffer *buf = t->buffers[b], *next;
		for (; buf; buf = next) {
			next = buf->next_in_table;
			if (buf->owner == pid)
				rd_objects_close_buffer(t, buf);
		}
		struct rd_event *ev = t->events[b], *enext;
		for (; ev; ev = enext) {
			enext = ev->next_in_table;
			if (ev->owner == pid)
				rd_objects_close_event(t, ev);
		}
	}
}

void rd_objects_client_put(struct rd_objects *t, struct rd_client *c)
{
	if (--c->connections)
		return;
	close_owned_by(t, c->pid);
	for (struct rd_client **p = &t->clients; *p; p = &(*p)->next) {
		if (*p == c) {
			*p = c->next;
			break;
		}
	}
	free(c);
}

static struct rd_client *client_of(struct rd_objects *t, pid_t pid)
{
	for (struct rd_client *c = t->clients; c; c = c->next)
		if (c->pid == pid)
			return c;
	return NULL;
}

static unsigned bucket(uint64_t serial)
{
	return (unsigned)(serial % RD_OBJECT_BUCKETS);
}

static void stamp(struct rd_objects *t, struct rp_id *id, char kind)
{
	id->kind = kind;
	id->device = (uint32_t)t->device->index;
	id->generation = atomic_load(&t->device->generation);
	id->serial = t->next_serial++;
}

void rd_objects_add_buffer(struct rd_objects *t, struct rd_buffer *buf, struct rd_client *owner)
{
	unsigned b;

	stamp(t, &buf->id, RP_ID_BUFFER);
	buf->owner = owner->pid;
	buf->core_refs = 1;   /* the table's */
	buf->closing = false;
	b = bucket(buf->id.serial);
	buf->next_in_table = t->buffers[b];
	t->buffers[b] = buf;
	t->nbuffers++;
	owner->buffers++;
}

void rd_objects_add_event(struct rd_objects *t, struct rd_event *ev, struct rd_client *owner)
{
	unsigned b;

	stamp(t, &ev->id, RP_ID_EVENT);
	ev->owner = owner->pid;
	ev->core_refs = 1;
	ev->closing = false;
	b = bucket(ev->id.serial);
	ev->next_in_table = t->events[b];
	t->events[b] = ev;
	t->nevents++;
	owner->events++;
}

static int check_id(struct rd_objects *t, const struct rp_id *id, char kind, const char *what, struct rp_error *err)
{
	char text[RP_ID_MAX];
	uint64_t generation = atomic_load(&t->device->generation);

	if (id->kind != kind) {
		rp_error_set(err, RP_ERR_NO_SUCH_OBJECT, "%s: %s is not %s id", what, rp_id_format(id, text),
			     kind == RP_ID_BUFFER ? "a buffer" : "an event");
		rp_error_add_str(err, "id", text);
		return -EINVAL;
	}
	if (id->device != (uint32_t)t->device->index) {
		rp_error_set(err, RP_ERR_NO_SUCH_OBJECT, "%s: %s belongs to device %u; this is device %d's worker", what,
			     rp_id_format(id, text), id->device, t->device->index);
		rp_error_add_str(err, "id", text);
		return -ENOENT;
	}
	if (id->generation != generation) {
		rp_error_set(err, RP_ERR_STALE_GENERATION,
			     "%s: %s was made in generation %llu; device %d is in generation %llu: import again", what,
			     rp_id_format(id, text), (unsigned long long)id->generation, t->device->index,
			     (unsigned long long)generation);
		rp_error_add_int(err, "device", t->device->index);
		rp_error_add_int(err, "generation", (long long)generation);
		return -ESTALE;
	}
	return 0;
}

static int not_found(const struct rp_id *id, const char *what, struct rp_error *err)
{
	char text[RP_ID_MAX];

	rp_error_set(err, RP_ERR_NO_SUCH_OBJECT, "%s: no %s %s is open for this process", what,
		     id->kind == RP_ID_BUFFER ? "buffer" : "event", rp_id_format(id, text));
	rp_error_add_str(err, "id", text);
	return -ENOENT;
}

int rd_objects_find_buffer(struct rd_objects *t, const struct rp_id *id, pid_t pid, const char *what,
			   struct rd_buffer **out, struct rp_error *err)
{
	int r = check_id(t, id, RP_ID_BUFFER, what, err);

	if (r < 0)
		return r;
	for (struct rd_buffer *b = t->buffers[bucket(id->serial)]; b; b = b->next_in_table) {
		if (b->id.serial == id->serial && b->owner == pid && !b->closing) {
			*out = b;
			return 0;
		}
	}
	return not_found(id, what, err);
}

int rd_objects_find_event(struct rd_objects *t, const struct rp_id *id, pid_t pid, const char *what,
			  struct rd_event **out, struct rp_error *err)
{
	int r = check_id(t, id, RP_ID_EVENT, what, err);

	if (r < 0)
		return r;
	for (struct rd_event *e = t->events[bucket(id->serial)]; e; e = e->next_in_table) {
		if (e->id.serial == id->serial && e->owner == pid && !e->closing) {
			*out = e;
			return 0;
		}
	}
	return not_found(id, what, err);
}

void rd_objects_buffer_ref(struct rd_buffer *buf)
{
	buf->core_refs++;
}

void rd_objects_buffer_unref(struct rd_objects *t, struct rd_buffer *buf)
{
	if (--buf->core_refs == 0)
		t->device->backend->close_buffer(buf);
}

void rd_objects_event_ref(struct rd_event *ev)
{
	ev->core_refs++;
}

void rd_objects_event_unref(struct rd_objects *t, struct rd_event *ev)
{
	if (--ev->core_refs == 0 && t->device->backend->close_event)
		t->device->backend->close_event(ev);
}

void rd_objects_close_buffer(struct rd_objects *t, struct rd_buffer *buf)
{
	struct rd_buffer **p = &t->buffers[bucket(buf->id.serial)];
	struct rd_client *owner;

	for (; *p; p = &(*p)->next_in_table) {
		if (*p == buf) {
			*p = buf->next_in_table;
			break;
		}
	}
	buf->closing = true;
	t->nbuffers--;
	owner = client_of(t, buf->owner);
	if (owner)
		owner->buffers--;
	rd_objects_buffer_unref(t, buf);
}

void rd_objects_close_event(struct rd_objects *t, struct rd_event *ev)
{
	struct rd_event **p = &t->events[bucket(ev->id.serial)];
	struct rd_client *owner;

	for (; *p; p = &(*p)->next_in_table) {
		if (*p == ev) {
			*p = ev->next_in_table;
			break;
		}
	}
	ev->closing = true;
	t->nevents--;
	owner = client_of(t, ev->owner);
	if (owner)
		owner->events--;
	rd_objects_event_unref(t, ev);
}

void rd_objects_close_all(struct rd_objects *t)
{
	for (unsigned b = 0; b < RD_OBJECT_BUCKETS; b++) {
		while (t->buffers[b])
			rd_objects_close_buffer(t, t->buffers[b]);
		while (t->events[b])
			rd_objects_close_event(t, t->events[b]);
	}
}
