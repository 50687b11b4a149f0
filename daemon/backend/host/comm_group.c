/* SPDX-License-Identifier: Apache-2.0 */
/* A host communicator's group in memory the workers share
 * (comm_group.h says what is in it and why). */
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <linux/futex.h>
#include <signal.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>
#include "daemon/backend/host/comm_group.h"
#include "daemon/env.h"
#include "daemon/socket_dir.h"

#define GROUP_MAGIC 0x7267636du          /* "rgcm" */
/* Every rank's staging together (twice: collectives and Send), within
 * the bounds of one slot: the file is sparse, pages come as they are
 * written. */
#define GROUP_STAGING_BYTES ((size_t)64 << 20)
#define SLOT_MIN_BYTES ((size_t)4 << 10)
#define SLOT_MAX_BYTES ((size_t)4 << 20)
/* How often a waiter looks whether its peers' workers are still there. */
#define GROUP_WAIT_SLICE_MS 20
/* How long an opener waits for the maker to fill the group in. */
#define GROUP_MAKE_WAIT_MS 2000
/* The unique id's bytes the file is named after. */
#define NAME_ID_BYTES 16

/* The directory groups are made in (-1: anonymous memory). */
static int groups_dir = -1;
/* This worker's handles; lock order: groups_lock, then a group's. */
static pthread_mutex_t groups_lock = PTHREAD_MUTEX_INITIALIZER;
static struct host_group *groups;

static uint64_t now_ms(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (uint64_t)ts.tv_sec * 1000u + (uint64_t)ts.tv_nsec / 1000000u;
}

static void futex_wait(_Atomic uint32_t *word, uint32_t seen, unsigned ms)
{
	struct timespec ts = { ms / 1000, (long)(ms % 1000) * 1000000L };

	/* Shared between processes: not FUTEX_PRIVATE_FLAG. */
	syscall(SYS_futex, (uint32_t *)word, FUTEX_WAIT, seen, &ts, NULL, 0);
}

static void futex_wake(_Atomic uint32_t *word)
{
	syscall(SYS_futex, (uint32_t *)word, FUTEX_WAKE, INT_MAX, NULL, NULL, 0);
}

int host_groups_open(const char *socket_path, char *why, size_t why_size)
{
	int dir;

	if (!socket_path || !*socket_path)
		return 0;
	dir = rd_socket_dir_open(socket_path, why, why_size);
	if (dir < 0)
		return dir;
	groups_dir = dir;
	return 0;
}

void host_groups_close(void)
{
	if (groups_dir >= 0)
		close(groups_dir);
	groups_dir = -1;
}

static size_t table_bytes(uint32_t nranks)
{
	size_t t = sizeof(struct host_group_shm) + (size_t)nranks * sizeof(struct host_group_rank);

	return (t + 63) & ~(size_t)63;
}

static size_t slot_bytes_for(uint32_t nranks)
{
	size_t s = GROUP_STAGING_BYTES / nranks;
	double told = rd_env_number(RD_ENV_HOST_COMM_SLOT_BYTES, 64, (double)SLOT_MAX_BYTES, 0);

	if (told >= 64)
		return (size_t)told & ~(size_t)63;
	if (s < SLOT_MIN_BYTES)
		s = SLOT_MIN_BYTES;
	if (s > SLOT_MAX_BYTES)
		s = SLOT_MAX_BYTES;
	return s & ~(size_t)63;
}

/* Fills in a group just made (its memory zeroed), magic last. */
static int fill(struct host_group_shm *shm, const unsigned char id[RP_COMM_ID_SIZE], uint32_t nranks, size_t slot,
		size_t map)
{
	pthread_mutexattr_t a;
	int r;

	shm->nranks = nranks;
	shm->slot_bytes = slot;
	shm->map_bytes = map;
	memcpy(shm->id, id, RP_COMM_ID_SIZE);
	pthread_mutexattr_init(&a);
	pthread_mutexattr_setpshared(&a, PTHREAD_PROCESS_SHARED);
	pthread_mutexattr_setrobust(&a, PTHREAD_MUTEX_ROBUST);
	r = pthread_mutex_init(&shm->lock, &a);
	pthread_mutexattr_destroy(&a);
	if (r != 0)
		return -r;
	atomic_store_explicit(&shm->magic, GROUP_MAGIC, memory_order_release);
	return 0;
}

static void name_of(const unsigned char id[RP_COMM_ID_SIZE], char *name, size_t size)
{
	int n = snprintf(name, size, "regen.comm-");

	for (int i = 0; i < NAME_ID_BYTES && n + 2 < (int)size; i++)
		n += snprintf(name + n, size - (size_t)n, "%02x", id[i]);
}

/* Opens the file another worker made, once it is filled in. */
static int open_made(int fd, struct host_group_shm **out, size_t *map_out, char *why, size_t why_size)
{
	uint64_t until = now_ms() + GROUP_MAKE_WAIT_MS;
	struct host_group_shm *shm;
	struct stat st;

	for (;;) {
		if (fstat(fd, &st) < 0) {
			snprintf(why, why_size, "cannot look at the communicator's shared memory: %s", strerror(errno));
			return -errno;
		}
		/* Only regend's user can make files in its directory; one that
		 * is not a 0600 file of ours is not a group. */
		if (!S_ISREG(st.st_mode) || st.st_uid != geteuid() || (st.st_mode & 077)) {
			snprintf(why, why_size, "the communicator's shared memory file is not regend's own");
			return -EPERM;
		}
		if ((size_t)st.st_size >= sizeof(struct host_group_shm))
			break;
		if (now_ms() > until)
			goto half_made;
		usleep(1000);
	}
	shm = mmap(NULL, (size_t)st.st_size, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
	if (shm == MAP_FAILED) {
		snprintf(why, why_size, "cannot map the communicator's shared memory: %s", strerror(errno));
		return -errno;
	}
	while (atomic_load_explicit(&shm->magic, memory_order_acquire) != GROUP_MAGIC) {
		if (now_ms() > until) {
			munmap(shm, (size_t)st.st_size);
			goto half_made;
		}
		usleep(1000);
	}
	if (shm->map_bytes != (uint64_t)st.st_size) {
		munmap(shm, (size_t)st.st_size);
		snprintf(why, why_size, "the communicator's shared memory is not the size it says");
		return -EINVAL;
	}
	*out = shm;
	*map_out = (size_t)st.st_size;
	return 0;
half_made:
	snprintf(why, why_size, "the communicator's shared memory was left half made (a worker died making it): ask "
				"rank 0 for a new unique id");
	return -EIO;
}

/* The group's memory: made (and named) by the first, opened by the others. */
static int map_group(struct host_group *g, uint32_t nranks, char *why, size_t why_size)
{
	size_t slot = slot_bytes_for(nranks);
	size_t map = table_bytes(nranks) + 2 * (size_t)nranks * slot;
	int fd, r;

	if (groups_dir < 0) {
		g->shm = mmap(NULL, map, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
		if (g->shm == MAP_FAILED) {
			snprintf(why, why_size, "no memory for the communicator's group: %s", strerror(errno));
			return -ENOMEM;
		}
		g->map_bytes = map;
		return fill(g->shm, g->id, nranks, slot, map);
	}
	name_of(g->id, g->name, sizeof(g->name));
	/* Made, opened, or gone between the two (its last rank left): again. */
	for (int tries = 0; tries < 8; tries++) {
		fd = openat(groups_dir, g->name, O_RDWR | O_CREAT | O_EXCL | O_CLOEXEC | O_NOFOLLOW, 0600);
		if (fd >= 0) {
			if (ftruncate(fd, (off_t)map) < 0) {
				r = -errno;
				snprintf(why, why_size, "no room for the communicator's shared memory (%zu bytes): %s", map,
					 strerror(errno));
				unlinkat(groups_dir, g->name, 0);
				close(fd);
				return r;
			}
			g->shm = mmap(NULL, map, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
			close(fd);
			if (g->shm == MAP_FAILED) {
				r = -errno;
				snprintf(why, why_size, "cannot map the communicator's shared memory: %s", strerror(errno));
				unlinkat(groups_dir, g->name, 0);
				return r;
			}
			g->map_bytes = map;
			g->shm->named = 1;
			r = fill(g->shm, g->id, nranks, slot, map);
			if (r < 0) {
				snprintf(why, why_size, "cannot make the communicator's lock: %s", strerror(-r));
				unlinkat(groups_dir, g->name, 0);
				munmap(g->shm, map);
			}
			return r;
		}
		if (errno != EEXIST) {
			r = -errno;
			snprintf(why, why_size, "cannot make the communicator's shared memory: %s", strerror(errno));
			return r;
		}
		fd = openat(groups_dir, g->name, O_RDWR | O_CLOEXEC | O_NOFOLLOW);
		if (fd < 0 && errno == ENOENT)
			continue;
		if (fd < 0) {
			r = -errno;
			snprintf(why, why_size, "cannot open the communicator's shared memory: %s", strerror(errno));
			return r;
		}
		r = open_made(fd, &g->shm, &g->map_bytes, why, why_size);
		close(fd);
		if (r < 0)
			return r;
		if (memcmp(g->shm->id, g->id, RP_COMM_ID_SIZE) != 0) {
			munmap(g->shm, g->map_bytes);
			snprintf(why, why_size, "another communicator's unique id begins as this one does: ask rank 0 for "
						"a new unique id");
			return -EEXIST;
		}
		return 0;
	}
	snprintf(why, why_size, "the communicator's shared memory kept going away while it was opened");
	return -EAGAIN;
}

int host_group_get(const unsigned char id[RP_COMM_ID_SIZE], uint32_t nranks, struct host_group **out, char *why,
		   size_t why_size)
{
	struct host_group *g;
	int r;

	pthread_mutex_lock(&groups_lock);
	for (g = groups; g; g = g->next) {
		if (memcmp(g->id, id, RP_COMM_ID_SIZE) == 0) {
			g->refs++;
			pthread_mutex_unlock(&groups_lock);
			*out = g;
			return 0;
		}
	}
	g = calloc(1, sizeof(*g));
	if (!g) {
		pthread_mutex_unlock(&groups_lock);
		snprintf(why, why_size, "no memory for a communicator");
		return -ENOMEM;
	}
	memcpy(g->id, id, RP_COMM_ID_SIZE);
	r = map_group(g, nranks, why, why_size);
	if (r < 0) {
		pthread_mutex_unlock(&groups_lock);
		free(g);
		return r;
	}
	g->refs = 1;
	g->next = groups;
	groups = g;
	pthread_mutex_unlock(&groups_lock);
	*out = g;
	return 0;
}

void host_group_hold(struct host_group *g)
{
	pthread_mutex_lock(&groups_lock);
	g->refs++;
	pthread_mutex_unlock(&groups_lock);
}

void host_group_put(struct host_group *g)
{
	bool last;

	pthread_mutex_lock(&groups_lock);
	last = --g->refs == 0;
	if (last) {
		for (struct host_group **p = &groups; *p; p = &(*p)->next) {
			if (*p == g) {
				*p = g->next;
				break;
			}
		}
	}
	pthread_mutex_unlock(&groups_lock);
	if (last) {
		munmap(g->shm, g->map_bytes);
		free(g);
	}
}

/* ---- The lock, failure and waiting ---- */

void host_group_wake_locked(struct host_group *g)
{
	atomic_fetch_add(&g->shm->seq, 1);
	futex_wake(&g->shm->seq);
}

void host_group_fail_locked(struct host_group *g, const char *fmt, ...)
{
	struct host_group_shm *shm = g->shm;
	va_list ap;

	if (!atomic_load(&shm->failed)) {
		va_start(ap, fmt);
		vsnprintf(shm->reason, sizeof(shm->reason), fmt, ap);
		va_end(ap);
		atomic_store_explicit(&shm->failed, 1, memory_order_release);
	}
	host_group_wake_locked(g);
}

const char *host_group_failed(const struct host_group *g)
{
	return atomic_load_explicit(&g->shm->failed, memory_order_acquire) ? g->shm->reason : NULL;
}

void host_group_lock(struct host_group *g)
{
	int r = pthread_mutex_lock(&g->shm->lock);

	/* What the dead worker was changing may be half done: nobody can
	 * trust the group's state from here. */
	if (r == EOWNERDEAD) {
		pthread_mutex_consistent(&g->shm->lock);
		host_group_fail_locked(g, "a worker died holding the communicator's lock");
	}
}

void host_group_unlock(struct host_group *g)
{
	pthread_mutex_unlock(&g->shm->lock);
}

/* With the lock: a rank whose worker is gone is out, and the group
 * failed, as nothing will ever come from it. */
static void check_peers_locked(struct host_group *g)
{
	struct host_group_shm *shm = g->shm;
	pid_t self = getpid(), alive = 0;

	for (uint32_t k = 0; k < shm->nranks; k++) {
		pid_t pid = atomic_load(&shm->ranks[k].pid);

		if (!shm->ranks[k].present || pid == 0 || pid == self || pid == alive)
			continue;
		if (kill(pid, 0) == 0 || errno != ESRCH) {
			alive = pid;
			continue;
		}
		shm->ranks[k].present = 0;
		shm->members--;
		host_group_fail_locked(g, "rank %u's worker (pid %d) is gone", k, (int)pid);
	}
}

int host_group_wait_locked(struct host_group *g, bool (*done)(struct host_group *g, void *arg), void *arg)
{
	uint64_t checked = now_ms();

	for (;;) {
		uint32_t seen;

		if (done(g, arg))
			return 0;
		if (host_group_failed(g))
			return -EIO;
		seen = atomic_load(&g->shm->seq);
		host_group_unlock(g);
		futex_wait(&g->shm->seq, seen, GROUP_WAIT_SLICE_MS);
		host_group_lock(g);
		if (now_ms() - checked >= GROUP_WAIT_SLICE_MS) {
			check_peers_locked(g);
			checked = now_ms();
		}
	}
}

/* ---- Joining and leaving ---- */

int host_group_absent_locked(const struct host_group *g)
{
	const struct host_group_shm *shm = g->shm;

	if (shm->members == shm->nranks)
		return -1;
	for (uint32_t k = 0; k < shm->nranks; k++)
		if (!shm->ranks[k].present)
			return (int)k;
	return -1;
}

int host_group_join_locked(struct host_group *g, uint32_t rank, uint32_t nranks, char *why, size_t why_size)
{
	struct host_group_shm *shm = g->shm;

	if (shm->nranks != nranks) {
		snprintf(why, why_size, "mismatch: rank %u says nranks %u, but the communicator has %u ranks", rank, nranks,
			 shm->nranks);
		return -EINVAL;
	}
	if (atomic_load(&shm->ranks[rank].pid) || shm->joined == shm->nranks) {
		snprintf(why, why_size, "rank %u already joined this unique id; ask rank 0 for a new one", rank);
		return -EINVAL;
	}
	if (host_group_failed(g)) {
		snprintf(why, why_size, "%s", shm->reason);
		return -EINVAL;
	}
	atomic_store(&shm->ranks[rank].pid, (int32_t)getpid());
	shm->ranks[rank].present = 1;
	shm->joined++;
	shm->members++;
	host_group_wake_locked(g);
	return 0;
}

void host_group_leave_locked(struct host_group *g, uint32_t rank, const char *why)
{
	struct host_group_shm *shm = g->shm;

	if (shm->ranks[rank].present) {
		shm->ranks[rank].present = 0;
		shm->members--;
	}
	check_peers_locked(g);
	/* A collective under way can never complete now; the others learn
	 * of it when they next need the rank (host_group_absent_locked). */
	if (shm->members > 0 && shm->arrived > 0)
		host_group_fail_locked(g, "rank %u %s", rank, why);
	else
		host_group_wake_locked(g);
	if (shm->members == 0 && shm->named && g->name[0] && groups_dir >= 0) {
		unlinkat(groups_dir, g->name, 0);
		shm->named = 0;
	}
}
