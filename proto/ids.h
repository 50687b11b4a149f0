/* SPDX-License-Identifier: Apache-2.0 */
/* Object ids on the wire: "<kind><device>.<generation>.<serial>", e.g.
 * "b0.3.17" is buffer 17 of device 0 made in generation 3 (kinds: b buffer,
 * e event, c communicator). The generation
 * in the id is what lets a worker answer io.regen.StaleGeneration. */
#pragma once

#include <stdbool.h>
#include <stdint.h>

#define RP_ID_MAX 64

/* A program's id ("p0.0.4") carries generation 0: its definition outlives
 * generations, so no generation makes it stale. */
enum rp_id_kind { RP_ID_BUFFER = 'b', RP_ID_EVENT = 'e', RP_ID_COMM = 'c', RP_ID_PROGRAM = 'p' };

struct rp_id {
	char kind;             /* enum rp_id_kind */
	uint32_t device;
	uint64_t generation;
	uint64_t serial;
};

/* Strict: no spaces, no signs, no leading zeros, no trailing text. 0 or -EINVAL. */
int rp_id_parse(const char *text, struct rp_id *id);
/* Writes the text form into buf (RP_ID_MAX bytes). Returns buf. */
char *rp_id_format(const struct rp_id *id, char buf[RP_ID_MAX]);
