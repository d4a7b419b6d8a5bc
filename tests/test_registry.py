"""Tests for backends/registry.py: finding backends by name."""

from __future__ import annotations

import pytest

from ddlsim.backends import registry
from ddlsim.backends.base import BackendError, BackendResult


class EchoBackend:
    name = "echo"

    def run(self, trace, point, options):
        return BackendResult()


def test_replay_is_built_in():
    # truth: the brief — "replay" is the built-in backend, also declared in pyproject.toml
    b = registry.get_backend("replay")
    assert b.name == "replay" and callable(b.run)
    assert "replay" in registry.available_backends()


def test_unknown_backend_lists_the_available_ones():
    # truth: the brief — BackendError("unknown backend 'x' (available: ...)")
    with pytest.raises(BackendError, match=r"unknown backend 'nope' \(available: .*replay.*\)"):
        registry.get_backend("nope")


def test_register_extends_the_built_ins(monkeypatch):
    monkeypatch.setitem(registry.BUILTIN, "echo", f"{__name__}:EchoBackend")
    assert "echo" in registry.available_backends()
    assert isinstance(registry.get_backend("echo"), EchoBackend)


def test_broken_plugin_is_one_line(monkeypatch):
    monkeypatch.setitem(registry.BUILTIN, "broken", "ddlsim.no_such_module:Thing")
    with pytest.raises(BackendError, match="backend 'broken' failed to load"):
        registry.get_backend("broken")


def test_entry_point_backends_are_found(monkeypatch):
    # an entry point of the ddlsim.backends group, as a third party would declare it
    from importlib.metadata import EntryPoint

    ep = EntryPoint("echo3", f"{__name__}:EchoBackend", registry.ENTRY_POINT_GROUP)
    monkeypatch.setattr(registry, "_entry_points", lambda: {"echo3": ep})
    assert "echo3" in registry.available_backends()
    assert isinstance(registry.get_backend("echo3"), EchoBackend)
