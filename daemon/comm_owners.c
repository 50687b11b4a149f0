/* SPDX-License-Identifier: Apache-2.0 */
#include <errno.h>
#include <string.h>
#include "daemon/comm_owners.h"

/* How many ids uid has, and its oldest. */
static unsigned count_of(const struct rd_comm_owners *t, uid_t uid, int *oldest)
{
	unsigned n = 0;

	*oldest = -1;
	for (int i = 0; i < RD_COMM_OWNERS_MAX; i++) {
		if (!t->ids[i].serial || t->ids[i].uid != uid)
			continue;
		n++;
		if (*oldest < 0 || t->ids[i].serial < t->ids[*oldest].serial)
			*oldest = i;
	}
	return n;
}

/* The slot a new id of uid takes. */
static int slot_for(const struct rd_comm_owners *t, uid_t uid)
{
	unsigned most = 0;
	int oldest, victim = -1;

	if (count_of(t, uid, &oldest) >= RD_COMM_OWNERS_PER_UID)
		return oldest;
	for (int i = 0; i < RD_COMM_OWNERS_MAX; i++)
		if (!t->ids[i].serial)
			return i;
	/* Full: the oldest of the uid that has most (the first such uid met
	 * when several have as many). */
	for (int i = 0; i < RD_COMM_OWNERS_MAX; i++) {
		unsigned n = count_of(t, t->ids[i].uid, &oldest);

		if (n > most) {
			most = n;
			victim = oldest;
		}
	}
	return victim;
}

void rd_comm_owners_made(struct rd_comm_owners *t, uid_t uid, const unsigned char id[RP_COMM_ID_SIZE])
{
	int i = slot_for(t, uid);

	t->ids[i].serial = ++t->next_serial;
	t->ids[i].uid = uid;
	memcpy(t->ids[i].id, id, RP_COMM_ID_SIZE);
}

int rd_comm_owners_find(const struct rd_comm_owners *t, const unsigned char id[RP_COMM_ID_SIZE], uid_t *uid)
{
	for (int i = 0; i < RD_COMM_OWNERS_MAX; i++) {
		if (t->ids[i].serial && memcmp(t->ids[i].id, id, RP_COMM_ID_SIZE) == 0) {
			*uid = t->ids[i].uid;
			return 0;
		}
	}
	return -ENOENT;
}

uid_t rd_comm_owners_claim(struct rd_comm_owners *t, uid_t uid, const unsigned char id[RP_COMM_ID_SIZE])
{
	uid_t owner;

	if (rd_comm_owners_find(t, id, &owner) == 0)
		return owner;
	rd_comm_owners_made(t, uid, id);
	return uid;
}
