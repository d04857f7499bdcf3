"""Who is who in a federation, and which gateway serves which client: one rule for the federations
``hivemesh init --gateways G --edges E`` writes (peer/runtime/netinit.py) and those a scenario
simulates (sim/scenario.py's ``[federation]``).

Gateways are ``gw0``, ``gw1``, ...; edge clients ``e000``, ``e001``, ... (zero-padded, so string
order is index order). Client ``i`` of ``E`` is served by gateway ``i * G // E``: contiguous
blocks, as even as ``E`` allows, so a scenario of ``G`` gateways with ``c`` clients each names the
very members a generated federation of ``G`` gateways and ``G * c`` clients has, and gives each
client the same gateway: the simulator can then run that federation from its files
(sim/from_network.py).
"""

from __future__ import annotations


def gateway_name(index: int) -> str:
    return f"gw{index}"


def federation_names(gateways: int, edges: int) -> tuple[tuple[str, ...], tuple[str, ...]]:
    """``gw0, gw1, ...`` and ``e000, e001, ...``."""
    width = max(3, len(str(edges - 1)))
    return (tuple(gateway_name(i) for i in range(gateways)), tuple(f"e{i:0{width}d}" for i in range(edges)))


def gateway_of(client: int, *, gateways: int, edges: int) -> str:
    """The gateway that serves client ``client`` (an index among ``edges``), of ``gateways``."""
    if not 0 <= client < edges or gateways < 1:
        raise ValueError(f"client {client} of {edges}, {gateways} gateways: out of range")
    return gateway_name(client * gateways // edges)
