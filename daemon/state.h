/* Device states, as io.regen.Device.State names them. */
#pragma once

enum rd_state {
	RD_STATE_READY = 0,
	RD_STATE_DRAINING,
	RD_STATE_RELEASED,
	RD_STATE_FAULTED,
	RD_STATE_RESETTING,
	RD_STATE_RESPAWNING,
};

static inline const char *rd_state_name(enum rd_state s)
{
	static const char *const names[] = { "ready", "draining", "released", "faulted", "resetting", "respawning" };
	return names[s];
}
