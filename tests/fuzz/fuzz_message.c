/* SPDX-License-Identifier: Apache-2.0 */
/* Message parsing: any bytes as one message's text through rp_call_parse,
 * as the daemon and libregen see them after framing. A call or reply that
 * parses is rebuilt with the builders and must parse back the same; every
 * string in its parameters goes through rp_id_parse, whose accepted ids must
 * format back to the same text. */
#include "fuzz_common.h"
#include "proto/ids.h"

static void check_ids(const cJSON *item, int depth)
{
	const cJSON *child;

	if (depth > RP_NESTING_MAX + 1)
		return;
	if (cJSON_IsString(item)) {
		struct rp_id id;
		char buf[RP_ID_MAX];

		if (rp_id_parse(item->valuestring, &id) == 0) {
			FZ_CHECK(strcmp(rp_id_format(&id, buf), item->valuestring) == 0, "id %s formats as %s",
				 item->valuestring, buf);
			/* Generations start at 1; a program's id says 0 (ids.h). */
			FZ_CHECK((id.generation == 0) == (id.kind == RP_ID_PROGRAM), "id %s with generation %llu",
				 item->valuestring, (unsigned long long)id.generation);
		}
	}
	cJSON_ArrayForEach(child, item)
		check_ids(child, depth + 1);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
	struct rp_error err = { 0 };
	struct rp_call call, again;
	char *text;
	int r;

	r = rp_call_parse((const char *)data, size, &call, &err);
	if (r < 0) {
		fz_check_error(r, &err, "rp_call_parse");
		FZ_CHECK(call.root == NULL && call.method == NULL, "refused call left state behind");
		rp_error_clear(&err);
		return 0;
	}
	FZ_CHECK(err.name == NULL && call.root != NULL && cJSON_IsObject(call.params), "bad success state");
	FZ_CHECK(!(call.method && call.error), "a call with an error");
	FZ_CHECK(!(call.oneway && call.more), "oneway and more both set");
	check_ids(call.params, 0);

	if (call.method != NULL) {
		text = rp_build_call(call.method, call.params, call.more, call.oneway);
	} else if (call.error != NULL) {
		struct rp_error e = { .name = call.error, .params = call.params };

		text = rp_build_error(&e);
	} else {
		text = rp_build_reply(call.params, call.continues);
	}
	FZ_CHECK(text != NULL, "cannot rebuild");
	r = rp_call_parse(text, strlen(text), &again, &err);
	FZ_CHECK(r == 0, "rebuilt message does not parse: %s", text);
	FZ_CHECK((call.method == NULL) == (again.method == NULL) &&
		 (call.method == NULL || strcmp(call.method, again.method) == 0), "method changed: %s", text);
	FZ_CHECK((call.error == NULL) == (again.error == NULL) &&
		 (call.error == NULL || strcmp(call.error, again.error) == 0), "error changed: %s", text);
	/* Not cJSON_Compare: infinities print as null, by cJSON's design. */
	FZ_CHECK(cJSON_GetArraySize(call.params) == cJSON_GetArraySize(again.params), "parameters lost keys: %s", text);
	rp_call_finish(&again);
	free(text);
	rp_call_finish(&call);
	return 0;
}
