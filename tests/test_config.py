from dataclasses import dataclass, field
from typing import Literal

import pytest

from peer.files.config import ConfigError, load


@dataclass(frozen=True, kw_only=True)
class Inner:
    lr: float = 0.1
    kind: Literal["sgd", "adamw"] = "sgd"


@dataclass(frozen=True, kw_only=True)
class Outer:
    name: str
    steps: int
    tags: tuple[str, ...] = ()
    inner: Inner = field(default_factory=Inner)


def test_valid_config_fills_defaults_and_converts_ints_to_floats() -> None:
    config = load(Outer, {"name": "a", "steps": 3, "inner": {"lr": 1}}, source="f.toml")
    assert config == Outer(name="a", steps=3, inner=Inner(lr=1.0))
    assert isinstance(config.inner.lr, float)


@pytest.mark.parametrize(
    ("data", "needle"),
    [
        ({"name": "a", "steps": 1, "stpes": 2}, "unknown key 'stpes'"),
        ({"name": "a"}, "missing key 'steps'"),
        ({"name": "a", "steps": "many"}, "key 'steps': expected int, got str"),
        ({"name": "a", "steps": True}, "key 'steps': expected int"),
        ({"name": "a", "steps": 1, "inner": {"kind": "sgdd"}}, "key 'inner.kind': expected one of"),
        ({"name": "a", "steps": 1, "inner": {"lr": 0.1, "x": 1}}, "unknown key 'inner.x'"),
        ({"name": "a", "steps": 1, "tags": ["ok", 3]}, "key 'tags[1]'"),
    ],
)
def test_bad_config_names_file_key_and_expectation(data: dict, needle: str) -> None:
    with pytest.raises(ConfigError) as caught:
        load(Outer, data, source="f.toml")
    assert str(caught.value).startswith("f.toml: ")
    assert needle in str(caught.value)
