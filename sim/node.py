"""The node model: compute time, churn schedules, deterministic identities, attacker tampering.

Compute time is modelled, never measured during a run: a unit of work of
``n`` local steps takes ``n * step_time_ms / speed`` (times
``straggle_slowdown`` when the counter-based draw for that unit says so).
Churn given as rates is expanded into a fixed list of events before the run
starts. Attackers tamper with what they send, never with what others send.
"""

from __future__ import annotations

import dataclasses
import hashlib
import math
from typing import Any, cast

import torch
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

from protocols.identity import Identity
from protocols.messages import Message
from protocols.rng import torch_generator
from sim.network import uniform
from sim.scenario import AttackConfig, ChurnEvent, ScenarioConfig


def work_seconds(scenario: ScenarioConfig, speed: float, name: str, work_index: int, steps: int) -> float:
    """Simulated seconds member ``name`` needs for its ``work_index``-th unit of ``steps`` steps."""
    nodes = scenario.nodes
    seconds = steps * nodes.step_time_ms / 1000.0 / speed
    if nodes.straggle_probability > 0 and \
            uniform(scenario.seed, name, work_index, "straggle") < nodes.straggle_probability:
        seconds *= nodes.straggle_slowdown
    return seconds


def sim_identity(seed: int, name: str, purpose: str = "identity") -> Identity:
    """A member's keys derived from the scenario seed, so reruns sign the very same bytes."""
    material = hashlib.blake2b(f"{seed}\x00{name}\x00{purpose}".encode(), digest_size=64).digest()
    return Identity(Ed25519PrivateKey.from_private_bytes(material[:32]), material[32:])


def churn_events(scenario: ScenarioConfig, names: tuple[str, ...]) -> list[ChurnEvent]:
    """Every churn event of the run, sorted by (time, member, kind): explicit, rate-drawn, and crashes."""
    events = list(scenario.faults.churn)
    rates = scenario.faults.rates
    if rates.crash_rate_per_s > 0:
        for name in rates.nodes or names:
            t = 0.0
            for k in range(1_000_000):
                t += -math.log(1.0 - uniform(scenario.seed, name, k, "churn-up")) / rates.crash_rate_per_s
                if t >= scenario.duration_s:
                    break
                events.append(ChurnEvent(node=name, kind="crash", at_s=t))
                t += -math.log(1.0 - uniform(scenario.seed, name, k, "churn-down")) * rates.mean_downtime_s
                if t >= scenario.duration_s:
                    break
                events.append(ChurnEvent(node=name, kind="restart", at_s=t))
    crash_at_s = scenario.faults.attack.crash_at_s or scenario.duration_s / 2
    for name in names:
        if scenario.behaviour(name) == "crash":
            events.append(ChurnEvent(node=name, kind="crash", at_s=crash_at_s))
    return sorted(events, key=lambda e: (e.at_s, e.node, e.kind))


def tamper(message: Message, behaviour: str, attack: AttackConfig, *, seed: int, name: str,
           index: int) -> Message:
    """What a sign-flip or noise attacker sends instead of ``message`` (others: unchanged).

    Only floating tensors change (indices of a sparse vector stay valid, so the
    codec accepts the message: filtering it is the algorithm's job).
    """
    if behaviour not in ("sign-flip", "noise") or not hasattr(message, "tensors"):
        return message
    tensors = {}
    for key, tensor in sorted(message.tensors.items()):
        if not tensor.is_floating_point():
            tensors[key] = tensor
        elif behaviour == "sign-flip":
            tensors[key] = tensor * (-attack.sign_flip_scale)
        else:
            generator = torch_generator(seed, name, index, f"attack-noise:{key}")
            rms = tensor.float().pow(2).mean().sqrt() if tensor.numel() else torch.zeros(())
            noise = torch.randn(tensor.shape, generator=generator, dtype=torch.float32)
            tensors[key] = (tensor.float() + noise * (attack.noise_scale * rms)).to(tensor.dtype)
    replaced: Message = dataclasses.replace(cast(Any, message), tensors=tensors)
    return replaced


def flip_signature(frames: list[bytes]) -> list[bytes]:
    """The same frames with one bit of the signature (the last frame) flipped."""
    signature = bytearray(frames[-1])
    signature[0] ^= 0x01
    return [*frames[:-1], bytes(signature)]
