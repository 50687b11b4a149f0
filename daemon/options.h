/* SPDX-License-Identifier: Apache-2.0 */
/* regend's settings: defaults, then the configuration file, then the
 * environment (an option that names a variable: REGEN_RING_SPIN_US), then
 * the command line. One table (options.c) writes each option once: its flag,
 * its key and its variable, its type and range, where it may be given,
 * whether SIGHUP applies it, its default and its help. The command line, the
 * file, the environment, --help, the worker's command line, the SIGHUP reload
 * and Status all read that table, so a value is checked by the same rule
 * whichever way it comes in. The environment variables that are not
 * options (the log's, the test knobs) are env.h's. */
#pragma once

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <sys/types.h>

#define RD_DEVICES_MAX 64
#define RD_CONFIG_DEFAULT "/etc/regen/regend.conf"

/* Defaults that code runs with where no option table is at hand (a unit
 * test of conn.c, a test that drives a backend itself and leaves
 * rd_device.options NULL): the table's default texts are made of these. */
#define RD_MESSAGE_TIMEOUT_MS_DEFAULT 30000
#define RD_CUDA_SPIN_US_DEFAULT 200
#define RD_CUDA_SHARE_ALONE_US_DEFAULT 2000

struct rd_options {
	char socket_path[108];
	char backend[16];              /* "host", "cuda", "auto" */
	int devices;                   /* < 0: as many as the backend finds (host: 1) */
	char socket_group[64];         /* group of the sockets: who may connect */
	bool have_socket_gid;
	gid_t socket_gid;
	char admin_group[64];          /* who may Release/Reset/Restart/InjectFault */
	bool have_admin_gid;
	gid_t admin_gid;
	bool fault_injection;
	unsigned drain_deadline_ms;
	unsigned call_deadline_ms;     /* a compute call's deadline when it names none */
	unsigned hang_cooldown_ms;     /* a uid whose call hung a device: its first cool-down (hang_charge.h) */
	unsigned heartbeat_ms;         /* no answer to the supervisor this long: unresponsive */
	unsigned health_period_ms;     /* the worker's context check */
	unsigned failed_retry_ms;      /* first pause before a worker starts again on a failed GPU */
	unsigned worker_start_timeout_ms; /* a worker not Ready this long after its start is killed */
	unsigned socket_mode;
	int log_level;                 /* enum rd_log_level */
	unsigned max_connections;      /* per peer uid, on each socket */
	unsigned max_buffers;          /* per client process, per device */
	unsigned max_events;           /* imported events, per client process, per device */
	unsigned max_comms;            /* communicators, per client process, per device */
	unsigned max_programs;         /* programs, per client process, per device */
	unsigned max_program_nodes;    /* nodes of those programs together, after lowering */
	unsigned max_uid_programs;     /* programs of every process of a uid together, per device */
	unsigned max_uid_program_nodes; /* and their nodes, after lowering */
	unsigned max_uid_compile_ms;   /* NVRTC time a uid's programs may take per device, refilled per hour */
	unsigned max_uid_module_mib;   /* compiled kernels a uid's programs hold per device */
	uint64_t max_scratch_mib;      /* per compute call */
	unsigned max_ring_entries;     /* entries of every ring of a uid together, per device */
	uint64_t max_import_gib;       /* bytes imported by a uid together, per device, in GiB */
	uint64_t max_kept_gib;         /* bytes kept (io.regen.Keep) by a uid together, on the node, in GiB */
	unsigned max_kept;             /* names kept by a uid together, on the node */
	unsigned keep_lease_ms;        /* how long a kept set outlives the last process that held it, at most */
	unsigned gemm_plans_max;       /* cached GEMM plans per device (CUDA) */
	char rtc_cache_dir[256];       /* programs' compiled kernels kept on disk (CUDA); "": not kept */
	char config_path[256];         /* the file read; "" = none */

	/* Tuning: what the defaults were measured for, changed to measure
	 * against or on a machine unlike those. */
	unsigned message_timeout_ms;   /* a message begun must end within this (conn.c) */
	int ring_spin_us;              /* a lane's ring watched after a record (worker/ring.c); -1: auto */
	unsigned cuda_spin_us;         /* a CUDA completer polls a call's event this long before it sleeps */
	unsigned cuda_share_alone_us;  /* a uid alone keeps this much of the GPU's time in flight (0: unbounded) */
	char cuda_wake[8];             /* "spin": a wake-up armed when the completer stops spinning; "launch": with each call */
	bool cuda_inline_launch;       /* a GEMM finding its lane idle is launched by the worker's loop itself */
	char cuda_client_wait[8];      /* "stream": a call's wait_event waited for on its lane's stream; "host": by its lane's thread */
	bool cuda_launch_profile;      /* each lane sums its launches' phases and prints them when it goes */
	int reset_retry_ms;            /* a CUDA reset's retries of the new context; -1: auto */
	unsigned attention_autotune;   /* attention configurations timed per new problem (0, 1: none) */
	bool program_gemm_slots;       /* programs' GEMMs read their operands from the Run's argument block */
	bool nvml;                     /* a CUDA worker watches the GPU through NVML */

	/* Worker processes only: what the supervisor tells the worker it starts. */
	int worker_device;             /* < 0: this process is the supervisor */
	uint64_t worker_generation;
	uint64_t worker_epoch;         /* the node's epoch when the worker starts */
	char worker_charged[256];      /* the uids cooling down after a hang (daemon/hang_charge.h) */
	int ctl_fd;
	int programs_fd;               /* the programs to define before serving (supervisor/kept_programs.h); -1: none */
};

/* Where an option may be given, and what becomes of it. */
enum rd_option_where {
	RD_OPT_CLI = 1 << 0,       /* --flag on the command line */
	RD_OPT_FILE = 1 << 1,      /* key = value in the configuration file */
	RD_OPT_WORKER = 1 << 2,    /* the supervisor hands it on to every worker */
	RD_OPT_INTERNAL = 1 << 3,  /* only the supervisor gives it, to a worker: not in --help */
	RD_OPT_RELOAD = 1 << 4,    /* SIGHUP applies it while serving; the others wait for a restart */
};

enum rd_option_type {
	RD_OPT_PATH,       /* an absolute path that leaves room for ".devNN" */
	RD_OPT_CHOICE,     /* one of `choices` */
	RD_OPT_UINT,       /* decimal, min..max, into an int, unsigned or uint64_t */
	RD_OPT_DEVICES,    /* 1..RD_DEVICES_MAX, or "auto" (or empty) for every device found */
	RD_OPT_MODE,       /* octal file mode, 0..0777 */
	RD_OPT_BOOL,       /* true/false/yes/no/1/0; on the command line --flag alone is true, --flag=false */
	RD_OPT_GROUP,      /* a group name, looked up now; empty = none */
	RD_OPT_LOG_LEVEL,  /* error, warn, info, debug, trace (or E W I D T) */
	RD_OPT_TEXT,       /* internal: text the worker checks itself, up to the field's size */
	RD_OPT_CONFIG,     /* --config: read before the rest of the command line */
	RD_OPT_HELP,
	RD_OPT_VERSION,
};

struct rd_option {
	const char *flag;          /* command line, without "--"; NULL: not there */
	const char *key;           /* configuration file; NULL: not there */
	const char *arg;           /* the value's name in --help; NULL: a flag without value */
	enum rd_option_type type;
	unsigned where;            /* enum rd_option_where */
	size_t offset, size;       /* the field in struct rd_options */
	size_t gid_offset, have_offset;  /* RD_OPT_GROUP: where the gid and whether there is one go */
	unsigned long long min, max;     /* RD_OPT_UINT */
	bool or_auto;              /* RD_OPT_UINT into an int: "auto" (stored as -1) is a value too */
	const char *const *choices;      /* RD_OPT_CHOICE: NULL terminated */
	const char *def;           /* the default, as text; NULL: none (zero) */
	const char *help;
	const char *env;           /* the environment variable that sets it too; NULL: none */
};

/* The table, ended by an entry with neither flag nor key. */
extern const struct rd_option rd_option_table[];

/* By configuration-file key; NULL if none. */
const struct rd_option *rd_option_by_key(const char *key);
/* Checks value against the option's rule and stores it. On a bad value
 * nothing changes, returns -EINVAL (-ENOENT: no such group) and `why` (may
 * be NULL) says what was expected: the same words whichever way it came in. */
int rd_option_set(struct rd_options *o, const struct rd_option *opt, const char *value, char *why, size_t why_size);
/* The value as text that rd_option_set takes back. Returns 1 for an option
 * that is not set ("" for no group, a flag at its default): nothing to hand
 * on. */
int rd_option_format(const struct rd_options *o, const struct rd_option *opt, char *buf, size_t size);

void rd_options_defaults(struct rd_options *o);
/* Defaults, then the configuration file (--config PATH, else
 * RD_CONFIG_DEFAULT when it exists), then the environment, then the command
 * line; a worker (--worker) reads neither file nor environment: its
 * command line carries everything. Returns 0, 1 for --help/--version
 * (printed), or -EINVAL after printing what was wrong. */
int rd_options_load(struct rd_options *o, int argc, char **argv);
/* The command line alone over what *o holds. */
int rd_options_parse(struct rd_options *o, int argc, char **argv);
/* Reads `key = value` lines into *o. explicit: a missing file is an error. */
int rd_options_read_file(struct rd_options *o, const char *path, bool explicit_path);
/* The options named in the environment, over what *o holds. -EINVAL after
 * printing what was wrong ("regend: REGEN_RING_SPIN_US: expected ..."). */
int rd_options_read_env(struct rd_options *o);
/* --help, from the table (and env.h's for the rest of the environment). */
void rd_options_usage(FILE *f);
/* Every option a person may set, by its configuration-file key, with its
 * value in force as rd_option_format writes it (an unset group ""): what
 * Status reports. NULL on ENOMEM. */
struct cJSON *rd_options_to_json(const struct rd_options *o);

/* A worker's command line: every option handed on to workers, with its value. */
#define RD_ARGV_MAX 128
struct rd_argv {
	char *argv[RD_ARGV_MAX];
	char text[4096];
};
/* argv[0] = exe, then --flag value for each RD_OPT_WORKER option that is set
 * in *o, NULL terminated. -ENOSPC if it does not fit. */
int rd_options_worker_argv(const struct rd_options *o, const char *exe, struct rd_argv *out);

/* SIGHUP: copies every RD_OPT_RELOAD option from fresh into live, and names
 * in `restart_only` ("socket, backend", or "") the others whose value differs. */
void rd_options_reload(struct rd_options *live, const struct rd_options *fresh, char *restart_only, size_t size);

/* A running worker's share of a SIGHUP: the options both handed on to
 * workers and reloadable (RD_OPT_WORKER and RD_OPT_RELOAD), which a worker
 * started before the reload holds with its command line's values. fn gets
 * each one's configuration-file key and its value as text
 * (rd_option_format; "" for an unset group). */
void rd_options_each_worker_reload(const struct rd_options *o,
				   void (*fn)(const char *key, const char *value, void *data), void *data);
/* The worker's side: sets one of those by key, by the rule its value met in
 * the supervisor. -ENOENT (and `why`) for a key that is not one of them,
 * else as rd_option_set. */
int rd_options_set_worker_reload(struct rd_options *o, const char *key, const char *value, char *why,
				 size_t why_size);

/* "<socket>.dev<N>": where device N's worker listens. */
int rd_worker_socket_path(const struct rd_options *o, int device, char *buf, size_t size);
