/* SPDX-License-Identifier: Apache-2.0 */
/* The programs (io.regen.Program) a device's worker was told to define,
 * kept by the supervisor so that a respawned worker defines them again,
 * under the same ids for the same processes, before it serves: a
 * program's definition outlives the worker, as it outlives a generation.
 *
 * The worker tells of each program a process defined (KeepProgram, with
 * the Define message's text as the client sent it) and of each it let go
 * (ForgetProgram: a Drop, the process's last connection closed, or the
 * process gone while nothing held it). A worker that dies tells nothing:
 * what it had defined stays here. Each program is its owner's: the
 * identity the worker read from the owner's socket (daemon/peer.h), which
 * the next worker checks again (the process still there, still the same)
 * before it gives the program back.
 *
 * Bounded by the worker's own limits, checked again here: max_programs and
 * max_program_nodes per process, max_uid_programs and max_uid_program_nodes
 * per uid (the worker refused whatever went past them at Define). A worker
 * that exits before it served, having been handed programs, may have died
 * of one of them: the device forgets them all, so that no definition keeps
 * a device from serving (device.c). */
#pragma once

#include <stddef.h>
#include <stdint.h>
#include <sys/types.h>
#include "daemon/options.h"
#include "proto/ids.h"

/* A program's owner, as the worker read it from the process's socket. */
struct rd_sv_program_owner {
	pid_t pid;
	uid_t uid;
	gid_t gid;
	uint64_t start_time, pidfs_inode;
};

struct rd_sv_kept_program {
	struct rd_sv_kept_program *next;
	char id[RP_ID_MAX];
	struct rd_sv_program_owner owner;
	unsigned nodes;                 /* after lowering: what the limits count */
	char *message;                  /* the Define call as the client sent it */
	size_t len;
};

struct rd_sv_kept_programs {
	struct rd_sv_kept_program *head;
	unsigned count;
};

void rd_sv_kept_programs_init(struct rd_sv_kept_programs *k);
void rd_sv_kept_programs_finish(struct rd_sv_kept_programs *k);

/* Keeps a program (message copied; the same id again replaces it). 0, or
 * -E2BIG past a limit of o's, -ENOMEM. */
int rd_sv_kept_programs_add(struct rd_sv_kept_programs *k, const char *id, const struct rd_sv_program_owner *owner,
			    unsigned nodes, const char *message, size_t len, const struct rd_options *o);
/* Forgets a program; an id it does not keep is nothing. */
void rd_sv_kept_programs_forget(struct rd_sv_kept_programs *k, const char *id);

/* A sealed memfd holding every kept program as one record each, in the
 * order they were kept, for a worker's --programs-fd: a JSON object
 * {program, pid, uid, gid, start_time, pidfs_inode, message} (the two
 * 64-bit numbers as decimal strings) and a NUL. The fd, or -errno. */
int rd_sv_kept_programs_memfd(const struct rd_sv_kept_programs *k);
