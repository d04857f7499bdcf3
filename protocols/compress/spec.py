"""The spec grammar: ``"name"`` or ``"name:key=value,key=value"``.

Values are ints, floats or booleans (``true``/``false``); every operator
declares which keys it takes, so a typo is an error naming the key.
"""

from __future__ import annotations

from protocols.errors import HivemeshError

SpecValue = int | float | bool


class SpecError(HivemeshError, ValueError):
    """A compression spec that does not parse or names an unknown operator or option."""


def parse_value(text: str) -> SpecValue:
    lowered = text.strip().lower()
    if lowered in ("true", "yes", "on"):
        return True
    if lowered in ("false", "no", "off"):
        return False
    try:
        return int(lowered)
    except ValueError:
        pass
    try:
        return float(lowered)
    except ValueError:
        raise SpecError(f"compression option value {text!r} is not a number or true/false") from None


def parse_spec(spec: str) -> tuple[str, dict[str, SpecValue]]:
    """Split a spec into the operator name and its options."""
    if not isinstance(spec, str) or not spec.strip():
        raise SpecError(f"compression spec must be a non-empty string, got {spec!r}")
    name, _, rest = spec.strip().partition(":")
    options: dict[str, SpecValue] = {}
    if rest.strip():
        for item in rest.split(","):
            key, eq, value = item.partition("=")
            key = key.strip()
            if not eq or not key or not value.strip():
                raise SpecError(f"compression spec {spec!r}: expected key=value, got {item!r}")
            if key in options:
                raise SpecError(f"compression spec {spec!r}: option {key!r} given twice")
            options[key] = parse_value(value)
    return name.strip().lower(), options


def take_float(options: dict[str, SpecValue], key: str, default: float) -> float:
    value = options.pop(key, default)
    if isinstance(value, bool):
        raise SpecError(f"compression option {key}={value} must be a number")
    return float(value)


def take_int(options: dict[str, SpecValue], key: str, default: int) -> int:
    value = options.pop(key, default)
    if isinstance(value, bool) or not isinstance(value, int):
        raise SpecError(f"compression option {key}={value} must be an integer")
    return value


def take_bool(options: dict[str, SpecValue], key: str, default: bool) -> bool:
    value = options.pop(key, default)
    if not isinstance(value, bool):
        raise SpecError(f"compression option {key}={value} must be true or false")
    return value
