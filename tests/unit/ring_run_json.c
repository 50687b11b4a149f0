/* Prints a program Run's ring records as proto/ring.h lays them out
 * (rp_ring_encode_run), with the layout's sizes, for clients written in
 * other languages to be held to (client/python/tests/test_units.py
 * compares regen/ring.py's records with these, byte for byte). The Run:
 * 130 bindings (position i, buffer index i % 3, offset 64 i) and 3 scalars
 * (positions 130 .. 132, values 0.5, -2.25 and 1e300), program index 7,
 * wait_event 5, no signal_event, deadline_ms 250, journal index 4 at 4096,
 * seq 17, retry; tag 1000, its record at number 4294967294. */
#include <stdio.h>
#include <stdlib.h>
#include <cjson/cJSON.h>
#include "proto/ring.h"

#define NBIND 130
#define NSCALARS 3

int main(void)
{
	static struct rp_ring_binding bind[NBIND];
	static const double values[NSCALARS] = { 0.5, -2.25, 1e300 };
	struct rp_ring_scalar scalars[NSCALARS];
	struct rp_ring_run_call call = {
		.program = 7, .wait_event = 5, .signal_event = RP_RING_NONE, .journal = 4, .deadline_ms = 250,
		.journal_offset = 4096, .seq = 17, .retry = true, .bind = bind, .nbind = NBIND, .scalars = scalars,
		.nscalars = NSCALARS,
	};
	cJSON *all = cJSON_CreateObject(), *records = cJSON_AddArrayToObject(all, "records");
	unsigned n = RP_RING_RUN_RECORDS(NBIND + NSCALARS);
	char *text;

	for (unsigned i = 0; i < NBIND; i++)
		bind[i] = (struct rp_ring_binding){ .bound = i, .buffer = i % 3, .offset = 64u * i };
	for (unsigned i = 0; i < NSCALARS; i++)
		scalars[i] = (struct rp_ring_scalar){ .bound = NBIND + i, .value = values[i] };
	cJSON_AddNumberToObject(all, "version", RP_RING_VERSION);
	cJSON_AddNumberToObject(all, "record_size", RP_RING_RECORD_SIZE);
	cJSON_AddNumberToObject(all, "run_entries", (double)RP_RING_RUN_ENTRIES);
	cJSON_AddNumberToObject(all, "continuation_entries", (double)RP_RING_CONTINUATION_ENTRIES);
	cJSON_AddNumberToObject(all, "continuations_max", RP_RING_RUN_CONTINUATIONS_MAX);
	cJSON_AddNumberToObject(all, "op_program", RP_OP_PROGRAM);
	cJSON_AddNumberToObject(all, "op_continuation", RP_RING_CONTINUATION);
	cJSON_AddNumberToObject(all, "error_max", RP_RING_ERROR_MAX);
	cJSON_AddNumberToObject(all, "completion_head", (double)offsetof(struct rp_ring_completion, head));
	cJSON_AddNumberToObject(all, "completion_timing", (double)offsetof(struct rp_ring_completion, timing));
	for (unsigned part = 0; part < n; part++) {
		union rp_ring_slot rec;
		char hex[2 * RP_RING_RECORD_SIZE + 1];

		rp_ring_encode_run(&call, 1000, 4294967294u, part, &rec);
		for (unsigned b = 0; b < RP_RING_RECORD_SIZE; b++)
			snprintf(hex + 2 * b, 3, "%02x", rec.bytes[b]);
		cJSON_AddItemToArray(records, cJSON_CreateString(hex));
	}
	text = cJSON_Print(all);
	puts(text);
	free(text);
	cJSON_Delete(all);
	return 0;
}
