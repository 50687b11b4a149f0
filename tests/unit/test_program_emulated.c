/* SPDX-License-Identifier: Apache-2.0 */
/* The kernels daemon/program/ writes, run without a GPU: each step's
 * source compiled as C++ behind tests/unit/program_emulator.hpp (the host
 * playing the GPU: blocks in turn, a block's threads as coroutines switched
 * at __syncthreads and at shuffles) and launched as the executor launches it,
 * against the host backend's reference on random inputs
 * (tests/lib/program_check.h: the same programs the GPU test runs; their
 * library steps, GEMMs and attention, in the reference's math). Every
 * program twice: with memory aligned to the kernels' vectors (their
 * vector paths) and one element off (their scalar paths), on grids of one
 * and two SMs' worth of blocks (the kernels loop over the rest).
 *
 * What this cannot see: the GPU's own math library (the host's libm stands
 * in, within the tolerances), its memory model, and speed. The GPU test
 * (tests/gpu/test_program_kernels.c) checks those on a GPU.
 *
 * Needs a C++ compiler (REGEN_TEST_CXX) and the toolkit's cuda_bf16.h
 * (REGEN_TEST_CUDA_INCLUDE); skipped (exit 77) without them.
 * REGEN_TEST_PROGRAM_FILES=a.json:b.json runs those programs instead (a
 * model's, as REGEN_COMPILE_DUMP writes them). */
#include <check.h>
#include <dlfcn.h>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "daemon/program/plan.h"
#include "tests/lib/program_check.h"
#include "tests/lib/rand.h"
#include "tests/unit/emulated.h"
#include "tests/unit/unit.h"

static struct tl_emulated emu;

typedef int emulate_fn(void *kernel, const void *args, unsigned grid, unsigned block);

/* The step's kernels as a shared object of the host, named by its
 * source's hash. */
static void *load_step(const struct rd_prog_step *st)
{
	char stem[32], *text = NULL;

	snprintf(stem, sizeof(stem), "%016llx", (unsigned long long)st->source_hash);
	ck_assert_int_ge(asprintf(&text, "%s\nRG_EMULATOR_LAUNCHER\n", st->source), 0);
	void *h = tl_emulated_load(&emu, stem, text, NULL);
	free(text);
	return h;
}

/* The program's first embedding node (forward or backward). */
static int gather_node(const struct rp_program *p)
{
	for (int i = 0; i < p->nnodes; i++)
		if (p->nodes[i].op->cls == RP_PC_GATHER)
			return i;
	ck_abort_msg("program %s has no embedding", p->name);
	return -1;
}

/* Rows of the node's table. */
static int64_t gather_rows(const struct rp_program *p, int node)
{
	const struct rp_prog_node *n = &p->nodes[node];

	return p->tensors[n->gather.fn == RP_GATHER_EMBEDDING ? n->in[0] : n->out[0]].shape[0];
}

/* Index tensor x's element at flat position `where` (its root at base). */
static void set_index(void *base, const struct rp_prog_tensor *x, int64_t where, int64_t value)
{
	int64_t off = x->root_offset, rest = where;

	for (int d = x->rank - 1; d >= 0; d--) {
		off += (rest % x->shape[d]) * x->strides[d];
		rest /= x->shape[d];
	}
	if (x->dtype == RP_DTYPE_I64)
		((int64_t *)base)[off] = value;
	else
		((int32_t *)base)[off] = (int32_t)value;
}

/* One run of the program's kernels over host memory: `skew` elements off
 * their vectors' alignment, grids for `sms` SMs. With `bad`: one index
 * made bad (*bad says where), which the run must report, not compare. */
static void run(const struct tl_prog_case *c, uint64_t salt, unsigned skew, unsigned sms, struct rd_prog_fault *bad)
{
	struct tl_prog t;
	char why[256], msg[512];
	int n;

	ck_assert_msg(tl_prog_open(&t, c, salt, why, sizeof(why)) == 0, "%s: %s", c->name, why);
	ck_assert_msg(!c->steps || t.plan.nsteps == c->steps, "%s: planned in %d steps, not %d", c->name, t.plan.nsteps,
		      c->steps);
	ck_assert_int_eq(tl_prog_reference(&t), 0);
	n = t.p.ntensors;
	void **mem = calloc((size_t)n, sizeof(void *)), **bound = calloc((size_t)t.p.nbound + 1, sizeof(void *));
	void **blocks = calloc((size_t)n, sizeof(void *));
	for (int i = 0; i < n; i++) {
		const struct rp_prog_tensor *x = &t.p.tensors[i];
		if (x->root != i || !t.initial[i])
			continue;
		blocks[i] = aligned_alloc(256, (t.root_bytes[i] + 8 * skew + 256) / 256 * 256);
		mem[i] = (char *)blocks[i] + skew * rp_dtype_size(x->dtype);
		memcpy(mem[i], t.initial[i], t.root_bytes[i]);
		bound[x->bind_index] = mem[i];
	}
	void *arena = aligned_alloc(256, t.plan.arena_bytes + 256);
	memset(arena, 0xcd, t.plan.arena_bytes + 256);   /* what an arena holds before: not zeros */
	if (t.plan.fault_offset != RD_PROG_NOT_IN_ARENA)
		memset((char *)arena + t.plan.fault_offset, 0, sizeof(struct rd_prog_fault));
	struct rd_prog_fault fault = { 0 };
	void *args = malloc(rd_prog_args_size(&t.plan));
	rd_prog_args_fill(&t.plan, args, bound, arena, &fault, t.scalars);
	if (bad) {
		/* One index outside the table, at a random place. */
		int node = gather_node(&t.p), index = t.p.nodes[node].in[1];
		int64_t vocab = gather_rows(&t.p, node), where = tl_rng_int(tl_rand(), 0, t.p.tensors[index].numel - 1);
		int64_t value = tl_rand_int(0, 1) ? vocab + tl_rand_int(0, 4) : -1 - tl_rand_int(0, 4);
		set_index(mem[t.p.tensors[index].root], &t.p.tensors[index], where, value);
		bad->node = node;
		bad->position = where;
		bad->value = value;
	}

	for (int s = 0; s < t.plan.nsteps; s++) {
		const struct rd_prog_step *st = &t.plan.steps[s];
		if (st->kind == RD_STEP_LIBRARY) {
			ck_assert_int_eq(tl_prog_run_library(&t, s, bound, arena), 0);
			continue;
		}
		void *h = load_step(st);
		emulate_fn *emulate = (emulate_fn *)dlsym(h, "rg_emulate");
		ck_assert_ptr_nonnull(emulate);
		for (int k = 0; k < st->nkernels; k++) {
			void *fn = dlsym(h, st->kernels[k].name);
			unsigned grid = rd_prog_kernel_grid(&st->kernels[k], sms);
			ck_assert_msg(fn != NULL, "%s is not in step %d's object", st->kernels[k].name, s);
			if (grid)
				ck_assert_int_eq(emulate(fn, args, grid, st->kernels[k].block), 0);
		}
		dlclose(h);
	}
	if (bad) {
		ck_assert_msg(fault.raised, "%s: an index outside the table was not reported", c->name);
		ck_assert_int_eq(fault.node, bad->node);
		ck_assert_int_eq(fault.position, bad->position);
		ck_assert_int_eq(fault.value, bad->value);
		ck_assert_uint_eq(((struct rd_prog_fault *)((char *)arena + t.plan.fault_offset))->raised, 0);
	} else {
		ck_assert_msg(!fault.raised, "%s: a bad index reported (node %d, position %lld, value %lld) with none",
			      c->name, fault.node, (long long)fault.position, (long long)fault.value);
	}
	for (int i = 0; i < n && !bad; i++) {
		if (!tl_prog_is_result(&t, i))
			continue;
		bool ok = tl_prog_compare(&t, i, mem[i], msg, sizeof(msg));
		ck_assert_msg(ok, "%s (%s, %u SMs): %s", c->name, skew ? "one element off" : "aligned", sms, msg);
	}
	for (int i = 0; i < n; i++)
		free(blocks[i]);
	free(blocks);
	free(mem);
	free(bound);
	free(arena);
	free(args);
	tl_prog_close(&t);
}

START_TEST(kernels_match_the_reference)
{
	const struct tl_prog_case *c = &tl_prog_cases[_i];

	run(c, (uint64_t)_i + 1, 0, 2, NULL);
	run(c, (uint64_t)_i + 100, 1, 1, NULL);
}
END_TEST

/* Whether case c's first embedding reads its indices from an input (one
 * the test can make bad; a loss's gather reads indices it computes). */
static bool gather_reads_an_input(const struct tl_prog_case *c)
{
	struct tl_prog t;
	char why[256];

	if (!strstr(c->json, "'embedding"))
		return false;
	ck_assert_msg(tl_prog_open(&t, c, 1, why, sizeof(why)) == 0, "%s: %s", c->name, why);
	int index = t.p.nodes[gather_node(&t.p)].in[1];
	bool input = t.p.tensors[t.p.tensors[index].root].kind == RP_PT_INPUT;
	tl_prog_close(&t);
	return input;
}

/* An index outside its table, in every program with an embedding (its
 * forward or backward first) of indices given as input: the first step's
 * report names the node, the position and the value, and the arena's note
 * is clear after. */
START_TEST(bad_index_is_reported)
{
	int found = 0;

	for (size_t i = 0; i < tl_prog_ncases; i++) {
		if (!gather_reads_an_input(&tl_prog_cases[i]))
			continue;
		for (unsigned skew = 0; skew < 2; skew++) {
			struct rd_prog_fault bad = { 0 };
			run(&tl_prog_cases[i], 500 + i, skew, 1 + skew, &bad);
		}
		found++;
	}
	ck_assert_int_gt(found, 0);
}
END_TEST

/* Programs from files (REGEN_TEST_PROGRAM_FILES, colon-separated: the
 * JSON REGEN_COMPILE_DUMP writes, a compiled model's programs as
 * io.regen.Program.Define gets them), run the same way: a real model's
 * graph, planned and emulated against the reference, without torch or a
 * GPU (gpu-check's `dumps` makes them at a shape the host can run). */
static struct tl_prog_case *dumped;
static int ndumped;

static void load_dumped(void)
{
	const char *files = getenv("REGEN_TEST_PROGRAM_FILES");
	char *list, *save = NULL;

	if (!files || !*files)
		return;
	list = strdup(files);
	for (char *path = strtok_r(list, ":", &save); path; path = strtok_r(NULL, ":", &save)) {
		dumped = realloc(dumped, (size_t)(ndumped + 1) * sizeof(*dumped));
		int r = tl_prog_case_read(&dumped[ndumped++], path);
		if (r) {
			fprintf(stderr, "REGEN_TEST_PROGRAM_FILES: %s: %s\n", path, strerror(-r));
			exit(1);
		}
	}
	free(list);
}

START_TEST(dumped_programs_match_the_reference)
{
	run(&dumped[_i], (uint64_t)_i + 1000, 0, 2, NULL);
}
END_TEST

static Suite *suite(void)
{
	Suite *s = suite_create("program_emulated");
	TCase *tc = tcase_create("emulated");

	tcase_set_timeout(tc, ndumped ? 3600 : 600);
	if (ndumped) {
		tcase_add_loop_test(tc, dumped_programs_match_the_reference, 0, ndumped);
	} else {
		tcase_add_loop_test(tc, kernels_match_the_reference, 0, (int)tl_prog_ncases);
		tcase_add_test(tc, bad_index_is_reported);
	}
	suite_add_tcase(s, tc);
	return s;
}

int main(void)
{
	int r = tl_emulated_open(&emu, "cuda_bf16.h");

	if (r)
		return r;
	tl_rand_init();
	load_dumped();
	r = unit_run(suite());
	tl_emulated_close(&emu);
	return r;
}
