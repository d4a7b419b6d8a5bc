"""The bundled scenarios (``scenarios/catalogue/*.toml``) and how a scenario argument names one."""

from __future__ import annotations

from pathlib import Path

from .schema import ScenarioError

CATALOGUE = Path(__file__).resolve().parent / "catalogue"


def resolve_scenario(name: str) -> Path:
    """A scenario argument is a file path or the name of a bundled scenario (a bundled name
    wins over a folder of the same name in the working directory, e.g. results of ``demo``)."""
    p = Path(name)
    bundled = CATALOGUE / f"{name}.toml"
    if p.is_dir() and "/" not in name and bundled.exists():
        return bundled
    if p.exists() or p.suffix == ".toml" or "/" in name:
        return p
    if bundled.exists():
        return bundled
    names = ", ".join(sorted(f.stem for f in CATALOGUE.glob("*.toml")))
    raise ScenarioError(f"{name}: no such scenario file or bundled scenario (bundled: {names})")
