/* SPDX-License-Identifier: Apache-2.0 */
#include <stdlib.h>
#include <string.h>
#include "daemon/dispatch.h"
#include "proto/errors.h"
#include "proto/idl.h"
#include "proto/params.h"
#include "regen-config.h"

static bool serves_interface(const struct rd_endpoint *ep, const char *iface, size_t len)
{
	for (const char *const *i = ep->interfaces; *i; i++)
		if (strlen(*i) == len && strncmp(*i, iface, len) == 0)
			return true;
	return false;
}

/* A method of the IDL's in an interface that a public socket serves and
 * this endpoint does not. */
static bool served_elsewhere(const struct rd_endpoint *ep, const char *method)
{
	const struct rp_interface *iface = rp_method_interface(method);

	return iface && (iface->served & (RP_SERVED_MAIN | RP_SERVED_WORKER)) &&
	       !serves_interface(ep, iface->name, strlen(iface->name));
}

static void get_info(const struct rd_endpoint *ep, struct rd_call *call)
{
	static const struct rp_field fields[] = { { NULL } };
	struct rp_error err = { 0 };
	cJSON *reply, *ifaces;

	if (rp_params_check(call->msg.params, fields, &err) < 0) {
		rd_call_fail(call, &err);
		return;
	}
	reply = cJSON_CreateObject();
	cJSON_AddStringToObject(reply, "vendor", "regen");
	cJSON_AddStringToObject(reply, "product", "regend");
	cJSON_AddStringToObject(reply, "version", REGEN_VERSION);
	cJSON_AddStringToObject(reply, "url", "https://github.com/regen-project/regen");
	ifaces = cJSON_AddArrayToObject(reply, "interfaces");
	cJSON_AddItemToArray(ifaces, cJSON_CreateString("org.varlink.service"));
	for (const char *const *i = ep->interfaces; *i; i++)
		cJSON_AddItemToArray(ifaces, cJSON_CreateString(*i));
	rd_call_reply(call, reply, false);
}

static void get_interface_description(const struct rd_endpoint *ep, struct rd_call *call)
{
	static const struct rp_field fields[] = { { "interface", RP_T_STRING, true }, { NULL } };
	struct rp_error err = { 0 };
	const char *name, *text;

	if (rp_params_check(call->msg.params, fields, &err) < 0 ||
	    rp_params_string(call->msg.params, "interface", 256, NULL, &name, &err) < 0) {
		rd_call_fail(call, &err);
		return;
	}
	text = rp_interface_description(name);
	if (!text || (strcmp(name, "org.varlink.service") != 0 && strcmp(name, "io.regen") != 0 &&
		      !serves_interface(ep, name, strlen(name)))) {
		rp_error_set(&err, RP_ERR_INTERFACE_NOT_FOUND, "no interface %s here", name);
		cJSON_DeleteItemFromObject(err.params, "message");
		rp_error_add_str(&err, "interface", name);
		rd_call_fail(call, &err);
		return;
	}
	cJSON *reply = cJSON_CreateObject();
	cJSON_AddStringToObject(reply, "description", text);
	rd_call_reply(call, reply, false);
}

/* Varlink's own errors carry only the parameters the spec gives them. */
static void fail_varlink(struct rd_call *call, const char *name, const char *key, const char *value)
{
	struct rp_error err = { 0 };

	rp_error_set(&err, name, "%s", "");
	cJSON_DeleteItemFromObject(err.params, "message");
	if (key)
		rp_error_add_str(&err, key, value);
	rd_call_fail(call, &err);
}

void rd_dispatch(const struct rd_endpoint *ep, struct rd_call *call)
{
	const char *method = call->msg.method;
	const char *dot = strrchr(method, '.');
	const struct rd_method *m;

	for (m = ep->methods; m->name && strcmp(m->name, method) != 0; m++)
		;
	if (!m->name || !m->takes_fds)
		rd_call_close_fds(call);

	if (strcmp(method, "org.varlink.service.GetInfo") == 0) {
		get_info(ep, call);
		return;
	}
	if (strcmp(method, "org.varlink.service.GetInterfaceDescription") == 0) {
		get_interface_description(ep, call);
		return;
	}
	if (m->name) {
		if (m->admin && !call->conn->admin) {
			struct rp_error err = { 0 };
			rp_error_set(&err, RP_ERR_NOT_PERMITTED,
				     "%s is for root and the admin group; uid %u is neither", method,
				     (unsigned)call->conn->peer.uid);
			rp_error_add_str(&err, "method", method);
			rd_call_fail(call, &err);
			return;
		}
		if (m->needs_more && !call->msg.more) {
			fail_varlink(call, RP_ERR_EXPECTED_MORE, NULL, NULL);
			return;
		}
		m->fn(call);
		return;
	}
	void (*fn)(struct rd_call *) = ep->find ? ep->find(method) : NULL;
	if (fn) {
		fn(call);
		return;
	}
	if (ep->elsewhere && served_elsewhere(ep, method)) {
		ep->elsewhere(call);
		return;
	}
	if (!dot || dot == method || !serves_interface(ep, method, (size_t)(dot - method))) {
		char iface[256];
		size_t len = dot ? (size_t)(dot - method) : strlen(method);
		snprintf(iface, sizeof(iface), "%.*s", (int)len, method);
		fail_varlink(call, RP_ERR_INTERFACE_NOT_FOUND, "interface", iface);
		return;
	}
	fail_varlink(call, RP_ERR_METHOD_NOT_FOUND, "method", method);
}
