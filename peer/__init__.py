"""hivemesh's member side. ``peer.join(config, model)`` makes your own training loop a member
(peer/library.py); imported on first use, so that the command line starts without torch."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from peer.library import Member, join

__all__ = ["Member", "join"]


def __getattr__(name: str) -> Any:
    if name in __all__:
        from peer import library

        return getattr(library, name)
    raise AttributeError(f"module 'peer' has no attribute {name!r}")
