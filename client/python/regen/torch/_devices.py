# SPDX-License-Identifier: Apache-2.0
"""torch's view of a CUDA device (UUID, PCI bus id) matched to regend's."""

import torch

from .. import devmatch, errors


def local_identity(local):
    """(uuid, pci) of this process's CUDA device ``local`` as torch knows
    them; either may be None on an older torch."""
    props = torch.cuda.get_device_properties(local)
    uuid = getattr(props, "uuid", None)
    pci = None
    if all(hasattr(props, a) for a in ("pci_domain_id", "pci_bus_id", "pci_device_id")):
        pci = (int(props.pci_domain_id), int(props.pci_bus_id), int(props.pci_device_id))
    return uuid, pci


def match_device(local, devices):
    uuid, pci = local_identity(local)
    try:
        return devmatch.match(local, uuid, pci, devices)
    except LookupError as e:
        raise errors.NoSuchDevice(parameters={"message": str(e), "device": local}) from None
