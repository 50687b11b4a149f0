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
	char admin_group[64];
	bool have_admin_gid;
	gid_t admin_gid;
	bool fault_injection;
	unsigned drain_deadline_ms;
	unsigned socket_mode;
	int log_level;                 /* enum rd_log_level */
	unsigned max_connections;      /* per peer uid, on each socket */
	unsigned max_buffers;          /* per client process, per device */

	/* Worker processes only. */
	bool worker;
	int worker_device;
	uint64_t worker_generation;
	int ctl_fd;
};

void rd_options_defaults(struct rd_options *o);
/* argv parsing; returns 0, 1 for --help/--version (printed), or -EINVAL
 * after printing what was wrong. */
int rd_options_parse(struct rd_options *o, int argc, char **argv);
/* "<socket>.dev<N>": where device N's worker listens. */
int rd_worker_socket_path(const struct rd_options *o, int device, char *buf, size_t size);
