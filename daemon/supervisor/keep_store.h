/* SPDX-License-Identifier: Apache-2.0 */
/* Kept state across a restart of regend: the service manager's fd store
 * (systemd's FileDescriptorStoreMax=, sd_notify FDSTORE=1) holds a
 * duplicate of every kept fd, named "regen-kept.<serial>", and one memfd of
 * regend's own, "regen-keep-index.<generation>", whose records say what
 * each fd is: its key (uid, job, rank, name), kind, device and size, and
 * its set's committed step and lease. systemd passes them back to the next
 * regend (LISTEN_FDS, LISTEN_FDNAMES), which reads the index, checks every
 * record and fd, and keeps what passes as if it had never stopped.
 *
 * The index is a header and a fixed number of slots, each a set's or a
 * name's record, written in place as the table changes (a Commit writes
 * one record: no message to the manager). A slot has two copies, each
 * with a version and a checksum; a write goes to the older copy, so
 * regend killed in the middle of one leaves the other whole. The memfd is
 * sealed against shrinking and growing, so mapping it cannot fault.
 *
 * Without a service manager that keeps an fd store (a plain `regend`, a
 * unit without FileDescriptorStoreMax=), every call here does nothing: a
 * restart of regend frees what it kept. */
#pragma once

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include "daemon/notify.h"
#include "proto/keep.h"

#define RD_KEEP_STORE_FD_PREFIX "regen-kept."
#define RD_KEEP_STORE_INDEX_PREFIX "regen-keep-index."

enum rd_keep_record_type { RD_KEEP_RECORD_FREE = 0, RD_KEEP_RECORD_SET = 1, RD_KEEP_RECORD_NAME = 2 };

#define RD_KEEP_RECORD_HELD 0x1u
#define RD_KEEP_RECORD_HAS_STEP 0x2u

/* One record as the index holds it (native byte order: only a regend of
 * this machine reads it; the header's version changes with the layout). */
struct rd_keep_record {
	uint64_t check;            /* FNV-1a 64 of the bytes after it */
	uint64_t version;          /* of the two copies of a slot, the larger is the newer */
	uint32_t type;             /* enum rd_keep_record_type */
	uint32_t uid;
	uint32_t rank;
	uint32_t kind;             /* name: enum rp_memory_kind */
	int32_t device;            /* name: cuda_fd's device, -1 for host_fd */
	uint32_t lease_ms;         /* set */
	uint64_t size;             /* name: bytes */
	uint64_t serial;           /* name: its fd is "regen-kept.<serial>" in the store */
	uint64_t kept_unix_ms;     /* name */
	uint64_t step;             /* set: the last committed step, where flags say it has one */
	uint64_t expires_unix_ms;  /* set: when its lease ends, while not held */
	uint32_t flags;            /* set: RD_KEEP_RECORD_* */
	int32_t holder_pid;        /* set: the holder's pid, for the log */
	char job[72];
	char name[72];             /* name */
	uint8_t reserved[24];
};
_Static_assert(sizeof(struct rd_keep_record) == 256, "an index record is 256 bytes");

struct rd_keep_store {
	bool on;                   /* a service manager keeps an fd store for regend */
	unsigned max_fds;          /* what the manager takes at most, the index's among them */
	int index_fd;
	uint64_t generation;
	uint8_t *map;
	size_t map_bytes;
	uint32_t nslots;
	uint64_t *versions;        /* each slot's newest version */
	uint8_t *newer;            /* which copy of each slot holds it */
	bool *used;
	uint32_t free_hint;
	uint64_t next_serial;
};

/* A record of the index regend's last run left, checked as a record
 * (its strings, numbers and kind), with its fd (taken: the callee owns it;
 * -1 for a set, or a name whose fd the store did not pass back). Returns
 * true to keep it; false closes the fd and takes it out of the store. */
typedef bool (*rd_keep_store_restore_cb)(const struct rd_keep_record *r, int fd, void *data);

/* Opens the store: a fresh index with room for `capacity` names (and as
 * many sets), and, where `passed` holds an index of regend's last run,
 * every valid record of it handed to restore (sets before names), which
 * writes what it keeps into the fresh index. Then the fresh index goes to
 * the store and the old one out of it, with every kept fd restore refused
 * or no record named. Takes the store's fds out of `passed`. Without an fd
 * store, closes what `passed` holds of one and returns 0. Negative errno
 * when regend cannot make its index (the store is then off: kept state
 * does not outlive regend). */
int rd_keep_store_open(struct rd_keep_store *st, struct rd_passed_fds *passed, unsigned capacity,
		       rd_keep_store_restore_cb restore, void *data);
/* regend stops: the index is unmapped and closed, the manager keeps its
 * own fds (a restart passes them back; a stop frees them). */
void rd_keep_store_close(struct rd_keep_store *st);

/* How many kept fds the manager's store takes beside the index (UINT_MAX
 * without a store, or where the manager does not say). */
unsigned rd_keep_store_max_names(const struct rd_keep_store *st);

/* A free slot (-1 when the index is full or there is no store). */
int rd_keep_store_slot(struct rd_keep_store *st);
/* Writes r (its check and version are filled in) into the slot. */
void rd_keep_store_write(struct rd_keep_store *st, int slot, const struct rd_keep_record *r);
/* Frees the slot (written as free, so a restart reads nothing there). */
void rd_keep_store_release(struct rd_keep_store *st, int slot);

/* Hands the manager a duplicate of fd under a new serial (0 without a
 * store, or when the manager cannot be told: the fd is then not kept across
 * a restart, which the log says). */
uint64_t rd_keep_store_add_fd(struct rd_keep_store *st, int fd);
/* Has the manager close its duplicate of the serial's fd. */
void rd_keep_store_remove_fd(struct rd_keep_store *st, uint64_t serial);

/* The checks of a record as read back, for the tests: 0, or -EINVAL with
 * what is wrong in why. */
int rd_keep_record_check(const struct rd_keep_record *r, char *why, size_t size);
uint64_t rd_keep_record_checksum(const struct rd_keep_record *r);
