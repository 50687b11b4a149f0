/* SPDX-License-Identifier: Apache-2.0 */
/* Kept state through libregen and regenctl (io.regen.Keep), against a real
 * regend: memory kept by a process that then dies comes back to another,
 * byte for byte, with its committed step; Status, List, regenctl kept and
 * the metrics show it with its job, size and lease; drop frees it; every
 * refusal is named (no such key, no job, a lease past the limit, memory
 * that is not a memfd or is of another size, CUDA memory on the host
 * backend); the pool keeps a chunk whole and maps one taken back as its
 * own. The death, the resume after a SIGKILL at random points and the
 * other uid are client/python/tests/test_keep.py's. */
#include <errno.h>
#include <signal.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/wait.h>
#include <unistd.h>
#include <cjson/cJSON.h>
#include "tests/lib/client.h"
#include "tests/lib/proc.h"

#define JOB "train-7"
#define LEASE_MAX_MS 20000

static struct tl_daemon daemon_;

static int run_ctl(char **out, const char *first, ...)
{
	char *argv[16];
	const char *a;
	va_list ap;
	int n = 0, rc;

	argv[n++] = daemon_.regenctl;
	argv[n++] = "--socket";
	argv[n++] = daemon_.sock;
	va_start(ap, first);
	for (a = first; a != NULL && n < 15; a = va_arg(ap, const char *))
		argv[n++] = (char *)a;
	va_end(ap);
	argv[n] = NULL;
	rc = tl_run(argv, out, NULL, 30, -1, -1);
	return rc;
}

/* A memfd of `size` bytes holding `fill` in every byte. */
static void filled(struct tl_memfd *m, size_t size, unsigned char fill)
{
	tl_memfd_create(m, size);
	memset(m->ptr, fill, size);
}

/* A child keeps two names of rank 3 and commits step 41, then is
 * SIGKILLed: what it kept outlives it. */
static int keeper(void *arg)
{
	regen_client *c = tl_client_connect(&daemon_);
	struct tl_memfd a, b;
	struct regen_kept out = { .size = sizeof(out) };
	struct regen_keep_args args = { .job = JOB, .rank = 3, .name = "weights", .kind = REGEN_MEMORY_HOST_FD,
					.device = -1, .lease_ms = LEASE_MAX_MS };

	(void)arg;
	filled(&a, 1 << 16, 0xa5);
	filled(&b, 8192, 0x3c);
	args.fd = a.fd;
	args.bytes = a.size;
	ASSERT_REGEN_OK(c, regen_keep(c, &args, &out));
	ASSERT_STR_EQ(out.job, JOB, "kept's job");
	ASSERT_EQ(out.rank, 3, "kept's rank");
	ASSERT_UINT_EQ(out.bytes, 1 << 16, "kept's bytes");
	ASSERT(out.held && out.holder_pid == getpid(), "held by %lld, not by this process", (long long)out.holder_pid);
	ASSERT_EQ(out.device, -1, "a host_fd's device");
	args.name = "optimizer";
	args.fd = b.fd;
	args.bytes = b.size;
	ASSERT_REGEN_OK(c, regen_keep(c, &args, NULL));
	ASSERT_REGEN_OK(c, regen_keep_commit(c, JOB, 3, 41));
	kill(getpid(), SIGKILL);
	return 1;
}

static void expect_taken_back(regen_client *c, const char *name, size_t size, unsigned char fill)
{
	struct regen_kept k = { .size = sizeof(k) };
	unsigned char *p;
	int fd = -1;

	ASSERT_REGEN_OK(c, regen_keep_take_back(c, JOB, 3, name, &k, &fd), "take back %s", name);
	ASSERT_GE(fd, 0, "the fd");
	ASSERT_UINT_EQ(k.bytes, size, "%s's size", name);
	ASSERT(k.has_step && k.step == 41, "%s: step %llu (has %d), not 41", name, (unsigned long long)k.step,
	       k.has_step);
	ASSERT(k.held && k.holder_pid == getpid(), "%s: held by %lld after the take back", name,
	       (long long)k.holder_pid);
	p = mmap(NULL, size, PROT_READ, MAP_SHARED, fd, 0);
	ASSERT(p != MAP_FAILED, "mmap of what was taken back");
	for (size_t i = 0; i < size; i++)
		ASSERT(p[i] == fill, "%s: byte %zu is %#x, not %#x", name, i, p[i], fill);
	munmap(p, size);
	close(fd);
}

static void kept_outlives_its_process(regen_client *c)
{
	regen_kept_list *list = NULL;
	pid_t pid = tl_fork(keeper, NULL, 30);

	ASSERT_EQ(tl_wait(pid, 30), 128 + SIGKILL, "the keeper's end");
	ASSERT_REGEN_OK(c, regen_keep_list(c, JOB, &list));
	ASSERT_EQ(regen_kept_list_count(list), 2, "names kept");
	for (size_t i = 0; i < 2; i++) {
		const struct regen_kept *k = regen_kept_list_get(list, i);
		ASSERT(!k->held && k->holder_pid == 0, "%s: still held after its process died", k->name);
		ASSERT(k->expires_unix_ms > k->kept_unix_ms, "%s: no lease end", k->name);
		ASSERT_EQ(k->lease_ms, LEASE_MAX_MS, "%s's lease", k->name);
	}
	regen_kept_list_free(list);
	expect_taken_back(c, "weights", 1 << 16, 0xa5);
	expect_taken_back(c, "optimizer", 8192, 0x3c);
}

static void refusals_are_named(regen_client *c)
{
	struct tl_memfd m;
	struct regen_keep_args args = { .job = JOB, .rank = 1, .name = "w", .kind = REGEN_MEMORY_HOST_FD, .device = -1 };
	int p[2], fd = -1;

	filled(&m, 4096, 1);
	args.fd = m.fd;
	args.bytes = m.size;
	ASSERT_REGEN_ERROR(c, regen_keep_take_back(c, JOB, 9, "w", NULL, &fd), REGEN_ERROR_NO_SUCH_OBJECT);
	ASSERT_EQ(fd, -1, "no fd for nothing");
	ASSERT(strstr(regen_client_error_parameters(c), "\"" JOB "/9/w\""), "%s", regen_client_error_parameters(c));
	ASSERT_REGEN_ERROR(c, regen_keep_commit(c, JOB, 9, 1), REGEN_ERROR_NO_SUCH_OBJECT);
	args.job = NULL;   /* this client states none, and its cgroup names none */
	ASSERT_REGEN_ERROR(c, regen_keep(c, &args, NULL), REGEN_ERROR_INVALID_JOB);
	args.job = JOB;
	args.lease_ms = LEASE_MAX_MS + 1;
	ASSERT_REGEN_ERROR(c, regen_keep(c, &args, NULL), REGEN_ERROR_LIMIT_EXCEEDED);
	ASSERT(strstr(regen_client_error_parameters(c), "\"lease_ms\""), "%s", regen_client_error_parameters(c));
	args.lease_ms = 0;
	args.bytes = 8192;
	ASSERT_REGEN_ERROR(c, regen_keep(c, &args, NULL), REGEN_ERROR_IMPORT_FAILED, "a size not the memfd's");
	args.bytes = 4096;
	ASSERT_EQ(pipe(p), 0, "pipe");
	args.fd = p[0];
	ASSERT_REGEN_ERROR(c, regen_keep(c, &args, NULL), REGEN_ERROR_IMPORT_FAILED, "a pipe");
	close(p[0]);
	close(p[1]);
	args.fd = m.fd;
	args.kind = REGEN_MEMORY_CUDA_FD;
	args.device = 0;
	ASSERT_REGEN_ERROR(c, regen_keep(c, &args, NULL), REGEN_ERROR_IMPORT_FAILED, "CUDA memory on the host backend");
	ASSERT(strstr(regen_client_error_message(c), "host backend"), "%s", regen_client_error_message(c));
	args.device = 5;
	ASSERT_REGEN_ERROR(c, regen_keep(c, &args, NULL), REGEN_ERROR_NO_SUCH_DEVICE);
	args.kind = REGEN_MEMORY_HOST_FD;
	args.device = -1;
	args.name = "not a name";
	ASSERT_REGEN_ERROR(c, regen_keep(c, &args, NULL), REGEN_ERROR_INVALID_PARAMETER);
	/* Kept with the memfd sealed against growing: the size counted stays
	 * the size held. */
	args.name = "w";
	ASSERT_REGEN_OK(c, regen_keep(c, &args, NULL));
	ASSERT(ftruncate(m.fd, 1 << 20) < 0 && errno == EPERM, "a kept memfd grew");
	tl_memfd_destroy(&m);
}

static void status_ctl_and_metrics_show_it(regen_client *c)
{
	char *out = NULL, *text = NULL;
	cJSON *st, *kept, *k;
	int n = 0;

	ASSERT_REGEN_OK(c, regen_call(c, -1, "io.regen.Device.Status", NULL, NULL, 0, &text));
	st = cJSON_Parse(text);
	kept = cJSON_GetObjectItem(st, "kept");
	cJSON_ArrayForEach(k, kept) {
		if (strcmp(cJSON_GetStringValue(cJSON_GetObjectItem(k, "job")), JOB) == 0)
			n++;
	}
	ASSERT_EQ(n, 3, "Status's kept: %s", text);
	cJSON_Delete(st);
	free(text);

	ASSERT_EQ(run_ctl(&out, "kept", NULL), 0, "regenctl kept");
	ASSERT(strstr(out, "JOB") && strstr(out, "LEASE_LEFT") && strstr(out, JOB) && strstr(out, "optimizer") &&
		       strstr(out, "65536") && strstr(out, "41"),
	       "regenctl kept:\n%s", out);
	free(out);
	ASSERT_EQ(run_ctl(&out, "--json", "kept", JOB, NULL), 0, "regenctl --json kept");
	st = cJSON_Parse(out);
	ASSERT_EQ(cJSON_GetArraySize(cJSON_GetObjectItem(st, "kept")), 3, "--json kept: %s", out);
	cJSON_Delete(st);
	free(out);
	ASSERT_EQ(run_ctl(&out, "metrics", NULL), 0, "regenctl metrics");
	ASSERT(strstr(out, "regen_kept_bytes{client_job=\"" JOB "\",rank=\"3\"") &&
		       strstr(out, "regen_kept_step{client_job=\"" JOB "\",rank=\"3\"") && strstr(out, "} 73728\n"),
	       "metrics:\n%s", out);
	free(out);
	ASSERT_EQ(run_ctl(&out, "kept", "not a job", NULL), 2, "kept with a bad job");
	free(out);
	ASSERT_EQ(run_ctl(&out, "drop", NULL), 2, "drop without a job");
	free(out);
	ASSERT_EQ(run_ctl(&out, "drop", JOB, "x", NULL), 2, "drop with a bad rank");
	free(out);
	ASSERT_EQ(run_ctl(&out, "drop", JOB, "3", "optimizer", NULL), 0, "regenctl drop of one name");
	ASSERT(strstr(out, "dropped 1 name(s), 8192 bytes"), "drop: %s", out);
	free(out);
	ASSERT_EQ(run_ctl(&out, "drop", JOB, NULL), 0, "regenctl drop of the job");
	ASSERT(strstr(out, "dropped 2 name(s), 69632 bytes"), "drop: %s", out);
	free(out);
	ASSERT_EQ(run_ctl(&out, "kept", JOB, NULL), 0, "regenctl kept after the drops");
	ASSERT_NULL(strstr(out, JOB), "still kept:\n%s", out);
	free(out);
}

static void the_pool_keeps_and_adopts_chunks(regen_client *c)
{
	struct regen_pool_chunk where = { .size = sizeof(where) };
	struct regen_pool_ref ref = { .size = sizeof(ref) };
	struct regen_kept k = { .size = sizeof(k) };
	char *p, *base = NULL;
	int fd = -1;

	ASSERT_REGEN_OK(c, regen_pool_configure(daemon_.sock, 2 << 20));
	p = regen_pool_alloc_host(4000);
	ASSERT_NOT_NULL(p, "%s", regen_pool_error());
	memcpy(p, "kept by the pool", 17);
	ASSERT_EQ(regen_pool_chunk_of(p, &where), 0, "chunk_of");
	ASSERT_EQ(where.kind, REGEN_MEMORY_HOST_FD, "a host chunk's kind");
	ASSERT_EQ(regen_pool_keep(p, JOB, 5, "chunk", 0), 0, "%s", regen_pool_error());
	ASSERT_EQ(regen_pool_keep((char *)&where, JOB, 5, "x", 0), -ENOENT, "memory not the pool's");
	ASSERT_REGEN_OK(c, regen_keep_take_back(c, JOB, 5, "chunk", &k, &fd));
	ASSERT_UINT_EQ(k.bytes, where.bytes, "the whole chunk");
	ASSERT_EQ(regen_pool_adopt(fd, k.kind, -1, k.bytes, (void **)&base), 0, "%s", regen_pool_error());
	ASSERT(base != p - where.offset, "adopted at the chunk's own address");
	ASSERT_STR_EQ(base + where.offset, "kept by the pool", "the bytes taken back");
	memcpy(base + where.offset, "changed", 8);
	ASSERT_STR_EQ(p, "changed", "one memory, two mappings");
	ASSERT_EQ(regen_pool_lookup(base + where.offset, 0, &ref), 0, "an adopted chunk imports: %s",
		  regen_pool_error());
	ASSERT_UINT_EQ(ref.offset, where.offset, "its offset in the import");
	regen_pool_free_host(base + where.offset);   /* never freed: it stays */
	ASSERT_STR_EQ(base + where.offset, "changed", "after a free of an adopted chunk's memory");
	regen_pool_free_host(p);
	ASSERT_REGEN_OK(c, regen_keep_drop(c, JOB, -1, NULL, NULL, NULL));
}

int main(void)
{
	static const char *const extra[] = { "--keep-lease-ms", "20000", NULL };
	struct tl_daemon_opts opts = { .devices = 1, .extra = extra };
	regen_client *c;

	tl_init(100);
	unsetenv("REGEN_JOB");
	tl_daemon_start(&daemon_, &opts);
	c = tl_client_connect(&daemon_);
	kept_outlives_its_process(c);
	refusals_are_named(c);
	status_ctl_and_metrics_show_it(c);
	the_pool_keeps_and_adopts_chunks(c);
	regen_client_destroy(c);
	tl_daemon_stop(&daemon_);
	tl_log("ok");
	return 0;
}
