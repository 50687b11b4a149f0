/* SPDX-License-Identifier: Apache-2.0 */
#include <errno.h>
#include <stdlib.h>
#include "daemon/log.h"
#include "daemon/supervisor/watch.h"
#include "proto/errors.h"

struct rd_sv_watcher {
	struct rd_call *call;
	struct rd_sv_watcher *next;
};

void rd_sv_watch_init(struct rd_sv_watch *w)
{
	w->epoch = 1;
	w->watchers = NULL;
	w->announcing = false;
}

static cJSON *event_json(const struct rd_sv_watch *w, const struct rd_sv_device *d, const char *reason)
{
	struct rp_watch_event ev = {
		.epoch = w->epoch,
		.device = (uint32_t)d->index,
		.generation = d->generation,
		.state = d->state,
		.reason = reason,
	};

	return rp_watch_event_encode(&ev);
}

int rd_sv_watch_subscribe(struct rd_sv_watch *w, struct rd_call *call, const struct rd_sv_device *devices, int n,
			  struct rp_error *err)
{
	struct rd_sv_watcher *watcher;
	unsigned same_conn = 0, same_uid = 0;

	for (struct rd_sv_watcher *o = w->watchers; o; o = o->next) {
		if (!o->call)
			continue;
		same_conn += o->call->conn == call->conn;
		same_uid += o->call->conn->peer.uid == call->conn->peer.uid;
	}
	if (same_conn >= RD_WATCHES_PER_CONNECTION || same_uid >= RD_WATCHES_PER_UID) {
		bool conn = same_conn >= RD_WATCHES_PER_CONNECTION;
		unsigned limit = conn ? RD_WATCHES_PER_CONNECTION : RD_WATCHES_PER_UID;

		rp_err_limit_exceeded(err, "watches", limit, "%u Watch calls are open on this %s already; one serves "
				      "every device", limit, conn ? "connection" : "uid");
		return -EUSERS;
	}
	watcher = calloc(1, sizeof(*watcher));
	if (!watcher) {
		rp_error_set(err, RP_ERR_OUT_OF_MEMORY, "no memory for a watcher");
		rp_error_add_int(err, "device", -1);
		return -ENOMEM;
	}
	watcher->call = call;
	watcher->next = w->watchers;
	w->watchers = watcher;
	for (int i = 0; i < n; i++)
		rd_call_reply(call, event_json(w, &devices[i], "subscribed"), true);
	return 0;
}

/* Unlinks the watchers rd_sv_watch_drop marked during an announcement. */
static void sweep(struct rd_sv_watch *w)
{
	struct rd_sv_watcher **p = &w->watchers;

	while (*p) {
		if (!(*p)->call) {
			struct rd_sv_watcher *gone = *p;
			*p = gone->next;
			free(gone);
		} else {
			p = &(*p)->next;
		}
	}
}

/* A watcher whose unread events reach this is dropped (its connection
 * closed): regend stops reading a peer that does not read, but events go on
 * coming, and any uid may hold 64 Watches. Far more than a reader that
 * keeps up ever has queued (an event is about 200 bytes: over a thousand). */
#define WATCH_UNREAD_MAX (256u << 10)

void rd_sv_watch_announce(struct rd_sv_watch *w, const struct rd_sv_device *d)
{
	bool outer = !w->announcing;

	w->announcing = true;
	for (struct rd_sv_watcher *watcher = w->watchers; watcher; watcher = watcher->next) {
		if (!watcher->call)
			continue;
		struct rd_conn *conn = watcher->call->conn;
		if (conn->tx.queued_bytes > WATCH_UNREAD_MAX) {
			rd_warn("watch", -1, 0, conn->peer.pid, "dropping a Watch whose client left %zu bytes of events unread",
				(size_t)conn->tx.queued_bytes);
			rd_conn_close(conn);   /* rd_sv_watch_drop marks it: swept below */
			continue;
		}
		rd_call_reply(watcher->call, event_json(w, d, d->reason), true);
	}
	if (outer) {
		w->announcing = false;
		sweep(w);
	}
}

void rd_sv_watch_bump(struct rd_sv_watch *w)
{
	w->epoch++;
}

void rd_sv_watch_drop(struct rd_sv_watch *w, struct rd_conn *conn)
{
	struct rd_sv_watcher **p = &w->watchers;

	while (*p) {
		if ((*p)->call && (*p)->call->conn == conn) {
			struct rd_sv_watcher *gone = *p;
			struct rd_call *call = gone->call;

			gone->call = NULL;
			if (w->announcing) {
				p = &gone->next;
			} else {
				*p = gone->next;
				free(gone);
			}
			rd_call_reply(call, NULL, false);
		} else {
			p = &(*p)->next;
		}
	}
}

void rd_sv_watch_end(struct rd_sv_watch *w)
{
	while (w->watchers) {
		struct rd_sv_watcher *gone = w->watchers;
		struct rp_error err = { 0 };

		w->watchers = gone->next;
		if (!gone->call) {
			free(gone);
			continue;
		}
		rp_error_set(&err, RP_ERR_DRAINING, "regend is stopping");
		rp_error_add_int(&err, "device", -1);
		rp_error_add_int(&err, "generation", 0);
		rd_call_fail(gone->call, &err);
		free(gone);
	}
}
