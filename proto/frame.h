/* SPDX-License-Identifier: Apache-2.0 */
/* Varlink framing over a Unix stream socket: NUL-terminated messages, with
 * file descriptors as SCM_RIGHTS on the first byte of the message that
 * references them. One implementation for daemon and client. */
#pragma once

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <sys/types.h>

#define RP_MESSAGE_MAX (1u << 20)   /* bytes, NUL excluded */
#define RP_FDS_MAX 16               /* per message */
#define RP_RX_READ_CHUNK 65536      /* bytes rp_rx_read asks for at most */

struct rp_fd_batch;
struct rp_rx_item;

/* Incremental receiver. Bytes may arrive split anywhere and several
 * messages may arrive in one read. */
struct rp_rx {
	char *buf;
	size_t len, cap;
	uint64_t buf_offset;       /* stream offset of buf[0] */
	uint64_t scan_offset;      /* stream offset up to which buf has no NUL */
	bool discarding;           /* inside an oversized message: skip to its NUL */
	uint64_t discarded_bytes;
	struct rp_fd_batch *batches; /* fds waiting for their message */
	size_t nbatches;
	struct rp_rx_item *head, *tail; /* complete messages not yet popped */
	/* What those messages hold: their memory (text and bookkeeping) and
	 * fds. A server counts them against the peer's budget (daemon/conn.c):
	 * received and not yet handled is still held. */
	size_t held_bytes, held_fds;
};

void rp_rx_init(struct rp_rx *rx);
/* Frees buffers and closes every fd not yet handed out. */
void rp_rx_finish(struct rp_rx *rx);

/* One recvmsg() on a non-blocking or blocking socket. Returns bytes read
 * (> 0), 0 on end of stream, or -errno (-EAGAIN when nothing is ready;
 * -ENOMEM leaves the receiver out of step with the stream: close it).
 * Received fds are attached to the LAST message that starts within the
 * bytes of this read: the sender sends them with that message's first byte
 * in a sendmsg() of its own, and Linux ends a read right after the segment
 * that carries fds, but may glue fd-less bytes before it (a whole earlier
 * message, say) into the same read. fds that arrive where no message starts
 * are closed. On MSG_CTRUNC (control data cut short, or fds refused by a
 * security module) every fd of the read is closed and the message they were
 * for is delivered with nfds 0 and fds_dropped > 0. */
ssize_t rp_rx_read(struct rp_rx *rx, int sock);

/* Append bytes as if read from the socket, with fds (may be NULL/0) that
 * arrived with them; the receiver owns the fds from here on, also on
 * error. Same fd rule as rp_rx_read. For tests and fuzzing. Returns 0 or
 * -ENOMEM. */
int rp_rx_feed(struct rp_rx *rx, const void *data, size_t len, const int *fds, size_t nfds);

/* Part of a message has arrived and not its end. */
static inline bool rp_rx_partial(const struct rp_rx *rx)
{
	return rx->len > 0 || rx->discarding || rx->batches != NULL;
}

enum rp_rx_result {
	RP_RX_NONE = 0,       /* no complete message buffered */
	RP_RX_MESSAGE = 1,    /* *msg set */
	RP_RX_TOO_LARGE = 2,  /* a message over RP_MESSAGE_MAX was discarded whole
	                         (its fds closed); answer it with MessageTooLarge */
};

/* A received message: NUL-terminated JSON text, and the fds that came with it. */
struct rp_msg {
	char *text;     /* malloc'ed, caller frees with rp_msg_finish */
	size_t len;     /* without the NUL */
	int fds[RP_FDS_MAX];   /* the receiver hands them over; claim one by setting it to -1 */
	size_t nfds;
	/* fds that came with the message but were closed: those beyond
	 * RP_FDS_MAX, or all of them on MSG_CTRUNC. A server should refuse a
	 * message with fds_dropped > 0 rather than act on it with fds missing. */
	size_t fds_dropped;
};
void rp_msg_finish(struct rp_msg *msg);   /* frees text, closes fds still >= 0 */

/* Pops the next complete message. Returns enum rp_rx_result or -ENOMEM.
 * An oversized message is reported once when its terminating NUL arrives;
 * until then its bytes are dropped as they come, so memory stays bounded.
 * *msg is always initialised (safe for rp_msg_finish); for RP_RX_TOO_LARGE
 * text is NULL and len the size of the discarded message. */
int rp_rx_next(struct rp_rx *rx, struct rp_msg *msg);

/* Outgoing queue with partial-write handling. Each message's fds go with
 * its first byte. */
struct rp_tx_item;
struct rp_tx {
	struct rp_tx_item *head, *tail;
	size_t queued_bytes;        /* bytes still to go on the wire */
	size_t held_bytes;          /* memory of the queued messages, bookkeeping included */
};

void rp_tx_init(struct rp_tx *tx);
void rp_tx_finish(struct rp_tx *tx);       /* drops queued messages, closes their fds */
/* Queues `text` (len bytes, a NUL is appended on the wire) and dups fds.
 * Returns 0, -EINVAL for too many fds or a NUL inside text, -ENOMEM, or the
 * -errno of a failed dup (-EBADF, -EMFILE). */
int rp_tx_push(struct rp_tx *tx, const char *text, size_t len, const int *fds, size_t nfds);
/* Writes as much as the socket takes. Returns 0 when the queue is empty,
 * -EAGAIN when data remains, another -errno on a broken connection. */
int rp_tx_flush(struct rp_tx *tx, int sock);
static inline bool rp_tx_empty(const struct rp_tx *tx) { return tx->head == NULL; }
