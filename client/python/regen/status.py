# SPDX-License-Identifier: Apache-2.0
"""io.regen.Device on the main socket (libregen's status.c): the node's
devices, their generations, and the lifecycle verbs."""

from typing import Optional

from . import errors
from ._parts import JSON, ClientPart

__all__ = ["StatusCalls"]


class StatusCalls(ClientPart):
    """The status part of :class:`regen.Client`."""

    def status(self) -> JSON:
        """{"epoch", "devices": [DeviceInfo...]} (see io.regen.Device)."""
        return self._main_call("io.regen.Device.Status")

    def generation(self) -> JSON:
        """{"epoch", "devices"}: cheap enough to poll."""
        return self._main_call("io.regen.Device.Generation")

    def device_info(self, device: int) -> JSON:
        for d in self.status()["devices"]:
            if d["index"] == device:
                return d
        raise errors.NoSuchDevice(parameters={"device": device, "message": f"no device {device}"})

    def info(self) -> JSON:
        """org.varlink.service.GetInfo."""
        return self._main_call("org.varlink.service.GetInfo")

    def _lifecycle(self, method: str, device: Optional[int], reason: Optional[str], extra: Optional[JSON] = None) -> JSON:
        params: JSON = {}
        if device is not None:
            params["device"] = int(device)
        if reason is not None:
            params["reason"] = str(reason)
        if extra:
            params.update(extra)
        return self._main_call(method, params)

    def release(self, device: Optional[int] = None, reason: Optional[str] = None,
                deadline_ms: None = None) -> JSON:
        """Drain and release (CUDA usable).  Bumps the generation.  The
        protocol has no deadline for Release: ``deadline_ms`` must be None."""
        if deadline_ms is not None:
            raise TypeError("io.regen.Device.Release takes no deadline; use restart(deadline_ms=...)")
        return self._lifecycle("io.regen.Device.Release", device, reason)

    def reset(self, device: Optional[int] = None, reason: Optional[str] = None, deadline_ms: None = None) -> JSON:
        """Throw the context away and rebuild.  ``deadline_ms`` must be None."""
        if deadline_ms is not None:
            raise TypeError("io.regen.Device.Reset takes no deadline; use restart(deadline_ms=...)")
        return self._lifecycle("io.regen.Device.Reset", device, reason)

    def restart(self, device: Optional[int] = None, reason: Optional[str] = None,
                deadline_ms: Optional[int] = None) -> JSON:
        """Drain (up to ``deadline_ms``), release or reset, new generation.
        Returns once the device serves again: {"epoch", "devices", "elapsed_us"}."""
        extra = {"deadline_ms": int(deadline_ms)} if deadline_ms is not None else None
        return self._lifecycle("io.regen.Device.Restart", device, reason, extra)

    def inject_fault(self, device: int, kind: str) -> JSON:
        """kind: "crash", "device_lost", "hang" or "xid" (regend
        --enable-fault-injection)."""
        return self._main_call("io.regen.Device.InjectFault", {"device": int(device), "kind": kind})
