/* SPDX-License-Identifier: Apache-2.0 */
/* Varlink messages: calls, replies and errors, parsed and built with cJSON. */
#pragma once

#include <stdarg.h>
#include <stdbool.h>
#include <stddef.h>
#include <cjson/cJSON.h>

#define RP_NESTING_MAX 32
#define RP_STRINGIFY_(x) #x
#define RP_STRINGIFY(x) RP_STRINGIFY_(x)

/* A named error with parameters, as it goes on the wire. `params` is owned
 * by the error (cJSON object). */
struct rp_error {
	const char *name;   /* static string, e.g. RP_ERR_INVALID_OPERAND; NULL = no error */
	cJSON *params;
};

/* Sets *err (freeing earlier params), params built from a printf message
 * stored under "message" plus the key/values given with rp_error_add_*.
 * Returns nothing: the Varlink error says what the client is told, the
 * caller's own -errno what C code does with it, and the two are kept apart. */
void rp_error_set(struct rp_error *err, const char *name, const char *fmt, ...)
	__attribute__((format(printf, 3, 4)));
/* As rp_error_set, with the message's arguments as a va_list. */
void rp_error_setv(struct rp_error *err, const char *name, const char *fmt, va_list ap)
	__attribute__((format(printf, 3, 0)));
/* Adds a parameter to an error already set. */
void rp_error_add_int(struct rp_error *err, const char *key, long long value);
void rp_error_add_str(struct rp_error *err, const char *key, const char *value);
/* org.varlink.service.InvalidParameter {parameter}: the standard error, no message. */
int rp_error_invalid_parameter(struct rp_error *err, const char *parameter);
void rp_error_clear(struct rp_error *err);
/* Moves src into dst (dst cleared first). */
void rp_error_move(struct rp_error *dst, struct rp_error *src);

/* A parsed incoming message: either a call (method != NULL) or a reply. */
struct rp_call {
	cJSON *root;            /* owns everything below */
	const char *method;     /* calls */
	cJSON *params;          /* object, never NULL after a successful parse (empty if absent) */
	bool oneway, more, upgrade;
	const char *error;      /* replies: error name or NULL */
	bool continues;         /* replies */
};

/* Why rp_call_parse refuses text before it parses it: not UTF-8, a
 * string holding \u0000 or an unpaired surrogate escape, nesting past
 * RP_NESTING_MAX. NULL when the text passes. */
const char *rp_text_refusal(const char *text, size_t len);

/* Parses one message's text. Rejects, with io.regen.InvalidMessage and a
 * reason: invalid JSON, not an object, nesting over RP_NESTING_MAX (checked
 * before cJSON sees the text), `method` not a string, `parameters` not an
 * object, unknown top-level keys, wrong types of the flags. */
int rp_call_parse(const char *text, size_t len, struct rp_call *call, struct rp_error *err);
void rp_call_finish(struct rp_call *call);

/* Builders. Each returns a malloc'ed NUL-terminated string (free()), or NULL
 * on ENOMEM. `params` may be NULL (sent as {}); it is not consumed. The text
 * is always UTF-8: bytes of a character cut in two (a peer's string cut to a
 * bounded buffer) are dropped. */
char *rp_build_call(const char *method, const cJSON *params, bool more, bool oneway);
char *rp_build_reply(const cJSON *params, bool continues);
char *rp_build_error(const struct rp_error *err);
