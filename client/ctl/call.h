/* SPDX-License-Identifier: Apache-2.0 */
/* regenctl call: one raw Varlink call on a socket, every reply printed as
 * it comes (one JSON line of its parameters), following "continues" when
 * the call asked for more. Debian 12's systemd has no varlinkctl. */
#pragma once

#include <stdbool.h>
#include <stddef.h>

/* 0 when the last reply came; -EREMOTE when regend answered an error (its
 * name in err_name, its parameters printed on stderr); -ETIMEDOUT after
 * timeout_s (0: none) without the next reply; -ECONNRESET when the
 * connection closed before it; another -errno when the socket could not
 * be reached. */
int ctl_call(const char *socket_path, const char *method, const char *params_json, bool more, double timeout_s,
	     char *err_name, size_t err_len);
