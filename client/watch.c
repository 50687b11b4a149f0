/* SPDX-License-Identifier: Apache-2.0 */
/* libregen: io.regen.Device.Watch, on a connection of its own: a call with
 * "more", then one reply per event. */
#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include "private.h"
#include "proto/device.h"

struct regen_watcher {
	regen_client *client;
	struct rc_conn conn;
	struct rp_call call;          /* the last reply: ev's strings point into it */
	bool have_call;
	bool ended;                   /* the daemon sent its last reply */
	unsigned long forks;          /* rc_forks when it was opened */
	struct regen_watch_event ev;
};

REGEN_EXPORT void regen_watcher_close(regen_watcher *w)
{
	if (w == NULL) {
		return;
	}
	if (w->have_call) {
		rp_call_finish(&w->call);
	}
	rc_conn_close(&w->conn);
	rp_rx_finish(&w->conn.rx);
	free(w);
}

REGEN_EXPORT int regen_watcher_open(regen_client *c, regen_watcher **out)
{
	int64_t deadline;
	regen_watcher *w;
	char *text = NULL;
	int r;

	if (out != NULL) {
		*out = NULL;
	}
	if (c == NULL || out == NULL) {
		return -EINVAL;
	}
	rc_clear_error(c);
	w = calloc(1, sizeof(*w));
	if (w == NULL) {
		return -ENOMEM;
	}
	w->client = c;
	w->forks = rc_forks;
	rc_conn_init(&w->conn);
	text = rp_build_call(RP_DEVICE_WATCH, NULL, true, false);
	if (text == NULL) {
		r = -ENOMEM;
		goto fail;
	}
	deadline = rc_deadline(c->timeout_s);
	r = rc_conn_open(&w->conn, c->socket_path, deadline, false);
	if (r < 0) {
		rc_set_local_error(c, "cannot connect to %s: %s", c->socket_path, strerror(-r));
		goto fail;
	}
	r = rc_conn_send(&w->conn, text, NULL, 0, deadline);
	if (r < 0) {
		rc_set_local_error(c, "cannot subscribe to Watch on %s: %s", c->socket_path, strerror(-r));
		goto fail;
	}
	free(text);
	*out = w;
	return 0;
fail:
	free(text);
	regen_watcher_close(w);
	return r;
}

REGEN_EXPORT int regen_watcher_next(regen_watcher *w, double timeout_s, const struct regen_watch_event **ev)
{
	regen_client *c;
	struct rp_msg msg = { 0 };
	struct rp_error perr = { 0 };
	struct rp_watch_event decoded;
	int r;

	if (ev != NULL) {
		*ev = NULL;
	}
	if (w == NULL || ev == NULL) {
		return -EINVAL;
	}
	c = w->client;
	rc_clear_error(c);
	if (w->have_call) {
		rp_call_finish(&w->call);
		w->have_call = false;
	}
	if (w->forks != rc_forks) {
		/* Its events are the parent's to read: a read here would take
		 * them from it. Only the child's copy of the socket is closed. */
		rc_conn_close(&w->conn);
		w->forks = rc_forks;
		w->ended = true;
		rc_set_local_error(c, "this watcher was opened by the parent process before this one was forked: "
				      "open another");
		return -ECONNRESET;
	}
	if (w->ended) {
		rc_set_local_error(c, "the daemon ended the Watch stream");
		return -ENODATA;
	}
	r = rc_conn_recv(&w->conn, &msg, rc_deadline(timeout_s));
	if (r == -ETIMEDOUT) {
		rc_set_local_error(c, "no Watch event before the timeout");
		return r;
	}
	if (r < 0) {
		rc_set_local_error(c, "the Watch connection ended");
		rc_conn_close(&w->conn);
		return r == -EMSGSIZE ? -EPROTO : -ECONNRESET;
	}
	r = rp_call_parse(msg.text, msg.len, &w->call, &perr);
	rc_msg_drop(&msg);
	if (r < 0) {
		rp_error_clear(&perr);
		rc_set_local_error(c, "unparsable Watch reply");
		rc_conn_close(&w->conn);
		return -EPROTO;
	}
	w->have_call = true;
	if (w->call.error != NULL) {
		rc_set_remote_error(c, w->call.error, w->call.params);
		w->ended = true;
		return -EREMOTE;
	}
	if (w->call.method != NULL) {
		rc_set_local_error(c, "%s sent a call where a Watch reply was expected", w->conn.path);
		rc_conn_close(&w->conn);
		return -EPROTO;
	}
	if (rp_watch_event_decode(w->call.params, &decoded, &perr) < 0) {
		rc_conn_close(&w->conn);
		return rc_malformed_reply(c, RP_DEVICE_WATCH, &perr);
	}
	w->ended = !w->call.continues;
	memset(&w->ev, 0, sizeof(w->ev));
	w->ev.size = sizeof(w->ev);
	w->ev.epoch = decoded.epoch;
	w->ev.device = decoded.device > INT32_MAX ? -1 : (int)decoded.device;
	w->ev.generation = decoded.generation;
	w->ev.state = rp_state_name(decoded.state);
	w->ev.reason = decoded.reason;
	rc_note_generation(c, w->ev.device, w->ev.generation);
	*ev = &w->ev;
	return 0;
}

REGEN_EXPORT int regen_watch_full(regen_client *c, double timeout_s, double total_s, regen_watch_cb cb,
				  void *userdata)
{
	int64_t total = rc_deadline(total_s), now;
	const struct regen_watch_event *ev;
	regen_watcher *w = NULL;
	double wait_s;
	int r;

	if (c == NULL || cb == NULL) {
		return -EINVAL;
	}
	r = regen_watcher_open(c, &w);
	while (r == 0) {
		wait_s = timeout_s;
		if (total != RC_FOREVER) {
			now = rc_now_ms();
			if (now >= total) {
				r = -ETIMEDOUT;
				rc_set_local_error(c, "no Watch event before the timeout");
				break;
			}
			if (!(wait_s > 0) || wait_s * 1000.0 > (double)(total - now)) {
				wait_s = (double)(total - now) / 1000.0;
			}
		}
		r = regen_watcher_next(w, wait_s, &ev);
		if (r == -ENODATA) {
			/* The daemon ended the stream after the last event. */
			r = 0;
			break;
		}
		if (r == 0 && cb(ev, userdata) != 0) {
			break;
		}
	}
	regen_watcher_close(w);
	return r;
}

REGEN_EXPORT int regen_watch(regen_client *c, double timeout_s, regen_watch_cb cb, void *userdata)
{
	return regen_watch_full(c, timeout_s, 0, cb, userdata);
}
