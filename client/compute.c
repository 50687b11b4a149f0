/* libregen: GEMM and attention calls. */
#include <errno.h>
#include <string.h>
#include "private.h"

static const char *dtype_name(enum regen_dtype dt)
{
	switch (dt) {
	case REGEN_F32:
		return "f32";
	case REGEN_F16:
		return "f16";
	case REGEN_BF16:
		return "bf16";
	}
	return NULL;
}

/* Every buffer and event a call names belongs to this client and lives on
 * one device (*device, -1 before the first). */
static int check_object(regen_client *c, const char *what, const char *name, const struct rc_object *obj,
			int *device)
{
	if (obj->client != c) {
		rc_set_local_error(c, "%s %s: %s belongs to another client", what, name, obj->id);
		return -EINVAL;
	}
	if (*device >= 0 && obj->device != *device) {
		rc_set_local_error(c, "%s %s is on device %d, the call on device %d", what, name, obj->device, *device);
		return -EINVAL;
	}
	*device = obj->device;
	return 0;
}

/* Adds wait_event and signal_event (each may be NULL), on the operands'
 * device. */
static int add_events(regen_client *c, cJSON *p, const regen_event *wait, const regen_event *signal, int *device)
{
	const struct {
		const char *name;
		const regen_event *ev;
	} events[] = { { "wait_event", wait }, { "signal_event", signal } };
	int r;

	for (size_t i = 0; i < 2; i++) {
		if (events[i].ev == NULL) {
			continue;
		}
		r = check_object(c, "event", events[i].name, &events[i].ev->obj, device);
		if (r < 0) {
			return r;
		}
		if (cJSON_AddStringToObject(p, events[i].name, events[i].ev->obj.id) == NULL) {
			return -ENOMEM;
		}
	}
	return 0;
}

/* Adds the io.regen.Operand for `t` under `name`. */
static int add_operand(regen_client *c, cJSON *p, const char *name, const struct regen_tensor *t, int *device)
{
	cJSON *o, *shape, *strides = NULL;
	bool any_stride = false;
	const char *dt;
	int i, r;

	if (t->buffer == NULL) {
		rc_set_local_error(c, "operand %s has no buffer", name);
		return -EINVAL;
	}
	r = check_object(c, "operand", name, &t->buffer->obj, device);
	if (r < 0) {
		return r;
	}
	dt = dtype_name(t->dtype);
	if (dt == NULL || t->rank < 1 || t->rank > 4) {
		rc_set_local_error(c, "operand %s: bad dtype or rank", name);
		return -EINVAL;
	}
	o = cJSON_AddObjectToObject(p, name);
	if (o == NULL || cJSON_AddStringToObject(o, "buffer", t->buffer->obj.id) == NULL ||
	    cJSON_AddNumberToObject(o, "offset", (double)t->offset) == NULL ||
	    cJSON_AddStringToObject(o, "dtype", dt) == NULL) {
		return -ENOMEM;
	}
	shape = cJSON_AddArrayToObject(o, "shape");
	if (shape == NULL) {
		return -ENOMEM;
	}
	for (i = 0; i < t->rank; i++) {
		if (!cJSON_AddItemToArray(shape, cJSON_CreateNumber((double)t->shape[i]))) {
			return -ENOMEM;
		}
		if (t->strides[i] != 0) {
			any_stride = true;
		}
	}
	if (any_stride) {
		strides = cJSON_AddArrayToObject(o, "strides");
		if (strides == NULL) {
			return -ENOMEM;
		}
		for (i = 0; i < t->rank; i++) {
			if (!cJSON_AddItemToArray(strides, cJSON_CreateNumber((double)t->strides[i]))) {
				return -ENOMEM;
			}
		}
	}
	return 0;
}

REGEN_EXPORT int regen_gemm(regen_client *c, const struct regen_gemm_args *g)
{
	static const char *const epilogues[] = { "none", "bias", "gelu", "gelu_bias" };
	cJSON *p;
	int device = -1, r;
	double alpha;

	if (c == NULL || g == NULL || (unsigned)g->epilogue > REGEN_EPILOGUE_GELU_BIAS) {
		return -EINVAL;
	}
	p = cJSON_CreateObject();
	if (p == NULL) {
		return -ENOMEM;
	}
	r = add_operand(c, p, "a", &g->a, &device);
	if (r == 0) {
		r = add_operand(c, p, "b", &g->b, &device);
	}
	if (r == 0 && g->c != NULL) {
		r = add_operand(c, p, "c", g->c, &device);
	}
	if (r == 0) {
		r = add_operand(c, p, "d", &g->d, &device);
	}
	if (r == 0 && g->bias != NULL) {
		r = add_operand(c, p, "bias", g->bias, &device);
	}
	if (r == 0) {
		r = add_events(c, p, g->wait_event, g->signal_event, &device);
	}
	if (r < 0) {
		goto out;
	}
	alpha = g->alpha;
	if (!g->alpha_set && alpha == 0) {
		alpha = 1;
	}
	r = -ENOMEM;
	if ((g->trans_a && cJSON_AddBoolToObject(p, "trans_a", 1) == NULL) ||
	    (g->trans_b && cJSON_AddBoolToObject(p, "trans_b", 1) == NULL) ||
	    cJSON_AddNumberToObject(p, "alpha", alpha) == NULL ||
	    ((g->beta != 0 || g->c != NULL) && cJSON_AddNumberToObject(p, "beta", g->beta) == NULL) ||
	    (g->epilogue != REGEN_EPILOGUE_NONE &&
	     cJSON_AddStringToObject(p, "epilogue", epilogues[g->epilogue]) == NULL) ||
	    (g->tf32 && cJSON_AddStringToObject(p, "compute", "tf32") == NULL)) {
		goto out;
	}
	r = rc_call(c, device, "io.regen.Compute.Gemm", p, NULL, 0, NULL);
out:
	cJSON_Delete(p);
	return r;
}

REGEN_EXPORT int regen_attention(regen_client *c, const struct regen_attention_args *a)
{
	cJSON *p;
	int device = -1, r;

	if (c == NULL || a == NULL) {
		return -EINVAL;
	}
	p = cJSON_CreateObject();
	if (p == NULL) {
		return -ENOMEM;
	}
	r = add_operand(c, p, "q", &a->q, &device);
	if (r == 0) {
		r = add_operand(c, p, "k", &a->k, &device);
	}
	if (r == 0) {
		r = add_operand(c, p, "v", &a->v, &device);
	}
	if (r == 0) {
		r = add_operand(c, p, "o", &a->o, &device);
	}
	if (r == 0 && a->stats != NULL) {
		r = add_operand(c, p, "stats", a->stats, &device);
	}
	if (r == 0) {
		r = add_events(c, p, a->wait_event, a->signal_event, &device);
	}
	if (r < 0) {
		goto out;
	}
	r = -ENOMEM;
	if ((a->scale != 0 && cJSON_AddNumberToObject(p, "scale", a->scale) == NULL) ||
	    cJSON_AddBoolToObject(p, "causal", a->causal) == NULL) {
		goto out;
	}
	r = rc_call(c, device, "io.regen.Compute.Attention", p, NULL, 0, NULL);
out:
	cJSON_Delete(p);
	return r;
}

/* The operand table takes a's members' addresses: only once a is known. */
static int attention_backward(regen_client *c, const struct regen_attention_backward_args *a)
{
	const struct {
		const char *name;
		const struct regen_tensor *t;
	} ops[] = {
		{ "q", &a->q }, { "k", &a->k }, { "v", &a->v }, { "o", &a->o }, { "d_o", &a->d_o },
		{ "stats", &a->stats }, { "d_q", &a->d_q }, { "d_k", &a->d_k }, { "d_v", &a->d_v },
	};
	cJSON *p;
	int device = -1, r = 0;
	size_t i;

	p = cJSON_CreateObject();
	if (p == NULL) {
		return -ENOMEM;
	}
	for (i = 0; i < sizeof(ops) / sizeof(ops[0]) && r == 0; i++) {
		r = add_operand(c, p, ops[i].name, ops[i].t, &device);
	}
	if (r == 0) {
		r = add_events(c, p, a->wait_event, a->signal_event, &device);
	}
	if (r < 0) {
		goto out;
	}
	r = -ENOMEM;
	if ((a->scale != 0 && cJSON_AddNumberToObject(p, "scale", a->scale) == NULL) ||
	    cJSON_AddBoolToObject(p, "causal", a->causal) == NULL) {
		goto out;
	}
	r = rc_call(c, device, "io.regen.Compute.AttentionBackward", p, NULL, 0, NULL);
out:
	cJSON_Delete(p);
	return r;
}

REGEN_EXPORT int regen_attention_backward(regen_client *c, const struct regen_attention_backward_args *a)
{
	if (c == NULL || a == NULL) {
		return -EINVAL;
	}
	return attention_backward(c, a);
}
