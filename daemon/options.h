/* regend's settings: defaults, then the configuration file, then the
 * command line. */
#pragma once

#include <stdbool.h>
#include <stdint.h>
#include <sys/types.h>

#define RD_DEVICES_MAX 64

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
	unsigned socket_mode;
	int log_level;                 /* enum rd_log_level */
	unsigned max_connections;      /* per peer uid, on each socket */
	unsigned max_buffers;          /* per client process, per device */
	char config_path[256];         /* "" = none */

	/* Worker processes only. */
	bool worker;
	int worker_device;
	uint64_t worker_generation;
	int ctl_fd;
};

void rd_options_defaults(struct rd_options *o);
/* Defaults, then the configuration file (--config PATH, else
 * /etc/regen/regend.conf when it exists), then the command line. Returns 0,
 * 1 for --help/--version (printed), or -EINVAL after printing what was wrong. */
int rd_options_load(struct rd_options *o, int argc, char **argv);
/* The command line alone over what *o holds. */
int rd_options_parse(struct rd_options *o, int argc, char **argv);
/* Reads `key = value` lines into *o. explicit: a missing file is an error. */
int rd_options_read_file(struct rd_options *o, const char *path, bool explicit_path);
/* "<socket>.dev<N>": where device N's worker listens. */
int rd_worker_socket_path(const struct rd_options *o, int device, char *buf, size_t size);
