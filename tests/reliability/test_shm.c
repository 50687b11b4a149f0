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

#include "rtest.h"

#define N 32
#define BYTES (N * N * 4)

static struct rt_daemon daemon_;

int main(void)
{
	struct rt_conn m, c, other;
	struct rt_reply r;
	struct rt_device before, after;
	char a[64], d[64];
	int unsealed, sealed, out;

	rt_daemon_start(&daemon_, NULL, 120);
	RT_CHECK(rt_connect(&m, daemon_.sock) == 0, "connect main");
	rt_status(&m, 0, &before);
	RT_CHECK(rt_connect(&c, rt_worker_socket(&daemon_, 0)) == 0, "connect worker");

	unsealed = rt_memfd_unsealed(BYTES);
	RT_CHECK(rt_import(&c, 0, unsealed, BYTES, a, &r) < 0, "an fd that can shrink was imported");
	RT_CHECK(strcmp(r.error, "io.regen.ImportFailed") == 0, "got %s, expected ImportFailed", r.error);
	RT_CHECK(rt_reply_str(&r, "kind") && strcmp(rt_reply_str(&r, "kind"), "host_fd") == 0, "ImportFailed kind");
	RT_CHECK(strstr(rt_reply_str(&r, "message"), "F_SEAL_SHRINK") != NULL, "the refusal does not name the fix: %s",
		 rt_reply_str(&r, "message"));
	rt_reply_finish(&r);
	/* The attack goes on regardless: shrink it and name it. Nothing was
	 * mapped, so nothing can fault. */
	RT_CHECK(ftruncate(unsealed, 0) == 0, "shrinking one's own unsealed memfd");

	sealed = rt_memfd(BYTES);
	out = rt_memfd(BYTES);
	RT_CHECK(rt_import(&c, 0, sealed, BYTES, a, &r) == 0, "sealed import: %s", r.error);
	rt_reply_finish(&r);
	RT_CHECK(rt_import(&c, 0, out, BYTES, d, &r) == 0, "sealed import: %s", r.error);
	rt_reply_finish(&r);
	RT_CHECK(ftruncate(sealed, 0) < 0 && errno == EPERM, "a sealed, imported memfd could be shrunk");
	for (int i = 0; i < 20; i++) {
		rt_call(&c, &r, 10, NULL, 0, "io.regen.Compute.Gemm",
			"{\"a\":{\"buffer\":\"%s\",\"dtype\":\"f32\",\"shape\":[%d,%d]},"
			"\"b\":{\"buffer\":\"%s\",\"dtype\":\"f32\",\"shape\":[%d,%d]},"
			"\"d\":{\"buffer\":\"%s\",\"dtype\":\"f32\",\"shape\":[%d,%d]}}",
			a, N, N, a, N, N, d, N, N);
		RT_CHECK(!r.error, "Gemm on sealed memory: %s", r.error);
		rt_reply_finish(&r);
	}
	RT_CHECK(rt_connect(&other, rt_worker_socket(&daemon_, 0)) == 0, "connect other");
	rt_call_ok(&other, &r, "io.regen.Device.Generation", NULL);
	rt_reply_finish(&r);
	rt_status(&m, 0, &after);
	RT_CHECK(after.worker_pid == before.worker_pid && after.respawns == before.respawns &&
		 after.generation == before.generation,
		 "the worker changed: pid %lld -> %lld, respawns %lld -> %lld, generation %lld -> %lld",
		 (long long)before.worker_pid, (long long)after.worker_pid, (long long)before.respawns,
		 (long long)after.respawns, (long long)before.generation, (long long)after.generation);
	rt_log("unsealed memfd refused by name; a sealed one cannot shrink; worker %lld served throughout (generation %lld)",
	       (long long)after.worker_pid, (long long)after.generation);
	return 0;
}
