/* SPDX-License-Identifier: Apache-2.0 */
/* Text a client (or any peer) wrote, made safe to show: on a terminal, in a
 * log line, inside JSON that a person reads. What it escapes is what a
 * terminal or a reader would act on instead of showing: C0 control
 * characters (a line feed forges a line, ESC starts a terminal sequence),
 * DEL, the C1 controls U+0080..U+009F (CSI, OSC as one character: some
 * terminals act on them in UTF-8 too), the characters that reorder text
 * (U+061C, U+200E, U+200F, U+202A..U+202E, U+2066..U+2069: "Trojan source"),
 * and bytes that are not UTF-8. Everything else is kept as it is. One rule
 * for every output: regend's log lines, regenctl's terminal and JSON
 * output, its metrics. */
#pragma once

#include <stdbool.h>
#include <stddef.h>

enum rp_text_style {
	/* \n, \t, \r, \xNN for the other C0, DEL and bytes that are not
	 * UTF-8, \uXXXX for C1 and the reordering characters. */
	RP_TEXT_LINE,
	/* Inside a JSON string as cJSON writes it (C0, quote and backslash
	 * escaped already): DEL, C1 and the reordering characters as \uXXXX,
	 * bytes that are not UTF-8 as \ufffd. Still valid JSON that reads
	 * back as the same text. */
	RP_TEXT_JSON,
	/* A Prometheus label value: backslash, quote and line feed as the
	 * exposition format escapes them (\\, \", \n), the rest of
	 * RP_TEXT_LINE's with a doubled backslash (\\x1b), which the format
	 * reads back as the escape's own characters. */
	RP_TEXT_LABEL,
};

/* Writes `in` escaped into out (size > 0, always NUL-terminated; cut at a
 * whole escape or character when it does not fit). Returns the length
 * written. in may be NULL ("" then). */
size_t rp_text_escape(const char *in, enum rp_text_style style, char *out, size_t size);
/* The same into a malloc'ed string that fits (NULL on ENOMEM). */
char *rp_text_escape_dup(const char *in, enum rp_text_style style);
/* Whether rp_text_escape would change `in` (no byte to escape). */
bool rp_text_is_plain(const char *in);
