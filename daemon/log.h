/* SPDX-License-Identifier: Apache-2.0 */
/* One logging facility for regend, by level and topic, switched at run time
 * by REGEN_DEBUG (read once): "W" sets the default level, "I,worker:D,conn:T"
 * sets it per topic. Levels E W I D T. Every line names the process role,
 * and where there is one the device, its generation and the client pid:
 *   regend[812] W supervisor dev=0 gen=3 client=4411: worker exited (signal 9) */
#pragma once

#include <stdint.h>
#include <sys/types.h>

enum rd_log_level { RD_LOG_ERROR = 0, RD_LOG_WARN, RD_LOG_INFO, RD_LOG_DEBUG, RD_LOG_TRACE };

/* role: "supervisor" or "worker"; spec: REGEN_DEBUG's value or NULL. */
void rd_log_init(const char *role, const char *spec);
/* Overrides the default level (e.g. from the configuration file); REGEN_DEBUG wins. */
void rd_log_set_default_level(enum rd_log_level level);
int rd_log_enabled(enum rd_log_level level, const char *topic);
int rd_log_level_parse(const char *text);  /* "error".."trace" or E..T; -1 unknown */

/* device < 0, generation 0 and client 0 are left out of the line. */
void rd_log_write(enum rd_log_level level, const char *topic, int device, uint64_t generation, pid_t client,
		  const char *fmt, ...) __attribute__((format(printf, 6, 7)));

#define rd_log(level, topic, dev, gen, client, ...)                                     \
	do {                                                                            \
		if (rd_log_enabled(level, topic))                                       \
			rd_log_write(level, topic, dev, gen, client, __VA_ARGS__);      \
	} while (0)

#define rd_err(topic, dev, gen, client, ...) rd_log(RD_LOG_ERROR, topic, dev, gen, client, __VA_ARGS__)
#define rd_warn(topic, dev, gen, client, ...) rd_log(RD_LOG_WARN, topic, dev, gen, client, __VA_ARGS__)
#define rd_info(topic, dev, gen, client, ...) rd_log(RD_LOG_INFO, topic, dev, gen, client, __VA_ARGS__)
#define rd_debug(topic, dev, gen, client, ...) rd_log(RD_LOG_DEBUG, topic, dev, gen, client, __VA_ARGS__)
#define rd_trace(topic, dev, gen, client, ...) rd_log(RD_LOG_TRACE, topic, dev, gen, client, __VA_ARGS__)
