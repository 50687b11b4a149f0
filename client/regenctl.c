/* regenctl: look at and steer regend from a shell or a scheduler. */
#include <errno.h>
#include <getopt.h>
#include <math.h>
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

enum {
	EXIT_OK = 0,
	EXIT_ERROR = 1,
	EXIT_USAGE = 2,
	EXIT_TIMEOUT = 3,
	EXIT_NOT_PERMITTED = 4,
	EXIT_UNREACHABLE = 5,
};

struct opts {
	const char *socket;
	bool json;
	int device;              /* -1: all */
	bool device_set, all;
	const char *reason;
	bool wait;
	double timeout;          /* seconds; 0 = default */
	bool timeout_set;
	long deadline_ms;
	bool deadline_set;
	long count;
	bool count_set;
	const char *kind;
	const char *verb;
};

static void usage(FILE *f)
{
	fprintf(f,
		"Usage: regenctl [--socket PATH] [--json] COMMAND [OPTIONS]\n"
		"\n"
		"Commands:\n"
		"  status                    every device: generation, state, backend, worker\n"
		"  generation                the node epoch and each device's generation\n"
		"  release [TARGET] [--reason TEXT] [--wait] [--timeout S]\n"
		"                            drain and release: CUDA resources destroyed, memory returned\n"
		"  reset   [TARGET] [--reason TEXT] [--wait] [--timeout S]\n"
		"                            throw the context away and rebuild\n"
		"  restart [TARGET] [--reason TEXT] [--deadline-ms MS] [--wait] [--timeout S]\n"
		"                            drain (until the deadline), release or reset, new generation\n"
		"  watch [--count N] [--timeout S]\n"
		"                            print the current state, then one line per generation change\n"
		"  inject-fault [--device N] KIND\n"
		"                            KIND: crash, device_lost, hang (needs --enable-fault-injection)\n"
		"\n"
		"TARGET: --device N, or --all (the default).\n"
		"\n"
		"Options:\n"
		"  --socket PATH   regend's socket (default $REGEN_SOCKET, else %s)\n"
		"  --json          machine-readable output: one JSON object per line\n"
		"  --wait          after the command, wait until every targeted device is ready\n"
		"                  in a newer generation; print the generation(s) and the time taken\n"
		"  --timeout S     give up after S seconds (default 60; watch: no limit)\n"
		"  --count N       watch: exit after N generation changes\n"
		"  -h, --help      this text\n"
		"\n"
		"Exit status:\n"
		"  0  success\n"
		"  1  error: regend answered with an error, or another failure\n"
		"  2  usage error\n"
		"  3  timeout: --timeout passed (or regend's io.regen.Timeout)\n"
		"  4  not permitted: io.regen.NotPermitted (admin commands need root or the admin\n"
		"     group), or no permission to open the socket\n"
		"  5  regend unreachable: no socket, connection refused, or the connection broke\n",
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
		if (strcmp(name, "io.regen.NotPermitted") == 0 ||
		    strcmp(name, "org.varlink.service.PermissionDenied") == 0) {
			return EXIT_NOT_PERMITTED;
		}
		if (strcmp(name, "io.regen.Timeout") == 0) {
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

/* Reports a failed call on stderr and picks the exit status. */
static int fail(regen_client *c, const char *what, int r)
{
	const char *name = regen_client_error_name(c);
	const char *msg = regen_client_error_message(c);

	if (r == -EREMOTE && name != NULL) {
		fprintf(stderr, "regenctl: %s: %s%s%s\n", what, name, msg ? ": " : "", msg ? msg : "");
	} else {
		fprintf(stderr, "regenctl: %s: %s%s%s\n", what, strerror(-r), msg ? " (" : "", msg ? msg : "");
		if (msg) {
			fputs(")\n", stderr);
		}
	}
	return exit_code(r, name);
}

static int64_t jint(const cJSON *o, const char *key)
{
	const cJSON *it = cJSON_GetObjectItemCaseSensitive(o, key);

	return cJSON_IsNumber(it) ? (int64_t)it->valuedouble : 0;
}

static const char *jstr(const cJSON *o, const char *key)
{
	const cJSON *it = cJSON_GetObjectItemCaseSensitive(o, key);

	return cJSON_IsString(it) ? it->valuestring : "";
}

/* Calls a main-socket method and returns its reply parsed. */
static int call_json(regen_client *c, const char *method, const cJSON *params, cJSON **out)
{
	char *ptext = NULL, *reply = NULL;
	int r;

	*out = NULL;
	if (params != NULL) {
		ptext = cJSON_PrintUnformatted(params);
		if (ptext == NULL) {
			return -ENOMEM;
		}
	}
	r = regen_call(c, -1, method, ptext, NULL, 0, &reply);
	free(ptext);
	if (r < 0) {
		return r;
	}
	*out = cJSON_Parse(reply);
	free(reply);
	return *out != NULL ? 0 : -EPROTO;
}

static void print_json(const cJSON *o)
{
	char *text = cJSON_PrintUnformatted(o);

	if (text != NULL) {
		puts(text);
		free(text);
	}
	fflush(stdout);
}

static int cmd_status(regen_client *c, const struct opts *o)
{
	enum { NCOL = 9 };
	static const char *const head[NCOL] = {
		"DEVICE", "GEN", "STATE", "BACKEND", "PID", "RESPAWNS", "MEM_USED", "MEM_BASE", "WORKER_SOCKET",
	};
	struct regen_status *st;
	char (*cells)[NCOL][128];
	int width[NCOL];
	int i, j, r;
	cJSON *reply;

	if (o->json) {
		r = call_json(c, "io.regen.Device.Status", NULL, &reply);
		if (r < 0) {
			return fail(c, "status", r);
		}
		print_json(reply);
		cJSON_Delete(reply);
		return EXIT_OK;
	}
	st = calloc(1, sizeof(*st));
	if (st == NULL) {
		return EXIT_ERROR;
	}
	r = regen_status(c, st);
	if (r < 0) {
		free(st);
		return fail(c, "status", r);
	}
	cells = calloc((size_t)st->ndevices + 1, sizeof(*cells));
	if (cells == NULL) {
		free(st);
		return EXIT_ERROR;
	}
	for (j = 0; j < NCOL; j++) {
		snprintf(cells[0][j], sizeof(cells[0][j]), "%s", head[j]);
	}
	for (i = 0; i < st->ndevices; i++) {
		const struct regen_device_info *d = &st->devices[i];
		char (*row)[128] = cells[i + 1];

		snprintf(row[0], 128, "%d", d->index);
		snprintf(row[1], 128, "%llu", (unsigned long long)d->generation);
		snprintf(row[2], 128, "%s", d->state[0] ? d->state : "-");
		snprintf(row[3], 128, "%s", d->backend[0] ? d->backend : "-");
		snprintf(row[4], 128, "%lld", (long long)d->worker_pid);
		snprintf(row[5], 128, "%llu", (unsigned long long)d->respawns);
		snprintf(row[6], 128, "%llu", (unsigned long long)d->memory_used);
		snprintf(row[7], 128, "%llu", (unsigned long long)d->memory_baseline);
		snprintf(row[8], 128, "%s", d->worker_socket[0] ? d->worker_socket : "-");
	}
	for (j = 0; j < NCOL; j++) {
		width[j] = 0;
		for (i = 0; i <= st->ndevices; i++) {
			int len = (int)strlen(cells[i][j]);

			if (len > width[j]) {
				width[j] = len;
			}
		}
	}
	for (i = 0; i <= st->ndevices; i++) {
		for (j = 0; j < NCOL; j++) {
			if (j == NCOL - 1) {
				printf("%s\n", cells[i][j]);
			} else {
				printf("%-*s  ", width[j], cells[i][j]);
			}
		}
	}
	free(cells);
	free(st);
	return EXIT_OK;
}

static int cmd_generation(regen_client *c, const struct opts *o)
{
	const cJSON *d;
	cJSON *reply;
	int r;

	r = call_json(c, "io.regen.Device.Generation", NULL, &reply);
	if (r < 0) {
		return fail(c, "generation", r);
	}
	if (o->json) {
		print_json(reply);
	} else {
		printf("EPOCH %lld\n", (long long)jint(reply, "epoch"));
		printf("%-6s  %-10s  %s\n", "DEVICE", "GEN", "STATE");
		cJSON_ArrayForEach(d, cJSON_GetObjectItemCaseSensitive(reply, "devices")) {
			printf("%-6lld  %-10lld  %s\n", (long long)jint(d, "index"),
			       (long long)jint(d, "generation"), jstr(d, "state"));
		}
	}
	cJSON_Delete(reply);
	return EXIT_OK;
}

static bool targeted(const struct opts *o, int64_t index)
{
	return o->device < 0 || index == o->device;
}

/* Polls Generation until every targeted device is ready in a generation
 * newer than in `before`. */
static int wait_ready(regen_client *c, const struct opts *o, const cJSON *before, double start, double deadline)
{
	const cJSON *d, *b;
	cJSON *now = NULL, *out = NULL, *arr;
	bool done;
	int r, found;

	for (;;) {
		r = call_json(c, "io.regen.Device.Generation", NULL, &now);
		/* The connection may break while regend restarts a worker:
		 * the next call reconnects. */
		if (r < 0 && r != -ECONNRESET) {
			return fail(c, "wait", r);
		}
		if (r == 0) {
			done = true;
			found = 0;
			cJSON_ArrayForEach(d, cJSON_GetObjectItemCaseSensitive(now, "devices")) {
				int64_t idx = jint(d, "index"), gen_before = 0;

				if (!targeted(o, idx)) {
					continue;
				}
				found++;
				cJSON_ArrayForEach(b, cJSON_GetObjectItemCaseSensitive(before, "devices")) {
					if (jint(b, "index") == idx) {
						gen_before = jint(b, "generation");
					}
				}
				if (strcmp(jstr(d, "state"), "ready") != 0 || jint(d, "generation") <= gen_before) {
					done = false;
				}
			}
			if (found == 0) {
				fprintf(stderr, "regenctl: wait: regend serves no device %d\n", o->device);
				cJSON_Delete(now);
				return EXIT_ERROR;
			}
			if (done) {
				break;
			}
			cJSON_Delete(now);
			now = NULL;
		}
		if (now_s() >= deadline) {
			fprintf(stderr, "regenctl: wait: the device(s) were not ready in a new generation after %.1f s\n",
				now_s() - start);
			return EXIT_TIMEOUT;
		}
		usleep(20000);
	}
	if (o->json) {
		out = cJSON_CreateObject();
		arr = cJSON_AddArrayToObject(out, "devices");
		cJSON_AddNumberToObject(out, "epoch", (double)jint(now, "epoch"));
		cJSON_ArrayForEach(d, cJSON_GetObjectItemCaseSensitive(now, "devices")) {
			cJSON *e;

			if (!targeted(o, jint(d, "index"))) {
				continue;
			}
			e = cJSON_CreateObject();
			cJSON_AddNumberToObject(e, "index", (double)jint(d, "index"));
			cJSON_AddNumberToObject(e, "generation", (double)jint(d, "generation"));
			cJSON_AddStringToObject(e, "state", jstr(d, "state"));
			cJSON_AddItemToArray(arr, e);
		}
		cJSON_AddNumberToObject(out, "elapsed_ms", floor((now_s() - start) * 1000.0));
		cJSON_AddBoolToObject(out, "ready", 1);
		print_json(out);
		cJSON_Delete(out);
	} else {
		cJSON_ArrayForEach(d, cJSON_GetObjectItemCaseSensitive(now, "devices")) {
			if (targeted(o, jint(d, "index"))) {
				printf("device %lld: ready in generation %lld\n", (long long)jint(d, "index"),
				       (long long)jint(d, "generation"));
			}
		}
		printf("elapsed %.3f s\n", now_s() - start);
		fflush(stdout);
	}
	cJSON_Delete(now);
	return EXIT_OK;
}

static int cmd_lifecycle(regen_client *c, const struct opts *o, const char *method)
{
	double timeout = o->timeout_set ? o->timeout : 60.0;
	double start = now_s(), deadline = start + timeout;
	cJSON *params = NULL, *before = NULL, *reply = NULL;
	const cJSON *d;
	int r, rc = EXIT_ERROR;

	params = cJSON_CreateObject();
	if (params == NULL) {
		goto out;
	}
	if (o->device >= 0) {
		cJSON_AddNumberToObject(params, "device", o->device);
	}
	if (o->reason != NULL) {
		cJSON_AddStringToObject(params, "reason", o->reason);
	}
	if (o->deadline_set) {
		cJSON_AddNumberToObject(params, "deadline_ms", (double)o->deadline_ms);
	}
	regen_client_set_timeout(c, timeout);
	if (o->wait) {
		r = call_json(c, "io.regen.Device.Generation", NULL, &before);
		if (r < 0) {
			rc = fail(c, "generation", r);
			goto out;
		}
	}
	r = call_json(c, method, params, &reply);
	if (r < 0) {
		rc = fail(c, o->verb, r);
		goto out;
	}
	if (o->json) {
		print_json(reply);
	} else {
		cJSON_ArrayForEach(d, cJSON_GetObjectItemCaseSensitive(reply, "devices")) {
			if (targeted(o, jint(d, "index"))) {
				printf("device %lld: generation %lld, %s\n", (long long)jint(d, "index"),
				       (long long)jint(d, "generation"), jstr(d, "state"));
			}
		}
		if (cJSON_GetObjectItemCaseSensitive(reply, "elapsed_us") != NULL) {
			printf("%s took %.3f ms\n", o->verb, (double)jint(reply, "elapsed_us") / 1000.0);
		}
		fflush(stdout);
	}
	rc = EXIT_OK;
	if (o->wait) {
		rc = wait_ready(c, o, before, start, deadline);
	}
out:
	cJSON_Delete(params);
	cJSON_Delete(before);
	cJSON_Delete(reply);
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
		       ev->state[0] ? ev->state : "-", ev->reason[0] ? ev->reason : "-");
		fflush(stdout);
	}
	if (strcmp(ev->reason, "subscribed") != 0) {
		ws->changes++;
	}
	return ws->o->count_set && ws->changes >= ws->o->count;
}

static int cmd_watch(regen_client *c, const struct opts *o)
{
	struct watch_state ws = { .o = o };
	int r;

	if (o->count_set && o->count == 0) {
		return EXIT_OK;
	}
	r = regen_watch_full(c, 0, o->timeout_set ? o->timeout : 0, on_event, &ws);
	if (r == -ETIMEDOUT && !o->count_set) {
		return EXIT_OK;
	}
	if (r < 0) {
		return fail(c, "watch", r);
	}
	return EXIT_OK;
}

static int cmd_inject_fault(regen_client *c, const struct opts *o)
{
	int r;

	if (o->timeout_set) {
		regen_client_set_timeout(c, o->timeout);
	}
	r = regen_inject_fault(c, o->device < 0 ? 0 : o->device, o->kind);
	if (r < 0) {
		return fail(c, "inject-fault", r);
	}
	if (o->json) {
		printf("{\"device\":%d,\"kind\":\"%s\"}\n", o->device < 0 ? 0 : o->device, o->kind);
	} else {
		printf("device %d: injected %s\n", o->device < 0 ? 0 : o->device, o->kind);
	}
	return EXIT_OK;
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

int main(int argc, char **argv)
{
	enum { OPT_SOCKET = 256, OPT_JSON, OPT_DEVICE, OPT_ALL, OPT_REASON, OPT_WAIT, OPT_TIMEOUT,
	       OPT_DEADLINE, OPT_COUNT, OPT_KIND };
	static const struct option longopts[] = {
		{ "socket", required_argument, NULL, OPT_SOCKET },
		{ "json", no_argument, NULL, OPT_JSON },
		{ "device", required_argument, NULL, OPT_DEVICE },
		{ "all", no_argument, NULL, OPT_ALL },
		{ "reason", required_argument, NULL, OPT_REASON },
		{ "wait", no_argument, NULL, OPT_WAIT },
		{ "timeout", required_argument, NULL, OPT_TIMEOUT },
		{ "deadline-ms", required_argument, NULL, OPT_DEADLINE },
		{ "count", required_argument, NULL, OPT_COUNT },
		{ "kind", required_argument, NULL, OPT_KIND },
		{ "help", no_argument, NULL, 'h' },
		{ NULL, 0, NULL, 0 },
	};
	struct opts o = { .device = -1 };
	const char *positional[4];
	int npos = 0, opt, r, rc;
	regen_client *c = NULL;
	bool lifecycle, is_restart;
	long v;
	char *end;

	opterr = 0;
	while ((opt = getopt_long(argc, argv, ":h", longopts, NULL)) != -1) {
		switch (opt) {
		case OPT_SOCKET:
			o.socket = optarg;
			break;
		case OPT_JSON:
			o.json = true;
			break;
		case OPT_DEVICE:
			if (!parse_long(optarg, 0, &v) || v >= REGEN_DEVICES_MAX) {
				return usage_error("--device: not a device index: '%s'", optarg);
			}
			o.device = (int)v;
			o.device_set = true;
			break;
		case OPT_ALL:
			o.all = true;
			break;
		case OPT_REASON:
			o.reason = optarg;
			break;
		case OPT_WAIT:
			o.wait = true;
			break;
		case OPT_TIMEOUT:
			errno = 0;
			o.timeout = strtod(optarg, &end);
			if (errno != 0 || end == optarg || *end != '\0' || !(o.timeout > 0) || !isfinite(o.timeout)) {
				return usage_error("--timeout: not a positive number of seconds: '%s'", optarg);
			}
			o.timeout_set = true;
			break;
		case OPT_DEADLINE:
			if (!parse_long(optarg, 1, &o.deadline_ms) || o.deadline_ms > INT32_MAX) {
				return usage_error("--deadline-ms: not a positive number: '%s'", optarg);
			}
			o.deadline_set = true;
			break;
		case OPT_COUNT:
			if (!parse_long(optarg, 0, &o.count)) {
				return usage_error("--count: not a count: '%s'", optarg);
			}
			o.count_set = true;
			break;
		case OPT_KIND:
			o.kind = optarg;
			break;
		case 'h':
			usage(stdout);
			return EXIT_OK;
		case ':':
			return usage_error("option '%s' needs an argument", argv[optind - 1]);
		default:
			return usage_error("unknown option '%s'", argv[optind - 1]);
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
	o.verb = positional[0];
	lifecycle = strcmp(o.verb, "release") == 0 || strcmp(o.verb, "reset") == 0 ||
		    strcmp(o.verb, "restart") == 0;
	is_restart = strcmp(o.verb, "restart") == 0;
	if (strcmp(o.verb, "inject-fault") == 0) {
		if (npos == 2 && o.kind == NULL) {
			o.kind = positional[1];
			npos = 1;
		}
		if (o.kind == NULL) {
			return usage_error("%s: which fault? crash, device_lost or hang", o.verb);
		}
		if (strcmp(o.kind, "crash") != 0 && strcmp(o.kind, "device_lost") != 0 &&
		    strcmp(o.kind, "hang") != 0) {
			return usage_error("inject-fault: unknown kind '%s' (crash, device_lost, hang)", o.kind);
		}
	} else if (!lifecycle && strcmp(o.verb, "status") != 0 && strcmp(o.verb, "generation") != 0 &&
		   strcmp(o.verb, "watch") != 0) {
		return usage_error("unknown command '%s'", o.verb);
	}
	if (npos > 1) {
		return usage_error("unexpected argument '%s'", positional[1]);
	}
	if (o.device_set && o.all) {
		return usage_error("%s: --device and --all exclude each other", o.verb);
	}
	if ((o.device_set || o.all) && !lifecycle && strcmp(o.verb, "inject-fault") != 0) {
		return usage_error("%s takes no --device/--all", o.verb);
	}
	if (o.all && !lifecycle) {
		return usage_error("%s takes no --all", o.verb);
	}
	if ((o.reason != NULL || o.wait) && !lifecycle) {
		return usage_error("%s takes no --reason/--wait", o.verb);
	}
	if (o.deadline_set && !is_restart) {
		return usage_error("--deadline-ms is for restart, not %s", o.verb);
	}
	if (o.count_set && strcmp(o.verb, "watch") != 0) {
		return usage_error("--count is for watch, not %s", o.verb);
	}
	if (o.kind != NULL && strcmp(o.verb, "inject-fault") != 0) {
		return usage_error("--kind is for inject-fault, not %s", o.verb);
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
		return exit_code(r, NULL);
	}
	if (o.timeout_set && strcmp(o.verb, "watch") != 0) {
		regen_client_set_timeout(c, o.timeout);
	}
	if (strcmp(o.verb, "status") == 0) {
		rc = cmd_status(c, &o);
	} else if (strcmp(o.verb, "generation") == 0) {
		rc = cmd_generation(c, &o);
	} else if (lifecycle) {
		rc = cmd_lifecycle(c, &o, strcmp(o.verb, "release") == 0 ? "io.regen.Device.Release" :
					  strcmp(o.verb, "reset") == 0 ? "io.regen.Device.Reset" :
					  "io.regen.Device.Restart");
	} else if (strcmp(o.verb, "watch") == 0) {
		rc = cmd_watch(c, &o);
	} else {
		rc = cmd_inject_fault(c, &o);
	}
	regen_client_destroy(c);
	return rc;
}
