/* SPDX-License-Identifier: Apache-2.0 */
/* Escaping a peer's text for people to read (text.h). */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "text.h"

/* The code point of the UTF-8 sequence at s (up to the end of s), and its
 * length in *len; -1 with *len 1 for a byte that starts no valid sequence
 * (overlong forms, surrogates and values past U+10FFFF included). */
static int32_t decode(const unsigned char *s, size_t *len)
{
	int32_t c;
	size_t n;

	*len = 1;
	if (s[0] < 0x80)
		return s[0];
	if (s[0] >= 0xc2 && s[0] <= 0xdf)
		n = 2, c = s[0] & 0x1f;
	else if (s[0] >= 0xe0 && s[0] <= 0xef)
		n = 3, c = s[0] & 0x0f;
	else if (s[0] >= 0xf0 && s[0] <= 0xf4)
		n = 4, c = s[0] & 0x07;
	else
		return -1;
	for (size_t i = 1; i < n; i++) {
		if ((s[i] & 0xc0) != 0x80)
			return -1;
		c = (c << 6) | (s[i] & 0x3f);
	}
	if ((n == 3 && c < 0x800) || (n == 4 && (c < 0x10000 || c > 0x10ffff)) || (c >= 0xd800 && c <= 0xdfff))
		return -1;
	*len = n;
	return c;
}

static bool reorders(int32_t c)
{
	return c == 0x061c || c == 0x200e || c == 0x200f || (c >= 0x202a && c <= 0x202e) || (c >= 0x2066 && c <= 0x2069);
}

/* Whether code point c (or -1: not UTF-8) is escaped. */
static bool escaped(int32_t c)
{
	return c < 0x20 || c == 0x7f || (c >= 0x80 && c <= 0x9f) || reorders(c);
}

/* The escape of c in style (c escaped(); the sequence's first byte for -1). */
static int escape_of(int32_t c, unsigned char byte, enum rp_text_style style, char *buf, size_t size)
{
	const char *slash = style == RP_TEXT_LABEL ? "\\\\" : "\\";

	if (style == RP_TEXT_LABEL && c == '\n')
		return snprintf(buf, size, "\\n");
	if (style == RP_TEXT_JSON)
		return c < 0 ? snprintf(buf, size, "\\ufffd") : snprintf(buf, size, "\\u%04x", (unsigned)c);
	if (c == '\n' || c == '\t' || c == '\r')
		return snprintf(buf, size, "%s%c", slash, c == '\n' ? 'n' : c == '\t' ? 't' : 'r');
	if (c < 0 || c < 0x80)
		return snprintf(buf, size, "%sx%02x", slash, c < 0 ? byte : (unsigned)c);
	return snprintf(buf, size, "%su%04x", slash, (unsigned)c);
}

size_t rp_text_escape(const char *in, enum rp_text_style style, char *out, size_t size)
{
	const unsigned char *s = (const unsigned char *)(in ? in : "");
	size_t o = 0;

	while (*s) {
		char esc[16];
		size_t len, n;
		int32_t c = decode(s, &len);

		if (escaped(c) || (style == RP_TEXT_LABEL && (c == '\\' || c == '"'))) {
			if (style == RP_TEXT_LABEL && (c == '\\' || c == '"'))
				n = (size_t)snprintf(esc, sizeof(esc), "\\%c", c);
			else
				n = (size_t)escape_of(c, s[0], style, esc, sizeof(esc));
		} else {
			memcpy(esc, s, len);
			n = len;
		}
		if (o + n >= size)
			break;
		memcpy(out + o, esc, n);
		o += n;
		s += len;
	}
	out[o] = '\0';
	return o;
}

char *rp_text_escape_dup(const char *in, enum rp_text_style style)
{
	/* At most 8 bytes out ("\\\\u202e", "\\ufffd") per byte in. */
	size_t size = 8 * strlen(in ? in : "") + 1;
	char *out = malloc(size);

	if (out)
		rp_text_escape(in, style, out, size);
	return out;
}

bool rp_text_is_plain(const char *in)
{
	const unsigned char *s = (const unsigned char *)(in ? in : "");

	while (*s) {
		size_t len;

		if (escaped(decode(s, &len)))
			return false;
		s += len;
	}
	return true;
}
