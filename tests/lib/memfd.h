/* SPDX-License-Identifier: Apache-2.0 */
/* Host memory a test shares with a worker: a memfd, mapped. */
#pragma once

#include <stddef.h>

struct tl_memfd {
	int fd;
	size_t size;
	unsigned char *ptr;
};

/* A zeroed memfd of size bytes, sealed against shrinking, mapped read-write
 * (fails the test on error). */
void tl_memfd_create(struct tl_memfd *m, size_t size);
/* Only the fd of a zeroed memfd of size bytes, not mapped, sealed against
 * shrinking as regend requires of a host_fd. */
int tl_memfd_open(size_t size);
/* The same without the seal: regend must refuse it. */
int tl_memfd_open_unsealed(size_t size);
/* Unmaps and closes; accepts one destroyed already or zeroed with fd -1. */
void tl_memfd_destroy(struct tl_memfd *m);
