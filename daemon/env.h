/* SPDX-License-Identifier: Apache-2.0 */
/* Tuning knobs read from the environment, parsed one way wherever they are
 * read. Each caller reads its knob once and keeps the value. */
#pragma once

#include <stdint.h>

/* $name as whole microseconds from 0 to 10 s (as strtol reads it: text
 * that is no number reads as 0), in nanoseconds; fallback when it is unset
 * or outside that range. */
uint64_t rd_env_us_as_ns(const char *name, uint64_t fallback);
