/* SPDX-License-Identifier: Apache-2.0 */
/* The job a client runs for, read from its /proc/PID/cgroup: Slurm's job_N
 * and the kubelet's pod UID (cgroupfs and systemd drivers, v1 and v2), and
 * nothing from paths that only look alike. */
#include <check.h>
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
		rd_peer_job_from_cgroup(cases[i].cgroup, job, sizeof(job));
		ck_assert_msg(strcmp(job, cases[i].job) == 0, "%s -> '%s', want '%s'", cases[i].cgroup, job, cases[i].job);
	}
}
END_TEST

START_TEST(test_truncates)
{
	char job[8];

	rd_peer_job_from_cgroup("0::/slurm/job_123456789/step_0\n", job, sizeof(job));
	ck_assert_str_eq(job, "slurm:1");
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
	suite_add_tcase(s, tc);
	sr = srunner_create(s);
	srunner_run_all(sr, CK_NORMAL);
	failed = srunner_ntests_failed(sr);
	srunner_free(sr);
	return failed ? EXIT_FAILURE : EXIT_SUCCESS;
}
