# SPDX-License-Identifier: Apache-2.0
"""Exceptions: one class per Varlink error regend can send.

Every error a reply carries becomes an instance of the class registered for
its wire name (``io.regen.StaleGeneration`` -> :class:`StaleGeneration`), or
of :class:`Error` itself for a name this module does not know.  The wire name
is ``.name``, the reply's parameters ``.parameters``, and each parameter is
also an attribute: ``except regen.StaleGeneration as e: e.generation``.
"""

from typing import TYPE_CHECKING, Any, Dict, Optional, Type

__all__ = [
    "Error", "ConnectionReset", "Unavailable", "ProtocolError",
    "StaleGeneration", "DeviceLost", "Draining", "NotPermitted", "OutOfMemory",
    "InvalidOperand", "NoSuchDevice", "NoSuchObject", "ImportFailed",
    "InvalidMessage", "MessageTooLarge", "LimitExceeded", "Timeout",
    "FaultInjectionDisabled", "WrongEndpoint", "Detached", "BackendError",
    "CommFailed", "CommTimeout", "CommInFlight", "InvalidJob", "InvalidProgram", "RunTorn",
    "InterfaceNotFound", "MethodNotFound", "MethodNotImplemented",
    "InvalidParameter", "PermissionDenied", "ExpectedMore",
    "error_from_reply",
]

_by_name: Dict[str, Type["Error"]] = {}


class Error(Exception):
    """A call failed.  ``name`` is the Varlink error name (None for errors
    raised on this side of the socket), ``parameters`` its parameters."""

    name: Optional[str] = None

    def __init__(self, name: Optional[str] = None, parameters: Optional[Dict[str, Any]] = None,
                 message: Optional[str] = None) -> None:
        self.name = name if name is not None else type(self).name
        self.parameters = dict(parameters or {})
        if message is None:
            message = self.parameters.get("message")
        self.message = message
        for key, value in self.parameters.items():
            # Parameters become attributes unless that would shadow one of
            # ours (name, parameters, args, ...).
            if key.isidentifier() and not hasattr(type(self), key) and key not in self.__dict__:
                setattr(self, key, value)
        super().__init__(self._text())

    if TYPE_CHECKING:
        # A parameter of the reply is an attribute (e.generation).
        def __getattr__(self, name: str) -> Any: ...

    def _text(self):
        # Parameters the message already spells out are not repeated.
        msg = self.message or ""
        extra = {k: v for k, v in self.parameters.items()
                 if k != "message" and not (isinstance(v, str) and v and v in msg)}
        parts = [self.name or type(self).__name__]
        if self.message:
            parts.append(self.message)
        if extra:
            parts.append(" ".join(f"{k}={v!r}" for k, v in extra.items()))
        return ": ".join(parts[:2]) + (f" ({parts[2]})" if len(parts) > 2 else "")


def _wire(name):
    def register(cls):
        cls.name = name
        _by_name[name] = cls
        return cls
    return register


class ConnectionReset(Error, ConnectionError):
    """The connection broke while a call was in flight: the call may or may
    not have run.  The next call on the same Client connects again."""


class Unavailable(Error, ConnectionError):
    """regend's socket (or a worker's) cannot be reached at all."""


class ProtocolError(Error):
    """regend sent something that is not a Varlink reply."""


@_wire("io.regen.StaleGeneration")
class StaleGeneration(Error):
    """An id was made in an earlier generation; re-import.  ``.generation``
    is the device's current generation."""


@_wire("io.regen.DeviceLost")
class DeviceLost(Error):
    """The device's context was lost during the call or is being reset."""


@_wire("io.regen.Draining")
class Draining(Error):
    """The device is draining for a release, reset or restart."""


@_wire("io.regen.NotPermitted")
class NotPermitted(Error):
    """Admin methods need root or the admin group."""


@_wire("io.regen.OutOfMemory")
class OutOfMemory(Error):
    pass


@_wire("io.regen.InvalidOperand")
class InvalidOperand(Error):
    """``.operand`` names the operand, ``.reason`` says what is wrong."""


@_wire("io.regen.NoSuchDevice")
class NoSuchDevice(Error):
    pass


@_wire("io.regen.NoSuchObject")
class NoSuchObject(Error):
    pass


@_wire("io.regen.ImportFailed")
class ImportFailed(Error):
    pass


@_wire("io.regen.InvalidMessage")
class InvalidMessage(Error):
    pass


@_wire("io.regen.MessageTooLarge")
class MessageTooLarge(Error):
    pass


@_wire("io.regen.LimitExceeded")
class LimitExceeded(Error):
    pass


@_wire("io.regen.Timeout")
class Timeout(Error):
    pass


@_wire("io.regen.FaultInjectionDisabled")
class FaultInjectionDisabled(Error):
    pass


@_wire("io.regen.WrongEndpoint")
class WrongEndpoint(Error):
    """A method was sent to the wrong socket (data-plane calls go to the
    worker socket, lifecycle calls to the main one)."""


@_wire("io.regen.Detached")
class Detached(Error):
    """The device is detached (regenctl detach): no worker serves it until
    an admin attaches it again."""


@_wire("io.regen.CommFailed")
class CommFailed(Error):
    """The communicator failed (NCCL's reason in ``parameters["reason"]``,
    "aborted" when it was aborted): Destroy it and Init a new one."""


@_wire("io.regen.CommTimeout")
class CommTimeout(Error):
    """Init or a collective passed its deadline; the communicator was aborted."""


@_wire("io.regen.CommInFlight")
class CommInFlight(Error):
    """Destroy was refused: calls are in flight (pass abort=True)."""


@_wire("io.regen.InvalidJob")
class InvalidJob(Error):
    """SetJob refused the job: ``.reason`` is "empty", "too long" or
    "character"; the connection's job did not change."""


@_wire("io.regen.InvalidProgram")
class InvalidProgram(Error):
    """Program.Define refused the program: ``.node`` names where ("nodes[3]
    (fc1)" or "tensors[2] (x)"), ``.reason`` what is wrong."""


@_wire("io.regen.BackendError")
class BackendError(Error):
    pass


@_wire("io.regen.RunTorn")
class RunTorn(Error):
    """The retry of a program Run whose journal holds marks only found the
    Run begun: a fault of regend's cut it after it began writing its
    inouts (``.program``, ``.seq``).  Nothing ran; the inouts may hold part
    of the update: load them from a checkpoint."""


@_wire("org.varlink.service.InterfaceNotFound")
class InterfaceNotFound(Error):
    pass


@_wire("org.varlink.service.MethodNotFound")
class MethodNotFound(Error):
    pass


@_wire("org.varlink.service.MethodNotImplemented")
class MethodNotImplemented(Error):
    pass


@_wire("org.varlink.service.InvalidParameter")
class InvalidParameter(Error):
    pass


@_wire("org.varlink.service.PermissionDenied")
class PermissionDenied(Error):
    pass


@_wire("org.varlink.service.ExpectedMore")
class ExpectedMore(Error):
    pass


def error_from_reply(name: str, parameters: Optional[Dict[str, Any]]) -> Error:
    """The exception for a reply's ``error`` name and ``parameters``."""
    cls = _by_name.get(name, Error)
    return cls(name, parameters)
