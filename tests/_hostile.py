"""Shared by the hostile-input tests: the machine configurations under test, what an honest
neighbour sends, and a Hypothesis strategy of crafted messages (any kind, any parts, any round)."""

from __future__ import annotations

import torch
from hypothesis import strategies as st

from protocols.gossip import GossipConfig, MachineBase
from protocols.gossip.payload import Payload
from protocols.messages import ErrorReply, Heartbeat, Message, ParamPull, ParamPush, StateSyncRequest

D = 6  # parameters per peer
ME = "p00"  # the victim; on ring:4 its neighbours are p01 and p03, p02 is not one
INSIDER = "p01"
HONEST = "p03"
BOUND = 10.0  # honest values are O(1): anything past this was dragged by the insider

CONFIGS: dict[str, GossipConfig] = {
    "dpsgd": GossipConfig(algorithm="dpsgd", total_steps=30),
    "local": GossipConfig(algorithm="local", local_steps=2, total_steps=30, final_gossip_rounds=2),
    "after": GossipConfig(algorithm="local", local_steps=2, mixing="after", total_steps=30),
    "diloco": GossipConfig(algorithm="local", local_steps=1, total_steps=30, outer="diloco", outer_every=2),
    "choco": GossipConfig(algorithm="choco", total_steps=30),
    "choco-topk": GossipConfig(algorithm="choco", total_steps=30, compression="topk:fraction=0.5",
                               choco_full_start=False),
    "dpsgd-qsgd": GossipConfig(algorithm="dpsgd", total_steps=30, compression="qsgd:bits=4,bucket=16"),
    "pushsum": GossipConfig(algorithm="pushsum", total_steps=30),
    "adpsgd": GossipConfig(algorithm="adpsgd", total_steps=30),
}
ROUND_CONFIGS = [k for k in CONFIGS if k != "adpsgd"]


def honest_push(machine: MachineBase, sender: str, r: int, *, reply: bool = False,
                value: torch.Tensor | None = None) -> ParamPush:
    """What an honest neighbour sends for round ``r`` (its parameters: 0.5 everywhere), or
    ``value`` encoded the same way (a well-formed message carrying what an insider chose)."""
    coder = Payload(machine.config.compression, numel=D, dtype=torch.float32, seed=0, name=sender)
    raw = machine.config.algorithm == "choco" and r == 0 and machine.config.choco_full_start
    x = torch.full((D,), 0.5)
    if machine.config.algorithm == "choco" and r > 0:
        x = torch.full((D,), 0.01)  # CHOCO sends q = x - x_hat: small once the copies are exact
    if value is not None:
        x = value
    tensors, meta, _ = coder.encode(x, r, raw=raw)
    if machine.config.algorithm == "pushsum":
        meta = {**meta, "w": 0.5}
    return ParamPush(round=r, tensors=tensors, meta=meta, want_reply=False)



_DTYPES = [torch.float32, torch.float64, torch.float16, torch.bfloat16, torch.int8, torch.uint8,
           torch.int16, torch.int32, torch.int64, torch.bool]
FLOATS = st.floats(allow_nan=True, allow_infinity=True, width=64)
_SCALARS = st.one_of(st.integers(min_value=-(2**63), max_value=2**64 - 1), FLOATS, st.text(max_size=8),
                     st.booleans())
_NAMES = st.sampled_from(["x", "y", "q/op", "q/values", "q/indices", "q/codes", "q/norms", "q/signs", "q/p",
                          "q/q", "q/exact", "q/sub/x"])
_META_KEYS = st.sampled_from(["w", "q/op", "q/numel", "q/norm", "q/scale", "q/seed", "zz", "q/sub/w"])
ROUNDS = st.one_of(st.integers(min_value=-3, max_value=6), st.sampled_from([-(2**63), 2**62, 2**64 - 1, 31]))


@st.composite
def _tensors(draw: st.DrawFn) -> torch.Tensor:
    dtype = draw(st.sampled_from(_DTYPES))
    numel = draw(st.sampled_from([0, 1, 3, D - 1, D, D + 1, 2 * D]))
    values = draw(st.lists(FLOATS if dtype.is_floating_point else st.integers(0, 1), min_size=numel,
                           max_size=numel))
    t = torch.tensor(values, dtype=torch.float64).to(dtype)
    return t.view(2, 3) if numel == D and draw(st.booleans()) else t


OTHER_KINDS = st.one_of(
    st.builds(ErrorReply, code=st.sampled_from(["update_refused", "config_mismatch", ""]),
              detail=st.one_of(st.text(max_size=5), ROUNDS.map(str))),
    st.builds(Heartbeat, step=ROUNDS, loss=FLOATS, sent_at_s=FLOATS),
    st.builds(ParamPull, round=ROUNDS),
    st.builds(StateSyncRequest, reason=st.text(max_size=5)),
)


@st.composite
def crafted(draw: st.DrawFn) -> tuple[str, Message]:
    sender = draw(st.sampled_from([INSIDER, HONEST, "p02", ME]))
    if draw(st.integers(0, 4)) == 0:
        return sender, draw(OTHER_KINDS)
    tensors = draw(st.dictionaries(_NAMES, _tensors(), max_size=3))
    meta = draw(st.dictionaries(_META_KEYS, _SCALARS, max_size=4))
    if draw(st.booleans()):
        meta["q/op"] = draw(st.sampled_from(["topk", "qsgd", "sign", "identity"]))
        meta["q/numel"] = draw(st.sampled_from([D, D - 1, 0, -1, 2**62]))
    return sender, ParamPush(round=draw(ROUNDS), tensors=tensors, meta=meta, want_reply=draw(st.booleans()))


