/* SPDX-License-Identifier: Apache-2.0 */
/* Shared by the libFuzzer targets: invariant checks that abort (a crash to
 * libFuzzer) with a message saying which rule broke. */
#pragma once

#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <cjson/cJSON.h>

#include "proto/errors.h"
#include "proto/message.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

#define FZ_CHECK(cond, ...) \
	do { \
		if (!(cond)) { \
			fprintf(stderr, "%s:%d: invariant broken: %s: ", __FILE__, __LINE__, #cond); \
			fprintf(stderr, __VA_ARGS__); \
			fputc('\n', stderr); \
			abort(); \
		} \
	} while (0)

/* A refused input must come with a named error that a client can be sent:
 * it builds into a Varlink error reply, which parses back with the same name. */
static inline void fz_check_error(int r, struct rp_error *err, const char *where)
{
	struct rp_error perr = { 0 };
	struct rp_call reply;
	char *text;

	FZ_CHECK(r < 0, "%s: error check on a success", where);
	FZ_CHECK(err->name != NULL, "%s: refused (%d) without naming an error", where, r);
	FZ_CHECK(err->params == NULL || cJSON_IsObject(err->params), "%s: %s params not an object", where, err->name);
	text = rp_build_error(err);
	FZ_CHECK(text != NULL, "%s: cannot build error %s", where, err->name);
	FZ_CHECK(rp_call_parse(text, strlen(text), &reply, &perr) == 0, "%s: built error does not parse: %s", where, text);
	FZ_CHECK(reply.method == NULL && reply.error != NULL && strcmp(reply.error, err->name) == 0,
		 "%s: error %s came back as %s", where, err->name, reply.error ? reply.error : "(none)");
	rp_call_finish(&reply);
	rp_error_clear(&perr);
	free(text);
}

/* Parses fuzz bytes as JSON, if the daemon's message parser would let
 * them through to cJSON at all (no NUL, UTF-8, no \u0000, bounded
 * nesting). NULL otherwise. */
static inline cJSON *fz_json(const uint8_t *data, size_t size)
{
	if (size == 0 || memchr(data, '\0', size) != NULL || rp_text_refusal((const char *)data, size) != NULL)
		return NULL;
	return cJSON_ParseWithLength((const char *)data, size);
}
