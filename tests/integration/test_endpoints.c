/* SPDX-License-Identifier: Apache-2.0 */
/* Each socket says where a method it does not serve is served, for every
 * method the IDL declares: on the main socket, every method of an
 * interface served on the worker sockets (Memory, Compute, Lane, Comm,
 * Program) is io.regen.WrongEndpoint naming the method and device 0's
 * worker socket (or the device a call names); on a worker socket, every
 * method of io.regen.Device but Generation (which a worker answers) is
 * io.regen.WrongEndpoint naming the main socket. The lists come from the
 * IDL (proto/embed_idl.py), so an interface or a method added there is
 * routed, and tested here, without a hand list. */
#include <stdio.h>
#include <string.h>
#include "proto/idl.h"
#include "tests/lib/client.h"
#include "tests/lib/varlink.h"

static struct tl_daemon daemon_;

static void expect_wrong_endpoint(struct tl_conn *conn, const char *method, const char *params, const char *socket)
{
	struct tl_reply r;

	tl_call(conn, &r, 10, NULL, 0, method, "%s", params);
	ASSERT_REPLY_ERROR(&r, "io.regen.WrongEndpoint", "%s", method);
	ASSERT_STR_EQ(tl_reply_str(&r, "method"), method);
	ASSERT_STR_EQ(tl_reply_str(&r, "socket"), socket, "%s", method);
	ASSERT_STR_CONTAINS(tl_reply_str(&r, "message"), socket, "%s: the message says where", method);
	tl_reply_finish(&r);
}

int main(void)
{
	struct tl_conn main_conn, worker_conn;
	char worker0[256], worker1[256];
	unsigned to_worker = 0, to_main = 0;
	regen_client *c;
	regen_status *st;

	tl_init(60);
	tl_daemon_start(&daemon_, NULL);
	c = tl_client_connect(&daemon_);
	st = tl_status(c);
	snprintf(worker0, sizeof(worker0), "%s", tl_status_device(st, 0)->worker_socket);
	snprintf(worker1, sizeof(worker1), "%s", tl_status_device(st, 1)->worker_socket);
	regen_status_free(st);
	ASSERT_OK(tl_conn_open(&main_conn, daemon_.sock), "connect %s", daemon_.sock);
	ASSERT_OK(tl_conn_open(&worker_conn, worker0), "connect %s", worker0);

	for (size_t i = 0; i < rp_interfaces_count; i++) {
		const struct rp_interface *iface = &rp_interfaces[i];

		for (const char *const *m = iface->methods; *m; m++) {
			if ((iface->served & RP_SERVED_WORKER) && !(iface->served & RP_SERVED_MAIN)) {
				expect_wrong_endpoint(&main_conn, *m, "{}", worker0);
				to_worker++;
			} else if ((iface->served & RP_SERVED_MAIN) && !(iface->served & RP_SERVED_WORKER) &&
				   strcmp(*m, "io.regen.Device.Generation") != 0) {
				expect_wrong_endpoint(&worker_conn, *m, "{}", daemon_.sock);
				to_main++;
			}
		}
	}
	/* A call that names its device is pointed at that device's worker. */
	expect_wrong_endpoint(&main_conn, "io.regen.Memory.ImportEvent", "{\"device\":1,\"handle\":\"00\"}", worker1);
	tl_log("%u methods pointed at the worker socket, %u at the main socket", to_worker, to_main);
	/* Memory 4, Compute 5, Lane 2, Comm 9, Program 4; Device's 9 but Generation. */
	ASSERT_UINT_GE(to_worker, 24);
	ASSERT_UINT_GE(to_main, 8);

	/* Both connections still serve. */
	struct tl_reply r;
	tl_call_ok(&main_conn, &r, "io.regen.Device.Generation", NULL);
	tl_reply_finish(&r);
	tl_call_ok(&worker_conn, &r, "io.regen.Device.Generation", NULL);
	tl_reply_finish(&r);
	tl_conn_close(&main_conn);
	tl_conn_close(&worker_conn);
	regen_client_destroy(c);
	ASSERT(tl_daemon_alive(&daemon_), "regend died");
	tl_log("PASS");
	return 0;
}
