/* Device states, as io.regen.Device.State names them; docs/lifecycle.md
 * draws the transitions. The supervisor holds each device's state
 * (daemon/supervisor/device.c); a worker knows only whether it serves. */
#pragma once

enum rd_state {
	RD_STATE_READY = 0,     /* serving */
	RD_STATE_DRAINING,      /* a Release/Restart refuses new work and waits for the calls in flight */
	RD_STATE_RELEASED,      /* the worker destroys its resources properly (CUDA usable) */
	RD_STATE_FAULTED,       /* the worker reported a lost context; a reset follows */
	RD_STATE_RESETTING,     /* the context is thrown away and rebuilt in process */
	RD_STATE_RESPAWNING,    /* the worker process is being replaced, or starts for the first time */
	/* The health monitor (issue 10) adds its two here, and to the names
	 * below and io.regen.Device.State: UNRESPONSIVE (no heartbeat; goes on
	 * to RESPAWNING) and FAILED (the GPU needs a reset or fell off the
	 * bus; no respawn loop). */
	RD_STATE_COUNT,
};

static inline const char *rd_state_name(enum rd_state s)
{
	static const char *const names[RD_STATE_COUNT] = {
		"ready", "draining", "released", "faulted", "resetting", "respawning",
	};
	return (unsigned)s < RD_STATE_COUNT ? names[s] : "unknown";
}
