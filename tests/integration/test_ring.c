/* SPDX-License-Identifier: Apache-2.0 */
/* io.regen.Lane, the ring beside a lane's connection: libregen picks it
 * where the worker offers it; a call gets the same answer over the ring as
 * over Varlink, errors named alike with the same parameters; queued calls
 * complete in order; after a restart, records fail with StaleGeneration
 * until the buffers are imported and bound again. A hostile client that
 * drives the ring by hand (a raw connection, its own memfd) gets named
 * refusals for bad setups, named errors in completions for bad records,
 * and a closed connection for counters that make no sense; the worker
 * serves on throughout. */
#include <errno.h>
#include <fcntl.h>
#include <math.h>
#include <poll.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <unistd.h>
#include <cjson/cJSON.h>
#include "proto/ring.h"
#include "tests/lib/client.h"
#include "tests/lib/dtype.h"
#include "tests/lib/reference.h"
#include "tests/lib/varlink.h"

static struct tl_daemon daemon_;

/* ---- libregen on both transports ---- */

/* The named error of the last call and its parameters, as one string. */
static void last_error(regen_client *c, char *out, size_t size)
{
	snprintf(out, size, "%s %s", regen_client_error_name(c) ? regen_client_error_name(c) : "(none)",
		 regen_client_error_parameters(c) ? regen_client_error_parameters(c) : "");
}

/* Replaces every `from` in s by the shorter or equal `to`. */
static void replace_all(char *s, const char *from, const char *to)
{
	size_t lf = strlen(from), lt = strlen(to);
	char *p;

	while ((p = strstr(s, from)) != NULL) {
		memcpy(p, to, lt);
		memmove(p + lt, p + lf, strlen(p + lf) + 1);
	}
}

static void tensor2(struct regen_tensor *t, regen_buffer *b, uint64_t offset, int64_t rows, int64_t cols)
{
	memset(t, 0, sizeof(*t));
	t->buffer = b;
	t->offset = offset;
	t->dtype = REGEN_F32;
	t->rank = 2;
	t->shape[0] = rows;
	t->shape[1] = cols;
}

/* Calls that must be refused, each with what makes it wrong. */
static int bad_gemm(int which, regen_buffer *b, struct regen_gemm_args *g)
{
	memset(g, 0, sizeof(*g));
	tensor2(&g->a, b, 0, 8, 8);
	tensor2(&g->b, b, 256, 8, 8);
	tensor2(&g->d, b, 512, 8, 8);
	switch (which) {
	case 0:   /* D past the end of the buffer */
		g->d.offset = (1 << 16) - 64;
		return 1;
	case 1:   /* K disagrees */
		g->b.shape[0] = 7;
		return 1;
	case 2:   /* beta without C */
		g->beta = 0.5;
		return 1;
	case 3:   /* D overlaps A */
		g->d.offset = 128;
		return 1;
	case 4:   /* a bias epilogue without a bias */
		g->epilogue = REGEN_EPILOGUE_BIAS;
		return 1;
	case 5:   /* misaligned */
		g->a.offset = 2;
		return 1;
	case 6:   /* a stride of 0 in the output */
		g->d.strides[0] = 0;
		g->d.strides[1] = 1;
		return 1;
	}
	return 0;
}

static void same_answers_on_both_transports(void)
{
	regen_client *cv = tl_client_connect(&daemon_), *cr = tl_client_connect(&daemon_);
	struct tl_buffer bv, br;
	struct regen_gemm_args g;
	char ev[1024], er[1024];

	ASSERT_REGEN_OK(cv, regen_client_set_transport(cv, REGEN_TRANSPORT_VARLINK));
	ASSERT_REGEN_OK(cr, regen_client_set_transport(cr, REGEN_TRANSPORT_RING));
	tl_buffer_create(cv, 0, 1 << 16, &bv);
	tl_buffer_create(cr, 0, 1 << 16, &br);
	ASSERT_GEMM_OK(cv, &bv, "a GEMM over Varlink");
	ASSERT_GEMM_OK(cr, &br, "a GEMM over the ring");
	ASSERT_EQ(regen_client_transport(cv, 0), REGEN_TRANSPORT_VARLINK, "the Varlink client's lane");
	ASSERT_EQ(regen_client_transport(cr, 0), REGEN_TRANSPORT_RING, "the ring client's lane");
	for (int i = 0; bad_gemm(i, bv.buf, &g); i++) {
		int rv = regen_gemm(cv, &g), rr;

		last_error(cv, ev, sizeof(ev));
		bad_gemm(i, br.buf, &g);
		rr = regen_gemm(cr, &g);
		last_error(cr, er, sizeof(er));
		ASSERT_EQ(rv, -EREMOTE, "bad GEMM %d over Varlink: %s", i, ev);
		ASSERT_EQ(rr, rv, "bad GEMM %d over the ring: %s (Varlink: %s)", i, er, ev);
		/* Buffer ids differ between the two clients; nothing else may. */
		replace_all(ev, regen_buffer_id(bv.buf), "BUF");
		replace_all(er, regen_buffer_id(br.buf), "BUF");
		ASSERT_STR_EQ(er, ev, "bad GEMM %d: the ring's error differs from Varlink's", i);
	}
	/* A closed buffer: NoSuchObject, both ways (the ring resolves its
	 * index for every record). */
	regen_buffer *gone_v = bv.buf, *gone_r = br.buf;
	struct tl_buffer ov, orr;
	tl_buffer_create(cv, 0, 1 << 16, &ov);
	tl_buffer_create(cr, 0, 1 << 16, &orr);
	ASSERT_GEMM_OK(cr, &orr, "a GEMM on a second buffer over the ring");
	bad_gemm(-1, gone_r, &g);
	tensor2(&g.a, gone_r, 0, 8, 8);
	tensor2(&g.b, orr.buf, 0, 8, 8);
	tensor2(&g.d, orr.buf, 512, 8, 8);
	ASSERT_REGEN_OK(cr, regen_gemm(cr, &g), "both buffers open");
	(void)gone_v;
	tl_buffer_free(&bv);
	tl_buffer_free(&ov);
	tl_buffer_free(&br);
	tl_buffer_free(&orr);
	regen_client_destroy(cv);
	regen_client_destroy(cr);
}

/* The lane's id table full (256 indexes): a call whose first operand is
 * bound at the index the client takes back next, and whose second is not
 * bound yet. The second's index must not be taken from the first: the
 * record would name the second buffer twice, and D = B @ B would come back
 * where A @ B was asked, with no error. */
#define ID_TABLE 256
static void a_full_id_table_keeps_a_records_own_indexes(void)
{
	regen_client *c = tl_client_connect(&daemon_);
	static struct tl_buffer t[ID_TABLE + 2];
	struct regen_gemm_args g;
	double a[4], b[4];

	ASSERT_REGEN_OK(c, regen_client_set_transport(c, REGEN_TRANSPORT_RING));
	for (int i = 0; i < ID_TABLE + 2; i++)
		tl_buffer_create(c, 0, 4096, &t[i]);
	/* Binds t[0] .. t[255] to indexes 0 .. 255, in order: call i reads
	 * t[i] (bound by call i - 1) and writes t[i + 1]. */
	for (int i = 0; i < ID_TABLE - 1; i++) {
		memset(&g, 0, sizeof(g));
		tensor2(&g.a, t[i].buf, 0, 2, 2);
		tensor2(&g.b, t[i].buf, 0, 2, 2);
		tensor2(&g.d, t[i + 1].buf, 0, 2, 2);
		ASSERT_REGEN_OK(c, regen_gemm(c, &g), "filling the id table, call %d", i);
	}
	ASSERT_EQ(regen_client_transport(c, 0), REGEN_TRANSPORT_RING, "the lane is on the ring");
	tl_fill_random(NULL, RP_DTYPE_F32, t[0].mem.ptr, 4, -1, 1, a);
	tl_fill_random(NULL, RP_DTYPE_F32, t[ID_TABLE].mem.ptr, 4, 1, 2, b);
	tl_poison(RP_DTYPE_F32, t[ID_TABLE + 1].mem.ptr, 4);
	memset(&g, 0, sizeof(g));
	tensor2(&g.a, t[0].buf, 0, 2, 2);
	tensor2(&g.b, t[ID_TABLE].buf, 0, 2, 2);
	tensor2(&g.d, t[ID_TABLE + 1].buf, 0, 2, 2);
	ASSERT_REGEN_OK(c, regen_gemm(c, &g), "A bound at the next index to take back, B and D not bound");
	const float *d = (const float *)t[ID_TABLE + 1].mem.ptr;
	for (int i = 0; i < 2; i++) {
		for (int j = 0; j < 2; j++) {
			double want = a[2 * i] * b[j] + a[2 * i + 1] * b[2 + j];
			ASSERT(fabs(d[2 * i + j] - want) <= 1e-5 * (1 + fabs(want)),
			       "D[%d][%d] = %g, A @ B is %g: the record named another buffer than A", i, j,
			       d[2 * i + j], want);
		}
	}
	for (int i = 0; i < ID_TABLE + 2; i++)
		tl_buffer_free(&t[i]);
	regen_client_destroy(c);
}

/* A call queued without waiting fails (D past the end of its buffer); 255
 * more fill the lane's id table; the next call names a buffer not bound yet.
 * Taking an index back waits for the queued calls, but their error is
 * theirs: the new call is queued, and regen_wait on the bad call's ticket
 * names its InvalidOperand (the client's wait had taken the error, failed
 * the good call with it and left regen_wait nothing to say). */
static void a_full_table_keeps_a_queued_error_for_the_wait(void)
{
	regen_client *c = tl_client_connect(&daemon_);
	static struct tl_buffer t[ID_TABLE + 1];
	struct regen_gemm_args g;
	uint64_t bad_ticket = 0, ticket = 0;

	ASSERT_REGEN_OK(c, regen_client_set_transport(c, REGEN_TRANSPORT_RING));
	for (int i = 0; i < ID_TABLE + 1; i++)
		tl_buffer_create(c, 0, 4096, &t[i]);
	memset(&g, 0, sizeof(g));
	tensor2(&g.a, t[0].buf, 0, 2, 2);
	tensor2(&g.b, t[0].buf, 0, 2, 2);
	tensor2(&g.d, t[0].buf, 4096 - 8, 2, 2);   /* past the end: InvalidOperand */
	ASSERT_REGEN_OK(c, regen_gemm_submit(c, &g, &bad_ticket), "the bad call is queued");
	for (int i = 1; i < ID_TABLE; i++) {
		memset(&g, 0, sizeof(g));
		tensor2(&g.a, t[i].buf, 0, 2, 2);
		tensor2(&g.b, t[i].buf, 0, 2, 2);
		tensor2(&g.d, t[i].buf, 64, 2, 2);
		ASSERT_REGEN_OK(c, regen_gemm_submit(c, &g, &ticket), "filling the id table, call %d", i);
	}
	ASSERT_EQ(regen_client_transport(c, 0), REGEN_TRANSPORT_RING, "the lane is on the ring");
	memset(&g, 0, sizeof(g));
	tensor2(&g.a, t[ID_TABLE].buf, 0, 2, 2);
	tensor2(&g.b, t[ID_TABLE].buf, 0, 2, 2);
	tensor2(&g.d, t[ID_TABLE].buf, 64, 2, 2);
	ASSERT_REGEN_OK(c, regen_gemm_submit(c, &g, &ticket), "a good call after the table filled");
	ASSERT_REGEN_ERROR(c, regen_wait(c, 0, bad_ticket), REGEN_ERROR_INVALID_OPERAND,
			   "regen_wait on the bad call's ticket");
	ASSERT_REGEN_OK(c, regen_wait(c, 0, ticket), "the good call");
	for (int i = 0; i < ID_TABLE + 1; i++)
		tl_buffer_free(&t[i]);
	regen_client_destroy(c);
}

/* A call queued on the ring behind an injected hang, then the worker
 * crashes and is respawned: the client's next call to that worker (an
 * import) says the calls in flight broke with the connection, as it does on
 * Varlink, where the lane had been reset without a word. */
static void a_crash_with_a_ring_call_in_flight_is_told(void)
{
	regen_client *c = tl_client_connect(&daemon_);
	struct tl_buffer b, b2;
	struct regen_gemm_args g;
	uint64_t gen, lost = 0;
	regen_status *st;

	ASSERT_REGEN_OK(c, regen_client_set_transport(c, REGEN_TRANSPORT_RING));
	tl_buffer_create(c, 1, 1 << 16, &b);
	memset(&g, 0, sizeof(g));
	tensor2(&g.a, b.buf, 0, 4, 4);
	tensor2(&g.b, b.buf, 256, 4, 4);
	tensor2(&g.d, b.buf, 512, 4, 4);
	ASSERT_REGEN_OK(c, regen_gemm(c, &g), "before the crash");
	ASSERT_EQ(regen_client_transport(c, 1), REGEN_TRANSPORT_RING, "the lane is on the ring");
	st = tl_status(c);
	gen = tl_status_device(st, 1)->generation;
	regen_status_free(st);
	ASSERT_REGEN_OK(c, regen_inject_fault(c, 1, "hang"));
	ASSERT_REGEN_OK(c, regen_gemm_submit(c, &g, &lost), "queued behind the hang");
	usleep(200000);
	(void)regen_inject_fault(c, 1, "crash");
	tl_wait_generation(c, 1, gen, 30);
	tl_buffer_alloc(4096, &b2);
	int imported = tl_buffer_import(c, 1, &b2);
	ASSERT_EQ(imported, -ECONNRESET, "the import after the crash: %d (%s)", imported,
		  regen_client_error_message(c) ? regen_client_error_message(c) : "-");
	ASSERT(strstr(regen_client_error_message(c), "calls in flight") != NULL, "the message: %s",
	       regen_client_error_message(c));
	ASSERT_EQ(tl_buffer_import(c, 1, &b2), 0, "the import again, on a fresh connection");
	tl_buffer_free(&b);
	tl_buffer_free(&b2);
	regen_client_destroy(c);
}

/* regen_client_set_transport while the lane has calls queued: they finish
 * on the transport they went on, and the next call after them takes the
 * new one (the lane had kept its transport for good). */
static void a_switch_with_calls_outstanding_applies_after_them(void)
{
	regen_client *c = tl_client_connect(&daemon_);
	struct tl_buffer b;
	struct regen_gemm_args g;
	uint64_t ticket = 0;
	static const enum regen_transport order[] = { REGEN_TRANSPORT_VARLINK, REGEN_TRANSPORT_RING };

	ASSERT_REGEN_OK(c, regen_client_set_transport(c, REGEN_TRANSPORT_RING));
	tl_buffer_create(c, 0, 4096, &b);
	memset(&g, 0, sizeof(g));
	tensor2(&g.a, b.buf, 0, 4, 4);
	tensor2(&g.b, b.buf, 256, 4, 4);
	tensor2(&g.d, b.buf, 512, 4, 4);
	ASSERT_REGEN_OK(c, regen_gemm(c, &g), "first");
	for (int i = 0; i < 2; i++) {
		for (int k = 0; k < 4; k++)
			ASSERT_REGEN_OK(c, regen_gemm_submit(c, &g, &ticket), "queued");
		ASSERT_REGEN_OK(c, regen_client_set_transport(c, order[i]));
		ASSERT_REGEN_OK(c, regen_wait(c, 0, ticket), "the queued calls");
		ASSERT_REGEN_OK(c, regen_gemm(c, &g), "after them");
		ASSERT_EQ(regen_client_transport(c, 0), order[i], "the call after the queued ones, switch %d", i);
	}
	tl_buffer_free(&b);
	regen_client_destroy(c);
}

/* A ring lane whose connection a Varlink call closed (an import that timed
 * out with the worker stopped), its worker then killed: regen_wait on the
 * queued call's ticket says -ECONNRESET at once (it waited out the whole
 * timeout on the closed fd), and after the reconnect the lost ticket is not
 * handed out again: new calls get new tickets, and the lost one still says
 * -ECONNRESET (tickets had started again at 1, and regen_wait on the lost
 * one answered 0 for a GEMM that never ran). */
static void a_lane_closed_under_its_records_tells_of_them(void)
{
	const int dev = 1;
	regen_client *c = tl_client_connect(&daemon_);
	struct tl_buffer m, x;
	struct regen_gemm_args g;
	uint64_t lost, n1, n2, gen;
	regen_status *st;
	pid_t pid;
	int r;

	ASSERT_REGEN_OK(c, regen_client_set_transport(c, REGEN_TRANSPORT_RING));
	tl_buffer_create(c, dev, 4096, &m);
	memset(&g, 0, sizeof(g));
	tensor2(&g.a, m.buf, 0, 8, 8);
	tensor2(&g.b, m.buf, 256, 8, 8);
	tensor2(&g.d, m.buf, 512, 8, 8);
	ASSERT_REGEN_OK(c, regen_gemm(c, &g), "before");
	ASSERT_EQ(regen_client_transport(c, dev), REGEN_TRANSPORT_RING, "the lane is on the ring");
	st = tl_status(c);
	pid = (pid_t)tl_status_device(st, dev)->worker_pid;
	gen = tl_status_device(st, dev)->generation;
	regen_status_free(st);
	ASSERT(kill(pid, SIGSTOP) == 0, "SIGSTOP %d", (int)pid);
	ASSERT_REGEN_OK(c, regen_gemm_submit(c, &g, &lost), "queued on a stopped worker");
	regen_client_set_timeout(c, 1);
	tl_buffer_alloc(4096, &x);
	r = regen_buffer_import_fd(c, dev, x.mem.fd, 4096, &x.buf);
	ASSERT_EQ(r, -ETIMEDOUT, "the import on the stopped worker");
	ASSERT(kill(pid, SIGKILL) == 0, "SIGKILL %d", (int)pid);
	regen_client_set_timeout(c, 8);
	double t0 = tl_now();
	r = regen_wait(c, dev, lost);
	ASSERT_EQ(r, -ECONNRESET, "regen_wait on the lost call: %s", regen_client_error_message(c));
	ASSERT(tl_now() - t0 < 2, "the lost call was told after %.1f s", tl_now() - t0);
	regen_client_set_timeout(c, 30);
	tl_wait_generation(c, dev, gen, 30);
	ASSERT_REGEN_OK(c, tl_buffer_import(c, dev, &m), "import again");
	tensor2(&g.a, m.buf, 0, 8, 8);
	tensor2(&g.b, m.buf, 256, 8, 8);
	tensor2(&g.d, m.buf, 512, 8, 8);
	ASSERT_REGEN_OK(c, regen_gemm_submit(c, &g, &n1), "a new call");
	ASSERT_REGEN_OK(c, regen_gemm_submit(c, &g, &n2), "another");
	ASSERT(n1 > lost && n2 > lost, "new tickets %llu, %llu handed out again below the lost %llu",
	       (unsigned long long)n1, (unsigned long long)n2, (unsigned long long)lost);
	ASSERT_EQ(regen_wait(c, dev, lost), -ECONNRESET, "the lost ticket, after new calls");
	ASSERT_REGEN_OK(c, regen_wait(c, dev, n2), "the new calls");
	tl_buffer_free(&x);
	tl_buffer_free(&m);
	regen_client_destroy(c);
}

/* 2000 GEMMs queued without waiting, in a ring of 256: all complete, in
 * order, and a bad one among them fails alone, named at the wait. */
/* On either transport: 2,000 calls queued without a wait are more than a
 * ring has entries and than regend answers unread on a connection (1,024),
 * so libregen must read the oldest answers as it goes. */
static void queued_calls_complete_in_order(enum regen_transport transport)
{
	regen_client *c = tl_client_connect(&daemon_);
	struct tl_buffer b;
	struct regen_gemm_args g;
	uint64_t t = 0, first = 0;
	float *m;

	ASSERT_REGEN_OK(c, regen_client_set_transport(c, transport));
	tl_buffer_create(c, 0, 1 << 16, &b);
	m = (float *)b.mem.ptr;
	/* A = I (4x4), B = 2I, D = A B: 2I every time. */
	for (int i = 0; i < 16; i++) {
		m[i] = i % 5 == 0 ? 1.0f : 0.0f;
		m[64 + i] = i % 5 == 0 ? 2.0f : 0.0f;
	}
	memset(&g, 0, sizeof(g));
	tensor2(&g.a, b.buf, 0, 4, 4);
	tensor2(&g.b, b.buf, 256, 4, 4);
	tensor2(&g.d, b.buf, 512, 4, 4);
	for (int i = 0; i < 2000; i++) {
		ASSERT_REGEN_OK(c, regen_gemm_submit(c, &g, &t), "submit %d", i);
		if (i == 0)
			first = t;
	}
	ASSERT_UINT_EQ(t, first + 1999, "tickets count calls");
	ASSERT_REGEN_OK(c, regen_wait(c, 0, t), "2000 queued GEMMs");
	for (int i = 0; i < 16; i++)
		ASSERT(m[128 + i] == (i % 5 == 0 ? 2.0f : 0.0f), "D[%d] = %g", i, m[128 + i]);
	/* One bad call in the middle: the wait names it; the others ran. */
	struct regen_gemm_args bad = g;
	bad.d.offset = (1 << 16) - 16;
	for (int i = 0; i < 10; i++)
		ASSERT_REGEN_OK(c, regen_gemm_submit(c, i == 5 ? &bad : &g, &t), "submit %d", i);
	ASSERT_REGEN_ERROR(c, regen_wait(c, 0, t), REGEN_ERROR_INVALID_OPERAND, "the bad call among ten");
	ASSERT_REGEN_OK(c, regen_gemm(c, &g), "the lane goes on");
	ASSERT_EQ(regen_client_transport(c, 0), transport, "still the transport asked for");
	tl_buffer_free(&b);
	regen_client_destroy(c);
}

/* Each completion says when the worker took, launched, finished and
 * published its record: stages in order, between the client's own submit
 * and read; a refused record never launched; a Varlink call has no stages. */
static void completions_carry_stage_times(void)
{
	regen_client *c = tl_client_connect(&daemon_);
	struct tl_buffer b;
	struct regen_call_timing t;
	struct regen_gemm_args g;

	ASSERT_REGEN_OK(c, regen_client_set_transport(c, REGEN_TRANSPORT_RING));
	tl_buffer_create(c, 0, 1 << 16, &b);
	for (int i = 0; i < 20; i++) {
		ASSERT_GEMM_OK(c, &b, "a GEMM over the ring");
		ASSERT_EQ(regen_client_last_timing(c, 0, &t), 0, "timing of GEMM %d", i);
		const uint64_t at[] = { t.submitted_ns, t.taken_ns, t.launched_ns, t.finished_ns, t.published_ns,
					t.completed_ns };
		for (unsigned s = 0; s < sizeof(at) / sizeof(at[0]); s++) {
			ASSERT(at[s] != 0, "GEMM %d: stage %u has no time", i, s);
			ASSERT(s == 0 || at[s] >= at[s - 1], "GEMM %d: stage %u (%llu) before stage %u (%llu)", i, s,
			       (unsigned long long)at[s], s - 1, (unsigned long long)at[s - 1]);
		}
		ASSERT(t.completed_ns - t.submitted_ns < 60ull * 1000000000u, "GEMM %d: a minute between submit and read", i);
	}
	bad_gemm(0, b.buf, &g);
	ASSERT_REGEN_ERROR(c, regen_gemm(c, &g), REGEN_ERROR_INVALID_OPERAND, "D past the end");
	ASSERT_EQ(regen_client_last_timing(c, 0, &t), 0, "timing of the refused call");
	ASSERT(t.taken_ns != 0 && t.published_ns >= t.taken_ns, "a refused record was taken and published");
	ASSERT(t.launched_ns == 0 && t.finished_ns == 0, "a refused record never ran (launched %llu)",
	       (unsigned long long)t.launched_ns);
	ASSERT_REGEN_OK(c, regen_client_set_transport(c, REGEN_TRANSPORT_VARLINK));
	ASSERT_GEMM_OK(c, &b, "a GEMM over Varlink");
	ASSERT_EQ(regen_client_last_timing(c, 0, &t), 0, "timing over Varlink");
	ASSERT(t.completed_ns != 0 && t.taken_ns == 0 && t.launched_ns == 0, "Varlink: only the client's read time");
	ASSERT_EQ(regen_client_last_timing(c, -1, &t), -EINVAL, "a bad device");
	tl_buffer_free(&b);
	regen_client_destroy(c);
}

/* A restart: the ring's bound ids go stale with the generation, and the
 * records say so; imported again, the buffer serves on the same ring. */
static void restart_fails_records_with_stale_generation(void)
{
	regen_client *c = tl_client_connect(&daemon_);
	struct tl_buffer b;
	struct regen_gemm_args g;
	uint64_t gen;
	regen_status *st;

	ASSERT_REGEN_OK(c, regen_client_set_transport(c, REGEN_TRANSPORT_RING));
	tl_buffer_create(c, 1, 1 << 16, &b);
	ASSERT_GEMM_OK(c, &b, "before the restart");
	st = tl_status(c);
	gen = tl_status_device(st, 1)->generation;
	regen_status_free(st);
	ASSERT_REGEN_OK(c, regen_restart(c, 1, "test_ring", 0, NULL));
	memset(&g, 0, sizeof(g));
	tensor2(&g.a, b.buf, 0, 4, 4);
	tensor2(&g.b, b.buf, 256, 4, 4);
	tensor2(&g.d, b.buf, 512, 4, 4);
	ASSERT_REGEN_ERROR(c, regen_gemm(c, &g), REGEN_ERROR_STALE_GENERATION, "a record naming a stale id");
	ASSERT(strstr(regen_client_error_parameters(c), "\"generation\"") != NULL, "%s",
	       regen_client_error_parameters(c));
	ASSERT_EQ(tl_buffer_import(c, 1, &b), 0, "import again");
	ASSERT_UINT_GT(regen_buffer_generation(b.buf), gen, "a new generation");
	ASSERT_GEMM_OK(c, &b, "after the restart, imported again");
	ASSERT_EQ(regen_client_transport(c, 1), REGEN_TRANSPORT_RING, "the same ring");
	tl_buffer_free(&b);
	regen_client_destroy(c);
}

/* ---- a hostile client driving the ring by hand ---- */

struct raw_ring {
	struct tl_conn conn;
	int memfd, bell[2];
	void *base;
	uint32_t entries, sq_tail, cq_head;
};

static int ring_memfd(uint32_t entries, bool seal)
{
	int fd = memfd_create("test-ring", MFD_CLOEXEC | MFD_ALLOW_SEALING);

	ASSERT_GE(fd, 0, "memfd_create");
	ASSERT_EQ(ftruncate(fd, (off_t)rp_ring_size(entries)), 0, "ftruncate");
	if (seal)
		ASSERT_EQ(fcntl(fd, F_ADD_SEALS, F_SEAL_SHRINK), 0, "seal");
	return fd;
}

static void raw_setup_on(struct raw_ring *r, int device, uint32_t entries)
{
	memset(r, 0, sizeof(*r));
	ASSERT_EQ(tl_conn_open(&r->conn, tl_daemon_worker_socket(&daemon_, device)), 0, "connect");
	r->entries = entries;
	r->memfd = ring_memfd(entries, true);
	r->base = mmap(NULL, rp_ring_size(entries), PROT_READ | PROT_WRITE, MAP_SHARED, r->memfd, 0);
	ASSERT(r->base != MAP_FAILED, "mmap");
	rp_ring_header(r->base)->magic = RP_RING_MAGIC;
	rp_ring_header(r->base)->version = RP_RING_VERSION;
	rp_ring_header(r->base)->entries = entries;
	ASSERT_EQ(socketpair(AF_UNIX, SOCK_DGRAM | SOCK_CLOEXEC, 0, r->bell), 0, "socketpair");
}

static void raw_setup(struct raw_ring *r, uint32_t entries)
{
	raw_setup_on(r, 0, entries);
}

static void raw_open(struct raw_ring *r)
{
	struct tl_reply rep;
	int fds[2] = { r->memfd, r->bell[1] };

	tl_call(&r->conn, &rep, 10, fds, 2, "io.regen.Lane.Open", "{\"entries\":%u,\"ring\":0,\"doorbell\":1}",
		r->entries);
	ASSERT_REPLY_OK(&rep);
	ASSERT_EQ(tl_reply_int(&rep, "entries"), r->entries, "entries");
	tl_reply_finish(&rep);
}

static void raw_close(struct raw_ring *r)
{
	munmap(r->base, rp_ring_size(r->entries));
	close(r->memfd);
	close(r->bell[0]);
	close(r->bell[1]);
	tl_conn_close(&r->conn);
}

static uint32_t raw_submit(struct raw_ring *r, const struct rp_ring_record *rec)
{
	memcpy(rp_ring_record_at(r->base, r->entries, r->sq_tail), rec, sizeof(*rec));
	rp_ring_store(&rp_ring_header(r->base)->sq_tail, ++r->sq_tail);
	rp_ring_fence();
	(void)send(r->bell[0], "", 1, MSG_DONTWAIT);
	return r->sq_tail - 1;
}

/* The next completion (fails the test after `seconds`). */
static void raw_complete_within(struct raw_ring *r, double seconds, struct rp_ring_completion *out)
{
	double until = tl_now() + seconds;

	while (rp_ring_load(&rp_ring_header(r->base)->cq_tail) == r->cq_head) {
		ASSERT(tl_now() < until, "no completion for record %u", r->cq_head);
		usleep(200);
	}
	memcpy(out, rp_ring_completion_at(r->base, r->entries, r->cq_head), sizeof(*out));
	rp_ring_store(&rp_ring_header(r->base)->cq_head, ++r->cq_head);
}

static void raw_complete(struct raw_ring *r, struct rp_ring_completion *out)
{
	raw_complete_within(r, tl_timeout(10), out);
}

static void raw_bind(struct raw_ring *r, uint32_t index, const char *id)
{
	struct tl_reply rep;

	tl_call(&r->conn, &rep, 10, NULL, 0, "io.regen.Lane.Bind", "{\"index\":%u,\"ids\":[\"%s\"]}", index, id);
	ASSERT_REPLY_OK(&rep);
	tl_reply_finish(&rep);
}

static void expect_open_refused(int memfd, int bell, const char *params, const char *error, const char *what)
{
	struct tl_conn conn;
	struct tl_reply rep;
	int fds[2] = { memfd, bell };

	ASSERT_EQ(tl_conn_open(&conn, tl_daemon_worker_socket(&daemon_, 0)), 0, "connect");
	tl_call(&conn, &rep, 10, fds, 2, "io.regen.Lane.Open", "%s", params);
	ASSERT_REPLY_ERROR(&rep, error, "%s", what);
	tl_reply_finish(&rep);
	tl_conn_close(&conn);
}

static void bad_setups_are_refused_by_name(void)
{
	int sealed = ring_memfd(4, true), unsealed = ring_memfd(4, false), dgram[2], stream[2];
	void *h = mmap(NULL, rp_ring_size(4), PROT_READ | PROT_WRITE, MAP_SHARED, sealed, 0);

	rp_ring_header(h)->magic = RP_RING_MAGIC;
	rp_ring_header(h)->version = RP_RING_VERSION;
	rp_ring_header(h)->entries = 4;
	ASSERT_EQ(socketpair(AF_UNIX, SOCK_DGRAM | SOCK_CLOEXEC, 0, dgram), 0, "socketpair");
	ASSERT_EQ(socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, stream), 0, "socketpair");
	expect_open_refused(unsealed, dgram[1], "{\"entries\":4,\"ring\":0,\"doorbell\":1}", "io.regen.ImportFailed",
			    "an unsealed memfd");
	expect_open_refused(sealed, stream[1], "{\"entries\":4,\"ring\":0,\"doorbell\":1}", "io.regen.ImportFailed",
			    "a stream socket for a doorbell");
	expect_open_refused(sealed, dgram[1], "{\"entries\":3,\"ring\":0,\"doorbell\":1}",
			    "org.varlink.service.InvalidParameter", "3 entries");
	expect_open_refused(sealed, dgram[1], "{\"entries\":8,\"ring\":0,\"doorbell\":1}", "io.regen.ImportFailed",
			    "a memfd too small for its entries");
	expect_open_refused(sealed, dgram[1], "{\"entries\":4,\"ring\":5,\"doorbell\":1}",
			    "org.varlink.service.InvalidParameter", "an fd index past the fds passed");
	expect_open_refused(dgram[1], sealed, "{\"entries\":4,\"ring\":0,\"doorbell\":1}", "io.regen.ImportFailed",
			    "a socket for a ring");
	rp_ring_header(h)->version = 99;
	expect_open_refused(sealed, dgram[1], "{\"entries\":4,\"ring\":0,\"doorbell\":1}", "io.regen.ImportFailed",
			    "a header of another version");
	munmap(h, rp_ring_size(4));
	close(sealed);
	close(unsealed);
	close(dgram[0]);
	close(dgram[1]);
	close(stream[0]);
	close(stream[1]);

	/* One ring per connection; Bind before Open is refused. */
	struct raw_ring r;
	struct tl_reply rep;
	raw_setup(&r, 4);
	tl_call(&r.conn, &rep, 10, NULL, 0, "io.regen.Lane.Bind", "{\"index\":0,\"ids\":[\"\"]}");
	ASSERT_REPLY_ERROR(&rep, "org.varlink.service.InvalidParameter", "Bind before Open");
	tl_reply_finish(&rep);
	raw_open(&r);
	int fds[2] = { r.memfd, r.bell[1] };
	tl_call(&r.conn, &rep, 10, fds, 2, "io.regen.Lane.Open", "{\"entries\":4,\"ring\":0,\"doorbell\":1}");
	ASSERT_REPLY_ERROR(&rep, "io.regen.LimitExceeded", "a second ring on one connection");
	tl_reply_finish(&rep);
	raw_close(&r);
}

/* A record of a 4x4 GEMM on index 0 (A at 0, B at 64, D at 128 bytes). */
static void small_gemm(struct rp_ring_record *rec, uint64_t tag)
{
	memset(rec, 0, sizeof(*rec));
	rec->tag = tag;
	rec->op = RP_OP_GEMM;
	rec->alpha = 1.0;
	rec->wait_event = rec->signal_event = RP_RING_NONE;
	for (int i = 0; i < RP_OP_OPERANDS_MAX; i++)
		rec->operands[i].index = RP_RING_NONE;
	for (int s = 0; s < 4; s++) {
		struct rp_ring_operand *o = &rec->operands[s];
		if (s == RP_GEMM_C)
			continue;
		o->index = 0;
		o->dtype = RP_DTYPE_F32;
		o->rank = 2;
		o->shape[0] = o->shape[1] = 4;
		o->strides[0] = 4;
		o->strides[1] = 1;
		o->offset = s == RP_GEMM_A ? 0 : s == RP_GEMM_B ? 64 : 128;
	}
}

static void expect_completion(struct raw_ring *r, uint64_t tag, const char *error, const char *what)
{
	struct rp_ring_completion cqe;
	char name[64];
	cJSON *params = NULL;

	raw_complete(r, &cqe);
	ASSERT_UINT_EQ(cqe.tag, tag, "%s: the completion's tag", what);
	int k = rp_ring_completion_error(&cqe, name, &params);
	if (error == NULL) {
		ASSERT_EQ(k, 0, "%s: failed with %s", what, cqe.error);
	} else {
		ASSERT_EQ(k, 1, "%s: did not fail", what);
		ASSERT_STR_EQ(name, error, "%s: %s", what, cqe.error);
		ASSERT_STR_EQ(cqe.error_name, error, "%s: error_name", what);
		ASSERT(cJSON_GetObjectItem(params, "message") != NULL || strncmp(error, "org.varlink", 11) == 0,
		       "%s: no message in %s", what, cqe.error);
	}
	cJSON_Delete(params);
}

/* A record published before the lane's connection closed still runs: a
 * rank killed right after it published (an optimizer step's Run, say) has
 * that work done, as a Varlink call it sent would be. The record is
 * published while the worker sleeps, with no doorbell, and the connection
 * closed at once: only the close can make the worker look. Before, the
 * ring stopped at the close and the GEMM never ran. */
static void records_published_before_the_close_run(void)
{
	regen_client *c = tl_client_connect(&daemon_);
	struct tl_buffer b;
	struct raw_ring r;
	struct rp_ring_record rec;
	float *a, *bm, *d;
	double until;

	tl_buffer_create(c, 0, 4096, &b);
	a = (float *)b.mem.ptr;
	bm = a + 16;
	d = a + 32;
	for (int i = 0; i < 16; i++) {
		a[i] = (float)(i + 1);
		bm[i] = i % 5 == 0 ? 2.0f : 0.0f;   /* twice the identity */
		d[i] = -1.0f;
	}
	raw_setup(&r, 8);
	raw_open(&r);
	raw_bind(&r, 0, regen_buffer_id(b.buf));
	until = tl_now() + tl_timeout(10);
	while (rp_ring_load(&rp_ring_header(r.base)->sq_sleeping) != 1)
		ASSERT(tl_now() < until, "the worker never said it sleeps");
	small_gemm(&rec, 77);
	memcpy(rp_ring_record_at(r.base, r.entries, r.sq_tail), &rec, sizeof(rec));
	rp_ring_store(&rp_ring_header(r.base)->sq_tail, ++r.sq_tail);
	rp_ring_fence();
	tl_conn_close(&r.conn);
	until = tl_now() + tl_timeout(10);
	while (rp_ring_load(&rp_ring_header(r.base)->cq_tail) == 0)
		ASSERT(tl_now() < until, "the record published before the close never completed");
	for (int i = 0; i < 16; i++)
		ASSERT(d[i] == 2.0f * a[i], "D[%d] is %g, not %g: the GEMM did not run", i, (double)d[i],
		       2.0 * (double)a[i]);
	struct rp_ring_completion cqe;
	char name[64];
	cJSON *params = NULL;
	memcpy(&cqe, rp_ring_completion_at(r.base, r.entries, 0), sizeof(cqe));
	ASSERT_UINT_EQ(cqe.tag, 77, "the completion's tag");
	ASSERT_EQ(rp_ring_completion_error(&cqe, name, &params), 0, "the record failed: %s", cqe.error);
	cJSON_Delete(params);
	munmap(r.base, rp_ring_size(r.entries));
	close(r.memfd);
	close(r.bell[0]);
	close(r.bell[1]);
	tl_buffer_free(&b);
	regen_client_destroy(c);
}

static void bad_records_get_named_errors(void)
{
	regen_client *c = tl_client_connect(&daemon_);
	struct tl_buffer b;
	struct raw_ring r;
	struct tl_reply rep;
	struct rp_ring_record rec;
	uint64_t tag = 100;

	/* Imported by this process on another connection: ids belong to the
	 * process, and the raw connection is this process's too. */
	tl_buffer_create(c, 0, 1 << 16, &b);
	raw_setup(&r, 8);
	raw_open(&r);
	tl_call(&r.conn, &rep, 10, NULL, 0, "io.regen.Lane.Bind", "{\"index\":0,\"ids\":[\"%s\"]}",
		regen_buffer_id(b.buf));
	ASSERT_REPLY_OK(&rep);
	tl_reply_finish(&rep);
	tl_call(&r.conn, &rep, 10, NULL, 0, "io.regen.Lane.Bind", "{\"index\":1,\"ids\":[\"b0.1.999999\"]}");
	ASSERT(rep.error != NULL, "binding an id nobody imported");
	tl_reply_finish(&rep);
	tl_call(&r.conn, &rep, 10, NULL, 0, "io.regen.Lane.Bind", "{\"index\":255,\"ids\":[\"%s\",\"%s\"]}",
		regen_buffer_id(b.buf), regen_buffer_id(b.buf));
	ASSERT_REPLY_ERROR(&rep, "org.varlink.service.InvalidParameter", "binding past the table");
	tl_reply_finish(&rep);

	small_gemm(&rec, ++tag);
	raw_submit(&r, &rec);
	expect_completion(&r, tag, NULL, "a good record");

	small_gemm(&rec, ++tag);
	rec.operands[RP_GEMM_B].index = 7;
	raw_submit(&r, &rec);
	expect_completion(&r, tag, "io.regen.InvalidOperand", "an unbound index");

	small_gemm(&rec, ++tag);
	rec.operands[RP_GEMM_A].index = 100000;
	raw_submit(&r, &rec);
	expect_completion(&r, tag, "io.regen.InvalidOperand", "an index past the table");

	small_gemm(&rec, ++tag);
	rec.op = 77;
	raw_submit(&r, &rec);
	expect_completion(&r, tag, "org.varlink.service.InvalidParameter", "an unknown op");

	small_gemm(&rec, ++tag);
	rec.operands[RP_GEMM_D].offset = (1 << 16) - 8;
	raw_submit(&r, &rec);
	expect_completion(&r, tag, "io.regen.InvalidOperand", "D past the buffer's end");

	small_gemm(&rec, ++tag);
	rec.operands[RP_GEMM_A].rank = 9;
	raw_submit(&r, &rec);
	expect_completion(&r, tag, "org.varlink.service.InvalidParameter", "rank 9");

	small_gemm(&rec, ++tag);
	rec.operands[RP_GEMM_A].shape[0] = -4;
	raw_submit(&r, &rec);
	expect_completion(&r, tag, "org.varlink.service.InvalidParameter", "a negative dim");

	small_gemm(&rec, ++tag);
	rec.operands[RP_GEMM_A].dtype = 200;
	raw_submit(&r, &rec);
	expect_completion(&r, tag, "org.varlink.service.InvalidParameter", "an unknown dtype");

	small_gemm(&rec, ++tag);
	rec.flags = RP_RING_CAUSAL;
	raw_submit(&r, &rec);
	expect_completion(&r, tag, "org.varlink.service.InvalidParameter", "attention's flag on a GEMM");

	small_gemm(&rec, ++tag);
	rec.operands[6].index = 0;
	raw_submit(&r, &rec);
	expect_completion(&r, tag, "org.varlink.service.InvalidParameter", "an operand slot the op has not");

	small_gemm(&rec, ++tag);
	rec.wait_event = 0;   /* a buffer where an event goes */
	raw_submit(&r, &rec);
	expect_completion(&r, tag, "org.varlink.service.InvalidParameter", "a buffer as wait_event");

	small_gemm(&rec, ++tag);
	rec.beta = 0.0 / 0.0;
	raw_submit(&r, &rec);
	expect_completion(&r, tag, "org.varlink.service.InvalidParameter", "beta NaN");

	small_gemm(&rec, ++tag);
	rec.deadline_ms = RP_DEADLINE_MS_MAX + 1;
	raw_submit(&r, &rec);
	expect_completion(&r, tag, "org.varlink.service.InvalidParameter", "a deadline past a day");

	small_gemm(&rec, ++tag);
	rec.deadline_ms = 5000;
	raw_submit(&r, &rec);
	expect_completion(&r, tag, NULL, "a deadline of 5 s");

	/* Rewritten while the worker may be reading: whatever it copied is
	 * checked; the ring stays usable. */
	small_gemm(&rec, ++tag);
	raw_submit(&r, &rec);
	memset(rp_ring_record_at(r.base, r.entries, r.sq_tail - 1), 0xff, 512);
	struct rp_ring_completion cqe;
	raw_complete(&r, &cqe);
	ASSERT_UINT_EQ(cqe.tag == tag ? tag : cqe.tag, cqe.tag, "a completion came");

	small_gemm(&rec, ++tag);
	raw_submit(&r, &rec);
	expect_completion(&r, tag, NULL, "a good record after the bad ones");

	/* Counters that make no sense: the connection closes, the worker
	 * serves on. */
	rp_ring_store(&rp_ring_header(r.base)->sq_tail, r.sq_tail + 1000);
	(void)send(r.bell[0], "", 1, MSG_DONTWAIT);
	char *text = tl_recv_text(&r.conn, 10);
	ASSERT_NULL(text, "the connection of a ring with a bogus counter closes");
	raw_close(&r);
	ASSERT_GEMM_OK(c, &b, "the worker serves on");
	tl_buffer_free(&b);
	regen_client_destroy(c);
}

/* Publishes as far as the completions allow, reading none of them, and
 * rings whenever the worker says it sleeps, with a burst of doorbells now
 * and then: until killed. */
static int flood(void *arg)
{
	struct raw_ring *r = arg;
	struct rp_ring_header *h = rp_ring_header(r->base);
	uint32_t tail = r->sq_tail;

	for (unsigned turn = 0;; turn++) {
		uint32_t room = r->entries - (tail - rp_ring_load(&h->cq_tail));
		if (room) {
			tail += room;
			rp_ring_store(&h->sq_tail, tail);
		}
		rp_ring_fence();
		if (rp_ring_flag(&h->sq_sleeping) || turn % 1024 == 0)
			for (int i = 0; i < 256; i++)
				(void)send(r->bell[0], "", 1, MSG_DONTWAIT);
	}
	return 0;
}

/* A client that refills its ring with bad records as fast as the worker
 * refuses them, and rings the doorbell without pause, does not keep the
 * worker's loop from another connection: a Varlink call on it is answered
 * meanwhile, promptly. */
static void a_flooding_ring_does_not_starve_others(void)
{
	regen_client *c = tl_client_connect(&daemon_);
	struct tl_buffer b;
	struct raw_ring r;
	struct rp_ring_record rec;
	struct tl_conn other;
	struct tl_reply rep;
	double slowest = 0;
	pid_t pid;

	tl_buffer_create(c, 0, 1 << 16, &b);
	raw_setup(&r, 1024);
	raw_open(&r);
	raw_bind(&r, 0, regen_buffer_id(b.buf));
	small_gemm(&rec, 1);
	rec.op = 77;   /* refused at once: the ring empties as fast as it fills */
	for (uint32_t i = 0; i < r.entries; i++)
		memcpy(rp_ring_record_at(r.base, r.entries, i), &rec, sizeof(rec));
	pid = tl_fork(flood, &r, 60);
	ASSERT_EQ(tl_conn_open(&other, tl_daemon_worker_socket(&daemon_, 0)), 0, "connect");
	usleep(100000);
	for (int i = 0; i < 20; i++) {
		double t0 = tl_now();
		tl_call(&other, &rep, 10, NULL, 0, "io.regen.Device.Generation", "{}");
		ASSERT_REPLY_OK(&rep);
		ASSERT(tl_now() - t0 < 2.0, "a call beside a flooding ring took %.2f s", tl_now() - t0);
		if (tl_now() - t0 > slowest)
			slowest = tl_now() - t0;
		tl_reply_finish(&rep);
	}
	kill(pid, SIGKILL);
	ASSERT_EQ(tl_wait(pid, 10), 128 + SIGKILL, "the flooding child");
	tl_log("measured: %u records refused beside 20 calls, the slowest call %.1f ms",
	       rp_ring_load(&rp_ring_header(r.base)->cq_tail), slowest * 1e3);
	ASSERT_UINT_GT(rp_ring_load(&rp_ring_header(r.base)->cq_tail), 4 * r.entries,
		       "the flood was served meanwhile");
	tl_conn_close(&other);
	raw_close(&r);
	ASSERT_GEMM_OK(c, &b, "the worker serves on");
	tl_buffer_free(&b);
	regen_client_destroy(c);
}

/* ---- program Runs over the ring ---- */

/* A program of `pairs` pairs y<i> = x<i> * s (f32 [16] each) and the
 * scalar s: 2 * pairs + 1 bound tensors, x0, y0, x1, y1, ..., s. */
#define RUN_N 16
static char *pairs_definition(int pairs)
{
	cJSON *d = cJSON_CreateObject(), *tensors = cJSON_AddArrayToObject(d, "tensors"),
	      *nodes = cJSON_AddArrayToObject(d, "nodes");
	char name[16];
	int n = RUN_N;

	for (int i = 0; i < pairs; i++) {
		for (int io = 0; io < 2; io++) {
			cJSON *t = cJSON_CreateObject();

			snprintf(name, sizeof(name), "%c%d", io ? 'y' : 'x', i);
			cJSON_AddStringToObject(t, "name", name);
			cJSON_AddStringToObject(t, "kind", io ? "output" : "input");
			cJSON_AddStringToObject(t, "dtype", "f32");
			cJSON_AddItemToObject(t, "shape", cJSON_CreateIntArray(&n, 1));
			cJSON_AddItemToArray(tensors, t);
		}
		cJSON *node = cJSON_CreateObject(), *in = cJSON_AddArrayToObject(node, "inputs"),
		      *out = cJSON_AddArrayToObject(node, "outputs");
		cJSON_AddStringToObject(node, "op", "mul");
		snprintf(name, sizeof(name), "x%d", i);
		cJSON_AddItemToArray(in, cJSON_CreateString(name));
		cJSON_AddItemToArray(in, cJSON_CreateString("s"));
		snprintf(name, sizeof(name), "y%d", i);
		cJSON_AddItemToArray(out, cJSON_CreateString(name));
		cJSON_AddItemToArray(nodes, node);
	}
	cJSON *sc = cJSON_CreateObject();
	cJSON_AddStringToObject(sc, "name", "s");
	cJSON_AddStringToObject(sc, "kind", "scalar");
	cJSON_AddItemToArray(tensors, sc);
	char *text = cJSON_PrintUnformatted(d);
	cJSON_Delete(d);
	return text;
}

/* Bindings of the pairs program: x<i> in xs[i % nx] and y<i> in ys[i % ny]
 * (each RUN_N floats apart, past the buffers' earlier pairs). */
struct pairs_run {
	char names[2 * 200][16];
	struct regen_program_binding bind[2 * 200];
	struct regen_program_scalar scalar;
	struct regen_program_run_args args;
};

static void pairs_run(struct pairs_run *pr, regen_program *prog, int pairs, struct tl_buffer *xs, int nx,
		      struct tl_buffer *ys, int ny, double s)
{
	memset(pr, 0, sizeof(*pr));
	for (int i = 0; i < pairs; i++) {
		for (int io = 0; io < 2; io++) {
			int k = 2 * i + io;

			snprintf(pr->names[k], sizeof(pr->names[k]), "%c%d", io ? 'y' : 'x', i);
			pr->bind[k] = (struct regen_program_binding){
				.name = pr->names[k], .buffer = io ? ys[i % ny].buf : xs[i % nx].buf,
				.offset = (uint64_t)(i / (io ? ny : nx)) * RUN_N * sizeof(float),
			};
		}
	}
	pr->scalar = (struct regen_program_scalar){ .name = "s", .value = s };
	pr->args = (struct regen_program_run_args){
		.program = prog, .bind = pr->bind, .nbind = (size_t)2 * pairs, .scalars = &pr->scalar, .nscalars = 1,
	};
}

/* y<i> is x<i> * s, each product rounded once to f32 (the host backend's
 * reference math: a double product, rounded). */
static void expect_pairs(int pairs, struct tl_buffer *xs, int nx, struct tl_buffer *ys, int ny, double s,
			 const char *what)
{
	for (int i = 0; i < pairs; i++) {
		const float *x = (const float *)xs[i % nx].mem.ptr + (size_t)(i / nx) * RUN_N;
		const float *y = (const float *)ys[i % ny].mem.ptr + (size_t)(i / ny) * RUN_N;

		for (int e = 0; e < RUN_N; e++)
			ASSERT(y[e] == (float)((double)x[e] * s), "%s: y%d[%d] = %.9g, x * s = %.9g", what, i, e,
			       (double)y[e], (double)(float)((double)x[e] * s));
	}
}

/* A Run with more bindings than one record holds (130 pairs and a scalar:
 * 261 entries, a record and four continuations) over the ring and over
 * Varlink: the same outputs, bit for bit, and x * s rounded once; the same
 * refusals with the same errors; queued Runs answered in order; a Run that
 * names more ids than the lane's id table goes as a Varlink call and gives
 * the same outputs. */
#define PAIRS 130
static void program_runs_alike_on_both_transports(void)
{
	regen_client *cl[2] = { tl_client_connect(&daemon_), tl_client_connect(&daemon_) };
	const enum regen_transport transports[2] = { REGEN_TRANSPORT_VARLINK, REGEN_TRANSPORT_RING };
	char *def = pairs_definition(PAIRS);
	static struct pairs_run pr;
	struct tl_buffer xs[2][3], ys[2][2];
	regen_program *prog[2];
	char err[2][1024];
	float *outs[2];

	for (int t = 0; t < 2; t++) {
		ASSERT_REGEN_OK(cl[t], regen_client_set_transport(cl[t], transports[t]));
		ASSERT_REGEN_OK(cl[t], regen_program_define(cl[t], 0, def, &prog[t]), "Define");
		for (int i = 0; i < 3; i++)
			tl_buffer_create(cl[t], 0, 64 * RUN_N * sizeof(float), &xs[t][i]);
		for (int i = 0; i < 2; i++)
			tl_buffer_create(cl[t], 0, 96 * RUN_N * sizeof(float), &ys[t][i]);
		for (int i = 0; i < 3; i++) {
			if (t == 0)
				tl_fill_random(NULL, RP_DTYPE_F32, xs[0][i].mem.ptr, 64 * RUN_N, -4, 4, NULL);
			else
				memcpy(xs[1][i].mem.ptr, xs[0][i].mem.ptr, 64 * RUN_N * sizeof(float));
		}
		pairs_run(&pr, prog[t], PAIRS, xs[t], 3, ys[t], 2, 0.3);
		ASSERT_REGEN_OK(cl[t], regen_program_run(cl[t], &pr.args), "a Run of 261 entries");
		ASSERT_EQ(regen_client_transport(cl[t], 0), transports[t], "the lane's transport");
		expect_pairs(PAIRS, xs[t], 3, ys[t], 2, 0.3, t ? "ring" : "Varlink");
	}
	for (int i = 0; i < 2; i++) {
		outs[0] = (float *)ys[0][i].mem.ptr;
		outs[1] = (float *)ys[1][i].mem.ptr;
		ASSERT(memcmp(outs[0], outs[1], 65 * RUN_N * sizeof(float)) == 0, "y buffer %d differs by transport", i);
	}

	/* Refusals: the same error, parameters and all, both ways. */
	for (int k = 0; k < 4; k++) {
		int r[2];

		for (int t = 0; t < 2; t++) {
			pairs_run(&pr, prog[t], PAIRS, xs[t], 3, ys[t], 2, 0.3);
			if (k == 0)
				pr.args.nbind--;                     /* y129 unbound */
			else if (k == 1)
				pr.bind[7].offset += 2;              /* y3 misaligned */
			else if (k == 2)
				pr.bind[9].offset = 1 << 20;         /* y4 past its buffer */
			else
				pr.args.deadline_ms = 86400001;      /* past a day */
			r[t] = regen_program_run(cl[t], &pr.args);
			last_error(cl[t], err[t], sizeof(err[t]));
			for (int i = 0; i < 3; i++)
				replace_all(err[t], regen_buffer_id(xs[t][i].buf), "X");
			for (int i = 0; i < 2; i++)
				replace_all(err[t], regen_buffer_id(ys[t][i].buf), "Y");
			replace_all(err[t], regen_program_id(prog[t]), "P");
		}
		ASSERT_EQ(r[0], -EREMOTE, "refusal %d over Varlink: %s", k, err[0]);
		ASSERT_EQ(r[1], r[0], "refusal %d over the ring: %s (Varlink: %s)", k, err[1], err[0]);
		ASSERT_STR_EQ(err[1], err[0], "refusal %d: the ring's error differs from Varlink's", k);
	}
	ASSERT(strstr(err[0], "deadline_ms") != NULL, "%s", err[0]);
	/* What cannot be named is refused here, unsent, both ways. */
	for (int t = 0; t < 2; t++) {
		pairs_run(&pr, prog[t], PAIRS, xs[t], 3, ys[t], 2, 0.3);
		pr.bind[0].name = "nope";
		ASSERT_EQ(regen_program_run(cl[t], &pr.args), -EINVAL, "a name the program does not bind");
		pairs_run(&pr, prog[t], PAIRS, xs[t], 3, ys[t], 2, NAN);
		ASSERT_EQ(regen_program_run(cl[t], &pr.args), -EINVAL, "a NaN scalar");
	}

	/* Ten Runs queued without waiting, each with its own scale: the last
	 * one's outputs stand, and the lane answers in order. */
	for (int t = 0; t < 2; t++) {
		uint64_t ticket = 0, before = 0;
		for (int k = 1; k <= 10; k++) {
			pairs_run(&pr, prog[t], PAIRS, xs[t], 3, ys[t], 2, 0.5 * k);
			ASSERT_REGEN_OK(cl[t], regen_program_run_submit(cl[t], &pr.args, &ticket), "queued Run %d", k);
			ASSERT_UINT_GT(ticket, before, "tickets grow");
			before = ticket;
		}
		ASSERT_REGEN_OK(cl[t], regen_wait(cl[t], 0, ticket), "ten queued Runs");
		expect_pairs(PAIRS, xs[t], 3, ys[t], 2, 5.0, t ? "the ring's last queued Run" : "Varlink's last queued Run");
	}

	/* Every tensor in a buffer of its own: 261 ids, past the 256 of the
	 * lane's id table. The ring's lane sends it as a Varlink call. */
	static struct tl_buffer own_x[PAIRS], own_y[PAIRS];
	for (int i = 0; i < PAIRS; i++) {
		tl_buffer_create(cl[1], 0, RUN_N * sizeof(float), &own_x[i]);
		tl_buffer_create(cl[1], 0, RUN_N * sizeof(float), &own_y[i]);
		tl_fill_random(NULL, RP_DTYPE_F32, own_x[i].mem.ptr, RUN_N, -4, 4, NULL);
	}
	pairs_run(&pr, prog[1], PAIRS, own_x, PAIRS, own_y, PAIRS, -1.25);
	ASSERT_REGEN_OK(cl[1], regen_program_run(cl[1], &pr.args), "a Run of more ids than the table holds");
	expect_pairs(PAIRS, own_x, PAIRS, own_y, PAIRS, -1.25, "a Run past the id table");
	ASSERT_EQ(regen_client_transport(cl[1], 0), REGEN_TRANSPORT_RING, "the lane stays on the ring");
	pairs_run(&pr, prog[1], PAIRS, xs[1], 3, ys[1], 2, 2.0);
	ASSERT_REGEN_OK(cl[1], regen_program_run(cl[1], &pr.args), "the ring again after it");
	expect_pairs(PAIRS, xs[1], 3, ys[1], 2, 2.0, "the ring again");
	for (int i = 0; i < PAIRS; i++) {
		tl_buffer_free(&own_x[i]);
		tl_buffer_free(&own_y[i]);
	}

	for (int t = 0; t < 2; t++) {
		ASSERT_REGEN_OK(cl[t], regen_program_drop(prog[t]), "Drop");
		for (int i = 0; i < 3; i++)
			tl_buffer_free(&xs[t][i]);
		for (int i = 0; i < 2; i++)
			tl_buffer_free(&ys[t][i]);
		regen_client_destroy(cl[t]);
	}
	free(def);
}

/* ---- calls and Runs in the record's terms (regen_record_submit) ---- */

static struct regen_record_operand record_matrix(const char *buffer, uint64_t offset, int64_t rows, int64_t cols)
{
	return (struct regen_record_operand){
		.buffer = buffer, .dtype = REGEN_F32, .rank = 2, .offset = offset,
		.shape = { rows, cols }, .strides = { cols, 1 },
	};
}

/* D = alpha A B^T + beta C over ids: the record's terms, both transports. */
static struct regen_record_call record_gemm(const char *buffer, int m, int n, int k)
{
	struct regen_record_call call = { .op = 0, .flags = 2, .alpha = 1.5, .beta = 0.5 };

	call.operands[0] = record_matrix(buffer, 0, m, k);
	call.operands[1] = record_matrix(buffer, 4096, n, k);
	call.operands[2] = record_matrix(buffer, 8192, m, n);
	call.operands[3] = record_matrix(buffer, 12288, m, n);
	return call;
}

static void expect_named(regen_client *c, int r, const char *name, const char *param, const char *what)
{
	char err[1024];

	last_error(c, err, sizeof(err));
	ASSERT_EQ(r, -EINVAL, "%s: refused here (%s)", what, err);
	ASSERT_STR_EQ(regen_client_error_name(c) ? regen_client_error_name(c) : "(none)", name, "%s: %s", what, err);
	ASSERT(strstr(err, param) != NULL, "%s: the error names %s: %s", what, param, err);
}

/* A call in the record's terms, its buffers and events by id, gives what
 * the math says on either transport; what a record cannot say is refused
 * here by the name regend gives it; a queued call's error names its
 * ticket; a Run in the record's terms runs as regen_program_run's. */
static void record_calls_run_on_both_transports(void)
{
	const enum regen_transport transports[2] = { REGEN_TRANSPORT_VARLINK, REGEN_TRANSPORT_RING };
	const int m = 7, n = 5, k = 9;

	for (int t = 0; t < 2; t++) {
		regen_client *c = tl_client_connect(&daemon_);
		struct tl_buffer b;
		double a[7 * 9], bt[5 * 9], cc[7 * 5], want[7 * 5], got[7 * 5];
		uint64_t ticket, tickets[3], submitted, completed;
		struct regen_record_call call;
		char id[64];

		ASSERT_REGEN_OK(c, regen_client_set_transport(c, transports[t]));
		tl_buffer_create(c, 0, 1 << 16, &b);
		snprintf(id, sizeof(id), "%s", regen_buffer_id(b.buf));
		float *mem = (float *)b.mem.ptr;
		tl_fill_random(NULL, RP_DTYPE_F32, mem, (size_t)m * k, -1, 1, a);
		tl_fill_random(NULL, RP_DTYPE_F32, mem + 1024, (size_t)n * k, -1, 1, bt);
		tl_fill_random(NULL, RP_DTYPE_F32, mem + 2048, (size_t)m * n, -1, 1, cc);
		call = record_gemm(id, m, n, k);
		ASSERT_REGEN_OK(c, regen_record_submit(c, 0, &call, &ticket), "a GEMM in the record's terms");
		ASSERT_REGEN_OK(c, regen_wait(c, 0, ticket), "its answer");
		ASSERT_EQ(regen_client_transport(c, 0), transports[t], "the lane's transport");
		struct tl_gemm g = { .m = m, .n = n, .k = k, .trans_b = true, .alpha = 1.5, .beta = 0.5 };
		tl_gemm_ref(&g, a, bt, cc, NULL, want, NULL);
		for (int i = 0; i < m * n; i++)
			got[i] = mem[3072 + i];
		ASSERT(tl_rel_error(got, want, (size_t)m * n) <= 1e-6, "transport %d: D against float64: %.3g", t,
		       tl_rel_error(got, want, (size_t)m * n));

		/* Refused here, named as regend names them. */
		call = record_gemm(id, m, n, k);
		call.operands[3].rank = 5;
		expect_named(c, regen_record_submit(c, 0, &call, &ticket), REGEN_ERROR_INVALID_PARAMETER, "d.shape",
			     "rank 5");
		call = record_gemm("e0.1.1", m, n, k);
		expect_named(c, regen_record_submit(c, 0, &call, &ticket), REGEN_ERROR_INVALID_OPERAND, "is not a buffer id",
			     "an event's id for a buffer");
		call = record_gemm(id, m, n, k);
		call.alpha = NAN;
		expect_named(c, regen_record_submit(c, 0, &call, &ticket), REGEN_ERROR_INVALID_PARAMETER, "alpha",
			     "alpha NaN");
		call = record_gemm(id, m, n, k);
		call.wait_event = id;
		expect_named(c, regen_record_submit(c, 0, &call, &ticket), REGEN_ERROR_INVALID_PARAMETER, "wait_event",
			     "a buffer's id for an event");
		call = record_gemm(id, m, n, k);
		call.op = 99;
		expect_named(c, regen_record_submit(c, 0, &call, &ticket), REGEN_ERROR_INVALID_PARAMETER, "\"op\"",
			     "no such op");
		struct regen_record_call ln = { .op = 3, .scale = NAN };
		ln.operands[0] = record_matrix(id, 0, m, k);
		expect_named(c, regen_record_submit(c, 0, &ln, &ticket), REGEN_ERROR_INVALID_PARAMETER, "eps",
			     "LayerNorm's eps NaN");

		/* Three queued, the second past the buffer's end: the wait's
		 * error is the second's, and says so. */
		for (int i = 0; i < 3; i++) {
			call = record_gemm(id, m, n, k);
			if (i == 1)
				call.operands[3].offset = (1 << 16) - 64;
			ASSERT_REGEN_OK(c, regen_record_submit(c, 0, &call, &tickets[i]), "queued %d", i);
		}
		ASSERT_EQ(regen_wait(c, 0, tickets[2]), -EREMOTE, "the second's error at the wait");
		ASSERT_STR_EQ(regen_client_error_name(c), REGEN_ERROR_INVALID_OPERAND, "past the end");
		ASSERT_UINT_EQ(regen_client_error_ticket(c), tickets[1], "the error names the second's ticket");
		ASSERT_REGEN_OK(c, regen_client_tickets(c, 0, &submitted, &completed));
		ASSERT_UINT_EQ(submitted, tickets[2], "tickets handed out");
		ASSERT_UINT_EQ(completed, tickets[2], "answers read");

		/* A Run by ids and positions: y0 = x0 * s, y1 = x1 * s. */
		char *def = pairs_definition(2);
		regen_program *prog;
		ASSERT_REGEN_OK(c, regen_program_define(c, 0, def, &prog), "Define");
		free(def);
		struct tl_buffer xs, ys;
		tl_buffer_create(c, 0, 2 * RUN_N * sizeof(float), &xs);
		tl_buffer_create(c, 0, 2 * RUN_N * sizeof(float), &ys);
		tl_fill_random(NULL, RP_DTYPE_F32, xs.mem.ptr, 2 * RUN_N, -4, 4, NULL);
		/* Define's binding order: x0, y0, x1, y1, s (the tensors' order). */
		const struct regen_record_binding bind[4] = {
			{ 0, "x0", regen_buffer_id(xs.buf), 0 }, { 1, "y0", regen_buffer_id(ys.buf), 0 },
			{ 2, "x1", regen_buffer_id(xs.buf), RUN_N * sizeof(float) },
			{ 3, "y1", regen_buffer_id(ys.buf), RUN_N * sizeof(float) },
		};
		const struct regen_record_scalar s = { 4, "s", -0.75 };
		struct regen_record_run run = {
			.program = regen_program_id(prog), .bind = bind, .nbind = 4, .scalars = &s, .nscalars = 1,
		};
		ASSERT_REGEN_OK(c, regen_record_run_submit(c, 0, &run, &ticket), "a Run in the record's terms");
		ASSERT_REGEN_OK(c, regen_wait(c, 0, ticket), "its answer");
		expect_pairs(2, &xs, 1, &ys, 1, -0.75, t ? "a record Run over the ring" : "a record Run over Varlink");
		run.program = regen_buffer_id(xs.buf);
		expect_named(c, regen_record_run_submit(c, 0, &run, &ticket), REGEN_ERROR_INVALID_PARAMETER,
			     "\"program\"", "a buffer's id for the program");
		run.program = regen_program_id(prog);
		struct regen_record_binding far[4];
		memcpy(far, bind, sizeof(far));
		far[2].offset = (UINT64_C(1) << 53) + 8;
		run.bind = far;
		expect_named(c, regen_record_run_submit(c, 0, &run, &ticket), REGEN_ERROR_INVALID_PARAMETER,
			     "bind.x1.offset", "an offset past 2^53");
		ASSERT_REGEN_OK(c, regen_program_drop(prog), "Drop");
		tl_buffer_free(&xs);
		tl_buffer_free(&ys);
		tl_buffer_free(&b);
		regen_client_destroy(c);
	}
}

/* A call queued behind a hang, the worker crashed; the next call names an
 * id the lane has not bound: its Bind meets the connection gone. The call
 * says so (-ECONNRESET, the lost call told of) and the lane starts afresh:
 * the one after it binds on a new connection. The lane had kept the dead
 * connection with its record outstanding, and every later call failed
 * with -ENOTCONN, for good. */
static void a_bind_that_meets_the_worker_gone_starts_the_lane_afresh(void)
{
	regen_client *c = tl_client_connect(&daemon_);
	struct regen_record_call call = { .op = 0, .alpha = 1.0 };
	struct tl_buffer b;
	struct regen_gemm_args g;
	uint64_t gen, lost = 0, ticket;
	char ghost[64];
	regen_status *st;
	int r;

	ASSERT_REGEN_OK(c, regen_client_set_transport(c, REGEN_TRANSPORT_RING));
	tl_buffer_create(c, 1, 1 << 16, &b);
	memset(&g, 0, sizeof(g));
	tensor2(&g.a, b.buf, 0, 4, 4);
	tensor2(&g.b, b.buf, 256, 4, 4);
	tensor2(&g.d, b.buf, 512, 4, 4);
	ASSERT_REGEN_OK(c, regen_gemm(c, &g), "before the crash");
	st = tl_status(c);
	gen = tl_status_device(st, 1)->generation;
	regen_status_free(st);
	ASSERT_REGEN_OK(c, regen_inject_fault(c, 1, "hang"));
	ASSERT_REGEN_OK(c, regen_gemm_submit(c, &g, &lost), "queued behind the hang");
	usleep(200000);
	(void)regen_inject_fault(c, 1, "crash");
	tl_wait_generation(c, 1, gen, 30);
	snprintf(ghost, sizeof(ghost), "b1.%llu.999999", (unsigned long long)gen + 1);
	call.operands[0] = call.operands[1] = call.operands[3] = record_matrix(ghost, 0, 4, 4);
	r = regen_record_submit(c, 1, &call, &ticket);
	ASSERT_EQ(r, -ECONNRESET, "the Bind on the dead connection: %d (%s)", r,
		  regen_client_error_message(c) ? regen_client_error_message(c) : "-");
	r = regen_record_submit(c, 1, &call, &ticket);
	ASSERT_EQ(r, -EREMOTE, "the Bind again, on a new connection: %d (%s)", r,
		  regen_client_error_message(c) ? regen_client_error_message(c) : "-");
	ASSERT_STR_EQ(regen_client_error_name(c), REGEN_ERROR_NO_SUCH_OBJECT, "a made-up id");
	ASSERT_EQ(regen_wait(c, 1, lost), -ECONNRESET, "the lost call's wait");
	tl_buffer_free(&b);
	regen_client_destroy(c);
}

/* CPU seconds a process has used (user and system). */
static double cpu_seconds(pid_t pid)
{
	char path[64], buf[1024];
	unsigned long utime = 0, stime = 0;
	FILE *f;

	snprintf(path, sizeof(path), "/proc/%d/stat", (int)pid);
	f = fopen(path, "r");
	ASSERT(f != NULL, "no %s", path);
	ASSERT(fgets(buf, sizeof(buf), f) != NULL, "read %s", path);
	fclose(f);
	/* The fields after the command's closing parenthesis: 14 and 15. */
	const char *p = strrchr(buf, ')');
	ASSERT(p != NULL && sscanf(p + 2, "%*c %*d %*d %*d %*d %*d %*u %*u %*u %*u %*u %lu %lu", &utime, &stime) == 2,
	       "parse %s", path);
	return (double)(utime + stime) / (double)sysconf(_SC_CLK_TCK);
}

static pid_t worker_pid(int device)
{
	struct tl_conn m;
	struct tl_device dev;

	ASSERT_EQ(tl_conn_open(&m, daemon_.sock), 0, "connect");
	tl_device_status(&m, device, &dev);
	tl_conn_close(&m);
	return (pid_t)dev.worker_pid;
}

/* Writes records recs[0 .. n) from sq_tail on and publishes the first
 * `publish` of them (the rest stays written, unpublished). */
static void raw_write(struct raw_ring *r, const union rp_ring_slot *recs, unsigned n, unsigned publish)
{
	for (unsigned k = 0; k < n; k++)
		memcpy(rp_ring_record_at(r->base, r->entries, r->sq_tail + k), &recs[k], sizeof(recs[k]));
	r->sq_tail += publish;
	rp_ring_store(&rp_ring_header(r->base)->sq_tail, r->sq_tail);
	rp_ring_fence();
	(void)send(r->bell[0], "", 1, MSG_DONTWAIT);
}

/* Publishes more of what raw_write wrote. */
static void raw_publish(struct raw_ring *r, unsigned more)
{
	r->sq_tail += more;
	rp_ring_store(&rp_ring_header(r->base)->sq_tail, r->sq_tail);
	rp_ring_fence();
	(void)send(r->bell[0], "", 1, MSG_DONTWAIT);
}

/* A continuation's completion: status 2, naming its Run's record. */
static void expect_continuation(struct raw_ring *r, uint64_t tag, uint32_t head, const char *what)
{
	struct rp_ring_completion cqe;
	char name[64];
	cJSON *params = NULL;

	raw_complete(r, &cqe);
	ASSERT_UINT_EQ(cqe.tag, tag, "%s: the continuation's tag", what);
	ASSERT_EQ(rp_ring_completion_error(&cqe, name, &params), 2, "%s: not a continuation's completion: %s", what,
		  cqe.error);
	ASSERT_UINT_EQ(cqe.head, head, "%s: the Run it continues", what);
}

struct other_process {
	const char *program;
};

/* Another process of this uid: it cannot bind the program to its own id
 * table, nor run it; an index that holds no program is refused as one. */
static int another_process_names_the_program(void *arg)
{
	const struct other_process *o = arg;
	struct raw_ring r;
	struct tl_reply rep;
	union rp_ring_slot rec;
	struct rp_ring_completion cqe;
	char name[64];
	cJSON *params = NULL;
	struct tl_memfd m;
	char buf[RP_ID_MAX];

	raw_setup(&r, 4);
	raw_open(&r);
	tl_call(&r.conn, &rep, 10, NULL, 0, "io.regen.Lane.Bind", "{\"index\":0,\"ids\":[\"%s\"]}", o->program);
	ASSERT_REPLY_ERROR(&rep, "io.regen.NoSuchObject", "another process's program bound");
	tl_reply_finish(&rep);
	tl_call(&r.conn, &rep, 10, NULL, 0, "io.regen.Program.Run", "{\"program\":\"%s\",\"bind\":{}}", o->program);
	ASSERT_REPLY_ERROR(&rep, "io.regen.NoSuchObject", "another process's program run");
	tl_reply_finish(&rep);
	/* Its own buffer where a program goes. */
	tl_memfd_create(&m, 4096);
	ASSERT_EQ(tl_import_memfd(&r.conn, 0, m.fd, 4096, buf, &rep), 0, "import");
	tl_reply_finish(&rep);
	raw_bind(&r, 1, buf);
	struct rp_ring_run_call call = { .program = 1, .wait_event = RP_RING_NONE, .signal_event = RP_RING_NONE,
					 .journal = RP_RING_NONE };
	for (uint32_t program = 0; program < 3; program++) {   /* unbound, a buffer, past the table's use */
		call.program = program == 2 ? 4000 : program;
		rp_ring_encode_run(&call, 7 + program, r.sq_tail, 0, &rec);
		raw_write(&r, &rec, 1, 1);
		raw_complete(&r, &cqe);
		ASSERT_EQ(rp_ring_completion_error(&cqe, name, &params), 1, "program index %u accepted", call.program);
		ASSERT_STR_EQ(name, "org.varlink.service.InvalidParameter", "%s", cqe.error);
		ASSERT(strstr(cqe.error, "\"program\"") != NULL, "%s", cqe.error);
		cJSON_Delete(params);
		params = NULL;
	}
	raw_close(&r);
	tl_memfd_destroy(&m);
	return 0;
}

/* A Run driven by hand: taken only once its continuations are all
 * published (the worker sleeps meanwhile instead of spinning on it), then
 * its completion and one per continuation in record order; a continuation
 * torn (another part) refuses its Run by name; a span past the ring is
 * refused, and a continuation that comes alone is no call; another process
 * cannot name the program. */
static void a_run_waits_for_its_continuations(void)
{
	regen_client *c = tl_client_connect(&daemon_);
	char *def = pairs_definition(PAIRS);
	regen_program *prog;
	struct tl_buffer bx, by;
	struct raw_ring r;
	union rp_ring_slot recs[RP_RING_RUN_CONTINUATIONS_MAX + 1];
	struct rp_ring_binding bind[2 * PAIRS];
	struct rp_ring_scalar scalar = { .bound = 2 * PAIRS, .value = 1.5 };
	struct rp_ring_run_call call = {
		.program = 1, .wait_event = RP_RING_NONE, .signal_event = RP_RING_NONE, .journal = RP_RING_NONE,
		.bind = bind, .nbind = 2 * PAIRS, .scalars = &scalar, .nscalars = 1,
	};
	unsigned n = RP_RING_RUN_RECORDS(2 * PAIRS + 1);
	pid_t worker = worker_pid(0);

	ASSERT_REGEN_OK(c, regen_program_define(c, 0, def, &prog), "Define");
	tl_buffer_create(c, 0, PAIRS * RUN_N * sizeof(float), &bx);
	tl_buffer_create(c, 0, PAIRS * RUN_N * sizeof(float), &by);
	tl_fill_random(NULL, RP_DTYPE_F32, bx.mem.ptr, PAIRS * RUN_N, -4, 4, NULL);
	for (int i = 0; i < PAIRS; i++) {
		bind[2 * i] = (struct rp_ring_binding){ .bound = 2 * i, .buffer = 0, .offset = i * RUN_N * 4 };
		bind[2 * i + 1] = (struct rp_ring_binding){ .bound = 2 * i + 1, .buffer = 2, .offset = i * RUN_N * 4 };
	}
	raw_setup(&r, 8);
	raw_open(&r);
	raw_bind(&r, 0, regen_buffer_id(bx.buf));
	raw_bind(&r, 1, regen_program_id(prog));
	raw_bind(&r, 2, regen_buffer_id(by.buf));

	/* The Run's own record published alone: nothing is taken. */
	ASSERT_EQ(n, 5, "261 entries take five records");
	for (unsigned k = 0; k < n; k++)
		rp_ring_encode_run(&call, 100, r.sq_tail, k, &recs[k]);
	raw_write(&r, recs, n, 1);
	double cpu0 = cpu_seconds(worker), t0 = tl_now();
	usleep(400 * 1000);
	double cpu = cpu_seconds(worker) - cpu0, wall = tl_now() - t0;
	tl_log("measured: the worker used %.0f ms of CPU in %.0f ms waiting for a Run's continuations", cpu * 1e3,
	       wall * 1e3);
	ASSERT_UINT_EQ(rp_ring_load(&rp_ring_header(r.base)->cq_tail), 0, "a Run taken before its continuations");
	ASSERT_UINT_EQ(rp_ring_load(&rp_ring_header(r.base)->sq_head), 0, "a Run taken before its continuations");
	ASSERT(cpu < 0.25 * wall, "the worker spun %.0f ms of %.0f ms on a Run published in part", cpu * 1e3,
	       wall * 1e3);
	raw_publish(&r, 1);   /* one continuation more: still not whole */
	usleep(50 * 1000);
	ASSERT_UINT_EQ(rp_ring_load(&rp_ring_header(r.base)->cq_tail), 0, "a Run taken with one continuation of four");
	raw_publish(&r, n - 2);
	expect_completion(&r, 100, NULL, "the Run, once whole");
	for (unsigned k = 1; k < n; k++)
		expect_continuation(&r, 100 + k, 0, "the Run's continuation");
	expect_pairs(PAIRS, &bx, 1, &by, 1, 1.5, "the Run by hand");

	/* A torn continuation: its part says 3 where 2 goes. */
	uint32_t head = r.sq_tail;
	for (unsigned k = 0; k < n; k++)
		rp_ring_encode_run(&call, 200, head, k, &recs[k]);
	recs[2].continuation.part = 3;
	raw_write(&r, recs, n, n);
	expect_completion(&r, 200, "org.varlink.service.InvalidParameter", "a torn continuation");
	for (unsigned k = 1; k < n; k++)
		expect_continuation(&r, 200 + k, head, "a torn Run's continuation");

	/* A span the ring cannot hold: refused alone; a lone continuation is
	 * refused as no call. */
	head = r.sq_tail;
	for (unsigned k = 0; k < n; k++)
		rp_ring_encode_run(&call, 300, head, k, &recs[k]);
	recs[0].run.continuations = 8;
	raw_write(&r, recs, 2, 2);
	expect_completion(&r, 300, "org.varlink.service.InvalidParameter", "a Run of nine records on a ring of eight");
	expect_completion(&r, 301, "org.varlink.service.InvalidParameter", "a continuation alone");

	/* The ring serves on. */
	head = r.sq_tail;
	scalar.value = -0.75;
	for (unsigned k = 0; k < n; k++)
		rp_ring_encode_run(&call, 400, head, k, &recs[k]);
	raw_write(&r, recs, n, n);
	expect_completion(&r, 400, NULL, "a Run after the refusals");
	for (unsigned k = 1; k < n; k++)
		expect_continuation(&r, 400 + k, head, "its continuation");
	expect_pairs(PAIRS, &bx, 1, &by, 1, -0.75, "a Run after the refusals");

	struct other_process o = { .program = regen_program_id(prog) };
	ASSERT_EQ(tl_wait(tl_fork(another_process_names_the_program, &o, 60), 60), 0, "another process");
	raw_close(&r);
	ASSERT_REGEN_OK(c, regen_program_drop(prog), "Drop");
	tl_buffer_free(&bx);
	tl_buffer_free(&by);
	regen_client_destroy(c);
	free(def);
}

/* A record behind a hung device is answered with io.regen.Timeout in its
 * completion once its deadline_ms passed, as a Varlink call is, and so is a
 * program's Run behind it, its continuation completed as its part; the
 * device then goes through its respawn. Last: device 1 is hung. */
static void a_hung_record_times_out(void)
{
	regen_client *c = tl_client_connect(&daemon_);
	struct tl_buffer b;
	struct raw_ring r;
	struct rp_ring_record rec;
	struct rp_ring_completion cqe;
	char name[64];
	cJSON *params = NULL;
	double t0;
	char *def = pairs_definition(40);
	regen_program *prog;

	tl_buffer_create(c, 1, 1 << 16, &b);
	ASSERT_REGEN_OK(c, regen_program_define(c, 1, def, &prog), "Define on device 1");
	raw_setup_on(&r, 1, 8);
	raw_open(&r);
	raw_bind(&r, 0, regen_buffer_id(b.buf));
	raw_bind(&r, 1, regen_program_id(prog));
	ASSERT_REGEN_OK(c, regen_inject_fault(c, 1, "hang"));
	small_gemm(&rec, 42);
	rec.deadline_ms = 300;
	t0 = tl_now();
	raw_submit(&r, &rec);
	raw_complete_within(&r, 10, &cqe);
	tl_log("measured: hung record (deadline_ms 300) completed after %.0f ms: %s", (tl_now() - t0) * 1e3, cqe.error);
	ASSERT_UINT_EQ(cqe.tag, 42, "the hung record's tag");
	ASSERT_EQ(rp_ring_completion_error(&cqe, name, &params), 1, "the hung record failed");
	ASSERT_STR_EQ(name, "io.regen.Timeout", "%s", cqe.error);
	ASSERT(cJSON_GetNumberValue(cJSON_GetObjectItem(params, "elapsed_ms")) >= 300, "Timeout after %s", cqe.error);
	ASSERT(cJSON_GetNumberValue(cJSON_GetObjectItem(params, "device")) == 1, "Timeout names device 1: %s",
	       cqe.error);
	ASSERT(tl_now() - t0 < 2, "the Timeout came %.2f s after the record", tl_now() - t0);
	cJSON_Delete(params);
	params = NULL;

	/* A Run of 81 entries (a record and a continuation) behind it. */
	struct rp_ring_binding bind[80];
	struct rp_ring_scalar scalar = { .bound = 80, .value = 2.0 };
	struct rp_ring_run_call call = {
		.program = 1, .wait_event = RP_RING_NONE, .signal_event = RP_RING_NONE, .journal = RP_RING_NONE,
		.deadline_ms = 300, .bind = bind, .nbind = 80, .scalars = &scalar, .nscalars = 1,
	};
	union rp_ring_slot recs[2];
	for (int i = 0; i < 80; i++)
		bind[i] = (struct rp_ring_binding){ .bound = (uint32_t)i, .buffer = 0, .offset = 64u * (uint32_t)i };
	uint32_t head = r.sq_tail;
	for (unsigned k = 0; k < 2; k++)
		rp_ring_encode_run(&call, 50, head, k, &recs[k]);
	t0 = tl_now();
	raw_write(&r, recs, 2, 2);
	raw_complete_within(&r, 10, &cqe);
	tl_log("measured: hung Run (deadline_ms 300) completed after %.0f ms: %s", (tl_now() - t0) * 1e3, cqe.error);
	ASSERT_UINT_EQ(cqe.tag, 50, "the hung Run's tag");
	ASSERT_EQ(rp_ring_completion_error(&cqe, name, &params), 1, "the hung Run failed");
	ASSERT_STR_EQ(name, "io.regen.Timeout", "%s", cqe.error);
	ASSERT(strstr(cqe.error, "io.regen.Program.Run") != NULL, "the Timeout names the Run: %s", cqe.error);
	cJSON_Delete(params);
	expect_continuation(&r, 51, head, "the hung Run's continuation");
	raw_close(&r);
	tl_buffer_free(&b);
	regen_program_drop(prog);
	free(def);
	regen_client_destroy(c);
}

int main(void)
{
	tl_init(240);
	tl_daemon_start(&daemon_, NULL);
	same_answers_on_both_transports();
	queued_calls_complete_in_order(REGEN_TRANSPORT_RING);
	queued_calls_complete_in_order(REGEN_TRANSPORT_VARLINK);
	a_full_id_table_keeps_a_records_own_indexes();
	a_full_table_keeps_a_queued_error_for_the_wait();
	a_crash_with_a_ring_call_in_flight_is_told();
	a_bind_that_meets_the_worker_gone_starts_the_lane_afresh();
	a_switch_with_calls_outstanding_applies_after_them();
	a_lane_closed_under_its_records_tells_of_them();
	completions_carry_stage_times();
	restart_fails_records_with_stale_generation();
	bad_setups_are_refused_by_name();
	bad_records_get_named_errors();
	records_published_before_the_close_run();
	a_flooding_ring_does_not_starve_others();
	program_runs_alike_on_both_transports();
	record_calls_run_on_both_transports();
	a_run_waits_for_its_continuations();
	a_hung_record_times_out();
	tl_daemon_stop(&daemon_);
	tl_log("ok");
	return 0;
}
