/* SPDX-License-Identifier: Apache-2.0 */
/* Text a client sends never reaches a person's terminal as anything but
 * text: no terminal sequence, no C1 control, no character that reorders a
 * line, no line of its own.
 *
 * regend --socket-mode 0666 --admin-group G, REGEN_DEBUG=I,conn:D (so that
 * every failed call is a log line naming its method):
 * - uid nobody calls a method named with ESC [2J, CSI (U+009B) and a
 *   right-to-left override (U+202E): MethodNotFound, and regend's log
 *   holds none of those bytes (C0 was escaped before; C1 and U+202E went
 *   through raw).
 * - uid nobody with gid G (an admin, not root) restarts device 0 with a
 *   reason holding an OSC title sequence, a line feed followed by a forged
 *   event line, CSI, U+202E and DEL; root's `regenctl watch`, its `--json`
 *   twin and `regenctl call io.regen.Device.Status` print none of those
 *   bytes, every watch line is one event (the forged one is not a line),
 *   and the log holds none of them either. (Before: regenctl printed the
 *   reason as it came: the title sequence set root's terminal title, the
 *   forged line read as an event.) */
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "tests/lib/asserts.h"
#include "tests/lib/daemon.h"
#include "tests/lib/proc.h"
#include "tests/lib/varlink.h"

static struct tl_daemon daemon_;
static gid_t admin_gid;

/* The JSON escapes of what a client sends, and the bytes they stand for:
 * none of those may reach a terminal. */
#define HOSTILE_JSON "\\u001b]0;owned\\u0007 \\u001b[2J\\u009b31m \\u202eevil\\u007f"
#define FORGED_JSON "\\nepoch 9 device 1 generation 99 state failed reason forged"
static const char *const forbidden[] = { "\x1b", "\x07", "\x7f", "\xc2\x9b", "\xe2\x80\xae", NULL };

/* The first forbidden byte sequence in text, or NULL. */
static const char *first_forbidden(const char *text, size_t len)
{
	for (int i = 0; forbidden[i]; i++)
		if (memmem(text, len, forbidden[i], strlen(forbidden[i])))
			return forbidden[i];
	return NULL;
}

static void expect_safe(const char *what, const char *text)
{
	const char *bad = first_forbidden(text, strlen(text));

	ASSERT(bad == NULL, "%s holds the raw bytes %02x...: %s", what, (unsigned char)bad[0], text);
}

static void expect_log_safe(void)
{
	char *text;
	size_t len;
	FILE *f = fopen(daemon_.log, "r");

	ASSERT(f != NULL, "open the log");
	text = malloc(1 << 24);
	len = fread(text, 1, (1 << 24) - 1, f);
	fclose(f);
	text[len] = '\0';
	ASSERT(first_forbidden(text, len) == NULL, "regend's log holds a client's raw terminal bytes");
	free(text);
}

static int nobody_calls_a_hostile_method(void *arg)
{
	struct tl_conn c;
	struct tl_reply r;

	tl_become_nobody(0, false);
	ASSERT_OK(tl_conn_open(&c, daemon_.sock), "connect");
	tl_call(&c, &r, 10, NULL, 0, "io.regen.Device.X" HOSTILE_JSON, NULL);
	ASSERT_REPLY_ERROR(&r, "org.varlink.service.MethodNotFound", "the hostile method");
	tl_reply_finish(&r);
	tl_conn_close(&c);
	return 0;
}

static int admin_restarts_with_a_hostile_reason(void *arg)
{
	struct tl_conn c;
	struct tl_reply r;

	tl_become_nobody(admin_gid, true);
	ASSERT_OK(tl_conn_open(&c, daemon_.sock), "connect");
	tl_call(&c, &r, 30, NULL, 0, "io.regen.Device.Restart",
		"{\"device\":0,\"reason\":\"" HOSTILE_JSON FORGED_JSON "\"}");
	ASSERT_REPLY_OK(&r, "the admin's Restart");
	tl_reply_finish(&r);
	tl_conn_close(&c);
	return 0;
}

/* root's regenctl watch, until the restart's events came (or 20 s). */
static int root_watches(void *arg)
{
	bool json = arg != NULL;
	char *argv[] = { daemon_.regenctl, "--socket", daemon_.sock, json ? "--json" : "watch",
			 json ? "watch" : "--count", json ? "--count" : "2", json ? "2" : "--timeout",
			 json ? "--timeout" : "20", json ? "20" : NULL, NULL };
	char *out = NULL, *err = NULL, *line, *save = NULL;
	int rc = tl_run(argv, &out, &err, 40, -1, -1);

	tl_log("regenctl%s watch: exit %d\n%s%s", json ? " --json" : "", rc, out, err);
	ASSERT_EQ(rc, 0, "regenctl watch");
	expect_safe("regenctl watch's output", out);
	expect_safe("regenctl watch's errors", err);
	for (line = strtok_r(out, "\n", &save); line; line = strtok_r(NULL, "\n", &save))
		ASSERT(json ? line[0] == '{' : strncmp(line, "epoch ", 6) == 0 && strncmp(line, "epoch 9 device 1 ", 17) != 0,
		       "a line regenctl watch did not write: %s", line);
	free(out);
	free(err);
	return 0;
}

int main(void)
{
	const char *group;
	char *out = NULL, *err = NULL;
	pid_t watchers[2];

	tl_init(120);
	if (geteuid() != 0)
		tl_skip("needs root, to call as a second uid");
	group = tl_group_without_nobody((gid_t)-1, &admin_gid);
	if (!group)
		tl_skip("no group to make uid nobody an admin with");
	tl_daemon_start(&daemon_, &(struct tl_daemon_opts){
					 .extra = (const char *const[]){ "--socket-mode", "0666", NULL },
					 .admin_group = group,
					 .debug = "I,conn:D",
				 });

	ASSERT_EQ(tl_wait(tl_fork(nobody_calls_a_hostile_method, NULL, 0), 30), 0, "uid nobody's call");
	expect_log_safe();
	tl_log("a method named with ESC, CSI and U+202E: the log holds none of them");

	watchers[0] = tl_fork(root_watches, NULL, 0);
	watchers[1] = tl_fork(root_watches, (void *)1, 0);
	/* The watchers subscribe first. */
	usleep(500000);
	ASSERT_EQ(tl_wait(tl_fork(admin_restarts_with_a_hostile_reason, NULL, 0), 30), 0, "the admin's Restart");
	ASSERT_EQ(tl_wait_children(watchers, 2, 40), 0, "root's regenctl watch");

	char *argv[] = { daemon_.regenctl, "--socket", daemon_.sock, "call", "io.regen.Device.Status", NULL };
	ASSERT_EQ(tl_run(argv, &out, &err, 30, -1, -1), 0, "regenctl call: %s", err);
	ASSERT(strstr(out, "evil"), "Status does not carry the reason: %s", out);
	expect_safe("regenctl call's output", out);
	free(out);
	free(err);
	expect_log_safe();
	tl_log("PASS");
	return 0;
}
