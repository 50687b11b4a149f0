/* The kernels daemon/program/ writes for a program's FUSED, REDUCTION and
 * GATHER steps, compiled and loaded by cuda/rtc.c and launched one after
 * the other as the executor launches them (the executor's own tests run
 * whole programs through Run and graphs), checked against the host
 * backend's reference (every node in double, rounded to each tensor's
 * dtype: daemon/backend/host/program_nodes.c) on fresh random inputs.
 *
 * Also: the same bits on a second run (no atomics anywhere), a module
 * across a release and a forgotten context (reloaded, not recompiled), the
 * on-disk cache (an image read back only for its own source), and the
 * memory bandwidth of large fused kernels against the GPU's peak (printed:
 * the target is 90%).
 *
 * Exit 0 pass, 1 fail, 77 without a GPU. */
#include <dirent.h>
#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>
#include <nvrtc.h>
#include "daemon/backend/cuda/common.h"
#include "daemon/backend/host/program_nodes.h"
#include "daemon/program/plan.h"
#include "tests/gpu/gpu_common.h"
#include "tests/lib/dtype.h"
#include "tests/lib/rand.h"

/* A program as a client defines it ('quotes' for "quotes"), and how its
 * inputs are drawn: floats uniform in [lo, hi), integers (indices) in
 * [0, int_hi). */
struct kcase {
	const char *name;
	const char *json;
	double lo, hi;
	int64_t int_hi;
};

static const struct kcase cases[] = {
	{ "chain over a bias, bf16",
	  "{'tensors':[{'name':'x','kind':'input','dtype':'bf16','shape':[1000,1024]},"
	  "{'name':'b','kind':'input','dtype':'bf16','shape':[1024]},"
	  "{'name':'h','kind':'intermediate','dtype':'f32','shape':[1000,1024]},"
	  "{'name':'g','kind':'intermediate','dtype':'f32','shape':[1000,1024]},"
	  "{'name':'y','kind':'output','dtype':'bf16','shape':[1000,1024]},"
	  "{'name':'dg','kind':'output','dtype':'bf16','shape':[1000,1024]}],"
	  "'nodes':[{'op':'add','inputs':['x','b'],'outputs':['h']},"
	  "{'op':'gelu','inputs':['h'],'outputs':['g']},"
	  "{'op':'mul','inputs':['g'],'outputs':['y'],'attrs':{'scalar':0.5}},"
	  "{'op':'gelu_backward','inputs':['y','h'],'outputs':['dg']}]}",
	  -3, 3, 0 },
	{ "every unary op, f32",
	  "{'tensors':[{'name':'x','kind':'input','dtype':'f32','shape':[77,131]},"
	  "{'name':'a','kind':'intermediate','dtype':'f32','shape':[77,131]},"
	  "{'name':'y1','kind':'output','dtype':'f32','shape':[77,131]},{'name':'y2','kind':'output','dtype':'f32','shape':[77,131]},"
	  "{'name':'y3','kind':'output','dtype':'f32','shape':[77,131]},{'name':'y4','kind':'output','dtype':'f32','shape':[77,131]},"
	  "{'name':'y5','kind':'output','dtype':'f32','shape':[77,131]},{'name':'y6','kind':'output','dtype':'f32','shape':[77,131]},"
	  "{'name':'y7','kind':'output','dtype':'f32','shape':[77,131]},{'name':'y8','kind':'output','dtype':'f32','shape':[77,131]},"
	  "{'name':'y9','kind':'output','dtype':'f32','shape':[77,131]},{'name':'y10','kind':'output','dtype':'f32','shape':[77,131]},"
	  "{'name':'y11','kind':'output','dtype':'f32','shape':[77,131]},{'name':'y12','kind':'output','dtype':'f32','shape':[77,131]},"
	  "{'name':'y13','kind':'output','dtype':'f32','shape':[77,131]},{'name':'y14','kind':'output','dtype':'f32','shape':[77,131]},"
	  "{'name':'y15','kind':'output','dtype':'f32','shape':[77,131]},{'name':'y16','kind':'output','dtype':'f32','shape':[77,131]}],"
	  "'nodes':[{'op':'abs','inputs':['x'],'outputs':['a']},"
	  "{'op':'neg','inputs':['x'],'outputs':['y1']},{'op':'exp','inputs':['x'],'outputs':['y2']},"
	  "{'op':'log','inputs':['a'],'outputs':['y3']},{'op':'tanh','inputs':['x'],'outputs':['y4']},"
	  "{'op':'erf','inputs':['x'],'outputs':['y5']},{'op':'sigmoid','inputs':['x'],'outputs':['y6']},"
	  "{'op':'silu','inputs':['x'],'outputs':['y7']},{'op':'gelu','inputs':['x'],'outputs':['y8']},"
	  "{'op':'gelu_tanh','inputs':['x'],'outputs':['y9']},{'op':'relu','inputs':['x'],'outputs':['y10']},"
	  "{'op':'sqrt','inputs':['a'],'outputs':['y11']},{'op':'rsqrt','inputs':['a'],'outputs':['y12']},"
	  "{'op':'reciprocal','inputs':['x'],'outputs':['y13']},{'op':'square','inputs':['x'],'outputs':['y14']},"
	  "{'op':'pow','inputs':['a'],'outputs':['y15'],'attrs':{'scalar':1.7}},"
	  "{'op':'pow','inputs':['a'],'outputs':['y16'],'attrs':{'scalar':-0.5}}]}",
	  -3, 3, 0 },
	{ "binary ops, gradients, comparisons and where, f16 and f64",
	  "{'tensors':[{'name':'x','kind':'input','dtype':'f16','shape':[64,96]},"
	  "{'name':'z','kind':'input','dtype':'f64','shape':[64,96]},"
	  "{'name':'s','kind':'scalar'},"
	  "{'name':'y1','kind':'output','dtype':'f64','shape':[64,96]},{'name':'y2','kind':'output','dtype':'f16','shape':[64,96]},"
	  "{'name':'y3','kind':'output','dtype':'f32','shape':[64,96]},{'name':'y4','kind':'output','dtype':'f64','shape':[64,96]},"
	  "{'name':'y5','kind':'output','dtype':'f32','shape':[64,96]},{'name':'y6','kind':'output','dtype':'f32','shape':[64,96]},"
	  "{'name':'y7','kind':'output','dtype':'f32','shape':[64,96]},{'name':'y8','kind':'output','dtype':'f32','shape':[64,96]},"
	  "{'name':'y9','kind':'output','dtype':'f32','shape':[64,96]},{'name':'y10','kind':'output','dtype':'f32','shape':[64,96]},"
	  "{'name':'c1','kind':'output','dtype':'u8','shape':[64,96]},{'name':'c2','kind':'output','dtype':'f32','shape':[64,96]},"
	  "{'name':'w','kind':'output','dtype':'f16','shape':[64,96]},{'name':'mx','kind':'output','dtype':'f32','shape':[64,96]}],"
	  "'nodes':[{'op':'add','inputs':['x','z'],'outputs':['y1']},{'op':'sub','inputs':['z','x'],'outputs':['y2']},"
	  "{'op':'mul','inputs':['x','s'],'outputs':['y3']},{'op':'div','inputs':['z','x'],'outputs':['y4']},"
	  "{'op':'gelu_tanh_backward','inputs':['x','z'],'outputs':['y5']},"
	  "{'op':'silu_backward','inputs':['x','z'],'outputs':['y6']},"
	  "{'op':'sigmoid_backward','inputs':['x','z'],'outputs':['y7']},"
	  "{'op':'tanh_backward','inputs':['x','z'],'outputs':['y8']},"
	  "{'op':'relu_backward','inputs':['x','z'],'outputs':['y9']},"
	  "{'op':'sub','inputs':['x'],'outputs':['y10'],'attrs':{'scalar':1.5,'scalar_first':true}},"
	  "{'op':'gt','inputs':['x','z'],'outputs':['c1']},{'op':'le','inputs':['x'],'outputs':['c2'],'attrs':{'scalar':0.25}},"
	  "{'op':'where','inputs':['c1','x'],'outputs':['w'],'attrs':{'scalar':-7}},"
	  "{'op':'maximum','inputs':['x','z'],'outputs':['mx']}]}",
	  -2, 2, 0 },
	{ "broadcasts, a transposed input, a strided output view, iota and fill",
	  "{'tensors':[{'name':'x','kind':'input','dtype':'f32','shape':[6,7,8]},"
	  "{'name':'col','kind':'input','dtype':'bf16','shape':[6,1,8]},"
	  "{'name':'r0','kind':'input','dtype':'f32','shape':[]},"
	  "{'name':'m','kind':'input','dtype':'f32','shape':[8,7,6]},"
	  "{'name':'mt','kind':'view','base':'m','shape':[6,7,8],'strides':[1,6,42]},"
	  "{'name':'big','kind':'output','dtype':'f32','shape':[6,7,20]},"
	  "{'name':'mid','kind':'view','base':'big','shape':[6,7,8],'strides':[140,20,1],'offset':5},"
	  "{'name':'io','kind':'intermediate','dtype':'i64','shape':[7,1]},"
	  "{'name':'iof','kind':'intermediate','dtype':'f32','shape':[7,1]},"
	  "{'name':'t1','kind':'intermediate','dtype':'f32','shape':[6,7,8]},"
	  "{'name':'t2','kind':'intermediate','dtype':'f32','shape':[6,7,8]},"
	  "{'name':'f','kind':'output','dtype':'bf16','shape':[6,7,8]}],"
	  "'nodes':[{'op':'mul','inputs':['x','col'],'outputs':['t1']},"
	  "{'op':'iota','outputs':['io'],'attrs':{'axis':0}},"
	  "{'op':'cast','inputs':['io'],'outputs':['iof']},"
	  "{'op':'add','inputs':['t1','iof'],'outputs':['t2']},"
	  "{'op':'sub','inputs':['t2','mt'],'outputs':['mid']},"
	  "{'op':'fill','outputs':['f'],'attrs':{'scalar':0.1}},"
	  "{'op':'div','inputs':['mid','r0'],'outputs':['mid']}]}",
	  0.5, 2, 0 },
	{ "every reduction over rows, short and long, with a prologue",
	  "{'tensors':[{'name':'a','kind':'input','dtype':'bf16','shape':[64,100]},"
	  "{'name':'b','kind':'input','dtype':'f32','shape':[8,50000]},"
	  "{'name':'sa','kind':'intermediate','dtype':'f32','shape':[64,100]},"
	  "{'name':'r1','kind':'output','dtype':'f32','shape':[64]},{'name':'r2','kind':'output','dtype':'bf16','shape':[64,1]},"
	  "{'name':'r3','kind':'output','dtype':'f32','shape':[64]},{'name':'r4','kind':'output','dtype':'f32','shape':[64]},"
	  "{'name':'r5','kind':'output','dtype':'f32','shape':[64]},"
	  "{'name':'q1','kind':'output','dtype':'f32','shape':[8]},{'name':'q2','kind':'output','dtype':'f64','shape':[8,1]},"
	  "{'name':'q3','kind':'output','dtype':'f32','shape':[8]},{'name':'q4','kind':'output','dtype':'f32','shape':[8]},"
	  "{'name':'q5','kind':'output','dtype':'f32','shape':[8]}],"
	  "'nodes':[{'op':'mul','inputs':['a','a'],'outputs':['sa']},"
	  "{'op':'sum','inputs':['sa'],'outputs':['r1']},{'op':'mean','inputs':['a'],'outputs':['r2']},"
	  "{'op':'max','inputs':['a'],'outputs':['r3']},{'op':'min','inputs':['a'],'outputs':['r4']},"
	  "{'op':'amax','inputs':['a'],'outputs':['r5']},"
	  "{'op':'sum','inputs':['b'],'outputs':['q1']},{'op':'mean','inputs':['b'],'outputs':['q2']},"
	  "{'op':'max','inputs':['b'],'outputs':['q3']},{'op':'min','inputs':['b'],'outputs':['q4']},"
	  "{'op':'amax','inputs':['b'],'outputs':['q5']}]}",
	  -2, 2, 0 },
	{ "every reduction over leading dims, one pass and two",
	  "{'tensors':[{'name':'a','kind':'input','dtype':'f32','shape':[3,20,10]},"
	  "{'name':'b','kind':'input','dtype':'bf16','shape':[20000,300]},"
	  "{'name':'r1','kind':'output','dtype':'f32','shape':[10]},{'name':'r2','kind':'output','dtype':'f32','shape':[1,1,10]},"
	  "{'name':'r3','kind':'output','dtype':'f32','shape':[10]},{'name':'r4','kind':'output','dtype':'f32','shape':[10]},"
	  "{'name':'r5','kind':'output','dtype':'f32','shape':[10]},"
	  "{'name':'q1','kind':'output','dtype':'f32','shape':[300]},{'name':'q2','kind':'output','dtype':'bf16','shape':[1,300]},"
	  "{'name':'q3','kind':'output','dtype':'f32','shape':[300]},{'name':'q4','kind':'output','dtype':'f32','shape':[300]},"
	  "{'name':'q5','kind':'output','dtype':'f32','shape':[300]}],"
	  "'nodes':[{'op':'sum','inputs':['a'],'outputs':['r1'],'attrs':{'axis':'leading'}},"
	  "{'op':'mean','inputs':['a'],'outputs':['r2'],'attrs':{'axis':'leading'}},"
	  "{'op':'max','inputs':['a'],'outputs':['r3'],'attrs':{'axis':'leading'}},"
	  "{'op':'min','inputs':['a'],'outputs':['r4'],'attrs':{'axis':'leading'}},"
	  "{'op':'amax','inputs':['a'],'outputs':['r5'],'attrs':{'axis':'leading'}},"
	  "{'op':'sum','inputs':['b'],'outputs':['q1'],'attrs':{'axis':'leading'}},"
	  "{'op':'mean','inputs':['b'],'outputs':['q2'],'attrs':{'axis':'leading'}},"
	  "{'op':'max','inputs':['b'],'outputs':['q3'],'attrs':{'axis':'leading'}},"
	  "{'op':'min','inputs':['b'],'outputs':['q4'],'attrs':{'axis':'leading'}},"
	  "{'op':'amax','inputs':['b'],'outputs':['q5'],'attrs':{'axis':'leading'}}]}",
	  -2, 2, 0 },
	{ "softmax, log_softmax and their backwards",
	  "{'tensors':[{'name':'x','kind':'input','dtype':'bf16','shape':[4,8,64,129]},"
	  "{'name':'dy','kind':'input','dtype':'bf16','shape':[4,8,64,129]},"
	  "{'name':'y','kind':'output','dtype':'bf16','shape':[4,8,64,129]},"
	  "{'name':'ly','kind':'output','dtype':'f32','shape':[4,8,64,129]},"
	  "{'name':'dx','kind':'output','dtype':'bf16','shape':[4,8,64,129]},"
	  "{'name':'dlx','kind':'output','dtype':'f32','shape':[4,8,64,129]}],"
	  "'nodes':[{'op':'softmax','inputs':['x'],'outputs':['y']},{'op':'log_softmax','inputs':['x'],'outputs':['ly']},"
	  "{'op':'softmax_backward','inputs':['dy','y'],'outputs':['dx']},"
	  "{'op':'log_softmax_backward','inputs':['dy','ly'],'outputs':['dlx']}]}",
	  -4, 4, 0 },
	{ "cross_entropy and its backward",
	  "{'tensors':[{'name':'logits','kind':'input','dtype':'bf16','shape':[300,5003]},"
	  "{'name':'t','kind':'input','dtype':'i64','shape':[300]},"
	  "{'name':'loss','kind':'output','dtype':'f32','shape':[300]},"
	  "{'name':'lse','kind':'output','dtype':'f32','shape':[300,1]},"
	  "{'name':'dloss','kind':'input','dtype':'f32','shape':[300]},"
	  "{'name':'dlogits','kind':'output','dtype':'bf16','shape':[300,5003]}],"
	  "'nodes':[{'op':'cross_entropy','inputs':['logits','t'],'outputs':['loss','lse'],'attrs':{'ignore_index':7}},"
	  "{'op':'cross_entropy_backward','inputs':['dloss','logits','t','lse'],'outputs':['dlogits']}]}",
	  -4, 4, 5003 },
	{ "rms_norm and its backward",
	  "{'tensors':[{'name':'x','kind':'input','dtype':'bf16','shape':[256,2048]},"
	  "{'name':'w','kind':'input','dtype':'bf16','shape':[2048]},"
	  "{'name':'dy','kind':'input','dtype':'bf16','shape':[256,2048]},"
	  "{'name':'y','kind':'output','dtype':'bf16','shape':[256,2048]},"
	  "{'name':'rstd','kind':'output','dtype':'f32','shape':[256,1]},"
	  "{'name':'dx','kind':'output','dtype':'bf16','shape':[256,2048]},"
	  "{'name':'dw','kind':'output','dtype':'f32','shape':[2048]}],"
	  "'nodes':[{'op':'rms_norm','inputs':['x','w'],'outputs':['y','rstd'],'attrs':{'eps':1e-6}},"
	  "{'op':'rms_norm_backward','inputs':['dy','x','w','rstd'],'outputs':['dx','dw']}]}",
	  -2, 2, 0 },
	{ "rotary and its backward",
	  "{'tensors':[{'name':'q','kind':'input','dtype':'bf16','shape':[2,128,4,64]},"
	  "{'name':'cos','kind':'input','dtype':'f32','shape':[128,32]},"
	  "{'name':'sin','kind':'input','dtype':'f32','shape':[128,32]},"
	  "{'name':'qr','kind':'output','dtype':'bf16','shape':[2,128,4,64]},"
	  "{'name':'dq','kind':'output','dtype':'bf16','shape':[2,128,4,64]}],"
	  "'nodes':[{'op':'rotary','inputs':['q','cos','sin'],'outputs':['qr']},"
	  "{'op':'rotary_backward','inputs':['qr','cos','sin'],'outputs':['dq']}]}",
	  -1, 1, 0 },
	{ "adamw and sgd, in place",
	  "{'tensors':[{'name':'p','kind':'inout','dtype':'f32','shape':[1000,33]},"
	  "{'name':'g','kind':'input','dtype':'bf16','shape':[1000,33]},"
	  "{'name':'m','kind':'inout','dtype':'f32','shape':[1000,33]},"
	  "{'name':'v','kind':'inout','dtype':'f32','shape':[1000,33]},"
	  "{'name':'b','kind':'inout','dtype':'bf16','shape':[777]},"
	  "{'name':'gb','kind':'input','dtype':'bf16','shape':[777]},"
	  "{'name':'mb','kind':'inout','dtype':'f32','shape':[777]},"
	  "{'name':'lr','kind':'scalar'},{'name':'step','kind':'scalar'}],"
	  "'nodes':[{'op':'adamw','inputs':['p','g','m','v'],'attrs':{'lr':'lr','step':'step','weight_decay':0.1}},"
	  "{'op':'sgd','inputs':['b','gb','mb'],'attrs':{'lr':'lr','momentum':0.9,'nesterov':true}}]}",
	  0.01, 1, 0 },
	{ "embedding and its backward, repeated indices",
	  "{'tensors':[{'name':'wte','kind':'input','dtype':'bf16','shape':[50,96]},"
	  "{'name':'ids','kind':'input','dtype':'i32','shape':[4,100]},"
	  "{'name':'e','kind':'output','dtype':'bf16','shape':[4,100,96]},"
	  "{'name':'de','kind':'input','dtype':'bf16','shape':[400,96]},"
	  "{'name':'dwte','kind':'output','dtype':'f32','shape':[50,96]}],"
	  "'nodes':[{'op':'embedding','inputs':['wte','ids'],'outputs':['e']},"
	  "{'op':'embedding_backward','inputs':['de','ids'],'outputs':['dwte']}]}",
	  -1, 1, 50 },
};

/* Elementwise tolerance, relative to the tensor's norm: a few roundings
 * of the output's dtype, f32's floor for reductions accumulated in f32. */
static double tolerance(enum rp_dtype dt)
{
	switch (dt) {
	case RP_DTYPE_BF16:
		return 1e-2;
	case RP_DTYPE_F16:
		return 2e-3;
	case RP_DTYPE_F32:
		return 1e-4;
	case RP_DTYPE_F64:
		return 1e-10;
	default:
		return 0;   /* integers: exact */
	}
}

static cJSON *json(const char *text)
{
	char *s = strdup(text);
	cJSON *j;

	for (char *p = s; *p; p++)
		if (*p == '\'')
			*p = '"';
	j = cJSON_Parse(s);
	free(s);
	return j;
}

/* One program's memory on both sides and its compiled steps. */
struct run {
	struct rp_program p;
	struct rd_prog_plan plan;
	size_t *root_bytes;      /* per root tensor */
	void **initial;          /* per bound root: its inputs' values, outputs poisoned */
	void **host;             /* per root: the reference's memory */
	void **dev;              /* per bound root: device memory */
	double *scalars;         /* by bind_index */
	void *arena, *args_dev;
	struct cuda_rtc_module *mods;
	cudaStream_t stream;
};

static bool bound_kind(enum rp_prog_tensor_kind k)
{
	return k == RP_PT_INPUT || k == RP_PT_OUTPUT || k == RP_PT_INOUT;
}

static int run_open(struct run *r, struct cuda_dev *cd, const struct kcase *c, uint64_t salt)
{
	struct rp_error err = { 0 };
	cJSON *params = json(c->json);
	struct tl_rng rng;
	int n;

	memset(r, 0, sizeof(*r));
	if (!params || rp_program_parse(params, &r->p, &err) < 0) {
		printf("  FAIL: %s: the program is refused: %s\n", c->name, gt_err_message(&err));
		cJSON_Delete(params);
		return -1;
	}
	cJSON_Delete(params);
	if (rd_prog_plan_build(&r->p, &r->plan, &err) < 0) {
		printf("  FAIL: %s: plan: %s\n", c->name, gt_err_message(&err));
		return -1;
	}
	n = r->p.ntensors;
	r->root_bytes = calloc((size_t)n, sizeof(size_t));
	r->initial = calloc((size_t)n, sizeof(void *));
	r->host = calloc((size_t)n, sizeof(void *));
	r->dev = calloc((size_t)n, sizeof(void *));
	r->scalars = calloc((size_t)(r->p.nbound + 1), sizeof(double));
	r->mods = calloc((size_t)r->plan.nsteps + 1, sizeof(*r->mods));
	for (int t = 0; t < n; t++) {
		size_t e = r->p.tensors[t].extent_bytes;
		int root = r->p.tensors[t].root;
		if (e > r->root_bytes[root])
			r->root_bytes[root] = e;
	}
	tl_rng_init(&rng, salt);
	for (int t = 0; t < n; t++) {
		const struct rp_prog_tensor *x = &r->p.tensors[t];
		size_t bytes = r->root_bytes[t] ? r->root_bytes[t] : 8, count = bytes / rp_dtype_size(x->dtype);
		if (x->root != t)
			continue;
		if (x->kind == RP_PT_SCALAR) {
			/* step counts from 1; lr and the others are small. */
			r->scalars[x->bind_index] = strcmp(x->name, "step") == 0 ? 3 : tl_rng_uniform(&rng, 0.1, 1);
			continue;
		}
		r->host[t] = malloc(bytes);
		if (!bound_kind(x->kind))
			continue;
		r->initial[t] = malloc(bytes);
		if (x->kind == RP_PT_OUTPUT)
			tl_poison(x->dtype, r->initial[t], count);
		else if (rp_dtype_is_float(x->dtype))
			tl_fill_random(&rng, x->dtype, r->initial[t], count, c->lo, c->hi, NULL);
		else
			tl_fill_random(&rng, x->dtype, r->initial[t], count, 0, (double)(c->int_hi ? c->int_hi : 16), NULL);
		CUDA_OK(cudaMalloc(&r->dev[t], bytes));
	}
	CUDA_OK(cudaMalloc(&r->arena, r->plan.arena_bytes ? r->plan.arena_bytes : 256));
	CUDA_OK(cudaMalloc(&r->args_dev, rd_prog_args_size(&r->plan)));
	CUDA_OK(cudaStreamCreateWithFlags(&r->stream, cudaStreamNonBlocking));
	for (int s = 0; s < r->plan.nsteps; s++) {
		if (r->plan.steps[s].kind == RD_STEP_LIBRARY) {
			printf("  FAIL: %s: step %d is a library call; this test launches generated kernels only\n",
			       c->name, s);
			return -1;
		}
		cuda_rtc_module_init(cd, &r->mods[s], &r->plan.steps[s]);
	}
	return 0;
}

static void run_close(struct run *r)
{
	for (int s = 0; s < r->plan.nsteps; s++)
		cuda_rtc_module_finish(&r->mods[s]);
	for (int t = 0; t < r->p.ntensors; t++) {
		free(r->initial[t]);
		free(r->host[t]);
		if (r->dev[t])
			cudaFree(r->dev[t]);
	}
	cudaFree(r->arena);
	cudaFree(r->args_dev);
	if (r->stream)
		cudaStreamDestroy(r->stream);
	free(r->root_bytes);
	free(r->initial);
	free(r->host);
	free(r->dev);
	free(r->scalars);
	free(r->mods);
	rd_prog_plan_finish(&r->plan);
	rp_program_finish(&r->p);
}

/* The reference: every node in program order on the host's copies. */
static int run_reference(struct run *r)
{
	void **addr = calloc((size_t)r->p.ntensors, sizeof(void *));
	size_t ws = 0;
	void *workspace;
	int rc = 0;

	for (int t = 0; t < r->p.ntensors; t++) {
		const struct rp_prog_tensor *x = &r->p.tensors[t];
		if (x->root == t && r->initial[t])
			memcpy(r->host[t], r->initial[t], r->root_bytes[t]);
	}
	for (int t = 0; t < r->p.ntensors; t++) {
		const struct rp_prog_tensor *x = &r->p.tensors[t], *root = &r->p.tensors[x->root];
		char *base = root->kind == RP_PT_SCALAR ? (char *)&r->scalars[root->bind_index] : r->host[x->root];
		addr[t] = base + (size_t)x->root_offset * rp_dtype_size(x->dtype);
	}
	for (int i = 0; i < r->p.nnodes; i++) {
		size_t w = rd_host_node_workspace(&r->p, i);
		ws = w > ws ? w : ws;
	}
	workspace = malloc(ws ? ws : 1);
	for (int i = 0; i < r->p.nnodes && rc == 0; i++)
		rc = rd_host_node_run(&r->p, i, addr, workspace, ws);
	free(workspace);
	free(addr);
	return rc;
}

/* The generated kernels, step after step, from the initial values. */
static int run_device(struct run *r, struct rp_error *err)
{
	void **bound = calloc((size_t)(r->p.nbound + 1), sizeof(void *));
	size_t args_size = rd_prog_args_size(&r->plan);
	void *args = malloc(args_size);
	int rc = 0;

	for (int t = 0; t < r->p.ntensors; t++) {
		const struct rp_prog_tensor *x = &r->p.tensors[t];
		if (x->root == t && r->dev[t]) {
			CUDA_OK(cudaMemcpy(r->dev[t], r->initial[t], r->root_bytes[t], cudaMemcpyHostToDevice));
			bound[x->bind_index] = r->dev[t];
		}
	}
	rd_prog_args_fill(&r->plan, args, bound, r->arena, r->scalars);
	CUDA_OK(cudaMemcpy(r->args_dev, args, args_size, cudaMemcpyHostToDevice));
	for (int s = 0; s < r->plan.nsteps && rc == 0; s++) {
		rc = cuda_rtc_module_get(&r->mods[s], err);
		for (int k = 0; k < r->plan.steps[s].nkernels && rc == 0; k++)
			rc = cuda_rtc_launch(&r->mods[s], k, r->stream, r->args_dev, err);
	}
	CUDA_OK(cudaStreamSynchronize(r->stream));
	free(bound);
	free(args);
	return rc;
}

/* Device results against the reference, each output and inout root. */
static bool compare(struct run *r, const char *name)
{
	bool ok = true;

	for (int t = 0; t < r->p.ntensors; t++) {
		const struct rp_prog_tensor *x = &r->p.tensors[t];
		if (x->root != t || (x->kind != RP_PT_OUTPUT && x->kind != RP_PT_INOUT))
			continue;
		size_t count = r->root_bytes[t] / rp_dtype_size(x->dtype);
		void *got = malloc(r->root_bytes[t]);
		double num = 0, den = 0;
		unsigned long nan_wrong = 0, poison_wrong = 0, int_wrong = 0;
		CUDA_OK(cudaMemcpy(got, r->dev[t], r->root_bytes[t], cudaMemcpyDeviceToHost));
		for (size_t i = 0; i < count; i++) {
			double g = tl_load(x->dtype, got, i), want = tl_load(x->dtype, r->host[t], i);
			if (tl_is_poison(x->dtype, r->host[t], i) != tl_is_poison(x->dtype, got, i)) {
				poison_wrong++;
				continue;
			}
			if (isnan(want) || isnan(g)) {
				nan_wrong += isnan(want) != isnan(g);
				continue;
			}
			if (!rp_dtype_is_float(x->dtype)) {
				int_wrong += g != want;
				continue;
			}
			num += (g - want) * (g - want);
			den += want * want;
		}
		double rel = den > 0 ? sqrt(num / den) : sqrt(num);
		bool good = rel <= tolerance(x->dtype) && !nan_wrong && !poison_wrong && !int_wrong;
		GT_CHECK(good, "%s: %s (%s, %zu elements): relative error %.3g (tolerance %.3g), %lu NaN mismatches, "
			 "%lu elements written that should not be or not written that should, %lu integers wrong",
			 name, x->name, rp_dtype_name(x->dtype), count, rel, tolerance(x->dtype), nan_wrong, poison_wrong,
			 int_wrong);
		ok &= good;
		free(got);
	}
	return ok;
}

/* Every output's and inout's bytes, to compare two runs bit for bit. */
static void *snapshot(struct run *r, size_t *size)
{
	size_t total = 0, at = 0;

	for (int t = 0; t < r->p.ntensors; t++)
		if (r->p.tensors[t].root == t && r->dev[t] && r->p.tensors[t].kind != RP_PT_INPUT)
			total += r->root_bytes[t];
	char *buf = malloc(total ? total : 1);
	for (int t = 0; t < r->p.ntensors; t++)
		if (r->p.tensors[t].root == t && r->dev[t] && r->p.tensors[t].kind != RP_PT_INPUT) {
			CUDA_OK(cudaMemcpy(buf + at, r->dev[t], r->root_bytes[t], cudaMemcpyDeviceToHost));
			at += r->root_bytes[t];
		}
	*size = total;
	return buf;
}

static void run_case(struct gt *t, const struct kcase *c, uint64_t salt)
{
	struct run r;
	struct rp_error err = { 0 };
	size_t n1, n2;

	printf("%s\n", c->name);
	if (run_open(&r, cuda_dev_of(&t->dev), c, salt) < 0) {
		gt_failures++;
		run_close(&r);
		return;
	}
	printf("  %d nodes in %d steps, %llu kernels, arena %llu bytes\n", r.p.nnodes, r.plan.nsteps,
	       (unsigned long long)r.plan.fused_kernels, (unsigned long long)r.plan.arena_bytes);
	int rc = run_reference(&r);
	GT_CHECK(rc == 0, "%s: the host reference ran (%d)", c->name, rc);
	rc = run_device(&r, &err);
	GT_CHECK(rc == 0, "%s: the kernels compiled, loaded and launched%s%s", c->name, rc ? ": " : "",
		 rc ? gt_err_message(&err) : "");
	if (rc == 0) {
		compare(&r, c->name);
		void *first = snapshot(&r, &n1);
		rc = run_device(&r, &err);
		void *second = snapshot(&r, &n2);
		GT_CHECK(rc == 0 && n1 == n2 && memcmp(first, second, n1) == 0, "%s: a second run gives the same bits",
			 c->name);
		free(first);
		free(second);
	}
	rp_error_clear(&err);
	run_close(&r);
}

/* A module across a release (unloaded, loaded again from the image kept)
 * and a forgotten context (the handle dropped, no CUDA call): the image
 * is compiled once. */
static void module_lifecycle(struct gt *t)
{
	struct run r;
	struct rp_error err = { 0 };

	printf("module lifecycle\n");
	if (run_open(&r, cuda_dev_of(&t->dev), &cases[0], 1000) < 0) {
		gt_failures++;
		run_close(&r);
		return;
	}
	run_reference(&r);
	int rc = run_device(&r, &err);
	void *image = r.mods[0].image;
	GT_CHECK(rc == 0 && r.mods[0].res.init_count == 1 && image, "first run: compiled and loaded once");
	rd_registry_release(&t->dev.registry);
	GT_CHECK(!rd_resource_is_valid(&r.mods[0].res) && r.mods[0].module == NULL, "release unloads the module");
	rc = run_device(&r, &err);
	GT_CHECK(rc == 0 && r.mods[0].res.init_count == 2 && r.mods[0].image == image,
		 "after a release: loaded again from the image kept (init %llu)",
		 (unsigned long long)r.mods[0].res.init_count);
	GT_CHECK(compare(&r, "after a release"), "after a release: the same results");
	rd_registry_invalidate(&t->dev.registry);
	GT_CHECK(!rd_resource_is_valid(&r.mods[0].res) && r.mods[0].module == NULL, "invalidate forgets the module");
	rc = run_device(&r, &err);
	GT_CHECK(rc == 0 && r.mods[0].res.init_count == 3 && r.mods[0].image == image,
		 "after an invalidate: loaded again from the image kept");
	GT_CHECK(compare(&r, "after an invalidate"), "after an invalidate: the same results");
	rp_error_clear(&err);
	run_close(&r);
}

static int count_files(const char *dir)
{
	DIR *d = opendir(dir);
	struct dirent *e;
	int n = 0;

	if (!d)
		return -1;
	while ((e = readdir(d)))
		n += e->d_name[0] != '.';
	closedir(d);
	return n;
}

static void *read_file(const char *path, size_t *size)
{
	FILE *f = fopen(path, "rb");
	char *buf;

	if (!f)
		return NULL;
	fseek(f, 0, SEEK_END);
	*size = (size_t)ftell(f);
	fseek(f, 0, SEEK_SET);
	buf = malloc(*size ? *size : 1);
	if (fread(buf, 1, *size, f) != *size) {
		free(buf);
		buf = NULL;
	}
	fclose(f);
	return buf;
}

/* The on-disk cache: a compile writes one file; a fresh module reads the
 * same image back; a file holding another source under this source's
 * name is not taken (the header and the source are checked). */
static void disk_cache(struct gt *t)
{
	char dir[] = "/tmp/regen-rtc-test-XXXXXX";
	struct cuda_dev *cd = cuda_dev_of(&t->dev);
	struct rp_error err = { 0 };
	struct run a, b;
	int major = 0, minor = 0;

	printf("on-disk cache\n");
	if (!mkdtemp(dir)) {
		GT_CHECK(false, "mkdtemp: %s", strerror(errno));
		return;
	}
	snprintf(t->dev.rtc_cache_dir, sizeof(t->dev.rtc_cache_dir), "%s", dir);
	if (run_open(&a, cd, &cases[0], 2000) < 0 || run_open(&b, cd, &cases[1], 2001) < 0) {
		gt_failures++;
		return;
	}
	int rc = cuda_rtc_module_compile(&a.mods[0], &err);
	GT_CHECK(rc == 0 && count_files(dir) == 1, "a compile leaves one file in the cache (%d)", count_files(dir));

	struct cuda_rtc_module again;
	cuda_rtc_module_init(cd, &again, &a.plan.steps[0]);
	rc = cuda_rtc_module_compile(&again, &err);
	GT_CHECK(rc == 0 && again.image_size == a.mods[0].image_size &&
			 memcmp(again.image, a.mods[0].image, again.image_size) == 0,
		 "a fresh module reads the same image back");
	cuda_rtc_module_finish(&again);

	/* b's file name, a's bytes. */
	char path_a[4096], path_b[4096];
	nvrtcVersion(&major, &minor);
	snprintf(path_a, sizeof(path_a), "%s/%016llx-%s%d-nvrtc%d.%d.%s", dir,
		 (unsigned long long)a.plan.steps[0].source_hash, a.mods[0].image_is_ptx ? "compute" : "sm",
		 a.mods[0].arch, major, minor, a.mods[0].image_is_ptx ? "ptx" : "cubin");
	snprintf(path_b, sizeof(path_b), "%s/%016llx-%s%d-nvrtc%d.%d.%s", dir,
		 (unsigned long long)b.plan.steps[0].source_hash, a.mods[0].image_is_ptx ? "compute" : "sm",
		 a.mods[0].arch, major, minor, a.mods[0].image_is_ptx ? "ptx" : "cubin");
	size_t size = 0;
	void *bytes = read_file(path_a, &size);
	GT_CHECK(bytes != NULL, "the cache file is named by the source's hash and the architecture: %s", path_a);
	FILE *f = bytes ? fopen(path_b, "wb") : NULL;
	if (f) {
		fwrite(bytes, 1, size, f);
		fclose(f);
	}
	free(bytes);
	rc = cuda_rtc_module_compile(&b.mods[0], &err);
	GT_CHECK(rc == 0 && (b.mods[0].image_size != a.mods[0].image_size ||
			     memcmp(b.mods[0].image, a.mods[0].image, a.mods[0].image_size) != 0),
		 "another source's file under this source's name is not taken");
	run_reference(&b);
	rc = run_device(&b, &err);
	GT_CHECK(rc == 0 && compare(&b, "after the cache refused a file"), "and the kernels compiled instead run right");

	t->dev.rtc_cache_dir[0] = '\0';
	rp_error_clear(&err);
	run_close(&a);
	run_close(&b);
	char cmd[128];
	snprintf(cmd, sizeof(cmd), "rm -rf %s", dir);
	if (system(cmd) != 0)
		printf("  (could not remove %s)\n", dir);
}

/* Bandwidth of a large fused kernel: bytes moved over time, against the
 * memory's peak (clock x bus width x 2). Printed, not asserted: timings on
 * a shared machine vary; the target is 90%. */
static void bandwidth(struct gt *t, const char *name, const char *json_text, double bytes_moved)
{
	struct kcase c = { name, json_text, -1, 1, 0 };
	struct rp_error err = { 0 };
	struct run r;
	cudaEvent_t e0, e1;
	int clock_khz = 0, bus_bits = 0;
	float ms = 0;
	enum { REPS = 20 };

	if (run_open(&r, cuda_dev_of(&t->dev), &c, 3000) < 0) {
		gt_failures++;
		run_close(&r);
		return;
	}
	if (run_device(&r, &err) < 0) {
		GT_CHECK(false, "%s: %s", name, gt_err_message(&err));
		run_close(&r);
		return;
	}
	cudaEventCreate(&e0);
	cudaEventCreate(&e1);
	cudaEventRecord(e0, r.stream);
	for (int i = 0; i < REPS; i++)
		for (int s = 0; s < r.plan.nsteps; s++)
			for (int k = 0; k < r.plan.steps[s].nkernels; k++)
				cuda_rtc_launch(&r.mods[s], k, r.stream, r.args_dev, &err);
	cudaEventRecord(e1, r.stream);
	CUDA_OK(cudaEventSynchronize(e1));
	cudaEventElapsedTime(&ms, e0, e1);
	cudaDeviceGetAttribute(&clock_khz, cudaDevAttrMemoryClockRate, 0);
	cudaDeviceGetAttribute(&bus_bits, cudaDevAttrGlobalMemoryBusWidth, 0);
	double gbs = bytes_moved * REPS / (ms * 1e-3) / 1e9;
	double peak = 2.0 * clock_khz * 1e3 * bus_bits / 8 / 1e9;
	printf("  bandwidth: %s: %.0f GB/s, %.0f%% of the memory's %.0f GB/s%s\n", name, gbs, 100 * gbs / peak, peak,
	       gbs < 0.9 * peak ? " (below the 90% target)" : "");
	cudaEventDestroy(e0);
	cudaEventDestroy(e1);
	rp_error_clear(&err);
	run_close(&r);
}

int main(void)
{
	struct gt t;

	if (gt_have_gpu())
		return GT_SKIP;
	tl_rand_init();
	gt_open(&t);
	for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++)
		run_case(&t, &cases[i], i + 1);
	module_lifecycle(&t);
	disk_cache(&t);

	printf("bandwidth\n");
	/* 256 Mi bf16 elements: 512 MiB in twice, out once. */
	bandwidth(&t, "y = x * 2 + z, bf16",
		  "{'tensors':[{'name':'x','kind':'input','dtype':'bf16','shape':[16384,16384]},"
		  "{'name':'z','kind':'input','dtype':'bf16','shape':[16384,16384]},"
		  "{'name':'h','kind':'intermediate','dtype':'f32','shape':[16384,16384]},"
		  "{'name':'y','kind':'output','dtype':'bf16','shape':[16384,16384]}],"
		  "'nodes':[{'op':'mul','inputs':['x'],'outputs':['h'],'attrs':{'scalar':2}},"
		  "{'op':'add','inputs':['h','z'],'outputs':['y']}]}",
		  3.0 * 16384 * 16384 * 2);
	bandwidth(&t, "gelu, f32",
		  "{'tensors':[{'name':'x','kind':'input','dtype':'f32','shape':[8192,16384]},"
		  "{'name':'y','kind':'output','dtype':'f32','shape':[8192,16384]}],"
		  "'nodes':[{'op':'gelu','inputs':['x'],'outputs':['y']}]}",
		  2.0 * 8192 * 16384 * 4);
	bandwidth(&t, "row sums, bf16 [65536, 4096]",
		  "{'tensors':[{'name':'x','kind':'input','dtype':'bf16','shape':[65536,4096]},"
		  "{'name':'s','kind':'output','dtype':'f32','shape':[65536]}],"
		  "'nodes':[{'op':'sum','inputs':['x'],'outputs':['s']}]}",
		  65536.0 * 4096 * 2);
	bandwidth(&t, "column sums (a bias gradient), bf16 [65536, 4096]",
		  "{'tensors':[{'name':'x','kind':'input','dtype':'bf16','shape':[65536,4096]},"
		  "{'name':'s','kind':'output','dtype':'f32','shape':[4096]}],"
		  "'nodes':[{'op':'sum','inputs':['x'],'outputs':['s'],'attrs':{'axis':'leading'}}]}",
		  65536.0 * 4096 * 2);

	gt_close(&t);
	printf("%s: %d failure%s\n", gt_failures ? "FAIL" : "PASS", gt_failures, gt_failures == 1 ? "" : "s");
	return gt_failures ? 1 : 0;
}
