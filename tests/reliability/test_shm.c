/* SPDX-License-Identifier: Apache-2.0 */
/* Shared memory never crashes a worker.
 *
 * The attack: import a memfd, shrink it with ftruncate, call Gemm on it;
 * the worker touches pages that are gone and dies of SIGBUS, and with it
 * every client of the device (in a loop: 9 crashes in 18 s). Now:
 * - an fd that can still shrink (no F_SEAL_SHRINK) is refused with
 *   io.regen.ImportFailed {kind: "host_fd"} naming the seal, and nothing
 *   is mapped;
 * - a sealed memfd cannot be shrunk by its owner after the import
 *   (ftruncate fails with EPERM), and computes as before;
 * - the worker is the same process throughout: no crash, no respawn, the
 *   generation unchanged, another client served.
 * (The worker also catches SIGBUS on client memory as a second line:
 * tests/unit/test_host_guard.c.) */
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#include "tests/lib/asserts.h"
#include "tests/lib/daemon.h"
#include "tests/lib/memfd.h"
#include "tests/lib/varlink.h"

#define N 32
#define BYTES (N * N * 4)

static struct tl_daemon daemon_;

int main(void)
{
	struct tl_conn m, c, other;
	struct tl_reply r;
	struct tl_device before, after;
	char a[64], d[64];
	int unsealed, sealed, out;

	tl_init(120);
	tl_daemon_start(&daemon_, NULL);
	ASSERT_OK(tl_conn_open(&m, daemon_.sock), "connect main");
	tl_device_status(&m, 0, &before);
	ASSERT_OK(tl_conn_open(&c, tl_daemon_worker_socket(&daemon_, 0)), "connect worker");

	unsealed = tl_memfd_open_unsealed(BYTES);
	ASSERT_LT(tl_import_memfd(&c, 0, unsealed, BYTES, a, &r), 0, "an fd that can shrink was imported");
	ASSERT_REPLY_ERROR(&r, "io.regen.ImportFailed");
	ASSERT_STR_EQ(tl_reply_str(&r, "kind"), "host_fd", "ImportFailed kind");
	ASSERT_STR_CONTAINS(tl_reply_str(&r, "message"), "F_SEAL_SHRINK", "the refusal does not name the fix");
	tl_reply_finish(&r);
	/* The attack goes on regardless: shrink it and name it. Nothing was
	 * mapped, so nothing can fault. */
	ASSERT_EQ(ftruncate(unsealed, 0), 0, "shrinking one's own unsealed memfd");

	sealed = tl_memfd_open(BYTES);
	out = tl_memfd_open(BYTES);
	ASSERT_EQ(tl_import_memfd(&c, 0, sealed, BYTES, a, &r), 0, "sealed import: %s", r.error);
	tl_reply_finish(&r);
	ASSERT_EQ(tl_import_memfd(&c, 0, out, BYTES, d, &r), 0, "sealed import: %s", r.error);
	tl_reply_finish(&r);
	ASSERT(ftruncate(sealed, 0) < 0 && errno == EPERM, "a sealed, imported memfd could be shrunk");
	for (int i = 0; i < 20; i++) {
		tl_call(&c, &r, 10, NULL, 0, "io.regen.Compute.Gemm",
			"{\"a\":{\"buffer\":\"%s\",\"dtype\":\"f32\",\"shape\":[%d,%d]},"
			"\"b\":{\"buffer\":\"%s\",\"dtype\":\"f32\",\"shape\":[%d,%d]},"
			"\"d\":{\"buffer\":\"%s\",\"dtype\":\"f32\",\"shape\":[%d,%d]}}",
			a, N, N, a, N, N, d, N, N);
		ASSERT_REPLY_OK(&r, "Gemm on sealed memory");
		tl_reply_finish(&r);
	}
	ASSERT_OK(tl_conn_open(&other, tl_daemon_worker_socket(&daemon_, 0)), "connect other");
	tl_call_ok(&other, &r, "io.regen.Device.Generation", NULL);
	tl_reply_finish(&r);
	tl_device_status(&m, 0, &after);
	ASSERT_EQ(after.worker_pid, before.worker_pid, "the worker changed");
	ASSERT_EQ(after.respawns, before.respawns, "the worker was respawned");
	ASSERT_EQ(after.generation, before.generation, "the generation changed");
	tl_log("unsealed memfd refused by name; a sealed one cannot shrink; worker %lld served throughout (generation %lld)",
	       (long long)after.worker_pid, (long long)after.generation);
	tl_conn_close(&other);
	tl_conn_close(&c);
	tl_conn_close(&m);
	return 0;
}
