/* SPDX-License-Identifier: Apache-2.0 */
/* The directory regend's sockets and state files live in: the main
 * socket's own (/run/regen). Whoever can change what is in it can put a
 * socket of theirs where a worker's goes and receive clients' memfds, or
 * make regend write where they choose. So regend makes it when it is
 * missing, and uses it only when nobody but regend's user and root can
 * change it: a directory, not a symlink to one, owned by regend's uid or
 * root, writable by neither its group nor others. What regend does in it
 * afterwards goes through the fd it opened and checked (openat, fstatat,
 * unlinkat, renameat, fchownat), never through the path again, but for
 * bind(), which takes no directory fd: a socket bound by its path is looked
 * for in the directory after (daemon/listen.c). A file gets its mode when
 * it is made (umask around bind, open's mode), never by chmod. */
#pragma once

#include <stddef.h>

/* Opens the directory of socket_path (made, with its missing parents,
 * 0755), checks it, and returns its fd (O_CLOEXEC), or -errno with a
 * sentence in why that says what is wrong with it and what to do. */
int rd_socket_dir_open(const char *socket_path, char *why, size_t why_size);
/* socket_path's last component: its name in that directory. */
const char *rd_socket_dir_name(const char *socket_path);
