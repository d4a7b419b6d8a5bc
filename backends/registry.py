"""Find a backend by name: the built-ins first, then the ``ddlsim.backends`` entry points.

A built-in is named by ``"module:attribute"`` in :data:`BUILTIN` and imported only when
asked for (so listing backends does not import torch). Third parties register a class
(or a zero-argument factory) under the entry-point group ``ddlsim.backends``.
"""

from __future__ import annotations

import importlib
from importlib.metadata import EntryPoint, entry_points

from .base import Backend, BackendError

ENTRY_POINT_GROUP = "ddlsim.backends"
BUILTIN: dict[str, str] = {
    "replay": "ddlsim.backends.replay:ReplayBackend",
    "live": "ddlsim.backends.live:LiveBackend",
}


def register(name: str, target: str) -> None:
    """Add (or replace) built-in backend ``name`` given as ``"module:attribute"``."""
    BUILTIN[name] = target


def _entry_points() -> dict[str, EntryPoint]:
    return {ep.name: ep for ep in entry_points(group=ENTRY_POINT_GROUP)}


def available_backends() -> list[str]:
    """Sorted names of the built-in and entry-point backends."""
    return sorted(set(BUILTIN) | set(_entry_points()))


def _load(target: str) -> object:
    module, _, attr = target.partition(":")
    obj: object = importlib.import_module(module)
    for part in attr.split(".") if attr else []:
        obj = getattr(obj, part)
    return obj


def get_backend(name: str) -> Backend:
    """An instance of backend ``name``; an unknown or broken one is a :class:`BackendError`."""
    try:
        if name in BUILTIN:
            factory = _load(BUILTIN[name])
        else:
            ep = _entry_points().get(name)
            if ep is None:
                raise BackendError(f"unknown backend {name!r} (available: {', '.join(available_backends())})")
            factory = ep.load()
    except BackendError:
        raise
    except Exception as e:  # an import failure of someone's plugin: one clear line
        raise BackendError(f"backend {name!r} failed to load: {type(e).__name__}: {e}") from None
    if not callable(factory):
        raise BackendError(f"backend {name!r} is not a class or factory")
    backend = factory()
    if not hasattr(backend, "run"):
        raise BackendError(f"backend {name!r} has no run() method")
    return backend
