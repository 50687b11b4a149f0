/* SPDX-License-Identifier: Apache-2.0 */
/* One client cannot use another's buffers, even by guessing their ids.
 *
 * Process A imports buffers on both devices. Process B (same uid, another
 * pid) imports one of its own, then names every serial b<dev>.1.1 ..
 * b<dev>.1.200 and, as a guess that happens to be right, A's own ids (the
 * worker may hand out serials that are not small or sequential) as
 * CloseBuffer's buffer and as a Gemm operand: every one
 * must fail with io.regen.NoSuchObject, and the error for an id A owns must
 * read exactly as the one for an id nobody owns (existence is not
 * revealed). Afterwards all of A's buffers still work for A. */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#include "tests/lib/asserts.h"
#include "tests/lib/daemon.h"
#include "tests/lib/memfd.h"
#include "tests/lib/varlink.h"

#define SERIALS 200
#define A_BUFFERS 5

static struct tl_daemon daemon_;

/* The error's message with every occurrence of id replaced by "ID". */
static char *masked_message(const struct tl_reply *r, const char *id)
{
	const char *m = tl_reply_str(r, "message");
	char *out = calloc(1, 1024), *o = out;

	ASSERT(m != NULL && out != NULL, "error without a message");
	while (*m && o < out + 1000) {
		if (strncmp(m, id, strlen(id)) == 0) {
			o += sprintf(o, "ID");
			m += strlen(id);
		} else {
			*o++ = *m++;
		}
	}
	return out;
}

static int guesser(void *arg)
{
	const char *const *a_ids = arg;
	int tried = 0, total = 0;

	for (int dev = 0; dev < daemon_.ndevices; dev++) {
		struct tl_conn c;
		struct tl_reply r;
		char own[64], other_msg[2][1024] = { "", "" };
		size_t n = 64 * 64 * 4;
		int fd = tl_memfd_open(n * 2);

		ASSERT_OK(tl_conn_open(&c, tl_daemon_worker_socket(&daemon_, dev)), "connect");
		ASSERT_EQ(tl_import_memfd(&c, dev, fd, n * 2, own, &r), 0, "B's own import failed: %s", r.error);
		tl_reply_finish(&r);
		int a_count = 0;
		for (int i = 0; a_ids[i]; i++)
			a_count++;
		for (int s = 1; s <= SERIALS + a_count; s++) {
			char id[64];
			bool a_owns = false;

			if (s <= SERIALS)
				snprintf(id, sizeof(id), "b%d.1.%d", dev, s);
			else
				snprintf(id, sizeof(id), "%s", a_ids[s - SERIALS - 1]);
			char prefix[16];
			snprintf(prefix, sizeof(prefix), "b%d.", dev);
			if (strncmp(id, prefix, strlen(prefix)) != 0)
				continue;   /* the other device's */
			if (strcmp(id, own) == 0)
				continue;
			for (int i = 0; a_ids[i]; i++)
				a_owns = a_owns || strcmp(a_ids[i], id) == 0;

			tl_call(&c, &r, 30, NULL, 0, "io.regen.Memory.CloseBuffer", "{\"buffer\":\"%s\"}", id);
			ASSERT_REPLY_ERROR(&r, "io.regen.NoSuchObject", "B's CloseBuffer %s -> %s", id,
			                   r.error ? r.error : "success");
			ASSERT_STR_EQ(tl_reply_str(&r, "id"), id, "NoSuchObject names another id");
			char *msg = masked_message(&r, id);
			/* The same words whether A owns the id or nobody does. */
			if (other_msg[a_owns][0] == '\0')
				snprintf(other_msg[a_owns], sizeof(other_msg[0]), "%s", msg);
			if (other_msg[!a_owns][0] != '\0')
				ASSERT_STR_EQ(msg, other_msg[!a_owns],
				              "the error tells A's ids from unused ones:\n  %s\n  %s", msg, other_msg[!a_owns]);
			free(msg);
			tl_reply_finish(&r);

			tl_call(&c, &r, 30, NULL, 0, "io.regen.Compute.Gemm",
				"{\"a\":{\"buffer\":\"%s\",\"dtype\":\"f32\",\"shape\":[4,4]},"
				"\"b\":{\"buffer\":\"%s\",\"dtype\":\"f32\",\"shape\":[4,4]},"
				"\"d\":{\"buffer\":\"%s\",\"offset\":%zu,\"dtype\":\"f32\",\"shape\":[4,4]}}",
				id, own, own, n);
			ASSERT_REPLY_ERROR(&r, "io.regen.NoSuchObject", "B's Gemm with a = %s -> %s", id,
			                   r.error ? r.error : "success");
			tl_reply_finish(&r);
			tl_call(&c, &r, 30, NULL, 0, "io.regen.Compute.Gemm",
				"{\"a\":{\"buffer\":\"%s\",\"dtype\":\"f32\",\"shape\":[4,4]},"
				"\"b\":{\"buffer\":\"%s\",\"dtype\":\"f32\",\"shape\":[4,4]},"
				"\"d\":{\"buffer\":\"%s\",\"dtype\":\"f32\",\"shape\":[4,4]}}",
				own, own, id);
			ASSERT_REPLY_ERROR(&r, "io.regen.NoSuchObject", "B's Gemm with d = %s -> %s", id,
			                   r.error ? r.error : "success");
			tl_reply_finish(&r);
			tried++;
			total++;
		}
		ASSERT(other_msg[1][0] != '\0', "none of A's ids was among those tried on device %d", dev);
		tl_log("device %d: %d guessed ids (A's %d among them), all NoSuchObject; A's read like unused ones: \"%s\"",
		       dev, tried, A_BUFFERS, other_msg[1]);
		tried = 0;
		tl_conn_close(&c);
		close(fd);
	}
	return total > 0 ? 0 : 1;
}

int main(void)
{
	struct tl_conn c[2];
	struct tl_reply r;
	char ids[2][A_BUFFERS][64];
	const char *all_ids[2 * A_BUFFERS + 1];
	size_t n = 4 * 4 * 4;
	int fds[2][A_BUFFERS], k = 0;

	tl_init(120);
	tl_daemon_start(&daemon_, NULL);
	for (int dev = 0; dev < 2; dev++) {
		ASSERT_OK(tl_conn_open(&c[dev], tl_daemon_worker_socket(&daemon_, dev)), "connect");
		for (int i = 0; i < A_BUFFERS; i++) {
			fds[dev][i] = tl_memfd_open(n * 3);
			ASSERT_EQ(tl_import_memfd(&c[dev], dev, fds[dev][i], n * 3, ids[dev][i], &r), 0, "A's import: %s",
				  r.error);
			tl_reply_finish(&r);
			all_ids[k++] = ids[dev][i];
		}
		tl_log("A (pid %d) owns %s .. %s on device %d", (int)getpid(), ids[dev][0], ids[dev][A_BUFFERS - 1], dev);
	}
	all_ids[k] = NULL;

	ASSERT_EQ(tl_wait(tl_fork(guesser, all_ids, 0), 100), 0, "the guessing process failed");

	/* A's buffers are all still there and still A's. */
	for (int dev = 0; dev < 2; dev++) {
		for (int i = 0; i < A_BUFFERS; i++) {
			float *p = mmap(NULL, n * 3, PROT_READ | PROT_WRITE, MAP_SHARED, fds[dev][i], 0);
			ASSERT(p != MAP_FAILED, "mmap");
			for (int j = 0; j < 16; j++) {
				p[j] = (float)(j % 4 == j / 4);   /* identity */
				p[16 + j] = (float)j;
			}
			tl_call_ok(&c[dev], &r, "io.regen.Compute.Gemm",
				   "{\"a\":{\"buffer\":\"%s\",\"dtype\":\"f32\",\"shape\":[4,4]},"
				   "\"b\":{\"buffer\":\"%s\",\"offset\":64,\"dtype\":\"f32\",\"shape\":[4,4]},"
				   "\"d\":{\"buffer\":\"%s\",\"offset\":128,\"dtype\":\"f32\",\"shape\":[4,4]}}",
				   ids[dev][i], ids[dev][i], ids[dev][i]);
			tl_reply_finish(&r);
			for (int j = 0; j < 16; j++)
				ASSERT(p[32 + j] == (float)j, "A's GEMM on %s after the guessing is wrong", ids[dev][i]);
			munmap(p, n * 3);
			tl_call_ok(&c[dev], &r, "io.regen.Memory.CloseBuffer", "{\"buffer\":\"%s\"}", ids[dev][i]);
			tl_reply_finish(&r);
		}
		tl_conn_close(&c[dev]);
	}
	tl_log("A's %d buffers survived the guessing and closed normally", 2 * A_BUFFERS);
	tl_log("PASS");
	return 0;
}
