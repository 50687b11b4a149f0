/* SPDX-License-Identifier: Apache-2.0 */
/* Whose a unique id is (daemon/comm_owners.c): an id is the uid's it was
 * made for, or the uid's that first joined with it; a uid keeps its last
 * RD_COMM_OWNERS_PER_UID; with the table full, a new id pushes out the
 * oldest id of the uid that has most, so that uids asking for many ids
 * cannot push out another's few. */
#include <check.h>
#include <errno.h>
#include <string.h>
#include "daemon/comm_owners.h"
#include "unit.h"

/* An id told apart by (uid, n). */
static void id_of(unsigned uid, unsigned n, unsigned char id[RP_COMM_ID_SIZE])
{
	memset(id, 0, RP_COMM_ID_SIZE);
	memcpy(id, &uid, sizeof(uid));
	memcpy(id + sizeof(uid), &n, sizeof(n));
	id[RP_COMM_ID_SIZE - 1] = 0x5a;
}

static bool known(const struct rd_comm_owners *t, unsigned uid, unsigned n)
{
	unsigned char id[RP_COMM_ID_SIZE];
	uid_t owner = (uid_t)-1;

	id_of(uid, n, id);
	if (rd_comm_owners_find(t, id, &owner) < 0)
		return false;
	ck_assert_uint_eq(owner, uid);
	return true;
}

static struct rd_comm_owners table;

START_TEST(an_id_is_the_uid_s_it_was_made_for)
{
	unsigned char id[RP_COMM_ID_SIZE];
	uid_t owner;

	memset(&table, 0, sizeof(table));
	id_of(1000, 1, id);
	ck_assert_int_eq(rd_comm_owners_find(&table, id, &owner), -ENOENT);
	rd_comm_owners_made(&table, 1000, id);
	ck_assert(known(&table, 1000, 1));
	id_of(1001, 1, id);
	ck_assert_int_eq(rd_comm_owners_find(&table, id, &owner), -ENOENT);
}
END_TEST

START_TEST(a_uid_keeps_its_last_ids)
{
	unsigned char id[RP_COMM_ID_SIZE];

	memset(&table, 0, sizeof(table));
	for (unsigned n = 0; n < RD_COMM_OWNERS_PER_UID + 5; n++) {
		id_of(1000, n, id);
		rd_comm_owners_made(&table, 1000, id);
	}
	for (unsigned n = 0; n < RD_COMM_OWNERS_PER_UID + 5; n++)
		ck_assert_msg(known(&table, 1000, n) == (n >= 5), "id %u", n);
}
END_TEST

START_TEST(uids_that_ask_most_cannot_push_out_another_s_few)
{
	const unsigned many = RD_COMM_OWNERS_MAX / RD_COMM_OWNERS_PER_UID + 4;
	unsigned char id[RP_COMM_ID_SIZE];

	memset(&table, 0, sizeof(table));
	/* The victim's two, made first (the oldest of all). */
	for (unsigned n = 0; n < 2; n++) {
		id_of(42, n, id);
		rd_comm_owners_made(&table, 42, id);
	}
	/* More uids than the table holds, each asking for all it may, twice
	 * over. */
	for (unsigned round = 0; round < 2; round++)
		for (unsigned u = 0; u < many; u++)
			for (unsigned n = 0; n < RD_COMM_OWNERS_PER_UID; n++) {
				id_of(2000 + u, round * 100 + n, id);
				rd_comm_owners_made(&table, 2000 + u, id);
			}
	ck_assert(known(&table, 42, 0) && known(&table, 42, 1));
	/* The last one made is there. */
	ck_assert(known(&table, 2000 + many - 1, 100 + RD_COMM_OWNERS_PER_UID - 1));
}
END_TEST

START_TEST(the_first_to_join_holds_an_id_made_elsewhere)
{
	unsigned char id[RP_COMM_ID_SIZE];

	memset(&table, 0, sizeof(table));
	/* Made by a worker for 1000: whoever joins next, it stays 1000's. */
	id_of(1000, 1, id);
	rd_comm_owners_made(&table, 1000, id);
	ck_assert_uint_eq(rd_comm_owners_claim(&table, 1001, id), 1000);
	ck_assert_uint_eq(rd_comm_owners_claim(&table, 1000, id), 1000);
	/* Made elsewhere: the first to join holds it, for everyone after. */
	id_of(7, 7, id);
	ck_assert_uint_eq(rd_comm_owners_claim(&table, 1001, id), 1001);
	ck_assert_uint_eq(rd_comm_owners_claim(&table, 1000, id), 1001);
	ck_assert(known(&table, 1000, 1));
	/* A join counts against the joiner's ids like a making does. */
	for (unsigned n = 0; n < RD_COMM_OWNERS_PER_UID; n++) {
		id_of(1001, 100 + n, id);
		ck_assert_uint_eq(rd_comm_owners_claim(&table, 1001, id), 1001);
	}
	ck_assert(known(&table, 1000, 1));
	id_of(7, 7, id);
	ck_assert_int_eq(rd_comm_owners_find(&table, id, &(uid_t){ 0 }), -ENOENT);
}
END_TEST

int main(void)
{
	Suite *s = suite_create("comm_owners");
	TCase *tc = tcase_create("comm_owners");

	tcase_add_test(tc, an_id_is_the_uid_s_it_was_made_for);
	tcase_add_test(tc, a_uid_keeps_its_last_ids);
	tcase_add_test(tc, uids_that_ask_most_cannot_push_out_another_s_few);
	tcase_add_test(tc, the_first_to_join_holds_an_id_made_elsewhere);
	suite_add_tcase(s, tc);
	return unit_run(s);
}
