/* SPDX-License-Identifier: Apache-2.0 */
/* Varlink framing: NUL-terminated JSON messages on a Unix stream socket,
 * with SCM_RIGHTS fds on the first byte of the message that uses them.
 *
 * The receiver works eagerly: every byte is looked at once, when it is fed.
 * Complete messages are copied into a queue that rp_rx_next() pops; only
 * the message still arriving is buffered, and only up to RP_MESSAGE_MAX
 * bytes, after which it is dropped as it streams in. */
#include <errno.h>
#include <fcntl.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/uio.h>
#include <unistd.h>

#include "frame.h"

/* SCM_MAX_FD: the most fds one sendmsg() may carry. One recvmsg() never
 * returns the fds of two sendmsg() calls, so this is all one read can hold,
 * and MSG_CTRUNC only happens when the kernel refuses an fd. */
#define FDS_PER_READ_MAX 253
#define READ_CHUNK RP_RX_READ_CHUNK
/* Keep a buffer this big between messages; a bigger one goes back. */
#define BUF_KEEP 65536

/* The fds of the message being received. */
struct rp_fd_batch {
	size_t nfds;
	size_t dropped;
	int fds[RP_FDS_MAX];
};

struct rp_rx_item {
	struct rp_rx_item *next;
	int result;                 /* enum rp_rx_result */
	struct rp_msg msg;
};

static void close_fds(const int *fds, size_t n)
{
	for (size_t i = 0; i < n; i++) {
		if (fds[i] >= 0)
			close(fds[i]);
	}
}

static void msg_reset(struct rp_msg *msg)
{
	msg->text = NULL;
	msg->len = 0;
	msg->nfds = 0;
	msg->fds_dropped = 0;
	for (size_t i = 0; i < RP_FDS_MAX; i++)
		msg->fds[i] = -1;
}

void rp_msg_finish(struct rp_msg *msg)
{
	if (msg == NULL)
		return;
	free(msg->text);
	/* Only the first nfds are ours: callers zero-initialise rp_msg, and
	 * fd 0 beyond nfds is not something to close. */
	close_fds(msg->fds, msg->nfds < RP_FDS_MAX ? msg->nfds : RP_FDS_MAX);
	msg_reset(msg);
}

void rp_rx_init(struct rp_rx *rx)
{
	memset(rx, 0, sizeof(*rx));
}

static void batch_drop(struct rp_rx *rx)
{
	if (rx->batches == NULL)
		return;
	close_fds(rx->batches->fds, rx->batches->nfds);
	free(rx->batches);
	rx->batches = NULL;
	rx->nbatches = 0;
}

void rp_rx_finish(struct rp_rx *rx)
{
	struct rp_rx_item *item, *next;

	for (item = rx->head; item != NULL; item = next) {
		next = item->next;
		rp_msg_finish(&item->msg);
		free(item);
	}
	batch_drop(rx);
	free(rx->buf);
	rp_rx_init(rx);
}

/* Gives the current message its fds. A message gets fds from one read only
 * (the one holding its first byte), so the merge is for robustness. */
static void batch_attach(struct rp_rx *rx, struct rp_fd_batch *b)
{
	struct rp_fd_batch *cur = rx->batches;

	if (cur == NULL) {
		rx->batches = b;
		rx->nbatches = 1;
		return;
	}
	for (size_t i = 0; i < b->nfds; i++) {
		if (cur->nfds < RP_FDS_MAX) {
			cur->fds[cur->nfds++] = b->fds[i];
		} else {
			close(b->fds[i]);
			cur->dropped++;
		}
	}
	cur->dropped += b->dropped;
	free(b);
}

static int buf_append(struct rp_rx *rx, const char *p, size_t n)
{
	if (n == 0)
		return 0;
	if (rx->len + n > rx->cap) {
		size_t cap = rx->cap ? rx->cap : 256;
		char *nb;

		while (cap < rx->len + n)
			cap *= 2;
		if (cap > RP_MESSAGE_MAX)
			cap = RP_MESSAGE_MAX;
		nb = realloc(rx->buf, cap);
		if (nb == NULL)
			return -ENOMEM;
		rx->buf = nb;
		rx->cap = cap;
	}
	memcpy(rx->buf + rx->len, p, n);
	rx->len += n;
	return 0;
}

/* The memory a queued message holds, for rx->held_bytes. */
static size_t item_bytes(const struct rp_rx_item *item)
{
	return sizeof(*item) + (item->msg.text != NULL ? item->msg.len + 1 : 0);
}

/* The NUL of the current message arrived: queue it (or its TOO_LARGE
 * report) and start the next one at stream offset `next_offset`. */
static int complete(struct rp_rx *rx, uint64_t next_offset)
{
	struct rp_rx_item *item = calloc(1, sizeof(*item));

	if (item == NULL)
		return -ENOMEM;
	msg_reset(&item->msg);
	if (rx->discarding) {
		item->result = RP_RX_TOO_LARGE;
		item->msg.len = rx->discarded_bytes;
	} else {
		item->result = RP_RX_MESSAGE;
		item->msg.text = malloc(rx->len + 1);
		if (item->msg.text == NULL) {
			free(item);
			return -ENOMEM;
		}
		if (rx->len > 0)
			memcpy(item->msg.text, rx->buf, rx->len);
		item->msg.text[rx->len] = '\0';
		item->msg.len = rx->len;
		if (rx->batches != NULL) {
			memcpy(item->msg.fds, rx->batches->fds, rx->batches->nfds * sizeof(int));
			item->msg.nfds = rx->batches->nfds;
			item->msg.fds_dropped = rx->batches->dropped;
			free(rx->batches);
			rx->batches = NULL;
			rx->nbatches = 0;
		}
	}
	if (rx->tail != NULL)
		rx->tail->next = item;
	else
		rx->head = item;
	rx->tail = item;
	rx->held_bytes += item_bytes(item);
	rx->held_fds += item->msg.nfds;

	rx->len = 0;
	if (rx->cap > BUF_KEEP) {
		free(rx->buf);
		rx->buf = NULL;
		rx->cap = 0;
	}
	rx->discarding = false;
	rx->discarded_bytes = 0;
	rx->buf_offset = next_offset;
	return 0;
}

/* Sorts the fds of one read into a batch, and finds where their message
 * starts in p: the last message that starts within these bytes (see
 * rp_rx_read in frame.h for why the last). Returns -ENOMEM with every fd
 * closed; *target = SIZE_MAX (fds closed) when no message starts here. */
static int batch_for_read(struct rp_rx *rx, const char *p, size_t n, const int *fds, size_t nfds,
			  size_t truncated, struct rp_fd_batch **out, size_t *target)
{
	struct rp_fd_batch *b;
	const char *nul;

	*out = NULL;
	*target = SIZE_MAX;
	if (nfds == 0 && truncated == 0)
		return 0;

	/* A message starts after every NUL but the last byte's, and at p[0]
	 * when nothing of the current message has arrived yet. */
	nul = n > 1 ? memrchr(p, '\0', n - 1) : NULL;
	if (nul != NULL)
		*target = (size_t)(nul - p) + 1;
	else if (n > 0 && !rx->discarding && rx->len == 0)
		*target = 0;
	if (*target == SIZE_MAX) {
		close_fds(fds, nfds);
		return 0;
	}

	b = calloc(1, sizeof(*b));
	if (b == NULL) {
		close_fds(fds, nfds);
		return -ENOMEM;
	}
	for (size_t i = 0; i < nfds; i++) {
		if (b->nfds < RP_FDS_MAX) {
			b->fds[b->nfds++] = fds[i];
		} else {
			close(fds[i]);
			b->dropped++;
		}
	}
	b->dropped += truncated;
	*out = b;
	return 0;
}

static int feed(struct rp_rx *rx, const char *p, size_t n, const int *fds, size_t nfds, size_t truncated)
{
	struct rp_fd_batch *fb;
	size_t target, pos = 0;
	int r;

	r = batch_for_read(rx, p, n, fds, nfds, truncated, &fb, &target);
	if (r < 0)
		return r;
	if (target == 0) {
		batch_attach(rx, fb);
		fb = NULL;
	}

	while (pos < n) {
		const char *nul = memchr(p + pos, '\0', n - pos);
		size_t seg = nul != NULL ? (size_t)(nul - (p + pos)) : n - pos;

		if (rx->discarding) {
			rx->discarded_bytes += seg;
		} else if (seg > RP_MESSAGE_MAX - rx->len) {
			/* Over the limit: forget what we have and skip to the
			 * NUL, so a peer cannot make us hold more than the limit. */
			rx->discarding = true;
			rx->discarded_bytes = rx->len + seg;
			rx->len = 0;
			free(rx->buf);
			rx->buf = NULL;
			rx->cap = 0;
			batch_drop(rx);
		} else {
			r = buf_append(rx, p + pos, seg);
			if (r < 0)
				goto error;
		}
		pos += seg;
		if (nul == NULL)
			break;
		pos++;
		r = complete(rx, rx->scan_offset + pos);
		if (r < 0)
			goto error;
		if (fb != NULL && pos == target) {
			batch_attach(rx, fb);
			fb = NULL;
		}
	}
	rx->scan_offset += n;
	return 0;

error:
	if (fb != NULL) {
		close_fds(fb->fds, fb->nfds);
		free(fb);
	}
	return r;
}

int rp_rx_feed(struct rp_rx *rx, const void *data, size_t len, const int *fds, size_t nfds)
{
	return feed(rx, data, len, fds, nfds, 0);
}

ssize_t rp_rx_read(struct rp_rx *rx, int sock)
{
	char data[READ_CHUNK];
	union {
		char buf[CMSG_SPACE(sizeof(int) * FDS_PER_READ_MAX)];
		struct cmsghdr align;
	} control;
	struct iovec iov = { .iov_base = data, .iov_len = sizeof(data) };
	struct msghdr mh = {
		.msg_iov = &iov,
		.msg_iovlen = 1,
		.msg_control = control.buf,
		.msg_controllen = sizeof(control.buf),
	};
	int fds[FDS_PER_READ_MAX];
	size_t nfds = 0, truncated = 0;
	struct cmsghdr *cmsg;
	ssize_t n;
	int r;

	do {
		n = recvmsg(sock, &mh, MSG_CMSG_CLOEXEC);
	} while (n < 0 && errno == EINTR);
	if (n < 0)
		return -errno;

	for (cmsg = CMSG_FIRSTHDR(&mh); cmsg != NULL; cmsg = CMSG_NXTHDR(&mh, cmsg)) {
		size_t k;

		if (cmsg->cmsg_level != SOL_SOCKET || cmsg->cmsg_type != SCM_RIGHTS)
			continue;
		k = (cmsg->cmsg_len - CMSG_LEN(0)) / sizeof(int);
		for (size_t i = 0; i < k; i++) {
			int fd;

			memcpy(&fd, CMSG_DATA(cmsg) + i * sizeof(int), sizeof(int));
			if (nfds < FDS_PER_READ_MAX)
				fds[nfds++] = fd;
			else
				close(fd);
		}
	}
	if (mh.msg_flags & MSG_CTRUNC) {
		/* Some fds were lost and we cannot tell which: hand none over,
		 * so the message is refused instead of acted on half-armed. */
		truncated = nfds + 1;
		close_fds(fds, nfds);
		nfds = 0;
	}
	if (n == 0) {
		close_fds(fds, nfds);
		return 0;
	}
	r = feed(rx, data, (size_t)n, fds, nfds, truncated);
	return r < 0 ? r : n;
}

int rp_rx_next(struct rp_rx *rx, struct rp_msg *msg)
{
	struct rp_rx_item *item = rx->head;
	int result;

	if (item == NULL) {
		msg_reset(msg);
		return RP_RX_NONE;
	}
	rx->head = item->next;
	if (rx->head == NULL)
		rx->tail = NULL;
	rx->held_bytes -= item_bytes(item);
	rx->held_fds -= item->msg.nfds;
	*msg = item->msg;
	result = item->result;
	free(item);
	return result;
}

struct rp_tx_item {
	struct rp_tx_item *next;
	size_t len;                 /* with the NUL */
	size_t sent;
	size_t nfds;                /* 0 once they went out */
	int fds[RP_FDS_MAX];
	char data[];
};

void rp_tx_init(struct rp_tx *tx)
{
	memset(tx, 0, sizeof(*tx));
}

void rp_tx_finish(struct rp_tx *tx)
{
	struct rp_tx_item *item, *next;

	for (item = tx->head; item != NULL; item = next) {
		next = item->next;
		close_fds(item->fds, item->nfds);
		free(item);
	}
	rp_tx_init(tx);
}

int rp_tx_push(struct rp_tx *tx, const char *text, size_t len, const int *fds, size_t nfds)
{
	struct rp_tx_item *item;
	int r;

	if (nfds > RP_FDS_MAX || (nfds > 0 && fds == NULL) || (len > 0 && text == NULL))
		return -EINVAL;
	/* A NUL inside would end the message early on the wire. */
	if (len > 0 && memchr(text, '\0', len) != NULL)
		return -EINVAL;
	if (len > SIZE_MAX - sizeof(*item) - 1)
		return -ENOMEM;
	item = malloc(sizeof(*item) + len + 1);
	if (item == NULL)
		return -ENOMEM;
	item->next = NULL;
	item->len = len + 1;
	item->sent = 0;
	item->nfds = 0;
	if (len > 0)
		memcpy(item->data, text, len);
	item->data[len] = '\0';
	for (size_t i = 0; i < nfds; i++) {
		int fd = fcntl(fds[i], F_DUPFD_CLOEXEC, 3);

		if (fd < 0) {
			r = -errno;
			goto error;
		}
		item->fds[item->nfds++] = fd;
	}

	if (tx->tail != NULL)
		tx->tail->next = item;
	else
		tx->head = item;
	tx->tail = item;
	tx->queued_bytes += item->len;
	tx->held_bytes += sizeof(*item) + item->len;
	return 0;

error:
	close_fds(item->fds, item->nfds);
	free(item);
	return r;
}

/* Messages without fds that go out in one sendmsg(). */
#define TX_BATCH 64

int rp_tx_flush(struct rp_tx *tx, int sock)
{
	while (tx->head != NULL) {
		union {
			char buf[CMSG_SPACE(sizeof(int) * RP_FDS_MAX)];
			struct cmsghdr align;
		} control;
		struct iovec iov[TX_BATCH];
		struct msghdr mh = { .msg_iov = iov };
		struct rp_tx_item *item = tx->head;
		ssize_t n;

		/* Each message with fds goes out in sendmsg() calls of its own,
		 * so the fds sit on its first byte and on no other message's
		 * bytes. Messages without fds that follow one another go out
		 * together: one system call for a whole batch of replies. */
		if (item->nfds > 0) {
			struct cmsghdr *cmsg;

			iov[0] = (struct iovec){ .iov_base = item->data + item->sent, .iov_len = item->len - item->sent };
			mh.msg_iovlen = 1;
			memset(&control, 0, sizeof(control));
			mh.msg_control = control.buf;
			mh.msg_controllen = CMSG_SPACE(sizeof(int) * item->nfds);
			cmsg = CMSG_FIRSTHDR(&mh);
			cmsg->cmsg_level = SOL_SOCKET;
			cmsg->cmsg_type = SCM_RIGHTS;
			cmsg->cmsg_len = CMSG_LEN(sizeof(int) * item->nfds);
			memcpy(CMSG_DATA(cmsg), item->fds, sizeof(int) * item->nfds);
		} else {
			for (struct rp_tx_item *it = item; it != NULL && it->nfds == 0 && mh.msg_iovlen < TX_BATCH;
			     it = it->next) {
				iov[mh.msg_iovlen++] =
					(struct iovec){ .iov_base = it->data + it->sent, .iov_len = it->len - it->sent };
			}
		}
		do {
			n = sendmsg(sock, &mh, MSG_NOSIGNAL);
		} while (n < 0 && errno == EINTR);
		if (n < 0)
			return -errno;
		if (n == 0)
			return -EAGAIN;
		if (item->nfds > 0) {
			/* They went with the first byte that went. */
			close_fds(item->fds, item->nfds);
			item->nfds = 0;
		}
		tx->queued_bytes -= (size_t)n;
		/* Account the bytes written to the messages in order. */
		while (n > 0) {
			size_t left = item->len - item->sent;

			if ((size_t)n < left) {
				item->sent += (size_t)n;
				break;
			}
			n -= (ssize_t)left;
			tx->head = item->next;
			if (tx->head == NULL)
				tx->tail = NULL;
			tx->held_bytes -= sizeof(*item) + item->len;
			free(item);
			item = tx->head;
		}
	}
	return 0;
}
