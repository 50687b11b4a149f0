/* SPDX-License-Identifier: Apache-2.0 */
/* A hang charged to the uid that caused it, so that it cannot be repeated
 * at will.
 *
 * A compute call still running at regend's call_deadline_ms makes its
 * device hung: the worker is replaced, and every user of the device loses
 * its ids, calls in flight and communicators. No backend can tell for sure
 * beforehand that a call will not finish (the host backend's estimate of a
 * call's work is what let such a call through), so the uid whose call it
 * was pays: each hang is a strike, and for a cool-down of hang_cooldown_ms
 * times 2^(strikes - 1) (at most 64 times) that uid's compute calls, ring
 * records and program runs are refused on every device of the node with
 * io.regen.LimitExceeded {resource: "hang cool-down", limit: the cool-down
 * in ms}, before they reach a lane. A hang that comes once a quiet time as
 * long as the last cool-down has passed after it counts as strike 1 again.
 * Communicators' calls are never refused (theirs end at their deadline
 * with the communicator, not the device), and a hang that fault injection
 * caused is nobody's.
 *
 * The supervisor keeps the table (it outlives the worker a hang took);
 * each worker holds a copy, from its command line when it starts
 * (--charged, the newest that fit) and from io.regen.Worker.Charged
 * whenever the table changes. As text, "uid:ms_left:cooldown_ms:strikes"
 * entries joined by commas, newest first. */
#pragma once

#include <stddef.h>
#include <stdint.h>
#include <sys/types.h>

#define RD_HANG_CHARGES_MAX 256
/* The cool-down doubles up to 2^(RD_HANG_STRIKES_MAX - 1) times the first. */
#define RD_HANG_STRIKES_MAX 7
/* The longest text of one charge, its comma included. */
#define RD_HANG_CHARGE_TEXT_MAX 48

struct rd_hang_charge {
	uid_t uid;
	unsigned strikes;
	uint64_t cooldown_ms;           /* this strike's cool-down */
	uint64_t until_ns;              /* uv_hrtime() when it ends */
	uint64_t serial;                /* the order charges were made in: newest first as text */
};

struct rd_hang_charges {
	struct rd_hang_charge e[RD_HANG_CHARGES_MAX];
	unsigned n;
	uint64_t next_serial;
};

/* A hang of uid's call at now_ns: one more strike, and its cool-down from
 * now. cooldown_ms 0: nothing is charged (NULL). Full: the charge that
 * ended first goes. */
const struct rd_hang_charge *rd_hang_charge(struct rd_hang_charges *t, uid_t uid, unsigned cooldown_ms,
					    uint64_t now_ns);
/* uid's charge while it cools down at now_ns, else NULL. */
const struct rd_hang_charge *rd_hang_charges_find(const struct rd_hang_charges *t, uid_t uid, uint64_t now_ns);
/* The charges still cooling down at now_ns as text, newest first, as many
 * whole entries as fit in size (always NUL-terminated). Returns how many. */
unsigned rd_hang_charges_format(const struct rd_hang_charges *t, uint64_t now_ns, char *buf, size_t size);
/* Replaces the table by the text's charges, their ends counted from
 * now_ns. -EINVAL (and the table empty) on text that is not the format. */
int rd_hang_charges_parse(struct rd_hang_charges *t, const char *text, uint64_t now_ns);
