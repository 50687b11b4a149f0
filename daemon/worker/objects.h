/* SPDX-License-Identifier: Apache-2.0 */
/* The worker's table of the ids it handed out (buffers, events and
 * communicators: one table and one code path for all), with their owners. An id names an
 * object only for the process that imported it, and only in the generation
 * it was made in. */
#pragma once

#include <stdbool.h>
#include <sys/types.h>
#include "daemon/backend/backend.h"
#include "daemon/peer.h"
#include "proto/message.h"

#define RD_OBJECT_BUCKETS 1024

struct rd_client;

struct rd_objects {
	struct rd_device *device;
	struct rd_object *table[RD_OBJECT_BUCKETS];
	uint64_t next_serial;
	unsigned count[4];             /* by rd_object_kind */
	struct rd_client *clients;
	/* When set: whether a communicator whose process's last connection
	 * closed stays, without an owner (detached, for io.regen.Comm.Attach). */
	bool (*keep)(struct rd_object *o, void *data);
	void *keep_data;
	/* When set: told of every object as it leaves the table. */
	void (*closed)(struct rd_object *o, void *data);
	void *closed_data;
};

/* Programs (io.regen.Program) are ids like the others, bound to the
 * process that defined them, except that a generation change neither
 * closes them nor makes their ids stale: a definition outlives
 * generations (its compiled forms are the backend's, per generation). */
enum rd_object_kind { RD_OBJECT_BUFFER = 0, RD_OBJECT_EVENT, RD_OBJECT_COMM, RD_OBJECT_PROGRAM, RD_OBJECT_KINDS };

/* A process with at least one connection to this worker: what ids are
 * bound to (daemon/peer.h says what makes two peers one process). */
struct rd_client {
	struct rd_peer peer;
	unsigned connections;
	unsigned count[RD_OBJECT_KINDS];   /* objects it holds, by rd_object_kind */
	uint64_t program_nodes;            /* nodes of the programs it holds (max_program_nodes) */
	/* What counts against its uid's limits (max_import_gib,
	 * max_ring_entries): the bytes its buffers span, its rings' entries. */
	uint64_t import_bytes;
	unsigned ring_entries;
	struct rd_client *next;
};

/* What every process of one uid holds in this worker together: what the
 * per-uid limits are held to. */
struct rd_uid_use {
	unsigned connections;
	uint64_t import_bytes;          /* max_import_gib */
	unsigned ring_entries;          /* max_ring_entries */
	unsigned programs;              /* max_uid_programs */
	uint64_t program_nodes;         /* max_uid_program_nodes */
};

void rd_objects_init(struct rd_objects *t, struct rd_device *dev);

struct rd_client *rd_objects_client_get(struct rd_objects *t, const struct rd_peer *peer);
/* The process's client without a connection of its own yet: for objects
 * given back to it (a respawned worker's programs, program_keep.c) before
 * it connects. Its first connection (rd_objects_client_get) takes it over
 * with the peer it read. NULL: no memory. */
struct rd_client *rd_objects_client_keep(struct rd_objects *t, const struct rd_peer *peer);
/* A process without a connection is gone: its client, if any is left,
 * goes with its objects, as with its last connection. */
void rd_objects_client_gone(struct rd_objects *t, const struct rd_peer *peer);
/* The sums of every process of this uid. */
struct rd_uid_use rd_objects_use_of_uid(const struct rd_objects *t, uid_t uid);
/* Connections of every process of this uid. */
static inline unsigned rd_objects_connections_of_uid(const struct rd_objects *t, uid_t uid)
{
	return rd_objects_use_of_uid(t, uid).connections;
}
/* Its rings' entries (ring.c's question). */
static inline unsigned rd_objects_ring_entries_of_uid(const struct rd_objects *t, uid_t uid)
{
	return rd_objects_use_of_uid(t, uid).ring_entries;
}
/* Drops one connection; with the last one, the client's objects are closed
 * (each as its calls finish), except a communicator that t->keep keeps: it
 * is left in the table without an owner. */
void rd_objects_client_put(struct rd_objects *t, struct rd_client *c);

/* The object header of a buffer or an event. */
static inline struct rd_object *rd_buffer_object(struct rd_buffer *b)
{
	return &b->obj;
}
static inline struct rd_object *rd_event_object(struct rd_event *e)
{
	return &e->obj;
}
struct rd_buffer *rd_object_buffer(struct rd_object *o);
struct rd_event *rd_object_event(struct rd_object *o);
struct rd_comm *rd_object_comm(struct rd_object *o);
struct rd_program *rd_object_program(struct rd_object *o);
enum rd_object_kind rd_object_kind_of(const struct rd_object *o);

/* Gives the object its id (current generation) and owner and adds it. */
void rd_objects_add(struct rd_objects *t, struct rd_object *o, enum rd_object_kind kind, struct rd_client *owner);
/* The same with the serial an earlier worker gave it (a program defined
 * again after a respawn keeps its id); later ids are past it. */
void rd_objects_add_as(struct rd_objects *t, struct rd_object *o, enum rd_object_kind kind, struct rd_client *owner,
		       uint64_t serial);

/* Resolves an id of `kind` for process `who`. Errors (err set, -errno
 * returned): io.regen.StaleGeneration when the id is from another
 * generation, io.regen.NoSuchObject when it names nothing `who` imported
 * (whether it exists for another process is not revealed) or is of the
 * other kind. what: the parameter name, for errors. */
int rd_objects_find(struct rd_objects *t, const struct rp_id *id, enum rd_object_kind kind,
		    const struct rd_client *who, const char *what, struct rd_object **out, struct rp_error *err);

/* A call in flight holds the object: its close waits for the call. */
void rd_objects_ref(struct rd_object *o);
void rd_objects_unref(struct rd_objects *t, struct rd_object *o);
/* Gives an ownerless (detached) object to `owner`. */
void rd_objects_adopt(struct rd_objects *t, struct rd_object *o, struct rd_client *owner);
/* Removes from the table; the backend close happens when no call uses it. */
void rd_objects_close(struct rd_objects *t, struct rd_object *o);

/* Closes every object but the programs (a generation change: all their
 * ids go stale at once). */
void rd_objects_close_all(struct rd_objects *t);
