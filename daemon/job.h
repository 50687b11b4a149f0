/* SPDX-License-Identifier: Apache-2.0 */
/* Which job a connection works for. Two words may name it: the kernel's
 * (the client's cgroup, rd_peer.job, read at connect) and the client's own
 * (io.regen.SetJob, kept in rd_conn.job for the connection). The cgroup's
 * names the connection wherever there is one, so that no client can put
 * its work under another job's name; the stated one names it where the
 * cgroup says nothing (a shell, a scheduler's prolog, a container regend
 * does not recognise), and is shown beside the cgroup's where the two
 * differ. Neither decides any right: ids are bound to the process and
 * admin rights to its credentials (daemon/peer.h). */
#pragma once

#include <stddef.h>
#include "daemon/conn.h"
#include "proto/job.h"

/* The job that names the connection (*job: "" for none) and where it
 * comes from: RP_JOB_CGROUP, RP_JOB_CLIENT or RP_JOB_NONE. */
enum rp_job_source rd_job_of(const struct rd_conn *conn, const char **job);

/* The job in words, for lifecycle reasons and log lines: "slurm:4242",
 * "stated: train-7", "slurm:4242, stated: train-7" (both, where they
 * differ), or "" for none. Returns buf. */
const char *rd_job_describe(const struct rd_conn *conn, char *buf, size_t len);

/* io.regen.SetJob on either socket: checks the parameters, sets (or, with
 * `job` absent, forgets) the connection's stated job and answers with the
 * job that names it now. < 0: the call failed (io.regen.InvalidJob for a
 * job the rule refuses, InvalidParameter for the wrong type) and nothing
 * changed. Either way `call` is answered and may be gone on return. */
int rd_job_set(struct rd_call *call);
