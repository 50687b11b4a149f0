/* SPDX-License-Identifier: Apache-2.0 */
/* io.regen.Keep's messages as structs: the parameters of Keep, Commit,
 * TakeBack, Drop and List, and the Kept entry their replies (and Status's
 * `kept`) carry, each encoded and decoded in one place.
 *
 * Decoders refuse what the supervisor refuses, with its error: an
 * org.varlink.service.InvalidParameter {parameter} naming the field, or an
 * io.regen.InvalidJob {reason} for a job that breaks the rule of stated
 * jobs (proto/job.h). A Kept's decoder names a bad field "kept.<field>"
 * (its caller's prefix), and ignores fields it does not know. Encoders
 * return a new cJSON object, NULL on ENOMEM. */
#pragma once

#include <stdbool.h>
#include <stdint.h>
#include <cjson/cJSON.h>
#include "job.h"
#include "message.h"

#define RP_KEEP_KEEP      "io.regen.Keep.Keep"
#define RP_KEEP_COMMIT    "io.regen.Keep.Commit"
#define RP_KEEP_TAKE_BACK "io.regen.Keep.TakeBack"
#define RP_KEEP_DROP      "io.regen.Keep.Drop"
#define RP_KEEP_LIST      "io.regen.Keep.List"

/* A kept name's longest, in bytes; a rank's largest; a step's largest (what
 * a JSON number holds exactly); the largest size (as an import's). */
#define RP_KEPT_NAME_MAX 64
#define RP_KEPT_RANK_MAX INT32_MAX
#define RP_KEPT_STEP_MAX (UINT64_C(1) << 53)
#define RP_KEPT_SIZE_MAX (UINT64_C(1) << 48)
/* "job/rank/name" as NoSuchObject's id names a key. */
#define RP_KEPT_KEY_TEXT_MAX (RP_JOB_MAX + 12 + RP_KEPT_NAME_MAX + 1)

enum rp_memory_kind { RP_MEMORY_HOST_FD = 0, RP_MEMORY_CUDA_FD, RP_MEMORY_KINDS };

/* "host_fd", "cuda_fd"; NULL out of range. */
const char *rp_memory_kind_name(enum rp_memory_kind kind);

/* 0 when `name` is 1 to RP_KEPT_NAME_MAX bytes of A-Z a-z 0-9 _ . : -;
 * else InvalidParameter "name" and -EINVAL. */
int rp_kept_name_check(const char *name, struct rp_error *err);

/* What names a set and a name in it. has_job false: the call named none
 * (the connection's job is meant). */
struct rp_kept_key {
	bool has_job;
	char job[RP_JOB_MAX + 1];
	bool has_rank;
	uint32_t rank;
	bool has_name;
	char name[RP_KEPT_NAME_MAX + 1];
};

/* "job/rank/name", "job/rank" (no name) or "job" (no rank) into buf. */
char *rp_kept_key_text(const char *job, const uint32_t *rank, const char *name, char *buf, size_t size);

struct rp_keep {
	struct rp_kept_key key;
	enum rp_memory_kind kind;
	uint32_t fd;                  /* its index among the fds passed (< RP_FDS_MAX) */
	uint64_t size;                /* 1 .. RP_KEPT_SIZE_MAX */
	bool has_device;              /* given; cuda_fd needs it, host_fd refuses it */
	uint32_t device;
	bool has_lease;
	uint64_t lease_ms;
};
int rp_keep_decode(const cJSON *params, struct rp_keep *out, struct rp_error *err);
cJSON *rp_keep_encode(const struct rp_keep *req);

struct rp_keep_commit {
	struct rp_kept_key key;       /* job (maybe), rank */
	uint64_t step;
};
int rp_keep_commit_decode(const cJSON *params, struct rp_keep_commit *out, struct rp_error *err);
cJSON *rp_keep_commit_encode(const struct rp_keep_commit *req);

/* TakeBack (job maybe, rank, name), Drop (job, rank and name maybe) and
 * List (job maybe): the key, and `uid` (an admin's). */
struct rp_keep_select {
	struct rp_kept_key key;
	bool has_uid;
	uint32_t uid;
};
int rp_keep_take_back_decode(const cJSON *params, struct rp_keep_select *out, struct rp_error *err);
int rp_keep_drop_decode(const cJSON *params, struct rp_keep_select *out, struct rp_error *err);
int rp_keep_list_decode(const cJSON *params, struct rp_keep_select *out, struct rp_error *err);
/* Writes what the select has: job, rank, name, uid. */
cJSON *rp_keep_select_encode(const struct rp_keep_select *sel);

/* io.regen.Keep.Kept. */
struct rp_kept {
	char job[RP_JOB_MAX + 1];
	uint32_t rank;
	char name[RP_KEPT_NAME_MAX + 1];
	uint32_t uid;
	enum rp_memory_kind kind;
	bool has_device;
	uint32_t device;
	uint64_t size;
	bool has_step;
	uint64_t step;
	bool held;
	bool has_holder_pid;
	int64_t holder_pid;
	uint64_t lease_ms;
	bool has_expires;
	uint64_t expires_unix_ms;
	uint64_t kept_unix_ms;
};
cJSON *rp_kept_encode(const struct rp_kept *k);
/* prefix names the object in errors ("kept.", "kept[3]."). */
int rp_kept_decode(const cJSON *o, const char *prefix, struct rp_kept *out, struct rp_error *err);
