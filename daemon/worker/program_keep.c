/* SPDX-License-Identifier: Apache-2.0 */
/* Programs outlive their worker: a definition outlives generations, and a
 * worker's death (a crash, a kill, a respawn) is a generation change like
 * another. The rank does not define its programs again; it only binds
 * again what did not survive (its buffers and events, per generation).
 *
 * Each program a process defines is told to the supervisor
 * (io.regen.Worker.KeepProgram: the Define call's text in a sealed memfd,
 * and the owner's identity as its socket gave it), and each one a process
 * lets go (ForgetProgram: a Drop, its last connection closed, or its
 * process gone). The supervisor keeps them per device
 * (daemon/supervisor/kept_programs.h) and hands them to the next worker
 * (--programs-fd), which, before it listens, checks each one's process
 * (still there, still the same: daemon/peer.h), parses and checks the
 * definition again (the same limits), and adds it under its old id to a
 * client of that process that has no connection yet. The process's first
 * connection takes that client over, and from there its programs live and
 * go as any others. A process that exits without connecting again lets
 * them go then (a pidfd watched on the loop). A second process never sees
 * them: ids are bound to the process (objects.c).
 *
 * What is not kept: programs of a process bound to its connection (its pid
 * unseen: no later connection can be it), and a program whose KeepProgram
 * the supervisor never read (it is written to the channel before Define's
 * reply, so a caller that heard of the program finds it kept). A worker
 * that stops on purpose (SIGTERM: regend stops, or its device is detached)
 * forgets nothing: the next worker defines them again. */
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>
#include "daemon/log.h"
#include "daemon/worker/session.h"
#include "proto/errors.h"
#include "proto/ids.h"
#include "proto/program.h"

/* A process whose programs came back with no connection of it: its pidfd,
 * readable once it exits. */
struct rd_kept_owner {
	struct rd_kept_owner *next;
	struct rd_worker *worker;
	struct rd_peer peer;
	uv_poll_t poll;
	int pidfd;
};

static void decimal(cJSON *o, const char *name, uint64_t v)
{
	char text[24];

	snprintf(text, sizeof(text), "%" PRIu64, v);
	cJSON_AddStringToObject(o, name, text);
}

void rd_program_keep(struct rd_worker *w, const struct rd_program *prog, const struct rd_client *owner,
		     const char *message, size_t len)
{
	const struct rd_peer *peer = &owner->peer;
	char id[RP_ID_MAX];
	int fd;

	if (!w->ctl || peer->token || !message)
		return;
	rp_id_format(&prog->obj.id, id);
	fd = memfd_create("regen-program", MFD_CLOEXEC | MFD_ALLOW_SEALING);
	if (fd < 0 || write(fd, message, len) != (ssize_t)len ||
	    fcntl(fd, F_ADD_SEALS, F_SEAL_SHRINK | F_SEAL_GROW | F_SEAL_WRITE | F_SEAL_SEAL) < 0) {
		rd_warn("program", w->dev.index, rd_worker_generation(w), peer->pid,
			"program %s will not outlive this worker: its definition cannot be handed on (%s)", id,
			strerror(errno));
		if (fd >= 0)
			close(fd);
		return;
	}
	cJSON *p = cJSON_CreateObject();
	cJSON_AddStringToObject(p, "program", id);
	cJSON_AddNumberToObject(p, "pid", peer->pid);
	cJSON_AddNumberToObject(p, "uid", peer->uid);
	cJSON_AddNumberToObject(p, "gid", peer->gid);
	decimal(p, "start_time", peer->start_time);
	decimal(p, "pidfs_inode", peer->pidfs_inode);
	cJSON_AddNumberToObject(p, "nodes", prog->def->nnodes);
	rd_conn_call_fds(w->ctl, "io.regen.Worker.KeepProgram", p, &fd, 1, true, NULL, NULL);
	close(fd);
	/* In the socket before the caller hears of the program. */
	rd_conn_flush(w->ctl);
}

static void forget_id(struct rd_worker *w, const char *id)
{
	cJSON *p;

	if (!w->ctl)
		return;
	p = cJSON_CreateObject();
	cJSON_AddStringToObject(p, "program", id);
	rd_conn_call(w->ctl, "io.regen.Worker.ForgetProgram", p, true, NULL, NULL);
}

/* objects.c's hook: an object left the table. A worker that stops keeps
 * its programs for the next. */
static void on_object_closed(struct rd_object *o, void *data)
{
	struct rd_worker *w = data;
	char id[RP_ID_MAX];

	if (rd_object_kind_of(o) != RD_OBJECT_PROGRAM || w->state == RD_WORKER_STOPPING)
		return;
	forget_id(w, rp_id_format(&o->id, id));
}

/* ---- owners with no connection ---- */

static void owner_freed(uv_handle_t *h)
{
	struct rd_kept_owner *k = h->data;

	close(k->pidfd);
	free(k);
}

static void owner_drop(struct rd_kept_owner *k)
{
	struct rd_worker *w = k->worker;

	for (struct rd_kept_owner **pp = &w->kept_owners; *pp; pp = &(*pp)->next)
		if (*pp == k) {
			*pp = k->next;
			break;
		}
	uv_poll_stop(&k->poll);
	uv_close((uv_handle_t *)&k->poll, owner_freed);
}

static void on_owner_exit(uv_poll_t *poll, int status, int events)
{
	struct rd_kept_owner *k = poll->data;
	struct rd_worker *w = k->worker;

	rd_debug("program", w->dev.index, rd_worker_generation(w), k->peer.pid,
		 "the process exited: the programs it had not come back for go");
	/* One that connected meanwhile lets them go with its last connection. */
	rd_objects_client_gone(&w->objects, &k->peer);
	owner_drop(k);
}

/* Watches the process of pidfd (taken) until it exits, once per process. */
static void owner_watch(struct rd_worker *w, const struct rd_peer *peer, int pidfd)
{
	struct rd_kept_owner *k;

	for (k = w->kept_owners; k; k = k->next)
		if (rd_peer_same_process(&k->peer, peer)) {
			close(pidfd);
			return;
		}
	k = calloc(1, sizeof(*k));
	if (!k || uv_poll_init(w->loop, &k->poll, pidfd) < 0) {
		/* Unwatched, its programs stay until the process connects and
		 * leaves, or the worker goes. */
		free(k);
		close(pidfd);
		return;
	}
	k->worker = w;
	k->peer = *peer;
	k->pidfd = pidfd;
	k->poll.data = k;
	k->next = w->kept_owners;
	w->kept_owners = k;
	uv_poll_start(&k->poll, UV_READABLE, on_owner_exit);
}

void rd_program_keep_stop(struct rd_worker *w)
{
	while (w->kept_owners)
		owner_drop(w->kept_owners);
}

/* ---- defining them again ---- */

static uint64_t record_decimal(const cJSON *rec, const char *name)
{
	const char *text = cJSON_GetStringValue(cJSON_GetObjectItemCaseSensitive(rec, name));
	char *end;
	unsigned long long v;

	if (!text || !*text)
		return 0;
	errno = 0;
	v = strtoull(text, &end, 10);
	return errno || *end ? 0 : (uint64_t)v;
}

static int record_int(const cJSON *rec, const char *name)
{
	const cJSON *n = cJSON_GetObjectItemCaseSensitive(rec, name);

	return cJSON_IsNumber(n) ? (int)n->valuedouble : -1;
}

/* One kept program: 1 defined again, 0 forgotten (its process is gone, or
 * the definition no longer passes), -ENOMEM. */
static int restore_one(struct rd_worker *w, const cJSON *rec, const char *id)
{
	const char *message = cJSON_GetStringValue(cJSON_GetObjectItemCaseSensitive(rec, "message"));
	struct rp_error err = { 0 };
	struct rp_call call = { 0 };
	struct rd_program *prog;
	struct rd_client *owner;
	struct rd_peer peer;
	struct rp_id rid;
	int pidfd, r;

	memset(&peer, 0, sizeof(peer));
	peer.pid = record_int(rec, "pid");
	peer.uid = (uid_t)record_int(rec, "uid");
	peer.gid = (gid_t)record_int(rec, "gid");
	peer.start_time = record_decimal(rec, "start_time");
	peer.pidfs_inode = record_decimal(rec, "pidfs_inode");
	if (rp_id_parse(id, &rid) < 0 || rid.kind != RP_ID_PROGRAM || rid.device != (uint32_t)w->dev.index ||
	    rid.generation != 0 || !message) {
		rd_warn("program", w->dev.index, rd_worker_generation(w), peer.pid,
			"a kept program '%s' is not one of this device's: forgotten", id);
		return 0;
	}
	pidfd = rd_peer_open_process(&peer);
	if (pidfd == -ESRCH) {
		rd_debug("program", w->dev.index, rd_worker_generation(w), peer.pid,
			 "program %s: its process is gone; forgotten", id);
		return 0;
	}
	struct rp_program *def = calloc(1, sizeof(*def));
	if (!def) {
		r = -ENOMEM;
		goto out;
	}
	r = rp_call_parse(message, strlen(message), &call, &err);
	if (r == 0)
		r = rp_program_parse(call.params, def, &err);
	owner = r == 0 ? rd_objects_client_keep(&w->objects, &peer) : NULL;
	if (r == 0 && !owner)
		r = -ENOMEM;
	if (r == 0)
		r = rd_program_add(w, owner, def, rid.serial, &prog, &err);
	if (r < 0) {
		const char *why = err.params ? cJSON_GetStringValue(cJSON_GetObjectItem(err.params, "message")) : NULL;
		rd_warn("program", w->dev.index, rd_worker_generation(w), peer.pid,
			"program %s cannot be defined again (%s): forgotten; its process defines it again on NoSuchObject",
			id, why ? why : err.name ? err.name : strerror(-r));
		rp_program_finish(def);
		free(def);
		/* A client kept for nothing goes. */
		if (owner && owner->connections == 0 && !owner->count[RD_OBJECT_PROGRAM])
			rd_objects_client_gone(&w->objects, &peer);
		r = r == -ENOMEM ? -ENOMEM : 0;
		goto out;
	}
	if (pidfd >= 0) {
		owner_watch(w, &peer, pidfd);
		pidfd = -1;
	}
	r = 1;
out:
	if (pidfd >= 0)
		close(pidfd);
	rp_call_finish(&call);
	rp_error_clear(&err);
	return r;
}

void rd_program_keep_start(struct rd_worker *w, int fd)
{
	unsigned defined = 0, forgotten = 0;
	struct stat st;
	char *text = NULL;

	w->objects.closed = on_object_closed;
	w->objects.closed_data = w;
	if (fd < 0)
		return;
	if (fstat(fd, &st) < 0 || st.st_size <= 0 ||
	    (text = mmap(NULL, (size_t)st.st_size, PROT_READ, MAP_PRIVATE, fd, 0)) == MAP_FAILED) {
		if (st.st_size > 0)
			rd_warn("program", w->dev.index, rd_worker_generation(w), 0,
				"the programs kept from earlier workers cannot be read (%s): none defined again",
				strerror(errno));
		close(fd);
		return;
	}
	/* Records, each a JSON object and a NUL (kept_programs.h). */
	for (size_t at = 0; at < (size_t)st.st_size;) {
		const char *rec_text = text + at;
		size_t n = strnlen(rec_text, (size_t)st.st_size - at);
		cJSON *rec = n < (size_t)st.st_size - at ? cJSON_ParseWithLength(rec_text, n) : NULL;
		const char *id = cJSON_GetStringValue(cJSON_GetObjectItemCaseSensitive(rec, "program"));
		int r = id ? restore_one(w, rec, id) : 0;

		if (r > 0) {
			defined++;
		} else {
			forgotten++;
			if (id)
				forget_id(w, id);
		}
		cJSON_Delete(rec);
		at += n + 1;
	}
	munmap(text, (size_t)st.st_size);
	close(fd);
	rd_info("program", w->dev.index, rd_worker_generation(w), 0,
		"defined again %u program(s) kept from earlier workers under their ids; %u forgotten", defined,
		forgotten);
}
