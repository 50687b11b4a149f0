# SPDX-License-Identifier: Apache-2.0
"""Matching a process's CUDA device to regend's device index by identity
(UUID, then PCI bus id), so that CUDA_VISIBLE_DEVICES may differ between a
rank and regend.  Standard library only: regen.torch feeds it torch's device
properties, a test feeds it plain values."""

import re

__all__ = ["normalize_uuid", "normalize_pci", "match"]

_HEX = re.compile(r"[0-9a-f]{32}")


def normalize_uuid(value):
    """32 lowercase hex digits of a GPU UUID given as NVML prints it
    ("GPU-58a3...-..."), as uuid.UUID or torch prints it, or as 16 bytes;
    None when it is not one."""
    if value is None:
        return None
    raw = getattr(value, "bytes", value)
    if isinstance(raw, (bytes, bytearray)):
        return bytes(raw).hex() if len(raw) == 16 else None
    text = str(value).strip().lower()
    if text.startswith(("gpu-", "mig-")):
        text = text[4:]
    text = text.strip("{}").replace("-", "")
    return text if _HEX.fullmatch(text) else None


def normalize_pci(value):
    """(domain, bus, device, function) of a PCI bus id ("0000:1b:00.0",
    NVML's "00000000:1B:00.0"), or of a (domain, bus, device) tuple; None
    when it is not one."""
    if value is None:
        return None
    if isinstance(value, (tuple, list)):
        if len(value) not in (3, 4) or not all(isinstance(x, int) for x in value):
            return None
        return tuple(value) + ((0,) if len(value) == 3 else ())
    m = re.fullmatch(r"\s*(?:([0-9a-fA-F]+):)?([0-9a-fA-F]+):([0-9a-fA-F]+)(?:\.([0-7]))?\s*", str(value))
    if not m:
        return None
    return (int(m.group(1) or "0", 16), int(m.group(2), 16), int(m.group(3), 16), int(m.group(4) or "0"))


def match(local_index, uuid, pci, devices):
    """regend's index for the local device with this ``uuid`` and ``pci``
    (either may be None) among Status's ``devices``, and how it was found:
    ("uuid" | "pci" | "index").  "index" (the same index) is the fallback
    when regend reports neither.  Raises LookupError when regend reports
    identities and none matches: the device is not one regend serves."""
    want_uuid, want_pci = normalize_uuid(uuid), normalize_pci(pci)
    reported = False
    for d in devices:
        health = d.get("health") or {}
        got = normalize_uuid(health.get("uuid") or d.get("uuid"))
        reported |= got is not None
        if want_uuid is not None and got == want_uuid:
            return d["index"], "uuid"
    for d in devices:
        health = d.get("health") or {}
        got = normalize_pci(health.get("pci_bus_id") or d.get("pci_bus_id"))
        reported |= got is not None
        if want_pci is not None and got is not None and got[:3] == want_pci[:3]:
            return d["index"], "pci"
    if reported and (want_uuid is not None or want_pci is not None):
        raise LookupError(f"regend serves no device with UUID {uuid} or PCI bus id {pci} "
                          f"(it serves {[(d.get('index'), (d.get('health') or {}).get('uuid')) for d in devices]})")
    indexes = [d.get("index") for d in devices]
    if local_index not in indexes:
        raise LookupError(f"regend serves no device {local_index} (it serves {indexes}) and reports no "
                          "UUID to match by")
    return local_index, "index"
