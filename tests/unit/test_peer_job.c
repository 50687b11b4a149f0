/* SPDX-License-Identifier: Apache-2.0 */
/* The job a client runs for, read from its /proc/PID/cgroup: Slurm's job_N
 * and the kubelet's pod UID (cgroupfs and systemd drivers, v1 and v2), and
 * nothing from paths that only look alike. */
#include <check.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "daemon/peer.h"

static const struct {
	const char *cgroup, *job;
} cases[] = {
	/* Slurm, cgroup v2 and v1. */
	{ "0::/system.slice/slurmstepd.scope/job_4242/step_0/user/task_0\n", "slurm:4242" },
	{ "12:memory:/slurm/uid_1000/job_77/step_batch\n11:devices:/slurm/uid_1000/job_77/step_batch\n", "slurm:77" },
	{ "0::/slurm/uid_1000/job_9\n", "slurm:9" },
	/* Kubernetes: systemd driver (underscores) and cgroupfs driver. */
	{ "0::/kubepods.slice/kubepods-besteffort.slice/kubepods-besteffort-pod0f1e2d3c_4b5a_6978_8a9b_0c1d2e3f4a5b.slice/"
	  "cri-containerd-abc.scope\n", "pod:0f1e2d3c-4b5a-6978-8a9b-0c1d2e3f4a5b" },
	{ "4:cpu:/kubepods/burstable/pod12345678-1234-1234-1234-123456789abc/deadbeef\n",
	  "pod:12345678-1234-1234-1234-123456789abc" },
	/* Neither. */
	{ "0::/user.slice/user-1000.slice/session-3.scope\n", "" },
	{ "0::/system.slice/job_runner.service\n", "" },
	{ "0::/home/job_12x/step\n", "" },
	{ "0::/pod12345678-1234-1234-1234-123456789abc/x\n", "" },
	{ "0::/kubepods/besteffort/podshort\n", "" },
	{ "", "" },
};

START_TEST(test_cases)
{
	char job[64];

	for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
		rd_peer_job_from_cgroup(cases[i].cgroup, job, sizeof(job), NULL);
		ck_assert_msg(strcmp(job, cases[i].job) == 0, "%s -> '%s', want '%s'", cases[i].cgroup, job, cases[i].job);
	}
}
END_TEST

START_TEST(test_truncates)
{
	char job[8];

	rd_peer_job_from_cgroup("0::/slurm/job_123456789/step_0\n", job, sizeof(job), NULL);
	ck_assert_str_eq(job, "slurm:1");
}
END_TEST

/* What the trust is asked: the line, cut after the job's component. */
static char asked[8][256];
static int nasked;

static bool trust_only_slurm_scope(const char *line, size_t path_end)
{
	snprintf(asked[nasked++ % 8], sizeof(asked[0]), "%.*s", (int)path_end, line);
	return strncmp(line, "0::/system.slice/slurmstepd.scope/", 34) == 0;
}

START_TEST(test_an_untrusted_directory_names_no_job)
{
	char job[64];

	nasked = 0;
	rd_peer_job_from_cgroup("0::/user.slice/user-1000.slice/user@1000.service/app.slice/job_4242/x\n", job,
				sizeof(job), trust_only_slurm_scope);
	ck_assert_str_eq(job, "");
	ck_assert_int_eq(nasked, 1);
	ck_assert_str_eq(asked[0], "0::/user.slice/user-1000.slice/user@1000.service/app.slice/job_4242");
	/* A later line that is trusted still names it. */
	nasked = 0;
	rd_peer_job_from_cgroup("4:pids:/user/job_1\n0::/system.slice/slurmstepd.scope/job_77/step_0\n", job,
				sizeof(job), trust_only_slurm_scope);
	ck_assert_str_eq(job, "slurm:77");
	ck_assert_int_eq(nasked, 2);
	ck_assert_str_eq(asked[0], "4:pids:/user/job_1");
	ck_assert_str_eq(asked[1], "0::/system.slice/slurmstepd.scope/job_77");
	nasked = 0;
	rd_peer_job_from_cgroup("4:cpu:/kubepods/burstable/pod12345678-1234-1234-1234-123456789abc/deadbeef\n", job,
				sizeof(job), trust_only_slurm_scope);
	ck_assert_str_eq(job, "");
	ck_assert_str_eq(asked[0], "4:cpu:/kubepods/burstable/pod12345678-1234-1234-1234-123456789abc");
}
END_TEST

int main(void)
{
	Suite *s = suite_create("peer_job");
	TCase *tc = tcase_create("core");
	SRunner *sr;
	int failed;

	tcase_add_test(tc, test_cases);
	tcase_add_test(tc, test_truncates);
	tcase_add_test(tc, test_an_untrusted_directory_names_no_job);
	suite_add_tcase(s, tc);
	sr = srunner_create(s);
	srunner_run_all(sr, CK_NORMAL);
	failed = srunner_ntests_failed(sr);
	srunner_free(sr);
	return failed ? EXIT_FAILURE : EXIT_SUCCESS;
}
