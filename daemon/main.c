/* SPDX-License-Identifier: Apache-2.0 */
/* regend: the supervisor, or (with the internal --worker) one device's worker. */
#include "daemon/conn.h"
#include "daemon/env.h"
#include "daemon/log.h"
#include "daemon/notify.h"
#include "daemon/options.h"
#include "daemon/supervisor/supervisor.h"
#include "daemon/worker/worker.h"

int main(int argc, char **argv)
{
	struct rd_options opts;
	int r;

	r = rd_options_load(&opts, argc, argv);
	if (r != 0)
		return r > 0 ? 0 : 2;
	rd_log_init(opts.worker_device >= 0 ? "regend-worker" : "regend", rd_env(RD_ENV_DEBUG));
	rd_log_set_default_level(opts.log_level);
	rd_conn_set_message_timeout(opts.message_timeout_ms);
	if (opts.worker_device >= 0)
		return rd_worker_run(&opts);
	struct rd_passed_fds passed;
	rd_passed_fds_take(&passed);
	return rd_supervisor_run(&opts, &passed, argc, argv);
}
