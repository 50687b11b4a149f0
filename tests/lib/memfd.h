/* Host memory a test shares with a worker: a memfd, mapped. */
#pragma once

#include <stddef.h>

struct tl_memfd {
	int fd;
	size_t size;
	unsigned char *ptr;
};

/* A zeroed memfd of size bytes, mapped read-write (fails the test on error). */
void tl_memfd_create(struct tl_memfd *m, size_t size);
/* Only the fd of a zeroed memfd of size bytes, not mapped. */
int tl_memfd_open(size_t size);
/* Unmaps and closes; accepts one destroyed already or zeroed with fd -1. */
void tl_memfd_destroy(struct tl_memfd *m);
