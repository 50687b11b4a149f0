/* SPDX-License-Identifier: Apache-2.0 */
#include <errno.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "daemon/hang_charge.h"

#define NS_PER_MS 1000000u

static struct rd_hang_charge *find(struct rd_hang_charges *t, uid_t uid)
{
	for (unsigned i = 0; i < t->n; i++)
		if (t->e[i].uid == uid)
			return &t->e[i];
	return NULL;
}

/* A slot for a new uid: a free one, else the charge that ended first. */
static struct rd_hang_charge *slot(struct rd_hang_charges *t)
{
	struct rd_hang_charge *first = NULL;

	if (t->n < RD_HANG_CHARGES_MAX)
		return &t->e[t->n++];
	for (unsigned i = 0; i < t->n; i++)
		if (!first || t->e[i].until_ns < first->until_ns)
			first = &t->e[i];
	return first;
}

const struct rd_hang_charge *rd_hang_charge(struct rd_hang_charges *t, uid_t uid, unsigned cooldown_ms,
					    uint64_t now_ns)
{
	struct rd_hang_charge *c = find(t, uid);

	if (cooldown_ms == 0)
		return NULL;
	/* Strikes are forgotten after a quiet time as long as the last
	 * cool-down. */
	if (c && now_ns >= c->until_ns + c->cooldown_ms * NS_PER_MS)
		c->strikes = 0;
	if (!c) {
		c = slot(t);
		memset(c, 0, sizeof(*c));
		c->uid = uid;
	}
	if (c->strikes < RD_HANG_STRIKES_MAX)
		c->strikes++;
	c->cooldown_ms = (uint64_t)cooldown_ms << (c->strikes - 1);
	c->until_ns = now_ns + c->cooldown_ms * NS_PER_MS;
	c->serial = ++t->next_serial;
	return c;
}

const struct rd_hang_charge *rd_hang_charges_find(const struct rd_hang_charges *t, uid_t uid, uint64_t now_ns)
{
	for (unsigned i = 0; i < t->n; i++)
		if (t->e[i].uid == uid && now_ns < t->e[i].until_ns)
			return &t->e[i];
	return NULL;
}

static int newest_first(const void *a, const void *b)
{
	const struct rd_hang_charge *x = *(const struct rd_hang_charge *const *)a;
	const struct rd_hang_charge *y = *(const struct rd_hang_charge *const *)b;

	return x->serial < y->serial ? 1 : x->serial > y->serial ? -1 : 0;
}

unsigned rd_hang_charges_format(const struct rd_hang_charges *t, uint64_t now_ns, char *buf, size_t size)
{
	const struct rd_hang_charge *cooling[RD_HANG_CHARGES_MAX];
	unsigned n = 0, written = 0;
	size_t used = 0;

	buf[0] = '\0';
	for (unsigned i = 0; i < t->n; i++)
		if (now_ns < t->e[i].until_ns)
			cooling[n++] = &t->e[i];
	qsort(cooling, n, sizeof(cooling[0]), newest_first);
	for (unsigned i = 0; i < n; i++) {
		const struct rd_hang_charge *c = cooling[i];
		int len = snprintf(buf + used, size - used, "%s%u:%" PRIu64 ":%" PRIu64 ":%u", written ? "," : "",
				   (unsigned)c->uid, (c->until_ns - now_ns + NS_PER_MS - 1) / NS_PER_MS, c->cooldown_ms,
				   c->strikes);

		if (len < 0 || (size_t)len >= size - used) {
			buf[used] = '\0';
			break;
		}
		used += (size_t)len;
		written++;
	}
	return written;
}

int rd_hang_charges_parse(struct rd_hang_charges *t, const char *text, uint64_t now_ns)
{
	const char *p = text;

	memset(t, 0, sizeof(*t));
	while (p && *p) {
		unsigned long long uid, left, cooldown, strikes;
		struct rd_hang_charge *c;
		int used = 0;

		if (sscanf(p, "%llu:%llu:%llu:%llu%n", &uid, &left, &cooldown, &strikes, &used) != 4 || used == 0 ||
		    uid > UINT32_MAX || left > UINT32_MAX || cooldown > UINT64_MAX / NS_PER_MS || strikes == 0 ||
		    strikes > RD_HANG_STRIKES_MAX || (p[used] != ',' && p[used] != '\0') || t->n == RD_HANG_CHARGES_MAX) {
			memset(t, 0, sizeof(*t));
			return -EINVAL;
		}
		c = &t->e[t->n++];
		c->uid = (uid_t)uid;
		c->strikes = (unsigned)strikes;
		c->cooldown_ms = cooldown;
		c->until_ns = now_ns + left * NS_PER_MS;
		/* Newest first in the text: the first gets the highest serial. */
		c->serial = UINT32_MAX - t->n;
		p += used + (p[used] == ',');
	}
	t->next_serial = UINT32_MAX;
	return 0;
}
