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

struct rp_fd_batch;

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
};

void rp_rx_init(struct rp_rx *rx);
/* Frees buffers and closes every fd not yet handed out. */
void rp_rx_finish(struct rp_rx *rx);

/* One recvmsg() on a non-blocking or blocking socket. Returns bytes read
 * (> 0), 0 on end of stream, or -errno (-EAGAIN when nothing is ready).
 * Received fds are attached to the first message that starts within the
 * bytes of this read, as the sender sent them with that message's first byte. */
ssize_t rp_rx_read(struct rp_rx *rx, int sock);

/* Append bytes as if read from the socket, with fds (may be NULL/0) that
 * arrived with them. For tests and fuzzing. Returns 0 or -ENOMEM. */
int rp_rx_feed(struct rp_rx *rx, const void *data, size_t len, const int *fds, size_t nfds);

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
	int fds[RP_FDS_MAX];
	size_t nfds;
};
void rp_msg_finish(struct rp_msg *msg);   /* frees text, closes fds still >= 0 */

/* Pops the next complete message. Returns enum rp_rx_result or -ENOMEM.
 * An oversized message is reported once when its terminating NUL arrives;
 * until then its bytes are dropped as they come, so memory stays bounded. */
int rp_rx_next(struct rp_rx *rx, struct rp_msg *msg);

/* Outgoing queue with partial-write handling. Each message's fds go with
 * its first byte. */
struct rp_tx_item;
struct rp_tx {
	struct rp_tx_item *head, *tail;
	size_t queued_bytes;
};

void rp_tx_init(struct rp_tx *tx);
void rp_tx_finish(struct rp_tx *tx);       /* drops queued messages, closes their fds */
/* Queues `text` (len bytes, a NUL is appended on the wire) and dups fds.
 * Returns 0, -EINVAL for too many fds, -ENOMEM. */
int rp_tx_push(struct rp_tx *tx, const char *text, size_t len, const int *fds, size_t nfds);
/* Writes as much as the socket takes. Returns 0 when the queue is empty,
 * -EAGAIN when data remains, another -errno on a broken connection. */
int rp_tx_flush(struct rp_tx *tx, int sock);
static inline bool rp_tx_empty(const struct rp_tx *tx) { return tx->head == NULL; }
