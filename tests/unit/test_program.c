/* SPDX-License-Identifier: Apache-2.0 */
/* io.regen.Program's Define and Run parameters (proto/program.h): every op
 * accepted with a valid example; each rule refused with the error a client
 * gets, naming the node or tensor it is about; each composite lowered into
 * the primitives it is documented to be; a Run's bindings held to the
 * program.
 *
 * Programs are written as JSON with single quotes for readability; they
 * become double quotes before parsing. */
#include <check.h>
#include <errno.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "proto/errors.h"
#include "proto/program.h"
#include "unit.h"

#define N(a) (sizeof(a) / sizeof((a)[0]))

/* ---- helpers ------------------------------------------------------------------------ */

static cJSON *json(const char *text)
{
	char *s = strdup(text);
	cJSON *j;

	ck_assert_ptr_nonnull(s);
	for (char *p = s; *p; p++) {
		if (*p == '\'') {
			*p = '"';
		}
	}
	j = cJSON_Parse(s);
	ck_assert_msg(j != NULL, "test JSON does not parse: %s", text);
	free(s);
	return j;
}

static void define_ok(const char *text, struct rp_program *p)
{
	cJSON *params = json(text);
	struct rp_error err = { 0 };
	int r = rp_program_parse(params, p, &err);

	if (r < 0) {
		char *e = err.params ? cJSON_PrintUnformatted(err.params) : NULL;

		ck_abort_msg("refused (%d, %s %s): %s", r, err.name ? err.name : "no error", e ? e : "", text);
	}
	ck_assert_ptr_null(err.name);
	ck_assert_ptr_nonnull(p->definition);
	cJSON_Delete(params);
}

/* Defines text, which must fail with error `name` whose `key` is `value`
 * and, when given, whose reason (or message) contains `has`. */
static void define_bad(const char *text, const char *name, const char *key, const char *value, const char *has)
{
	cJSON *params = json(text);
	struct rp_error err = { 0 };
	struct rp_program p;
	const cJSON *v, *reason;
	int r = rp_program_parse(params, &p, &err);

	ck_assert_msg(r < 0, "accepted, expected %s %s=%s: %s", name, key, value, text);
	ck_assert_msg(err.name && strcmp(err.name, name) == 0, "got %s, expected %s: %s", err.name ? err.name : "none",
		      name, text);
	v = cJSON_GetObjectItemCaseSensitive(err.params, key);
	ck_assert_msg(cJSON_IsString(v) && strcmp(v->valuestring, value) == 0, "%s names %s '%s', expected '%s'", name, key,
		      cJSON_IsString(v) ? v->valuestring : "(none)", value);
	if (has) {
		reason = cJSON_GetObjectItemCaseSensitive(err.params, "reason");
		if (!cJSON_IsString(reason)) {
			reason = cJSON_GetObjectItemCaseSensitive(err.params, "message");
		}
		ck_assert_msg(cJSON_IsString(reason) && strstr(reason->valuestring, has),
			      "reason '%s' lacks '%s'", cJSON_IsString(reason) ? reason->valuestring : "(none)", has);
	}
	/* Refused: nothing kept. */
	ck_assert_ptr_null(p.tensors);
	ck_assert_ptr_null(p.nodes);
	ck_assert_ptr_null(p.definition);
	ck_assert_int_eq(p.ntensors, 0);
	ck_assert_int_eq(r == -E2BIG, strcmp(name, RP_ERR_LIMIT_EXCEEDED) == 0);
	rp_error_clear(&err);
	cJSON_Delete(params);
}

static int tensor(const struct rp_program *p, const char *name)
{
	for (int i = 0; i < p->ntensors; i++) {
		if (strcmp(p->tensors[i].name, name) == 0) {
			return i;
		}
	}
	ck_abort_msg("no tensor %s", name);
	return -1;
}

/* The ops of the nodes from the definition's node `source`, space-separated;
 * each named "<its name>.<k>" in order. */
static void ops_are(const struct rp_program *p, int source, const char *name, const char *want)
{
	char got[4096] = "", node[80];
	int k = 0;

	for (int i = 0; i < p->nnodes; i++) {
		if (p->nodes[i].source != source) {
			continue;
		}
		snprintf(got + strlen(got), sizeof(got) - strlen(got), "%s%s", k ? " " : "", p->nodes[i].op->name);
		snprintf(node, sizeof(node), "%s.%d", name, k++);
		ck_assert_str_eq(p->nodes[i].name, node);
	}
	ck_assert_str_eq(got, want);
}

/* The first node from the definition's node `source`. */
static int first_of(const struct rp_program *p, int source)
{
	for (int i = 0; i < p->nnodes; i++) {
		if (p->nodes[i].source == source) {
			return i;
		}
	}
	ck_abort_msg("no node from nodes[%d]", source);
	return -1;
}

/* ---- every op accepted ------------------------------------------------------------------ */

/* One valid program per op. Tensors every row may use: */
#define COMMON                                                                                                       \
	"{'name':'a','kind':'input','dtype':'f32','shape':[4,3]},"                                                   \
	"{'name':'b','kind':'input','dtype':'bf16','shape':[3]},"                                                    \
	"{'name':'c','kind':'input','dtype':'u8','shape':[4,1]},"                                                    \
	"{'name':'s','kind':'scalar'},"                                                                              \
	"{'name':'y','kind':'output','dtype':'f32','shape':[4,3]},"                                                  \
	"{'name':'yb','kind':'output','dtype':'bf16','shape':[4,3]},"                                                \
	"{'name':'yu','kind':'output','dtype':'u8','shape':[4,3]},"                                                  \
	"{'name':'yi','kind':'output','dtype':'i64','shape':[4,3]},"                                                 \
	"{'name':'r','kind':'output','dtype':'f32','shape':[4]}"

#define PROG(extra_tensors, nodes) "{'tensors':[" COMMON extra_tensors "],'nodes':[" nodes "]}"

struct ok_case {
	const char *op;
	const char *program;
};

static const struct ok_case ok_cases[] = {
	{ "gemm", PROG(",{'name':'w','kind':'input','dtype':'f32','shape':[3,5]},"
		       "{'name':'d','kind':'output','dtype':'f32','shape':[4,5]}",
		       "{'op':'gemm','inputs':{'a':'a','b':'w'},'outputs':{'d':'d'},'attrs':{'alpha':0.5}}") },
	{ "attention", PROG(",{'name':'q','kind':'input','dtype':'bf16','shape':[2,4,8,16]},"
			    "{'name':'k','kind':'input','dtype':'bf16','shape':[2,2,8,16]},"
			    "{'name':'o','kind':'output','dtype':'bf16','shape':[2,4,8,16]},"
			    "{'name':'st','kind':'output','dtype':'f32','shape':[2,4,8]}",
			    "{'op':'attention','inputs':{'q':'q','k':'k','v':'k'},'outputs':{'o':'o','stats':'st'},"
			    "'attrs':{'causal':true}}") },
	{ "attention_backward",
	  PROG(",{'name':'q','kind':'input','dtype':'f16','shape':[1,2,4,8]},"
	       "{'name':'o','kind':'input','dtype':'f16','shape':[1,2,4,8]},"
	       "{'name':'st','kind':'input','dtype':'f32','shape':[1,2,4]},"
	       "{'name':'dq','kind':'output','dtype':'f16','shape':[1,2,4,8]},"
	       "{'name':'dk','kind':'output','dtype':'f16','shape':[1,2,4,8]},"
	       "{'name':'dv','kind':'output','dtype':'f16','shape':[1,2,4,8]}",
	       "{'op':'attention_backward','inputs':{'q':'q','k':'q','v':'q','o':'o','d_o':'o','stats':'st'},"
	       "'outputs':{'d_q':'dq','d_k':'dk','d_v':'dv'}}") },
	{ "layer_norm", PROG(",{'name':'w','kind':'input','dtype':'f32','shape':[3]},"
			     "{'name':'mean','kind':'output','dtype':'f32','shape':[4]}",
			     "{'op':'layer_norm','inputs':{'x':'a','weight':'w','bias':'w'},"
			     "'outputs':{'y':'y','mean':'mean','rstd':'r'},'attrs':{'eps':1e-6}}") },
	{ "layer_norm_backward",
	  PROG(",{'name':'w','kind':'input','dtype':'f32','shape':[3]},"
	       "{'name':'st','kind':'input','dtype':'f32','shape':[4]},"
	       "{'name':'dw','kind':'output','dtype':'f32','shape':[3]}",
	       "{'op':'layer_norm_backward','inputs':{'d_y':'a','x':'a','weight':'w','mean':'st','rstd':'st'},"
	       "'outputs':{'d_x':'y','d_weight':'dw'}}") },
	{ "add", PROG("", "{'op':'add','inputs':['a','b'],'outputs':['y']}") },
	{ "sub", PROG("", "{'op':'sub','inputs':['a'],'outputs':['y'],'attrs':{'scalar':1,'scalar_first':true}}") },
	{ "mul", PROG("", "{'op':'mul','inputs':['a','s'],'outputs':['yb']}") },
	{ "div", PROG("", "{'op':'div','inputs':['b','a'],'outputs':['y']}") },
	{ "pow", PROG("", "{'op':'pow','inputs':['a'],'outputs':['y'],'attrs':{'scalar':2}}") },
	{ "maximum", PROG("", "{'op':'maximum','inputs':['a'],'outputs':['y'],'attrs':{'scalar':0}}") },
	{ "minimum", PROG("", "{'op':'minimum','inputs':['a','b'],'outputs':['y']}") },
	{ "eq", PROG("", "{'op':'eq','inputs':['a','b'],'outputs':['yu']}") },
	{ "ne", PROG("", "{'op':'ne','inputs':['c'],'outputs':['yu'],'attrs':{'scalar':0}}") },
	{ "lt", PROG("", "{'op':'lt','inputs':['a','b'],'outputs':['y']}") },
	{ "le", PROG("", "{'op':'le','inputs':['a','b'],'outputs':['yi']}") },
	{ "gt", PROG("", "{'op':'gt','inputs':['a'],'outputs':['yu'],'attrs':{'scalar':0.5}}") },
	{ "ge", PROG("", "{'op':'ge','inputs':['a','c'],'outputs':['yu']}") },
	{ "neg", PROG("", "{'op':'neg','inputs':['a'],'outputs':['y']}") },
	{ "exp", PROG("", "{'op':'exp','inputs':['a'],'outputs':['yb']}") },
	{ "log", PROG("", "{'op':'log','inputs':['b'],'outputs':['y']}") },
	{ "tanh", PROG("", "{'op':'tanh','inputs':['a'],'outputs':['y']}") },
	{ "erf", PROG("", "{'op':'erf','inputs':['a'],'outputs':['y']}") },
	{ "sigmoid", PROG("", "{'op':'sigmoid','inputs':['a'],'outputs':['y']}") },
	{ "silu", PROG("", "{'op':'silu','inputs':['a'],'outputs':['y']}") },
	{ "gelu", PROG("", "{'op':'gelu','inputs':['a'],'outputs':['y']}") },
	{ "gelu_tanh", PROG("", "{'op':'gelu_tanh','inputs':['a'],'outputs':['y']}") },
	{ "relu", PROG("", "{'op':'relu','inputs':['a'],'outputs':['y']}") },
	{ "sqrt", PROG("", "{'op':'sqrt','inputs':['a'],'outputs':['y']}") },
	{ "rsqrt", PROG("", "{'op':'rsqrt','inputs':['a'],'outputs':['y']}") },
	{ "abs", PROG("", "{'op':'abs','inputs':['a'],'outputs':['y']}") },
	{ "reciprocal", PROG("", "{'op':'reciprocal','inputs':['a'],'outputs':['y']}") },
	{ "square", PROG("", "{'op':'square','inputs':['s'],'outputs':['y']}") },
	{ "cast", PROG("", "{'op':'cast','inputs':['c'],'outputs':['y']}") },
	{ "gelu_backward", PROG("", "{'op':'gelu_backward','inputs':['a','a'],'outputs':['y']}") },
	{ "gelu_tanh_backward", PROG("", "{'op':'gelu_tanh_backward','inputs':['a','b'],'outputs':['y']}") },
	{ "silu_backward", PROG("", "{'op':'silu_backward','inputs':['a','a'],'outputs':['y']}") },
	{ "sigmoid_backward", PROG("", "{'op':'sigmoid_backward','inputs':['a','a'],'outputs':['y']}") },
	{ "tanh_backward", PROG("", "{'op':'tanh_backward','inputs':['a','a'],'outputs':['y']}") },
	{ "relu_backward", PROG("", "{'op':'relu_backward','inputs':['a','a'],'outputs':['y']}") },
	{ "where", PROG("", "{'op':'where','inputs':['c','a','b'],'outputs':['y']}") },
	{ "fill", PROG("", "{'op':'fill','outputs':['yi'],'attrs':{'scalar':-3}}") },
	{ "iota", PROG("", "{'op':'iota','outputs':['yi'],'attrs':{'axis':0}}") },
	{ "dropout_mask", PROG("", "{'op':'dropout_mask','inputs':['s'],'outputs':['yu'],'attrs':{'p':0.1,'stream':3}}") },
	{ "sum", PROG("", "{'op':'sum','inputs':['a'],'outputs':['r']}") },
	{ "mean", PROG(",{'name':'col','kind':'output','dtype':'f32','shape':[3]}",
		       "{'op':'mean','inputs':['a'],'outputs':['col'],'attrs':{'axis':'leading'}}") },
	{ "max", PROG(",{'name':'k','kind':'output','dtype':'bf16','shape':[4,1]}",
		      "{'op':'max','inputs':['a'],'outputs':['k'],'attrs':{'axis':'last'}}") },
	{ "min", PROG("", "{'op':'min','inputs':['a'],'outputs':['r']}") },
	{ "amax", PROG(",{'name':'one','kind':'output','dtype':'f32','shape':[1,3]}",
		       "{'op':'amax','inputs':['a'],'outputs':['one'],'attrs':{'axis':'leading'}}") },
	{ "embedding", PROG(",{'name':'tab','kind':'input','dtype':'bf16','shape':[10,3]},"
			    "{'name':'ix','kind':'input','dtype':'i32','shape':[2,2]},"
			    "{'name':'e','kind':'output','dtype':'bf16','shape':[2,2,3]}",
			    "{'op':'embedding','inputs':['tab','ix'],'outputs':['e']}") },
	{ "embedding_backward", PROG(",{'name':'ix','kind':'input','dtype':'i64','shape':[4]},"
				     "{'name':'dt','kind':'output','dtype':'f32','shape':[10,3]}",
				     "{'op':'embedding_backward','inputs':['a','ix'],'outputs':['dt']}") },
	{ "rms_norm", PROG("", "{'op':'rms_norm','inputs':['a','b'],'outputs':['y','r'],'attrs':{'eps':1e-5}}") },
	{ "rms_norm_backward",
	  PROG(",{'name':'dw','kind':'output','dtype':'f32','shape':[3]}",
	       "{'op':'rms_norm_backward','inputs':['a','a','b','r'],'outputs':['y','dw']}") },
	{ "softmax", PROG("", "{'op':'softmax','inputs':['a'],'outputs':['y']}") },
	{ "softmax_backward", PROG("", "{'op':'softmax_backward','inputs':['a','a'],'outputs':['yb']}") },
	{ "log_softmax", PROG("", "{'op':'log_softmax','inputs':['a'],'outputs':['y']}") },
	{ "log_softmax_backward", PROG("", "{'op':'log_softmax_backward','inputs':['a','a'],'outputs':['y']}") },
	{ "cross_entropy", PROG(",{'name':'t','kind':'input','dtype':'i32','shape':[4]}",
				"{'op':'cross_entropy','inputs':['a','t'],'outputs':['r'],'attrs':{'ignore_index':0}}") },
	{ "cross_entropy_backward",
	  PROG(",{'name':'t','kind':'input','dtype':'i64','shape':[4]},{'name':'lse','kind':'input','dtype':'f32','shape':[4,1]}",
	       "{'op':'cross_entropy_backward','inputs':['lse','a','t','lse'],'outputs':['yb']}") },
	{ "rotary", PROG(",{'name':'x','kind':'input','dtype':'bf16','shape':[2,5,3,8]},"
			 "{'name':'cs','kind':'input','dtype':'f32','shape':[5,4]},"
			 "{'name':'xr','kind':'output','dtype':'bf16','shape':[2,5,3,8]}",
			 "{'op':'rotary','inputs':['x','cs','cs'],'outputs':['xr']}") },
	{ "rotary_backward", PROG(",{'name':'x','kind':'input','dtype':'f32','shape':[2,3,5,8]},"
				  "{'name':'cs','kind':'input','dtype':'f32','shape':[5,4]},"
				  "{'name':'xr','kind':'output','dtype':'f32','shape':[2,3,5,8]}",
				  "{'op':'rotary_backward','inputs':['x','cs','cs'],'outputs':['xr'],'attrs':{'layout':'bhsd'}}") },
	{ "adamw", PROG(",{'name':'p','kind':'inout','dtype':'f32','shape':[3]},"
			"{'name':'m','kind':'inout','dtype':'f32','shape':[3]},"
			"{'name':'v','kind':'inout','dtype':'f32','shape':[3]},"
			"{'name':'step','kind':'scalar'}",
			"{'op':'adamw','inputs':['p','b','m','v'],'attrs':{'lr':'s','step':'step','weight_decay':0}},"
			"{'op':'fill','outputs':['y'],'attrs':{'scalar':0}},{'op':'fill','outputs':['yb'],'attrs':{'scalar':0}}") },
	{ "sgd", PROG(",{'name':'p','kind':'inout','dtype':'f32','shape':[3]},"
		      "{'name':'m','kind':'inout','dtype':'f32','shape':[3]}",
		      "{'op':'sgd','inputs':['p','b','m'],'attrs':{'lr':0.1,'momentum':0.9,'nesterov':true}}") },
};

/* The outputs a row does not write are written by fills added here. */
static const char *const fills = "{'op':'fill','name':'fy','outputs':['y'],'attrs':{'scalar':0}},"
				 "{'op':'fill','name':'fyb','outputs':['yb'],'attrs':{'scalar':0}},"
				 "{'op':'fill','name':'fyu','outputs':['yu'],'attrs':{'scalar':0}},"
				 "{'op':'fill','name':'fyi','outputs':['yi'],'attrs':{'scalar':0}},"
				 "{'op':'fill','name':'fr','outputs':['r'],'attrs':{'scalar':0}},";

/* The row's node is the definition's node ROW, after the fills. */
#define ROW 5

/* program with the fills put first (the row's node may overwrite what
 * they wrote); malloc'ed. */
static char *with_fills(const char *program)
{
	const char *nodes = strstr(program, "'nodes':[") + strlen("'nodes':[");
	size_t head = (size_t)(nodes - program);
	char *text = malloc(strlen(program) + strlen(fills) + 1);

	ck_assert_ptr_nonnull(text);
	memcpy(text, program, head);
	strcpy(text + head, fills);
	strcat(text, nodes);
	return text;
}

START_TEST(every_op_is_accepted)
{
	const struct ok_case *c = &ok_cases[_i];
	char *text = with_fills(c->program);
	struct rp_program p;

	define_ok(text, &p);
	ck_assert_ptr_eq(rp_prog_op_find(c->op), rp_prog_op_find(c->op));
	ck_assert_ptr_nonnull(rp_prog_op_find(c->op));
	bool found = false;
	for (int i = 0; i < p.nnodes; i++) {
		ck_assert_int_ne(p.nodes[i].op->cls, RP_PC_COMPOSITE);
		found = found || p.nodes[i].source == ROW;
	}
	ck_assert_msg(found, "%s: no node came from the row's node", c->op);
	rp_program_finish(&p);
	free(text);
}
END_TEST

/* Every name of enum rp_pointwise, rp_reduction and rp_gather is in the
 * table, and no two entries share a name. */
START_TEST(the_table_covers_every_primitive)
{
	static const char *const pointwise[RP_PW_COUNT] = {
		"add", "sub", "mul", "div", "pow", "maximum", "minimum", "eq", "ne", "lt", "le", "gt", "ge", "neg", "exp",
		"log", "tanh", "erf", "sigmoid", "silu", "gelu", "gelu_tanh", "relu", "sqrt", "rsqrt", "abs",
		"reciprocal", "square", "cast", "gelu_backward", "gelu_tanh_backward", "silu_backward",
		"sigmoid_backward", "tanh_backward", "relu_backward", "where", "fill", "iota", "dropout_mask",
	};
	static const char *const reductions[RP_RED_COUNT] = { "sum", "mean", "max", "min", "amax", "logsumexp" };

	for (int i = 0; i < RP_PW_COUNT; i++) {
		const struct rp_prog_op *op = rp_prog_op_find(pointwise[i]);

		ck_assert_msg(op && op->cls == RP_PC_POINTWISE && op->fn == i && op->in_place, "%s", pointwise[i]);
	}
	for (int i = 0; i < RP_RED_COUNT; i++) {
		const struct rp_prog_op *op = rp_prog_op_find(reductions[i]);

		ck_assert_msg(op && op->cls == RP_PC_REDUCTION && op->fn == i && !op->in_place, "%s", reductions[i]);
	}
	ck_assert_int_eq(rp_prog_op_find("embedding")->fn, RP_GATHER_EMBEDDING);
	ck_assert_int_eq(rp_prog_op_find("embedding_backward")->fn, RP_GATHER_EMBEDDING_BACKWARD);
	for (int id = 0; id < RP_OP_COUNT; id++) {
		const struct rp_prog_op *op = rp_prog_op_find(rp_op_get((enum rp_op_id)id)->name);

		ck_assert_msg(op && op->cls == RP_PC_COMPUTE && op->fn == id, "%s", rp_op_get((enum rp_op_id)id)->name);
	}
	for (size_t i = 0; i < N(ok_cases); i++) {
		for (size_t j = 0; j < i; j++) {
			ck_assert_str_ne(ok_cases[i].op, ok_cases[j].op);
		}
	}
	ck_assert_ptr_null(rp_prog_op_find("conv2d"));
	ck_assert_ptr_null(rp_prog_op_find(NULL));
}
END_TEST

/* ---- what Define derives ---------------------------------------------------------------- */

START_TEST(define_derives_layout_binding_and_lifetimes)
{
	struct rp_program p;
	int x, w, h, ht, y, lr, sl;

	define_ok("{'name':'mlp','tensors':["
		  "{'name':'x','kind':'input','dtype':'bf16','shape':[8,16]},"
		  "{'name':'w','kind':'input','dtype':'bf16','shape':[32,16],'strides':[16,1]},"
		  "{'name':'h','kind':'intermediate','dtype':'bf16','shape':[8,32]},"
		  "{'name':'ht','kind':'view','base':'h','shape':[32,8],'strides':[1,32]},"
		  "{'name':'lr','kind':'scalar','shape':[]},"
		  "{'name':'y','kind':'output','dtype':'f32','shape':[32,8]},"
		  "{'name':'sl','kind':'view','base':'y','offset':8,'shape':[2,8]}],"
		  "'nodes':[{'op':'gemm','name':'fc','inputs':{'a':'x','b':'w'},'outputs':{'d':'h'},"
		  "'attrs':{'trans_b':true}},"
		  "{'op':'mul','name':'scale','inputs':['ht','lr'],'outputs':['y']},"
		  "{'op':'relu','name':'act','inputs':['sl'],'outputs':['sl']}]}",
		  &p);
	x = tensor(&p, "x");
	w = tensor(&p, "w");
	h = tensor(&p, "h");
	ht = tensor(&p, "ht");
	y = tensor(&p, "y");
	lr = tensor(&p, "lr");
	sl = tensor(&p, "sl");
	ck_assert_str_eq(p.name, "mlp");
	ck_assert_int_eq(p.ntensors, 7);
	ck_assert_int_eq(p.nnodes, 3);
	/* Bound in definition order; intermediates and views are not. */
	ck_assert_int_eq(p.nbound, 4);
	ck_assert_int_eq(p.bind[0], x);
	ck_assert_int_eq(p.bind[1], w);
	ck_assert_int_eq(p.bind[2], lr);
	ck_assert_int_eq(p.bind[3], y);
	ck_assert_int_eq(p.tensors[lr].bind_index, 2);
	ck_assert_int_eq(p.tensors[h].bind_index, -1);
	ck_assert_int_eq(p.tensors[lr].kind, RP_PT_SCALAR);
	ck_assert_int_eq(p.tensors[lr].dtype, RP_DTYPE_F64);
	ck_assert_int_eq(p.tensors[lr].rank, 0);
	ck_assert_uint_eq(rp_prog_tensor_elem_size(&p.tensors[lr]), 8);
	/* Layout: contiguous unless given; a view's root and offset. */
	ck_assert(rp_prog_tensor_contiguous(&p.tensors[h]));
	ck_assert(!rp_prog_tensor_contiguous(&p.tensors[ht]));
	ck_assert_int_eq(p.tensors[h].strides[0], 32);
	ck_assert_int_eq(p.tensors[ht].root, h);
	ck_assert_int_eq(p.tensors[ht].base, h);
	ck_assert_int_eq(p.tensors[sl].root, y);
	ck_assert_int_eq(p.tensors[sl].root_offset, 8);
	ck_assert_int_eq(p.tensors[sl].numel, 16);
	ck_assert_uint_eq(p.tensors[y].extent_bytes, 32 * 8 * 4);
	ck_assert_uint_eq(p.tensors[sl].extent_bytes, (8 + 16) * 4);
	ck_assert_uint_eq(p.tensors[w].extent_bytes, 32 * 16 * 2);
	ck_assert_uint_eq(p.intermediate_bytes, 8 * 32 * 2);
	/* The gemm's descriptor, as io.regen.Compute would have it. */
	ck_assert_ptr_eq(p.nodes[0].compute.spec, &rp_op_gemm);
	ck_assert_int_eq(p.nodes[0].compute.gemm.m, 8);
	ck_assert_int_eq(p.nodes[0].compute.gemm.n, 32);
	ck_assert_int_eq(p.nodes[0].compute.gemm.k, 16);
	ck_assert(p.nodes[0].compute.gemm.trans_b);
	ck_assert(p.nodes[0].compute.present[RP_GEMM_D] && !p.nodes[0].compute.present[RP_GEMM_C]);
	ck_assert_int_eq(p.nodes[0].in[RP_GEMM_D], h);
	ck_assert_int_eq(p.nodes[0].nin, RP_GEMM_OPERANDS);
	/* Lifetimes: a root's are its views' too. */
	ck_assert_int_eq(p.tensors[h].first_write, 0);
	ck_assert_int_eq(p.tensors[h].last_read, 1);
	ck_assert_int_eq(p.tensors[ht].first_write, -1);
	ck_assert_int_eq(p.tensors[ht].last_read, 1);
	ck_assert_int_eq(p.tensors[y].first_write, 1);
	ck_assert_int_eq(p.tensors[y].last_write, 2);
	ck_assert_int_eq(p.tensors[y].last_read, 2);
	ck_assert_int_eq(p.tensors[x].first_write, -1);
	ck_assert(!p.updates_in_place);
	ck_assert_str_eq(cJSON_GetObjectItemCaseSensitive(p.definition, "name")->valuestring, "mlp");
	rp_program_finish(&p);
	ck_assert_ptr_null(p.tensors);
	rp_program_finish(&p);
	rp_program_finish(NULL);
}
END_TEST

START_TEST(in_place_update_of_an_inout_is_noted)
{
	struct rp_program p;

	define_ok("{'tensors':[{'name':'p','kind':'inout','dtype':'f32','shape':[4]},"
		  "{'name':'g','kind':'input','dtype':'f32','shape':[4]}],"
		  "'nodes':[{'op':'sub','inputs':['p','g'],'outputs':['p']}]}",
		  &p);
	ck_assert(p.updates_in_place);
	ck_assert_str_eq(p.nodes[0].name, "sub_0");
	rp_program_finish(&p);
}
END_TEST

/* ---- each rule refused, naming the node ---------------------------------------------------- */

#define T_X "{'name':'x','kind':'input','dtype':'f32','shape':[4,3]}"
#define T_Y "{'name':'y','kind':'output','dtype':'f32','shape':[4,3]}"
#define T_H "{'name':'h','kind':'intermediate','dtype':'f32','shape':[4,3]}"

struct bad_case {
	const char *what;
	const char *program;
	const char *error;
	const char *key;      /* node (InvalidProgram), parameter, resource */
	const char *value;
	const char *has;      /* words the reason must hold, or NULL */
};

#define IP RP_ERR_INVALID_PROGRAM, "node"
#define PARAM RP_ERR_INVALID_PARAMETER, "parameter"

static const struct bad_case bad_cases[] = {
	/* Ops and attrs. */
	{ "unknown op", "{'tensors':[" T_X "," T_Y "],'nodes':[{'op':'conv2d','name':'c1','inputs':['x'],'outputs':['y']}]}",
	  IP, "nodes[0] (c1)", "unknown op 'conv2d'" },
	{ "unknown attr", "{'tensors':[" T_X "," T_Y "],'nodes':[{'op':'relu','inputs':['x'],'outputs':['y'],'attrs':{'alpha':1}}]}",
	  PARAM, "nodes[0].attrs.alpha", NULL },
	{ "attr of a wrong type", "{'tensors':[" T_X "," T_Y "],'nodes':[{'op':'add','inputs':['x'],'outputs':['y'],"
	  "'attrs':{'scalar':'one'}}]}", PARAM, "nodes[0].attrs.scalar", NULL },
	{ "compute attr out of range", "{'tensors':[" T_X "," T_Y ",{'name':'w','kind':'input','dtype':'f32','shape':[3]}],"
	  "'nodes':[{'op':'layer_norm','inputs':{'x':'x','weight':'w'},'outputs':{'y':'y'},'attrs':{'eps':-1}}]}",
	  PARAM, "nodes[0].attrs.eps", NULL },
	{ "compute attr unknown", "{'tensors':[" T_X "," T_Y "],'nodes':[{'op':'gemm','inputs':{'a':'x','b':'x'},"
	  "'outputs':{'d':'y'},'attrs':{'scale':2}}]}", PARAM, "nodes[0].attrs.scale", NULL },
	{ "compute operand unknown", "{'tensors':[" T_X "," T_Y "],'nodes':[{'op':'gemm','inputs':{'a':'x','q':'x'},"
	  "'outputs':{'d':'y'}}]}", PARAM, "nodes[0].inputs.q", NULL },
	{ "compute operand missing", "{'tensors':[" T_X "," T_Y "],'nodes':[{'op':'gemm','inputs':{'a':'x'},"
	  "'outputs':{'d':'y'}}]}", PARAM, "nodes[0].inputs.b", NULL },
	{ "compute output under inputs", "{'tensors':[" T_X "," T_Y "],'nodes':[{'op':'gemm','name':'g',"
	  "'inputs':{'a':'x','b':'x','d':'y'}}]}", IP, "nodes[0] (g)", "name it under outputs" },
	{ "operands listed for a compute op", "{'tensors':[" T_X "," T_Y "],'nodes':[{'op':'gemm','inputs':['x','x'],"
	  "'outputs':['y']}]}", PARAM, "nodes[0].inputs", NULL },
	{ "unknown tensor", "{'tensors':[" T_X "," T_Y "],'nodes':[{'op':'relu','name':'r','inputs':['z'],'outputs':['y']}]}",
	  IP, "nodes[0] (r)", "'z', which is not declared" },
	{ "too many inputs", "{'tensors':[" T_X "," T_Y "],'nodes':[{'op':'relu','name':'r','inputs':['x','x'],'outputs':['y']}]}",
	  IP, "nodes[0] (r)", "relu takes 1 input, not 2" },
	{ "binary op with one input and no scalar", "{'tensors':[" T_X "," T_Y "],'nodes':[{'op':'add','name':'a',"
	  "'inputs':['x'],'outputs':['y']}]}", IP, "nodes[0] (a)", "add takes 2 tensor inputs" },
	{ "binary op with two inputs and a scalar", "{'tensors':[" T_X "," T_Y "],'nodes':[{'op':'mul','name':'a',"
	  "'inputs':['x','x'],'outputs':['y'],'attrs':{'scalar':2}}]}", IP, "nodes[0] (a)", "besides its scalar" },
	{ "null operand of a primitive", "{'tensors':[" T_X "," T_Y "],'nodes':[{'op':'add','inputs':['x',null],"
	  "'outputs':['y']}]}", PARAM, "nodes[0].inputs[1]", NULL },
	/* Dtypes. */
	{ "an FP8 input to arithmetic", "{'tensors':[" T_Y ",{'name':'q','kind':'input','dtype':'e4m3','shape':[3]}],"
	  "'nodes':[{'op':'exp','name':'e','inputs':['q'],'outputs':['y']}]}", IP, "nodes[0] (e)",
	  "operands of gemm, quantize and transpose_quantize only" },
	{ "a cast to FP8", "{'tensors':[" T_X ",{'name':'q','kind':'output','dtype':'e5m2','shape':[4,3]}],"
	  "'nodes':[{'op':'cast','name':'c','inputs':['x'],'outputs':['q']}]}", IP, "nodes[0] (c)", "cast does not take q" },
	{ "integer input to arithmetic", "{'tensors':[" T_Y ",{'name':'i','kind':'input','dtype':'i32','shape':[3]}],"
	  "'nodes':[{'op':'exp','name':'e','inputs':['i'],'outputs':['y']}]}", IP, "nodes[0] (e)", "cast it first" },
	{ "integer output of arithmetic", "{'tensors':[" T_X ",{'name':'y','kind':'output','dtype':'u8','shape':[4,3]}],"
	  "'nodes':[{'op':'add','name':'e','inputs':['x','x'],'outputs':['y']}]}", IP, "nodes[0] (e)", "cast the result" },
	{ "where mixing floats and integers", "{'tensors':[" T_X "," T_Y ",{'name':'i','kind':'input','dtype':'i64','shape':[3]}],"
	  "'nodes':[{'op':'where','name':'w','inputs':['x','i','x'],'outputs':['y']}]}", IP, "nodes[0] (w)",
	  "all floats or all integers" },
	{ "fill an integer with a fraction", "{'tensors':[{'name':'y','kind':'output','dtype':'i32','shape':[2]}],"
	  "'nodes':[{'op':'fill','name':'f','outputs':['y'],'attrs':{'scalar':0.5}}]}", IP, "nodes[0] (f)", "does not hold" },
	{ "gemm of f64", "{'tensors':[{'name':'x','kind':'input','dtype':'f64','shape':[4,4]},"
	  "{'name':'y','kind':'output','dtype':'f64','shape':[4,4]}],'nodes':[{'op':'gemm','name':'fc',"
	  "'inputs':{'a':'x','b':'x'},'outputs':{'d':'y'}}]}", IP, "nodes[0] (fc)", "operand a (tensor x): a is f64" },
	/* What the protocol would pass on to cuBLASLt, which has no kernel for it
	 * (proto/compute_gemm.c's check_fp8, at define time as for Compute). */
	{ "FP8 gemm of two e4m3 into e5m2", "{'tensors':[{'name':'q','kind':'input','dtype':'e4m3','shape':[16,32]},"
	  "{'name':'s','kind':'input','dtype':'f32','shape':[1]},"
	  "{'name':'g','kind':'output','dtype':'e5m2','shape':[16,16]}],'nodes':[{'op':'gemm','name':'fc',"
	  "'inputs':{'a':'q','b':'q','a_scale':'s','b_scale':'s','d_scale':'s'},'outputs':{'d':'g'},"
	  "'attrs':{'trans_b':true}}]}", IP, "nodes[0] (fc)", "operand d (tensor g): a and b are e4m3 and d is e5m2" },
	{ "embedding index of floats", "{'tensors':[" T_X "," T_Y ",{'name':'ix','kind':'input','dtype':'f32','shape':[4]}],"
	  "'nodes':[{'op':'embedding','name':'emb','inputs':['x','ix'],'outputs':['y']}]}", IP, "nodes[0] (emb)",
	  "must be i32 or i64" },
	/* Shapes. */
	{ "gemm shapes disagree", "{'tensors':[" T_X "," T_Y "],'nodes':[{'op':'gemm','name':'fc',"
	  "'inputs':{'a':'x','b':'x'},'outputs':{'d':'y'}}]}", IP, "nodes[0] (fc)", "operand b (tensor x): op(A) is [4, 3]" },
	{ "compute operand of a wrong rank", "{'tensors':[" T_Y ",{'name':'x','kind':'input','dtype':'f32','shape':[2,4,3]}],"
	  "'nodes':[{'op':'gemm','name':'fc','inputs':{'a':'x','b':'x'},'outputs':{'d':'y'}}]}", IP, "nodes[0] (fc)",
	  "operand a (tensor x) is [2, 4, 3] but must be rank 2" },
	{ "broadcast that does not fit", "{'tensors':[" T_X "," T_Y ",{'name':'v','kind':'input','dtype':'f32','shape':[4]}],"
	  "'nodes':[{'op':'add','name':'bias','inputs':['x','v'],'outputs':['y']}]}", IP, "nodes[0] (bias)",
	  "v is [4], which does not broadcast to its output y's [4, 3]" },
	{ "input of a higher rank than the output", "{'tensors':[" T_Y ",{'name':'v','kind':'input','dtype':'f32','shape':[1,4,3]}],"
	  "'nodes':[{'op':'neg','name':'n','inputs':['v'],'outputs':['y']}]}", IP, "nodes[0] (n)", "does not broadcast" },
	{ "reduction to a wrong shape", "{'tensors':[" T_X ",{'name':'r','kind':'output','dtype':'f32','shape':[3]}],"
	  "'nodes':[{'op':'sum','name':'s','inputs':['x'],'outputs':['r']}]}", IP, "nodes[0] (s)", "the last dimension" },
	{ "logsumexp over the leading dims", "{'tensors':[" T_X ",{'name':'r','kind':'output','dtype':'f32','shape':[3]}],"
	  "'nodes':[{'op':'logsumexp','name':'l','inputs':['x'],'outputs':['r'],'attrs':{'axis':'leading'}}]}",
	  IP, "nodes[0] (l)", "the last dimension only" },
	{ "reduction of a rank-0 tensor", "{'tensors':[{'name':'s','kind':'scalar'},{'name':'r','kind':'output','dtype':'f32','shape':[]}],"
	  "'nodes':[{'op':'sum','name':'s','inputs':['s'],'outputs':['r']}]}", IP, "nodes[0] (s)", "nothing to reduce" },
	{ "iota along a missing axis", "{'tensors':[{'name':'y','kind':'output','dtype':'i32','shape':[4]}],"
	  "'nodes':[{'op':'iota','name':'i','outputs':['y'],'attrs':{'axis':1}}]}", IP, "nodes[0] (i)", "axis 1" },
	{ "dropout_mask without a seed", "{'tensors':[" T_Y "],'nodes':[{'op':'dropout_mask','name':'drop',"
	  "'inputs':[],'outputs':['y'],'attrs':{'p':0.1}}]}", IP, "nodes[0] (drop)",
	  "dropout_mask takes 1 input, not 0: [seed] -> [mask], seed a scalar tensor" },
	{ "dropout_mask seeded by an input tensor", "{'tensors':[" T_Y ",{'name':'sd','kind':'input','dtype':'f64','shape':[]}],"
	  "'nodes':[{'op':'dropout_mask','name':'drop','inputs':['sd'],'outputs':['y'],'attrs':{'p':0.1}}]}", IP,
	  "nodes[0] (drop)", "its seed sd is a tensor of kind input, but must be one of kind scalar" },
	{ "dropout_mask seeded by a view of a scalar", "{'tensors':[" T_Y ",{'name':'s','kind':'scalar'},"
	  "{'name':'sv','kind':'view','base':'s','shape':[]}],"
	  "'nodes':[{'op':'dropout_mask','name':'drop','inputs':['sv'],'outputs':['y'],'attrs':{'p':0.1}}]}", IP,
	  "nodes[0] (drop)", "its seed sv is a tensor of kind view" },
	{ "dropout_mask with p 1", "{'tensors':[" T_Y ",{'name':'s','kind':'scalar'}],'nodes':[{'op':'dropout_mask',"
	  "'inputs':['s'],'outputs':['y'],'attrs':{'p':1}}]}", PARAM, "nodes[0].attrs.p", NULL },
	{ "dropout_mask with a negative p", "{'tensors':[" T_Y ",{'name':'s','kind':'scalar'}],'nodes':[{'op':'dropout_mask',"
	  "'inputs':['s'],'outputs':['y'],'attrs':{'p':-0.1}}]}", PARAM, "nodes[0].attrs.p", NULL },
	{ "dropout_mask with p as a string", "{'tensors':[" T_Y ",{'name':'s','kind':'scalar'}],'nodes':[{'op':'dropout_mask',"
	  "'inputs':['s'],'outputs':['y'],'attrs':{'p':'nan'}}]}", PARAM, "nodes[0].attrs.p", NULL },
	{ "dropout_mask without p", "{'tensors':[" T_Y ",{'name':'s','kind':'scalar'}],'nodes':[{'op':'dropout_mask',"
	  "'inputs':['s'],'outputs':['y']}]}", PARAM, "nodes[0].attrs.p", NULL },
	{ "dropout_mask with a stream past 32 bits", "{'tensors':[" T_Y ",{'name':'s','kind':'scalar'}],"
	  "'nodes':[{'op':'dropout_mask','inputs':['s'],'outputs':['y'],'attrs':{'p':0.5,'stream':4294967296}}]}",
	  PARAM, "nodes[0].attrs.stream", NULL },
	{ "dropout_mask with a negative stream", "{'tensors':[" T_Y ",{'name':'s','kind':'scalar'}],"
	  "'nodes':[{'op':'dropout_mask','inputs':['s'],'outputs':['y'],'attrs':{'p':0.5,'stream':-1}}]}",
	  PARAM, "nodes[0].attrs.stream", NULL },
	{ "embedding rows of a wrong shape", "{'tensors':[" T_X ",{'name':'ix','kind':'input','dtype':'i32','shape':[5]},"
	  "{'name':'e','kind':'output','dtype':'f32','shape':[4,3]}],'nodes':[{'op':'embedding','name':'emb',"
	  "'inputs':['x','ix'],'outputs':['e']}]}", IP, "nodes[0] (emb)", "[N, 3]" },
	/* Order. */
	{ "read before write", "{'tensors':[" T_X "," T_Y "," T_H "],'nodes':[{'op':'relu','name':'r','inputs':['h'],"
	  "'outputs':['y']},{'op':'relu','name':'w','inputs':['x'],'outputs':['h']}]}", IP, "nodes[0] (r)",
	  "reads h before any node writes it" },
	{ "a node reading its own output", "{'tensors':[" T_X "," T_Y "," T_H "],'nodes':[{'op':'add','name':'acc',"
	  "'inputs':['h','x'],'outputs':['h']},{'op':'relu','inputs':['h'],'outputs':['y']}]}", IP, "nodes[0] (acc)",
	  "its own output" },
	{ "an output read before written", "{'tensors':[" T_X "," T_Y "],'nodes':[{'op':'add','name':'a',"
	  "'inputs':['y','x'],'outputs':['y']}]}", IP, "nodes[0] (a)", "its own output" },
	{ "an output never written", "{'tensors':[" T_X "," T_Y ",{'name':'z','kind':'output','dtype':'f32','shape':[1]}],"
	  "'nodes':[{'op':'relu','inputs':['x'],'outputs':['y']}]}", IP, "tensors[2] (z)", "no node writes it" },
	{ "an input written", "{'tensors':[" T_X "," T_Y "],'nodes':[{'op':'relu','name':'r','inputs':['x'],'outputs':['x']},"
	  "{'op':'relu','inputs':['x'],'outputs':['y']}]}", IP, "nodes[0] (r)", "x, an input, which is read only" },
	{ "an input written through a view", "{'tensors':[" T_X "," T_Y ",{'name':'xv','kind':'view','base':'x','shape':[3]}],"
	  "'nodes':[{'op':'fill','name':'f','outputs':['xv'],'attrs':{'scalar':1}},"
	  "{'op':'relu','inputs':['x'],'outputs':['y']}]}", IP, "nodes[0] (f)", "xv, a view of x, an input" },
	{ "a scalar written", "{'tensors':[{'name':'s','kind':'scalar'}," T_Y "],'nodes':[{'op':'fill','name':'f',"
	  "'outputs':['s'],'attrs':{'scalar':1}},{'op':'fill','outputs':['y'],'attrs':{'scalar':1}}]}",
	  IP, "nodes[0] (f)", "a scalar" },
	/* Memory. */
	{ "output aliasing input", "{'tensors':[{'name':'m','kind':'inout','dtype':'f32','shape':[4,4]}],"
	  "'nodes':[{'op':'gemm','name':'fc','inputs':{'a':'m','b':'m'},'outputs':{'d':'m'}}]}", IP, "nodes[0] (fc)",
	  "writes m, which shares memory with its input m" },
	{ "pointwise output overlapping its input off by one", "{'tensors':[{'name':'m','kind':'inout','dtype':'f32','shape':[8]},"
	  "{'name':'lo','kind':'view','base':'m','shape':[4]},{'name':'hi','kind':'view','base':'m','offset':1,'shape':[4]}],"
	  "'nodes':[{'op':'neg','name':'n','inputs':['lo'],'outputs':['hi']}]}", IP, "nodes[0] (n)",
	  "unless it is the very same tensor" },
	{ "reduction in place", "{'tensors':[{'name':'m','kind':'inout','dtype':'f32','shape':[4,4]},"
	  "{'name':'col','kind':'view','base':'m','shape':[4],'strides':[4]}],"
	  "'nodes':[{'op':'sum','name':'s','inputs':['m'],'outputs':['col']}]}", IP, "nodes[0] (s)", "shares memory" },
	{ "two outputs of one node overlapping", "{'tensors':[" T_X "," T_Y ",{'name':'w','kind':'input','dtype':'f32','shape':[3]},"
	  "{'name':'st','kind':'output','dtype':'f32','shape':[4]}],'nodes':[{'op':'layer_norm','name':'ln',"
	  "'inputs':{'x':'x','weight':'w'},'outputs':{'y':'y','mean':'st','rstd':'st'}}]}", IP, "nodes[0] (ln)",
	  "its outputs st and st share memory" },
	{ "a broadcast view written", "{'tensors':[" T_X ",{'name':'y','kind':'output','dtype':'f32','shape':[3]},"
	  "{'name':'yb','kind':'view','base':'y','shape':[4,3],'strides':[0,1]}],"
	  "'nodes':[{'op':'relu','name':'r','inputs':['x'],'outputs':['yb']}]}", IP, "nodes[0] (r)", "broadcast dimension" },
	{ "an output whose strides overlap", "{'tensors':[" T_X ",{'name':'y','kind':'output','dtype':'f32','shape':[4,3],"
	  "'strides':[2,1]}],'nodes':[{'op':'relu','name':'r','inputs':['x'],'outputs':['y']}]}", IP, "nodes[0] (r)",
	  "make elements share memory" },
	/* Tensors. */
	{ "view out of its base", "{'tensors':[" T_X ",{'name':'v','kind':'view','base':'x','offset':10,'shape':[2,3]}],"
	  "'nodes':[]}", IP, "tensors[1] (v)", "a view lies inside its base" },
	{ "view of a tensor defined after it", "{'tensors':[{'name':'v','kind':'view','base':'x','shape':[3]}," T_X "],"
	  "'nodes':[]}", IP, "tensors[0] (v)", "not a tensor defined before it" },
	{ "view of another dtype", "{'tensors':[" T_X ",{'name':'v','kind':'view','base':'x','dtype':'bf16','shape':[3]}],"
	  "'nodes':[]}", IP, "tensors[1] (v)", "has its base's dtype" },
	{ "view without a base", "{'tensors':[{'name':'v','kind':'view','dtype':'f32','shape':[3]}],'nodes':[]}",
	  PARAM, "tensors[0].base", NULL },
	{ "base on a non-view", "{'tensors':[" T_X ",{'name':'v','kind':'input','base':'x','dtype':'f32','shape':[3]}],"
	  "'nodes':[]}", PARAM, "tensors[1].base", NULL },
	{ "strides on an intermediate", "{'tensors':[{'name':'h','kind':'intermediate','dtype':'f32','shape':[3],'strides':[1]}],"
	  "'nodes':[]}", PARAM, "tensors[0].strides", NULL },
	{ "strides of another rank", "{'tensors':[{'name':'h','kind':'input','dtype':'f32','shape':[3,3],'strides':[1]}],"
	  "'nodes':[]}", PARAM, "tensors[0].strides", NULL },
	{ "negative stride", "{'tensors':[{'name':'h','kind':'input','dtype':'f32','shape':[3],'strides':[-1]}],"
	  "'nodes':[]}", PARAM, "tensors[0].strides", NULL },
	{ "a dim of 0", "{'tensors':[{'name':'h','kind':'input','dtype':'f32','shape':[3,0]}],'nodes':[]}",
	  PARAM, "tensors[0].shape", NULL },
	{ "rank 7", "{'tensors':[{'name':'h','kind':'input','dtype':'f32','shape':[1,1,1,1,1,1,1]}],'nodes':[]}",
	  PARAM, "tensors[0].shape", NULL },
	{ "a scalar of another dtype", "{'tensors':[{'name':'s','kind':'scalar','dtype':'f32'}],'nodes':[]}",
	  PARAM, "tensors[0].dtype", NULL },
	{ "a scalar with a shape", "{'tensors':[{'name':'s','kind':'scalar','shape':[1]}],'nodes':[]}",
	  PARAM, "tensors[0].shape", NULL },
	{ "unknown dtype", "{'tensors':[{'name':'h','kind':'input','dtype':'f8','shape':[3]}],'nodes':[]}",
	  PARAM, "tensors[0].dtype", NULL },
	{ "empty dtype", "{'tensors':[{'name':'h','kind':'input','dtype':'','shape':[3]}],'nodes':[]}",
	  PARAM, "tensors[0].dtype", NULL },
	{ "empty base", "{'tensors':[{'name':'v','kind':'view','base':'','shape':[3]}],'nodes':[]}",
	  PARAM, "tensors[0].base", NULL },
	{ "empty op", "{'tensors':[],'nodes':[{'op':''}]}", PARAM, "nodes[0].op", NULL },
	{ "unknown kind", "{'tensors':[{'name':'h','kind':'weight','dtype':'f32','shape':[3]}],'nodes':[]}",
	  PARAM, "tensors[0].kind", NULL },
	{ "unknown tensor field", "{'tensors':[{'name':'h','kind':'input','dtype':'f32','shape':[3],'device':0}],'nodes':[]}",
	  PARAM, "tensors[0].device", NULL },
	{ "a name with a space", "{'tensors':[{'name':'h 1','kind':'input','dtype':'f32','shape':[3]}],'nodes':[]}",
	  PARAM, "tensors[0].name", NULL },
	{ "a name of 65 bytes", "{'tensors':[{'name':'" "aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa"
	  "','kind':'input','dtype':'f32','shape':[3]}],'nodes':[]}", PARAM, "tensors[0].name", NULL },
	{ "two tensors of one name", "{'tensors':[" T_X "," T_X "],'nodes':[]}", IP, "tensors[1] (x)", "tensors[0]" },
	{ "two nodes of one name", "{'tensors':[" T_X "," T_Y "],'nodes':[{'op':'relu','name':'r','inputs':['x'],"
	  "'outputs':['y']},{'op':'relu','name':'r','inputs':['x'],'outputs':['y']}]}", IP, "nodes[1] (r)", "unique" },
	{ "a composite's generated name taken", "{'tensors':[" T_X "," T_Y ",{'name':'sm.0','kind':'input','dtype':'f32','shape':[1]}],"
	  "'nodes':[{'op':'softmax','name':'sm','inputs':['x'],'outputs':['y']}]}", IP, "nodes[0] (sm)",
	  "sm.0 of a tensor it lowers into is taken by tensors[2]" },
	{ "a composite's name too long for its parts", "{'tensors':[" T_X "," T_Y "],'nodes':[{'op':'softmax','name':'"
	  "aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa','inputs':['x'],'outputs':['y']}]}",
	  RP_ERR_INVALID_PROGRAM, "node", "nodes[0] (aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa)",
	  "shorten it" },
	{ "no tensors", "{'nodes':[]}", PARAM, "tensors", NULL },
	{ "nodes not a list", "{'tensors':[],'nodes':{}}", PARAM, "nodes", NULL },
	{ "a node not an object", "{'tensors':[],'nodes':[1]}", PARAM, "nodes[0]", NULL },
	{ "a node without an op", "{'tensors':[],'nodes':[{'inputs':[]}]}", PARAM, "nodes[0].op", NULL },
	{ "an unknown program field", "{'tensors':[],'nodes':[],'version':2}", PARAM, "version", NULL },
	{ "a program name with a slash", "{'name':'a/b','tensors':[],'nodes':[]}", PARAM, "name", NULL },
	/* Composites check their own operands, naming the composite. */
	{ "rms_norm weight of a wrong length", "{'tensors':[" T_X "," T_Y ",{'name':'w','kind':'input','dtype':'f32','shape':[4]}],"
	  "'nodes':[{'op':'rms_norm','name':'norm','inputs':['x','w'],'outputs':['y']}]}", IP, "nodes[0] (norm)",
	  "rms_norm's weight w is [4] but x is [4, 3]: it must be [3]" },
	{ "rms_norm eps of 0", "{'tensors':[" T_X "," T_Y "],'nodes':[{'op':'rms_norm','inputs':['x'],'outputs':['y'],"
	  "'attrs':{'eps':0}}]}", PARAM, "nodes[0].attrs.eps", NULL },
	{ "rms_norm_backward dweight without weight", "{'tensors':[" T_X "," T_Y ",{'name':'r','kind':'input','dtype':'f32','shape':[4]},"
	  "{'name':'dw','kind':'output','dtype':'f32','shape':[3]}],'nodes':[{'op':'rms_norm_backward','name':'nb',"
	  "'inputs':['x','x',null,'r'],'outputs':['y','dw']}]}", IP, "nodes[0] (nb)", "no weight" },
	{ "softmax to another shape", "{'tensors':[" T_X ",{'name':'y','kind':'output','dtype':'f32','shape':[3,4]}],"
	  "'nodes':[{'op':'softmax','name':'sm','inputs':['x'],'outputs':['y']}]}", IP, "nodes[0] (sm)", "shaped like" },
	{ "cross_entropy target of floats", "{'tensors':[" T_X ",{'name':'t','kind':'input','dtype':'f32','shape':[4]},"
	  "{'name':'l','kind':'output','dtype':'f32','shape':[4]}],'nodes':[{'op':'cross_entropy','name':'ce',"
	  "'inputs':['x','t'],'outputs':['l']}]}", IP, "nodes[0] (ce)", "must be i32 or i64 [4]" },
	{ "rotary of an odd head dim", "{'tensors':[{'name':'x','kind':'input','dtype':'f32','shape':[1,2,2,3]},"
	  "{'name':'c','kind':'input','dtype':'f32','shape':[2,1]},{'name':'y','kind':'output','dtype':'f32','shape':[1,2,2,3]}],"
	  "'nodes':[{'op':'rotary','name':'rope','inputs':['x','c','c'],'outputs':['y']}]}", IP, "nodes[0] (rope)", "D even" },
	{ "rotary with cos of a wrong shape", "{'tensors':[{'name':'x','kind':'input','dtype':'f32','shape':[1,2,2,4]},"
	  "{'name':'c','kind':'input','dtype':'f32','shape':[2,4]},{'name':'y','kind':'output','dtype':'f32','shape':[1,2,2,4]}],"
	  "'nodes':[{'op':'rotary','name':'rope','inputs':['x','c','c'],'outputs':['y']}]}", IP, "nodes[0] (rope)",
	  "must be [S, D/2] = [2, 2]" },
	{ "rotary with an unknown layout", "{'tensors':[{'name':'x','kind':'input','dtype':'f32','shape':[1,2,2,4]},"
	  "{'name':'c','kind':'input','dtype':'f32','shape':[2,2]},{'name':'y','kind':'output','dtype':'f32','shape':[1,2,2,4]}],"
	  "'nodes':[{'op':'rotary','inputs':['x','c','c'],'outputs':['y'],'attrs':{'layout':'sbhd'}}]}",
	  PARAM, "nodes[0].attrs.layout", NULL },
	{ "adamw updating an input", "{'tensors':[" T_X ",{'name':'m','kind':'inout','dtype':'f32','shape':[4,3]},"
	  "{'name':'t','kind':'scalar'}],'nodes':[{'op':'adamw','name':'opt','inputs':['x','x','m','m'],"
	  "'attrs':{'step':'t'}}]}", IP, "nodes[0] (opt)", "declare it inout" },
	{ "adamw without step", "{'tensors':[{'name':'p','kind':'inout','dtype':'f32','shape':[3]}],"
	  "'nodes':[{'op':'adamw','inputs':['p','p','p','p']}]}", PARAM, "nodes[0].attrs.step", NULL },
	{ "adamw step a number", "{'tensors':[{'name':'p','kind':'inout','dtype':'f32','shape':[3]}],"
	  "'nodes':[{'op':'adamw','inputs':['p','p','p','p'],'attrs':{'step':3}}]}", PARAM, "nodes[0].attrs.step", NULL },
	{ "adamw beta1 of 1", "{'tensors':[{'name':'p','kind':'inout','dtype':'f32','shape':[3]},{'name':'t','kind':'scalar'}],"
	  "'nodes':[{'op':'adamw','inputs':['p','p','p','p'],'attrs':{'step':'t','beta1':1}}]}",
	  PARAM, "nodes[0].attrs.beta1", NULL },
	{ "adamw lr naming a tensor of rank 1", "{'tensors':[{'name':'p','kind':'inout','dtype':'f32','shape':[3]},"
	  "{'name':'t','kind':'scalar'}],'nodes':[{'op':'adamw','name':'opt','inputs':['p','p','p','p'],"
	  "'attrs':{'step':'t','lr':'p'}}]}", IP, "nodes[0] (opt)", "not a rank-0 float tensor" },
	{ "adamw unknown attr", "{'tensors':[{'name':'p','kind':'inout','dtype':'f32','shape':[3]},{'name':'t','kind':'scalar'}],"
	  "'nodes':[{'op':'adamw','inputs':['p','p','p','p'],'attrs':{'step':'t','amsgrad':true}}]}",
	  PARAM, "nodes[0].attrs.amsgrad", NULL },
	{ "adamw with outputs", "{'tensors':[{'name':'p','kind':'inout','dtype':'f32','shape':[3]},{'name':'t','kind':'scalar'}],"
	  "'nodes':[{'op':'adamw','name':'opt','inputs':['p','p','p','p'],'outputs':['p'],'attrs':{'step':'t'}}]}",
	  IP, "nodes[0] (opt)", "adamw takes 0 outputs, not 1" },
	{ "sgd momentum without a buffer", "{'tensors':[{'name':'p','kind':'inout','dtype':'f32','shape':[3]}],"
	  "'nodes':[{'op':'sgd','name':'opt','inputs':['p','p'],'attrs':{'lr':0.1,'momentum':0.9}}]}",
	  IP, "nodes[0] (opt)", "no momentum_buffer" },
	{ "sgd without lr", "{'tensors':[{'name':'p','kind':'inout','dtype':'f32','shape':[3]}],"
	  "'nodes':[{'op':'sgd','inputs':['p','p']}]}", PARAM, "nodes[0].attrs.lr", NULL },
	/* Limits. */
	{ "a tensor past 2^40 elements", "{'tensors':[{'name':'h','kind':'input','dtype':'u8','shape':[2147483648,1024]}],"
	  "'nodes':[]}", RP_ERR_LIMIT_EXCEEDED, "resource", "tensor elements", NULL },
	{ "strides past 2^53", "{'tensors':[{'name':'h','kind':'input','dtype':'u8','shape':[3],'strides':[9007199254740992]}],"
	  "'nodes':[]}", IP, "tensors[0] (h)", "past element 2^53" },
};

START_TEST(each_rule_is_refused_by_name)
{
	const struct bad_case *c = &bad_cases[_i];

	define_bad(c->program, c->error, c->key, c->value, c->has);
}
END_TEST

/* The same node in place: the very tensor of its input is fine for a
 * pointwise op (and a GEMM's C as its D), not for others. */
START_TEST(in_place_is_allowed_only_exactly)
{
	struct rp_program p;

	define_ok("{'tensors':[" T_X "," T_Y "," T_H "],'nodes':["
		  "{'op':'relu','inputs':['x'],'outputs':['h']},"
		  "{'op':'mul','inputs':['h'],'outputs':['h'],'attrs':{'scalar':2}},"
		  "{'op':'add','inputs':['h','x'],'outputs':['h']},"
		  "{'op':'cast','inputs':['h'],'outputs':['y']}]}",
		  &p);
	ck_assert_int_eq(p.tensors[tensor(&p, "h")].last_write, 2);
	rp_program_finish(&p);
	define_ok("{'tensors':[{'name':'x','kind':'input','dtype':'f32','shape':[4,4]},"
		  "{'name':'acc','kind':'inout','dtype':'f32','shape':[4,4]}],'nodes':["
		  "{'op':'gemm','inputs':{'a':'x','b':'x','c':'acc'},'outputs':{'d':'acc'},'attrs':{'beta':1}}]}",
		  &p);
	ck_assert(p.updates_in_place);
	rp_program_finish(&p);
	/* Written through a transposed view of itself: not the same order. */
	define_bad("{'tensors':[{'name':'m','kind':'inout','dtype':'f32','shape':[3,3]},"
		   "{'name':'mt','kind':'view','base':'m','shape':[3,3],'strides':[1,3]}],"
		   "'nodes':[{'op':'neg','name':'t','inputs':['m'],'outputs':['mt']}]}",
		   RP_ERR_INVALID_PROGRAM, "node", "nodes[0] (t)", "very same tensor");
}
END_TEST

/* Rank-0 tensors broadcast anywhere; a reduction may make one. */
START_TEST(rank_0_tensors_broadcast)
{
	struct rp_program p;

	define_ok("{'tensors':[" T_X ",{'name':'lr','kind':'scalar'},{'name':'tot','kind':'output','dtype':'f32','shape':[]},"
		  "{'name':'v','kind':'intermediate','dtype':'f32','shape':[3]}," T_Y "],'nodes':["
		  "{'op':'mul','inputs':['x','lr'],'outputs':['y']},"
		  "{'op':'sum','inputs':['x'],'outputs':['v'],'attrs':{'axis':'leading'}},"
		  "{'op':'sum','inputs':['v'],'outputs':['tot']}]}",
		  &p);
	ck_assert_int_eq(p.tensors[tensor(&p, "tot")].rank, 0);
	ck_assert_int_eq(p.tensors[tensor(&p, "tot")].numel, 1);
	rp_program_finish(&p);
}
END_TEST

/* ---- limits ---------------------------------------------------------------------------------- */

/* A program of n tensors: t0 an input, the others of `kind`, each
 * written by a node `op` of t0 when op is given. */
static char *many_tensors(int n, const char *kind, const char *op)
{
	size_t cap = (size_t)n * 160 + 256, len = 0;
	char *s = malloc(cap);

	len += (size_t)snprintf(s + len, cap - len, "{'tensors':[");
	for (int i = 0; i < n; i++) {
		len += (size_t)snprintf(s + len, cap - len, "%s{'name':'t%d','kind':'%s','dtype':'f32','shape':[2]}",
					i ? "," : "", i, i == 0 ? "input" : kind);
	}
	len += (size_t)snprintf(s + len, cap - len, "],'nodes':[");
	for (int i = 1; op && i < n; i++) {
		len += (size_t)snprintf(s + len, cap - len, "%s{'op':'%s','inputs':['t0'],'outputs':['t%d']}", i > 1 ? "," : "",
					op, i);
	}
	snprintf(s + len, cap - len, "]}");
	return s;
}

/* n nodes `op` of input t0 into output t1. */
static char *many_nodes(int n, const char *op)
{
	size_t cap = (size_t)n * 64 + 256, len = 0;
	char *s = malloc(cap);

	len += (size_t)snprintf(s + len, cap - len, "{'tensors':[{'name':'t0','kind':'input','dtype':'f32','shape':[2]},"
				"{'name':'t1','kind':'output','dtype':'f32','shape':[2]}],'nodes':[");
	for (int i = 0; i < n; i++) {
		len += (size_t)snprintf(s + len, cap - len, "%s{'op':'%s','inputs':['t0'],'outputs':['t1']}", i ? "," : "", op);
	}
	snprintf(s + len, cap - len, "]}");
	return s;
}

START_TEST(limits_are_named)
{
	struct rp_program p;
	char *s;

	s = many_tensors(RP_PROG_TENSORS_MAX, "intermediate", NULL);
	define_ok(s, &p);
	ck_assert_int_eq(p.ntensors, RP_PROG_TENSORS_MAX);
	rp_program_finish(&p);
	free(s);
	s = many_tensors(RP_PROG_TENSORS_MAX + 1, "intermediate", NULL);
	define_bad(s, RP_ERR_LIMIT_EXCEEDED, "resource", "tensors", NULL);
	free(s);
	s = many_tensors(RP_PROG_BOUND_MAX, "output", "relu");
	define_ok(s, &p);
	ck_assert_int_eq(p.nbound, RP_PROG_BOUND_MAX);
	rp_program_finish(&p);
	free(s);
	s = many_tensors(RP_PROG_BOUND_MAX + 1, "input", NULL);
	define_bad(s, RP_ERR_LIMIT_EXCEEDED, "resource", "bound tensors", NULL);
	free(s);
	s = many_nodes(RP_PROG_NODES_MAX, "relu");
	define_ok(s, &p);
	ck_assert_int_eq(p.nnodes, RP_PROG_NODES_MAX);
	rp_program_finish(&p);
	free(s);
	s = many_nodes(RP_PROG_NODES_MAX + 1, "relu");
	define_bad(s, RP_ERR_LIMIT_EXCEEDED, "resource", "nodes", "split the program");
	free(s);
	/* Past the nodes after lowering: each softmax is 3 nodes (and 2
	 * tensors, under their limit here). */
	s = many_nodes(RP_PROG_NODES_MAX / 3 + 1, "softmax");
	define_bad(s, RP_ERR_LIMIT_EXCEEDED, "resource", "nodes", "after lowering");
	free(s);
}
END_TEST

/* ---- lowering ------------------------------------------------------------------------------------ */

struct lowering {
	const char *program;
	const char *ops;
};

static const struct lowering lowerings[] = {
	{ PROG("", "{'op':'rms_norm','name':'n','inputs':['a','b'],'outputs':['y','r']}"),
	  "square mean add rsqrt mul mul" },
	{ PROG("", "{'op':'rms_norm','name':'n','inputs':['a'],'outputs':['y']}"), "square mean add rsqrt mul" },
	{ PROG(",{'name':'dw','kind':'output','dtype':'f32','shape':[3]}",
	       "{'op':'rms_norm_backward','name':'n','inputs':['a','a','b','r'],'outputs':['y','dw']}"),
	  "mul mul sum mul mul mean mul sub mul" },
	{ PROG("", "{'op':'rms_norm_backward','name':'n','inputs':['a','a',null,'r'],'outputs':['y']}"),
	  "mul mul mean mul sub mul" },
	{ PROG("", "{'op':'softmax','name':'n','inputs':['a'],'outputs':['y']}"), "logsumexp sub exp" },
	{ PROG("", "{'op':'softmax_backward','name':'n','inputs':['a','a'],'outputs':['y']}"), "mul sum sub mul" },
	{ PROG("", "{'op':'log_softmax','name':'n','inputs':['a'],'outputs':['y']}"), "logsumexp sub" },
	{ PROG("", "{'op':'log_softmax_backward','name':'n','inputs':['a','a'],'outputs':['y']}"), "sum exp mul sub" },
	{ PROG(",{'name':'t','kind':'input','dtype':'i32','shape':[4]},{'name':'lse','kind':'output','dtype':'f32','shape':[4]}",
	       "{'op':'cross_entropy','name':'n','inputs':['a','t'],'outputs':['r','lse']}"),
	  "logsumexp iota eq where sum ne sub where" },
	{ PROG(",{'name':'t','kind':'input','dtype':'i32','shape':[4]}",
	       "{'op':'cross_entropy_backward','name':'n','inputs':['r','a','t','r'],'outputs':['y']}"),
	  "sub exp iota eq sub ne where mul" },
	{ PROG(",{'name':'x','kind':'input','dtype':'bf16','shape':[2,5,3,8]},{'name':'cs','kind':'input','dtype':'f32','shape':[5,4]},"
	       "{'name':'xr','kind':'output','dtype':'bf16','shape':[2,5,3,8]}",
	       "{'op':'rotary','name':'n','inputs':['x','cs','cs'],'outputs':['xr']}"),
	  "mul mul mul mul sub add" },
	{ PROG(",{'name':'x','kind':'input','dtype':'bf16','shape':[2,5,3,8]},{'name':'cs','kind':'input','dtype':'f32','shape':[5,4]},"
	       "{'name':'xr','kind':'output','dtype':'bf16','shape':[2,5,3,8]}",
	       "{'op':'rotary_backward','name':'n','inputs':['x','cs','cs'],'outputs':['xr']}"),
	  "mul mul mul mul add sub" },
	/* Numbers folded: only the step makes scalar nodes. */
	{ PROG(",{'name':'p','kind':'inout','dtype':'f32','shape':[3]},{'name':'m','kind':'inout','dtype':'f32','shape':[3]},"
	       "{'name':'v','kind':'inout','dtype':'f32','shape':[3]},{'name':'step','kind':'scalar'}",
	       "{'op':'adamw','name':'n','inputs':['p','b','m','v'],'attrs':{'step':'step'}}"),
	  "pow sub div pow sub sqrt "
	  "sub mul add mul mul mul add sqrt div add div mul mul sub cast cast cast" },
	{ PROG(",{'name':'p','kind':'inout','dtype':'f32','shape':[3]},{'name':'m','kind':'inout','dtype':'f32','shape':[3]},"
	       "{'name':'v','kind':'inout','dtype':'f32','shape':[3]},{'name':'step','kind':'scalar'}",
	       "{'op':'adamw','name':'n','inputs':['p','b','m','v'],'attrs':{'step':'step','lr':'s','weight_decay':0.1}}"),
	  "pow sub div pow sub sqrt mul sub "
	  "sub mul add mul mul mul add sqrt div add div mul mul sub cast cast cast" },
	{ PROG(",{'name':'p','kind':'inout','dtype':'f32','shape':[3]}",
	       "{'op':'sgd','name':'n','inputs':['p','b'],'attrs':{'lr':0.1}}"),
	  "mul sub cast" },
	{ PROG(",{'name':'p','kind':'inout','dtype':'f32','shape':[3]},{'name':'m','kind':'inout','dtype':'f32','shape':[3]}",
	       "{'op':'sgd','name':'n','inputs':['p','b','m'],'attrs':{'lr':'s','momentum':0.9,'weight_decay':1e-4,"
	       "'nesterov':true}}"),
	  "mul add mul add mul add mul sub cast cast" },
};

START_TEST(composites_lower_into_primitives)
{
	char *text = with_fills(lowerings[_i].program);
	struct rp_program p;

	define_ok(text, &p);
	ops_are(&p, ROW, "n", lowerings[_i].ops);
	rp_program_finish(&p);
	free(text);
}
END_TEST

/* rms_norm, operand by operand: y = x * rsqrt(mean(x^2) + eps) * weight,
 * rstd written through a [4, 1] view of the [4] output. */
START_TEST(rms_norm_lowers_as_documented)
{
	char *text = with_fills(PROG("", "{'op':'rms_norm','name':'n','inputs':['a','b'],'outputs':['y','r'],"
					 "'attrs':{'eps':1e-5}}"));
	struct rp_program p;
	const struct rp_prog_node *n;
	int a, b, y, r, first;

	define_ok(text, &p);
	free(text);
	a = tensor(&p, "a");
	b = tensor(&p, "b");
	y = tensor(&p, "y");
	r = tensor(&p, "r");
	first = first_of(&p, ROW);
	n = &p.nodes[first];
	ck_assert_int_eq(n[0].in[0], a);                               /* square(a) */
	ck_assert_int_eq(p.tensors[n[0].out[0]].dtype, RP_DTYPE_F32);
	ck_assert_int_eq(n[1].red.axis, RP_AXIS_LAST);                  /* mean over the row */
	ck_assert_int_eq(p.tensors[n[1].out[0]].rank, 2);
	ck_assert_int_eq(p.tensors[n[1].out[0]].shape[1], 1);
	ck_assert(n[2].pw.has_scalar && n[2].pw.scalar == 1e-5 && !n[2].pw.scalar_first);   /* + eps */
	ck_assert_int_eq(p.tensors[n[3].out[0]].kind, RP_PT_VIEW);      /* rsqrt into r as [4, 1] */
	ck_assert_int_eq(p.tensors[n[3].out[0]].root, r);
	ck_assert_int_eq(n[4].in[0], a);                               /* a * rstd */
	ck_assert_int_eq(n[4].in[1], n[3].out[0]);
	ck_assert_int_eq(n[5].in[1], b);                               /* * weight -> y */
	ck_assert_int_eq(n[5].out[0], y);
	ck_assert_int_eq(p.tensors[r].last_write, first + 3);
	ck_assert_str_eq(p.tensors[n[0].out[0]].name, "n.0");
	rp_program_finish(&p);
}
END_TEST

/* AdamW writes its state only with casts, after every read of it, and
 * shares its per-step scalars with the next adamw of the same
 * hyperparameters. */
START_TEST(adamw_assigns_state_last_and_shares_its_scalars)
{
	struct rp_program p;
	int casts = 0, pows = 0;

	define_ok("{'tensors':[{'name':'g','kind':'input','dtype':'bf16','shape':[3]},{'name':'t','kind':'scalar'},"
		  "{'name':'p1','kind':'inout','dtype':'f32','shape':[3]},{'name':'m1','kind':'inout','dtype':'f32','shape':[3]},"
		  "{'name':'v1','kind':'inout','dtype':'f32','shape':[3]},{'name':'p2','kind':'inout','dtype':'f32','shape':[3]},"
		  "{'name':'m2','kind':'inout','dtype':'f32','shape':[3]},{'name':'v2','kind':'inout','dtype':'f32','shape':[3]}],"
		  "'nodes':[{'op':'adamw','name':'o1','inputs':['p1','g','m1','v1'],'attrs':{'step':'t'}},"
		  "{'op':'adamw','name':'o2','inputs':['p2','g','m2','v2'],'attrs':{'step':'t'}}]}",
		  &p);
	ck_assert(p.updates_in_place);
	for (int i = 0; i < p.nnodes; i++) {
		const struct rp_prog_tensor *out = &p.tensors[p.nodes[i].out[0]];

		ck_assert_int_eq(p.nodes[i].op->cls, RP_PC_POINTWISE);
		pows += p.nodes[i].op->fn == RP_PW_POW;
		if (out->kind == RP_PT_INOUT) {
			ck_assert_int_eq(p.nodes[i].op->fn, RP_PW_CAST);
			/* Nothing after the cast reads what it wrote. */
			ck_assert_int_le(out->last_read, i);
			casts++;
		}
		if (p.nodes[i].op->fn != RP_PW_CAST) {
			ck_assert_int_ne(out->kind, RP_PT_INOUT);
		}
	}
	ck_assert_int_eq(casts, 6);
	ck_assert_int_eq(pows, 2);
	/* Per-step scalars are f64 rank 0. */
	ck_assert_int_eq(p.tensors[p.nodes[0].out[0]].dtype, RP_DTYPE_F64);
	ck_assert_int_eq(p.tensors[p.nodes[0].out[0]].rank, 0);
	rp_program_finish(&p);
}
END_TEST

/* A composite's output may be its input's very tensor: it reads its
 * inputs whole before it writes. */
START_TEST(composites_work_in_place)
{
	struct rp_program p;

	define_ok("{'tensors':[{'name':'x','kind':'inout','dtype':'bf16','shape':[1,4,2,8]},"
		  "{'name':'c','kind':'input','dtype':'f32','shape':[4,4]}],"
		  "'nodes':[{'op':'rotary','inputs':['x','c','c'],'outputs':['x']}]}",
		  &p);
	rp_program_finish(&p);
	define_ok("{'tensors':[{'name':'x','kind':'inout','dtype':'f32','shape':[4,8]}],"
		  "'nodes':[{'op':'softmax','inputs':['x'],'outputs':['x']}]}",
		  &p);
	rp_program_finish(&p);
}
END_TEST

/* A lowered node's own check failing names the composite and the part. */
START_TEST(a_lowered_node_is_named_by_its_composite)
{
	/* softmax into a broadcast view: its last node writes through it. */
	define_bad("{'tensors':[{'name':'x','kind':'input','dtype':'f32','shape':[4,4]},"
		   "{'name':'y','kind':'output','dtype':'f32','shape':[4]},"
		   "{'name':'yb','kind':'view','base':'y','shape':[4,4],'strides':[0,1]}],"
		   "'nodes':[{'op':'softmax','name':'sm','inputs':['x'],'outputs':['yb']}]}",
		   RP_ERR_INVALID_PROGRAM, "node", "nodes[0] (sm)", "its lowered node sm.2 (exp): writes yb through a broadcast");
}
END_TEST

/* ---- Run ------------------------------------------------------------------------------------------ */

static const char *const run_program =
	"{'tensors':[{'name':'x','kind':'input','dtype':'bf16','shape':[4]},{'name':'lr','kind':'scalar'},"
	"{'name':'p','kind':'inout','dtype':'f32','shape':[4]},{'name':'y','kind':'output','dtype':'f32','shape':[4]}],"
	"'nodes':[{'op':'mul','inputs':['x','lr'],'outputs':['y']},{'op':'sub','inputs':['p','y'],'outputs':['p']}]}";

static void run_bad(const struct rp_program *p, const char *params, const char *error, const char *key,
		    const char *value)
{
	cJSON *j = json(params);
	struct rp_error err = { 0 };
	struct rp_program_run run;
	const cJSON *v;

	ck_assert_msg(rp_program_run_parse(p, j, &run, &err) == -EINVAL, "accepted: %s", params);
	ck_assert_msg(strcmp(err.name, error) == 0, "%s: got %s", params, err.name);
	v = cJSON_GetObjectItemCaseSensitive(err.params, key);
	ck_assert_msg(cJSON_IsString(v) && strcmp(v->valuestring, value) == 0, "%s: %s is '%s', expected '%s'", params,
		      key, cJSON_IsString(v) ? v->valuestring : "(none)", value);
	ck_assert_ptr_null(run.bind);
	ck_assert_ptr_null(run.scalars);
	rp_error_clear(&err);
	cJSON_Delete(j);
}

#define BIND_ALL "'bind':{'x':{'buffer':'b0.1.1'},'p':{'buffer':'b0.1.2','offset':64},'y':{'buffer':'b0.1.1','offset':8}}"

START_TEST(run_binds_every_bound_tensor)
{
	struct rp_program p;
	struct rp_program_run run;
	struct rp_error err = { 0 };
	struct rp_id id;
	cJSON *j;

	define_ok(run_program, &p);
	j = json("{'program':'p0.0.7'," BIND_ALL ",'scalars':{'lr':0.001},'wait_event':'e0.1.3','deadline_ms':50}");
	ck_assert_int_eq(rp_program_run_id(j, &id, &err), 0);
	ck_assert_int_eq(id.kind, RP_ID_PROGRAM);
	ck_assert_int_eq(id.serial, 7);
	ck_assert_int_eq(rp_program_run_parse(&p, j, &run, &err), 0);
	ck_assert_int_eq(run.nbound, 4);
	ck_assert_int_eq(run.program.serial, 7);
	/* By bind_index: x, lr, p, y. */
	ck_assert_int_eq(run.bind[0].buffer.serial, 1);
	ck_assert_uint_eq(run.bind[0].offset, 0);
	ck_assert(run.scalars[1] == 0.001);
	ck_assert_int_eq(run.bind[2].buffer.serial, 2);
	ck_assert_uint_eq(run.bind[2].offset, 64);
	ck_assert_uint_eq(run.bind[3].offset, 8);
	ck_assert(run.wait_event.present && !run.signal_event.present);
	ck_assert_uint_eq(run.deadline_ms, 50);
	rp_program_run_finish(&run);
	ck_assert_ptr_null(run.bind);
	rp_program_run_finish(&run);
	cJSON_Delete(j);
	rp_program_finish(&p);
}
END_TEST

START_TEST(run_refuses_what_the_program_does_not_say)
{
	struct rp_program p;
	struct rp_error err = { 0 };
	struct rp_id id;
	cJSON *j;

	define_ok(run_program, &p);
	run_bad(&p, "{'program':'p0.0.7','bind':{'x':{'buffer':'b0.1.1'},'p':{'buffer':'b0.1.2'}},'scalars':{'lr':1}}",
		RP_ERR_INVALID_PARAMETER, "parameter", "bind.y");
	run_bad(&p, "{'program':'p0.0.7'," BIND_ALL "}", RP_ERR_INVALID_PARAMETER, "parameter", "scalars.lr");
	run_bad(&p, "{'program':'p0.0.7'," BIND_ALL ",'scalars':{'lr':1,'mom':0.9}}", RP_ERR_INVALID_PARAMETER,
		"parameter", "scalars.mom");
	run_bad(&p, "{'program':'p0.0.7','bind':{'x':{'buffer':'b0.1.1'},'p':{'buffer':'b0.1.2'},'y':{'buffer':'b0.1.3'},"
		"'z':{'buffer':'b0.1.4'}},'scalars':{'lr':1}}",
		RP_ERR_INVALID_PARAMETER, "parameter", "bind.z");
	run_bad(&p, "{'program':'p0.0.7','bind':{'x':{'buffer':'b0.1.1'},'p':{'buffer':'b0.1.2'},'y':{'buffer':'b0.1.3'},"
		"'lr':{'buffer':'b0.1.4'}},'scalars':{'lr':1}}",
		RP_ERR_INVALID_PARAMETER, "parameter", "bind.lr");
	run_bad(&p, "{'program':'p0.0.7','bind':{'x':{'buffer':'b0.1.1'},'x':{'buffer':'b0.1.1'},'p':{'buffer':'b0.1.2'},"
		"'y':{'buffer':'b0.1.3'}},'scalars':{'lr':1}}",
		RP_ERR_INVALID_PARAMETER, "parameter", "bind.x");
	/* Wrong types. */
	run_bad(&p, "{'program':'p0.0.7','bind':{'x':'b0.1.1','p':{'buffer':'b0.1.2'},'y':{'buffer':'b0.1.3'}},"
		"'scalars':{'lr':1}}", RP_ERR_INVALID_PARAMETER, "parameter", "bind.x");
	run_bad(&p, "{'program':'p0.0.7','bind':{'x':{'buffer':'e0.1.1'},'p':{'buffer':'b0.1.2'},'y':{'buffer':'b0.1.3'}},"
		"'scalars':{'lr':1}}", RP_ERR_INVALID_PARAMETER, "parameter", "bind.x.buffer");
	run_bad(&p, "{'program':'p0.0.7','bind':{'x':{'buffer':''},'p':{'buffer':'b0.1.2'},'y':{'buffer':'b0.1.3'}},"
		"'scalars':{'lr':1}}", RP_ERR_INVALID_PARAMETER, "parameter", "bind.x.buffer");
	run_bad(&p, "{'program':'p0.0.7','bind':{'x':{'buffer':'b0.1.1','offset':-2},'p':{'buffer':'b0.1.2'},"
		"'y':{'buffer':'b0.1.3'}},'scalars':{'lr':1}}", RP_ERR_INVALID_PARAMETER, "parameter", "bind.x.offset");
	run_bad(&p, "{'program':'p0.0.7','bind':{'x':{'buffer':'b0.1.1','size':2},'p':{'buffer':'b0.1.2'},"
		"'y':{'buffer':'b0.1.3'}},'scalars':{'lr':1}}", RP_ERR_INVALID_PARAMETER, "parameter", "bind.x.size");
	run_bad(&p, "{'program':'p0.0.7','bind':{'x':{'buffer':'b0.1.1'},'p':{'buffer':'b0.1.2','offset':6},"
		"'y':{'buffer':'b0.1.3'}},'scalars':{'lr':1}}", RP_ERR_INVALID_OPERAND, "operand", "p");
	run_bad(&p, "{'program':'p0.0.7'," BIND_ALL ",'scalars':{'lr':'fast'}}", RP_ERR_INVALID_PARAMETER, "parameter",
		"scalars.lr");
	run_bad(&p, "{'program':'b0.1.7'," BIND_ALL ",'scalars':{'lr':1}}", RP_ERR_INVALID_PARAMETER, "parameter",
		"program");
	run_bad(&p, "{'program':'p0.1.7'," BIND_ALL ",'scalars':{'lr':1}}", RP_ERR_INVALID_PARAMETER, "parameter",
		"program");
	run_bad(&p, "{" BIND_ALL ",'scalars':{'lr':1}}", RP_ERR_INVALID_PARAMETER, "parameter", "program");
	run_bad(&p, "{'program':'p0.0.7','bind':[]}", RP_ERR_INVALID_PARAMETER, "parameter", "bind");
	run_bad(&p, "{'program':'p0.0.7'," BIND_ALL ",'scalars':{'lr':1},'deadline_ms':0}", RP_ERR_INVALID_PARAMETER,
		"parameter", "deadline_ms");
	run_bad(&p, "{'program':'p0.0.7'," BIND_ALL ",'scalars':{'lr':1},'signal_event':'b0.1.1'}",
		RP_ERR_INVALID_PARAMETER, "parameter", "signal_event");
	run_bad(&p, "{'program':'p0.0.7'," BIND_ALL ",'scalars':{'lr':1},'priority':1}", RP_ERR_INVALID_PARAMETER,
		"parameter", "priority");
	j = json("[1]");
	ck_assert_int_eq(rp_program_run_id(j, &id, &err), -EINVAL);
	ck_assert_str_eq(err.name, RP_ERR_INVALID_PARAMETER);
	rp_error_clear(&err);
	cJSON_Delete(j);
	rp_program_finish(&p);
}
END_TEST

/* A dropout_mask's seed is an integer in [0, 2^53) at every Run (the
 * Philox key), refused by name otherwise; other scalars take any finite
 * number. */
START_TEST(run_takes_a_seed_only_as_an_integer)
{
	static const char *const program =
		"{'tensors':[{'name':'seed','kind':'scalar'},{'name':'lr','kind':'scalar'},"
		"{'name':'m','kind':'output','dtype':'u8','shape':[8]}],"
		"'nodes':[{'op':'dropout_mask','inputs':['seed'],'outputs':['m'],'attrs':{'p':0.25}}]}";
	static const char *const bad[] = { "0.5", "-1", "9007199254740992", "1e300", "'7'" };
	static const char *const good[] = { "0", "1", "123456789", "9007199254740991" };
	struct rp_program p;
	struct rp_program_run run;
	struct rp_error err = { 0 };
	char params[256];

	define_ok(program, &p);
	ck_assert(p.tensors[0].seed);
	ck_assert(!p.tensors[1].seed);
	for (size_t i = 0; i < N(bad); i++) {
		snprintf(params, sizeof(params), "{'program':'p0.0.1','bind':{'m':{'buffer':'b0.1.1'}},"
			 "'scalars':{'seed':%s,'lr':0.5}}", bad[i]);
		run_bad(&p, params, RP_ERR_INVALID_PARAMETER, "parameter", "scalars.seed");
	}
	for (size_t i = 0; i < N(good); i++) {
		cJSON *j;

		snprintf(params, sizeof(params), "{'program':'p0.0.1','bind':{'m':{'buffer':'b0.1.1'}},"
			 "'scalars':{'seed':%s,'lr':0.5}}", good[i]);
		j = json(params);
		ck_assert_msg(rp_program_run_parse(&p, j, &run, &err) == 0, "%s refused", params);
		ck_assert(run.scalars[0] == strtod(good[i], NULL));
		rp_program_run_finish(&run);
		cJSON_Delete(j);
	}
	rp_program_finish(&p);
}
END_TEST

START_TEST(program_run_spec_is_the_runs)
{
	ck_assert_int_eq(rp_op_program_run.id, RP_OP_PROGRAM);
	ck_assert_str_eq(rp_op_program_run.method, "io.regen.Program.Run");
	ck_assert_str_eq(rp_op_program_run.name, "program");
	ck_assert_uint_eq(rp_op_program_run.noperands, 0);
	ck_assert_ptr_null(rp_op_program_run.scalars->name);
	ck_assert_int_eq(rp_op_slot(&rp_op_program_run, "a"), RP_NO_SLOT);
}
END_TEST

static Suite *program_suite(void)
{
	Suite *s = suite_create("program");
	TCase *ops = tcase_create("ops"), *rules = tcase_create("rules"), *lower = tcase_create("lowering");
	TCase *run = tcase_create("run");

	tcase_add_loop_test(ops, every_op_is_accepted, 0, N(ok_cases));
	tcase_add_test(ops, the_table_covers_every_primitive);
	tcase_add_test(ops, define_derives_layout_binding_and_lifetimes);
	tcase_add_test(ops, in_place_update_of_an_inout_is_noted);
	suite_add_tcase(s, ops);
	tcase_add_loop_test(rules, each_rule_is_refused_by_name, 0, N(bad_cases));
	tcase_add_test(rules, in_place_is_allowed_only_exactly);
	tcase_add_test(rules, rank_0_tensors_broadcast);
	tcase_add_test(rules, limits_are_named);
	tcase_set_timeout(rules, 60);
	suite_add_tcase(s, rules);
	tcase_add_loop_test(lower, composites_lower_into_primitives, 0, N(lowerings));
	tcase_add_test(lower, rms_norm_lowers_as_documented);
	tcase_add_test(lower, adamw_assigns_state_last_and_shares_its_scalars);
	tcase_add_test(lower, composites_work_in_place);
	tcase_add_test(lower, a_lowered_node_is_named_by_its_composite);
	suite_add_tcase(s, lower);
	tcase_add_test(run, run_binds_every_bound_tensor);
	tcase_add_test(run, run_refuses_what_the_program_does_not_say);
	tcase_add_test(run, run_takes_a_seed_only_as_an_integer);
	tcase_add_test(run, program_run_spec_is_the_runs);
	suite_add_tcase(s, run);
	return s;
}

int main(void)
{
	return unit_run(program_suite());
}
