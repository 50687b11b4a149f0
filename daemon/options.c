#include <errno.h>
#include <getopt.h>
#include <grp.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "daemon/log.h"
#include "daemon/options.h"
#include "regen-config.h"

void rd_options_defaults(struct rd_options *o)
{
	memset(o, 0, sizeof(*o));
	snprintf(o->socket_path, sizeof(o->socket_path), "%s", REGEN_DEFAULT_SOCKET);
	snprintf(o->backend, sizeof(o->backend), "auto");
	o->devices = -1;
	o->drain_deadline_ms = 10000;
	o->socket_mode = 0660;
	o->log_level = RD_LOG_INFO;
	o->max_connections = 256;
	o->max_buffers = 4096;
	o->ctl_fd = -1;
}

static void usage(FILE *f)
{
	fprintf(f,
		"Usage: regend [OPTIONS]\n"
		"Serve GEMM and attention on this node's GPUs over Varlink.\n\n"
		"  --socket PATH             listen here (default %s)\n"
		"  --backend host|cuda|auto  compute backend (default auto: cuda where a GPU is)\n"
		"  --devices N               devices to serve (host backend: how many to simulate)\n"
		"  --admin-group NAME        members may Release/Reset/Restart (root always may)\n"
		"  --socket-group NAME       group of the sockets: its members may connect\n"
		"  --enable-fault-injection  allow io.regen.Device.InjectFault (tests only)\n"
		"  --drain-deadline-ms MS    how long Restart waits for calls in flight (default 10000)\n"
		"  --socket-mode OCTAL       mode of the sockets (default 0660)\n"
		"  --config PATH             configuration file (default /etc/regen/regend.conf)\n"
		"  --max-connections N       per uid, on each socket (default 256)\n"
		"  --max-buffers N           per client process and device (default 4096)\n"
		"  --help, --version\n\n"
		"Logs go to stderr; REGEN_DEBUG=E|W|I|D|T[,topic:LEVEL...] sets the levels.\n",
		REGEN_DEFAULT_SOCKET);
}

static int parse_uint(const char *text, unsigned long max, unsigned long *out)
{
	char *end;
	errno = 0;
	unsigned long v = strtoul(text, &end, 0);
	if (errno || end == text || *end || v > max || text[0] == '-')
		return -EINVAL;
	*out = v;
	return 0;
}

static int apply_key(struct rd_options *o, const char *key, const char *value);

int rd_options_parse(struct rd_options *o, int argc, char **argv)
{
	enum { OPT_SOCKET = 256, OPT_BACKEND, OPT_DEVICES, OPT_ADMIN, OPT_FAULTS, OPT_DRAIN, OPT_MODE,
	       OPT_WORKER, OPT_GENERATION, OPT_CTL_FD, OPT_HELP, OPT_VERSION, OPT_CONFIG, OPT_MAX_CONN, OPT_MAX_BUF, OPT_SOCKET_GROUP };
	static const struct option longopts[] = {
		{ "socket", required_argument, NULL, OPT_SOCKET },
		{ "backend", required_argument, NULL, OPT_BACKEND },
		{ "devices", required_argument, NULL, OPT_DEVICES },
		{ "admin-group", required_argument, NULL, OPT_ADMIN },
		{ "enable-fault-injection", no_argument, NULL, OPT_FAULTS },
		{ "drain-deadline-ms", required_argument, NULL, OPT_DRAIN },
		{ "socket-mode", required_argument, NULL, OPT_MODE },
		{ "config", required_argument, NULL, OPT_CONFIG },
		{ "max-connections", required_argument, NULL, OPT_MAX_CONN },
		{ "socket-group", required_argument, NULL, OPT_SOCKET_GROUP },
		{ "max-buffers", required_argument, NULL, OPT_MAX_BUF },
		/* Internal: how the supervisor starts a device's worker. */
		{ "worker", required_argument, NULL, OPT_WORKER },
		{ "generation", required_argument, NULL, OPT_GENERATION },
		{ "ctl-fd", required_argument, NULL, OPT_CTL_FD },
		{ "help", no_argument, NULL, OPT_HELP },
		{ "version", no_argument, NULL, OPT_VERSION },
		{ NULL, 0, NULL, 0 },
	};
	unsigned long v;
	int c;

	optind = 1;
	while ((c = getopt_long(argc, argv, "", longopts, NULL)) != -1) {
		switch (c) {
		case OPT_SOCKET:
			if (strlen(optarg) + 8 >= sizeof(o->socket_path)) {
				fprintf(stderr, "regend: --socket: path too long (max %zu bytes)\n", sizeof(o->socket_path) - 8);
				return -EINVAL;
			}
			snprintf(o->socket_path, sizeof(o->socket_path), "%s", optarg);
			break;
		case OPT_BACKEND:
			if (strcmp(optarg, "host") && strcmp(optarg, "cuda") && strcmp(optarg, "auto")) {
				fprintf(stderr, "regend: --backend: expected host, cuda or auto, got '%s'\n", optarg);
				return -EINVAL;
			}
			snprintf(o->backend, sizeof(o->backend), "%s", optarg);
			break;
		case OPT_DEVICES:
			if (parse_uint(optarg, RD_DEVICES_MAX, &v) < 0 || v == 0) {
				fprintf(stderr, "regend: --devices: expected 1..%d, got '%s'\n", RD_DEVICES_MAX, optarg);
				return -EINVAL;
			}
			o->devices = (int)v;
			break;
		case OPT_ADMIN:
		case OPT_SOCKET_GROUP:
			if (apply_key(o, c == OPT_ADMIN ? "admin_group" : "socket_group", optarg) < 0) {
				fprintf(stderr, "regend: --%s: no group named '%s'\n",
					c == OPT_ADMIN ? "admin-group" : "socket-group", optarg);
				return -EINVAL;
			}
			break;
		case OPT_FAULTS:
			o->fault_injection = true;
			break;
		case OPT_DRAIN:
			if (parse_uint(optarg, 3600000, &v) < 0) {
				fprintf(stderr, "regend: --drain-deadline-ms: expected 0..3600000, got '%s'\n", optarg);
				return -EINVAL;
			}
			o->drain_deadline_ms = (unsigned)v;
			break;
		case OPT_MODE:
			if (parse_uint(optarg, 0777, &v) < 0) {
				fprintf(stderr, "regend: --socket-mode: expected an octal mode like 0660, got '%s'\n", optarg);
				return -EINVAL;
			}
			o->socket_mode = (unsigned)v;
			break;
		case OPT_WORKER:
			if (parse_uint(optarg, RD_DEVICES_MAX - 1, &v) < 0)
				return -EINVAL;
			o->worker = true;
			o->worker_device = (int)v;
			break;
		case OPT_GENERATION:
			if (parse_uint(optarg, ~0ul, &v) < 0 || v == 0)
				return -EINVAL;
			o->worker_generation = v;
			break;
		case OPT_CTL_FD:
			if (parse_uint(optarg, 1024, &v) < 0)
				return -EINVAL;
			o->ctl_fd = (int)v;
			break;
		case OPT_MAX_CONN:
		case OPT_MAX_BUF:
			if (parse_uint(optarg, 100000000, &v) < 0 || v == 0) {
				fprintf(stderr, "regend: --%s: expected a positive number, got '%s'\n",
					c == OPT_MAX_CONN ? "max-connections" : "max-buffers", optarg);
				return -EINVAL;
			}
			if (c == OPT_MAX_CONN)
				o->max_connections = (unsigned)v;
			else
				o->max_buffers = (unsigned)v;
			break;
		case OPT_CONFIG:
			break;   /* read before the command line, by rd_options_load */
		case OPT_HELP:
			usage(stdout);
			return 1;
		case OPT_VERSION:
			printf("regend %s\n", REGEN_VERSION);
			return 1;
		default:
			usage(stderr);
			return -EINVAL;
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

static int parse_bool(const char *v, bool *out)
{
	if (!strcmp(v, "true") || !strcmp(v, "yes") || !strcmp(v, "1"))
		*out = true;
	else if (!strcmp(v, "false") || !strcmp(v, "no") || !strcmp(v, "0"))
		*out = false;
	else
		return -EINVAL;
	return 0;
}

/* One key; the same checks as the command line, which it mirrors. */
static int apply_key(struct rd_options *o, const char *key, const char *value)
{
	unsigned long v;
	int level;

	if (!strcmp(key, "socket")) {
		if (strlen(value) + 8 >= sizeof(o->socket_path) || value[0] != '/')
			return -EINVAL;
		snprintf(o->socket_path, sizeof(o->socket_path), "%s", value);
	} else if (!strcmp(key, "backend")) {
		if (strcmp(value, "host") && strcmp(value, "cuda") && strcmp(value, "auto"))
			return -EINVAL;
		snprintf(o->backend, sizeof(o->backend), "%s", value);
	} else if (!strcmp(key, "devices")) {
		if (!strcmp(value, "auto") || !*value) {
			o->devices = -1;
			return 0;
		}
		if (parse_uint(value, RD_DEVICES_MAX, &v) < 0 || v == 0)
			return -EINVAL;
		o->devices = (int)v;
	} else if (!strcmp(key, "admin_group") || !strcmp(key, "socket_group")) {
		bool admin = !strcmp(key, "admin_group");
		char *name = admin ? o->admin_group : o->socket_group;
		if (!*value) {
			name[0] = '\0';
			*(admin ? &o->have_admin_gid : &o->have_socket_gid) = false;
			return 0;
		}
		struct group *g = getgrnam(value);
		if (!g)
			return -ENOENT;
		snprintf(name, sizeof(o->admin_group), "%s", value);
		*(admin ? &o->admin_gid : &o->socket_gid) = g->gr_gid;
		*(admin ? &o->have_admin_gid : &o->have_socket_gid) = true;
	} else if (!strcmp(key, "drain_deadline_ms")) {
		if (parse_uint(value, 3600000, &v) < 0)
			return -EINVAL;
		o->drain_deadline_ms = (unsigned)v;
	} else if (!strcmp(key, "fault_injection")) {
		return parse_bool(value, &o->fault_injection);
	} else if (!strcmp(key, "log_level")) {
		level = rd_log_level_parse(value);
		if (level < 0)
			return -EINVAL;
		o->log_level = level;
	} else if (!strcmp(key, "socket_mode")) {
		if (parse_uint(value, 0777, &v) < 0)
			return -EINVAL;
		o->socket_mode = (unsigned)v;
	} else if (!strcmp(key, "max_connections")) {
		if (parse_uint(value, 1000000, &v) < 0 || v == 0)
			return -EINVAL;
		o->max_connections = (unsigned)v;
	} else if (!strcmp(key, "max_buffers")) {
		if (parse_uint(value, 100000000, &v) < 0 || v == 0)
			return -EINVAL;
		o->max_buffers = (unsigned)v;
	} else {
		return -ENOKEY;
	}
	return 0;
}

int rd_options_read_file(struct rd_options *o, const char *path, bool explicit_path)
{
	char line[512];
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
		char *s = trim(line), *eq, *key, *value;
		int r;

		lineno++;
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
		r = apply_key(o, key, value);
		if (r == -ENOKEY)
			fprintf(stderr, "regend: %s:%u: unknown key '%s'\n", path, lineno, key);
		else if (r == -ENOENT)
			fprintf(stderr, "regend: %s:%u: %s: no group named '%s'\n", path, lineno, key, value);
		else if (r < 0)
			fprintf(stderr, "regend: %s:%u: %s: invalid value '%s'\n", path, lineno, key, value);
		errors += r < 0;
	}
	fclose(f);
	snprintf(o->config_path, sizeof(o->config_path), "%s", path);
	return errors ? -EINVAL : 0;
}

int rd_options_load(struct rd_options *o, int argc, char **argv)
{
	const char *path = "/etc/regen/regend.conf";
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
		if (r < 0)
			return -EINVAL;
	}
	return rd_options_parse(o, argc, argv);
}

int rd_worker_socket_path(const struct rd_options *o, int device, char *buf, size_t size)
{
	int n = snprintf(buf, size, "%s.dev%d", o->socket_path, device);
	return n < 0 || (size_t)n >= size ? -ENAMETOOLONG : 0;
}
