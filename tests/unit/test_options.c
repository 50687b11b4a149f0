/* SPDX-License-Identifier: Apache-2.0 */
/* The option table: a value is checked by the same rule whether it comes on
 * the command line or from the configuration file (same verdict, same
 * words, nothing changed by a refused value); the defaults are the
 * documented ones; a worker's command line, built from the table, parses
 * back to the same settings; SIGHUP applies the reloadable keys only, and
 * those a worker holds reach a running worker. */
#include <check.h>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include <cjson/cJSON.h>
#include "daemon/env.h"
#include "daemon/log.h"
#include "daemon/options.h"
#include "regen-config.h"

/* stderr into a file while a call runs. */
static int saved_stderr = -1;
static FILE *captured;

static void capture_begin(void)
{
	fflush(stderr);
	captured = tmpfile();
	ck_assert_ptr_nonnull(captured);
	saved_stderr = dup(STDERR_FILENO);
	dup2(fileno(captured), STDERR_FILENO);
}

static void capture_end(char *buf, size_t size)
{
	size_t n;

	fflush(stderr);
	dup2(saved_stderr, STDERR_FILENO);
	close(saved_stderr);
	rewind(captured);
	n = fread(buf, 1, size - 1, captured);
	buf[n] = '\0';
	fclose(captured);
}

/* Every option's value as text: two settings are the same when these are. */
static void snapshot(const struct rd_options *o, char *buf, size_t size)
{
	size_t n = 0;

	for (const struct rd_option *opt = rd_option_table; opt->flag || opt->key; opt++) {
		char v[256] = "";
		int set = rd_option_format(o, opt, v, sizeof(v));
		if (opt->type != RD_OPT_CONFIG && n < size)
			n += snprintf(buf + n, size - n, "%s=%s%s;", opt->flag ? opt->flag : opt->key, v, set ? "(unset)" : "");
	}
}

/* --flag value, or --flag=value for a flag (a bool) */
static int parse_cli(struct rd_options *o, const char *flag, const char *value, char *err, size_t size)
{
	const struct rd_option *opt = rd_option_table;
	char arg[128];
	char *argv[] = { "regend", arg, (char *)value, NULL };
	int argc = value ? 3 : 2, r;

	while ((opt->flag || opt->key) && !(opt->flag && strcmp(opt->flag, flag) == 0))
		opt++;
	snprintf(arg, sizeof(arg), "--%s", flag);
	if (value && opt->type == RD_OPT_BOOL) {
		snprintf(arg, sizeof(arg), "--%s=%s", flag, value);
		argc = 2;
	}
	capture_begin();
	r = rd_options_parse(o, argc, argv);
	capture_end(err, size);
	return r;
}

static int read_file_text(struct rd_options *o, const char *text, char *path, size_t path_size, char *err, size_t size)
{
	FILE *f;
	int fd, r;

	snprintf(path, path_size, "/tmp/regen-test-options-XXXXXX");
	fd = mkstemp(path);
	ck_assert_int_ge(fd, 0);
	f = fdopen(fd, "w");
	fputs(text, f);
	fclose(f);
	capture_begin();
	r = rd_options_read_file(o, path, true);
	capture_end(err, size);
	unlink(path);
	return r;
}

static int parse_file(struct rd_options *o, const char *key, const char *value, char *path, size_t path_size, char *err,
		      size_t size)
{
	char line[512];

	snprintf(line, sizeof(line), "%s = %s\n", key, value);
	return read_file_text(o, line, path, path_size, err, size);
}

/* What follows "regend: <where>: <name>: " on the one line printed. */
static const char *reason_after(const char *text, const char *name)
{
	const char *p = strstr(text, name);

	ck_assert_msg(p != NULL, "'%s' not in '%s'", name, text);
	p += strlen(name);
	ck_assert_msg(strncmp(p, ": ", 2) == 0, "'%s' not followed by ': ' in '%s'", name, text);
	return p + 2;
}

static const struct {
	const char *key, *value;
} bad[] = {
	/* The command line used to take a relative socket path, the file not. */
	{ "socket", "relative/regend.sock" },
	{ "socket", "/run/regen/a-path-of-a-hundred-bytes-leaves-no-room-for-the-suffix-dev63-of-the-worker-sockets-beside-it" },
	{ "socket", "" },
	{ "backend", "gpu" },
	{ "backend", "" },
	{ "devices", "0" },
	{ "devices", "65" },
	{ "devices", "-1" },
	{ "devices", "two" },
	{ "devices", "0x2" },
	{ "admin_group", "regen-test-no-such-group" },
	{ "socket_group", "regen-test-no-such-group" },
	{ "drain_deadline_ms", "3600001" },
	{ "drain_deadline_ms", "-5" },
	{ "drain_deadline_ms", "10s" },
	{ "drain_deadline_ms", "0x10" },
	{ "socket_mode", "0800" },
	{ "socket_mode", "01777" },
	{ "socket_mode", "rw" },
	{ "max_connections", "0" },
	/* The command line used to take up to 100000000, the file 1000000. */
	{ "max_connections", "5000000" },
	{ "max_connections", "-1" },
	{ "max_buffers", "0" },
	{ "max_buffers", "100000001" },
	{ "max_buffers", "18446744073709551617" },
	{ "max_events", "0" },
	{ "max_events", "100000001" },
	{ "max_comms", "0" },
	{ "max_comms", "65537" },
	{ "max_ring_entries", "0" },
	{ "max_ring_entries", "16777217" },
	{ "max_uid_programs", "0" },
	{ "max_uid_program_nodes", "268435457" },
	{ "hang_cooldown_ms", "86400001" },
	{ "hang_cooldown_ms", "-1" },
	{ "max_import_gib", "0" },
	{ "max_import_gib", "131073" },
	{ "gemm_plans_max", "0" },
	{ "gemm_plans_max", "65537" },
	{ "gemm_plans_max", "many" },
	{ "rtc_cache_dir", "relative/cache" },
	{ "log_level", "loud" },
	{ "message_timeout_ms", "0" },
	{ "ring_spin_us", "10000001" },
	{ "ring_spin_us", "soon" },
	{ "cuda_spin_us", "-1" },
	{ "cuda_wake", "sometimes" },
	{ "cuda_inline_launch", "maybe" },
	{ "reset_retry_ms", "60001" },
	{ "attention_autotune", "17" },
	{ "nvml", "off" },
};

START_TEST(a_bad_value_gets_the_same_error_on_the_command_line_and_in_the_file)
{
	const struct rd_option *opt = rd_option_by_key(bad[_i].key);
	struct rd_options defaults, cli, file;
	char cli_err[1024], file_err[1024], path[64], want[4096], got[4096];
	int r_cli, r_file;

	ck_assert_ptr_nonnull(opt);
	ck_assert_ptr_nonnull(opt->flag);
	rd_options_defaults(&defaults);
	rd_options_defaults(&cli);
	rd_options_defaults(&file);
	r_cli = parse_cli(&cli, opt->flag, bad[_i].value, cli_err, sizeof(cli_err));
	r_file = parse_file(&file, bad[_i].key, bad[_i].value, path, sizeof(path), file_err, sizeof(file_err));
	ck_assert_msg(r_cli == -EINVAL, "--%s '%s': %d", opt->flag, bad[_i].value, r_cli);
	ck_assert_msg(r_file == -EINVAL, "%s = '%s': %d", bad[_i].key, bad[_i].value, r_file);

	/* regend: --devices: <why>  and  regend: /tmp/x:1: devices: <why> */
	char flag[64];
	snprintf(flag, sizeof(flag), "--%s", opt->flag);
	ck_assert_msg(strncmp(cli_err, "regend: --", 10) == 0, "command line: '%s'", cli_err);
	ck_assert_msg(strstr(file_err, path) && strstr(file_err, ":1: "), "file: '%s' does not name %s:1", file_err, path);
	ck_assert_str_eq(reason_after(cli_err, flag), reason_after(file_err, bad[_i].key));
	ck_assert_msg(strstr(cli_err, "expected") || strstr(cli_err, "no group"), "no reason a person can act on: %s",
		      cli_err);

	/* Nothing changed. */
	snapshot(&defaults, want, sizeof(want));
	snapshot(&cli, got, sizeof(got));
	ck_assert_str_eq(got, want);
	snapshot(&file, got, sizeof(got));
	ck_assert_str_eq(got, want);
}
END_TEST

static const struct {
	const char *key, *value, *stored;
} good[] = {
	/* The file used to take auto, the command line not. */
	{ "devices", "auto", "auto" },
	{ "devices", "64", "64" },
	{ "socket_mode", "0600", "0600" },
	{ "socket_mode", "600", "0600" },
	{ "drain_deadline_ms", "010", "10" },
	{ "drain_deadline_ms", "0", "0" },
	{ "max_connections", "1000000", "1000000" },
	{ "socket", "/tmp/regen.sock", "/tmp/regen.sock" },
	{ "backend", "host", "host" },
	{ "admin_group", "root", "root" },
	{ "admin_group", "", "" },
	{ "rtc_cache_dir", "/var/cache/regen", "/var/cache/regen" },
	{ "rtc_cache_dir", "", "" },
	{ "log_level", "debug", "debug" },
	{ "log_level", "W", "warn" },
	{ "ring_spin_us", "auto", "auto" },
	{ "ring_spin_us", "0", "0" },
	{ "reset_retry_ms", "auto", "auto" },
	{ "cuda_wake", "launch", "launch" },
	{ "cuda_inline_launch", "no", "false" },
	{ "cuda_launch_profile", "1", "true" },
	{ "nvml", "false", "false" },
	{ "attention_autotune", "4", "4" },
};

START_TEST(a_good_value_means_the_same_on_the_command_line_and_in_the_file)
{
	const struct rd_option *opt = rd_option_by_key(good[_i].key);
	struct rd_options cli, file;
	char err[1024], path[64], a[4096], b[4096], v[256];

	ck_assert_ptr_nonnull(opt);
	rd_options_defaults(&cli);
	rd_options_defaults(&file);
	ck_assert_int_eq(parse_cli(&cli, opt->flag, good[_i].value, err, sizeof(err)), 0);
	ck_assert_str_eq(err, "");
	ck_assert_int_eq(parse_file(&file, good[_i].key, good[_i].value, path, sizeof(path), err, sizeof(err)), 0);
	ck_assert_str_eq(err, "");
	rd_option_format(&cli, opt, v, sizeof(v));
	ck_assert_str_eq(v, good[_i].stored);
	snapshot(&cli, a, sizeof(a));
	snapshot(&file, b, sizeof(b));
	ck_assert_str_eq(a, b);
}
END_TEST

START_TEST(the_defaults_are_the_documented_ones)
{
	struct rd_options o;

	rd_options_defaults(&o);
	ck_assert_str_eq(o.socket_path, REGEN_DEFAULT_SOCKET);
	ck_assert_str_eq(o.backend, "auto");
	ck_assert_int_eq(o.devices, -1);
	ck_assert(!o.have_admin_gid && !o.have_socket_gid);
	ck_assert(!o.fault_injection);
	ck_assert_uint_eq(o.drain_deadline_ms, 10000);
	ck_assert_uint_eq(o.socket_mode, 0660);
	ck_assert_int_eq(o.log_level, RD_LOG_INFO);
	ck_assert_uint_eq(o.max_connections, 256);
	ck_assert_uint_eq(o.max_buffers, 4096);
	ck_assert_uint_eq(o.max_events, 4096);
	ck_assert_uint_eq(o.max_comms, 64);
	ck_assert_uint_eq(o.max_ring_entries, 16384);
	ck_assert_uint_eq(o.max_import_gib, 1024);
	ck_assert_uint_eq(o.max_uid_programs, 256);
	ck_assert_uint_eq(o.hang_cooldown_ms, 60000);
	ck_assert_str_eq(o.worker_charged, "");
	ck_assert_uint_eq(o.max_uid_program_nodes, 262144);
	ck_assert_uint_eq(o.gemm_plans_max, 256);
	ck_assert_uint_eq(o.message_timeout_ms, RD_MESSAGE_TIMEOUT_MS_DEFAULT);
	ck_assert_int_eq(o.ring_spin_us, -1);
	ck_assert_uint_eq(o.cuda_spin_us, RD_CUDA_SPIN_US_DEFAULT);
	ck_assert_str_eq(o.cuda_wake, "spin");
	ck_assert(o.cuda_inline_launch && !o.cuda_launch_profile && o.nvml);
	ck_assert_int_eq(o.reset_retry_ms, -1);
	ck_assert_uint_eq(o.attention_autotune, 0);
	ck_assert_str_eq(o.config_path, "");
	ck_assert_int_eq(o.worker_device, -1);
	ck_assert_int_eq(o.ctl_fd, -1);
	/* Each written default passes its own rule. */
	for (const struct rd_option *opt = rd_option_table; opt->flag || opt->key; opt++)
		if (opt->def && opt->type != RD_OPT_CONFIG)
			ck_assert_msg(rd_option_set(&o, opt, opt->def, NULL, 0) == 0, "%s: default '%s' refused",
				      opt->key, opt->def);
}
END_TEST

START_TEST(a_file_error_names_the_line_and_keeps_reading)
{
	struct rd_options o;
	char err[2048], path[64];

	rd_options_defaults(&o);
	ck_assert_int_eq(read_file_text(&o,
					"# comment\n\nbackend = host\nno_such_key = 1\nworker = 0\n"
					"max_buffers = 0\nnot a pair\nlog_level = debug\n",
					path, sizeof(path), err, sizeof(err)),
			 -EINVAL);
	ck_assert_msg(strstr(err, ":4: unknown key 'no_such_key'"), "%s", err);
	/* Internal options are not keys of the file. */
	ck_assert_msg(strstr(err, ":5: unknown key 'worker'"), "%s", err);
	ck_assert_msg(strstr(err, ":6: max_buffers: expected 1..100000000, got '0'"), "%s", err);
	ck_assert_msg(strstr(err, ":7: expected 'key = value'"), "%s", err);
	ck_assert_str_eq(o.backend, "host");
	ck_assert_int_eq(o.log_level, RD_LOG_DEBUG);
	ck_assert_uint_eq(o.max_buffers, 4096);
}
END_TEST

/* A line past the buffer is refused whole: its rest had been read as a
 * line of its own, so a key at the end of a long comment took effect. */
START_TEST(a_line_too_long_is_refused_whole)
{
	struct rd_options o;
	char err[2048], path[64], text[2048];
	int n;

	rd_options_defaults(&o);
	n = snprintf(text, sizeof(text), "# ");
	for (int i = 0; i < 509; i++)
		text[n++] = 'x';
	snprintf(text + n, sizeof(text) - (size_t)n, "fault_injection = true\nbackend = host\n");
	ck_assert_int_eq(read_file_text(&o, text, path, sizeof(path), err, sizeof(err)), -EINVAL);
	ck_assert_msg(strstr(err, ":1: line longer than 510 bytes"), "%s", err);
	ck_assert_msg(!o.fault_injection, "a key at the end of a long comment took effect");
	ck_assert_str_eq(o.backend, "host");   /* the next line is the file's line 2, read as such */
}
END_TEST

START_TEST(the_workers_command_line_parses_back_to_the_same_settings)
{
	struct rd_options sv, wk;
	struct rd_argv args;
	char a[4096], b[4096];
	int argc = 0;

	rd_options_defaults(&sv);
	ck_assert_int_eq(rd_option_set(&sv, rd_option_by_key("socket"), "/tmp/regen-test/s", NULL, 0), 0);
	ck_assert_int_eq(rd_option_set(&sv, rd_option_by_key("backend"), "host", NULL, 0), 0);
	ck_assert_int_eq(rd_option_set(&sv, rd_option_by_key("admin_group"), "root", NULL, 0), 0);
	ck_assert_int_eq(rd_option_set(&sv, rd_option_by_key("fault_injection"), "true", NULL, 0), 0);
	ck_assert_int_eq(rd_option_set(&sv, rd_option_by_key("drain_deadline_ms"), "1234", NULL, 0), 0);
	ck_assert_int_eq(rd_option_set(&sv, rd_option_by_key("socket_mode"), "0606", NULL, 0), 0);
	ck_assert_int_eq(rd_option_set(&sv, rd_option_by_key("max_connections"), "9", NULL, 0), 0);
	ck_assert_int_eq(rd_option_set(&sv, rd_option_by_key("max_buffers"), "17", NULL, 0), 0);
	ck_assert_int_eq(rd_option_set(&sv, rd_option_by_key("max_comms"), "5", NULL, 0), 0);
	ck_assert_int_eq(rd_option_set(&sv, rd_option_by_key("log_level"), "debug", NULL, 0), 0);
	ck_assert_int_eq(rd_option_set(&sv, rd_option_by_key("rtc_cache_dir"), "/var/cache/regen/rtc", NULL, 0), 0);
	/* Flags whose default is true travel as --flag=false. */
	ck_assert_int_eq(rd_option_set(&sv, rd_option_by_key("nvml"), "false", NULL, 0), 0);
	ck_assert_int_eq(rd_option_set(&sv, rd_option_by_key("cuda_launch_profile"), "true", NULL, 0), 0);
	ck_assert_int_eq(rd_option_set(&sv, rd_option_by_key("ring_spin_us"), "50", NULL, 0), 0);
	sv.worker_device = 3;
	sv.worker_generation = 12345678901234ull;
	sv.ctl_fd = 3;
	ck_assert_int_eq(rd_options_worker_argv(&sv, "/usr/sbin/regend", &args), 0);
	ck_assert_str_eq(args.argv[0], "/usr/sbin/regend");
	while (args.argv[argc])
		argc++;
	rd_options_defaults(&wk);
	ck_assert_int_eq(rd_options_parse(&wk, argc, args.argv), 0);
	/* What a worker is handed it has; the rest (devices, heartbeat_ms) is not its business. */
	for (const struct rd_option *opt = rd_option_table; opt->flag || opt->key; opt++) {
		if (!(opt->where & RD_OPT_WORKER))
			continue;
		rd_option_format(&sv, opt, a, sizeof(a));
		rd_option_format(&wk, opt, b, sizeof(b));
		ck_assert_msg(strcmp(a, b) == 0, "--%s: '%s' became '%s'", opt->flag, a, b);
	}
	ck_assert_int_eq(wk.worker_device, 3);
	ck_assert(wk.worker_generation == 12345678901234ull);
	ck_assert(wk.have_admin_gid && wk.admin_gid == 0);
	ck_assert(!wk.have_socket_gid);
	/* Workers log too (they logged at info whatever log_level said). */
	ck_assert_int_eq(wk.log_level, RD_LOG_DEBUG);
	ck_assert(!wk.nvml && wk.cuda_launch_profile && wk.cuda_inline_launch);
	ck_assert_int_eq(wk.ring_spin_us, 50);
	for (int i = 0; i < argc; i++)
		ck_assert_msg(strcmp(args.argv[i], "--socket-group") != 0, "an unset group is handed on");
}
END_TEST

START_TEST(sighup_applies_the_reloadable_keys_and_names_the_others)
{
	struct rd_options live, fresh;
	char restart_only[256];

	rd_options_defaults(&live);
	rd_options_defaults(&fresh);
	ck_assert_int_eq(rd_option_set(&fresh, rd_option_by_key("log_level"), "trace", NULL, 0), 0);
	ck_assert_int_eq(rd_option_set(&fresh, rd_option_by_key("drain_deadline_ms"), "5", NULL, 0), 0);
	ck_assert_int_eq(rd_option_set(&fresh, rd_option_by_key("max_connections"), "7", NULL, 0), 0);
	ck_assert_int_eq(rd_option_set(&fresh, rd_option_by_key("admin_group"), "root", NULL, 0), 0);
	ck_assert_int_eq(rd_option_set(&fresh, rd_option_by_key("backend"), "host", NULL, 0), 0);
	ck_assert_int_eq(rd_option_set(&fresh, rd_option_by_key("max_buffers"), "3", NULL, 0), 0);
	rd_options_reload(&live, &fresh, restart_only, sizeof(restart_only));
	ck_assert_int_eq(live.log_level, RD_LOG_TRACE);
	ck_assert_uint_eq(live.drain_deadline_ms, 5);
	ck_assert_uint_eq(live.max_connections, 7);
	ck_assert(live.have_admin_gid && live.admin_gid == 0);
	ck_assert_str_eq(live.admin_group, "root");
	ck_assert_str_eq(live.backend, "auto");
	ck_assert_uint_eq(live.max_buffers, 4096);
	ck_assert_str_eq(restart_only, "backend, max_buffers");
	/* Nothing changed: nothing to name. */
	rd_options_reload(&live, &live, restart_only, sizeof(restart_only));
	ck_assert_str_eq(restart_only, "");
}
END_TEST

static void take_reloaded(const char *key, const char *value, void *data)
{
	char why[256];

	ck_assert_msg(rd_options_set_worker_reload(data, key, value, why, sizeof(why)) == 0, "%s = '%s': %s", key,
		      value, why);
}

/* A worker started before a SIGHUP had the old values on its command line:
 * what SIGHUP reloads of the options handed on to workers reaches it by
 * key, checked by the same rule (drain_deadline_ms and max_connections had
 * stayed at the worker's start-up values). */
START_TEST(sighup_reaches_a_running_workers_options)
{
	struct rd_options live, fresh, worker;
	char restart_only[256], a[256], b[256], why[256];
	unsigned n = 0;

	rd_options_defaults(&live);
	rd_options_defaults(&worker);
	rd_options_defaults(&fresh);
	ck_assert_int_eq(rd_option_set(&fresh, rd_option_by_key("drain_deadline_ms"), "5", NULL, 0), 0);
	ck_assert_int_eq(rd_option_set(&fresh, rd_option_by_key("max_connections"), "7", NULL, 0), 0);
	ck_assert_int_eq(rd_option_set(&fresh, rd_option_by_key("admin_group"), "root", NULL, 0), 0);
	ck_assert_int_eq(rd_option_set(&fresh, rd_option_by_key("max_buffers"), "3", NULL, 0), 0);
	ck_assert_int_eq(rd_option_set(&fresh, rd_option_by_key("log_level"), "trace", NULL, 0), 0);
	rd_options_reload(&live, &fresh, restart_only, sizeof(restart_only));
	rd_options_each_worker_reload(&live, take_reloaded, &worker);
	for (const struct rd_option *opt = rd_option_table; opt->flag || opt->key; opt++) {
		if (!opt->key || !(opt->where & RD_OPT_WORKER) || !(opt->where & RD_OPT_RELOAD))
			continue;
		rd_option_format(&live, opt, a, sizeof(a));
		rd_option_format(&worker, opt, b, sizeof(b));
		ck_assert_msg(strcmp(a, b) == 0, "%s: the supervisor has '%s', the worker '%s'", opt->key, a, b);
		n++;
	}
	ck_assert_uint_ge(n, 4);
	ck_assert_uint_eq(worker.drain_deadline_ms, 5);
	ck_assert_uint_eq(worker.max_connections, 7);
	ck_assert(worker.have_admin_gid && worker.admin_gid == 0);
	ck_assert_int_eq(worker.log_level, RD_LOG_TRACE);
	/* What needs a restart, or is the supervisor's alone, is not the
	 * running worker's to change. */
	ck_assert_uint_eq(worker.max_buffers, 4096);
	ck_assert_int_eq(rd_options_set_worker_reload(&worker, "max_buffers", "3", why, sizeof(why)), -ENOENT);
	ck_assert_int_eq(rd_options_set_worker_reload(&worker, "heartbeat_ms", "500", why, sizeof(why)), -ENOENT);
	ck_assert_int_eq(rd_options_set_worker_reload(&worker, "no_such_key", "1", why, sizeof(why)), -ENOENT);
	ck_assert_uint_eq(worker.max_buffers, 4096);
	/* A bad value is refused by the option's own rule and changes nothing. */
	ck_assert_int_eq(rd_options_set_worker_reload(&worker, "max_connections", "0", why, sizeof(why)), -EINVAL);
	ck_assert_str_eq(why, "expected 1..1000000, got '0'");
	ck_assert_uint_eq(worker.max_connections, 7);
	/* An unset group travels as "" and unsets it. */
	ck_assert_int_eq(rd_options_set_worker_reload(&worker, "admin_group", "", why, sizeof(why)), 0);
	ck_assert(!worker.have_admin_gid);
}
END_TEST

/* `flag` in `text` as a whole word: "--worker" is not in
 * "--worker-start-timeout-ms". */
static bool mentions(const char *text, const char *flag)
{
	size_t n = strlen(flag);

	for (const char *at = strstr(text, flag); at; at = strstr(at + 1, flag)) {
		char next = at[n];
		if (!(next == '-' || next == '_' || (next >= 'a' && next <= 'z')))
			return true;
	}
	return false;
}

START_TEST(help_lists_every_option_a_person_may_give)
{
	char text[8192], flag[80];
	FILE *f = tmpfile();
	size_t n;

	rd_options_usage(f);
	rewind(f);
	n = fread(text, 1, sizeof(text) - 1, f);
	text[n] = '\0';
	fclose(f);
	for (const struct rd_option *opt = rd_option_table; opt->flag || opt->key; opt++) {
		if (opt->flag)
			snprintf(flag, sizeof(flag), "--%s", opt->flag);
		else
			snprintf(flag, sizeof(flag), "%s = ", opt->key);
		if (opt->where & RD_OPT_INTERNAL)
			ck_assert_msg(!mentions(text, flag), "internal %s in --help", flag);
		else
			ck_assert_msg(mentions(text, flag), "%s missing from --help", flag);
	}
}
END_TEST

/* Sets (or, value NULL, unsets) each of the variables. */
static void set_env(const char *const *pairs)
{
	for (; pairs[0]; pairs += 2) {
		if (pairs[1])
			setenv(pairs[0], pairs[1], 1);
		else
			unsetenv(pairs[0]);
	}
}

/* The environment sets an option between the file and the command line,
 * by the same rule and with the same words; empty is unset; a worker reads
 * none of it (its command line carries what the supervisor read). */
START_TEST(the_environment_sets_an_option_between_the_file_and_the_command_line)
{
	static const char *const set[] = { "REGEN_RING_SPIN_US", "70", "REGEN_CUDA_WAKE", "launch", "REGEN_NVML", "0",
					   "REGEN_MESSAGE_TIMEOUT_MS", "", NULL };
	static const char *const unset[] = { "REGEN_RING_SPIN_US", NULL, "REGEN_CUDA_WAKE", NULL, "REGEN_NVML", NULL,
					     "REGEN_MESSAGE_TIMEOUT_MS", NULL, NULL };
	char path[64], config[80], err[1024];
	struct rd_options o;
	FILE *f;
	int fd, r;

	snprintf(path, sizeof(path), "/tmp/regen-test-options-XXXXXX");
	fd = mkstemp(path);
	ck_assert_int_ge(fd, 0);
	f = fdopen(fd, "w");
	fputs("ring_spin_us = 60\ncuda_spin_us = 5\nnvml = true\n", f);
	fclose(f);
	snprintf(config, sizeof(config), "--config=%s", path);

	set_env(set);
	char *argv[] = { "regend", config, "--cuda-wake", "spin", NULL };
	capture_begin();
	r = rd_options_load(&o, 4, argv);
	capture_end(err, sizeof(err));
	ck_assert_msg(r == 0, "%d: %s", r, err);
	ck_assert_int_eq(o.ring_spin_us, 70);                 /* the environment over the file */
	ck_assert_uint_eq(o.cuda_spin_us, 5);                 /* the file where the environment says nothing */
	ck_assert_str_eq(o.cuda_wake, "spin");                /* the command line over the environment */
	ck_assert(!o.nvml);
	ck_assert_uint_eq(o.message_timeout_ms, RD_MESSAGE_TIMEOUT_MS_DEFAULT);   /* empty: unset */

	/* A worker: its command line alone. */
	char *worker_argv[] = { "regend", "--worker", "0", NULL };
	ck_assert_int_eq(rd_options_load(&o, 3, worker_argv), 0);
	ck_assert_int_eq(o.ring_spin_us, -1);
	ck_assert(o.nvml);

	/* A bad value is refused by the option's rule, naming the variable. */
	setenv("REGEN_ATTENTION_AUTOTUNE", "many", 1);
	capture_begin();
	r = rd_options_load(&o, 2, argv);
	capture_end(err, sizeof(err));
	unsetenv("REGEN_ATTENTION_AUTOTUNE");
	ck_assert_int_eq(r, -EINVAL);
	ck_assert_msg(strstr(err, "regend: REGEN_ATTENTION_AUTOTUNE: expected 0..16, got 'many'"), "%s", err);
	set_env(unset);
	unlink(path);
}
END_TEST

/* What Status reports: every option a person may set, by its key, with
 * the value in force as the file takes it back; nothing internal. */
START_TEST(status_reports_every_settable_option)
{
	struct rd_options o;
	cJSON *all;
	unsigned keys = 0;

	rd_options_defaults(&o);
	ck_assert_int_eq(rd_option_set(&o, rd_option_by_key("attention_autotune"), "3", NULL, 0), 0);
	all = rd_options_to_json(&o);
	ck_assert_ptr_nonnull(all);
	for (const struct rd_option *opt = rd_option_table; opt->flag || opt->key; opt++) {
		const cJSON *v;
		char want[256];

		if (!opt->key || (opt->where & RD_OPT_INTERNAL)) {
			if (opt->flag)
				ck_assert_ptr_null(cJSON_GetObjectItemCaseSensitive(all, opt->flag));
			continue;
		}
		v = cJSON_GetObjectItemCaseSensitive(all, opt->key);
		ck_assert_msg(cJSON_IsString(v), "%s missing", opt->key);
		rd_option_format(&o, opt, want, sizeof(want));
		ck_assert_str_eq(v->valuestring, want);
		keys++;
	}
	ck_assert_int_eq(cJSON_GetArraySize(all), (int)keys);
	ck_assert_str_eq(cJSON_GetObjectItemCaseSensitive(all, "attention_autotune")->valuestring, "3");
	ck_assert_str_eq(cJSON_GetObjectItemCaseSensitive(all, "ring_spin_us")->valuestring, "auto");
	ck_assert_ptr_null(cJSON_GetObjectItemCaseSensitive(all, "worker"));
	cJSON_Delete(all);
}
END_TEST

/* An option's variable is REGEN_ and its key in capitals, settable by a
 * person (in the file too); no variable is named twice, here or in env.h's
 * table of the rest. */
START_TEST(each_variable_is_named_once)
{
	unsigned n = 0;

	for (const struct rd_option *opt = rd_option_table; opt->flag || opt->key; opt++) {
		char want[96];
		size_t i;

		if (!opt->env)
			continue;
		ck_assert_msg(opt->key && opt->flag && !(opt->where & RD_OPT_INTERNAL), "%s", opt->env);
		snprintf(want, sizeof(want), "REGEN_%s", opt->key);
		for (i = 6; want[i]; i++)
			want[i] = (char)(want[i] >= 'a' && want[i] <= 'z' ? want[i] - 'a' + 'A' : want[i]);
		ck_assert_str_eq(opt->env, want);
		for (int v = 0; v < RD_ENV_VARS; v++)
			ck_assert_str_ne(rd_env_table[v].name, opt->env);
		n++;
	}
	ck_assert_uint_ge(n, 9);
	for (int v = 0; v < RD_ENV_VARS; v++) {
		ck_assert_msg(strncmp(rd_env_table[v].name, "REGEN_", 6) == 0 && rd_env_table[v].help, "entry %d", v);
		for (int w = 0; w < v; w++)
			ck_assert_str_ne(rd_env_table[v].name, rd_env_table[w].name);
	}
}
END_TEST

int main(void)
{
	Suite *s = suite_create("options");
	TCase *tc = tcase_create("core");
	tcase_add_loop_test(tc, a_bad_value_gets_the_same_error_on_the_command_line_and_in_the_file, 0,
			    sizeof(bad) / sizeof(bad[0]));
	tcase_add_loop_test(tc, a_good_value_means_the_same_on_the_command_line_and_in_the_file, 0,
			    sizeof(good) / sizeof(good[0]));
	tcase_add_test(tc, the_defaults_are_the_documented_ones);
	tcase_add_test(tc, a_file_error_names_the_line_and_keeps_reading);
	tcase_add_test(tc, a_line_too_long_is_refused_whole);
	tcase_add_test(tc, the_workers_command_line_parses_back_to_the_same_settings);
	tcase_add_test(tc, sighup_applies_the_reloadable_keys_and_names_the_others);
	tcase_add_test(tc, sighup_reaches_a_running_workers_options);
	tcase_add_test(tc, help_lists_every_option_a_person_may_give);
	tcase_add_test(tc, the_environment_sets_an_option_between_the_file_and_the_command_line);
	tcase_add_test(tc, status_reports_every_settable_option);
	tcase_add_test(tc, each_variable_is_named_once);
	suite_add_tcase(s, tc);
	SRunner *sr = srunner_create(s);
	srunner_run_all(sr, CK_NORMAL);
	int failed = srunner_ntests_failed(sr);
	srunner_free(sr);
	return failed ? 1 : 0;
}
