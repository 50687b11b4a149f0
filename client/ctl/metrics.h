/* SPDX-License-Identifier: Apache-2.0 */
/* regenctl metrics: a Status reply as Prometheus text exposition format
 * (version 0.0.4), for node_exporter's textfile collector or a scrape
 * through a small wrapper. */
#pragma once

#include <stdio.h>
#include <cjson/cJSON.h>

/* Writes every metric of the reply (io.regen.Device.Status's parameters,
 * its devices and what it keeps for ranks) to f. Fields a regend does not send (an older one, a device without
 * health yet) are left out, never written as 0. hostname: the node's name
 * as dcgm-exporter gives it (its Hostname label). */
void ctl_metrics_write(FILE *f, const cJSON *status, const char *hostname);
