/* SPDX-License-Identifier: Apache-2.0 */
/* Generations that outlive regend itself.
 *
 * A client holds ids stamped with the generation they were made in and
 * knows a device's generation only ever grows: a StaleGeneration tells it
 * to wait for a newer one and import again. A regend that started again
 * (a crash, an upgrade, systemd's restart) would count from 1 once more,
 * and a rank that had seen generation 3 would wait for ever for "3 or
 * later", or send ids of generation 3 that the new regend cannot place.
 * So the supervisor keeps the epoch and every device's generation in a
 * file beside its socket (<socket>.generations: regend's runtime
 * directory, which lives until reboot) and a new regend goes on from there,
 * one generation later than the last it served. The file is read and
 * written in the socket's checked directory (daemon/socket_dir.h), made
 * anew under a name of its own (O_EXCL) and renamed over the old. */
#pragma once

#include <stdint.h>

/* Reads the file for the socket named socket_name in dir (absent,
 * unreadable, not ours or malformed: nothing changes, the counts start at
 * 1): *epoch and each of the n generations become one more than the
 * file's. Something there that is not a regular file (a FIFO, a device, a
 * directory) is refused: -EINVAL with why filled, and regend does not
 * start (it would wait on a FIFO for ever). */
int rd_sv_generations_load(int dir, const char *socket_name, uint64_t *epoch, uint64_t *generations, int n, char *why,
			   size_t why_size);
/* Writes the counts (atomically: a new file renamed over the old). A
 * failure is logged once; regend serves on. */
void rd_sv_generations_save(int dir, const char *socket_name, uint64_t epoch, const uint64_t *generations, int n);
