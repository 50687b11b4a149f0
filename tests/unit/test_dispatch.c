/* SPDX-License-Identifier: Apache-2.0 */
/* daemon/dispatch.c behind a real connection (conn_pair.h): a method table
 * of its own, with an admin method, a "more"-only method and a `find` hook
 * for methods another table names. Unknown interfaces and methods get
 * Varlink's named errors with only the parameters the spec gives them; a
 * non-admin is refused an admin method by name; a "more"-only method without
 * "more" is ExpectedMore; org.varlink.service is answered by dispatch
 * itself, for the interfaces this endpoint serves. */
#include <check.h>
#include <string.h>
#include "conn_pair.h"
#include "daemon/dispatch.h"
#include "regen-config.h"
#include "unit.h"

static struct conn_pair pair;
static int handled;
static char handled_method[128];

static void handler(struct rd_call *call)
{
	cJSON *reply = cJSON_CreateObject();

	handled++;
	snprintf(handled_method, sizeof(handled_method), "%s", call->msg.method);
	cJSON_AddStringToObject(reply, "handled", call->msg.method);
	rd_call_reply(call, reply, false);
}

/* Two replies: one that continues, one that ends the call. */
static void streamer(struct rd_call *call)
{
	cJSON *first = cJSON_CreateObject();

	handled++;
	cJSON_AddNumberToObject(first, "n", 1);
	rd_call_reply(call, first, true);
	handler(call);
	handled--;
}

static const struct rd_method methods[] = {
	{ "io.regen.Device.Status", handler, false, false },
	{ "io.regen.Device.Release", handler, true, false },
	{ "io.regen.Device.Watch", streamer, false, true },
	{ NULL },
};

static const char *const interfaces[] = { "io.regen.Device", NULL };

/* Claims two methods of the table as well: the table must win for them. */
static void (*find(const char *method))(struct rd_call *call)
{
	static const char *const claimed[] = { "io.regen.Compute.Gemm", "io.regen.Device.Release",
					       "io.regen.Device.Watch", NULL };

	for (int i = 0; claimed[i] != NULL; i++) {
		if (strcmp(method, claimed[i]) == 0) {
			return handler;
		}
	}
	return NULL;
}

/* Where the IDL serves a method another socket serves. */
static void elsewhere(struct rd_call *call)
{
	cJSON *reply = cJSON_CreateObject();

	handled++;
	snprintf(handled_method, sizeof(handled_method), "%s", call->msg.method);
	cJSON_AddStringToObject(reply, "elsewhere", call->msg.method);
	rd_call_reply(call, reply, false);
}

static const struct rd_endpoint endpoint = { .methods = methods, .interfaces = interfaces, .find = find };
static const struct rd_endpoint endpoint_without_find = { .methods = methods, .interfaces = interfaces };
static const struct rd_endpoint endpoint_with_elsewhere = {
	.methods = methods, .interfaces = interfaces, .find = find, .elsewhere = elsewhere
};
static const struct rd_endpoint *ep;

static void on_call(struct rd_conn *conn, struct rd_call *call)
{
	rd_dispatch(ep, call);
}

static void setup(void)
{
	handled = 0;
	handled_method[0] = '\0';
	ep = &endpoint;
	conn_pair_open(&pair, on_call, NULL);
}

static void teardown(void)
{
	conn_pair_close(&pair);
}

/* Sends a whole message's text and reads its one reply. */
static void roundtrip(const char *text, struct tl_reply *r)
{
	ck_assert_int_eq(tl_send_text(&pair.peer, text, NULL, 0), 0);
	ck_assert_int_eq(tl_recv(&pair.peer, r, 5), 0);
}

static void call(const char *method, const char *params, struct tl_reply *r)
{
	ck_assert_int_eq(tl_send(&pair.peer, method, NULL, 0, "%s", params ? params : "{}"), 0);
	ck_assert_int_eq(tl_recv(&pair.peer, r, 5), 0);
}

/* The error's parameters are exactly `params` (JSON text). */
static void expect_error(struct tl_reply *r, const char *name, const char *params)
{
	cJSON *want = cJSON_Parse(params);

	ck_assert_msg(r->error != NULL, "expected %s, got %s", name, tl_reply_describe(r));
	ck_assert_str_eq(r->error, name);
	ck_assert_msg(cJSON_Compare(r->params, want, true), "%s: parameters %s, want %s", name, tl_reply_text(r),
		      params);
	cJSON_Delete(want);
	tl_reply_finish(r);
}

START_TEST(a_method_of_the_table_reaches_its_handler)
{
	struct tl_reply r;

	call("io.regen.Device.Status", NULL, &r);
	ck_assert_msg(r.error == NULL, "%s", tl_reply_describe(&r));
	ck_assert_str_eq(tl_reply_str(&r, "handled"), "io.regen.Device.Status");
	tl_reply_finish(&r);
	ck_assert_int_eq(handled, 1);
}
END_TEST

START_TEST(an_unknown_method_of_a_served_interface_is_method_not_found)
{
	struct tl_reply r;

	call("io.regen.Device.Frobnicate", NULL, &r);
	expect_error(&r, "org.varlink.service.MethodNotFound", "{\"method\":\"io.regen.Device.Frobnicate\"}");
	ck_assert_int_eq(handled, 0);
}
END_TEST

START_TEST(an_interface_not_served_here_is_interface_not_found)
{
	struct tl_reply r;

	call("com.example.Nope.Call", NULL, &r);
	expect_error(&r, "org.varlink.service.InterfaceNotFound", "{\"interface\":\"com.example.Nope\"}");
	/* Known to regen, served elsewhere (a worker socket). */
	call("io.regen.Memory.ImportBuffer", NULL, &r);
	expect_error(&r, "org.varlink.service.InterfaceNotFound", "{\"interface\":\"io.regen.Memory\"}");
	/* No interface at all. */
	call("Status", NULL, &r);
	expect_error(&r, "org.varlink.service.InterfaceNotFound", "{\"interface\":\"Status\"}");
	/* An empty interface name is none. */
	call(".Status", NULL, &r);
	expect_error(&r, "org.varlink.service.InterfaceNotFound", "{\"interface\":\"\"}");
	ck_assert_int_eq(handled, 0);
}
END_TEST

START_TEST(an_admin_method_is_refused_to_a_non_admin_by_name)
{
	struct tl_reply r;

	pair.conn->admin = false;
	call("io.regen.Device.Release", NULL, &r);
	ck_assert_str_eq(r.error, "io.regen.NotPermitted");
	ck_assert_str_eq(tl_reply_str(&r, "method"), "io.regen.Device.Release");
	ck_assert_ptr_nonnull(strstr(tl_reply_str(&r, "message"), "admin"));
	tl_reply_finish(&r);
	ck_assert_int_eq(handled, 0);

	pair.conn->admin = true;
	call("io.regen.Device.Release", NULL, &r);
	ck_assert_msg(r.error == NULL, "%s", tl_reply_describe(&r));
	tl_reply_finish(&r);
	ck_assert_int_eq(handled, 1);
}
END_TEST

START_TEST(a_more_only_method_without_more_is_expected_more)
{
	struct tl_reply r;

	call("io.regen.Device.Watch", NULL, &r);
	expect_error(&r, "org.varlink.service.ExpectedMore", "{}");
	ck_assert_int_eq(handled, 0);

	roundtrip("{\"method\":\"io.regen.Device.Watch\",\"more\":true}", &r);
	ck_assert_msg(r.error == NULL && r.continues, "%s", tl_reply_describe(&r));
	ck_assert_int_eq(tl_reply_int(&r, "n"), 1);
	tl_reply_finish(&r);
	ck_assert_int_eq(tl_recv(&pair.peer, &r, 5), 0);
	ck_assert(!r.continues);
	ck_assert_str_eq(tl_reply_str(&r, "handled"), "io.regen.Device.Watch");
	tl_reply_finish(&r);
	ck_assert_int_eq(handled, 1);
}
END_TEST

START_TEST(get_info_names_the_served_interfaces)
{
	struct tl_reply r;
	const cJSON *ifaces;

	call("org.varlink.service.GetInfo", NULL, &r);
	ck_assert_msg(r.error == NULL, "%s", tl_reply_describe(&r));
	ck_assert_str_eq(tl_reply_str(&r, "vendor"), "regen");
	ck_assert_str_eq(tl_reply_str(&r, "product"), "regend");
	ck_assert_str_eq(tl_reply_str(&r, "version"), REGEN_VERSION);
	ck_assert_ptr_nonnull(tl_reply_str(&r, "url"));
	ifaces = cJSON_GetObjectItem(r.params, "interfaces");
	ck_assert_int_eq(cJSON_GetArraySize(ifaces), 2);
	ck_assert_str_eq(cJSON_GetArrayItem(ifaces, 0)->valuestring, "org.varlink.service");
	ck_assert_str_eq(cJSON_GetArrayItem(ifaces, 1)->valuestring, "io.regen.Device");
	tl_reply_finish(&r);

	call("org.varlink.service.GetInfo", "{\"bogus\":1}", &r);
	ck_assert_str_eq(r.error, "org.varlink.service.InvalidParameter");
	ck_assert_str_eq(tl_reply_str(&r, "parameter"), "bogus");
	tl_reply_finish(&r);
	ck_assert_int_eq(handled, 0);
}
END_TEST

START_TEST(get_interface_description_serves_what_this_endpoint_serves)
{
	static const char *const served[] = { "io.regen.Device", "org.varlink.service", "io.regen" };
	struct tl_reply r;
	char params[128];

	for (size_t i = 0; i < sizeof(served) / sizeof(served[0]); i++) {
		char first_line[160];

		snprintf(params, sizeof(params), "{\"interface\":\"%s\"}", served[i]);
		call("org.varlink.service.GetInterfaceDescription", params, &r);
		ck_assert_msg(r.error == NULL, "%s: %s", served[i], tl_reply_describe(&r));
		snprintf(first_line, sizeof(first_line), "interface %s\n", served[i]);
		ck_assert_msg(strstr(tl_reply_str(&r, "description"), first_line) != NULL,
			      "the description of %s does not declare it", served[i]);
		tl_reply_finish(&r);
	}
	call("org.varlink.service.GetInterfaceDescription", "{\"interface\":\"io.regen.Memory\"}", &r);
	expect_error(&r, "org.varlink.service.InterfaceNotFound", "{\"interface\":\"io.regen.Memory\"}");
	call("org.varlink.service.GetInterfaceDescription", "{\"interface\":\"com.example.Nope\"}", &r);
	expect_error(&r, "org.varlink.service.InterfaceNotFound", "{\"interface\":\"com.example.Nope\"}");
	call("org.varlink.service.GetInterfaceDescription", NULL, &r);
	ck_assert_str_eq(r.error, "org.varlink.service.InvalidParameter");
	ck_assert_str_eq(tl_reply_str(&r, "parameter"), "interface");
	tl_reply_finish(&r);
}
END_TEST

START_TEST(the_find_hook_serves_methods_of_another_table)
{
	struct tl_reply r;

	/* Not in the table, not in a served interface, no admin, no "more". */
	pair.conn->admin = false;
	call("io.regen.Compute.Gemm", NULL, &r);
	ck_assert_msg(r.error == NULL, "%s", tl_reply_describe(&r));
	ck_assert_str_eq(tl_reply_str(&r, "handled"), "io.regen.Compute.Gemm");
	tl_reply_finish(&r);
	ck_assert_int_eq(handled, 1);
	/* What the hook does not know falls through to the named errors. */
	call("io.regen.Compute.Convolve", NULL, &r);
	expect_error(&r, "org.varlink.service.InterfaceNotFound", "{\"interface\":\"io.regen.Compute\"}");
	/* Without the hook, the same method is unknown. */
	ep = &endpoint_without_find;
	call("io.regen.Compute.Gemm", NULL, &r);
	expect_error(&r, "org.varlink.service.InterfaceNotFound", "{\"interface\":\"io.regen.Compute\"}");
	ck_assert_int_eq(handled, 1);
}
END_TEST

START_TEST(a_table_method_wins_over_the_find_hook)
{
	struct tl_reply r;

	/* The hook claims Release and Watch too, but they are in the table:
	 * the table's admin and "more" rules hold. */
	pair.conn->admin = false;
	call("io.regen.Device.Release", NULL, &r);
	ck_assert_str_eq(r.error, "io.regen.NotPermitted");
	tl_reply_finish(&r);
	call("io.regen.Device.Watch", NULL, &r);
	expect_error(&r, "org.varlink.service.ExpectedMore", "{}");
	ck_assert_int_eq(handled, 0);
}
END_TEST

/* What the IDL declares for the other public socket goes to `elsewhere`
 * (the table and the hook first); what it declares for no socket a client
 * reaches, or does not declare, stays a named Varlink error. */
START_TEST(a_method_served_on_another_socket_goes_elsewhere)
{
	static const char *const other_socket[] = { "io.regen.Memory.ImportBuffer", "io.regen.Lane.Open",
						    "io.regen.Comm.Init", "io.regen.Program.Run" };
	struct tl_reply r;

	ep = &endpoint_with_elsewhere;
	pair.conn->admin = false;
	for (size_t i = 0; i < sizeof(other_socket) / sizeof(other_socket[0]); i++) {
		call(other_socket[i], NULL, &r);
		ck_assert_msg(r.error == NULL, "%s: %s", other_socket[i], tl_reply_describe(&r));
		ck_assert_str_eq(tl_reply_str(&r, "elsewhere"), other_socket[i]);
		tl_reply_finish(&r);
	}
	/* The hook claims Gemm: it wins. */
	call("io.regen.Compute.Gemm", NULL, &r);
	ck_assert_str_eq(tl_reply_str(&r, "handled"), "io.regen.Compute.Gemm");
	tl_reply_finish(&r);
	/* Not in the IDL. */
	call("io.regen.Memory.Frobnicate", NULL, &r);
	expect_error(&r, "org.varlink.service.InterfaceNotFound", "{\"interface\":\"io.regen.Memory\"}");
	/* The control channel's: no client reaches them anywhere. */
	call("io.regen.Worker.Drain", NULL, &r);
	expect_error(&r, "org.varlink.service.InterfaceNotFound", "{\"interface\":\"io.regen.Worker\"}");
	/* An interface served here: its unknown method is unknown, not elsewhere. */
	call("io.regen.Device.Frobnicate", NULL, &r);
	expect_error(&r, "org.varlink.service.MethodNotFound", "{\"method\":\"io.regen.Device.Frobnicate\"}");
	ck_assert_int_eq(handled, (int)(sizeof(other_socket) / sizeof(other_socket[0])) + 1);
}
END_TEST

int main(void)
{
	Suite *s = suite_create("dispatch");
	TCase *tc = tcase_create("endpoint");

	tcase_add_checked_fixture(tc, setup, teardown);
	tcase_add_test(tc, a_method_of_the_table_reaches_its_handler);
	tcase_add_test(tc, an_unknown_method_of_a_served_interface_is_method_not_found);
	tcase_add_test(tc, an_interface_not_served_here_is_interface_not_found);
	tcase_add_test(tc, an_admin_method_is_refused_to_a_non_admin_by_name);
	tcase_add_test(tc, a_more_only_method_without_more_is_expected_more);
	tcase_add_test(tc, get_info_names_the_served_interfaces);
	tcase_add_test(tc, get_interface_description_serves_what_this_endpoint_serves);
	tcase_add_test(tc, the_find_hook_serves_methods_of_another_table);
	tcase_add_test(tc, a_table_method_wins_over_the_find_hook);
	tcase_add_test(tc, a_method_served_on_another_socket_goes_elsewhere);
	suite_add_tcase(s, tc);
	return unit_run(s);
}
