"""Where a peer finds its keys: the configured key file, and the key files beside it.

A key rotation (``hivemesh roster rotate``) gives a member a new key pair at a
round. The member's operator writes the new key file next to the one the
peer's config names (same directory, any name ending in ``.key``, e.g.
``keys/p01.key`` and ``keys/p01-2.key``); the peer finds it by the public id
the roster lists for it, when it learns the rotation (and signs with it from the
rotation's round on) and at every start, so the config keeps naming the first
key file. A key file that cannot be read (another's, mode not 0600) is skipped.
The search runs only for a rotation: at a start, when the configured key is
on the roster's revoked list and the member's entry says it was rotated, so a
config that names another member's key is still an error, even where one
folder holds every member's key (``hivemesh init``).
"""

from __future__ import annotations

from pathlib import Path

from peer.files.keyfile import KeyFileError, load_identity
from protocols.identity import Identity

KEY_SUFFIX = ".key"


def find_identity(key_path: str | Path, public_id: str) -> Identity | None:
    """The identity whose public id is ``public_id``: the file at ``key_path`` or a ``*.key`` file in
    its directory; None if there is none (KeyFileError from ``key_path`` itself goes up)."""
    key_path = Path(key_path)
    configured = load_identity(key_path)
    if configured.public_id == public_id:
        return configured
    for path in sorted(key_path.parent.glob(f"*{KEY_SUFFIX}")):
        if path == key_path:
            continue
        try:
            identity = load_identity(path)
        except KeyFileError:
            continue
        if identity.public_id == public_id:
            return identity
    return None
