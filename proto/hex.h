/* SPDX-License-Identifier: Apache-2.0 */
/* Bytes as hex text and back: the one codec behind the 64-byte CUDA IPC
 * handles (memory.h) and NCCL's 128-byte unique ids (comm.h). */
#pragma once

#include <stddef.h>

/* Exactly 2n hex digits, either case, into n bytes. 0, or -EINVAL for
 * another length or a character that is not a hex digit (out is then
 * unspecified). */
int rp_hex_decode(const char *hex, unsigned char *out, size_t n);
/* n bytes as 2n lowercase hex digits and a NUL (out holds 2n + 1).
 * Returns out. */
char *rp_hex_encode(const unsigned char *in, size_t n, char *out);
