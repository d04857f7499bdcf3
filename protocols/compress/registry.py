"""Operator names -> constructors, and ``from_spec``.

Each entry takes the parsed options (and the model's parameter shapes) and
pops the keys it knows; anything left over is an unknown option.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

from protocols.compress.base import Compressor
from protocols.compress.casts import BFloat16, Float16, Identity
from protocols.compress.powersgd import PowerSGD
from protocols.compress.qsgd import QSGD
from protocols.compress.randomk import RandomK
from protocols.compress.sign import ScaledSign
from protocols.compress.spec import SpecError, SpecValue, parse_spec, take_bool, take_float, take_int
from protocols.compress.topk import TopK, TopKApprox

Shapes = Sequence[tuple[int, ...]] | None
Factory = Callable[[dict[str, SpecValue], Shapes], Compressor]


def _identity(options: dict[str, SpecValue], shapes: Shapes) -> Compressor:
    return Identity()


def _fp16(options: dict[str, SpecValue], shapes: Shapes) -> Compressor:
    return Float16()


def _bf16(options: dict[str, SpecValue], shapes: Shapes) -> Compressor:
    return BFloat16()


def _sign(options: dict[str, SpecValue], shapes: Shapes) -> Compressor:
    return ScaledSign()


def _topk(options: dict[str, SpecValue], shapes: Shapes) -> Compressor:
    return TopK(fraction=take_float(options, "fraction", 0.01))


def _topk_approx(options: dict[str, SpecValue], shapes: Shapes) -> Compressor:
    return TopKApprox(fraction=take_float(options, "fraction", 0.01), slack=take_float(options, "slack", 0.1))


def _qsgd(options: dict[str, SpecValue], shapes: Shapes) -> Compressor:
    return QSGD(bits=take_int(options, "bits", 8), bucket=take_int(options, "bucket", 512))


def _randomk(options: dict[str, SpecValue], shapes: Shapes) -> Compressor:
    fraction = take_float(options, "fraction", 0.01)
    return RandomK(fraction=fraction, unbiased=take_bool(options, "unbiased", False))


def _powersgd(options: dict[str, SpecValue], shapes: Shapes) -> Compressor:
    frozen = None if shapes is None else tuple(tuple(int(d) for d in shape) for shape in shapes)
    return PowerSGD(rank=take_int(options, "rank", 4), shapes=frozen)


REGISTRY: dict[str, Factory] = {
    "identity": _identity,
    "fp16": _fp16,
    "bf16": _bf16,
    "topk": _topk,
    "topk-approx": _topk_approx,
    "sign": _sign,
    "qsgd": _qsgd,
    "randomk": _randomk,
    "powersgd": _powersgd,
}


def from_spec(spec: str, *, shapes: Sequence[tuple[int, ...]] | None = None) -> Compressor:
    """Build the operator a spec names, e.g. ``"topk:fraction=0.01"``; raises SpecError when it is bad."""
    name, options = parse_spec(spec)
    factory = REGISTRY.get(name)
    if factory is None:
        raise SpecError(f"unknown compression {name!r}; known: {', '.join(sorted(REGISTRY))}")
    try:
        compressor = factory(options, shapes)
    except SpecError:
        raise
    except ValueError as error:
        raise SpecError(f"compression spec {spec!r}: {error}") from None
    if options:
        raise SpecError(f"compression spec {spec!r}: unknown option(s) {', '.join(sorted(options))}")
    return compressor
