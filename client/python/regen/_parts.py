# SPDX-License-Identifier: Apache-2.0
"""What the parts of regen.Client (connection.py, status.py, objects.py,
...) share for a type checker: each part reaches the others' members
through ``self``, which only the assembled Client has.  At run time the
base is ``object``; a type checker sees one whose unknown attributes are
``Any`` (each member is typed where its part defines it)."""

from typing import TYPE_CHECKING, Any, Dict

__all__ = ["ClientPart", "JSON", "OperandLike", "EventLike"]

# A Varlink reply's or parameter's object, as json.loads gives it.
JSON = Dict[str, Any]
# A compute call's operand: a regen.Operand, or a torch tensor (which
# regen itself never imports: regen.torch resolves it).
OperandLike = Any
# A wait_event or signal_event: a regen.Event or its wire id.
EventLike = Any

if TYPE_CHECKING:
    class ClientPart:
        def __getattr__(self, name: str) -> Any: ...
else:
    ClientPart = object
