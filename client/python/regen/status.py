# SPDX-License-Identifier: Apache-2.0
"""io.regen.Device on the main socket (libregen's status.c): the node's
devices, their generations, and the lifecycle verbs."""

from . import errors

__all__ = ["StatusCalls"]


class StatusCalls:
    """The status part of :class:`regen.Client`."""

    def status(self):
        """{"epoch", "devices": [DeviceInfo...]} (see io.regen.Device)."""
        return self._main_call("io.regen.Device.Status")

    def generation(self):
        """{"epoch", "devices"}: cheap enough to poll."""
        return self._main_call("io.regen.Device.Generation")

    def device_info(self, device):
        for d in self.status()["devices"]:
            if d["index"] == device:
                return d
        raise errors.NoSuchDevice(parameters={"device": device, "message": f"no device {device}"})

    def info(self):
        """org.varlink.service.GetInfo."""
        return self._main_call("org.varlink.service.GetInfo")

    def _lifecycle(self, method, device, reason, extra=None):
        params = {}
        if device is not None:
            params["device"] = int(device)
        if reason is not None:
            params["reason"] = str(reason)
        if extra:
            params.update(extra)
        return self._main_call(method, params)

    def release(self, device=None, reason=None, deadline_ms=None):
        """Drain and release (CUDA usable).  Bumps the generation.  The
        protocol has no deadline for Release: ``deadline_ms`` must be None."""
        if deadline_ms is not None:
            raise TypeError("io.regen.Device.Release takes no deadline; use restart(deadline_ms=...)")
        return self._lifecycle("io.regen.Device.Release", device, reason)

    def reset(self, device=None, reason=None, deadline_ms=None):
        """Throw the context away and rebuild.  ``deadline_ms`` must be None."""
        if deadline_ms is not None:
            raise TypeError("io.regen.Device.Reset takes no deadline; use restart(deadline_ms=...)")
        return self._lifecycle("io.regen.Device.Reset", device, reason)

    def restart(self, device=None, reason=None, deadline_ms=None):
        """Drain (up to ``deadline_ms``), release or reset, new generation.
        Returns once the device serves again: {"epoch", "devices", "elapsed_us"}."""
        extra = {"deadline_ms": int(deadline_ms)} if deadline_ms is not None else None
        return self._lifecycle("io.regen.Device.Restart", device, reason, extra)

    def inject_fault(self, device, kind):
        """kind: "crash", "device_lost" or "hang" (regend --enable-fault-injection)."""
        return self._main_call("io.regen.Device.InjectFault", {"device": int(device), "kind": kind})
