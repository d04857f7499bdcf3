"""TOML configuration, parsed and validated once at the edge into frozen dataclasses.

``load(cls, data, source)`` walks the dataclass's type hints and checks every key:
an unknown key, a missing key or a wrong type raises :class:`ConfigError`
naming the source file, the dotted key and what was expected. Defaults come
from the dataclass fields, so each component owns its own config class.
"""

from __future__ import annotations

import dataclasses
import difflib
import tomllib
import types
import typing
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any, Literal, TypeVar, Union, get_args, get_origin, get_type_hints

from protocols.errors import HivemeshError

T = TypeVar("T")


class ConfigError(HivemeshError, ValueError):
    """A config file (or mapping) that does not match its schema.

    ``key`` is the dotted key at fault when one is ("" when the file as a whole is); for an
    unknown key, ``known`` holds the keys its table accepts (what ``hivemesh config reference``
    is checked against).
    """

    def __init__(self, message: str, *, key: str = "", known: tuple[str, ...] = ()) -> None:
        super().__init__(message)
        self.key = key
        self.known = known


# A field the loader fills in itself (the file's name, say): never read from the file.
INTERNAL: Mapping[str, Any] = {"internal": True}


# Keys that were renamed: refused with the new name rather than converted, so that one
# spelling is in use (peer.files.schema says why each was renamed).
RENAMED_KEYS: dict[str, str] = {
    "neighbour_timeout_ms": "neighbour_timeout_s (seconds: divide the old value by 1000)",
}


def read_toml(path: str | Path) -> dict[str, Any]:
    """Read a TOML file, turning I/O and syntax errors into ConfigError."""
    path = Path(path)
    try:
        with path.open("rb") as handle:
            return tomllib.load(handle)
    except FileNotFoundError:
        raise ConfigError(f"{path}: no such file") from None
    except OSError as error:
        raise ConfigError(f"{path}: cannot read: {error.strerror}") from None
    except tomllib.TOMLDecodeError as error:
        raise ConfigError(f"{path}: not valid TOML: {error}") from None


def load_file(cls: type[T], path: str | Path, section: str | None = None) -> T:
    """Read ``path`` (optionally one ``[section]`` of it) into dataclass ``cls``."""
    data: Any = read_toml(path)
    if section is not None:
        if section not in data:
            raise ConfigError(f"{path}: missing section [{section}]")
        data = data[section]
    return load(cls, data, source=str(path), prefix=section or "")


def load(cls: type[T], data: Any, *, source: str = "<config>", prefix: str = "") -> T:
    """Build dataclass ``cls`` from a plain mapping, validating every key."""
    return typing.cast(T, _convert(cls, data, source, prefix))


def nearest(name: str, known: Iterable[str]) -> str:
    """`` (did you mean 'X'?)`` for the known name closest to a misspelt ``name``, else ""."""
    close = difflib.get_close_matches(name, sorted(known), n=1, cutoff=0.6)
    return f" (did you mean '{close[0]}'?)" if close else ""


def accepted_fields(cls: type) -> dict[str, dataclasses.Field[Any]]:
    """The fields of dataclass ``cls`` a file may set (INTERNAL ones are the loader's)."""
    return {f.name: f for f in dataclasses.fields(cls) if f.init and not f.metadata.get("internal")}


def apply_override(data: dict[str, Any], assignment: str, *, source: str = "<config>") -> None:
    """Set one dotted key of a config mapping from ``KEY=VALUE`` (``--set``), in place.

    VALUE is read as a TOML value (``2``, ``0.5``, ``true``, ``"x"``, ``["a"]``); anything that
    is not one is taken as a bare string, so ``graph.spec=ring:4`` needs no quotes. Tables on the
    way are created if missing; the result is then checked like the file itself, so a misspelt
    key or a wrong type is reported by name.
    """
    key, equals, text = assignment.partition("=")
    names = key.strip().split(".")
    if not equals or not all(names):
        raise ConfigError(f"{source}: --set {assignment!r}: expected KEY=VALUE (e.g. duration_s=2)")
    try:
        value = tomllib.loads(f"value = {text}")["value"]
    except tomllib.TOMLDecodeError:
        value = text.strip()
    table = data
    for depth, name in enumerate(names[:-1]):
        inner = table.setdefault(name, {})
        where = ".".join(names[:depth + 1])
        if not isinstance(inner, dict):
            raise ConfigError(f"{source}: --set {assignment!r}: key '{where}' is not a table", key=where)
        table[name] = inner = dict(inner)   # a copy: the caller's nested tables stay as they were
        table = inner
    table[names[-1]] = value


def _where(source: str, key: str) -> str:
    return f"{source}: key '{key}'" if key else f"{source}"


def _expected(source: str, key: str, tp: Any, value: Any) -> ConfigError:
    return ConfigError(f"{_where(source, key)}: expected {_type_name(tp)}, got {_describe(value)}", key=key)


def _describe(value: Any) -> str:
    shown = repr(value)
    if len(shown) > 40:
        shown = shown[:37] + "..."
    return f"{type(value).__name__} {shown}"


def _type_name(tp: Any) -> str:
    origin = get_origin(tp)
    if origin is Literal:
        return "one of " + ", ".join(repr(a) for a in get_args(tp))
    if origin in (Union, types.UnionType):
        return " or ".join(_type_name(a) for a in get_args(tp))
    if origin is tuple:
        return f"a list of {_type_name(get_args(tp)[0])}"
    if origin in (dict, Mapping):
        return f"a table of {_type_name(get_args(tp)[1])}"
    if dataclasses.is_dataclass(tp):
        return "a table"
    if tp is type(None):
        return "nothing"
    return getattr(tp, "__name__", str(tp))


def _convert(tp: Any, value: Any, source: str, key: str) -> Any:
    origin = get_origin(tp)
    if dataclasses.is_dataclass(tp) and isinstance(tp, type):
        return _convert_dataclass(tp, value, source, key)
    if tp is Any:
        return value
    if origin is Literal:
        if value in get_args(tp) and type(value) in {type(a) for a in get_args(tp)}:
            return value
        words = [a for a in get_args(tp) if isinstance(a, str)]
        guess = nearest(value, words) if isinstance(value, str) else ""
        raise ConfigError(f"{_where(source, key)}: expected {_type_name(tp)}, got {_describe(value)}{guess}",
                          key=key)
    if origin in (Union, types.UnionType):
        options = [option for option in get_args(tp) if option is not type(None)]
        if len(options) == 1:   # an optional table or value: its own errors (TOML has no null)
            return _convert(options[0], value, source, key)
        for option in get_args(tp):
            if option is type(None):
                continue
            try:
                return _convert(option, value, source, key)
            except ConfigError:
                continue
        raise _expected(source, key, tp, value)
    if origin is tuple:
        if not isinstance(value, list | tuple):
            raise _expected(source, key, tp, value)
        item_type = get_args(tp)[0]
        return tuple(_convert(item_type, v, source, f"{key}[{i}]") for i, v in enumerate(value))
    if origin in (dict, Mapping):
        if not isinstance(value, dict):
            raise _expected(source, key, tp, value)
        value_type = get_args(tp)[1]
        return {str(k): _convert(value_type, v, source, f"{key}.{k}" if key else str(k))
                for k, v in value.items()}
    if tp is float:
        if isinstance(value, int | float) and not isinstance(value, bool):
            return float(value)
    elif tp is int:
        if isinstance(value, int) and not isinstance(value, bool):
            return value
    elif tp is bool or tp is str:
        if isinstance(value, tp):
            return value
    else:
        raise TypeError(f"config schema uses unsupported type {tp!r} at {key}")
    raise _expected(source, key, tp, value)


def _convert_dataclass(cls: type, value: Any, source: str, key: str) -> Any:
    if not isinstance(value, dict):
        raise ConfigError(f"{_where(source, key)}: expected a table, got {_describe(value)}", key=key)
    hints = get_type_hints(cls)
    fields = accepted_fields(cls)
    unknown = sorted(set(value) - set(fields))
    if unknown:
        name = next((k for k in unknown if k in RENAMED_KEYS), unknown[0])
        bad = f"{key}.{name}" if key else name
        section = f"table [{key}]" if key else "the top-level table"
        known = tuple(sorted(fields))
        if name in RENAMED_KEYS:
            raise ConfigError(f"{source}: key '{bad}' in {section} was renamed: use {RENAMED_KEYS[name]}",
                              key=bad, known=known)
        raise ConfigError(f"{source}: unknown key '{bad}' in {section}{nearest(name, fields)} "
                          f"(known keys here: {', '.join(known)})", key=bad, known=known)
    kwargs = {}
    for name, field in fields.items():
        sub = f"{key}.{name}" if key else name
        if name in value:
            kwargs[name] = _convert(hints[name], value[name], source, sub)
        elif field.default is dataclasses.MISSING and field.default_factory is dataclasses.MISSING:
            raise ConfigError(f"{source}: missing key '{sub}' (expected {_type_name(hints[name])})", key=sub)
    try:
        return cls(**kwargs)
    except (ValueError, TypeError) as error:
        # __post_init__ validation: the message says which value is wrong, and starts with the
        # field's name when one field is at fault: name its whole dotted key then
        text = str(error)
        culprit = next((name for name in sorted(fields, key=len, reverse=True)
                        if text.startswith(name) and text[len(name):len(name) + 1] in (" ", ":", "")), "")
        if culprit:
            sub = f"{key}.{culprit}" if key else culprit
            raise ConfigError(f"{source}: key '{sub}': {text}", key=sub) from None
        raise ConfigError(f"{_where(source, key) if key else source}: {text}", key=key) from None
