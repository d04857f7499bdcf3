"""Compressed <-> the ``tensors``/``meta`` of a message, under a name prefix.

``pack(c, "w")`` gives tensors ``{"w/<part>": ...}`` and meta
``{"w/op": op, "w/numel": n, "w/<param>": ...}``; several compressed vectors
travel in one message under different prefixes. Part and parameter names never
contain "/", so ``unpack`` ignores deeper prefixes such as "w/sub/...".
"""

from __future__ import annotations

from collections.abc import Mapping

import torch

from protocols.compress.base import BadParts, Compressed
from protocols.messages import Scalar

_RESERVED = ("op", "numel")


def _split(name: str, prefix: str) -> str | None:
    head = prefix + "/"
    if not name.startswith(head):
        return None
    rest = name[len(head):]
    return rest if rest and "/" not in rest else None


def pack(c: Compressed, prefix: str) -> tuple[dict[str, torch.Tensor], dict[str, Scalar]]:
    """The message fields for ``c``: raw frames in ``tensors``, op/numel/params in ``meta``."""
    if prefix.endswith("/"):
        raise ValueError(f"pack prefix {prefix!r} must not end with '/'")
    tensors = {f"{prefix}/{part}": t for part, t in c.parts.items()}
    meta: dict[str, Scalar] = {f"{prefix}/op": c.op, f"{prefix}/numel": c.numel}
    for key, value in c.params.items():
        if key in _RESERVED or "/" in key:
            raise ValueError(f"compressed parameter name {key!r} is reserved or has '/'")
        meta[f"{prefix}/{key}"] = value
    return tensors, meta


def unpack(
    tensors: Mapping[str, torch.Tensor],
    meta: Mapping[str, Scalar],
    prefix: str,
    numel: int | None = None,
) -> Compressed:
    """Collect the fields under ``prefix``; raises BadParts when they are missing or malformed.

    ``numel``: the length the receiver expects (its own parameter count); a
    different declared length is rejected before anything is allocated.
    """
    op = meta.get(f"{prefix}/op")
    declared = meta.get(f"{prefix}/numel")
    if not isinstance(op, str):
        raise BadParts("missing_op", prefix)
    if isinstance(declared, bool) or not isinstance(declared, int) or declared < 0:
        raise BadParts("bad_numel", f"{prefix}: {declared!r}")
    if numel is not None and declared != numel:
        raise BadParts("wrong_numel", f"{prefix}: {declared}, expected {numel}")
    parts: dict[str, torch.Tensor] = {}
    for name, tensor in tensors.items():
        part = _split(name, prefix)
        if part is not None:
            parts[part] = tensor
    params: dict[str, Scalar] = {}
    for name, value in meta.items():
        key = _split(name, prefix)
        if key is not None and key not in _RESERVED:
            params[key] = value
    return Compressed(op=op, numel=declared, parts=parts, params=params)
