/* SPDX-License-Identifier: Apache-2.0 */
/* regenctl: look at and steer regend from a shell or a scheduler. */
#include <errno.h>
#include <getopt.h>
#include <math.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>
#include <cjson/cJSON.h>
#include "regen-config.h"
#include "regen.h"
#include "client/ctl/call.h"
#include "client/ctl/metrics.h"
#include "client/ctl/targets.h"
#include "proto/job.h"
#include "proto/keep.h"
#include "proto/text.h"

enum {
	EXIT_OK = 0,
	EXIT_ERROR = 1,
	EXIT_USAGE = 2,
	EXIT_TIMEOUT = 3,
	EXIT_NOT_PERMITTED = 4,
	EXIT_UNREACHABLE = 5,
	/* health's verdicts, worst first when devices differ. */
	EXIT_DEGRADED = 6,
	EXIT_FAULTED = 7,
	EXIT_FAILED = 8,
	EXIT_UNSUPPORTED = 9,
};

#define DEFAULT_TIMEOUT_S 60.0

/* The options a command may take (struct command's `options`). --socket,
 * --json and --timeout go with every command. */
enum {
	OPT_DEVICE = 1 << 0,
	OPT_ALL = 1 << 1,
	OPT_REASON = 1 << 2,
	OPT_WAIT = 1 << 3,
	OPT_DEADLINE = 1 << 4,
	OPT_COUNT = 1 << 5,
	OPT_KIND = 1 << 6,
	OPT_JOB = 1 << 7,
	OPT_MORE = 1 << 8,
	OPT_UID = 1 << 9,
};

struct opts {
	const char *socket;
	bool json;
	unsigned given;          /* OPT_* on the command line */
	int device;              /* inject-fault's; -1: not given */
	const char *device_list; /* --device as given */
	struct ctl_targets targets;   /* lifecycle commands: resolved after connecting */
	const char *reason;
	double timeout;          /* seconds */
	bool timeout_set;
	long deadline_ms;
	long count;
	const char *kind;
	long xid;                /* inject-fault xid's number */
	const char *command;     /* its name, for messages */
	const char *method, *params;   /* call's */
	/* kept's and drop's: the job, the rank (-1: every one), the name
	 * (NULL: every one), and --uid (-1: the caller's own). */
	const char *kept_job;
	long kept_rank;
	const char *kept_name;
	long uid;
};

enum verb { VERB_NONE = 0, VERB_RELEASE, VERB_RESET, VERB_RESTART, VERB_DETACH, VERB_ATTACH };

struct command {
	const char *name;
	int (*run)(regen_client *c, const struct command *cmd, const struct opts *o);
	const char *args;        /* what follows the name in the usage text */
	const char *help;
	unsigned options;        /* OPT_* it takes */
	bool admin;              /* root or the daemon's admin group */
	enum verb verb;          /* lifecycle commands */
};

static int cmd_status(regen_client *c, const struct command *cmd, const struct opts *o);
static int cmd_generation(regen_client *c, const struct command *cmd, const struct opts *o);
static int cmd_lifecycle(regen_client *c, const struct command *cmd, const struct opts *o);
static int cmd_watch(regen_client *c, const struct command *cmd, const struct opts *o);
static int cmd_inject_fault(regen_client *c, const struct command *cmd, const struct opts *o);
static int cmd_health(regen_client *c, const struct command *cmd, const struct opts *o);
static int cmd_kept(regen_client *c, const struct command *cmd, const struct opts *o);
static int cmd_drop(regen_client *c, const struct command *cmd, const struct opts *o);
/* The node's name as dcgm-exporter labels its series (Hostname): $NODE_NAME
 * where it is set (a Kubernetes pod's, from the downward API, as
 * dcgm-exporter reads it), else the host name. */
static const char *metrics_hostname(void)
{
	static char name[256];
	const char *node = getenv("NODE_NAME");

	if (node != NULL && node[0] != '\0') {
		return node;
	}
	if (gethostname(name, sizeof(name) - 1) < 0) {
		return "";
	}
	name[sizeof(name) - 1] = '\0';
	return name;
}

static int cmd_metrics(regen_client *c, const struct command *cmd, const struct opts *o);

#define LIFECYCLE_OPTS (OPT_DEVICE | OPT_ALL | OPT_JOB | OPT_REASON | OPT_WAIT)

static const struct command commands[] = {
	{ "status", cmd_status, "", "every device: generation, state, backend, worker", 0, false, VERB_NONE },
	{ "generation", cmd_generation, "", "the node epoch and each device's generation", 0, false, VERB_NONE },
	{ "release", cmd_lifecycle, "TARGET [--reason TEXT] [--wait]",
	  "drain and release: CUDA resources destroyed, memory returned", LIFECYCLE_OPTS, true, VERB_RELEASE },
	{ "reset", cmd_lifecycle, "TARGET [--reason TEXT] [--wait]", "throw the context away and rebuild",
	  LIFECYCLE_OPTS, true, VERB_RESET },
	{ "restart", cmd_lifecycle, "TARGET [--reason TEXT] [--deadline-ms MS] [--wait]",
	  "drain (until the deadline), release or reset, new generation", LIFECYCLE_OPTS | OPT_DEADLINE, true,
	  VERB_RESTART },
	{ "detach", cmd_lifecycle, "TARGET [--reason TEXT] [--deadline-ms MS]",
	  "drain, worker exits, no handle on the GPU, no respawn (for nvidia-smi -r, driver upgrades)",
	  OPT_DEVICE | OPT_ALL | OPT_JOB | OPT_REASON | OPT_DEADLINE, true, VERB_DETACH },
	{ "attach", cmd_lifecycle, "TARGET [--reason TEXT] [--wait]", "bring detached devices back, new generation",
	  LIFECYCLE_OPTS, true, VERB_ATTACH },
	{ "health", cmd_health, "", "exit 0 when every device is ready, else 6 degraded, 7 faulted, 8 failed, "
	  "9 unsupported", 0, false, VERB_NONE },
	{ "metrics", cmd_metrics, "", "Prometheus text format (node_exporter's textfile collector)", 0, false,
	  VERB_NONE },
	{ "call", NULL, "METHOD [JSON] [--more]", "one raw Varlink call on regend's socket; prints each reply", OPT_MORE,
	  false, VERB_NONE },
	{ "watch", cmd_watch, "[--count N]", "print the current state, then one line per state transition", OPT_COUNT,
	  false, VERB_NONE },
	{ "kept", cmd_kept, "[JOB]", "memory regend keeps for ranks (io.regen.Keep): job, rank, name, uid, bytes, step, "
	  "held by which process or until when", 0, false, VERB_NONE },
	{ "drop", cmd_drop, "JOB [RANK [NAME]] [--uid UID]",
	  "free kept memory now: a name, a rank's set or the job's; another uid's with --uid (admin)", OPT_UID, false,
	  VERB_NONE },
	{ "inject-fault", cmd_inject_fault, "[--device N] KIND [XID]",
	  "KIND: crash, device_lost, hang, or xid with its number (the host backend reports it as NVML would); "
	  "needs regend --enable-fault-injection", OPT_DEVICE | OPT_KIND, true, VERB_NONE },
};
#define NCOMMANDS (sizeof(commands) / sizeof(commands[0]))

/* io.regen.Device.InjectFault's kinds. */
static const char *const fault_kinds[] = { "crash", "device_lost", "hang", "xid", NULL };
/* The XIDs InjectFault takes (its `xid` parameter). */
#define XID_MAX 65535

/* The command-line spelling of each OPT_* bit, for usage errors. */
static const char *option_name(unsigned bit)
{
	switch (bit) {
	case OPT_DEVICE:
		return "--device";
	case OPT_ALL:
		return "--all";
	case OPT_REASON:
		return "--reason";
	case OPT_WAIT:
		return "--wait";
	case OPT_DEADLINE:
		return "--deadline-ms";
	case OPT_COUNT:
		return "--count";
	case OPT_KIND:
		return "--kind";
	case OPT_JOB:
		return "--job";
	case OPT_MORE:
		return "--more";
	case OPT_UID:
		return "--uid";
	}
	return "?";
}

static void usage(FILE *f)
{
	char head[96];
	size_t i;

	fprintf(f, "Usage: regenctl [--socket PATH] [--json] [--as-job JOB] COMMAND [OPTIONS] [--timeout S]\n\n"
		"Commands:\n");
	for (i = 0; i < NCOMMANDS; i++) {
		const struct command *cmd = &commands[i];

		snprintf(head, sizeof(head), "%s%s%s", cmd->name, cmd->args[0] ? " " : "", cmd->args);
		if (strlen(head) <= 24) {
			fprintf(f, "  %-26s%s%s\n", head, cmd->help, cmd->admin ? " (admin)" : "");
		} else {
			fprintf(f, "  %s\n%28s%s%s\n", head, "", cmd->help, cmd->admin ? " (admin)" : "");
		}
	}
	fprintf(f,
		"\n"
		"TARGET (one of them; there is no default):\n"
		"  --device LIST   devices by index (0,1 or 0-3), GPU UUID (GPU-..., HOST-N on the\n"
		"                  host backend), MIG device (MIG-..., GPU:MIG: its GPU) or PCI bus\n"
		"                  id (0000:65:00.0), as status shows them\n"
		"  --job           the job's own GPUs: SLURM_STEP_GPUS, SLURM_JOB_GPUS,\n"
		"                  NVIDIA_VISIBLE_DEVICES or CUDA_VISIBLE_DEVICES, the first set\n"
		"                  (a folder of GPUs, or void with /dev/nvidiaN nodes: the\n"
		"                  device plugin's volume-mounts and CDI); a job without GPUs\n"
		"                  has nothing to do (exit 0)\n"
		"  --all           every device of the node, other jobs' too\n"
		"\n"
		"Options:\n"
		"  --socket PATH   regend's socket (default $REGEN_SOCKET, else %s)\n"
		"  --json          machine-readable output: one JSON object per line\n"
		"  --as-job JOB    the job regenctl works for, in its own words (default $REGEN_JOB):\n"
		"                  named in lifecycle reasons, Status and the log where regenctl's\n"
		"                  cgroup names no job; 1-64 of A-Z a-z 0-9 . _ - : / @ + =\n"
		"  --wait          after the command, wait until every targeted device is ready\n"
		"                  in a newer generation; print the generation(s) and the time taken\n"
		"  --timeout S     give up after S seconds (default 60; watch: no limit)\n"
		"  --count N       watch: exit after N transitions\n"
		"  --more          call: ask for more replies and print each until the last\n"
		"  --uid UID       drop: another uid's kept memory (admin)\n"
		"  --version       regenctl's version\n"
		"  -h, --help      this text\n"
		"\n"
		"Admin commands need root or membership in regend's --admin-group.\n"
		"\n"
		"Exit status:\n"
		"  0  success\n"
		"  1  error: regend answered with an error, or another failure\n"
		"  2  usage error\n"
		"  3  timeout: --timeout passed (or regend's " REGEN_ERROR_TIMEOUT ")\n"
		"  4  not permitted: " REGEN_ERROR_NOT_PERMITTED " (admin commands need root or the admin\n"
		"     group), or no permission to open the socket\n"
		"  5  regend unreachable: no socket, connection refused, or the connection broke\n"
		"  health only (the worst device wins):\n"
		"  6  degraded: a device is draining, released, resetting, respawning or detached,\n"
		"     or its GPU waits for a reset (retired pages or remapped rows pending)\n"
		"  7  faulted: a device faulted or its worker is unresponsive\n"
		"  8  failed: a device failed (needs a GPU reset or fell off the bus), or a row\n"
		"     remapping failed\n"
		"  9  unsupported: the node's software cannot drive a device (the NVIDIA driver is\n"
		"     missing or too old for the CUDA runtime, the GPU is older than regen\n"
		"     supports, the CUDA backend is not installed): status names what to install\n",
		REGEN_DEFAULT_SOCKET);
}

static int usage_error(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
static int usage_error(const char *fmt, ...)
{
	va_list ap;

	fprintf(stderr, "regenctl: ");
	va_start(ap, fmt);
	vfprintf(stderr, fmt, ap);
	va_end(ap);
	fprintf(stderr, "\nTry 'regenctl --help'.\n");
	return EXIT_USAGE;
}

static double now_s(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

static int exit_code(int r, const char *name)
{
	if (r == -EREMOTE && name != NULL) {
		if (strcmp(name, REGEN_ERROR_NOT_PERMITTED) == 0 || strcmp(name, REGEN_ERROR_PERMISSION_DENIED) == 0) {
			return EXIT_NOT_PERMITTED;
		}
		if (strcmp(name, REGEN_ERROR_TIMEOUT) == 0) {
			return EXIT_TIMEOUT;
		}
		return EXIT_ERROR;
	}
	switch (-r) {
	case ETIMEDOUT:
		return EXIT_TIMEOUT;
	case EACCES:
	case EPERM:
		return EXIT_NOT_PERMITTED;
	case ENOENT:
	case ECONNREFUSED:
	case ECONNRESET:
	case ENOTCONN:
	case EPIPE:
		return EXIT_UNREACHABLE;
	default:
		return EXIT_ERROR;
	}
}

/* A string from regend as a terminal shows it (proto/text.h): its text
 * comes from clients too (a restart's reason), and no line feed or
 * terminal sequence of theirs reaches whoever runs regenctl. One of four
 * buffers, used in turn. */
static const char *shown(const char *s)
{
	static char bufs[4][1024];
	static unsigned next;
	char *b = bufs[next++ % 4];

	rp_text_escape(s, RP_TEXT_LINE, b, sizeof(bufs[0]));
	return b;
}

/* Reports a failed call on stderr and picks the exit status. */
static int fail(regen_client *c, const char *what, int r)
{
	const char *name = regen_client_error_name(c);
	const char *msg = regen_client_error_message(c);

	if (r == -EREMOTE && name != NULL) {
		fprintf(stderr, "regenctl: %s: %s%s%s\n", what, shown(name), msg ? ": " : "", msg ? shown(msg) : "");
	} else if (msg != NULL) {
		fprintf(stderr, "regenctl: %s: %s (%s)\n", what, strerror(-r), shown(msg));
	} else {
		fprintf(stderr, "regenctl: %s: %s\n", what, strerror(-r));
	}
	return exit_code(r, name);
}

/* Prints and frees one line of JSON (NULL: out of memory, nothing), what
 * a terminal would act on escaped in its strings. */
static void print_line(char *text)
{
	char *safe = text != NULL ? rp_text_escape_dup(text, RP_TEXT_JSON) : NULL;

	if (safe != NULL)
		puts(safe);
	free(safe);
	free(text);
	fflush(stdout);
}

static void print_json(const cJSON *o)
{
	print_line(cJSON_PrintUnformatted(o));
}

/* The reply as regend sent it, on one line. */
static void print_status_json(const regen_status *st)
{
	print_line(regen_status_to_json(st));
}

static void count_cell(char *cell, size_t size, int64_t v)
{
	if (v < 0)
		snprintf(cell, size, "?");
	else
		snprintf(cell, size, "%lld", (long long)v);
}

/* HEALTH, UUID, PCI, LAST_XID (number@UTC time), ECC_DBE (since the driver
 * loaded/lifetime) and PENDING (what waits for a GPU reset, or needs
 * service): one word each, "-" for none, "?" for unknown. */
static void health_cells(const struct regen_device_info *d, char (*cell)[128])
{
	char v[32], a[32];

	if (!REGEN_HAS_FIELD(d, remap_failed) || !d->has_health) {
		for (int j = 0; j < 6; j++)
			snprintf(cell[j], 128, "-");
		return;
	}
	snprintf(cell[0], 128, "%s", d->health_source[0] ? shown(d->health_source) : "-");
	snprintf(cell[1], 128, "%s", d->uuid[0] ? shown(d->uuid) : "-");
	snprintf(cell[2], 128, "%s", d->pci_bus_id[0] ? shown(d->pci_bus_id) : "-");
	if (d->last_xid) {
		time_t t = (time_t)(d->last_xid_unix_ms / 1000);
		struct tm tm;
		char when[32] = "?";

		if (gmtime_r(&t, &tm))
			strftime(when, sizeof(when), "%Y-%m-%dT%H:%M:%SZ", &tm);
		snprintf(cell[3], 128, "%u@%s", d->last_xid, when);
	} else {
		snprintf(cell[3], 128, "-");
	}
	count_cell(v, sizeof(v), d->ecc_dbe_volatile);
	count_cell(a, sizeof(a), d->ecc_dbe_aggregate);
	snprintf(cell[4], 128, "%s/%s", v, a);
	snprintf(cell[5], 128, "%s%s%s", d->retired_pages_pending == 1 ? "retire," : "",
		 d->remap_pending == 1 ? "remap," : "", d->remap_failed == 1 ? "remap-failed," : "");
	if (cell[5][0])
		cell[5][strlen(cell[5]) - 1] = '\0';
	else
		snprintf(cell[5], 128, "%s", d->retired_pages_pending < 0 && d->remap_pending < 0 ? "?" : "-");
}

static int cmd_status(regen_client *c, const struct command *cmd, const struct opts *o)
{
	enum { NCOL = 16 };
	static const char *const head[NCOL] = {
		"DEVICE", "GEN", "STATE", "BACKEND", "PID", "RESPAWNS", "MEM_USED", "MEM_BASE", "WORKER_SOCKET",
		"HEALTH", "UUID", "PCI", "LAST_XID", "ECC_DBE", "PENDING", "SHARING",
	};
	regen_status *st = NULL;
	char (*cells)[NCOL][128];
	int width[NCOL];
	int i, j, n, r;

	r = regen_status_get(c, &st);
	if (r < 0) {
		return fail(c, cmd->name, r);
	}
	if (o->json) {
		print_status_json(st);
		regen_status_free(st);
		return EXIT_OK;
	}
	n = regen_status_device_count(st);
	cells = calloc((size_t)n + 1, sizeof(*cells));
	if (cells == NULL) {
		regen_status_free(st);
		return EXIT_ERROR;
	}
	for (j = 0; j < NCOL; j++) {
		snprintf(cells[0][j], sizeof(cells[0][j]), "%s", head[j]);
	}
	for (i = 0; i < n; i++) {
		const struct regen_device_info *d = regen_status_device(st, i);
		char (*row)[128] = cells[i + 1];

		snprintf(row[0], 128, "%d", d->index);
		snprintf(row[1], 128, "%llu", (unsigned long long)d->generation);
		snprintf(row[2], 128, "%s", d->state[0] ? shown(d->state) : "-");
		snprintf(row[3], 128, "%s", d->backend[0] ? shown(d->backend) : "-");
		/* No worker runs (detached, failed, between two): "-". */
		if (d->worker_pid > 0)
			snprintf(row[4], 128, "%lld", (long long)d->worker_pid);
		else
			snprintf(row[4], 128, "-");
		snprintf(row[5], 128, "%llu", (unsigned long long)d->respawns);
		snprintf(row[6], 128, "%llu", (unsigned long long)d->memory_used);
		snprintf(row[7], 128, "%llu", (unsigned long long)d->memory_baseline);
		snprintf(row[8], 128, "%s", d->worker_socket[0] ? shown(d->worker_socket) : "-");
		health_cells(d, row + 9);
		/* SHARING: "mps" (no isolation between the worker and the ranks)
		 * or "isolated"; "-" before a worker said. */
		snprintf(row[15], 128, "%s",
			 !REGEN_HAS_FIELD(d, sharing_reason) || !d->has_sharing ? "-" : d->mps ? "mps" : "isolated");
	}
	for (j = 0; j < NCOL; j++) {
		width[j] = 0;
		for (i = 0; i <= n; i++) {
			int len = (int)strlen(cells[i][j]);

			if (len > width[j]) {
				width[j] = len;
			}
		}
	}
	for (i = 0; i <= n; i++) {
		for (j = 0; j < NCOL; j++) {
			if (j == NCOL - 1) {
				printf("%s\n", cells[i][j]);
			} else {
				printf("%-*s  ", width[j], cells[i][j]);
			}
		}
	}
	free(cells);
	regen_status_free(st);
	return EXIT_OK;
}

static int cmd_generation(regen_client *c, const struct command *cmd, const struct opts *o)
{
	regen_status *st = NULL;
	int i, r;

	r = regen_generation_get(c, &st);
	if (r < 0) {
		return fail(c, cmd->name, r);
	}
	if (o->json) {
		print_status_json(st);
	} else {
		printf("EPOCH %llu\n", (unsigned long long)regen_status_epoch(st));
		printf("%-6s  %-10s  %s\n", "DEVICE", "GEN", "STATE");
		for (i = 0; i < regen_status_device_count(st); i++) {
			const struct regen_device_info *d = regen_status_device(st, i);

			printf("%-6d  %-10llu  %s\n", d->index, (unsigned long long)d->generation, shown(d->state));
		}
	}
	regen_status_free(st);
	return EXIT_OK;
}

static bool targeted(const struct opts *o, int index)
{
	return ctl_targeted(&o->targets, index);
}

/* --wait: a Watch subscribed before the command is sent, and the targeted
 * devices' generations from just after it; the command's changes then
 * arrive as events. The stream from the subscription on is complete and in
 * order, so the last event of each device is its state now. */
/* How a targeted device came back, from the states it went through: the
 * worst one counts (a release whose worker was then killed was a respawn). */
enum how { HOW_NONE = 0, HOW_RELEASED, HOW_RESET, HOW_RESPAWNED };

struct waiter {
	regen_watcher *w;
	regen_status *before;
	uint64_t epoch;
	struct {
		bool seen;
		bool ready;
		uint64_t generation;
	} now[REGEN_DEVICES_MAX];
	/* Outlive a new subscription. */
	enum how how[REGEN_DEVICES_MAX];
	char why[REGEN_DEVICES_MAX][160];   /* the respawn's reason */
	const struct opts *o;               /* NULL until the command was sent: no progress before */
	bool progress;                      /* stderr is a terminal: one line per step */
	long in_flight[REGEN_DEVICES_MAX];  /* calls in flight as the command went out */
};

/* Each device's calls in flight as the command is sent (Status asks the
 * workers afresh): what its drain waits for. -1 where regend does not say. */
static void note_in_flight(regen_client *c, struct waiter *wt)
{
	char *reply = NULL;
	cJSON *j, *d;

	for (int i = 0; i < REGEN_DEVICES_MAX; i++) {
		wt->in_flight[i] = -1;
	}
	if (regen_call(c, -1, "io.regen.Device.Status", NULL, NULL, 0, &reply) < 0) {
		return;
	}
	j = cJSON_Parse(reply);
	cJSON_ArrayForEach(d, cJSON_GetObjectItemCaseSensitive(j, "devices")) {
		const cJSON *index = cJSON_GetObjectItemCaseSensitive(d, "index");
		const cJSON *in_flight = cJSON_GetObjectItemCaseSensitive(cJSON_GetObjectItemCaseSensitive(d, "counters"),
									  "in_flight");

		if (cJSON_IsNumber(index) && index->valuedouble >= 0 && index->valuedouble < REGEN_DEVICES_MAX &&
		    cJSON_IsNumber(in_flight)) {
			wt->in_flight[(int)index->valuedouble] = (long)in_flight->valuedouble;
		}
	}
	cJSON_Delete(j);
	free(reply);
}

static void waiter_progress(struct waiter *wt, const struct regen_watch_event *ev)
{
	const char *s = ev->state;
	long n;

	if (strcmp(ev->reason, "subscribed") == 0) {
		return;
	}
	if (strcmp(s, "draining") == 0) {
		n = wt->in_flight[ev->device];
		if (n >= 0) {
			fprintf(stderr, "device %d: draining %ld call(s) in flight\n", ev->device, n);
		} else {
			fprintf(stderr, "device %d: draining\n", ev->device);
		}
	} else if (strcmp(s, "released") == 0) {
		fprintf(stderr, "device %d: releasing in place (every resource destroyed, memory returned)\n", ev->device);
	} else if (strcmp(s, "resetting") == 0) {
		fprintf(stderr, "device %d: resetting (context thrown away and rebuilt)\n", ev->device);
	} else if (strcmp(s, "respawning") == 0 && strcmp(wt->o->command, "attach") == 0) {
		fprintf(stderr, "device %d: attaching: a new worker starts\n", ev->device);
	} else if (strcmp(s, "respawning") == 0 || strcmp(s, "unresponsive") == 0) {
		fprintf(stderr, "device %d: worker killed, respawning: %s\n", ev->device, shown(ev->reason));
	} else if (strcmp(s, "ready") == 0) {
		fprintf(stderr, "device %d: ready in generation %llu\n", ev->device, (unsigned long long)ev->generation);
	} else {
		fprintf(stderr, "device %d: %s: %s\n", ev->device, shown(s), shown(ev->reason));
	}
}

static void waiter_apply(struct waiter *wt, const struct regen_watch_event *ev)
{
	enum how how = HOW_NONE;

	if (ev->device < 0 || ev->device >= REGEN_DEVICES_MAX) {
		return;
	}
	if (wt->o != NULL && targeted(wt->o, ev->device) && strcmp(ev->reason, "subscribed") != 0) {
		if (strcmp(ev->state, "released") == 0) {
			how = HOW_RELEASED;
		} else if (strcmp(ev->state, "resetting") == 0) {
			how = HOW_RESET;
		} else if (strcmp(ev->state, "respawning") == 0 || strcmp(ev->state, "unresponsive") == 0) {
			how = HOW_RESPAWNED;
			snprintf(wt->why[ev->device], sizeof(wt->why[ev->device]), "%s", ev->reason);
		}
		if (how > wt->how[ev->device]) {
			wt->how[ev->device] = how;
		}
		if (wt->progress) {
			waiter_progress(wt, ev);
		}
	}
	wt->now[ev->device].seen = true;
	wt->now[ev->device].ready = strcmp(ev->state, "ready") == 0;
	wt->now[ev->device].generation = ev->generation;
	if (ev->epoch > wt->epoch) {
		wt->epoch = ev->epoch;
	}
}

/* Seconds to wait for the next event before `deadline`. Never 0, which
 * libregen takes as "forever": past the deadline, events already received
 * are still read, and only then the wait times out. */
static double wait_left(double deadline)
{
	double left = deadline - now_s();

	return left > 0.001 ? left : 0.001;
}

/* Subscribes; returns once regend has taken the subscription (its first
 * event is in), so that no change after this point goes unseen. */
static int waiter_subscribe(regen_client *c, struct waiter *wt, double deadline)
{
	const struct regen_watch_event *ev;
	int r;

	regen_watcher_close(wt->w);
	wt->w = NULL;
	memset(wt->now, 0, sizeof(wt->now));
	r = regen_watcher_open(c, &wt->w);
	if (r == 0) {
		r = regen_watcher_next(wt->w, wait_left(deadline), &ev);
	}
	if (r == 0) {
		waiter_apply(wt, ev);
	}
	return r;
}

/* True when every targeted device is ready in a generation newer than it
 * had before the command. */
static bool waiter_done(const struct waiter *wt, const struct opts *o)
{
	for (int i = 0; i < regen_status_device_count(wt->before); i++) {
		const struct regen_device_info *d = regen_status_device(wt->before, i);

		if (!targeted(o, d->index) || d->index < 0 || d->index >= REGEN_DEVICES_MAX) {
			continue;
		}
		/* Attach leaves a device that was not detached as it was. */
		if (!wt->now[d->index].seen || !wt->now[d->index].ready ||
		    (wt->now[d->index].generation <= d->generation &&
		     !(strcmp(o->command, "attach") == 0 && strcmp(d->state, "detached") != 0))) {
			return false;
		}
	}
	return true;
}

static void waiter_report(const struct waiter *wt, const struct opts *o, double start)
{
	cJSON *out, *arr, *e;
	int i;

	if (o->json) {
		out = cJSON_CreateObject();
		arr = cJSON_AddArrayToObject(out, "devices");
		cJSON_AddNumberToObject(out, "epoch", (double)wt->epoch);
		for (i = 0; i < REGEN_DEVICES_MAX; i++) {
			if (wt->now[i].seen && targeted(o, i) && regen_status_find_device(wt->before, i) != NULL) {
				e = cJSON_CreateObject();
				cJSON_AddNumberToObject(e, "index", i);
				cJSON_AddNumberToObject(e, "generation", (double)wt->now[i].generation);
				cJSON_AddStringToObject(e, "state", "ready");
				cJSON_AddStringToObject(e, "how", (const char *const[]){ "", "released", "reset",
										       "respawned" }[wt->how[i]]);
				cJSON_AddItemToArray(arr, e);
			}
		}
		cJSON_AddNumberToObject(out, "elapsed_ms", floor((now_s() - start) * 1000.0));
		cJSON_AddBoolToObject(out, "ready", 1);
		print_json(out);
		cJSON_Delete(out);
		return;
	}
	for (i = 0; i < REGEN_DEVICES_MAX; i++) {
		if (wt->now[i].seen && targeted(o, i) && regen_status_find_device(wt->before, i) != NULL) {
			printf("device %d: ready in generation %llu", i, (unsigned long long)wt->now[i].generation);
			switch (wt->how[i]) {
			case HOW_RELEASED:
				printf(" (released in place)\n");
				break;
			case HOW_RESET:
				printf(" (reset in place)\n");
				break;
			case HOW_RESPAWNED:
				if (strcmp(o->command, "attach") == 0) {
					printf(" (attached: a new worker)\n");
				} else {
					printf(" (worker killed and respawned: %s)\n", shown(wt->why[i]));
				}
				break;
			default:
				printf("\n");
			}
		}
	}
	printf("elapsed %.3f s\n", now_s() - start);
	fflush(stdout);
}

/* Reads events until the targeted devices are ready in a new generation.
 * A broken Watch connection (regend restarting) is subscribed again: its
 * first events say where every device stands. */
static int waiter_wait(regen_client *c, struct waiter *wt, const struct opts *o, double start, double deadline)
{
	const struct regen_watch_event *ev;
	int r;

	for (int i = 0; i < REGEN_DEVICES_MAX && !o->targets.all; i++) {
		if (o->targets.want[i] && regen_status_find_device(wt->before, i) == NULL) {
			fprintf(stderr, "regenctl: wait: regend serves no device %d\n", i);
			return EXIT_ERROR;
		}
	}
	while (!waiter_done(wt, o)) {
		if (wt->w == NULL) {
			r = now_s() < deadline ? waiter_subscribe(c, wt, deadline) : -ETIMEDOUT;
		} else {
			r = regen_watcher_next(wt->w, wait_left(deadline), &ev);
			if (r == 0) {
				waiter_apply(wt, ev);
			}
		}
		if (r == -ETIMEDOUT) {
			fprintf(stderr, "regenctl: wait: gave up after %.1f s: not every device is ready in a new generation "
				"yet; the %s goes on inside regend ('regenctl watch' follows it)\n", now_s() - start,
				o->command);
			return EXIT_TIMEOUT;
		}
		if (r == -ECONNRESET || r == -ENODATA || r == -ECONNREFUSED || r == -ENOENT) {
			regen_watcher_close(wt->w);
			wt->w = NULL;
			usleep(20000);
		} else if (r < 0) {
			return fail(c, "wait", r);
		}
	}
	waiter_report(wt, o, start);
	return EXIT_OK;
}

static const char *verb_method(enum verb verb)
{
	switch (verb) {
	case VERB_RELEASE:
		return "io.regen.Device.Release";
	case VERB_RESET:
		return "io.regen.Device.Reset";
	case VERB_DETACH:
		return "io.regen.Device.Detach";
	case VERB_ATTACH:
		return "io.regen.Device.Attach";
	default:
		return "io.regen.Device.Restart";
	}
}

/* The call's parameters: one device as "device" (what every regend
 * understands), several as "devices", none for --all. */
static char *lifecycle_params(const struct command *cmd, const struct opts *o)
{
	cJSON *p = cJSON_CreateObject(), *list = NULL;
	char *text;

	if (!o->targets.all && o->targets.count == 1) {
		for (int i = 0; i < REGEN_DEVICES_MAX; i++)
			if (o->targets.want[i])
				cJSON_AddNumberToObject(p, "device", i);
	} else if (!o->targets.all) {
		list = cJSON_AddArrayToObject(p, "devices");
		for (int i = 0; i < REGEN_DEVICES_MAX; i++)
			if (o->targets.want[i])
				cJSON_AddItemToArray(list, cJSON_CreateNumber(i));
	}
	if (o->reason)
		cJSON_AddStringToObject(p, "reason", o->reason);
	if ((cmd->verb == VERB_RESTART || cmd->verb == VERB_DETACH) && (o->given & OPT_DEADLINE))
		cJSON_AddNumberToObject(p, "deadline_ms", (double)o->deadline_ms);
	text = cJSON_PrintUnformatted(p);
	cJSON_Delete(p);
	return text;
}

/* The reply, one line per targeted device. */
static void print_lifecycle_reply(const struct command *cmd, const struct opts *o, const char *text)
{
	cJSON *reply = cJSON_Parse(text), *d;
	const cJSON *elapsed = cJSON_GetObjectItemCaseSensitive(reply, "elapsed_us");

	cJSON_ArrayForEach(d, cJSON_GetObjectItemCaseSensitive(reply, "devices")) {
		const cJSON *index = cJSON_GetObjectItemCaseSensitive(d, "index");
		const cJSON *gen = cJSON_GetObjectItemCaseSensitive(d, "generation");
		const char *state = cJSON_GetStringValue(cJSON_GetObjectItemCaseSensitive(d, "state"));

		if (cJSON_IsNumber(index) && targeted(o, (int)index->valuedouble))
			printf("device %d: generation %.0f, %s\n", (int)index->valuedouble,
			       cJSON_IsNumber(gen) ? gen->valuedouble : 0, state ? shown(state) : "?");
	}
	if (cJSON_IsNumber(elapsed) && elapsed->valuedouble > 0)
		printf("%s took %.3f ms\n", cmd->name, elapsed->valuedouble / 1000.0);
	fflush(stdout);
	cJSON_Delete(reply);
}

/* The lifecycle call, on a thread of its own while --wait follows the
 * device's steps on the Watch connection: Release, Reset and Restart
 * answer only when the devices serve again. */
struct pending_call {
	regen_client *c;
	const char *method, *params;
	char *reply;
	int r;
	atomic_bool done;
};

static void *call_thread(void *data)
{
	struct pending_call *pc = data;

	pc->r = regen_call(pc->c, -1, pc->method, pc->params, NULL, 0, &pc->reply);
	atomic_store(&pc->done, true);
	return NULL;
}

/* Sends the call on a connection of its own (*caller, which says what went
 * wrong; the watcher's reads touch c's error state) and, while it runs,
 * reads the Watch (progress lines). */
static int call_while_watching(regen_client *c, const struct opts *o, double timeout, struct waiter *wt,
			       const char *method, const char *params, char **reply, regen_client **caller)
{
	struct pending_call pc = { .method = method, .params = params };
	const struct regen_watch_event *ev;
	pthread_t th;
	int r;

	*caller = c;
	r = regen_client_connect(o->socket, &pc.c);
	if (r < 0) {
		return r;
	}
	regen_client_set_timeout(pc.c, timeout);
	*caller = pc.c;
	atomic_init(&pc.done, false);
	if (pthread_create(&th, NULL, call_thread, &pc) != 0) {
		return regen_call(pc.c, -1, method, params, NULL, 0, reply);
	}
	while (!atomic_load(&pc.done) && wt->w != NULL) {
		r = regen_watcher_next(wt->w, 0.05, &ev);
		if (r == 0) {
			waiter_apply(wt, ev);
		} else if (r != -ETIMEDOUT) {
			/* waiter_wait subscribes again. */
			regen_watcher_close(wt->w);
			wt->w = NULL;
		}
	}
	pthread_join(th, NULL);
	*reply = pc.reply;
	return pc.r;
}

static int cmd_lifecycle(regen_client *c, const struct command *cmd, const struct opts *o)
{
	double timeout = o->timeout_set ? o->timeout : DEFAULT_TIMEOUT_S;
	double start = now_s(), deadline = start + timeout;
	struct waiter wt = { 0 };
	char *params = NULL, *reply = NULL;
	regen_client *caller = c;
	int r, rc;

	if (!o->targets.all && o->targets.count == 0) {
		/* --job in a job without GPUs: nothing of the node is its own. */
		fprintf(stderr, "regenctl: %s: the job has no GPU (%s): nothing to do\n", cmd->name, o->targets.from);
		return EXIT_OK;
	}
	regen_client_set_timeout(c, timeout);
	if (o->given & OPT_WAIT) {
		r = waiter_subscribe(c, &wt, deadline);
		if (r == 0) {
			r = regen_generation_get(c, &wt.before);
		}
		if (r < 0) {
			rc = fail(c, "wait", r);
			goto out;
		}
	}
	params = lifecycle_params(cmd, o);
	wt.o = o;
	wt.progress = !o->json && isatty(STDERR_FILENO);
	if (wt.progress) {
		note_in_flight(c, &wt);
	}
	if (!params) {
		r = -ENOMEM;
	} else if (o->given & OPT_WAIT) {
		r = call_while_watching(c, o, timeout, &wt, verb_method(cmd->verb), params, &reply, &caller);
	} else {
		r = regen_call(c, -1, verb_method(cmd->verb), params, NULL, 0, &reply);
	}
	if (r == -ETIMEDOUT) {
		fprintf(stderr, "regenctl: %s: no answer within %.1f s; the %s goes on inside regend ('regenctl watch' "
			"follows it)\n", cmd->name, timeout, cmd->name);
		rc = EXIT_TIMEOUT;
		goto out;
	}
	if (r < 0) {
		rc = fail(caller, cmd->name, r);
		goto out;
	}
	if (o->json) {
		puts(reply);
		fflush(stdout);
	} else {
		print_lifecycle_reply(cmd, o, reply);
	}
	rc = EXIT_OK;
	if (o->given & OPT_WAIT) {
		rc = waiter_wait(c, &wt, o, start, deadline);
	}
out:
	if (caller != c) {
		regen_client_destroy(caller);
	}
	regen_watcher_close(wt.w);
	regen_status_free(wt.before);
	free(params);
	free(reply);
	return rc;
}

struct watch_state {
	const struct opts *o;
	long changes;
};

static int on_event(const struct regen_watch_event *ev, void *userdata)
{
	struct watch_state *ws = userdata;
	cJSON *j;

	if (ws->o->json) {
		j = cJSON_CreateObject();
		if (j != NULL) {
			cJSON_AddNumberToObject(j, "epoch", (double)ev->epoch);
			cJSON_AddNumberToObject(j, "device", ev->device);
			cJSON_AddNumberToObject(j, "generation", (double)ev->generation);
			cJSON_AddStringToObject(j, "state", ev->state);
			cJSON_AddStringToObject(j, "reason", ev->reason);
			print_json(j);
			cJSON_Delete(j);
		}
	} else {
		printf("epoch %llu device %d generation %llu state %s reason %s\n",
		       (unsigned long long)ev->epoch, ev->device, (unsigned long long)ev->generation,
		       ev->state[0] ? shown(ev->state) : "-", ev->reason[0] ? shown(ev->reason) : "-");
		fflush(stdout);
	}
	if (strcmp(ev->reason, "subscribed") != 0) {
		ws->changes++;
	}
	return (ws->o->given & OPT_COUNT) && ws->changes >= ws->o->count;
}

/* The Watch ended because regend went away (stopped, restarting, its
 * socket not there yet), not because of the watch. */
static bool regend_gone(regen_client *c, int r)
{
	const char *name = regen_client_error_name(c);

	if (r == -EREMOTE)
		return name != NULL && strcmp(name, REGEN_ERROR_DRAINING) == 0;
	return r == -ECONNRESET || r == -ENODATA || r == -ECONNREFUSED || r == -ENOENT || r == -EPIPE ||
	       r == -ENOTCONN;
}

/* Follows regend across its restarts, as --wait does: when the Watch ends
 * with regend (SIGTERM's io.regen.Draining, a closed connection), it says
 * so on stderr and subscribes again once regend is back; the new
 * subscription's first events say where every device stands then. */
static int cmd_watch(regen_client *c, const struct command *cmd, const struct opts *o)
{
	double deadline = o->timeout_set ? now_s() + o->timeout : 0;
	struct watch_state ws = { .o = o };
	const struct regen_watch_event *ev;
	regen_watcher *w = NULL;
	bool away = false;
	int r;

	if ((o->given & OPT_COUNT) && o->count == 0) {
		return EXIT_OK;
	}
	for (;;) {
		if (w == NULL) {
			r = regen_watcher_open(c, &w);
			if (r == 0 && away) {
				fprintf(stderr, "regenctl: watch: regend is back; watching again\n");
				away = false;
			}
		}
		if (w != NULL) {
			r = regen_watcher_next(w, deadline > 0 ? wait_left(deadline) : 0, &ev);
		}
		if (r == 0) {
			if (on_event(ev, &ws)) {
				break;
			}
			continue;
		}
		if (r != -ETIMEDOUT && regend_gone(c, r)) {
			regen_watcher_close(w);
			w = NULL;
			if (!away) {
				fprintf(stderr, "regenctl: watch: regend went away (%s); watching again when it is back\n",
					regen_client_error_message(c) ? regen_client_error_message(c) : strerror(-r));
				away = true;
			}
			if (deadline > 0 && now_s() >= deadline) {
				r = -ETIMEDOUT;
			} else {
				usleep(100000);
				continue;
			}
		}
		regen_watcher_close(w);
		if (r == -ETIMEDOUT && !(o->given & OPT_COUNT)) {
			return EXIT_OK;
		}
		if (r == -ETIMEDOUT) {
			fprintf(stderr, "regenctl: watch: %ld of %ld transition(s) within %.1f s\n", ws.changes, o->count,
				o->timeout);
			return EXIT_TIMEOUT;
		}
		return fail(c, cmd->name, r);
	}
	regen_watcher_close(w);
	return EXIT_OK;
}

/* ---- Kept state ---- */

/* Seconds until a lease ends, from its end in Unix milliseconds. */
static double seconds_left(int64_t end_unix_ms)
{
	struct timespec ts;

	clock_gettime(CLOCK_REALTIME, &ts);
	return ((double)end_unix_ms - ((double)ts.tv_sec * 1e3 + (double)ts.tv_nsec * 1e-6)) / 1e3;
}

static int cmd_kept(regen_client *c, const struct command *cmd, const struct opts *o)
{
	enum { NCOL = 10 };
	static const char *const head[NCOL] = {
		"JOB", "RANK", "NAME", "UID", "KIND", "DEVICE", "BYTES", "STEP", "HELD_BY", "LEASE_LEFT",
	};
	regen_kept_list *list = NULL;
	char (*cells)[NCOL][128];
	int width[NCOL] = { 0 };
	size_t i, n;
	int j, r;

	if (o->json) {
		cJSON *p = cJSON_CreateObject();
		char *params, *reply = NULL;

		if (o->kept_job != NULL)
			cJSON_AddStringToObject(p, "job", o->kept_job);
		params = cJSON_PrintUnformatted(p);
		cJSON_Delete(p);
		r = regen_call(c, -1, RP_KEEP_LIST, params, NULL, 0, &reply);
		free(params);
		if (r < 0)
			return fail(c, cmd->name, r);
		print_line(reply);
		return EXIT_OK;
	}
	r = regen_keep_list(c, o->kept_job, &list);
	if (r < 0)
		return fail(c, cmd->name, r);
	n = regen_kept_list_count(list);
	cells = calloc(n + 1, sizeof(*cells));
	if (cells == NULL) {
		regen_kept_list_free(list);
		return EXIT_ERROR;
	}
	for (j = 0; j < NCOL; j++)
		snprintf(cells[0][j], sizeof(cells[0][j]), "%s", head[j]);
	for (i = 0; i < n; i++) {
		const struct regen_kept *k = regen_kept_list_get(list, i);
		char (*row)[128] = cells[i + 1];

		snprintf(row[0], 128, "%s", shown(k->job));
		snprintf(row[1], 128, "%u", k->rank);
		snprintf(row[2], 128, "%s", shown(k->name));
		snprintf(row[3], 128, "%u", k->uid);
		snprintf(row[4], 128, "%s", k->kind == REGEN_MEMORY_CUDA_FD ? "cuda_fd" : "host_fd");
		if (k->device >= 0)
			snprintf(row[5], 128, "%d", k->device);
		else
			snprintf(row[5], 128, "-");
		snprintf(row[6], 128, "%llu", (unsigned long long)k->bytes);
		if (k->has_step)
			snprintf(row[7], 128, "%llu", (unsigned long long)k->step);
		else
			snprintf(row[7], 128, "-");
		/* Held: by which process ("held" where its pid is not seen);
		 * else how long its lease has left. */
		if (k->held && k->holder_pid > 0)
			snprintf(row[8], 128, "pid %lld", (long long)k->holder_pid);
		else
			snprintf(row[8], 128, "%s", k->held ? "held" : "-");
		if (k->held || k->expires_unix_ms < 0)
			snprintf(row[9], 128, "-");
		else
			snprintf(row[9], 128, "%.1fs", fmax(seconds_left(k->expires_unix_ms), 0.0));
	}
	for (j = 0; j < NCOL; j++)
		for (i = 0; i <= n; i++)
			if ((int)strlen(cells[i][j]) > width[j])
				width[j] = (int)strlen(cells[i][j]);
	for (i = 0; i <= n; i++)
		for (j = 0; j < NCOL; j++)
			printf("%-*s%s", j == NCOL - 1 ? 0 : width[j], cells[i][j], j == NCOL - 1 ? "\n" : "  ");
	free(cells);
	regen_kept_list_free(list);
	return EXIT_OK;
}

static int cmd_drop(regen_client *c, const struct command *cmd, const struct opts *o)
{
	cJSON *p = cJSON_CreateObject(), *rep;
	char *params, *reply = NULL;
	int r;

	cJSON_AddStringToObject(p, "job", o->kept_job);
	if (o->kept_rank >= 0)
		cJSON_AddNumberToObject(p, "rank", (double)o->kept_rank);
	if (o->kept_name != NULL)
		cJSON_AddStringToObject(p, "name", o->kept_name);
	if (o->uid >= 0)
		cJSON_AddNumberToObject(p, "uid", (double)o->uid);
	params = cJSON_PrintUnformatted(p);
	cJSON_Delete(p);
	r = regen_call(c, -1, RP_KEEP_DROP, params, NULL, 0, &reply);
	free(params);
	if (r < 0)
		return fail(c, cmd->name, r);
	if (o->json) {
		print_line(reply);
		return EXIT_OK;
	}
	rep = cJSON_Parse(reply);
	free(reply);
	printf("dropped %.0f name(s), %.0f bytes\n", cJSON_GetNumberValue(cJSON_GetObjectItem(rep, "names")),
	       cJSON_GetNumberValue(cJSON_GetObjectItem(rep, "bytes")));
	cJSON_Delete(rep);
	return EXIT_OK;
}

static int cmd_inject_fault(regen_client *c, const struct command *cmd, const struct opts *o)
{
	int device = o->device < 0 ? 0 : o->device;
	bool xid = strcmp(o->kind, "xid") == 0;
	char params[96], *reply = NULL;
	int r;

	/* libregen's regen_inject_fault has no XID: the call itself. */
	if (xid) {
		snprintf(params, sizeof(params), "{\"device\":%d,\"kind\":\"xid\",\"xid\":%ld}", device, o->xid);
		r = regen_call(c, -1, "io.regen.Device.InjectFault", params, NULL, 0, &reply);
		free(reply);
	} else {
		r = regen_inject_fault(c, device, o->kind);
	}
	if (r < 0) {
		return fail(c, cmd->name, r);
	}
	if (o->json && xid) {
		printf("{\"device\":%d,\"kind\":\"xid\",\"xid\":%ld}\n", device, o->xid);
	} else if (o->json) {
		printf("{\"device\":%d,\"kind\":\"%s\"}\n", device, o->kind);
	} else if (xid) {
		printf("device %d: injected XID %ld\n", device, o->xid);
	} else {
		printf("device %d: injected %s\n", device, o->kind);
	}
	return EXIT_OK;
}

/* What a device's state and health say about the node, as health's exit
 * status: 0 ready, else the verdict. */
static int device_verdict(const struct regen_device_info *d)
{
	const char *s = d->state;

	if (strcmp(s, "unsupported") == 0) {
		return EXIT_UNSUPPORTED;
	}
	if (strcmp(s, "failed") == 0 || (REGEN_HAS_FIELD(d, remap_failed) && d->has_health && d->remap_failed == 1)) {
		return EXIT_FAILED;
	}
	if (strcmp(s, "faulted") == 0 || strcmp(s, "unresponsive") == 0) {
		return EXIT_FAULTED;
	}
	if (strcmp(s, "ready") != 0 || (REGEN_HAS_FIELD(d, remap_failed) && d->has_health &&
					 (d->retired_pages_pending == 1 || d->remap_pending == 1))) {
		return EXIT_DEGRADED;
	}
	return EXIT_OK;
}

static const char *verdict_name(int v)
{
	switch (v) {
	case EXIT_OK:
		return "ok";
	case EXIT_DEGRADED:
		return "degraded";
	case EXIT_FAULTED:
		return "faulted";
	case EXIT_FAILED:
		return "failed";
	case EXIT_UNSUPPORTED:
		return "unsupported";
	}
	return "unreachable";
}

/* For a Slurm HealthCheckProgram or a Kubernetes exec probe: the exit
 * status alone says it, no jq needed; a line per device says why. */
static int cmd_health(regen_client *c, const struct command *cmd, const struct opts *o)
{
	regen_status *st = NULL;
	cJSON *out, *arr, *e;
	int i, v, worst = EXIT_OK, r;

	r = regen_generation_get(c, &st);
	if (r < 0) {
		int rc = fail(c, cmd->name, r);

		if (o->json) {
			printf("{\"health\":\"unreachable\"}\n");
		}
		return rc;
	}
	out = cJSON_CreateObject();
	arr = cJSON_CreateArray();
	for (i = 0; i < regen_status_device_count(st); i++) {
		const struct regen_device_info *d = regen_status_device(st, i);

		v = device_verdict(d);
		/* EXIT_* of the verdicts grow with how bad they are. */
		if (v > worst) {
			worst = v;
		}
		if (o->json) {
			e = cJSON_CreateObject();
			cJSON_AddNumberToObject(e, "index", d->index);
			cJSON_AddStringToObject(e, "state", d->state);
			cJSON_AddStringToObject(e, "health", verdict_name(v));
			cJSON_AddStringToObject(e, "reason", d->reason);
			cJSON_AddItemToArray(arr, e);
		} else {
			printf("device %d: %s (%s, generation %llu%s%s)\n", d->index, verdict_name(v), shown(d->state),
			       (unsigned long long)d->generation, v != EXIT_OK && d->reason[0] ? ": " : "",
			       v != EXIT_OK ? shown(d->reason) : "");
		}
	}
	if (o->json) {
		cJSON_AddStringToObject(out, "health", verdict_name(worst));
		cJSON_AddItemToObject(out, "devices", arr);
		print_json(out);
	} else {
		cJSON_Delete(arr);
		printf("%s\n", verdict_name(worst));
	}
	cJSON_Delete(out);
	regen_status_free(st);
	return worst;
}

/* regend did not answer: the scrape (or the textfile written from it)
 * still parses, and says so. */
static void print_regen_down(void)
{
	printf("# HELP regen_up 1: regend answered io.regen.Device.Status.\n# TYPE regen_up gauge\nregen_up 0\n");
	fflush(stdout);
}

static int cmd_metrics(regen_client *c, const struct command *cmd, const struct opts *o)
{
	char *reply = NULL;
	cJSON *status;
	int r;

	(void)o;
	r = regen_call(c, -1, "io.regen.Device.Status", NULL, NULL, 0, &reply);
	if (r < 0) {
		print_regen_down();
		return fail(c, cmd->name, r);
	}
	status = cJSON_Parse(reply);
	free(reply);
	if (!cJSON_IsObject(status)) {
		cJSON_Delete(status);
		print_regen_down();
		fprintf(stderr, "regenctl: metrics: regend's reply is not a JSON object\n");
		return EXIT_ERROR;
	}
	ctl_metrics_write(stdout, status, metrics_hostname());
	fflush(stdout);
	cJSON_Delete(status);
	return EXIT_OK;
}

/* The socket regenctl talks to: --socket, else $REGEN_SOCKET, else the
 * default (as libregen picks it). */
static const char *socket_path(const struct opts *o)
{
	const char *path = o->socket;

	if (path == NULL || path[0] == '\0') {
		path = getenv("REGEN_SOCKET");
	}
	if (path == NULL || path[0] == '\0') {
		path = REGEN_DEFAULT_SOCKET;
	}
	return path;
}

static int cmd_call(const struct opts *o)
{
	char name[128];
	int r;

	r = ctl_call(socket_path(o), o->method, o->params, (o->given & OPT_MORE) != 0,
		     o->timeout_set ? o->timeout : ((o->given & OPT_MORE) ? 0 : DEFAULT_TIMEOUT_S), name, sizeof(name));
	if (r == -ETIMEDOUT) {
		fprintf(stderr, "regenctl: call: %s: no reply within %.1f s\n", o->method,
			o->timeout_set ? o->timeout : DEFAULT_TIMEOUT_S);
	} else if (r == -ECONNRESET) {
		fprintf(stderr, "regenctl: call: %s: regend closed the connection before it answered\n", o->method);
	} else if (r < 0 && r != -EREMOTE) {
		fprintf(stderr, "regenctl: call: cannot reach regend at %s: %s\n", socket_path(o), strerror(-r));
	}
	if (r == -EREMOTE) {
		if (strcmp(name, REGEN_ERROR_NOT_PERMITTED) == 0 || strcmp(name, REGEN_ERROR_PERMISSION_DENIED) == 0) {
			return EXIT_NOT_PERMITTED;
		}
		return strcmp(name, REGEN_ERROR_TIMEOUT) == 0 ? EXIT_TIMEOUT : EXIT_ERROR;
	}
	return r < 0 ? exit_code(r, NULL) : EXIT_OK;
}

static bool parse_long(const char *s, long min, long *out)
{
	char *end;
	long v;

	errno = 0;
	v = strtol(s, &end, 10);
	if (errno != 0 || end == s || *end != '\0' || v < min) {
		return false;
	}
	*out = v;
	return true;
}

/* --device LIST, --job or --all, as device indices. */
static int resolve_targets(regen_client *c, const struct command *cmd, struct opts *o)
{
	char msg[256] = "";
	int r = 0;

	if (o->given & OPT_ALL) {
		o->targets.all = true;
		return EXIT_OK;
	}
	if (o->given & OPT_JOB) {
		r = ctl_targets_from_job(c, &o->targets, msg, sizeof(msg));
	} else {
		r = ctl_targets_from_list(c, o->device_list, &o->targets, msg, sizeof(msg));
	}
	if (r == -EINVAL || r == -ENODEV) {
		fprintf(stderr, "regenctl: %s: %s%s%s\n", cmd->name, msg, o->targets.from[0] ? " in " : "", o->targets.from);
		return r == -EINVAL ? EXIT_USAGE : EXIT_ERROR;
	}
	if (r < 0) {
		return fail(c, cmd->name, r);
	}
	if ((o->given & OPT_JOB) && (o->targets.all || o->targets.count) && !o->json) {
		fprintf(stderr, "regenctl: %s: the job's GPUs from %s\n", cmd->name, o->targets.from);
	}
	return EXIT_OK;
}

static const struct command *find_command(const char *name)
{
	for (size_t i = 0; i < NCOMMANDS; i++) {
		if (strcmp(commands[i].name, name) == 0) {
			return &commands[i];
		}
	}
	return NULL;
}

static bool known_fault(const char *kind)
{
	for (int i = 0; fault_kinds[i] != NULL; i++) {
		if (strcmp(fault_kinds[i], kind) == 0) {
			return true;
		}
	}
	return false;
}

/* The option values that getopt does not check. */
static int parse_option(int opt, const char *arg, struct opts *o)
{
	long v;

	switch (opt) {
	case OPT_DEVICE:
		/* A list for the lifecycle commands (checked with the command),
		 * one index for the others. */
		o->device_list = arg;
		if (parse_long(arg, 0, &v) && v < REGEN_DEVICES_MAX) {
			o->device = (int)v;
		}
		break;
	case OPT_REASON:
		o->reason = arg;
		break;
	case OPT_DEADLINE:
		if (!parse_long(arg, 1, &o->deadline_ms) || o->deadline_ms > INT32_MAX) {
			return usage_error("--deadline-ms: not a positive number: '%s'", arg);
		}
		break;
	case OPT_COUNT:
		if (!parse_long(arg, 0, &o->count)) {
			return usage_error("--count: not a count: '%s'", arg);
		}
		break;
	case OPT_KIND:
		o->kind = arg;
		break;
	case OPT_UID:
		if (!parse_long(arg, 0, &o->uid) || o->uid >= UINT32_MAX) {
			return usage_error("--uid: not a uid: '%s'", arg);
		}
		break;
	}
	o->given |= (unsigned)opt;
	return EXIT_OK;
}

/* Checks the command line against the command's entry. */
static int check_command(const struct command *cmd, struct opts *o, const char *const *positional, int npos)
{
	unsigned extra = o->given & ~cmd->options;

	/* call's METHOD and JSON. */
	if (cmd->run == NULL) {
		if (npos < 1 || npos > 2) {
			return usage_error("call: METHOD [JSON], e.g. call io.regen.Device.Status '{}'");
		}
		if (strchr(positional[0], '.') == NULL) {
			return usage_error("call: '%s' is no method name (interface.Method)", positional[0]);
		}
		if (npos == 2) {
			cJSON *p = cJSON_Parse(positional[1]);
			bool object = cJSON_IsObject(p);

			cJSON_Delete(p);
			if (!object) {
				return usage_error("call: the parameters are no JSON object: '%s'", positional[1]);
			}
		}
		o->method = positional[0];
		o->params = npos == 2 ? positional[1] : NULL;
		npos = 0;
	}
	/* inject-fault's KIND may come as its argument, and xid's number
	 * after it. */
	if ((cmd->options & OPT_KIND) && npos >= 1 && o->kind == NULL) {
		o->kind = positional[0];
		positional++;
		npos--;
	}
	if ((cmd->options & OPT_KIND) && o->kind != NULL && strcmp(o->kind, "xid") == 0) {
		if (npos == 0) {
			return usage_error("%s xid: which XID? e.g. 'regenctl inject-fault xid 79'", cmd->name);
		}
		if (!parse_long(positional[0], 1, &o->xid) || o->xid > XID_MAX) {
			return usage_error("%s xid: not an XID (1 to %d): '%s'", cmd->name, XID_MAX, positional[0]);
		}
		positional++;
		npos--;
	}
	/* kept's JOB; drop's JOB [RANK [NAME]]. */
	if (cmd->run == cmd_kept || cmd->run == cmd_drop) {
		struct rp_error err = { 0 };
		int most = cmd->run == cmd_kept ? 1 : 3;

		if (cmd->run == cmd_drop && npos == 0) {
			return usage_error("drop: which job? 'regenctl drop JOB [RANK [NAME]]' (kept lists them)");
		}
		if (npos > most) {
			return usage_error("unexpected argument '%s'", positional[most]);
		}
		if (npos >= 1 && rp_job_check(positional[0], &err) < 0) {
			rp_error_clear(&err);
			return usage_error("%s: not a job: '%s' (1-64 of A-Z a-z 0-9 . _ - : / @ + =)", cmd->name,
					   positional[0]);
		}
		if (npos >= 2 && (!parse_long(positional[1], 0, &o->kept_rank) || o->kept_rank > RP_KEPT_RANK_MAX)) {
			return usage_error("%s: not a rank: '%s'", cmd->name, positional[1]);
		}
		if (npos >= 3 && rp_kept_name_check(positional[2], &err) < 0) {
			rp_error_clear(&err);
			return usage_error("%s: not a kept name: '%s' (1-64 of A-Z a-z 0-9 _ . : -)", cmd->name,
					   positional[2]);
		}
		o->kept_job = npos >= 1 ? positional[0] : NULL;
		o->kept_name = npos >= 3 ? positional[2] : NULL;
		npos = 0;
	}
	if (npos > 0) {
		return usage_error("unexpected argument '%s'", positional[0]);
	}
	if (extra != 0) {
		return usage_error("%s takes no %s", cmd->name, option_name(extra & -extra));
	}
	if (__builtin_popcount(o->given & (OPT_DEVICE | OPT_ALL | OPT_JOB)) > 1) {
		return usage_error("%s: --device, --job and --all exclude each other", cmd->name);
	}
	if (cmd->verb != VERB_NONE) {
		char msg[256];

		if (!(o->given & (OPT_DEVICE | OPT_ALL | OPT_JOB))) {
			return usage_error("%s: which devices? --device LIST, --job, or --all for every device of the node",
					   cmd->name);
		}
		if ((o->given & OPT_DEVICE) && ctl_targets_check(o->device_list, msg, sizeof(msg)) < 0) {
			return usage_error("%s", msg);
		}
	} else if ((o->given & OPT_DEVICE) && o->device < 0) {
		return usage_error("--device: not a device index: '%s'", o->device_list);
	}
	if (cmd->options & OPT_KIND) {
		if (o->kind == NULL) {
			return usage_error("%s: which fault? crash, device_lost, hang or xid N", cmd->name);
		}
		if (!known_fault(o->kind)) {
			return usage_error("%s: unknown kind '%s' (crash, device_lost, hang, xid N)", cmd->name, o->kind);
		}
	}
	return EXIT_OK;
}

int main(int argc, char **argv)
{
	/* Above every OPT_*. */
	enum { LONG_SOCKET = 1 << 16, LONG_JSON, LONG_TIMEOUT, LONG_VERSION, LONG_AS_JOB };
	static const struct option longopts[] = {
		{ "socket", required_argument, NULL, LONG_SOCKET },
		{ "as-job", required_argument, NULL, LONG_AS_JOB },
		{ "json", no_argument, NULL, LONG_JSON },
		{ "timeout", required_argument, NULL, LONG_TIMEOUT },
		{ "device", required_argument, NULL, OPT_DEVICE },
		{ "all", no_argument, NULL, OPT_ALL },
		{ "reason", required_argument, NULL, OPT_REASON },
		{ "wait", no_argument, NULL, OPT_WAIT },
		{ "deadline-ms", required_argument, NULL, OPT_DEADLINE },
		{ "count", required_argument, NULL, OPT_COUNT },
		{ "kind", required_argument, NULL, OPT_KIND },
		{ "job", no_argument, NULL, OPT_JOB },
		{ "more", no_argument, NULL, OPT_MORE },
		{ "uid", required_argument, NULL, OPT_UID },
		{ "version", no_argument, NULL, LONG_VERSION },
		{ "help", no_argument, NULL, 'h' },
		{ NULL, 0, NULL, 0 },
	};
	struct opts o = { .device = -1, .kept_rank = -1, .uid = -1 };
	const struct command *cmd;
	const char *positional[4];
	int npos = 0, opt, r, rc;
	regen_client *c = NULL;
	const char *as_job = NULL, *job;
	struct rp_error jerr = { 0 };
	char *end;

	opterr = 0;
	while ((opt = getopt_long(argc, argv, ":h", longopts, NULL)) != -1) {
		switch (opt) {
		case LONG_SOCKET:
			o.socket = optarg;
			break;
		case LONG_JSON:
			o.json = true;
			break;
		case LONG_AS_JOB:
			as_job = optarg;
			break;
		case LONG_TIMEOUT:
			errno = 0;
			o.timeout = strtod(optarg, &end);
			if (errno != 0 || end == optarg || *end != '\0' || !(o.timeout > 0) || !isfinite(o.timeout)) {
				return usage_error("--timeout: not a positive number of seconds: '%s'", optarg);
			}
			o.timeout_set = true;
			break;
		case 'h':
			usage(stdout);
			return EXIT_OK;
		case LONG_VERSION:
			printf("regenctl %s\n", REGEN_VERSION);
			return EXIT_OK;
		case ':':
			return usage_error("option '%s' needs an argument", argv[optind - 1]);
		case '?':
			return usage_error("unknown option '%s'", argv[optind - 1]);
		default:
			rc = parse_option(opt, optarg, &o);
			if (rc != EXIT_OK) {
				return rc;
			}
		}
	}
	while (optind < argc) {
		if (npos == (int)(sizeof(positional) / sizeof(positional[0]))) {
			return usage_error("too many arguments ('%s')", argv[optind]);
		}
		positional[npos++] = argv[optind++];
	}
	if (npos == 0) {
		usage(stderr);
		return EXIT_USAGE;
	}
	cmd = find_command(positional[0]);
	if (cmd == NULL) {
		return usage_error("unknown command '%s'", positional[0]);
	}
	o.command = cmd->name;
	rc = check_command(cmd, &o, positional + 1, npos - 1);
	if (rc != EXIT_OK) {
		return rc;
	}
	if (cmd->run == NULL) {
		return cmd_call(&o);
	}
	/* libregen states $REGEN_JOB on every connection (and refuses to
	 * connect with one regend would refuse): --as-job goes there too, and
	 * either is checked here, where a bad one can be named. */
	if (as_job != NULL && setenv("REGEN_JOB", as_job, 1) < 0) {
		return usage_error("--as-job: %s", strerror(errno));
	}
	job = getenv("REGEN_JOB");
	if (job != NULL && job[0] != '\0' && rp_job_check(job, &jerr) < 0) {
		rc = usage_error("%s: %s", as_job != NULL ? "--as-job" : "REGEN_JOB",
				 cJSON_GetStringValue(cJSON_GetObjectItem(jerr.params, "message")));
		rp_error_clear(&jerr);
		return rc;
	}

	r = regen_client_connect(o.socket, &c);
	if (r < 0) {
		const char *path = o.socket;

		if (path == NULL) {
			path = getenv("REGEN_SOCKET");
		}
		if (path == NULL || path[0] == '\0') {
			path = REGEN_DEFAULT_SOCKET;
		}
		fprintf(stderr, "regenctl: cannot reach regend at %s: %s\n", path, strerror(-r));
		if (cmd->run == cmd_metrics) {
			print_regen_down();
		} else if (cmd->run == cmd_health && o.json) {
			printf("{\"health\":\"unreachable\"}\n");
		}
		return exit_code(r, NULL);
	}
	/* watch's --timeout bounds the whole watch, not each call. */
	if (o.timeout_set && cmd->run != cmd_watch) {
		regen_client_set_timeout(c, o.timeout);
	}
	if (cmd->verb != VERB_NONE) {
		rc = resolve_targets(c, cmd, &o);
		if (rc != EXIT_OK) {
			regen_client_destroy(c);
			return rc;
		}
	}
	rc = cmd->run(c, cmd, &o);
	regen_client_destroy(c);
	return rc;
}
