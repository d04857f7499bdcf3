"""``hivemesh config reference``: every key of a peer file, an edge client's file and a scenario, from
the schema itself.

The keys, types and defaults are read from the config dataclasses the loaders use
(:func:`peer.files.config.accepted_fields`, plus the class a plain table is checked against,
:func:`peer.files.schema.checked_as`); the meaning is the comment written beside (or just above)
the field in its class, the unit the one its name carries (``_s``, ``_ms``, ``_mbps``...). So a
new key shows up here the day it is added, and a test compares this list with what the loaders
accept.
"""

from __future__ import annotations

import ast
import dataclasses
import functools
import inspect
import io
import math
import textwrap
import tokenize
from dataclasses import dataclass
from typing import Any, get_args, get_origin, get_type_hints

from peer.files.config import _type_name, accepted_fields
from peer.files.schema import checked_as
from peer.files.tomlout import scalar

# name suffix -> unit; longest first, so "_per_s" wins over "_s"
_UNITS = (("_per_s", "1/s"), ("_mbps", "Mbit/s"), ("_bytes", "bytes"), ("_steps", "steps"),
          ("_ms", "ms"), ("_s", "s"))


@dataclass(frozen=True)
class KeyDoc:
    """One key as a file writes it: ``faults.churn[].at_s`` is ``at_s`` in a ``[[faults.churn]]``."""

    key: str
    type: str
    default: str   # as TOML, or "required"
    unit: str
    meaning: str


def peer_file_keys() -> list[KeyDoc]:
    """Every key of a peer file (``hivemesh peer --config``)."""
    from peer.runtime.peerconfig import PeerFile

    return list(_keys(PeerFile, ""))


# [network] keys only gateways act on (their gossip): an edge client takes them from the shared file
# for the run id alone, so its reference leaves them out
GATEWAY_ONLY = ("network.topology", "network.weights", "network.gossip.")


def edge_file_keys() -> list[KeyDoc]:
    """Every key of an edge client's file (``hivemesh edge --config``) that acts on the client."""
    from peer.runtime.edgeconfig import EdgeFile

    return [doc for doc in _keys(EdgeFile, "") if not doc.key.startswith(GATEWAY_ONLY)]


# read before the loaders see the file (peer/files/include.py): a key of every member's file
INCLUDE_DOC = KeyDoc(key="include", type="str", default='""', unit="",
                     meaning="a shared file (relative to this file) whose tables this member takes, word "
                             "for word; this file may not set a key of them (hivemesh init writes a "
                             "federation's [network] and [federation] in federation.toml)")


def scenario_keys() -> list[KeyDoc]:
    """Every key of a scenario file (``hivemesh sim``)."""
    from sim.scenario import ScenarioConfig

    return list(_keys(ScenarioConfig, ""))


def render() -> str:
    """The reference as text: per file kind, one entry per key (``key = default  (type, unit)``
    and its meaning on the next line)."""
    out = []
    for title, keys in (("peer config (hivemesh peer --config FILE)", [INCLUDE_DOC, *peer_file_keys()]),
                        ("edge client config (hivemesh edge --config FILE)",
                         [INCLUDE_DOC, *edge_file_keys()]),
                        ("scenario (hivemesh sim FILE)", scenario_keys())):
        out.append(f"# {title}")
        for doc in keys:
            kind = f"{doc.type}, {doc.unit}" if doc.unit else doc.type
            out.append(f"{doc.key} = {doc.default}  ({kind})")
            out.append(f"    {doc.meaning}")
        out.append("")
    return "\n".join(out)


def _keys(cls: type, prefix: str) -> Any:
    hints = get_type_hints(cls)
    meanings = _meanings(cls)
    for name, field in accepted_fields(cls).items():
        key = f"{prefix}.{name}" if prefix else name
        tp = hints[name]
        inner = _table_class(tp, field)
        if inner is not None:
            yield from _keys(inner, key)
            continue
        items = get_args(tp)[0] if get_origin(tp) is tuple else None
        if items is not None and dataclasses.is_dataclass(items) and isinstance(items, type):
            yield from _keys(items, f"{key}[]")
            continue
        yield KeyDoc(key=key, type=_type_name(tp), default=_default(field), unit=_unit(name),
                     meaning=meanings.get(name, ""))


def _table_class(tp: Any, field: dataclasses.Field[Any]) -> type | None:
    """The class whose fields a table's keys are: the field's own type, or the owner's class."""
    if dataclasses.is_dataclass(tp) and isinstance(tp, type):
        return tp
    options = [arg for arg in get_args(tp) if arg is not type(None)]
    if len(options) == 1 and dataclasses.is_dataclass(options[0]) and isinstance(options[0], type):
        return options[0]   # an optional table ([federation]): its keys, as when it is given
    return checked_as(field.metadata)


def _default(field: dataclasses.Field[Any]) -> str:
    if field.default is not dataclasses.MISSING:
        value = field.default
    elif field.default_factory is not dataclasses.MISSING:
        value = field.default_factory()
    else:
        return "required"
    if isinstance(value, dict):
        return "{}" if not value else repr(value)
    if isinstance(value, float) and math.isinf(value):
        return "inf"
    return scalar(value)


def _unit(name: str) -> str:
    return next((unit for suffix, unit in _UNITS if name.endswith(suffix)), "")


def _meanings(cls: type) -> dict[str, str]:
    """Each field's comment, from the class (or base class) that declares it."""
    out: dict[str, str] = {}
    for klass in reversed(cls.__mro__):
        if dataclasses.is_dataclass(klass):
            out.update(_comments(klass))
    return out


@functools.cache
def _comments(cls: type) -> dict[str, str]:
    """Field name -> its comment: the one on its line(s), else the comment lines just above it."""
    source = textwrap.dedent(inspect.getsource(cls))
    comments: dict[int, str] = {}
    code_lines: set[int] = set()
    for token in tokenize.generate_tokens(io.StringIO(source).readline):
        if token.type == tokenize.COMMENT:
            comments[token.start[0]] = token.string.lstrip("#").strip()
        elif token.type not in (tokenize.NL, tokenize.NEWLINE, tokenize.INDENT, tokenize.DEDENT):
            code_lines.update(range(token.start[0], token.end[0] + 1))
    classdef = ast.parse(source).body[0]
    assert isinstance(classdef, ast.ClassDef)
    out = {}
    for statement in classdef.body:
        if not (isinstance(statement, ast.AnnAssign) and isinstance(statement.target, ast.Name)):
            continue
        end = statement.end_lineno or statement.lineno
        text = [comments[line] for line in range(statement.lineno, end + 1) if line in comments]
        if not text:
            above = statement.lineno - 1
            while above in comments and above not in code_lines:
                text.insert(0, comments[above])
                above -= 1
        out[statement.target.id] = " ".join(text)
    return out
