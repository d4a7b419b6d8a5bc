"""Shared helpers for the tests: scenario points from TOML snippets."""

from __future__ import annotations

from typing import Any

import pytest

from ddlsim.scenarios.load import load_text


def make_point(toml: str = "", **sets: Any) -> dict[str, Any]:
    """The single validated point of a scenario snippet, with ``--set`` style overrides."""
    overrides = [f"{k.replace('__', '.')}={v!r}" if isinstance(v, str) else f"{k.replace('__', '.')}={v}"
                 for k, v in sets.items()]
    overrides = [o.replace("'", '"') for o in overrides]
    points = load_text(toml, "<test>", overrides).points()
    assert len(points) == 1
    return points[0]


@pytest.fixture
def point_factory():
    return make_point
