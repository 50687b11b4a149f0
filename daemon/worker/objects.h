/* The worker's tables of imported buffers and events, by id, with their
 * owners. An id names an object only for the process that imported it, and
 * only in the generation it was made in. */
#pragma once

#include <stdbool.h>
#include <sys/types.h>
#include "daemon/backend/backend.h"
#include "proto/message.h"

#define RD_OBJECT_BUCKETS 1024

struct rd_client;

struct rd_objects {
	struct rd_device *device;
	struct rd_buffer *buffers[RD_OBJECT_BUCKETS];
	struct rd_event *events[RD_OBJECT_BUCKETS];
	uint64_t next_serial;
	unsigned nbuffers, nevents;
	struct rd_client *clients;
};

/* A process with at least one connection to this worker. */
struct rd_client {
	pid_t pid;
	unsigned connections;
	unsigned buffers, events;
	struct rd_client *next;
};

void rd_objects_init(struct rd_objects *t, struct rd_device *dev);

struct rd_client *rd_objects_client_get(struct rd_objects *t, pid_t pid);
/* Drops one connection; with the last one, the client's buffers and events
 * are closed (as they finish their calls). */
void rd_objects_client_put(struct rd_objects *t, struct rd_client *c);

/* Gives the object its id (current generation) and owner and adds it. */
void rd_objects_add_buffer(struct rd_objects *t, struct rd_buffer *buf, struct rd_client *owner);
void rd_objects_add_event(struct rd_objects *t, struct rd_event *ev, struct rd_client *owner);

/* Resolves an id for `pid`. Errors (err set, -errno returned):
 * io.regen.StaleGeneration when the id is from another generation,
 * io.regen.NoSuchObject when it names nothing this pid owns (whether it
 * exists for another process is not revealed), InvalidParameter when the
 * text is no id of the right kind. what: the parameter name, for errors. */
int rd_objects_find_buffer(struct rd_objects *t, const struct rp_id *id, pid_t pid, const char *what,
			   struct rd_buffer **out, struct rp_error *err);
int rd_objects_find_event(struct rd_objects *t, const struct rp_id *id, pid_t pid, const char *what,
			  struct rd_event **out, struct rp_error *err);

/* Removes from the table; the backend close happens when no call uses it. */
void rd_objects_close_buffer(struct rd_objects *t, struct rd_buffer *buf);
void rd_objects_close_event(struct rd_objects *t, struct rd_event *ev);
void rd_objects_buffer_ref(struct rd_buffer *buf);
void rd_objects_buffer_unref(struct rd_objects *t, struct rd_buffer *buf);
void rd_objects_event_ref(struct rd_event *ev);
void rd_objects_event_unref(struct rd_objects *t, struct rd_event *ev);

/* Closes every object (a generation change: all ids go stale at once). */
void rd_objects_close_all(struct rd_objects *t);
