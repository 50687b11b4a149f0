/* SPDX-License-Identifier: Apache-2.0 */
/* Varlink messages: parsing calls and replies, building them, and the
 * errors that go on the wire. */
#include <errno.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "errors.h"
#include "message.h"

void rp_error_clear(struct rp_error *err)
{
	if (err == NULL)
		return;
	cJSON_Delete(err->params);
	err->name = NULL;
	err->params = NULL;
}

void rp_error_move(struct rp_error *dst, struct rp_error *src)
{
	if (dst == src)
		return;
	rp_error_clear(dst);
	*dst = *src;
	src->name = NULL;
	src->params = NULL;
}

void rp_error_setv(struct rp_error *err, const char *name, const char *fmt, va_list ap)
{
	char *text = NULL;
	int n;

	if (err == NULL)
		return;
	rp_error_clear(err);
	err->name = name;
	err->params = cJSON_CreateObject();
	n = vasprintf(&text, fmt, ap);
	/* Out of memory here still leaves a named error to send. */
	if (n >= 0 && err->params != NULL)
		cJSON_AddStringToObject(err->params, "message", text);
	if (n >= 0)
		free(text);
}

void rp_error_set(struct rp_error *err, const char *name, const char *fmt, ...)
{
	va_list ap;

	va_start(ap, fmt);
	rp_error_setv(err, name, fmt, ap);
	va_end(ap);
}

/* Sets key to item, replacing an earlier value: a key appears once. */
static void error_put(struct rp_error *err, const char *key, cJSON *item)
{
	if (item == NULL)
		return;
	if (err == NULL || err->name == NULL || key == NULL) {
		cJSON_Delete(item);
		return;
	}
	if (err->params == NULL)
		err->params = cJSON_CreateObject();
	if (err->params == NULL) {
		cJSON_Delete(item);
		return;
	}
	if (cJSON_GetObjectItemCaseSensitive(err->params, key) != NULL)
		cJSON_ReplaceItemInObjectCaseSensitive(err->params, key, item);
	else
		cJSON_AddItemToObject(err->params, key, item);
}

void rp_error_add_int(struct rp_error *err, const char *key, long long value)
{
	error_put(err, key, cJSON_CreateNumber((double)value));
}

void rp_error_add_str(struct rp_error *err, const char *key, const char *value)
{
	error_put(err, key, cJSON_CreateString(value != NULL ? value : ""));
}

int rp_error_invalid_parameter(struct rp_error *err, const char *parameter)
{
	if (err == NULL)
		return -EINVAL;
	rp_error_clear(err);
	err->name = RP_ERR_INVALID_PARAMETER;
	err->params = cJSON_CreateObject();
	if (err->params != NULL)
		cJSON_AddStringToObject(err->params, "parameter", parameter != NULL ? parameter : "");
	return -EINVAL;
}

static int invalid_message(struct rp_error *err, const char *fmt, ...) __attribute__((format(printf, 2, 3)));

/* io.regen.InvalidMessage {reason, message}: the reason alone, and the
 * same in a sentence that says what was refused. */
static int invalid_message(struct rp_error *err, const char *fmt, ...)
{
	char *reason = NULL;
	va_list ap;
	int n;

	va_start(ap, fmt);
	n = vasprintf(&reason, fmt, ap);
	va_end(ap);
	if (n < 0)
		reason = NULL;
	rp_error_set(err, RP_ERR_INVALID_MESSAGE, "Invalid Varlink message: %s",
		     reason != NULL ? reason : "out of memory");
	rp_error_add_str(err, "reason", reason != NULL ? reason : "out of memory");
	free(reason);
	return -EINVAL;
}

/* Length of the UTF-8 sequence at s (at most n bytes), or 0 when it is not
 * one: no overlong forms, no encoded surrogates, nothing past U+10FFFF. */
static size_t utf8_sequence(const unsigned char *s, size_t n)
{
	unsigned c = s[0];
	size_t len;
	unsigned cp;

	if (c < 0x80)
		return 1;
	if (c >= 0xc2 && c <= 0xdf) {
		len = 2;
		cp = c & 0x1f;
	} else if (c >= 0xe0 && c <= 0xef) {
		len = 3;
		cp = c & 0x0f;
	} else if (c >= 0xf0 && c <= 0xf4) {
		len = 4;
		cp = c & 0x07;
	} else {
		return 0;
	}
	if (n < len)
		return 0;
	for (size_t i = 1; i < len; i++) {
		if ((s[i] & 0xc0) != 0x80)
			return 0;
		cp = (cp << 6) | (s[i] & 0x3f);
	}
	if ((len == 3 && (cp < 0x800 || (cp >= 0xd800 && cp <= 0xdfff))) || (len == 4 && (cp < 0x10000 || cp > 0x10ffff)))
		return 0;
	return len;
}

static int hex4(const char *s)
{
	int v = 0;

	for (int i = 0; i < 4; i++) {
		char c = s[i];
		int d = c >= '0' && c <= '9' ? c - '0' : c >= 'a' && c <= 'f' ? c - 'a' + 10 : c >= 'A' && c <= 'F' ? c - 'A' + 10 : -1;
		if (d < 0)
			return -1;
		v = v * 16 + d;
	}
	return v;
}

/* What cJSON is never shown: text that is not UTF-8 (it would come back raw
 * in an error, and no peer could decode the reply), strings holding
 * \u0000 (cJSON would end the C string there: "Generation\u0000junk" would
 * read as "Generation"), unpaired surrogate escapes, and nesting deeper
 * than the limit (cJSON's parser recurses). NULL when the text is fine,
 * else why not. */
const char *rp_text_refusal(const char *text, size_t n)
{
	const unsigned char *s = (const unsigned char *)text;
	bool in_string = false;
	int depth = 0;

	for (size_t i = 0; i < n; i++) {
		/* ASCII, nearly every byte of a message, without a call. */
		size_t len = s[i] < 0x80 ? 1 : utf8_sequence(s + i, n - i);

		if (len == 0)
			return "not valid UTF-8";
		if (len > 1) {
			i += len - 1;
			continue;
		}
		if (in_string) {
			if (s[i] == '"') {
				in_string = false;
			} else if (s[i] == '\\' && i + 1 < n) {
				i++;
				if (s[i] != 'u')
					continue;
				int u = i + 4 < n ? hex4(text + i + 1) : -1;
				if (u == 0)
					return "a string holds \\u0000";
				if (u >= 0xdc00 && u <= 0xdfff)
					return "a string holds an unpaired surrogate escape";
				if (u >= 0xd800 && u <= 0xdbff) {
					int lo = i + 10 < n && s[i + 5] == '\\' && s[i + 6] == 'u' ? hex4(text + i + 7) : -1;
					if (lo < 0xdc00 || lo > 0xdfff)
						return "a string holds an unpaired surrogate escape";
					i += 6;
				}
				if (u >= 0)
					i += 4;
			}
		} else if (s[i] == '"') {
			in_string = true;
		} else if (s[i] == '[' || s[i] == '{') {
			if (++depth > RP_NESTING_MAX)
				return "nested deeper than " RP_STRINGIFY(RP_NESTING_MAX) " levels";
		} else if ((s[i] == ']' || s[i] == '}') && depth > 0) {
			depth--;
		}
	}
	return NULL;
}

static bool is_space(char c)
{
	return c == ' ' || c == '\t' || c == '\n' || c == '\r';
}

enum {
	KEY_METHOD = 1 << 0,
	KEY_PARAMETERS = 1 << 1,
	KEY_ONEWAY = 1 << 2,
	KEY_MORE = 1 << 3,
	KEY_UPGRADE = 1 << 4,
	KEY_CONTINUES = 1 << 5,
	KEY_ERROR = 1 << 6,
};

static const struct {
	const char *name;
	unsigned bit;
} keys[] = {
	{ "method", KEY_METHOD },
	{ "parameters", KEY_PARAMETERS },
	{ "oneway", KEY_ONEWAY },
	{ "more", KEY_MORE },
	{ "upgrade", KEY_UPGRADE },
	{ "continues", KEY_CONTINUES },
	{ "error", KEY_ERROR },
};

static int parse_bool(const cJSON *item, bool *out, struct rp_error *err)
{
	if (!cJSON_IsBool(item))
		return invalid_message(err, "'%s' must be a boolean", item->string);
	*out = cJSON_IsTrue(item);
	return 0;
}

int rp_call_parse(const char *text, size_t len, struct rp_call *call, struct rp_error *err)
{
	const char *end = NULL, *refusal;
	unsigned seen = 0;
	cJSON *root, *item;
	int r;

	memset(call, 0, sizeof(*call));
	if (text == NULL || len == 0)
		return invalid_message(err, "empty message");
	if (memchr(text, '\0', len) != NULL)
		return invalid_message(err, "contains a NUL byte");
	refusal = rp_text_refusal(text, len);
	if (refusal != NULL)
		return invalid_message(err, "%s", refusal);

	root = cJSON_ParseWithLengthOpts(text, len, &end, 0);
	if (root == NULL) {
		size_t at = end != NULL && end >= text && end <= text + len ? (size_t)(end - text) : 0;
		return invalid_message(err, "not valid JSON (error at byte %zu)", at);
	}
	while (end < text + len && is_space(*end))
		end++;
	if (end != text + len) {
		r = invalid_message(err, "trailing data after the JSON value at byte %zu", (size_t)(end - text));
		goto error;
	}
	if (!cJSON_IsObject(root)) {
		r = invalid_message(err, "not a JSON object");
		goto error;
	}

	cJSON_ArrayForEach(item, root) {
		unsigned bit = 0;

		r = 0;
		for (size_t i = 0; i < sizeof(keys) / sizeof(keys[0]); i++) {
			if (strcmp(item->string, keys[i].name) == 0) {
				bit = keys[i].bit;
				break;
			}
		}
		if (bit == 0) {
			r = invalid_message(err, "unknown key '%s'", item->string);
			goto error;
		}
		if (seen & bit) {
			r = invalid_message(err, "duplicate key '%s'", item->string);
			goto error;
		}
		seen |= bit;

		switch (bit) {
		case KEY_METHOD:
		case KEY_ERROR:
			if (!cJSON_IsString(item) || item->valuestring[0] == '\0') {
				r = invalid_message(err, "'%s' must be a non-empty string", item->string);
				goto error;
			}
			if (bit == KEY_METHOD)
				call->method = item->valuestring;
			else
				call->error = item->valuestring;
			break;
		case KEY_PARAMETERS:
			/* null is how some implementations (Debian's Go varlink)
			 * say "no parameters". */
			if (cJSON_IsNull(item))
				break;
			if (!cJSON_IsObject(item)) {
				r = invalid_message(err, "'parameters' must be an object");
				goto error;
			}
			call->params = item;
			break;
		case KEY_ONEWAY:
			r = parse_bool(item, &call->oneway, err);
			break;
		case KEY_MORE:
			r = parse_bool(item, &call->more, err);
			break;
		case KEY_UPGRADE:
			r = parse_bool(item, &call->upgrade, err);
			break;
		case KEY_CONTINUES:
			r = parse_bool(item, &call->continues, err);
			break;
		}
		if (r < 0)
			goto error;
	}

	if (seen & KEY_METHOD) {
		if (seen & (KEY_CONTINUES | KEY_ERROR)) {
			r = invalid_message(err, "'%s' belongs in a reply, not in a call",
					    (seen & KEY_ERROR) ? "error" : "continues");
			goto error;
		}
		if (call->oneway && call->more) {
			r = invalid_message(err, "'oneway' and 'more' cannot both be set");
			goto error;
		}
	} else if (seen & (KEY_ONEWAY | KEY_MORE | KEY_UPGRADE)) {
		r = invalid_message(err, "missing 'method'");
		goto error;
	}

	if (call->params == NULL) {
		cJSON_DeleteItemFromObjectCaseSensitive(root, "parameters");
		call->params = cJSON_AddObjectToObject(root, "parameters");
		if (call->params == NULL) {
			r = -ENOMEM;
			rp_error_set(err, RP_ERR_OUT_OF_MEMORY, "out of memory parsing a message");
			goto error;
		}
	}
	call->root = root;
	return 0;

error:
	cJSON_Delete(root);
	memset(call, 0, sizeof(*call));
	return r;
}

void rp_call_finish(struct rp_call *call)
{
	if (call == NULL)
		return;
	cJSON_Delete(call->root);
	memset(call, 0, sizeof(*call));
}

/* Adds params without copying: a reference is printed like the object and
 * not freed with root. */
static bool add_params(cJSON *root, const cJSON *params)
{
	if (params == NULL)
		return cJSON_AddObjectToObject(root, "parameters") != NULL;
	return cJSON_AddItemReferenceToObject(root, "parameters", (cJSON *)params);
}

/* Drops, in place, every byte of text that does not belong to a UTF-8
 * character. Strings a peer sent are cut to bounded buffers on their way
 * into errors and reasons ("%.80s", a 120-byte reason in a 128-byte one),
 * which may cut a character in two; cJSON writes such bytes as they are,
 * and no peer could decode a message holding half a character. Only
 * string contents can be affected: JSON's own syntax is ASCII. */
static char *keep_utf8(char *text)
{
	const unsigned char *s = (const unsigned char *)text;
	size_t n, r = 0, w;

	if (text == NULL)
		return NULL;
	n = strlen(text);
	/* Every reply passes here and nearly all are whole: nothing moves
	 * before the first byte dropped, and ASCII needs no call. */
	while (r < n) {
		size_t len = s[r] < 0x80 ? 1 : utf8_sequence(s + r, n - r);
		if (len == 0)
			break;
		r += len;
	}
	if (r == n)
		return text;
	w = r;
	while (r < n) {
		size_t len = utf8_sequence(s + r, n - r);
		if (len == 0) {
			r++;
			continue;
		}
		memmove(text + w, text + r, len);
		w += len;
		r += len;
	}
	text[w] = '\0';
	return text;
}

static char *print_and_delete(cJSON *root)
{
	char *text = keep_utf8(cJSON_PrintUnformatted(root));

	cJSON_Delete(root);
	return text;
}

char *rp_build_call(const char *method, const cJSON *params, bool more, bool oneway)
{
	cJSON *root;

	if (method == NULL)
		return NULL;
	root = cJSON_CreateObject();
	if (root == NULL)
		return NULL;
	if (cJSON_AddStringToObject(root, "method", method) == NULL || !add_params(root, params))
		goto error;
	if (more && cJSON_AddTrueToObject(root, "more") == NULL)
		goto error;
	if (oneway && cJSON_AddTrueToObject(root, "oneway") == NULL)
		goto error;
	return print_and_delete(root);

error:
	cJSON_Delete(root);
	return NULL;
}

char *rp_build_reply(const cJSON *params, bool continues)
{
	cJSON *root = cJSON_CreateObject();

	if (root == NULL)
		return NULL;
	if (!add_params(root, params))
		goto error;
	if (continues && cJSON_AddTrueToObject(root, "continues") == NULL)
		goto error;
	return print_and_delete(root);

error:
	cJSON_Delete(root);
	return NULL;
}

char *rp_build_error(const struct rp_error *err)
{
	cJSON *root;

	if (err == NULL || err->name == NULL)
		return NULL;
	root = cJSON_CreateObject();
	if (root == NULL)
		return NULL;
	if (cJSON_AddStringToObject(root, "error", err->name) == NULL || !add_params(root, err->params))
		goto error;
	return print_and_delete(root);

error:
	cJSON_Delete(root);
	return NULL;
}
