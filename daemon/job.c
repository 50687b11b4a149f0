/* SPDX-License-Identifier: Apache-2.0 */
#include <errno.h>
#include <stdio.h>
#include <string.h>
#include "daemon/job.h"
#include "proto/params.h"

enum rp_job_source rd_job_of(const struct rd_conn *conn, const char **job)
{
	if (conn->peer.job[0]) {
		*job = conn->peer.job;
		return RP_JOB_CGROUP;
	}
	*job = conn->job;
	return conn->job[0] ? RP_JOB_CLIENT : RP_JOB_NONE;
}

const char *rd_job_describe(const struct rd_conn *conn, char *buf, size_t len)
{
	const char *cgroup = conn->peer.job, *stated = conn->job;

	if (stated[0] && strcmp(stated, cgroup) != 0)
		snprintf(buf, len, "%s%sstated: %s", cgroup, cgroup[0] ? ", " : "", stated);
	else
		snprintf(buf, len, "%s", cgroup);
	return buf;
}

int rd_job_set(struct rd_call *call)
{
	static const struct rp_field fields[] = { { "job", RP_T_STRING, false }, { NULL } };
	const cJSON *param = cJSON_GetObjectItemCaseSensitive(call->msg.params, "job");
	struct rp_error err = { 0 };
	const char *job = NULL, *named;
	enum rp_job_source source;
	cJSON *reply;

	/* An empty string is the rule's to refuse (InvalidJob), not the
	 * getter's. */
	if (rp_params_check(call->msg.params, fields, &err) < 0) {
		rd_call_fail(call, &err);
		return -EINVAL;
	}
	if (cJSON_IsString(param))
		job = param->valuestring;
	if (job && rp_job_check(job, &err) < 0) {
		rd_call_fail(call, &err);
		return -EINVAL;
	}
	snprintf(call->conn->job, sizeof(call->conn->job), "%s", job ? job : "");
	source = rd_job_of(call->conn, &named);
	reply = cJSON_CreateObject();
	cJSON_AddStringToObject(reply, "job", named);
	cJSON_AddStringToObject(reply, "source", rp_job_source_name(source));
	rd_call_reply(call, reply, false);
	return 0;
}
