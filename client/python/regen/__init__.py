# SPDX-License-Identifier: Apache-2.0
"""regen: a pure-Python client of regend, the per-node CUDA work daemon.

    import regen
    c = regen.Client()                 # $REGEN_SOCKET or /run/regen/regend.sock
    print(c.status())
    buf = c.import_tensor(x)           # torch CUDA tensor, shared by CUDA IPC
    c.gemm(x, w, y)                    # y = x @ w, on regend's device
    c.restart(reason="rank 3 failed")  # new generation; old ids raise StaleGeneration

Stdlib only (regen.torch brings torch tensors in); with libregen and
regen._accel, compute calls take the ring.  One Client per thread.
"""

from .client import DEFAULT_SOCKET, DTYPE_SIZE, Buffer, Client, Comm, Event, Operand, Watch, normalize_ipc_handle
from .errors import *  # noqa: F401,F403
from .errors import __all__ as _errors_all
from .program import Program, ProgramBuilder

__version__ = "0.1.0"
__all__ = ["Client", "Operand", "Buffer", "Event", "Comm", "Watch", "DEFAULT_SOCKET", "DTYPE_SIZE",
           "normalize_ipc_handle", "Program", "ProgramBuilder"] + list(_errors_all)
