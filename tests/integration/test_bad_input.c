/* SPDX-License-Identifier: Apache-2.0 */
/* Bad input, sent raw over the sockets (our own writes, not libregen's):
 * each message in the table is answered with its named error, the
 * connection keeps serving afterwards (framing allows it in every case
 * here), and meanwhile another client keeps getting right answers and no
 * worker crashes or changes generation. */
#include <errno.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>
#include <cjson/cJSON.h>
#include "tests/lib/client.h"
#include "tests/lib/varlink.h"

static struct tl_daemon daemon_;
static atomic_int *stop_flag;      /* [0] stop, [1] the checker's right answers */

enum target { MAIN, WORKER };
enum fds_mode { NO_FDS, ONE_FD };

struct bad_case {
	const char *what;
	enum target target;
	const char *text;          /* $ID own 4 KiB buffer, $BIG own 4 MiB one, $OTHER another
	                              process's, $GEN the generation */
	const char *expect;        /* names separated by '|' */
	const char *key;           /* parameter to check, or NULL */
	const char *value;         /* its expected value (prefix for "parameter"), or NULL */
	enum fds_mode fds;
};

#define OP(name, off, shape) "\"" name "\":{\"buffer\":\"$ID\",\"offset\":" #off ",\"dtype\":\"f32\",\"shape\":" shape "}"
#define GEMM(body) "{\"method\":\"io.regen.Compute.Gemm\",\"parameters\":{" body "}}"
#define GOOD_A OP("a", 0, "[4,4]")
#define GOOD_B OP("b", 64, "[4,4]")
#define GOOD_D OP("d", 128, "[4,4]")
#define ATTN_OP(name, off, dt, shape) "\"" name "\":{\"buffer\":\"$ID\",\"offset\":" #off ",\"dtype\":\"" dt "\",\"shape\":" shape "}"
/* A call of io.regen.Compute.`method` on 4x4 f32 q, k, v and o in $ID at
 * offsets 0 to 192, then the operands in `more`. */
#define ATTN_QKVO ATTN_OP("q", 0, "f32", "[1,1,4,4]") "," ATTN_OP("k", 64, "f32", "[1,1,4,4]") "," \
	ATTN_OP("v", 128, "f32", "[1,1,4,4]") "," ATTN_OP("o", 192, "f32", "[1,1,4,4]")
#define ATTENTION(method, more) "{\"method\":\"io.regen.Compute." method "\",\"parameters\":{" ATTN_QKVO "," more "}}"
/* A LayerNorm of f32 x [4, 8] at 0 and weight [8] at 128 in $ID, then the
 * operands and scalars in `more` (y, ...); LN_BWD's d_y at 1024, mean and
 * rstd at 1280 and 1296, then `more` (d_x, ...). */
#define LN_OP(name, off, dt, shape) ATTN_OP(name, off, dt, shape)
#define LAYER_NORM(more) "{\"method\":\"io.regen.Compute.LayerNorm\",\"parameters\":{" \
	LN_OP("x", 0, "f32", "[4,8]") "," LN_OP("weight", 128, "f32", "[8]") "," more "}}"
#define LN_BWD(more) "{\"method\":\"io.regen.Compute.LayerNormBackward\",\"parameters\":{" \
	LN_OP("d_y", 1024, "f32", "[4,8]") "," LN_OP("x", 0, "f32", "[4,8]") "," LN_OP("weight", 128, "f32", "[8]") "," \
	LN_OP("mean", 1280, "f32", "[4]") "," LN_OP("rstd", 1296, "f32", "[4]") "," more "}}"

static const struct bad_case cases[] = {
	/* Framing and message shape. */
	{ "malformed JSON", MAIN, "{\"method\":\"io.regen.Device.Status\",", REGEN_ERROR_INVALID_MESSAGE },
	{ "not an object", MAIN, "[1,2,3]", REGEN_ERROR_INVALID_MESSAGE },
	{ "no method", MAIN, "{\"parameters\":{}}", REGEN_ERROR_INVALID_MESSAGE },
	{ "method not a string", MAIN, "{\"method\":42}", REGEN_ERROR_INVALID_MESSAGE },
	{ "parameters not an object", MAIN, "{\"method\":\"io.regen.Device.Status\",\"parameters\":[1]}",
	  REGEN_ERROR_INVALID_MESSAGE },
	{ "unknown top-level key", MAIN, "{\"method\":\"io.regen.Device.Status\",\"bogus\":1}", REGEN_ERROR_INVALID_MESSAGE },
	{ "flag of the wrong type", MAIN, "{\"method\":\"io.regen.Device.Status\",\"more\":\"yes\"}",
	  REGEN_ERROR_INVALID_MESSAGE },
	{ "empty message", MAIN, "", REGEN_ERROR_INVALID_MESSAGE },
	/* Methods and parameters on the main socket. */
	{ "unknown method", MAIN, "{\"method\":\"io.regen.Device.Frobnicate\"}", REGEN_ERROR_METHOD_NOT_FOUND,
	  "method", "io.regen.Device.Frobnicate" },
	{ "unknown interface", MAIN, "{\"method\":\"com.example.Nope.Call\"}",
	  REGEN_ERROR_INTERFACE_NOT_FOUND "|" REGEN_ERROR_METHOD_NOT_FOUND },
	{ "unknown parameter", MAIN, "{\"method\":\"io.regen.Device.Status\",\"parameters\":{\"bogus\":1}}",
	  REGEN_ERROR_INVALID_PARAMETER, "parameter", "bogus" },
	{ "device of the wrong type", MAIN, "{\"method\":\"io.regen.Device.Release\",\"parameters\":{\"device\":\"zero\"}}",
	  REGEN_ERROR_INVALID_PARAMETER, "parameter", "device" },
	{ "negative device", MAIN, "{\"method\":\"io.regen.Device.Release\",\"parameters\":{\"device\":-1}}",
	  REGEN_ERROR_INVALID_PARAMETER "|" REGEN_ERROR_NO_SUCH_DEVICE },
	{ "device not served", MAIN, "{\"method\":\"io.regen.Device.Release\",\"parameters\":{\"device\":7}}",
	  REGEN_ERROR_NO_SUCH_DEVICE, "device", "7" },
	{ "deadline_ms on Release", MAIN,
	  "{\"method\":\"io.regen.Device.Release\",\"parameters\":{\"device\":0,\"deadline_ms\":5}}",
	  REGEN_ERROR_INVALID_PARAMETER, "parameter", "deadline_ms" },
	{ "negative deadline", MAIN,
	  "{\"method\":\"io.regen.Device.Restart\",\"parameters\":{\"device\":0,\"deadline_ms\":-5}}",
	  REGEN_ERROR_INVALID_PARAMETER, "parameter", "deadline_ms" },
	{ "InjectFault without kind", MAIN, "{\"method\":\"io.regen.Device.InjectFault\",\"parameters\":{\"device\":0}}",
	  REGEN_ERROR_INVALID_PARAMETER, "parameter", "kind" },
	{ "InjectFault unknown kind", MAIN,
	  "{\"method\":\"io.regen.Device.InjectFault\",\"parameters\":{\"device\":0,\"kind\":\"meteor\"}}",
	  REGEN_ERROR_INVALID_PARAMETER, "parameter", "kind" },
	{ "Watch without more", MAIN, "{\"method\":\"io.regen.Device.Watch\"}", REGEN_ERROR_EXPECTED_MORE },
	{ "data-plane method on the main socket", MAIN,
	  "{\"method\":\"io.regen.Compute.Gemm\",\"parameters\":{}}", REGEN_ERROR_WRONG_ENDPOINT, "method",
	  "io.regen.Compute.Gemm" },
	{ "LayerNormBackward on the main socket", MAIN,
	  "{\"method\":\"io.regen.Compute.LayerNormBackward\",\"parameters\":{}}", REGEN_ERROR_WRONG_ENDPOINT, "method",
	  "io.regen.Compute.LayerNormBackward" },
	{ "interface description of an unknown interface", MAIN,
	  "{\"method\":\"org.varlink.service.GetInterfaceDescription\",\"parameters\":{\"interface\":\"com.nope\"}}",
	  REGEN_ERROR_INTERFACE_NOT_FOUND, "interface", "com.nope" },

	/* The worker socket. */
	{ "malformed JSON (worker)", WORKER, "{\"method\":", REGEN_ERROR_INVALID_MESSAGE },
	{ "unknown method (worker)", WORKER, "{\"method\":\"io.regen.Compute.Frobnicate\"}",
	  REGEN_ERROR_METHOD_NOT_FOUND },
	{ "control method on a worker socket", WORKER, "{\"method\":\"io.regen.Device.Release\"}",
	  REGEN_ERROR_WRONG_ENDPOINT "|" REGEN_ERROR_INTERFACE_NOT_FOUND "|" REGEN_ERROR_METHOD_NOT_FOUND },
	{ "operand of the wrong type", WORKER, GEMM("\"a\":5," GOOD_B "," GOOD_D), REGEN_ERROR_INVALID_PARAMETER,
	  "parameter", "a" },
	{ "missing operand d", WORKER, GEMM(GOOD_A "," GOOD_B), REGEN_ERROR_INVALID_PARAMETER, "parameter", "d" },
	{ "negative shape", WORKER, GEMM(OP("a", 0, "[-4,4]") "," GOOD_B "," GOOD_D), REGEN_ERROR_INVALID_PARAMETER,
	  "parameter", "a.shape" },
	{ "zero shape", WORKER, GEMM(OP("a", 0, "[0,4]") "," GOOD_B "," GOOD_D), REGEN_ERROR_INVALID_PARAMETER,
	  "parameter", "a.shape" },
	{ "huge shape", WORKER, GEMM(OP("a", 0, "[1099511627776,4]") "," GOOD_B "," GOOD_D),
	  REGEN_ERROR_INVALID_PARAMETER, "parameter", "a.shape" },
	{ "rank 5", WORKER, GEMM(OP("a", 0, "[1,1,1,4,4]") "," GOOD_B "," GOOD_D), REGEN_ERROR_INVALID_PARAMETER,
	  "parameter", "a.shape" },
	{ "shape far past the buffer", WORKER,
	  GEMM(OP("a", 0, "[65536,65536]") ","
	       "\"b\":{\"buffer\":\"$BIG\",\"dtype\":\"f32\",\"shape\":[65536,4]},"
	       "\"d\":{\"buffer\":\"$BIG\",\"offset\":2097152,\"dtype\":\"f32\",\"shape\":[65536,4]}"),
	  REGEN_ERROR_INVALID_OPERAND, "operand", "a" },
	{ "offset at the buffer's end", WORKER, GEMM(OP("a", 4096, "[4,4]") "," GOOD_B "," GOOD_D),
	  REGEN_ERROR_INVALID_OPERAND, "operand", "a" },
	{ "extent one element past the end", WORKER, GEMM(OP("a", 4036, "[4,4]") "," GOOD_B "," GOOD_D),
	  REGEN_ERROR_INVALID_OPERAND, "operand", "a" },
	{ "negative offset", WORKER, GEMM(OP("a", -64, "[4,4]") "," GOOD_B "," GOOD_D),
	  REGEN_ERROR_INVALID_PARAMETER, "parameter", "a.offset" },
	{ "unknown dtype", WORKER,
	  GEMM("\"a\":{\"buffer\":\"$ID\",\"dtype\":\"f8\",\"shape\":[4,4]}," GOOD_B "," GOOD_D),
	  REGEN_ERROR_INVALID_PARAMETER, "parameter", "a.dtype" },
	{ "unknown operand field", WORKER,
	  GEMM("\"a\":{\"buffer\":\"$ID\",\"dtype\":\"f32\",\"shape\":[4,4],\"colour\":1}," GOOD_B "," GOOD_D),
	  REGEN_ERROR_INVALID_PARAMETER, "parameter", "a." },
	{ "unknown Gemm parameter", WORKER, GEMM(GOOD_A "," GOOD_B "," GOOD_D ",\"gamma\":2"),
	  REGEN_ERROR_INVALID_PARAMETER, "parameter", "gamma" },
	{ "alpha of the wrong type", WORKER, GEMM(GOOD_A "," GOOD_B "," GOOD_D ",\"alpha\":\"two\""),
	  REGEN_ERROR_INVALID_PARAMETER, "parameter", "alpha" },
	{ "inner dimensions differ", WORKER, GEMM(OP("a", 0, "[4,3]") "," GOOD_B "," GOOD_D), REGEN_ERROR_INVALID_OPERAND },
	{ "d overlaps a", WORKER, GEMM(GOOD_A "," GOOD_B "," OP("d", 32, "[4,4]")), REGEN_ERROR_INVALID_OPERAND,
	  "operand", "d" },
	{ "beta without c", WORKER, GEMM(GOOD_A "," GOOD_B "," GOOD_D ",\"beta\":0.5"),
	  REGEN_ERROR_INVALID_OPERAND "|" REGEN_ERROR_INVALID_PARAMETER },
	{ "last stride not 1", WORKER,
	  GEMM("\"a\":{\"buffer\":\"$ID\",\"dtype\":\"f32\",\"shape\":[4,4],\"strides\":[1,4]}," GOOD_B "," GOOD_D),
	  REGEN_ERROR_INVALID_OPERAND "|" REGEN_ERROR_INVALID_PARAMETER },
	{ "malformed buffer id", WORKER,
	  GEMM("\"a\":{\"buffer\":\"b0.x\",\"dtype\":\"f32\",\"shape\":[4,4]}," GOOD_B "," GOOD_D),
	  REGEN_ERROR_INVALID_OPERAND, "operand", "a" },
	{ "another process's buffer", WORKER,
	  GEMM("\"a\":{\"buffer\":\"$OTHER\",\"dtype\":\"f32\",\"shape\":[4,4]}," GOOD_B "," GOOD_D),
	  REGEN_ERROR_NO_SUCH_OBJECT, "id", "$OTHER" },
	{ "buffer never made", WORKER,
	  GEMM("\"a\":{\"buffer\":\"b0.$GEN.999999\",\"dtype\":\"f32\",\"shape\":[4,4]}," GOOD_B "," GOOD_D),
	  REGEN_ERROR_NO_SUCH_OBJECT, "id", "b0.$GEN.999999" },
	{ "attention stats in f16", WORKER,
	  ATTENTION("Attention", ATTN_OP("stats", 256, "f16", "[1,1,4]")),
	  REGEN_ERROR_INVALID_OPERAND "|" REGEN_ERROR_INVALID_PARAMETER },
	/* Sequence lengths: what the parser sees, then what only the host
	 * backend can see, the values (main() writes them: 99 and 4 at 2048,
	 * 3 and 0 at 2056), refused before anything is written. */
	{ "attention seq_len_q without seq_len_kv", WORKER,
	  ATTENTION("Attention", ATTN_OP("seq_len_q", 2048, "i32", "[1]")),
	  REGEN_ERROR_INVALID_OPERAND, "operand", "seq_len_kv" },
	{ "attention seq_len_q of f32", WORKER,
	  ATTENTION("Attention",
		    ATTN_OP("seq_len_q", 2048, "f32", "[1]") ","
		    ATTN_OP("seq_len_kv", 2052, "i32", "[1]")),
	  REGEN_ERROR_INVALID_OPERAND, "operand", "seq_len_q" },
	{ "attention seq_len_kv past the buffer", WORKER,
	  ATTENTION("Attention",
		    ATTN_OP("seq_len_q", 2048, "i32", "[1]") ","
		    ATTN_OP("seq_len_kv", 4096, "i32", "[1]")),
	  REGEN_ERROR_INVALID_OPERAND, "operand", "seq_len_kv" },
	{ "attention seq_len_q 99 past Sq 4", WORKER,
	  ATTENTION("Attention",
		    ATTN_OP("seq_len_q", 2048, "i32", "[1]") ","
		    ATTN_OP("seq_len_kv", 2052, "i32", "[1]")),
	  REGEN_ERROR_INVALID_OPERAND, "operand", "seq_len_q" },
	{ "attention queries with no key (seq_len_kv 0)", WORKER,
	  ATTENTION("AttentionBackward",
		    ATTN_OP("d_o", 256, "f32", "[1,1,4,4]") ","
		    ATTN_OP("stats", 320, "f32", "[1,1,4]") "," ATTN_OP("d_q", 384, "f32", "[1,1,4,4]") ","
		    ATTN_OP("d_k", 448, "f32", "[1,1,4,4]") "," ATTN_OP("d_v", 512, "f32", "[1,1,4,4]") ","
		    ATTN_OP("seq_len_q", 2056, "i32", "[1]") "," ATTN_OP("seq_len_kv", 2060, "i32", "[1]")),
	  REGEN_ERROR_INVALID_OPERAND, "operand", "seq_len_kv" },
	/* LayerNorm: what the parser refuses, then the bounds the worker checks. */
	{ "LayerNorm weight of another dtype", WORKER,
	  "{\"method\":\"io.regen.Compute.LayerNorm\",\"parameters\":{" LN_OP("x", 0, "f32", "[4,8]") ","
	  LN_OP("weight", 128, "bf16", "[8]") "," LN_OP("y", 256, "f32", "[4,8]") "}}",
	  REGEN_ERROR_INVALID_OPERAND, "operand", "weight" },
	{ "LayerNorm eps 0", WORKER, LAYER_NORM(LN_OP("y", 256, "f32", "[4,8]") ",\"eps\":0"),
	  REGEN_ERROR_INVALID_PARAMETER, "parameter", "eps" },
	{ "LayerNorm eps as text", WORKER, LAYER_NORM(LN_OP("y", 256, "f32", "[4,8]") ",\"eps\":\"1e-5\""),
	  REGEN_ERROR_INVALID_PARAMETER, "parameter", "eps" },
	{ "LayerNorm without y", WORKER, LAYER_NORM("\"eps\":0.5"), REGEN_ERROR_INVALID_PARAMETER, "parameter", "y" },
	{ "LayerNorm y over x", WORKER, LAYER_NORM(LN_OP("y", 64, "f32", "[4,8]")), REGEN_ERROR_INVALID_OPERAND,
	  "operand", "y" },
	{ "LayerNorm mean of f16", WORKER, LAYER_NORM(LN_OP("y", 256, "f32", "[4,8]") "," LN_OP("mean", 1280, "f16", "[4]")),
	  REGEN_ERROR_INVALID_OPERAND, "operand", "mean" },
	{ "LayerNorm rstd past the buffer", WORKER,
	  LAYER_NORM(LN_OP("y", 256, "f32", "[4,8]") "," LN_OP("rstd", 4088, "f32", "[4]")), REGEN_ERROR_INVALID_OPERAND,
	  "operand", "rstd" },
	{ "LayerNorm row past the longest", WORKER,
	  "{\"method\":\"io.regen.Compute.LayerNorm\",\"parameters\":{"
	  "\"x\":{\"buffer\":\"$BIG\",\"dtype\":\"f32\",\"shape\":[1,65537]},"
	  "\"weight\":{\"buffer\":\"$BIG\",\"offset\":262148,\"dtype\":\"f32\",\"shape\":[65537]},"
	  "\"y\":{\"buffer\":\"$BIG\",\"offset\":524296,\"dtype\":\"f32\",\"shape\":[1,65537]}}}",
	  REGEN_ERROR_INVALID_OPERAND, "operand", "x" },
	{ "LayerNormBackward d_x over d_y", WORKER, LN_BWD(LN_OP("d_x", 1024, "f32", "[4,8]")),
	  REGEN_ERROR_INVALID_OPERAND, "operand", "d_x" },
	{ "LayerNormBackward with eps", WORKER, LN_BWD(LN_OP("d_x", 1536, "f32", "[4,8]") ",\"eps\":1e-5"),
	  REGEN_ERROR_INVALID_PARAMETER, "parameter", "eps" },
	{ "LayerNormBackward d_weight of another length", WORKER,
	  LN_BWD(LN_OP("d_x", 1536, "f32", "[4,8]") "," LN_OP("d_weight", 1792, "f32", "[4]")),
	  REGEN_ERROR_INVALID_OPERAND, "operand", "d_weight" },
	{ "LayerNormBackward with another process's buffer as d_residual", WORKER,
	  LN_BWD(LN_OP("d_x", 1536, "f32", "[4,8]") ","
		 "\"d_residual\":{\"buffer\":\"$OTHER\",\"dtype\":\"f32\",\"shape\":[4,8]}"),
	  REGEN_ERROR_NO_SUCH_OBJECT, "id", "$OTHER" },
	{ "CloseBuffer without buffer", WORKER, "{\"method\":\"io.regen.Memory.CloseBuffer\",\"parameters\":{}}",
	  REGEN_ERROR_INVALID_PARAMETER, "parameter", "buffer" },
	{ "import: referenced fd missing", WORKER,
	  "{\"method\":\"io.regen.Memory.ImportBuffer\",\"parameters\":{\"device\":0,\"kind\":\"host_fd\",\"size\":4096,\"fd\":0}}",
	  REGEN_ERROR_INVALID_PARAMETER "|" REGEN_ERROR_IMPORT_FAILED },
	{ "import: fd index past those passed", WORKER,
	  "{\"method\":\"io.regen.Memory.ImportBuffer\",\"parameters\":{\"device\":0,\"kind\":\"host_fd\",\"size\":4096,\"fd\":3}}",
	  REGEN_ERROR_INVALID_PARAMETER "|" REGEN_ERROR_IMPORT_FAILED, NULL, NULL, ONE_FD },
	{ "import: size past the memfd's end", WORKER,
	  "{\"method\":\"io.regen.Memory.ImportBuffer\",\"parameters\":{\"device\":0,\"kind\":\"host_fd\",\"size\":1048576,\"fd\":0}}",
	  REGEN_ERROR_IMPORT_FAILED, NULL, NULL, ONE_FD },
	{ "import: size 0", WORKER,
	  "{\"method\":\"io.regen.Memory.ImportBuffer\",\"parameters\":{\"device\":0,\"kind\":\"host_fd\",\"size\":0,\"fd\":0}}",
	  REGEN_ERROR_INVALID_PARAMETER "|" REGEN_ERROR_IMPORT_FAILED, NULL, NULL, ONE_FD },
	{ "import: unknown kind", WORKER,
	  "{\"method\":\"io.regen.Memory.ImportBuffer\",\"parameters\":{\"device\":0,\"kind\":\"tape\",\"size\":4096,\"fd\":0}}",
	  REGEN_ERROR_INVALID_PARAMETER, "parameter", "kind", ONE_FD },
	{ "import: another device's worker", WORKER,
	  "{\"method\":\"io.regen.Memory.ImportBuffer\",\"parameters\":{\"device\":1,\"kind\":\"host_fd\",\"size\":4096,\"fd\":0}}",
	  REGEN_ERROR_NO_SUCH_DEVICE "|" REGEN_ERROR_WRONG_ENDPOINT "|" REGEN_ERROR_INVALID_PARAMETER, NULL, NULL, ONE_FD },
	{ "import: cuda_ipc handle that is not hex", WORKER,
	  "{\"method\":\"io.regen.Memory.ImportBuffer\",\"parameters\":{\"device\":0,\"kind\":\"cuda_ipc\",\"size\":4096,\"handle\":\"zz\"}}",
	  REGEN_ERROR_INVALID_PARAMETER "|" REGEN_ERROR_IMPORT_FAILED },
};

/* Replaces $ID, $OTHER and $GEN. */
static const char *big_id;

static char *expand(const char *tmpl, const char *id, const char *other, unsigned long long gen)
{
	size_t cap = strlen(tmpl) * 2 + 1024, len = 0;
	char *out = malloc(cap);
	const char *p = tmpl;

	ASSERT_NOT_NULL(out, "malloc");
	while (*p) {
		const char *rep = NULL;
		char genbuf[32];
		size_t skip = 0;

		if (strncmp(p, "$BIG", 4) == 0) {
			rep = big_id;
			skip = 4;
		} else if (strncmp(p, "$ID", 3) == 0) {
			rep = id;
			skip = 3;
		} else if (strncmp(p, "$OTHER", 6) == 0) {
			rep = other;
			skip = 6;
		} else if (strncmp(p, "$GEN", 4) == 0) {
			snprintf(genbuf, sizeof(genbuf), "%llu", gen);
			rep = genbuf;
			skip = 4;
		}
		if (rep != NULL) {
			ASSERT(len + strlen(rep) + 1 < cap, "expand");
			memcpy(out + len, rep, strlen(rep));
			len += strlen(rep);
			p += skip;
		} else {
			ASSERT(len + 2 < cap, "expand");
			out[len++] = *p++;
		}
	}
	out[len] = '\0';
	return out;
}

static bool name_in(const char *name, const char *list)
{
	const char *p = list;
	size_t n = strlen(name);

	while (p != NULL && *p) {
		const char *bar = strchr(p, '|');
		size_t len = bar ? (size_t)(bar - p) : strlen(p);

		if (len == n && strncmp(p, name, n) == 0) {
			return true;
		}
		p = bar ? bar + 1 : NULL;
	}
	return false;
}

/* Checks one reply; returns a malloc'ed complaint or NULL. */
static char *judge(const char *reply, const char *expect, const char *key, const char *value)
{
	cJSON *j = reply ? cJSON_Parse(reply) : NULL;
	const cJSON *err, *params, *item;
	char *msg = NULL;
	char got[128];

	if (j == NULL) {
		return strdup(reply ? "reply is not JSON" : "no reply (connection closed or 10 s timeout)");
	}
	err = cJSON_GetObjectItemCaseSensitive(j, "error");
	params = cJSON_GetObjectItemCaseSensitive(j, "parameters");
	if (!cJSON_IsString(err)) {
		ASSERT(asprintf(&msg, "no error: %s", reply) > 0, "asprintf");
		goto out;
	}
	if (!name_in(err->valuestring, expect)) {
		ASSERT(asprintf(&msg, "got %s, expected %s: %s", err->valuestring, expect, reply) > 0, "asprintf");
		goto out;
	}
	if (key != NULL) {
		item = cJSON_GetObjectItemCaseSensitive(params, key);
		if (cJSON_IsNumber(item)) {
			snprintf(got, sizeof(got), "%lld", (long long)item->valuedouble);
		} else if (cJSON_IsString(item)) {
			snprintf(got, sizeof(got), "%s", item->valuestring);
		} else {
			ASSERT(asprintf(&msg, "%s lacks parameter '%s': %s", err->valuestring, key, reply) > 0, "asprintf");
			goto out;
		}
		/* "parameter" names may be more precise than expected
		 * ("a.shape[0]" for "a.shape"). */
		if (value != NULL && (strcmp(key, "parameter") == 0 ? strncmp(got, value, strlen(value)) != 0
								   : strcmp(got, value) != 0)) {
			ASSERT(asprintf(&msg, "%s.%s is '%s', expected '%s': %s", err->valuestring, key, got, value, reply) > 0,
			       "asprintf");
			goto out;
		}
	}
	/* io.regen errors say what to do next. */
	if (strncmp(err->valuestring, "io.regen.", 9) == 0 && cJSON_GetObjectItemCaseSensitive(params, "message") == NULL &&
	    cJSON_GetObjectItemCaseSensitive(params, "reason") == NULL) {
		ASSERT(asprintf(&msg, "%s without a message: %s", err->valuestring, reply) > 0, "asprintf");
	}
out:
	cJSON_Delete(j);
	return msg;
}

/* The connection still serves: GetInfo answers. */
static bool still_serves(struct tl_conn *raw)
{
	char *reply;
	bool ok;

	if (tl_send_text(raw, "{\"method\":\"org.varlink.service.GetInfo\"}", NULL, 0) < 0) {
		return false;
	}
	reply = tl_recv_text(raw, 10);
	ok = reply != NULL && strstr(reply, "\"interfaces\"") != NULL && strstr(reply, "\"error\"") == NULL;
	free(reply);
	return ok;
}

static int checker_main(void *arg)
{
	regen_client *c = tl_client_connect(&daemon_);
	struct tl_buffer m[2];
	struct tl_gemm_case gc;
	char why[512], desc[256];
	long n = 0;
	int r, dev;

	tl_buffer_create(c, 0, 1 << 17, &m[0]);
	tl_buffer_create(c, 1, 1 << 17, &m[1]);
	while (!atomic_load(&stop_flag[0]) || n < 20) {
		dev = (int)(n % 2);
		tl_gemm_random_case(&gc, 24);
		r = tl_gemm_run(c, &m[dev], 0, &gc, why, sizeof(why));
		if (r != 0) {
			tl_gemm_describe(&gc, desc, sizeof(desc));
			if (r < 0) {
				tl_fail_regen(__FILE__, __LINE__, desc, c, r, "");
			}
			ASSERT(false, "checker: %s: %s", desc, why);
		}
		n++;
		atomic_store(&stop_flag[1], (int)n);
	}
	tl_log("checker: %ld right answers during the bad input", n);
	tl_buffer_free(&m[0]);
	tl_buffer_free(&m[1]);
	regen_client_destroy(c);
	return 0;
}

static int other_main(void *arg)
{
	int *fds = arg;
	regen_client *c = tl_client_connect(&daemon_);
	struct tl_buffer m;
	char ch;
	const char *id;

	tl_buffer_create(c, 0, 4096, &m);
	id = regen_buffer_id(m.buf);
	ASSERT(write(fds[1], id, strlen(id) + 1) == (ssize_t)strlen(id) + 1, "pipe");
	/* Hold the buffer until the parent is done. */
	(void)!read(fds[2], &ch, 1);
	tl_buffer_free(&m);
	regen_client_destroy(c);
	return 0;
}

/* Imports spare's memfd at `offset` on the raw connection; the buffer id
 * into id. */
static void import_at(struct tl_conn *raw, struct tl_buffer *spare, unsigned offset, char *id, size_t size)
{
	char msg[256], *reply;

	snprintf(msg, sizeof(msg),
		 "{\"method\":\"io.regen.Memory.ImportBuffer\",\"parameters\":{\"device\":0,\"kind\":\"host_fd\","
		 "\"size\":2048,\"offset\":%u,\"fd\":0}}",
		 offset);
	ASSERT_EQ(tl_send_text(raw, msg, &spare->mem.fd, 1), 0, "send ImportBuffer");
	reply = tl_recv_text(raw, 10);
	cJSON *j = reply ? cJSON_Parse(reply) : NULL;
	const cJSON *buf = cJSON_GetObjectItemCaseSensitive(cJSON_GetObjectItemCaseSensitive(j, "parameters"), "buffer");
	ASSERT(cJSON_IsString(buf), "ImportBuffer at offset %u: %s", offset, reply ? reply : "(no reply)");
	snprintf(id, size, "%s", buf->valuestring);
	cJSON_Delete(j);
	free(reply);
}

/* A buffer imported at an offset that is not a multiple of an operand's
 * element size puts the operand's elements at misaligned addresses even
 * at an offset the parser takes (a multiple of the element size within
 * the buffer). The CUDA backend used to answer a bf16 GEMM there with
 * BackendError (cuBLASLt found no algorithm) and the host backend ran it;
 * both now refuse it with InvalidOperand naming the operand, and D is not
 * written. A buffer whose import offset keeps the elements aligned
 * computes. */
static int misaligned_imports(struct tl_conn *raw, struct tl_buffer *spare)
{
	struct {
		const char *what;
		unsigned import_offset;
		const char *dtype, *operand;
		unsigned off_a, off_b, off_d;
	} mc[] = {
		{ "bf16 a in a buffer imported at an odd offset", 1, "bf16", "a", 0, 64, 128 },
		{ "f16 operands in a buffer imported at offset 3", 3, "f16", "a", 2, 64, 128 },
		{ "f32 operands in a buffer imported at offset 2", 2, "f32", "a", 0, 64, 128 },
		{ "f32 operands in a buffer imported at offset 6", 6, "f32", "a", 0, 64, 128 },
		{ "bf16 operands in a buffer imported at offset 2", 2, "bf16", NULL, 0, 64, 128 },
		{ "f32 operands in a buffer imported at offset 1024", 1024, "f32", NULL, 0, 64, 128 },
	};
	char id[64], msg[1024], *reply, *complaint;
	int failures = 0;

	for (size_t i = 0; i < sizeof(mc) / sizeof(mc[0]); i++) {
		unsigned char before[1024];
		import_at(raw, spare, mc[i].import_offset, id, sizeof(id));
		/* Poison where d lies, to see it untouched. */
		unsigned char *d = (unsigned char *)spare->mem.ptr + mc[i].import_offset + mc[i].off_d;
		memset(d, 0x7f, 64);
		memcpy(before, spare->mem.ptr + mc[i].import_offset, sizeof(before));
		snprintf(msg, sizeof(msg),
			 "{\"method\":\"io.regen.Compute.Gemm\",\"parameters\":{"
			 "\"a\":{\"buffer\":\"%s\",\"offset\":%u,\"dtype\":\"%s\",\"shape\":[4,4]},"
			 "\"b\":{\"buffer\":\"%s\",\"offset\":%u,\"dtype\":\"%s\",\"shape\":[4,4]},"
			 "\"d\":{\"buffer\":\"%s\",\"offset\":%u,\"dtype\":\"%s\",\"shape\":[4,4]}}}",
			 id, mc[i].off_a, mc[i].dtype, id, mc[i].off_b, mc[i].dtype, id, mc[i].off_d,
			 mc[i].dtype);
		ASSERT_EQ(tl_send_text(raw, msg, NULL, 0), 0, "send %s", mc[i].what);
		reply = tl_recv_text(raw, 10);
		if (mc[i].operand) {
			complaint = judge(reply, REGEN_ERROR_INVALID_OPERAND, "operand", mc[i].operand);
			if (!complaint && (!reply || !strstr(reply, "misaligned")))
				complaint = strdup("the reason does not say misaligned");
			if (!complaint && memcmp(before, spare->mem.ptr + mc[i].import_offset, sizeof(before)) != 0)
				complaint = strdup("the refused call wrote to its buffer");
		} else {
			complaint = reply && strstr(reply, "\"error\"") == NULL && strstr(reply, "elapsed_us") != NULL
					    ? NULL
					    : strdup("an aligned call failed");
		}
		if (complaint) {
			tl_log("BAD %s: %s\n    %s", mc[i].what, complaint, reply ? reply : "(no reply)");
			failures++;
			free(complaint);
		} else {
			tl_log("ok  %s: %s", mc[i].what, reply);
		}
		free(reply);
		snprintf(msg, sizeof(msg), "{\"method\":\"io.regen.Memory.CloseBuffer\",\"parameters\":{\"buffer\":\"%s\"}}",
			 id);
		ASSERT_EQ(tl_send_text(raw, msg, NULL, 0), 0, "send CloseBuffer");
		reply = tl_recv_text(raw, 10);
		ASSERT(reply && strstr(reply, "\"error\"") == NULL, "CloseBuffer %s: %s", id, reply ? reply : "(no reply)");
		free(reply);
	}
	return failures;
}

/* A message over the size limit, then proof the connection survives. */
static int oversized(struct tl_conn *raw, const char *where)
{
	size_t big = (1u << 20) + 65536;
	const char *head = "{\"method\":\"io.regen.Device.Status\",\"parameters\":{\"pad\":\"";
	char *msg = malloc(big + 64), *reply, *complaint;
	int failures = 0;

	ASSERT_NOT_NULL(msg, "malloc");
	strcpy(msg, head);
	memset(msg + strlen(head), 'x', big - strlen(head));
	strcpy(msg + big, "\"}}");
	ASSERT_EQ(tl_send_text(raw, msg, NULL, 0), 0, "send oversized");
	free(msg);
	reply = tl_recv_text(raw, 20);
	complaint = judge(reply, REGEN_ERROR_MESSAGE_TOO_LARGE, "limit", "1048576");
	if (complaint) {
		tl_log("BAD oversized message (%s): %s", where, complaint);
		failures++;
		free(complaint);
	} else {
		tl_log("ok  oversized message (%s): %s", where, reply);
	}
	free(reply);
	if (!still_serves(raw)) {
		tl_log("BAD oversized message (%s): the connection stopped serving", where);
		failures++;
	}
	return failures;
}

static int deep_nesting(struct tl_conn *raw, const char *where)
{
	char msg[512], *reply, *complaint;
	int i, n = 0, failures = 0;

	n += snprintf(msg + n, sizeof(msg) - (size_t)n, "{\"method\":\"io.regen.Device.Status\",\"parameters\":{\"x\":");
	for (i = 0; i < 40; i++) {
		msg[n++] = '[';
	}
	for (i = 0; i < 40; i++) {
		msg[n++] = ']';
	}
	n += snprintf(msg + n, sizeof(msg) - (size_t)n, "}}");
	ASSERT_EQ(tl_send_text(raw, msg, NULL, 0), 0, "send");
	reply = tl_recv_text(raw, 10);
	complaint = judge(reply, REGEN_ERROR_INVALID_MESSAGE, NULL, NULL);
	if (complaint) {
		tl_log("BAD nesting 40 (%s): %s", where, complaint);
		failures++;
		free(complaint);
	} else {
		tl_log("ok  nesting 40 (%s): %s", where, reply);
	}
	free(reply);
	if (!still_serves(raw)) {
		tl_log("BAD nesting 40 (%s): the connection stopped serving", where);
		failures++;
	}
	return failures;
}

int main(void)
{
	const struct regen_device_info *dev0, *was, *now;
	regen_status *before, *after;
	struct tl_conn main_raw, worker_raw;
	struct tl_buffer own, big, spare;
	regen_client *c;
	pid_t checker, other;
	int pipefd[2], holdfd[2], other_fds[3];
	char other_id[64] = "", *text, *reply, *complaint;
	size_t i, n;
	int failures = 0, k;

	tl_init(230);
	tl_daemon_start(&daemon_, NULL);
	stop_flag = mmap(NULL, 2 * sizeof(*stop_flag), PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
	ASSERT(stop_flag != MAP_FAILED, "mmap");
	atomic_store(&stop_flag[0], 0);
	atomic_store(&stop_flag[1], 0);
	c = tl_client_connect(&daemon_);
	before = tl_status(c);
	dev0 = tl_status_device(before, 0);

	ASSERT(pipe(pipefd) == 0 && pipe(holdfd) == 0, "pipe");
	other_fds[0] = pipefd[0];
	other_fds[1] = pipefd[1];
	other_fds[2] = holdfd[0];
	other = tl_fork(other_main, other_fds, 200);
	for (n = 0; n < sizeof(other_id) - 1; n++) {
		ASSERT(read(pipefd[0], &other_id[n], 1) == 1, "other process's id");
		if (other_id[n] == '\0') {
			break;
		}
	}
	tl_log("another process's buffer: %s", other_id);
	checker = tl_fork(checker_main, NULL, 200);

	tl_buffer_create(c, 0, 4096, &own);
	{
		/* The lengths the attention cases above point at. */
		const int32_t lengths[4] = { 99, 4, 3, 0 };
		memcpy((char *)own.mem.ptr + 2048, lengths, sizeof(lengths));
	}
	tl_buffer_create(c, 0, 4 << 20, &big);
	big_id = regen_buffer_id(big.buf);
	tl_buffer_alloc(4096, &spare);
	ASSERT_OK(tl_conn_open(&main_raw, daemon_.sock), "connect main");
	ASSERT_OK(tl_conn_open(&worker_raw, dev0->worker_socket), "connect %s",
	          dev0->worker_socket);

	/* The checker is at work before the first bad message. */
	while (atomic_load(&stop_flag[1]) < 5) {
		usleep(1000);
	}
	for (i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
		const struct bad_case *bc = &cases[i];
		struct tl_conn *raw = bc->target == MAIN ? &main_raw : &worker_raw;
		char *value = bc->value ? expand(bc->value, regen_buffer_id(own.buf), other_id,
						 (unsigned long long)dev0->generation) : NULL;

		text = expand(bc->text, regen_buffer_id(own.buf), other_id, (unsigned long long)dev0->generation);
		ASSERT_EQ(tl_send_text(raw, text, bc->fds == ONE_FD ? &spare.mem.fd : NULL, bc->fds == ONE_FD ? 1 : 0),
			  0,
		          "send %s", bc->what);
		reply = tl_recv_text(raw, 10);
		complaint = judge(reply, bc->expect, bc->key, value);
		if (complaint) {
			tl_log("BAD %s: sent %s\n    %s", bc->what, text, complaint);
			failures++;
			free(complaint);
		} else {
			tl_log("ok  %s: %s", bc->what, reply);
		}
		free(reply);
		free(value);
		if (!still_serves(raw)) {
			tl_log("BAD %s: the connection stopped serving after it", bc->what);
			failures++;
			tl_conn_close(raw);
			ASSERT_OK(tl_conn_open(raw, bc->target == MAIN ? daemon_.sock : dev0->worker_socket),
			          "reconnect");
		}
		free(text);
	}
	failures += misaligned_imports(&worker_raw, &spare);
	failures += oversized(&main_raw, "main");
	failures += oversized(&worker_raw, "worker");
	failures += deep_nesting(&main_raw, "main");
	failures += deep_nesting(&worker_raw, "worker");

	/* A partial message followed by a hang-up must not take the daemon
	 * with it. */
	for (k = 0; k < 2; k++) {
		struct tl_conn tmp;

		ASSERT_OK(tl_conn_open(&tmp, k == 0 ? daemon_.sock : dev0->worker_socket), "connect");
		ASSERT_EQ(tl_send_bytes(&tmp, "{\"method\":\"io.regen", 19, NULL, 0), 0, "send");
		tl_conn_close(&tmp);
	}

	/* And goes on getting right answers after the last one. */
	k = atomic_load(&stop_flag[1]);
	while (atomic_load(&stop_flag[1]) < k + 5) {
		usleep(1000);
	}
	atomic_store(&stop_flag[0], 1);
	ASSERT(write(holdfd[1], "x", 1) == 1, "pipe");
	k = tl_wait_children(&checker, 1, 60);
	ASSERT_EQ(k, 0, "the client doing real work failed during the bad input");
	ASSERT_EQ(tl_wait_children(&other, 1, 30), 0, "the other process failed");

	/* The daemon kept serving, nothing crashed, nothing changed generation. */
	ASSERT(tl_daemon_alive(&daemon_), "regend died");
	ASSERT(still_serves(&main_raw) && still_serves(&worker_raw), "raw connections stopped serving");
	after = tl_status(c);
	ASSERT_EQ(regen_status_device_count(after), regen_status_device_count(before), "devices came or went");
	for (k = 0; k < regen_status_device_count(after); k++) {
		was = tl_status_device(before, k);
		now = tl_status_device(after, k);
		ASSERT(now->worker_pid == was->worker_pid && now->respawns == 0,
		       "device %d's worker changed: pid %lld -> %lld, respawns %llu", k, (long long)was->worker_pid,
		       (long long)now->worker_pid, (unsigned long long)now->respawns);
		ASSERT_UINT_EQ(now->generation, was->generation, "device %d's generation moved %llu -> %llu", k,
		               (unsigned long long)was->generation, (unsigned long long)now->generation);
		ASSERT_STR_EQ(now->state, "ready", "device %d is %s", k, now->state);
	}
	regen_status_free(before);
	regen_status_free(after);
	tl_conn_close(&main_raw);
	tl_conn_close(&worker_raw);
	tl_buffer_free(&own);
	tl_buffer_free(&big);
	tl_buffer_free(&spare);
	regen_client_destroy(c);
	ASSERT_EQ(failures, 0, "%d bad-input cases not answered as the IDL says", failures);
	tl_log("PASS");
	return 0;
}
