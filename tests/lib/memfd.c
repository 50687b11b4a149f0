/* SPDX-License-Identifier: Apache-2.0 */
/* Host memory; see memfd.h. */
#include <errno.h>
#include <fcntl.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>
#include "tests/lib/asserts.h"
#include "tests/lib/memfd.h"

int tl_memfd_open_unsealed(size_t size)
{
	int fd = memfd_create("regen-test", MFD_CLOEXEC | MFD_ALLOW_SEALING);

	ASSERT(fd >= 0, "memfd_create: %s", strerror(errno));
	ASSERT(ftruncate(fd, (off_t)size) == 0, "ftruncate %zu: %s", size, strerror(errno));
	return fd;
}

int tl_memfd_open(size_t size)
{
	int fd = tl_memfd_open_unsealed(size);

	ASSERT(fcntl(fd, F_ADD_SEALS, F_SEAL_SHRINK) == 0, "F_SEAL_SHRINK: %s", strerror(errno));
	return fd;
}

void tl_memfd_create(struct tl_memfd *m, size_t size)
{
	memset(m, 0, sizeof(*m));
	m->fd = tl_memfd_open(size);
	m->ptr = mmap(NULL, size, PROT_READ | PROT_WRITE, MAP_SHARED, m->fd, 0);
	ASSERT(m->ptr != MAP_FAILED, "mmap %zu: %s", size, strerror(errno));
	m->size = size;
}

void tl_memfd_destroy(struct tl_memfd *m)
{
	if (m->ptr != NULL && m->ptr != MAP_FAILED) {
		munmap(m->ptr, m->size);
	}
	if (m->fd >= 0) {
		close(m->fd);
	}
	memset(m, 0, sizeof(*m));
	m->fd = -1;
}
