/* SPDX-License-Identifier: Apache-2.0 */
#include <errno.h>
#include <getopt.h>
#include <grp.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <cjson/cJSON.h>
#include "daemon/env.h"
#include "daemon/log.h"
#include "daemon/options.h"
#include "regen-config.h"

#define STR_(x) #x
#define STR(x) STR_(x)
#define FIELD(name) .offset = offsetof(struct rd_options, name), .size = sizeof(((struct rd_options *)0)->name)
#define GROUP_FIELDS(name, gid, have) \
	FIELD(name), .gid_offset = offsetof(struct rd_options, gid), .have_offset = offsetof(struct rd_options, have)
#define USER (RD_OPT_CLI | RD_OPT_FILE)

static const char *const backends[] = { "host", "cuda", "auto", NULL };
static const char *const wakes[] = { "spin", "launch", NULL };
static const char *const client_waits[] = { "stream", "host", NULL };
static const char *const log_levels[] = { "error", "warn", "info", "debug", "trace", NULL };

/* Every option, once. A worker reads no configuration file: what it needs
 * comes on its command line (RD_OPT_WORKER), built from this table. */
const struct rd_option rd_option_table[] = {
	{ "socket", "socket", "PATH", RD_OPT_PATH, USER | RD_OPT_WORKER, FIELD(socket_path),
	  .def = REGEN_DEFAULT_SOCKET, .help = "main socket; device N's worker listens on PATH.devN" },
	{ "backend", "backend", "host|cuda|auto", RD_OPT_CHOICE, USER | RD_OPT_WORKER, FIELD(backend), .choices = backends,
	  .def = "auto", .help = "compute backend; auto: cuda where a GPU is" },
	{ "devices", "devices", "N", RD_OPT_DEVICES, USER, FIELD(devices), .def = "auto",
	  .help = "devices to serve (host: how many to simulate)" },
	{ "admin-group", "admin_group", "NAME", RD_OPT_GROUP, USER | RD_OPT_WORKER | RD_OPT_RELOAD,
	  GROUP_FIELDS(admin_group, admin_gid, have_admin_gid), .def = "",
	  .help = "members may Release/Reset/Restart (root always may)" },
	{ "socket-group", "socket_group", "NAME", RD_OPT_GROUP, USER | RD_OPT_WORKER,
	  GROUP_FIELDS(socket_group, socket_gid, have_socket_gid), .def = "",
	  .help = "group of the sockets: its members may connect" },
	{ "enable-fault-injection", "fault_injection", NULL, RD_OPT_BOOL, USER | RD_OPT_WORKER, FIELD(fault_injection),
	  .def = "false", .help = "allow io.regen.Device.InjectFault (tests only)" },
	{ "drain-deadline-ms", "drain_deadline_ms", "MS", RD_OPT_UINT, USER | RD_OPT_WORKER | RD_OPT_RELOAD,
	  FIELD(drain_deadline_ms), .min = 0, .max = 3600000, .def = "10000",
	  .help = "how long Restart and SIGTERM wait for calls in flight" },
	{ "call-deadline-ms", "call_deadline_ms", "MS", RD_OPT_UINT, USER | RD_OPT_WORKER, FIELD(call_deadline_ms),
	  .min = 1, .max = 86400000, .def = "60000",
	  .help = "a compute call's deadline when it names none; past it (and past a call's own) the device counts as "
		  "hung" },
	{ "hang-cooldown-ms", "hang_cooldown_ms", "MS", RD_OPT_UINT, USER | RD_OPT_RELOAD, FIELD(hang_cooldown_ms),
	  .min = 0, .max = 86400000, .def = "60000",
	  .help = "a uid whose compute call hung a device has its compute calls refused this long, doubling with "
		  "each hang within a cool-down of the last (up to 64x); 0: no cool-down" },
	{ "heartbeat-ms", "heartbeat_ms", "MS", RD_OPT_UINT, USER | RD_OPT_RELOAD, FIELD(heartbeat_ms), .min = 100,
	  .max = 600000, .def = "2000", .help = "a worker that answers no heartbeat this long is unresponsive: respawned" },
	{ "health-period-ms", "health_period_ms", "MS", RD_OPT_UINT, USER | RD_OPT_WORKER, FIELD(health_period_ms),
	  .min = 1, .max = 1000, .def = "5", .help = "how often a worker checks its context without a call" },
	{ "failed-retry-ms", "failed_retry_ms", "MS", RD_OPT_UINT, USER | RD_OPT_RELOAD, FIELD(failed_retry_ms),
	  .min = 100, .max = 86400000, .def = "30000",
	  .help = "first pause before a worker is started again on a failed GPU (doubles, up to 16x)" },
	{ "worker-start-timeout-ms", "worker_start_timeout_ms", "MS", RD_OPT_UINT, USER | RD_OPT_RELOAD,
	  FIELD(worker_start_timeout_ms), .min = 1000, .max = 3600000, .def = "120000",
	  .help = "a worker not ready this long after it started is killed and counted as a failed start" },
	{ "socket-mode", "socket_mode", "OCTAL", RD_OPT_MODE, USER | RD_OPT_WORKER, FIELD(socket_mode), .def = "0660",
	  .help = "mode of the sockets regend creates" },
	/* Workers log too: it travels on their command line, and on SIGHUP. */
	{ "log-level", "log_level", "LEVEL", RD_OPT_LOG_LEVEL, USER | RD_OPT_WORKER | RD_OPT_RELOAD, FIELD(log_level),
	  .def = "info", .help = "error, warn, info, debug or trace (REGEN_DEBUG wins)" },
	{ "max-connections", "max_connections", "N", RD_OPT_UINT, USER | RD_OPT_WORKER | RD_OPT_RELOAD,
	  FIELD(max_connections), .min = 1, .max = 1000000, .def = "256",
	  .help = "connections per uid, on each socket" },
	{ "max-buffers", "max_buffers", "N", RD_OPT_UINT, USER | RD_OPT_WORKER, FIELD(max_buffers), .min = 1,
	  .max = 100000000, .def = "4096", .help = "imported buffers per client process and device" },
	{ "max-events", "max_events", "N", RD_OPT_UINT, USER | RD_OPT_WORKER, FIELD(max_events), .min = 1,
	  .max = 100000000, .def = "4096", .help = "imported events (io.regen.Memory.ImportEvent) per client process and device" },
	{ "max-comms", "max_comms", "N", RD_OPT_UINT, USER | RD_OPT_WORKER, FIELD(max_comms), .min = 1, .max = 65536,
	  .def = "64", .help = "communicators (io.regen.Comm) per client process and device" },
	{ "max-programs", "max_programs", "N", RD_OPT_UINT, USER | RD_OPT_WORKER, FIELD(max_programs), .min = 1,
	  .max = 65536, .def = "64", .help = "programs (io.regen.Program) defined per client process and device" },
	{ "max-program-nodes", "max_program_nodes", "N", RD_OPT_UINT, USER | RD_OPT_WORKER, FIELD(max_program_nodes),
	  .min = 1, .max = 16777216, .def = "65536",
	  .help = "nodes of all the programs one client process holds on a device, counted after lowering" },
	{ "max-uid-programs", "max_uid_programs", "N", RD_OPT_UINT, USER | RD_OPT_WORKER, FIELD(max_uid_programs),
	  .min = 1, .max = 16777216, .def = "256",
	  .help = "programs the processes of one uid define together, per device" },
	{ "max-uid-program-nodes", "max_uid_program_nodes", "N", RD_OPT_UINT, USER | RD_OPT_WORKER,
	  FIELD(max_uid_program_nodes), .min = 1, .max = 268435456, .def = "262144",
	  .help = "nodes of all the programs the processes of one uid hold on a device together, after lowering" },
	{ "max-uid-compile-ms", "max_uid_compile_ms", "MS", RD_OPT_UINT, USER | RD_OPT_WORKER, FIELD(max_uid_compile_ms),
	  .min = 1, .max = 86400000, .def = "600000",
	  .help = "NVRTC time compiling the kernels of one uid's programs may take per device, a budget given back at "
		  "this many ms an hour; a compile past it is stopped, its Run LimitExceeded" },
	{ "max-uid-module-mib", "max_uid_module_mib", "MIB", RD_OPT_UINT, USER | RD_OPT_WORKER, FIELD(max_uid_module_mib),
	  .min = 1, .max = 1048576, .def = "1024",
	  .help = "compiled kernels (their images, in the worker's memory and loaded on the device) the programs of "
		  "one uid hold together per device" },
	{ "max-ring-entries", "max_ring_entries", "N", RD_OPT_UINT, USER | RD_OPT_WORKER, FIELD(max_ring_entries),
	  .min = 1, .max = 16777216, .def = "16384",
	  .help = "entries of a uid's lane rings (io.regen.Lane) together, per device: each holds a call's state" },
	{ "max-import-gib", "max_import_gib", "GIB", RD_OPT_UINT, USER | RD_OPT_WORKER, FIELD(max_import_gib),
	  .min = 1, .max = 131072, .def = "1024",
	  .help = "GiB a uid's imported buffers may span together, per device (each is mapped into the worker)" },
	{ "max-kept-gib", "max_kept_gib", "GIB", RD_OPT_UINT, USER | RD_OPT_RELOAD, FIELD(max_kept_gib), .min = 0,
	  .max = 131072, .def = "1024",
	  .help = "GiB of memory a uid's ranks may have regend keep for them together (io.regen.Keep), held or leased; "
		  "0: none" },
	{ "max-kept", "max_kept", "N", RD_OPT_UINT, USER | RD_OPT_RELOAD, FIELD(max_kept), .min = 0, .max = 65536,
	  .def = "1024", .help = "names a uid may have kept together (each holds one file descriptor in regend)" },
	{ "keep-lease-ms", "keep_lease_ms", "MS", RD_OPT_UINT, USER | RD_OPT_RELOAD, FIELD(keep_lease_ms), .min = 0,
	  .max = 86400000, .def = "300000",
	  .help = "how long kept memory outlives the last process that held it before it is freed, at most and by "
		  "default" },
	{ "max-scratch-mib", "max_scratch_mib", "MIB", RD_OPT_UINT, USER | RD_OPT_WORKER, FIELD(max_scratch_mib),
	  .min = 1, .max = 1048576, .def = "4096",
	  .help = "scratch one compute call may take (workspaces, host staging); more is LimitExceeded" },
	/* Read when the worker opens its device (the backend sizes its cache
	 * then): a restart applies a new value, as for attention's plans,
	 * whose limit has no key. */
	{ "gemm-plans-max", "gemm_plans_max", "N", RD_OPT_UINT, USER | RD_OPT_WORKER, FIELD(gemm_plans_max), .min = 1,
	  .max = 65536, .def = "256",
	  .help = "GEMM plans (cuBLASLt) each device keeps cached; the least recently used are destroyed past it" },
	/* Read when the worker opens its device. */
	{ "rtc-cache-dir", "rtc_cache_dir", "PATH", RD_OPT_PATH, USER | RD_OPT_WORKER, FIELD(rtc_cache_dir), .def = "",
	  .help = "where the CUDA backend keeps programs' compiled kernels between runs (a directory of regend's user "
		  "that no other may write); empty: systemd's cache directory ending in /rtc where the unit made one "
		  "(CacheDirectory=regen/rtc), else nowhere" },
	/* Tuning. Each is also set by its environment variable (between the
	 * file and the command line), as before it was an option. */
	{ "message-timeout-ms", "message_timeout_ms", "MS", RD_OPT_UINT, USER | RD_OPT_WORKER, FIELD(message_timeout_ms),
	  .env = "REGEN_MESSAGE_TIMEOUT_MS", .min = 1, .max = 3600000, .def = STR(RD_MESSAGE_TIMEOUT_MS_DEFAULT),
	  .help = "a message begun must end within this, counted while regend reads the connection; else it is "
		  "closed" },
	{ "ring-spin-us", "ring_spin_us", "US|auto", RD_OPT_UINT, USER | RD_OPT_WORKER, FIELD(ring_spin_us),
	  .env = "REGEN_RING_SPIN_US", .min = 0, .max = 10000000, .or_auto = true, .def = "auto",
	  .help = "how long a worker watches a lane's ring after a record before it sleeps on the doorbell, at "
		  "most; auto: 1000, or 10 with fewer than four CPUs" },
	{ "cuda-spin-us", "cuda_spin_us", "US", RD_OPT_UINT, USER | RD_OPT_WORKER, FIELD(cuda_spin_us),
	  .env = "REGEN_CUDA_SPIN_US", .min = 0, .max = 10000000, .def = STR(RD_CUDA_SPIN_US_DEFAULT),
	  .help = "how long a CUDA lane's completer polls a call's completion before it sleeps" },
	{ "cuda-share-alone-us", "cuda_share_alone_us", "US", RD_OPT_UINT, USER | RD_OPT_WORKER,
	  FIELD(cuda_share_alone_us), .env = "REGEN_CUDA_SHARE_ALONE_US", .min = 0, .max = 10000000,
	  .def = STR(RD_CUDA_SHARE_ALONE_US_DEFAULT),
	  .help = "how long a uid alone on a CUDA device keeps its calls from entering to their end, at most: the "
		  "calls it runs at once follow it (two at least, 64 at most), and so does what another uid's call "
		  "that comes finds ahead of it; 0: unbounded" },
	{ "cuda-wake", "cuda_wake", "spin|launch", RD_OPT_CHOICE, USER | RD_OPT_WORKER, FIELD(cuda_wake),
	  .env = "REGEN_CUDA_WAKE", .choices = wakes, .def = "spin",
	  .help = "spin: a CUDA completer arms its wake-up when it stops spinning; launch: with every call (to "
		  "measure against)" },
	{ "cuda-client-wait", "cuda_client_wait", "stream|host", RD_OPT_CHOICE, USER | RD_OPT_WORKER,
	  FIELD(cuda_client_wait), .env = "REGEN_CUDA_CLIENT_WAIT", .choices = client_waits, .def = "stream",
	  .help = "stream: a CUDA call's wait_event is waited for on its lane's stream; host: its lane's thread "
		  "polls the event and launches the call once it is done, so no stream waits on a client's work "
		  "(a dead client's waiting calls fail, the device is not replaced)" },
	{ "cuda-inline-launch", "cuda_inline_launch", NULL, RD_OPT_BOOL, USER | RD_OPT_WORKER,
	  FIELD(cuda_inline_launch), .env = "REGEN_CUDA_INLINE_LAUNCH", .def = "true",
	  .help = "a GEMM that finds its CUDA lane idle is launched by the worker's loop itself, not handed to the "
		  "lane's thread" },
	{ "cuda-launch-profile", "cuda_launch_profile", NULL, RD_OPT_BOOL, USER | RD_OPT_WORKER,
	  FIELD(cuda_launch_profile), .env = "REGEN_CUDA_LAUNCH_PROFILE", .def = "false",
	  .help = "each CUDA lane sums where its launches spend their time and prints the means when it goes" },
	{ "reset-retry-ms", "reset_retry_ms", "MS|auto", RD_OPT_UINT, USER | RD_OPT_WORKER, FIELD(reset_retry_ms),
	  .env = "REGEN_RESET_RETRY_MS", .min = 0, .max = 60000, .or_auto = true, .def = "auto",
	  .help = "how long a CUDA reset retries making the new context; auto: 25 after a sticky error, else 250" },
	{ "attention-autotune", "attention_autotune", "N", RD_OPT_UINT, USER | RD_OPT_WORKER, FIELD(attention_autotune),
	  .env = "REGEN_ATTENTION_AUTOTUNE", .min = 0, .max = 16, .def = "0",
	  .help = "attention configurations a CUDA worker times on each new problem's first calls and picks the "
		  "fastest of; 0 or 1: none, the heuristics' first" },
	{ "program-gemm-slots", "program_gemm_slots", NULL, RD_OPT_BOOL, USER | RD_OPT_WORKER,
	  FIELD(program_gemm_slots), .env = "REGEN_PROGRAM_GEMM_SLOTS", .def = "false",
	  .help = "a CUDA program's GEMMs read their operands from the Run's argument block (cuBLASLt's pointer "
		  "arrays), so that its graph replays when they move" },
	{ "nvml", "nvml", NULL, RD_OPT_BOOL, USER | RD_OPT_WORKER, FIELD(nvml), .env = "REGEN_NVML", .def = "true",
	  .help = "a CUDA worker watches its GPU's XIDs, ECC and row remapping through NVML" },
	{ "config", NULL, "PATH", RD_OPT_CONFIG, RD_OPT_CLI, FIELD(config_path), .def = RD_CONFIG_DEFAULT,
	  .help = "configuration file" },
	{ "help", NULL, NULL, RD_OPT_HELP, RD_OPT_CLI, .help = "print this help and exit" },
	{ "version", NULL, NULL, RD_OPT_VERSION, RD_OPT_CLI, .help = "print the version and exit" },
	/* How the supervisor starts device N's worker. */
	{ "worker", NULL, "N", RD_OPT_UINT, RD_OPT_CLI | RD_OPT_INTERNAL | RD_OPT_WORKER, FIELD(worker_device),
	  .min = 0, .max = RD_DEVICES_MAX - 1, .help = "be device N's worker" },
	{ "generation", NULL, "G", RD_OPT_UINT, RD_OPT_CLI | RD_OPT_INTERNAL | RD_OPT_WORKER,
	  FIELD(worker_generation), .min = 1, .max = UINT64_MAX, .help = "the generation to serve" },
	{ "epoch", NULL, "E", RD_OPT_UINT, RD_OPT_CLI | RD_OPT_INTERNAL | RD_OPT_WORKER, FIELD(worker_epoch),
	  .min = 1, .max = UINT64_MAX, .help = "the node's epoch now" },
	{ "charged", NULL, "LIST", RD_OPT_TEXT, RD_OPT_CLI | RD_OPT_INTERNAL | RD_OPT_WORKER, FIELD(worker_charged),
	  .help = "the uids cooling down after a hang: uid:ms_left:cooldown_ms:strikes,..." },
	{ "ctl-fd", NULL, "FD", RD_OPT_UINT, RD_OPT_CLI | RD_OPT_INTERNAL | RD_OPT_WORKER, FIELD(ctl_fd), .min = 0,
	  .max = 1024, .help = "the control channel to the supervisor" },
	{ "programs-fd", NULL, "FD", RD_OPT_UINT, RD_OPT_CLI | RD_OPT_INTERNAL | RD_OPT_WORKER, FIELD(programs_fd),
	  .min = 0, .max = 1024, .help = "the programs to define again before serving (their processes' ids kept)" },
	{ NULL },
};

#define EACH_OPTION(opt) for (const struct rd_option *opt = rd_option_table; opt->flag || opt->key; opt++)

const struct rd_option *rd_option_by_key(const char *key)
{
	EACH_OPTION(opt)
		if (opt->key && strcmp(opt->key, key) == 0)
			return opt;
	return NULL;
}

/* Digits only (no sign, no blanks, no 0x): "010" is ten milliseconds, not
 * eight, and a mode is octal whether or not it starts with 0. */
static int parse_number(const char *text, int base, unsigned long long max, unsigned long long *out)
{
	unsigned long long v;
	char *end;

	if (!*text || strspn(text, base == 8 ? "01234567" : "0123456789") != strlen(text))
		return -EINVAL;
	errno = 0;
	v = strtoull(text, &end, base);
	if (errno || *end || v > max)
		return -EINVAL;
	*out = v;
	return 0;
}

static void *field(struct rd_options *o, size_t offset)
{
	return (char *)o + offset;
}

static const void *cfield(const struct rd_options *o, size_t offset)
{
	return (const char *)o + offset;
}

/* Integer fields are int, unsigned or uint64_t: stored and read by size. */
static void store_uint(struct rd_options *o, const struct rd_option *opt, unsigned long long v)
{
	if (opt->size == sizeof(uint64_t)) {
		uint64_t u = v;
		memcpy(field(o, opt->offset), &u, sizeof(u));
	} else {
		unsigned u = (unsigned)v;
		memcpy(field(o, opt->offset), &u, sizeof(u));
	}
}

static long long load_int(const struct rd_options *o, const struct rd_option *opt)
{
	if (opt->size == sizeof(uint64_t)) {
		uint64_t u;
		memcpy(&u, cfield(o, opt->offset), sizeof(u));
		return (long long)u;
	}
	int i;
	memcpy(&i, cfield(o, opt->offset), sizeof(i));
	return i;
}

static void choices_text(const char *const *choices, char *buf, size_t size)
{
	size_t n = 0;

	buf[0] = '\0';
	for (int i = 0; choices[i] && n < size; i++)
		n += snprintf(buf + n, size - n, "%s%s", i == 0 ? "" : choices[i + 1] ? ", " : " or ", choices[i]);
}

static int find_choice(const char *const *choices, const char *value)
{
	for (int i = 0; choices[i]; i++)
		if (strcmp(choices[i], value) == 0)
			return i;
	return -1;
}

/* 1, 0, or -1 when the text is neither. */
static int parse_bool(const char *text)
{
	static const char *const yes[] = { "true", "yes", "1", NULL }, *const no[] = { "false", "no", "0", NULL };

	return find_choice(yes, text) >= 0 ? 1 : find_choice(no, text) >= 0 ? 0 : -1;
}

#define WHY(...) (why ? snprintf(why, why_size, __VA_ARGS__) : 0)

int rd_option_set(struct rd_options *o, const struct rd_option *opt, const char *value, char *why, size_t why_size)
{
	unsigned long long v;
	char text[96];

	switch (opt->type) {
	case RD_OPT_PATH:
		/* A path whose default is none may be set back to none. */
		if (value[0] == '\0' && opt->def && opt->def[0] == '\0') {
			snprintf(field(o, opt->offset), opt->size, "%s", value);
			return 0;
		}
		if (value[0] != '/' || strlen(value) + 8 >= opt->size) {
			WHY("expected an absolute path of at most %zu bytes, got '%.100s'", opt->size - 9, value);
			return -EINVAL;
		}
		snprintf(field(o, opt->offset), opt->size, "%s", value);
		return 0;
	case RD_OPT_CONFIG:
		snprintf(field(o, opt->offset), opt->size, "%s", value);
		return 0;
	case RD_OPT_TEXT:
		if (strlen(value) >= opt->size) {
			WHY("expected at most %zu bytes, got %zu", opt->size - 1, strlen(value));
			return -EINVAL;
		}
		snprintf(field(o, opt->offset), opt->size, "%s", value);
		return 0;
	case RD_OPT_CHOICE:
		if (find_choice(opt->choices, value) < 0) {
			choices_text(opt->choices, text, sizeof(text));
			WHY("expected %s, got '%.100s'", text, value);
			return -EINVAL;
		}
		snprintf(field(o, opt->offset), opt->size, "%s", value);
		return 0;
	case RD_OPT_UINT:
		if (opt->or_auto && strcmp(value, "auto") == 0) {
			store_uint(o, opt, (unsigned long long)-1);
			return 0;
		}
		if (parse_number(value, 10, opt->max, &v) < 0 || v < opt->min) {
			WHY("expected %llu..%llu%s, got '%.100s'", opt->min, opt->max, opt->or_auto ? " or auto" : "", value);
			return -EINVAL;
		}
		store_uint(o, opt, v);
		return 0;
	case RD_OPT_DEVICES:
		if (!*value || strcmp(value, "auto") == 0) {
			v = (unsigned long long)-1;
		} else if (parse_number(value, 10, RD_DEVICES_MAX, &v) < 0 || v == 0) {
			WHY("expected 1..%d or auto, got '%.100s'", RD_DEVICES_MAX, value);
			return -EINVAL;
		}
		store_uint(o, opt, v);
		return 0;
	case RD_OPT_MODE:
		if (parse_number(value, 8, 0777, &v) < 0) {
			WHY("expected an octal mode 0..0777 like 0660, got '%.100s'", value);
			return -EINVAL;
		}
		store_uint(o, opt, v);
		return 0;
	case RD_OPT_BOOL: {
		int b = parse_bool(value);
		if (b < 0) {
			WHY("expected true or false, got '%.100s'", value);
			return -EINVAL;
		}
		*(bool *)field(o, opt->offset) = b;
		return 0;
	}
	case RD_OPT_GROUP: {
		struct group *g = NULL;
		if (*value && !(g = getgrnam(value))) {
			WHY("no group named '%.100s'", value);
			return -ENOENT;
		}
		if (strlen(value) >= opt->size) {
			WHY("expected a group name of at most %zu bytes, got '%.100s'", opt->size - 1, value);
			return -EINVAL;
		}
		snprintf(field(o, opt->offset), opt->size, "%s", value);
		*(bool *)field(o, opt->have_offset) = g != NULL;
		*(gid_t *)field(o, opt->gid_offset) = g ? g->gr_gid : 0;
		return 0;
	}
	case RD_OPT_LOG_LEVEL: {
		int level = rd_log_level_parse(value);
		if (level < 0) {
			choices_text(log_levels, text, sizeof(text));
			WHY("expected %s, got '%.100s'", text, value);
			return -EINVAL;
		}
		store_uint(o, opt, (unsigned)level);
		return 0;
	}
	case RD_OPT_HELP:
	case RD_OPT_VERSION:
		break;
	}
	WHY("takes no value");
	return -EINVAL;
}

int rd_option_format(const struct rd_options *o, const struct rd_option *opt, char *buf, size_t size)
{
	long long v;

	buf[0] = '\0';
	switch (opt->type) {
	case RD_OPT_PATH:
	case RD_OPT_CONFIG:
	case RD_OPT_CHOICE:
		snprintf(buf, size, "%s", (const char *)cfield(o, opt->offset));
		return 0;
	case RD_OPT_UINT:
		v = load_int(o, opt);
		if (opt->or_auto && v < 0)
			snprintf(buf, size, "auto");
		else if (opt->size == sizeof(uint64_t))
			snprintf(buf, size, "%llu", (unsigned long long)v);
		else
			snprintf(buf, size, "%lld", v);
		return 0;
	case RD_OPT_DEVICES:
		v = load_int(o, opt);
		if (v < 0)
			snprintf(buf, size, "auto");
		else
			snprintf(buf, size, "%lld", v);
		return 0;
	case RD_OPT_MODE:
		snprintf(buf, size, "0%o", (unsigned)load_int(o, opt));
		return 0;
	case RD_OPT_BOOL: {
		bool b = *(const bool *)cfield(o, opt->offset);
		snprintf(buf, size, "%s", b ? "true" : "false");
		return b == (opt->def && parse_bool(opt->def) == 1) ? 1 : 0;
	}
	case RD_OPT_GROUP:
		snprintf(buf, size, "%s", (const char *)cfield(o, opt->offset));
		return *(const bool *)cfield(o, opt->have_offset) ? 0 : 1;
	case RD_OPT_LOG_LEVEL:
		v = load_int(o, opt);
		snprintf(buf, size, "%s", v >= 0 && v < 5 ? log_levels[v] : "info");
		return 0;
	case RD_OPT_TEXT:
		snprintf(buf, size, "%s", (const char *)cfield(o, opt->offset));
		return buf[0] ? 0 : 1;
	case RD_OPT_HELP:
	case RD_OPT_VERSION:
		break;
	}
	return 1;
}

void rd_options_defaults(struct rd_options *o)
{
	memset(o, 0, sizeof(*o));
	EACH_OPTION(opt)
		if (opt->def && opt->type != RD_OPT_CONFIG)
			rd_option_set(o, opt, opt->def, NULL, 0);
	/* The internal options have no default a user writes: -1 says "not a
	 * worker" and "no control channel"; a generation and the epoch start
	 * at 1. */
	o->worker_device = -1;
	o->worker_generation = 1;
	o->worker_epoch = 1;
	o->ctl_fd = -1;
	o->programs_fd = -1;
}

void rd_options_usage(FILE *f)
{
	char left[64], def[160];
	bool file_alone = false;

	fprintf(f, "Usage: regend [OPTIONS]\nServe GEMM and attention on this node's GPUs over Varlink.\n\n");
	EACH_OPTION(opt) {
		if (!opt->flag || (opt->where & RD_OPT_INTERNAL))
			continue;
		snprintf(left, sizeof(left), "--%s%s%s", opt->flag, opt->arg ? " " : opt->type == RD_OPT_BOOL ? "[=BOOL]" : "",
			 opt->arg ? opt->arg : "");
		def[0] = '\0';
		if (opt->def && *opt->def)
			snprintf(def, sizeof(def), " (default %s%s%s)", opt->def, opt->env ? "; " : "", opt->env ? opt->env : "");
		else if (opt->env)
			snprintf(def, sizeof(def), " (%s)", opt->env);
		fprintf(f, "  %-26s %s%s\n", left, opt->help, def);
	}
	fprintf(f, "\nEach option is also a key of the configuration file (--drain-deadline-ms: drain_deadline_ms;\n"
		   "--enable-fault-injection: fault_injection = true).\n");
	EACH_OPTION(opt) {
		if (opt->flag)
			continue;
		if (!file_alone)
			fprintf(f, "Keys of the file alone:\n");
		file_alone = true;
		snprintf(left, sizeof(left), "%s = %s", opt->key, opt->arg);
		fprintf(f, "  %-26s %s (default %s)\n", left, opt->help, opt->def);
	}
	fprintf(f, "\nAn option that names a variable (REGEN_RING_SPIN_US) may be set in the environment too; the\n"
		   "command line wins over it, and it over the file. Logs go to stderr. The environment also holds:\n");
	for (int i = 0; i < RD_ENV_VARS; i++)
		if (!rd_env_table[i].test)
			fprintf(f, "  %s=%s\n      %s\n", rd_env_table[i].name, rd_env_table[i].value, rd_env_table[i].help);
	fprintf(f, "Test knobs (tests only, never in production):\n");
	for (int i = 0; i < RD_ENV_VARS; i++)
		if (rd_env_table[i].test)
			fprintf(f, "  %s=%s\n      %s\n", rd_env_table[i].name, rd_env_table[i].value, rd_env_table[i].help);
}

int rd_options_parse(struct rd_options *o, int argc, char **argv)
{
	struct option longopts[96];
	char why[256];
	int n = 0, c;

	EACH_OPTION(opt) {
		if (!opt->flag)
			continue;
		if (n == (int)(sizeof(longopts) / sizeof(longopts[0])) - 1)
			return -ENOSPC;
		longopts[n++] = (struct option){ opt->flag,
						 opt->arg ? required_argument
							  : opt->type == RD_OPT_BOOL ? optional_argument : no_argument,
						 NULL, 256 + (int)(opt - rd_option_table) };
	}
	longopts[n] = (struct option){ NULL, 0, NULL, 0 };
	optind = 1;
	while ((c = getopt_long(argc, argv, "", longopts, NULL)) != -1) {
		if (c < 256) {
			rd_options_usage(stderr);
			return -EINVAL;
		}
		const struct rd_option *opt = &rd_option_table[c - 256];
		switch (opt->type) {
		case RD_OPT_HELP:
			rd_options_usage(stdout);
			return 1;
		case RD_OPT_VERSION:
			printf("regend %s\n", REGEN_VERSION);
			return 1;
		case RD_OPT_CONFIG:
			break;   /* read before the command line, by rd_options_load */
		default:
			if (rd_option_set(o, opt, optarg ? optarg : "true", why, sizeof(why)) < 0) {
				fprintf(stderr, "regend: --%s: %s\n", opt->flag, why);
				return -EINVAL;
			}
		}
	}
	if (optind < argc) {
		fprintf(stderr, "regend: unexpected argument '%s'\n", argv[optind]);
		return -EINVAL;
	}
	return 0;
}

static char *trim(char *s)
{
	char *end;

	while (*s == ' ' || *s == '\t')
		s++;
	end = s + strlen(s);
	while (end > s && (end[-1] == ' ' || end[-1] == '\t' || end[-1] == '\n' || end[-1] == '\r'))
		*--end = '\0';
	return s;
}

int rd_options_read_file(struct rd_options *o, const char *path, bool explicit_path)
{
	char line[512], why[256];
	unsigned lineno = 0;
	int errors = 0;
	FILE *f = fopen(path, "re");

	if (!f) {
		if (errno == ENOENT && !explicit_path)
			return 0;
		fprintf(stderr, "regend: cannot read %s: %s\n", path, strerror(errno));
		return -errno;
	}
	while (fgets(line, sizeof(line), f)) {
		size_t len = strlen(line);
		char *s, *eq, *key, *value;
		const struct rd_option *opt;

		lineno++;
		if (len == sizeof(line) - 1 && line[len - 1] != '\n' && !feof(f)) {
			/* Its rest would read as a line of its own: a key at the end
			 * of a long comment would take effect. The line is refused,
			 * all of it. */
			int c;

			while ((c = fgetc(f)) != EOF && c != '\n')
				;
			fprintf(stderr, "regend: %s:%u: line longer than %zu bytes\n", path, lineno, sizeof(line) - 2);
			errors++;
			continue;
		}
		s = trim(line);
		if (!*s || *s == '#')
			continue;
		eq = strchr(s, '=');
		if (!eq) {
			fprintf(stderr, "regend: %s:%u: expected 'key = value'\n", path, lineno);
			errors++;
			continue;
		}
		*eq = '\0';
		key = trim(s);
		value = trim(eq + 1);
		opt = rd_option_by_key(key);
		if (!opt || !(opt->where & RD_OPT_FILE)) {
			fprintf(stderr, "regend: %s:%u: unknown key '%s'\n", path, lineno, key);
			errors++;
		} else if (rd_option_set(o, opt, value, why, sizeof(why)) < 0) {
			fprintf(stderr, "regend: %s:%u: %s: %s\n", path, lineno, key, why);
			errors++;
		}
	}
	fclose(f);
	snprintf(o->config_path, sizeof(o->config_path), "%s", path);
	return errors ? -EINVAL : 0;
}

int rd_options_read_env(struct rd_options *o)
{
	char why[256];
	int errors = 0;

	EACH_OPTION(opt) {
		const char *value = opt->env ? getenv(opt->env) : NULL;

		/* Set empty is unset, as a shell's VAR= leaves it. */
		if (!value || !*value)
			continue;
		if (rd_option_set(o, opt, value, why, sizeof(why)) < 0) {
			fprintf(stderr, "regend: %s: %s\n", opt->env, why);
			errors++;
		}
	}
	return errors ? -EINVAL : 0;
}

/* rtc_cache_dir set nowhere: the unit's cache directory for it, when
 * systemd made one (CacheDirectory=regen/rtc puts ".../rtc" among
 * $CACHE_DIRECTORY's colon-separated paths), so that a worker started
 * after a fault loads the programs' kernels instead of compiling them
 * again while the ranks wait. */
static void rtc_cache_dir_from_systemd(struct rd_options *o)
{
	const char *dirs = getenv("CACHE_DIRECTORY");

	if (o->rtc_cache_dir[0] || !dirs)
		return;
	for (const char *p = dirs; *p;) {
		const char *end = strchrnul(p, ':');
		size_t n = (size_t)(end - p);
		if (n > 4 && n < sizeof(o->rtc_cache_dir) && !memcmp(end - 4, "/rtc", 4)) {
			memcpy(o->rtc_cache_dir, p, n);
			o->rtc_cache_dir[n] = '\0';
			return;
		}
		p = *end ? end + 1 : end;
	}
}

int rd_options_load(struct rd_options *o, int argc, char **argv)
{
	const char *path = RD_CONFIG_DEFAULT;
	bool explicit_path = false;
	int r;

	rd_options_defaults(o);
	for (int i = 1; i < argc; i++) {
		if (!strcmp(argv[i], "--config") && i + 1 < argc) {
			path = argv[i + 1];
			explicit_path = true;
		} else if (!strncmp(argv[i], "--config=", 9)) {
			path = argv[i] + 9;
			explicit_path = true;
		} else if (!strcmp(argv[i], "--worker")) {
			/* Workers get everything they need on their command line. */
			path = NULL;
		}
	}
	if (path) {
		r = rd_options_read_file(o, path, explicit_path);
		if (r < 0 || rd_options_read_env(o) < 0)
			return -EINVAL;
	}
	r = rd_options_parse(o, argc, argv);
	if (r == 0 && path)
		rtc_cache_dir_from_systemd(o);
	return r;
}

int rd_options_worker_argv(const struct rd_options *o, const char *exe, struct rd_argv *out)
{
	size_t used = 0;
	int n = 0;

	out->argv[n++] = (char *)exe;
	EACH_OPTION(opt) {
		char value[256];
		int len;

		if (!(opt->where & RD_OPT_WORKER) || rd_option_format(o, opt, value, sizeof(value)) != 0)
			continue;
		/* An internal fd of -1 is none: not passed. */
		if ((opt->where & RD_OPT_INTERNAL) && value[0] == '-')
			continue;
		if (opt->type == RD_OPT_BOOL) {
			/* One word: --flag=false, for a flag whose default is true. */
			len = snprintf(out->text + used, sizeof(out->text) - used, "--%s=%s", opt->flag, value);
			if (n + 2 > RD_ARGV_MAX || len < 0 || (size_t)len + 1 >= sizeof(out->text) - used)
				return -ENOSPC;
			out->argv[n++] = out->text + used;
			used += (size_t)len + 1;
			continue;
		}
		len = snprintf(out->text + used, sizeof(out->text) - used, "--%s%c%s", opt->flag, '\0', value);
		if (n + 3 > RD_ARGV_MAX || len < 0 || (size_t)len + 1 >= sizeof(out->text) - used)
			return -ENOSPC;
		out->argv[n++] = out->text + used;
		used += strlen(opt->flag) + 3;
		if (opt->arg) {
			out->argv[n++] = out->text + used;
			used += strlen(value) + 1;
		}
	}
	out->argv[n] = NULL;
	return 0;
}

/* Groups carry their gid and whether there is one beside the name. */
static void copy_value(struct rd_options *dst, const struct rd_options *src, const struct rd_option *opt)
{
	memcpy(field(dst, opt->offset), cfield(src, opt->offset), opt->size);
	if (opt->type == RD_OPT_GROUP) {
		memcpy(field(dst, opt->gid_offset), cfield(src, opt->gid_offset), sizeof(gid_t));
		memcpy(field(dst, opt->have_offset), cfield(src, opt->have_offset), sizeof(bool));
	}
}

void rd_options_reload(struct rd_options *live, const struct rd_options *fresh, char *restart_only, size_t size)
{
	size_t n = 0;

	restart_only[0] = '\0';
	EACH_OPTION(opt) {
		char a[256], b[256];

		if (!opt->key || (opt->where & RD_OPT_INTERNAL))
			continue;
		if (opt->where & RD_OPT_RELOAD) {
			copy_value(live, fresh, opt);
			continue;
		}
		rd_option_format(live, opt, a, sizeof(a));
		rd_option_format(fresh, opt, b, sizeof(b));
		if (strcmp(a, b) && n < size)
			n += snprintf(restart_only + n, size - n, "%s%s", n ? ", " : "", opt->key);
	}
}

static bool worker_reloads(const struct rd_option *opt)
{
	return opt->key && (opt->where & RD_OPT_WORKER) && (opt->where & RD_OPT_RELOAD);
}

void rd_options_each_worker_reload(const struct rd_options *o,
				   void (*fn)(const char *key, const char *value, void *data), void *data)
{
	EACH_OPTION(opt) {
		char value[256];

		if (!worker_reloads(opt))
			continue;
		rd_option_format(o, opt, value, sizeof(value));
		fn(opt->key, value, data);
	}
}

int rd_options_set_worker_reload(struct rd_options *o, const char *key, const char *value, char *why,
				 size_t why_size)
{
	const struct rd_option *opt = rd_option_by_key(key);

	if (!opt || !worker_reloads(opt)) {
		WHY("not an option a running worker reloads");
		return -ENOENT;
	}
	return rd_option_set(o, opt, value, why, why_size);
}

int rd_worker_socket_path(const struct rd_options *o, int device, char *buf, size_t size)
{
	int n = snprintf(buf, size, "%s.dev%d", o->socket_path, device);
	return n < 0 || (size_t)n >= size ? -ENAMETOOLONG : 0;
}

cJSON *rd_options_to_json(const struct rd_options *o)
{
	cJSON *all = cJSON_CreateObject();

	EACH_OPTION(opt) {
		char value[256];

		if (!opt->key || (opt->where & RD_OPT_INTERNAL))
			continue;
		rd_option_format(o, opt, value, sizeof(value));
		if (!all || !cJSON_AddStringToObject(all, opt->key, value)) {
			cJSON_Delete(all);
			return NULL;
		}
	}
	return all;
}
