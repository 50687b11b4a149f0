/* SPDX-License-Identifier: Apache-2.0 */
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>
#include "daemon/job.h"
#include "daemon/log.h"
#include "daemon/supervisor/keep.h"
#include "daemon/supervisor/supervisor.h"
#include "proto/errors.h"

struct kept_name {
	struct kept_name *next;
	char name[RP_KEPT_NAME_MAX + 1];
	enum rp_memory_kind kind;
	int device;                   /* cuda_fd's; -1 for host_fd */
	uint64_t size;
	int fd;                       /* what keeps the memory alive */
	uint64_t kept_unix_ms;
	/* Its record and fd in the fd store (-1, 0: none). */
	int slot;
	uint64_t serial;
	/* A cuda_fd that regend's restart brought back is checked by its
	 * device's worker before it is taken back. */
	bool checked;
};

struct kept_set {
	struct kept_set *next;
	uid_t uid;
	char job[RP_JOB_MAX + 1];
	uint32_t rank;
	bool has_step;
	uint64_t step;
	/* The process that last kept, committed or took back here; whether it
	 * still has a connection to the main socket. */
	struct rd_peer holder;
	bool held;
	/* Not held, and no worker runs work its holder submitted any more
	 * (take_back_settle found none): a TakeBack need not look again. */
	bool settled;
	uint32_t lease_ms;
	uint64_t expires_ns;          /* uv_hrtime() when the lease ends, while not held */
	uint64_t expires_unix_ms;
	struct kept_name *names;
	int slot;                     /* its record in the fd store's index, or -1 */
};

static struct rd_supervisor *supervisor_of(const struct rd_call *call)
{
	return call->conn->data;
}

static uint64_t unix_ms(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_REALTIME, &ts);
	return (uint64_t)ts.tv_sec * 1000u + (uint64_t)ts.tv_nsec / 1000000u;
}

static uint64_t set_bytes(const struct kept_set *s)
{
	uint64_t bytes = 0;

	for (const struct kept_name *n = s->names; n; n = n->next)
		bytes += n->size;
	return bytes;
}

static unsigned set_names(const struct kept_set *s)
{
	unsigned count = 0;

	for (const struct kept_name *n = s->names; n; n = n->next)
		count++;
	return count;
}

void rd_sv_keep_use_of_uid(const struct rd_sv_keep *k, uid_t uid, uint64_t *bytes, unsigned *names)
{
	*bytes = 0;
	*names = 0;
	for (const struct kept_set *s = k->sets; s; s = s->next) {
		if (s->uid != uid)
			continue;
		*bytes += set_bytes(s);
		*names += set_names(s);
	}
}

static struct kept_set *find_set(const struct rd_sv_keep *k, uid_t uid, const char *job, uint32_t rank)
{
	for (struct kept_set *s = k->sets; s; s = s->next)
		if (s->uid == uid && s->rank == rank && strcmp(s->job, job) == 0)
			return s;
	return NULL;
}

static struct kept_name *find_name(const struct kept_set *s, const char *name)
{
	for (struct kept_name *n = s->names; n; n = n->next)
		if (strcmp(n->name, name) == 0)
			return n;
	return NULL;
}

/* ---- The fd store's copy (keep_store.h) ---- */

static void store_set(struct rd_sv_keep *k, struct kept_set *s)
{
	struct rd_keep_record r = { .type = RD_KEEP_RECORD_SET };

	if (!k->store.on)
		return;
	if (s->slot < 0)
		s->slot = rd_keep_store_slot(&k->store);
	if (s->slot < 0) {
		rd_warn("keep", -1, 0, 0, "the fd store's index is full: %s/%" PRIu32 " does not outlive a restart of regend",
			s->job, s->rank);
		return;
	}
	r.uid = (uint32_t)s->uid;
	r.rank = s->rank;
	snprintf(r.job, sizeof(r.job), "%s", s->job);
	r.lease_ms = s->lease_ms;
	r.flags = (s->held ? RD_KEEP_RECORD_HELD : 0) | (s->has_step ? RD_KEEP_RECORD_HAS_STEP : 0);
	r.step = s->step;
	r.expires_unix_ms = s->held ? 0 : s->expires_unix_ms;
	r.holder_pid = (int32_t)s->holder.pid;
	rd_keep_store_write(&k->store, s->slot, &r);
}

static void store_name(struct rd_sv_keep *k, const struct kept_set *s, struct kept_name *n)
{
	struct rd_keep_record r = { .type = RD_KEEP_RECORD_NAME };

	if (!k->store.on || !n->serial)
		return;
	if (n->slot < 0)
		n->slot = rd_keep_store_slot(&k->store);
	if (n->slot < 0) {
		rd_warn("keep", -1, 0, 0, "the fd store's index is full: %s/%" PRIu32 "/%s does not outlive a restart of "
			"regend", s->job, s->rank, n->name);
		return;
	}
	r.uid = (uint32_t)s->uid;
	r.rank = s->rank;
	snprintf(r.job, sizeof(r.job), "%s", s->job);
	snprintf(r.name, sizeof(r.name), "%s", n->name);
	r.kind = (uint32_t)n->kind;
	r.device = n->device;
	r.size = n->size;
	r.serial = n->serial;
	r.kept_unix_ms = n->kept_unix_ms;
	rd_keep_store_write(&k->store, n->slot, &r);
}

/* The record first: a regend killed in between finds an fd no record
 * names, which it frees. */
static void name_free(struct rd_sv_keep *k, struct kept_name *n)
{
	rd_keep_store_release(&k->store, n->slot);
	rd_keep_store_remove_fd(&k->store, n->serial);
	if (n->fd >= 0)
		close(n->fd);
	free(n);
}

/* Unlinks and frees the set with every name in it. */
static void set_free(struct rd_sv_keep *k, struct kept_set *set)
{
	for (struct kept_set **p = &k->sets; *p; p = &(*p)->next) {
		if (*p == set) {
			*p = set->next;
			break;
		}
	}
	for (struct kept_name *n = set->names, *next; n; n = next) {
		next = n->next;
		name_free(k, n);
	}
	rd_keep_store_release(&k->store, set->slot);
	free(set);
}

/* ---- Leases ---- */

static void on_lease_end(uv_timer_t *t);

/* The timer waits for the soonest lease end, or for nothing. */
static void arm_lease_timer(struct rd_sv_keep *k)
{
	uint64_t soonest = UINT64_MAX, now = uv_hrtime();

	if (k->closed)
		return;
	for (const struct kept_set *s = k->sets; s; s = s->next)
		if (!s->held && s->expires_ns < soonest)
			soonest = s->expires_ns;
	if (soonest == UINT64_MAX) {
		uv_timer_stop(&k->lease_timer);
		return;
	}
	uv_timer_start(&k->lease_timer, on_lease_end, soonest > now ? (soonest - now + 999999) / 1000000 : 0, 0);
}

static void on_lease_end(uv_timer_t *t)
{
	struct rd_sv_keep *k = t->data;
	uint64_t now = uv_hrtime();

	for (struct kept_set *s = k->sets, *next; s; s = next) {
		next = s->next;
		if (s->held || s->expires_ns > now)
			continue;
		rd_info("keep", -1, 0, 0, "lease of %s/%" PRIu32 " (uid %u) ended after %" PRIu32
			" ms with no process holding it: %u name(s), %" PRIu64 " bytes freed",
			s->job, s->rank, (unsigned)s->uid, s->lease_ms, set_names(s), set_bytes(s));
		set_free(k, s);
	}
	arm_lease_timer(k);
}

static void start_lease(struct rd_sv_keep *k, struct kept_set *s)
{
	s->held = false;
	s->expires_ns = uv_hrtime() + (uint64_t)s->lease_ms * 1000000u;
	s->expires_unix_ms = unix_ms() + s->lease_ms;
	store_set(k, s);
	arm_lease_timer(k);
}

static bool process_connected(const struct rd_conn *sessions, const struct rd_peer *peer)
{
	for (const struct rd_conn *c = sessions; c; c = c->next)
		if (!c->closed && rd_peer_same_process(&c->peer, peer))
			return true;
	return false;
}

/* The caller's process holds the set from now on; if it is already gone
 * (its connection closed while its call was answered), the lease runs. */
static void hold(struct rd_sv_keep *k, struct kept_set *s, const struct rd_conn *conn, const struct rd_conn *sessions)
{
	s->holder = conn->peer;
	s->settled = false;
	if (process_connected(sessions, &conn->peer)) {
		s->held = true;
		store_set(k, s);
		arm_lease_timer(k);
	} else {
		start_lease(k, s);
	}
}

void rd_sv_keep_connection_closed(struct rd_sv_keep *k, const struct rd_conn *conn, const struct rd_conn *sessions)
{
	if (process_connected(sessions, &conn->peer))
		return;
	for (struct kept_set *s = k->sets; s; s = s->next) {
		if (!s->held || !rd_peer_same_process(&s->holder, &conn->peer))
			continue;
		rd_info("keep", -1, 0, conn->peer.pid, "%s/%" PRIu32 " (uid %u): its process is gone; kept for %" PRIu32
			" ms: %u name(s), %" PRIu64 " bytes", s->job, s->rank, (unsigned)s->uid, s->lease_ms,
			set_names(s), set_bytes(s));
		start_lease(k, s);
	}
}

void rd_sv_keep_init(struct rd_sv_keep *k, uv_loop_t *loop, const struct rd_options *opts)
{
	memset(k, 0, sizeof(*k));
	k->loop = loop;
	k->opts = opts;
	uv_timer_init(loop, &k->lease_timer);
	k->lease_timer.data = k;
	k->store.index_fd = -1;
	/* A lease does not keep regend running. */
	uv_unref((uv_handle_t *)&k->lease_timer);
}

void rd_sv_keep_close(struct rd_sv_keep *k)
{
	if (k->closed)
		return;
	k->closed = true;
	/* First: what the manager keeps stays there for the next start. */
	rd_keep_store_close(&k->store);
	while (k->sets)
		set_free(k, k->sets);
	uv_close((uv_handle_t *)&k->lease_timer, NULL);
}

/* ---- Listing ---- */

static void fill_kept(const struct kept_set *s, const struct kept_name *n, struct rp_kept *out)
{
	memset(out, 0, sizeof(*out));
	snprintf(out->job, sizeof(out->job), "%s", s->job);
	out->rank = s->rank;
	snprintf(out->name, sizeof(out->name), "%s", n->name);
	out->uid = (uint32_t)s->uid;
	out->kind = n->kind;
	out->has_device = n->device >= 0;
	out->device = n->device >= 0 ? (uint32_t)n->device : 0;
	out->size = n->size;
	out->has_step = s->has_step;
	out->step = s->step;
	out->held = s->held;
	out->has_holder_pid = s->held && s->holder.pid > 0;
	out->holder_pid = s->holder.pid;
	out->lease_ms = s->lease_ms;
	out->has_expires = !s->held;
	out->expires_unix_ms = s->expires_unix_ms;
	out->kept_unix_ms = n->kept_unix_ms;
}

static cJSON *kept_json(const struct kept_set *s, const struct kept_name *n)
{
	struct rp_kept kept;

	fill_kept(s, n, &kept);
	return rp_kept_encode(&kept);
}

cJSON *rd_sv_keep_list_json(const struct rd_sv_keep *k, const char *job, const uid_t *uid)
{
	cJSON *list = cJSON_CreateArray();

	for (const struct kept_set *s = k->sets; list && s; s = s->next) {
		if ((job && strcmp(job, s->job) != 0) || (uid && *uid != s->uid))
			continue;
		for (const struct kept_name *n = s->names; n; n = n->next) {
			cJSON *o = kept_json(s, n);
			if (!o || !cJSON_AddItemToArray(list, o)) {
				cJSON_Delete(o);
				cJSON_Delete(list);
				return NULL;
			}
		}
	}
	return list;
}

/* ---- What every method checks ---- */

/* The job a call names: its `job`, else the job that names the
 * connection. */
static int resolve_job(const struct rd_call *call, const struct rp_kept_key *key, char *job, struct rp_error *err)
{
	const char *conn_job;

	if (key->has_job) {
		snprintf(job, RP_JOB_MAX + 1, "%s", key->job);
		return 0;
	}
	rd_job_of(call->conn, &conn_job);
	if (!conn_job[0] || strlen(conn_job) > RP_JOB_MAX) {
		rp_err_invalid_job(err, "empty",
				   "no job names this connection: pass `job`, state one (io.regen.SetJob, $REGEN_JOB) or "
				   "run under a scheduler that gives the job a cgroup");
		return -EINVAL;
	}
	snprintf(job, RP_JOB_MAX + 1, "%s", conn_job);
	return 0;
}

/* Whose sets a call reaches: the caller's uid's, or (admins only) `uid`'s. */
static int resolve_uid(const struct rd_call *call, const struct rp_keep_select *sel, uid_t *uid, struct rp_error *err)
{
	*uid = call->conn->peer.uid;
	if (!sel->has_uid || sel->uid == (uint32_t)*uid)
		return 0;
	if (!call->conn->admin) {
		rp_err_not_permitted(err, call->msg.method,
				     "uid %u names another uid's kept memory (uid %" PRIu32
				     "): only root and the admin group may",
				     (unsigned)*uid, sel->uid);
		return -EPERM;
	}
	*uid = sel->uid;
	return 0;
}

static void fail_no_such(struct rd_call *call, const char *job, const uint32_t *rank, const char *name, uid_t uid)
{
	struct rp_error err = { 0 };
	char key[RP_KEPT_KEY_TEXT_MAX];

	rp_kept_key_text(job, rank, name, key, sizeof(key));
	rp_err_no_such_object(&err, key,
			      "uid %u keeps nothing as %s (never kept, dropped, or its lease ended: List shows what is "
			      "kept)",
			      (unsigned)uid, key);
	rd_call_fail(call, &err);
}

/* ---- Keep ---- */

/* Kept fds of every uid together stay under half the supervisor's fd
 * limit: the rest is for connections (and their fds in flight), so that
 * keeping cannot starve the main socket of accepts. */
static unsigned nofile_half(void)
{
	struct rlimit rl;

	if (getrlimit(RLIMIT_NOFILE, &rl) < 0 || rl.rlim_cur == RLIM_INFINITY || rl.rlim_cur > UINT32_MAX)
		return UINT32_MAX / 2;
	return (unsigned)(rl.rlim_cur / 2);
}

/* ... and within what the service manager's fd store takes, where it
 * keeps them across a restart. */
static unsigned kept_fds_max(const struct rd_sv_keep *k)
{
	unsigned half = nofile_half(), store = rd_keep_store_max_names(&k->store);

	return store < half ? store : half;
}

static unsigned kept_fds(const struct rd_sv_keep *k)
{
	unsigned n = 0;

	for (const struct kept_set *s = k->sets; s; s = s->next)
		n += set_names(s);
	return n;
}

/* A Keep whose memory is checked (a CUDA export by its device's worker),
 * or about to be entered. */
struct keep_pending {
	struct rd_call *call;
	struct rp_keep req;
	char job[RP_JOB_MAX + 1];
	uint32_t lease_ms;
	int fd;
};

static void pending_free(struct keep_pending *p)
{
	if (p->fd >= 0)
		close(p->fd);
	free(p);
}

/* The memory is what it says it is: the limits, then the table. */
static void keep_enter(struct keep_pending *p)
{
	struct rd_call *call = p->call;
	struct rd_supervisor *sv = supervisor_of(call);
	struct rd_sv_keep *k = &sv->keep;
	uid_t uid = call->conn->peer.uid;
	struct rp_error err = { 0 };
	struct kept_set *set = find_set(k, uid, p->job, p->req.key.rank);
	struct kept_name *old = set ? find_name(set, p->req.key.name) : NULL;
	uint64_t bytes, max_bytes = k->opts->max_kept_gib << 30;
	unsigned names;

	rd_sv_keep_use_of_uid(k, uid, &bytes, &names);
	if (old) {
		bytes -= old->size;
		names--;
	}
	if (names + 1 > k->opts->max_kept) {
		rp_err_limit_exceeded(&err, "kept names", k->opts->max_kept,
				      "uid %u keeps %u names already, max_kept (%u): drop some (io.regen.Keep.Drop, "
				      "regenctl drop)",
				      (unsigned)uid, names, k->opts->max_kept);
		goto fail;
	}
	if (!old && kept_fds(k) + 1 > kept_fds_max(k)) {
		rp_err_limit_exceeded(&err, "kept names", kept_fds_max(k),
				      "regend holds %u kept fds, half its fd limit (LimitNOFILE) or what the fd store "
				      "takes (FileDescriptorStoreMax= less one): every uid's kept memory together; raise "
				      "the limit or drop some",
				      kept_fds(k));
		goto fail;
	}
	if (p->req.size > max_bytes || bytes > max_bytes - p->req.size) {
		rp_err_limit_exceeded(&err, "kept bytes", (long long)max_bytes,
				      "uid %u keeps %" PRIu64 " bytes already; %" PRIu64
				      " more would pass max_kept_gib (%" PRIu64 " GiB): drop some",
				      (unsigned)uid, bytes, p->req.size, k->opts->max_kept_gib);
		goto fail;
	}
	struct kept_name *n = calloc(1, sizeof(*n));
	if (!n) {
		rp_err_out_of_memory(&err, -1, "no memory for the kept name");
		goto fail;
	}
	if (!set) {
		set = calloc(1, sizeof(*set));
		if (!set) {
			free(n);
			rp_err_out_of_memory(&err, -1, "no memory for the kept set");
			goto fail;
		}
		set->uid = uid;
		set->slot = -1;
		snprintf(set->job, sizeof(set->job), "%s", p->job);
		set->rank = p->req.key.rank;
		set->next = k->sets;
		k->sets = set;
	}
	snprintf(n->name, sizeof(n->name), "%s", p->req.key.name);
	n->kind = p->req.kind;
	n->device = p->req.kind == RP_MEMORY_CUDA_FD ? (int)p->req.device : -1;
	n->size = p->req.size;
	n->fd = p->fd;
	p->fd = -1;
	n->kept_unix_ms = unix_ms();
	n->checked = true;
	n->slot = -1;
	n->serial = rd_keep_store_add_fd(&k->store, n->fd);
	if (old) {
		for (struct kept_name **q = &set->names; *q; q = &(*q)->next) {
			if (*q == old) {
				*q = old->next;
				break;
			}
		}
		name_free(k, old);
	}
	n->next = set->names;
	set->names = n;
	set->lease_ms = p->lease_ms;
	store_name(k, set, n);
	hold(k, set, call->conn, sv->sessions);
	rd_info("keep", n->device, 0, call->conn->peer.pid, "uid %u keeps %s/%" PRIu32 "/%s: %s, %" PRIu64 " bytes%s",
		(unsigned)uid, set->job, set->rank, n->name, rp_memory_kind_name(n->kind), n->size,
		old ? " (in place of the one kept before)" : "");
	cJSON *reply = cJSON_CreateObject();
	cJSON *kept = kept_json(set, n);
	if (reply && kept)
		cJSON_AddItemToObject(reply, "kept", kept);
	else
		cJSON_Delete(kept);
	rd_call_reply(call, reply, false);
	pending_free(p);
	return;
fail:
	rd_call_fail(call, &err);
	pending_free(p);
}

static void on_export_checked(struct rd_conn *conn, const struct rp_call *reply, void *userdata)
{
	struct keep_pending *p = userdata;
	struct rp_error err = { 0 };

	(void)conn;
	if (!reply) {
		rp_err_draining(&err, p->req.device, 0,
				"device %" PRIu32 "'s worker went away while it checked the memory; keep it again once "
				"the device serves",
				p->req.device);
	} else if (reply->error) {
		const cJSON *m = cJSON_GetObjectItemCaseSensitive(reply->params, "message");
		rp_err_import_failed(&err, "cuda_fd", "device %" PRIu32 "'s worker refused the memory: %s", p->req.device,
				     cJSON_IsString(m) ? m->valuestring : reply->error);
	}
	if (err.name) {
		rd_call_fail(p->call, &err);
		pending_free(p);
		return;
	}
	keep_enter(p);
}

/* A memfd, sealed so that its size stays what is counted. */
static int check_host_fd(int fd, uint64_t size, struct rp_error *err)
{
	struct stat st;

	if (fstat(fd, &st) < 0 || !S_ISREG(st.st_mode)) {
		rp_err_import_failed(err, "host_fd", "the fd passed is not a memfd");
		return -EINVAL;
	}
	if (fcntl(fd, F_ADD_SEALS, F_SEAL_SHRINK | F_SEAL_GROW) < 0) {
		rp_err_import_failed(err, "host_fd",
				     "the fd cannot be sealed against shrinking and growing (%s): keep a memfd made "
				     "with MFD_ALLOW_SEALING whose seals are not sealed",
				     strerror(errno));
		return -EPERM;
	}
	if ((uint64_t)st.st_size != size) {
		rp_err_import_failed(err, "host_fd", "the memfd holds %lld bytes, not %" PRIu64, (long long)st.st_size,
				     size);
		return -EINVAL;
	}
	return 0;
}

void rd_sv_keep_keep(struct rd_call *call)
{
	struct rd_supervisor *sv = supervisor_of(call);
	struct rd_sv_keep *k = &sv->keep;
	struct rp_error err = { 0 };
	struct keep_pending *p = calloc(1, sizeof(*p));

	if (!p) {
		rp_err_out_of_memory(&err, -1, "no memory for the call");
		goto fail;
	}
	p->call = call;
	p->fd = -1;
	if (rp_keep_decode(call->msg.params, &p->req, &err) < 0 || resolve_job(call, &p->req.key, p->job, &err) < 0)
		goto fail;
	if (p->req.fd >= call->raw.nfds || call->raw.fds[p->req.fd] < 0) {
		rp_err_import_failed(&err, rp_memory_kind_name(p->req.kind),
				     "Keep needs 'fd': the index of a file descriptor passed with this message (%zu "
				     "passed)",
				     call->raw.nfds);
		goto fail;
	}
	p->lease_ms = p->req.has_lease ? (uint32_t)p->req.lease_ms : k->opts->keep_lease_ms;
	if (p->lease_ms > k->opts->keep_lease_ms) {
		rp_err_limit_exceeded(&err, "lease_ms", k->opts->keep_lease_ms,
				      "a lease of %" PRIu32 " ms is longer than keep_lease_ms (%u ms)", p->lease_ms,
				      k->opts->keep_lease_ms);
		goto fail;
	}
	p->fd = call->raw.fds[p->req.fd];
	call->raw.fds[p->req.fd] = -1;
	if (p->req.kind == RP_MEMORY_HOST_FD) {
		if (check_host_fd(p->fd, p->req.size, &err) < 0)
			goto fail;
		keep_enter(p);
		return;
	}
	/* CUDA memory: the supervisor cannot map it (it never touches CUDA);
	 * the device's worker checks it is what it says. */
	if (p->req.device >= (uint32_t)sv->ndevices) {
		rp_err_no_such_device(&err, p->req.device, "device %" PRIu32 " is not served; this regend has %d",
				      p->req.device, sv->ndevices);
		goto fail;
	}
	struct rd_sv_device *d = &sv->devices[p->req.device];
	if (!rd_sv_device_serving(d)) {
		rp_err_draining(&err, d->index, (long long)d->generation,
				"device %d is %s: its worker checks CUDA memory before regend keeps it; keep it again "
				"once the device serves",
				d->index, rp_state_name(d->state));
		goto fail;
	}
	cJSON *params = cJSON_CreateObject();
	cJSON_AddStringToObject(params, "kind", "cuda_fd");
	cJSON_AddNumberToObject(params, "fd", 0);
	cJSON_AddNumberToObject(params, "size", (double)p->req.size);
	if (rd_sv_device_call_fds(d, "io.regen.Worker.CheckExport", params, &p->fd, 1, on_export_checked, p) < 0) {
		rp_err_draining(&err, d->index, (long long)d->generation,
				"the control channel to device %d's worker is gone; keep it again once it serves",
				d->index);
		goto fail;
	}
	return;
fail:
	rd_call_fail(call, &err);
	if (p)
		pending_free(p);
}

/* ---- Restart: what the fd store kept ---- */

static bool restore_set(struct rd_sv_keep *k, const struct rd_keep_record *r)
{
	uint64_t now = unix_ms(), left;
	struct kept_set *s;

	if (find_set(k, (uid_t)r->uid, r->job, r->rank)) {
		rd_warn("keep", -1, 0, 0, "the fd store's index names %s/%" PRIu32 " of uid %u twice: the second is refused",
			r->job, r->rank, (unsigned)r->uid);
		return false;
	}
	s = calloc(1, sizeof(*s));
	if (!s)
		return false;
	s->uid = (uid_t)r->uid;
	snprintf(s->job, sizeof(s->job), "%.*s", RP_JOB_MAX, r->job);
	s->rank = r->rank;
	s->has_step = r->flags & RD_KEEP_RECORD_HAS_STEP;
	s->step = s->has_step ? r->step : 0;
	s->slot = -1;
	/* No worker of this regend runs anything of the holder's. */
	s->settled = true;
	s->lease_ms = r->lease_ms < k->opts->keep_lease_ms ? r->lease_ms : k->opts->keep_lease_ms;
	/* A held set's holder lost its connection with regend, not its life:
	 * the whole lease to come back. A leased one keeps its end, never
	 * past a whole lease from now. */
	left = s->lease_ms;
	if (!(r->flags & RD_KEEP_RECORD_HELD))
		left = r->expires_unix_ms <= now ? 0 : r->expires_unix_ms - now < left ? r->expires_unix_ms - now : left;
	s->held = false;
	s->expires_ns = uv_hrtime() + left * 1000000u;
	s->expires_unix_ms = now + left;
	s->next = k->sets;
	k->sets = s;
	store_set(k, s);
	return true;
}

/* A host_fd is what the record says: a memfd of its size, sealed as Keep
 * sealed it (so the size stays what is counted). A cuda_fd's worker
 * checks it at its first TakeBack. */
static const char *restored_fd_refusal(const struct rd_sv_keep *k, const struct rd_keep_record *r, int fd)
{
	struct stat st;
	int seals;

	if (fd < 0)
		return "its fd did not come back from the store";
	if (fstat(fd, &st) < 0)
		return "its fd cannot be read";
	if (r->kind == RP_MEMORY_CUDA_FD)
		return r->device < k->ndevices ? NULL : "its device is not one this regend serves";
	seals = fcntl(fd, F_GET_SEALS);
	if (!S_ISREG(st.st_mode) || seals < 0 || (seals & (F_SEAL_SHRINK | F_SEAL_GROW)) != (F_SEAL_SHRINK | F_SEAL_GROW))
		return "its fd is not a memfd sealed against shrinking and growing";
	if ((uint64_t)st.st_size != r->size)
		return "its memfd's size is not the record's";
	return NULL;
}

static bool restore_name(struct rd_sv_keep *k, const struct rd_keep_record *r, int fd)
{
	struct kept_set *s = find_set(k, (uid_t)r->uid, r->job, r->rank);
	const char *why = NULL;
	struct kept_name *n;

	if (!s)
		why = "no record of its set";
	else if (find_name(s, r->name))
		why = "its name is in the index twice";
	else if (kept_fds(k) + 1 > kept_fds_max(k))
		why = "regend holds as many kept fds as it may (LimitNOFILE, FileDescriptorStoreMax=)";
	else
		why = restored_fd_refusal(k, r, fd);
	if (why) {
		rd_warn("keep", r->device, 0, 0, "%s/%" PRIu32 "/%s (uid %u) from the fd store is refused: %s; freed", r->job,
			r->rank, r->name, (unsigned)r->uid, why);
		return false;
	}
	n = calloc(1, sizeof(*n));
	if (!n)
		return false;
	snprintf(n->name, sizeof(n->name), "%.*s", RP_KEPT_NAME_MAX, r->name);
	n->kind = (enum rp_memory_kind)r->kind;
	n->device = r->device;
	n->size = r->size;
	n->fd = fd;
	n->kept_unix_ms = r->kept_unix_ms;
	n->slot = -1;
	n->serial = r->serial;
	n->checked = r->kind != RP_MEMORY_CUDA_FD;
	n->next = s->names;
	s->names = n;
	store_name(k, s, n);
	return true;
}

static bool restore_record(const struct rd_keep_record *r, int fd, void *data)
{
	struct rd_sv_keep *k = data;

	return r->type == RD_KEEP_RECORD_SET ? restore_set(k, r) : restore_name(k, r, fd);
}

void rd_sv_keep_restore(struct rd_sv_keep *k, struct rd_passed_fds *passed, int ndevices)
{
	unsigned sets = 0, names = 0;
	uint64_t bytes = 0;

	k->ndevices = ndevices;
	rd_keep_store_open(&k->store, passed, nofile_half(), restore_record, k);
	/* A set whose every name was refused is not kept. */
	for (struct kept_set *s = k->sets, *next; s; s = next) {
		next = s->next;
		if (!s->names) {
			set_free(k, s);
			continue;
		}
		sets++;
		names += set_names(s);
		bytes += set_bytes(s);
	}
	if (sets)
		rd_info("keep", -1, 0, 0, "kept across regend's restart: %u set(s), %u name(s), %" PRIu64 " bytes", sets,
			names, bytes);
	arm_lease_timer(k);
}

/* ---- Commit, TakeBack, Drop, List ---- */

void rd_sv_keep_commit(struct rd_call *call)
{
	struct rd_supervisor *sv = supervisor_of(call);
	struct rp_error err = { 0 };
	struct rp_keep_commit req;
	struct kept_set *set;
	char job[RP_JOB_MAX + 1];

	if (rp_keep_commit_decode(call->msg.params, &req, &err) < 0 || resolve_job(call, &req.key, job, &err) < 0) {
		rd_call_fail(call, &err);
		return;
	}
	set = find_set(&sv->keep, call->conn->peer.uid, job, req.key.rank);
	if (!set) {
		fail_no_such(call, job, &req.key.rank, NULL, call->conn->peer.uid);
		return;
	}
	set->has_step = true;
	set->step = req.step;
	hold(&sv->keep, set, call->conn, sv->sessions);
	rd_trace("keep", -1, 0, call->conn->peer.pid, "%s/%" PRIu32 " committed step %" PRIu64, job, set->rank,
		 req.step);
	cJSON *reply = cJSON_CreateObject();
	cJSON_AddNumberToObject(reply, "names", set_names(set));
	rd_call_reply(call, reply, false);
}

/* The TakeBack of a set whose holder is gone waits until no worker holds a
 * connection of that process any more: a Run it queued just before it died
 * still runs there (a lane runs what was sent or published before its
 * close), and a rank that took the memory back before it finished would
 * read the step as not done and apply it a second time. At most
 * call_deadline_ms: past it, a call of the process has hung its device,
 * which the device's own deadline handles. */
#define SETTLE_POLL_MS 5

struct take_back_wait {
	struct rd_call *call;
	struct rd_peer holder;
	unsigned asked;                /* answers still to come this round */
	bool busy;                     /* some worker still holds the process's connections */
	uint64_t deadline_ns;
	uv_timer_t timer;
};

static void take_back_now(struct rd_call *call);
static void settle_ask(struct take_back_wait *t);
static void check_restored(struct rd_call *call, struct kept_set *set, struct kept_name *n);

static void wait_free(uv_handle_t *h)
{
	free(h->data);
}

static void settle_done(struct take_back_wait *t)
{
	struct rd_supervisor *sv = supervisor_of(t->call);

	for (struct kept_set *s = sv->keep.sets; s; s = s->next)
		if (!s->held && rd_peer_same_process(&s->holder, &t->holder))
			s->settled = true;
	take_back_now(t->call);
	uv_close((uv_handle_t *)&t->timer, wait_free);
}

static void on_settle_poll(uv_timer_t *timer)
{
	settle_ask(timer->data);
}

static void on_process_sessions(struct rd_conn *conn, const struct rp_call *reply, void *userdata)
{
	struct take_back_wait *t = userdata;

	(void)conn;
	/* A worker gone (no reply) holds nothing of anyone's any more. */
	if (reply && !reply->error) {
		const cJSON *n = cJSON_GetObjectItemCaseSensitive(reply->params, "sessions");
		const cJSON *alive = cJSON_GetObjectItemCaseSensitive(reply->params, "alive");
		if (cJSON_GetNumberValue(n) > 0 && !cJSON_IsTrue(alive))
			t->busy = true;
	}
	if (--t->asked)
		return;
	if (t->busy && uv_hrtime() < t->deadline_ns) {
		uv_timer_start(&t->timer, on_settle_poll, SETTLE_POLL_MS, 0);
		return;
	}
	if (t->busy)
		rd_warn("keep", -1, 0, t->call->conn->peer.pid,
			"process %d's work still runs after call_deadline_ms; its memory is taken back anyway",
			(int)t->holder.pid);
	settle_done(t);
}

static void settle_ask(struct take_back_wait *t)
{
	struct rd_supervisor *sv = supervisor_of(t->call);

	t->busy = false;
	t->asked = 1;   /* this function's own, so that no answer ends the round early */
	for (int i = 0; i < sv->ndevices; i++) {
		if (!rd_sv_device_serving(&sv->devices[i]))
			continue;
		cJSON *p = cJSON_CreateObject();
		cJSON_AddNumberToObject(p, "pid", t->holder.pid);
		cJSON_AddNumberToObject(p, "uid", t->holder.uid);
		cJSON_AddNumberToObject(p, "gid", t->holder.gid);
		cJSON_AddNumberToObject(p, "start_time", (double)t->holder.start_time);
		cJSON_AddNumberToObject(p, "pidfs_inode", (double)t->holder.pidfs_inode);
		if (rd_sv_device_call(&sv->devices[i], "io.regen.Worker.ProcessSessions", p, on_process_sessions, t) == 0)
			t->asked++;
	}
	on_process_sessions(NULL, NULL, t);
}

void rd_sv_keep_take_back(struct rd_call *call)
{
	struct rd_supervisor *sv = supervisor_of(call);
	struct rp_error err = { 0 };
	struct rp_keep_select req;
	struct kept_set *set;
	char job[RP_JOB_MAX + 1];
	uid_t uid;

	if (rp_keep_take_back_decode(call->msg.params, &req, &err) < 0 || resolve_job(call, &req.key, job, &err) < 0 ||
	    resolve_uid(call, &req, &uid, &err) < 0) {
		rd_call_fail(call, &err);
		return;
	}
	set = find_set(&sv->keep, uid, job, req.key.rank);
	/* A holder whose pid regend never saw cannot be asked about: its
	 * memory goes back as it is. */
	if (!set || set->held || set->settled || set->holder.token != 0 || set->holder.pid <= 0) {
		take_back_now(call);
		return;
	}
	struct take_back_wait *t = calloc(1, sizeof(*t));
	if (!t) {
		take_back_now(call);
		return;
	}
	t->call = call;
	t->holder = set->holder;
	t->deadline_ns = uv_hrtime() + (uint64_t)sv->opts.call_deadline_ms * 1000000u;
	uv_timer_init(sv->loop, &t->timer);
	t->timer.data = t;
	settle_ask(t);
}

/* A cuda_fd regend's restart brought back: its device's worker checks it
 * (as it checked it at Keep) before it goes to anyone; the TakeBack goes
 * on once it did. */
struct restored_check {
	struct rd_call *call;
	struct rd_sv_keep *k;
	uint64_t serial;
};

static struct kept_name *name_of_serial(struct rd_sv_keep *k, uint64_t serial, struct kept_set **set)
{
	for (struct kept_set *s = k->sets; s; s = s->next) {
		for (struct kept_name *n = s->names; n; n = n->next) {
			if (n->serial == serial) {
				*set = s;
				return n;
			}
		}
	}
	return NULL;
}

static void on_restored_checked(struct rd_conn *conn, const struct rp_call *reply, void *userdata)
{
	struct restored_check *c = userdata;
	struct rp_error err = { 0 };
	struct kept_set *set = NULL;
	struct kept_name *n = name_of_serial(c->k, c->serial, &set);

	(void)conn;
	if (n && !reply) {
		rp_err_draining(&err, n->device, 0,
				"device %d's worker went away while it checked the memory; take it back again once the "
				"device serves", n->device);
	} else if (n && reply->error) {
		const cJSON *m = cJSON_GetObjectItemCaseSensitive(reply->params, "message");
		rd_warn("keep", n->device, 0, 0, "%s/%" PRIu32 "/%s (uid %u), kept across regend's restart, is refused by "
			"device %d's worker (%s): freed", set->job, set->rank, n->name, (unsigned)set->uid, n->device,
			cJSON_IsString(m) ? m->valuestring : reply->error);
		rp_err_import_failed(&err, "cuda_fd", "device %d's worker refused the memory kept across regend's restart "
				     "(%s): it is freed", n->device, cJSON_IsString(m) ? m->valuestring : reply->error);
		for (struct kept_name **q = &set->names; *q; q = &(*q)->next) {
			if (*q == n) {
				*q = n->next;
				break;
			}
		}
		name_free(c->k, n);
		if (!set->names)
			set_free(c->k, set);
		arm_lease_timer(c->k);
	} else if (n) {
		n->checked = true;
	}
	if (err.name)
		rd_call_fail(c->call, &err);
	else
		take_back_now(c->call);   /* gone meanwhile: NoSuchObject */
	free(c);
}

static void check_restored(struct rd_call *call, struct kept_set *set, struct kept_name *n)
{
	struct rd_supervisor *sv = supervisor_of(call);
	struct rp_error err = { 0 };
	struct rd_sv_device *d = n->device >= 0 && n->device < sv->ndevices ? &sv->devices[n->device] : NULL;
	struct restored_check *c = NULL;

	(void)set;
	if (!d || !rd_sv_device_serving(d)) {
		rp_err_draining(&err, n->device, d ? (long long)d->generation : 0,
				"device %d is not serving: its worker checks the CUDA memory kept across regend's "
				"restart before it is taken back; take it back once the device serves", n->device);
		rd_call_fail(call, &err);
		return;
	}
	c = calloc(1, sizeof(*c));
	cJSON *params = cJSON_CreateObject();
	if (!c || !params) {
		free(c);
		cJSON_Delete(params);
		rp_err_out_of_memory(&err, -1, "no memory for the check");
		rd_call_fail(call, &err);
		return;
	}
	c->call = call;
	c->k = &sv->keep;
	c->serial = n->serial;
	cJSON_AddStringToObject(params, "kind", "cuda_fd");
	cJSON_AddNumberToObject(params, "fd", 0);
	cJSON_AddNumberToObject(params, "size", (double)n->size);
	if (rd_sv_device_call_fds(d, "io.regen.Worker.CheckExport", params, &n->fd, 1, on_restored_checked, c) < 0) {
		free(c);
		rp_err_draining(&err, d->index, (long long)d->generation,
				"the control channel to device %d's worker is gone; take it back again once it serves",
				d->index);
		rd_call_fail(call, &err);
	}
}

/* TakeBack, once no worker runs the holder's work any more. */
static void take_back_now(struct rd_call *call)
{
	struct rd_supervisor *sv = supervisor_of(call);
	struct rp_error err = { 0 };
	struct rp_keep_select req;
	struct kept_set *set;
	struct kept_name *n;
	char job[RP_JOB_MAX + 1];
	uid_t uid;
	int r;

	if (rp_keep_take_back_decode(call->msg.params, &req, &err) < 0 || resolve_job(call, &req.key, job, &err) < 0 ||
	    resolve_uid(call, &req, &uid, &err) < 0) {
		rd_call_fail(call, &err);
		return;
	}
	set = find_set(&sv->keep, uid, job, req.key.rank);
	n = set ? find_name(set, req.key.name) : NULL;
	if (!n) {
		fail_no_such(call, job, &req.key.rank, req.key.name, uid);
		return;
	}
	if (!n->checked) {
		check_restored(call, set, n);
		return;
	}
	hold(&sv->keep, set, call->conn, sv->sessions);
	cJSON *reply = cJSON_CreateObject();
	cJSON *kept = kept_json(set, n);
	if (!reply || !kept) {
		cJSON_Delete(reply);
		cJSON_Delete(kept);
		rp_err_out_of_memory(&err, -1, "no memory for the reply");
		rd_call_fail(call, &err);
		return;
	}
	cJSON_AddItemToObject(reply, "kept", kept);
	cJSON_AddNumberToObject(reply, "fd", 0);
	rd_info("keep", n->device, 0, call->conn->peer.pid, "uid %u takes back %s/%" PRIu32 "/%s (%" PRIu64 " bytes)",
		(unsigned)call->conn->peer.uid, job, set->rank, n->name, n->size);
	r = rd_call_reply_fds(call, reply, &n->fd, 1);
	if (r < 0) {
		rp_err_limit_exceeded(&err, "file descriptors", 0, "regend cannot pass the memory's fd now: %s",
				      strerror(-r));
		rd_call_fail(call, &err);
	}
}

void rd_sv_keep_drop(struct rd_call *call)
{
	struct rd_supervisor *sv = supervisor_of(call);
	struct rd_sv_keep *k = &sv->keep;
	struct rp_error err = { 0 };
	struct rp_keep_select req;
	uint64_t bytes = 0;
	unsigned names = 0;
	uid_t uid;

	if (rp_keep_drop_decode(call->msg.params, &req, &err) < 0 || resolve_uid(call, &req, &uid, &err) < 0) {
		rd_call_fail(call, &err);
		return;
	}
	for (struct kept_set *s = k->sets, *next; s; s = next) {
		next = s->next;
		if (s->uid != uid || strcmp(s->job, req.key.job) != 0 || (req.key.has_rank && s->rank != req.key.rank))
			continue;
		for (struct kept_name **q = &s->names; *q;) {
			struct kept_name *n = *q;
			if (req.key.has_name && strcmp(n->name, req.key.name) != 0) {
				q = &n->next;
				continue;
			}
			*q = n->next;
			names++;
			bytes += n->size;
			name_free(k, n);
		}
		if (!s->names)
			set_free(k, s);
	}
	arm_lease_timer(k);
	if (names)
		rd_info("keep", -1, 0, call->conn->peer.pid, "uid %u dropped %u name(s) of uid %u's job %s: %" PRIu64
			" bytes freed", (unsigned)call->conn->peer.uid, names, (unsigned)uid, req.key.job, bytes);
	cJSON *reply = cJSON_CreateObject();
	cJSON_AddNumberToObject(reply, "names", names);
	cJSON_AddNumberToObject(reply, "bytes", (double)bytes);
	rd_call_reply(call, reply, false);
}

void rd_sv_keep_list(struct rd_call *call)
{
	struct rd_supervisor *sv = supervisor_of(call);
	struct rp_error err = { 0 };
	struct rp_keep_select req;
	uid_t uid;

	if (rp_keep_list_decode(call->msg.params, &req, &err) < 0) {
		rd_call_fail(call, &err);
		return;
	}
	uid = req.uid;
	cJSON *list = rd_sv_keep_list_json(&sv->keep, req.key.has_job ? req.key.job : NULL, req.has_uid ? &uid : NULL);
	cJSON *reply = cJSON_CreateObject();
	if (!list || !reply) {
		cJSON_Delete(list);
		cJSON_Delete(reply);
		rp_err_out_of_memory(&err, -1, "no memory for the list");
		rd_call_fail(call, &err);
		return;
	}
	cJSON_AddItemToObject(reply, "kept", list);
	rd_call_reply(call, reply, false);
}
