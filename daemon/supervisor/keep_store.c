/* SPDX-License-Identifier: Apache-2.0 */
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>
#include "daemon/log.h"
#include "daemon/supervisor/keep_store.h"

#define INDEX_MAGIC UINT64_C(0x78697065656b6772)   /* "rgkeepix" */
/* Changes with the header's or a record's layout: a regend of another
 * layout finds no index it can read, and what was kept is freed. */
#define INDEX_LAYOUT 1
#define RECORD_BYTES sizeof(struct rd_keep_record)
/* Two slots a name (its own and, at most, its set's): the most the index
 * holds is 2^18 slots, 128 MiB of a memfd of which only the written pages
 * take memory. */
#define INDEX_SLOTS_MAX (UINT32_C(1) << 18)

struct index_header {
	uint64_t magic;
	uint32_t layout;
	uint32_t record_bytes;
	uint32_t nslots;
	uint32_t reserved0;
	uint64_t generation;
	uint64_t check;            /* FNV-1a 64 of the header's bytes before it */
	uint8_t reserved[24];
};
_Static_assert(sizeof(struct index_header) == 64, "the index header is 64 bytes");

/* A checksum against torn and stray writes, not against an adversary:
 * only regend and the service manager hold the index's fd. */
static uint64_t fnv1a(const void *data, size_t len)
{
	const uint8_t *p = data;
	uint64_t h = UINT64_C(0xcbf29ce484222325);

	for (size_t i = 0; i < len; i++) {
		h ^= p[i];
		h *= UINT64_C(0x100000001b3);
	}
	return h;
}

uint64_t rd_keep_record_checksum(const struct rd_keep_record *r)
{
	return fnv1a((const uint8_t *)r + sizeof(r->check), RECORD_BYTES - sizeof(r->check));
}

static size_t index_bytes(uint32_t nslots)
{
	return sizeof(struct index_header) + (size_t)nslots * 2 * RECORD_BYTES;
}

static struct rd_keep_record *copy_at(uint8_t *map, uint32_t slot, int copy)
{
	return (struct rd_keep_record *)(map + sizeof(struct index_header) + ((size_t)slot * 2 + (size_t)copy) * RECORD_BYTES);
}

/* ---- Checking what is read back ---- */

/* 1 to max bytes, NUL-terminated within the field, of printable ASCII
 * without spaces: what a job (stated or a cgroup's) and a kept name are. */
static bool text_ok(const char *s, size_t field, size_t max)
{
	size_t len = strnlen(s, field);

	if (len == 0 || len == field || len > max)
		return false;
	for (size_t i = 0; i < len; i++)
		if ((unsigned char)s[i] < 0x21 || (unsigned char)s[i] > 0x7e)
			return false;
	return true;
}

int rd_keep_record_check(const struct rd_keep_record *r, char *why, size_t size)
{
	const char *bad = NULL;

	if (r->type != RD_KEEP_RECORD_SET && r->type != RD_KEEP_RECORD_NAME)
		bad = "its type is neither a set's nor a name's";
	else if (!text_ok(r->job, sizeof(r->job), RP_JOB_MAX))
		bad = "its job is not 1 to 64 printable bytes";
	else if (r->rank > RP_KEPT_RANK_MAX)
		bad = "its rank is past 2^31 - 1";
	else if (r->type == RD_KEEP_RECORD_SET && (r->flags & ~(RD_KEEP_RECORD_HELD | RD_KEEP_RECORD_HAS_STEP)))
		bad = "its flags are not a set's";
	else if (r->type == RD_KEEP_RECORD_SET && (r->flags & RD_KEEP_RECORD_HAS_STEP) && r->step > RP_KEPT_STEP_MAX)
		bad = "its step is past 2^53";
	else if (r->type == RD_KEEP_RECORD_NAME && rp_kept_name_check(r->name, NULL) < 0)
		bad = "its name is not 1 to 64 bytes of A-Z a-z 0-9 _ . : -";
	else if (r->type == RD_KEEP_RECORD_NAME && r->kind >= RP_MEMORY_KINDS)
		bad = "its kind is neither host_fd nor cuda_fd";
	else if (r->type == RD_KEEP_RECORD_NAME && ((r->kind == RP_MEMORY_CUDA_FD) != (r->device >= 0)))
		bad = "its device does not fit its kind";
	else if (r->type == RD_KEEP_RECORD_NAME && (r->size == 0 || r->size > RP_KEPT_SIZE_MAX))
		bad = "its size is 0 or past 2^48";
	else if (r->type == RD_KEEP_RECORD_NAME && r->serial == 0)
		bad = "it names no fd";
	if (bad) {
		snprintf(why, size, "%s", bad);
		return -EINVAL;
	}
	return 0;
}

/* The newer of a slot's two copies that is whole, or NULL. */
static const struct rd_keep_record *newest_copy(uint8_t *map, uint32_t slot)
{
	const struct rd_keep_record *best = NULL;

	for (int c = 0; c < 2; c++) {
		const struct rd_keep_record *r = copy_at(map, slot, c);
		if (r->check != rd_keep_record_checksum(r))
			continue;
		if (!best || r->version > best->version)
			best = r;
	}
	return best;
}

/* An index of an earlier regend, mapped read-only where it is whole: a
 * memfd sealed against shrinking and growing (so reading it cannot fault
 * however its holder changed it), of the size its header says, with the
 * generation its name says. */
static uint8_t *map_old_index(int fd, uint64_t generation, uint32_t *nslots, size_t *bytes, char *why, size_t size)
{
	struct index_header h;
	struct stat st;
	int seals;
	uint8_t *map;

	if (fstat(fd, &st) < 0 || !S_ISREG(st.st_mode)) {
		snprintf(why, size, "it is not a memfd");
		return NULL;
	}
	seals = fcntl(fd, F_GET_SEALS);
	if (seals < 0 || (seals & (F_SEAL_SHRINK | F_SEAL_GROW)) != (F_SEAL_SHRINK | F_SEAL_GROW)) {
		snprintf(why, size, "it is not sealed against shrinking and growing");
		return NULL;
	}
	if ((uint64_t)st.st_size < sizeof(h) || pread(fd, &h, sizeof(h), 0) != (ssize_t)sizeof(h)) {
		snprintf(why, size, "it holds %lld bytes, less than a header", (long long)st.st_size);
		return NULL;
	}
	if (h.magic != INDEX_MAGIC || h.layout != INDEX_LAYOUT || h.record_bytes != RECORD_BYTES ||
	    h.check != fnv1a(&h, offsetof(struct index_header, check))) {
		snprintf(why, size, "its header is not that of layout %d (another regend's, or damaged)", INDEX_LAYOUT);
		return NULL;
	}
	if (h.nslots == 0 || h.nslots > INDEX_SLOTS_MAX || (uint64_t)st.st_size != index_bytes(h.nslots)) {
		snprintf(why, size, "its size (%lld bytes) is not what its %" PRIu32 " slots take", (long long)st.st_size,
			 h.nslots);
		return NULL;
	}
	if (h.generation != generation) {
		snprintf(why, size, "its header's generation %" PRIu64 " is not its name's", h.generation);
		return NULL;
	}
	map = mmap(NULL, (size_t)st.st_size, PROT_READ, MAP_SHARED, fd, 0);
	if (map == MAP_FAILED) {
		snprintf(why, size, "mmap: %s", strerror(errno));
		return NULL;
	}
	*nslots = h.nslots;
	*bytes = (size_t)st.st_size;
	return map;
}

/* ---- The fresh index ---- */

static int index_create(struct rd_keep_store *st, uint32_t nslots)
{
	struct index_header h = {
		.magic = INDEX_MAGIC,
		.layout = INDEX_LAYOUT,
		.record_bytes = RECORD_BYTES,
		.nslots = nslots,
		.generation = st->generation,
	};
	size_t bytes = index_bytes(nslots);
	int fd, r;

	fd = memfd_create("regen-keep-index", MFD_CLOEXEC | MFD_ALLOW_SEALING);
	if (fd < 0)
		return -errno;
	if (ftruncate(fd, (off_t)bytes) < 0 || fcntl(fd, F_ADD_SEALS, F_SEAL_SHRINK | F_SEAL_GROW | F_SEAL_SEAL) < 0) {
		r = -errno;
		close(fd);
		return r;
	}
	st->map = mmap(NULL, bytes, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
	st->versions = calloc(nslots, sizeof(*st->versions));
	st->newer = calloc(nslots, sizeof(*st->newer));
	st->used = calloc(nslots, sizeof(*st->used));
	if (st->map == MAP_FAILED || !st->versions || !st->newer || !st->used) {
		r = st->map == MAP_FAILED ? -errno : -ENOMEM;
		if (st->map != MAP_FAILED)
			munmap(st->map, bytes);
		st->map = NULL;
		free(st->versions);
		free(st->newer);
		free(st->used);
		close(fd);
		return r;
	}
	h.check = fnv1a(&h, offsetof(struct index_header, check));
	memcpy(st->map, &h, sizeof(h));
	st->index_fd = fd;
	st->map_bytes = bytes;
	st->nslots = nslots;
	return 0;
}

int rd_keep_store_slot(struct rd_keep_store *st)
{
	if (!st->on)
		return -1;
	for (uint32_t i = 0; i < st->nslots; i++) {
		uint32_t s = (st->free_hint + i) % st->nslots;
		if (!st->used[s]) {
			st->used[s] = true;
			st->free_hint = s + 1;
			return (int)s;
		}
	}
	return -1;
}

static void write_slot(struct rd_keep_store *st, int slot, const struct rd_keep_record *r)
{
	struct rd_keep_record *dst;
	int older;

	if (!st->on || slot < 0 || (uint32_t)slot >= st->nslots)
		return;
	older = !st->newer[slot];
	dst = copy_at(st->map, (uint32_t)slot, older);
	/* The checksum last: until it is written, the copy being written
	 * does not count, and the other one says what the slot holds. */
	memcpy(dst, r, RECORD_BYTES);
	dst->version = ++st->versions[slot];
	dst->check = rd_keep_record_checksum(dst);
	st->newer[slot] = (uint8_t)older;
}

void rd_keep_store_write(struct rd_keep_store *st, int slot, const struct rd_keep_record *r)
{
	write_slot(st, slot, r);
}

void rd_keep_store_release(struct rd_keep_store *st, int slot)
{
	struct rd_keep_record free_record = { .type = RD_KEEP_RECORD_FREE };

	if (!st->on || slot < 0 || (uint32_t)slot >= st->nslots)
		return;
	write_slot(st, slot, &free_record);
	st->used[slot] = false;
}

unsigned rd_keep_store_max_names(const struct rd_keep_store *st)
{
	if (!st->on || st->max_fds == UINT_MAX)
		return UINT_MAX;
	return st->max_fds > 1 ? st->max_fds - 1 : 0;
}

static void fd_name(char *buf, size_t size, const char *prefix, uint64_t n)
{
	snprintf(buf, size, "%s%" PRIu64, prefix, n);
}

uint64_t rd_keep_store_add_fd(struct rd_keep_store *st, int fd)
{
	char name[64];
	uint64_t serial;
	int r;

	if (!st->on)
		return 0;
	serial = st->next_serial++;
	fd_name(name, sizeof(name), RD_KEEP_STORE_FD_PREFIX, serial);
	r = rd_notify_fd_store(fd, name);
	if (r < 0) {
		rd_warn("keep", -1, 0, 0, "the service manager's fd store did not take kept fd %s (%s): it does not "
			"outlive a restart of regend", name, strerror(-r));
		return 0;
	}
	return serial;
}

void rd_keep_store_remove_fd(struct rd_keep_store *st, uint64_t serial)
{
	char name[64];

	if (!st->on || serial == 0)
		return;
	fd_name(name, sizeof(name), RD_KEEP_STORE_FD_PREFIX, serial);
	rd_notify_fd_store_remove(name);
}

/* ---- Opening: what the last run left ---- */

/* n when name is prefix followed by a decimal number (no sign, no
 * leading zero), else 0. */
static uint64_t numbered(const char *name, const char *prefix)
{
	size_t len = strlen(prefix);
	uint64_t n = 0;

	if (!name || strncmp(name, prefix, len) != 0 || !name[len] || name[len] == '0' || strlen(name + len) > 19)
		return 0;
	for (const char *p = name + len; *p; p++) {
		if (*p < '0' || *p > '9')
			return 0;
		n = n * 10 + (uint64_t)(*p - '0');
	}
	return n;
}

struct passed_fd {
	uint64_t n;                /* serial or generation */
	int fd;
	bool twice;                /* the manager holds two fds under this name */
};

/* The fds of passed whose names are prefix<n>, taken out of it. */
static struct passed_fd *take_numbered(struct rd_passed_fds *passed, const char *prefix, int *count)
{
	struct passed_fd *out = calloc((size_t)passed->n + 1, sizeof(*out));
	int n = 0;

	if (!out)
		return NULL;
	for (int i = 0; i < passed->n; i++) {
		uint64_t v = numbered(passed->names ? passed->names[i] : NULL, prefix);
		if (!v || passed->fds[i] < 0)
			continue;
		for (int j = 0; j < n; j++) {
			if (out[j].n == v) {
				out[j].twice = true;
				v = 0;
			}
		}
		if (!v) {
			close(passed->fds[i]);
		} else {
			out[n].n = v;
			out[n].fd = passed->fds[i];
			n++;
		}
		passed->fds[i] = -1;
	}
	*count = n;
	return out;
}

static int serial_cmp(const void *a, const void *b)
{
	uint64_t x = *(const uint64_t *)a, y = *(const uint64_t *)b;

	return x < y ? -1 : x > y;
}

/* The serials the old index's name records name, sorted (NULL on ENOMEM:
 * then none is found twice). */
static uint64_t *claimed_serials(uint8_t *map, uint32_t nslots, size_t *count)
{
	uint64_t *out = malloc((size_t)nslots * sizeof(*out));
	size_t n = 0;

	for (uint32_t s = 0; out && s < nslots; s++) {
		const struct rd_keep_record *r = newest_copy(map, s);
		if (r && r->type == RD_KEEP_RECORD_NAME)
			out[n++] = r->serial;
	}
	if (out)
		qsort(out, n, sizeof(*out), serial_cmp);
	*count = n;
	return out;
}

static bool claimed_twice(const uint64_t *serials, size_t count, uint64_t serial)
{
	const uint64_t *hit = serials ? bsearch(&serial, serials, count, sizeof(*serials), serial_cmp) : NULL;

	if (!hit)
		return false;
	return (hit > serials && hit[-1] == serial) || (hit + 1 < serials + count && hit[1] == serial);
}

/* Every whole record of the old index to restore (sets, then names with
 * their fds). Counts what was refused. */
static void restore_records(uint8_t *map, uint32_t nslots, struct passed_fd *fds, int nfds,
			    rd_keep_store_restore_cb restore, void *data, unsigned *refused)
{
	size_t nserials = 0;
	uint64_t *serials = claimed_serials(map, nslots, &nserials);

	for (int pass = RD_KEEP_RECORD_SET; pass <= RD_KEEP_RECORD_NAME; pass++) {
		for (uint32_t s = 0; s < nslots; s++) {
			const struct rd_keep_record *found = newest_copy(map, s);
			struct rd_keep_record r;
			char why[128];
			int fd = -1;

			if (!found || found->type != (uint32_t)pass)
				continue;
			/* A copy of our own: what is checked is what is used,
			 * whatever happens to the memfd meanwhile. */
			memcpy(&r, found, sizeof(r));
			if (r.check != rd_keep_record_checksum(&r))
				continue;
			if (rd_keep_record_check(&r, why, sizeof(why)) < 0) {
				rd_warn("keep", -1, 0, 0, "the fd store's index: slot %" PRIu32 " refused: %s", s, why);
				(*refused)++;
				continue;
			}
			/* Two records that claim one fd: neither can be
			 * believed. */
			if (pass == RD_KEEP_RECORD_NAME && claimed_twice(serials, nserials, r.serial)) {
				rd_warn("keep", -1, 0, 0, "the fd store's index: %s/%" PRIu32 "/%s names fd %s%" PRIu64
					" that another record names too: refused", r.job, r.rank, r.name,
					RD_KEEP_STORE_FD_PREFIX, r.serial);
				(*refused)++;
				continue;
			}
			for (int i = 0; pass == RD_KEEP_RECORD_NAME && i < nfds; i++) {
				if (fds[i].n == r.serial && fds[i].fd >= 0 && !fds[i].twice) {
					fd = fds[i].fd;
					fds[i].fd = -1;   /* the record's, whatever restore decides */
				}
			}
			if (!restore(&r, fd, data)) {
				(*refused)++;
				if (fd >= 0) {
					close(fd);
					for (int i = 0; i < nfds; i++)
						if (fds[i].n == r.serial)
							fds[i].fd = -2;   /* to go out of the store */
				}
			}
		}
	}
	free(serials);
}

int rd_keep_store_open(struct rd_keep_store *st, struct rd_passed_fds *passed, unsigned capacity,
		       rd_keep_store_restore_cb restore, void *data)
{
	struct passed_fd *indexes = NULL, *kept = NULL;
	int nindexes = 0, nkept = 0, r = 0;
	const struct passed_fd *old = NULL;
	uint8_t *old_map = NULL;
	size_t old_bytes = 0;
	uint32_t old_slots = 0, nslots;
	unsigned refused = 0;
	char name[64], why[160];

	memset(st, 0, sizeof(*st));
	st->index_fd = -1;
	st->next_serial = 1;
	st->on = rd_notify_fd_store_available(&st->max_fds);
	indexes = take_numbered(passed, RD_KEEP_STORE_INDEX_PREFIX, &nindexes);
	kept = take_numbered(passed, RD_KEEP_STORE_FD_PREFIX, &nkept);
	if (!indexes || !kept) {
		r = -ENOMEM;
		goto out;
	}
	if (!st->on) {
		if (nindexes || nkept)
			rd_warn("keep", -1, 0, 0, "%d kept fd(s) passed at start, but no service manager keeps an fd store "
				"for regend now ($NOTIFY_SOCKET, FileDescriptorStoreMax=): freed", nkept);
		goto out;
	}
	/* The newest index that is whole; the others go. */
	for (int i = 0; i < nindexes; i++) {
		const struct passed_fd *best = NULL;
		for (int j = 0; j < nindexes; j++)
			if (indexes[j].fd >= 0 && !indexes[j].twice && (!best || indexes[j].n > best->n))
				best = &indexes[j];
		if (!best)
			break;
		old_map = map_old_index(best->fd, best->n, &old_slots, &old_bytes, why, sizeof(why));
		if (old_map) {
			old = best;
			break;
		}
		rd_warn("keep", -1, 0, 0, "the fd store's index %s%" PRIu64 " is refused: %s", RD_KEEP_STORE_INDEX_PREFIX,
			best->n, why);
		close(best->fd);
		indexes[best - indexes].fd = -1;
	}
	for (int i = 0; i < nkept; i++)
		if (kept[i].n >= st->next_serial)
			st->next_serial = kept[i].n + 1;
	st->generation = 1;
	for (int i = 0; i < nindexes; i++)
		if (indexes[i].n >= st->generation)
			st->generation = indexes[i].n + 1;
	if (st->max_fds != UINT_MAX && capacity > st->max_fds - 1)
		capacity = st->max_fds > 1 ? st->max_fds - 1 : 1;
	nslots = capacity > INDEX_SLOTS_MAX / 2 ? INDEX_SLOTS_MAX : 2 * (capacity ? capacity : 1);
	r = index_create(st, nslots);
	if (r < 0) {
		rd_err("keep", -1, 0, 0, "cannot make the index of kept state (%s): kept state will not outlive a "
		       "restart of regend", strerror(-r));
		st->on = false;
		goto out;
	}
	if (old_map)
		restore_records(old_map, old_slots, kept, nkept, restore, data, &refused);
	/* The fresh index before the old one goes: a regend killed in
	 * between finds both, and takes the newer. */
	fd_name(name, sizeof(name), RD_KEEP_STORE_INDEX_PREFIX, st->generation);
	r = rd_notify_fd_store(st->index_fd, name);
	if (r < 0)
		rd_err("keep", -1, 0, 0, "the service manager did not take the index of kept state (%s): kept state "
		       "will not outlive a restart of regend", strerror(-r));
	for (int i = 0; i < nindexes; i++) {
		fd_name(name, sizeof(name), RD_KEEP_STORE_INDEX_PREFIX, indexes[i].n);
		rd_notify_fd_store_remove(name);
	}
	for (int i = 0; i < nkept; i++) {
		if (kept[i].fd == -1)
			continue;
		if (kept[i].fd >= 0) {
			rd_warn("keep", -1, 0, 0, "kept fd %s%" PRIu64 " from the fd store has no record in the index%s: "
				"freed", RD_KEEP_STORE_FD_PREFIX, kept[i].n,
				kept[i].twice ? " (two fds under one name: neither can be told apart)" : "");
			close(kept[i].fd);
		}
		fd_name(name, sizeof(name), RD_KEEP_STORE_FD_PREFIX, kept[i].n);
		rd_notify_fd_store_remove(name);
	}
	if (old || nkept)
		rd_info("keep", -1, 0, 0, "restart: %d kept fd(s) came back from the fd store, index %s%" PRIu64 "; %u "
			"record(s) refused", nkept, RD_KEEP_STORE_INDEX_PREFIX, old ? old->n : 0, refused);
	r = 0;
out:
	if (old_map)
		munmap(old_map, old_bytes);
	for (int i = 0; indexes && i < nindexes; i++)
		if (indexes[i].fd >= 0)
			close(indexes[i].fd);
	for (int i = 0; kept && i < nkept; i++)
		if (kept[i].fd >= 0)
			close(kept[i].fd);
	free(indexes);
	free(kept);
	return r;
}

void rd_keep_store_close(struct rd_keep_store *st)
{
	if (st->map)
		munmap(st->map, st->map_bytes);
	if (st->index_fd >= 0)
		close(st->index_fd);
	free(st->versions);
	free(st->newer);
	free(st->used);
	memset(st, 0, sizeof(*st));
	st->index_fd = -1;
}
