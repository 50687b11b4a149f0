/* SPDX-License-Identifier: Apache-2.0 */
#include <ctype.h>
#include <stdbool.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>
#include "daemon/log.h"
#include "proto/text.h"

#define TOPICS_MAX 16

static struct {
	const char *role;
	int default_level;
	int env_default;          /* REGEN_DEBUG set a default: config may not override */
	struct { char name[24]; int level; } topics[TOPICS_MAX];
	int ntopics;
	bool journal;             /* stderr is the journal: lines carry their priority */
} log_state = { .role = "regend", .default_level = RD_LOG_WARN };

/* systemd sets JOURNAL_STREAM=DEV:INO when stderr is a stream to journald;
 * the variable alone may be inherited from elsewhere, so the fd must match. */
static bool stderr_is_journal(void)
{
	const char *env = getenv("JOURNAL_STREAM");
	unsigned long long dev, ino;
	struct stat st;

	if (!env || sscanf(env, "%llu:%llu", &dev, &ino) != 2 || fstat(STDERR_FILENO, &st) < 0)
		return false;
	return (unsigned long long)st.st_dev == dev && (unsigned long long)st.st_ino == ino;
}

int rd_log_level_parse(const char *text)
{
	static const char *const names[] = { "error", "warn", "info", "debug", "trace" };

	if (!text || !*text)
		return -1;
	if (text[1] == '\0') {
		const char *letters = "EWIDT";
		const char *p = strchr(letters, toupper((unsigned char)text[0]));
		return p ? (int)(p - letters) : -1;
	}
	for (int i = 0; i < 5; i++)
		if (strcasecmp(text, names[i]) == 0)
			return i;
	return -1;
}

void rd_log_init(const char *role, const char *spec)
{
	char buf[256], *save = NULL;

	log_state.role = role;
	log_state.journal = stderr_is_journal();
	if (!spec || !*spec)
		return;
	snprintf(buf, sizeof(buf), "%s", spec);
	for (char *tok = strtok_r(buf, ",", &save); tok; tok = strtok_r(NULL, ",", &save)) {
		char *colon = strchr(tok, ':');
		if (!colon) {
			int level = rd_log_level_parse(tok);
			if (level >= 0) {
				log_state.default_level = level;
				log_state.env_default = 1;
			}
			continue;
		}
		*colon = '\0';
		int level = rd_log_level_parse(colon + 1);
		if (level < 0 || log_state.ntopics == TOPICS_MAX)
			continue;
		snprintf(log_state.topics[log_state.ntopics].name, sizeof(log_state.topics[0].name), "%s", tok);
		log_state.topics[log_state.ntopics++].level = level;
	}
}

void rd_log_set_default_level(enum rd_log_level level)
{
	if (!log_state.env_default)
		log_state.default_level = level;
}

int rd_log_enabled(enum rd_log_level level, const char *topic)
{
	for (int i = 0; i < log_state.ntopics; i++)
		if (strcmp(log_state.topics[i].name, topic) == 0)
			return (int)level <= log_state.topics[i].level;
	return (int)level <= log_state.default_level;
}

void rd_log_write(enum rd_log_level level, const char *topic, int device, uint64_t generation, pid_t client,
		  const char *fmt, ...)
{
	char line[1024], message[1024];
	int n, head;
	va_list ap;

	/* One write per line, so lines of the supervisor and its workers, which
	 * share stderr, never interleave mid-line. To the journal, each line
	 * starts with its syslog priority (sd-daemon(3)), so that
	 * `journalctl -p warning` finds regend's warnings. */
	static const char *const priorities[] = { "<3>", "<4>", "<6>", "<7>", "<7>" };
	n = snprintf(line, sizeof(line), "%s%s[%d] %c %s", log_state.journal ? priorities[level] : "", log_state.role,
		     (int)getpid(), "EWIDT"[level], topic);
	if (device >= 0 && n < (int)sizeof(line))
		n += snprintf(line + n, sizeof(line) - n, " dev=%d", device);
	if (generation && n < (int)sizeof(line))
		n += snprintf(line + n, sizeof(line) - n, " gen=%llu", (unsigned long long)generation);
	if (client && n < (int)sizeof(line))
		n += snprintf(line + n, sizeof(line) - n, " client=%d", (int)client);
	if (n < (int)sizeof(line))
		n += snprintf(line + n, sizeof(line) - n, ": ");
	head = n < (int)sizeof(line) - 2 ? n : (int)sizeof(line) - 2;
	/* A message may carry what a client sent (a restart's reason, a
	 * method name): a line feed in it would forge a log line, a terminal
	 * sequence would reach whoever reads the journal. */
	va_start(ap, fmt);
	vsnprintf(message, sizeof(message), fmt, ap);
	va_end(ap);
	n = head + (int)rp_text_escape(message, RP_TEXT_LINE, line + head, sizeof(line) - 1 - (size_t)head);
	line[n++] = '\n';
	ssize_t w = write(STDERR_FILENO, line, n);
	(void)w;
}
