/* SPDX-License-Identifier: Apache-2.0 */
/* Object ids on the wire: "<kind><device>.<generation>.<serial>". */
#include <errno.h>
#include <inttypes.h>
#include <stdio.h>

#include "ids.h"

/* One decimal number: digits only, no leading zero unless it is "0", no
 * overflow past max. Advances *p past it. */
static int parse_number(const char **p, uint64_t max, uint64_t *out)
{
	const char *s = *p;
	uint64_t v = 0;

	if (*s < '0' || *s > '9')
		return -EINVAL;
	if (*s == '0' && s[1] >= '0' && s[1] <= '9')
		return -EINVAL;
	for (; *s >= '0' && *s <= '9'; s++) {
		if (__builtin_mul_overflow(v, 10, &v) || __builtin_add_overflow(v, (uint64_t)(*s - '0'), &v))
			return -EINVAL;
	}
	if (v > max)
		return -EINVAL;
	*p = s;
	*out = v;
	return 0;
}

int rp_id_parse(const char *text, struct rp_id *id)
{
	const char *p = text;
	uint64_t device, generation, serial;

	if (text == NULL || (*p != RP_ID_BUFFER && *p != RP_ID_EVENT && *p != RP_ID_COMM && *p != RP_ID_PROGRAM))
		return -EINVAL;
	p++;
	if (parse_number(&p, UINT32_MAX, &device) < 0 || *p++ != '.')
		return -EINVAL;
	if (parse_number(&p, UINT64_MAX, &generation) < 0 || *p++ != '.')
		return -EINVAL;
	if (parse_number(&p, UINT64_MAX, &serial) < 0 || *p != '\0')
		return -EINVAL;
	/* Generations start at 1: 0 is never a generation anything was made
	 * in, except a program, whose definition outlives generations and
	 * whose id always says 0 (ids.h). */
	if ((generation == 0) != (text[0] == RP_ID_PROGRAM))
		return -EINVAL;
	id->kind = text[0];
	id->device = (uint32_t)device;
	id->generation = generation;
	id->serial = serial;
	return 0;
}

char *rp_id_format(const struct rp_id *id, char buf[RP_ID_MAX])
{
	snprintf(buf, RP_ID_MAX, "%c%" PRIu32 ".%" PRIu64 ".%" PRIu64, id->kind, id->device, id->generation,
		 id->serial);
	return buf;
}
