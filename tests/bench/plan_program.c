/* SPDX-License-Identifier: Apache-2.0 */
/* The CUDA backend's plan of programs given as io.regen.Program.Define's
 * parameters (the JSON REGEN_COMPILE_DUMP writes beside a compiled model's
 * graphs): its steps as the executor's trace lists them (REGEN_PROGRAM_TRACE,
 * without the times), and the totals, to see what a change to the planner
 * does to real programs without torch or a GPU. Run by hand:
 *   build/tests/bench/plan_program [--nodes] [--source] DUMP/compiled1_forward_0.json ...
 * --nodes lists each step's nodes (name and op) under it, --source its
 * generated CUDA C. */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <cjson/cJSON.h>
#include "daemon/program/plan.h"
#include "proto/program.h"
#include "tests/lib/program_check.h"

static const char *message_of(const struct rp_error *err)
{
	const char *m = err->params ? cJSON_GetStringValue(cJSON_GetObjectItem(err->params, "message")) : NULL;

	return m ? m : err->name ? err->name : "?";
}

static int show(const char *path, bool nodes, bool source)
{
	struct rp_error err = { 0 };
	struct rp_program p;
	struct rd_prog_plan plan;
	struct tl_prog_case c;
	int r = tl_prog_case_read(&c, path);
	cJSON *params = r ? NULL : cJSON_Parse(c.json);
	int library = 0, kinds[4] = { 0 };

	if (!r)
		tl_prog_case_free(&c);
	if (!params) {
		fprintf(stderr, "%s: %s\n", path, r ? strerror(-r) : "not readable as JSON");
		return -EINVAL;
	}
	if (rp_program_parse(params, &p, &err) < 0) {
		fprintf(stderr, "%s: refused: %s\n", path, message_of(&err));
		rp_error_clear(&err);
		cJSON_Delete(params);
		return -EINVAL;
	}
	cJSON_Delete(params);
	if (rd_prog_plan_build(&p, &plan, &err) < 0) {
		fprintf(stderr, "%s: no plan: %s\n", path, message_of(&err));
		rp_error_clear(&err);
		rp_program_finish(&p);
		return -EINVAL;
	}
	printf("# program %s (%s): %d steps, %d nodes\n", p.name, path, plan.nsteps, p.nnodes);
	printf("# step kind kernels nodes first_node op\n");
	for (int s = 0; s < plan.nsteps; s++) {
		const struct rd_prog_step *st = &plan.steps[s];
		const struct rp_prog_node *n = &p.nodes[st->first_node];
		bool lib = st->kind == RD_STEP_LIBRARY;

		library += lib;
		kinds[st->kind]++;
		printf("%d %s %d %d %s %s\n", s, rd_prog_step_kind_name(st->kind), lib ? 1 : st->nkernels, st->nnodes,
		       n->name, lib ? n->compute.spec->method : n->op->name);
		for (int k = 0; nodes && k < st->nnodes; k++)
			printf("    %d %s %s\n", st->nodes[k], p.nodes[st->nodes[k]].name, p.nodes[st->nodes[k]].op->name);
		if (source && st->source)
			printf("%s\n", st->source);
	}
	printf("# total: %d steps (%d library, %d fused, %d reduction, %d gather), %llu generated kernels, "
	       "%llu launches\n",
	       plan.nsteps, kinds[RD_STEP_LIBRARY], kinds[RD_STEP_FUSED], kinds[RD_STEP_REDUCTION], kinds[RD_STEP_GATHER],
	       (unsigned long long)plan.fused_kernels, (unsigned long long)plan.fused_kernels + (unsigned long long)library);
	rd_prog_plan_finish(&plan);
	rp_program_finish(&p);
	return 0;
}

int main(int argc, char **argv)
{
	bool nodes = false, source = false;
	int failed = 0, files = 0;

	for (int i = 1; i < argc; i++) {
		if (strcmp(argv[i], "--nodes") == 0 || strcmp(argv[i], "--source") == 0) {
			nodes |= argv[i][2] == 'n';
			source |= argv[i][2] == 's';
			continue;
		}
		files++;
		failed |= show(argv[i], nodes, source) < 0;
	}
	if (!files) {
		fprintf(stderr, "usage: %s [--nodes] [--source] PROGRAM.json ...\n", argv[0]);
		return 2;
	}
	return failed;
}
