"""The dependency pins (docs/design.md, "Tooling"): constraints.txt pins exactly each package a
trace depends on and the dev tools, every pin inside pyproject.toml's range for it, and the
dev extra names the tools CI runs. Truth: PEP 440 as the ``packaging`` library implements it."""

from __future__ import annotations

import tomllib
from pathlib import Path

from packaging.requirements import Requirement
from packaging.utils import canonicalize_name

ROOT = Path(__file__).resolve().parents[1]
TRACE_PACKAGES = {"simpy", "numpy", "numba", "llvmlite", "torch", "torchvision"}  # docs/design.md
BOUNDED = {"simpy", "numpy", "numba", "torch", "torchvision"}  # declared by ddlsim itself


def _project() -> dict:
    return tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))["project"]


def _pins() -> dict[str, Requirement]:
    lines = (ROOT / "constraints.txt").read_text(encoding="utf-8").splitlines()
    reqs = [Requirement(line.split("#")[0]) for line in lines if line.split("#")[0].strip()]
    return {canonicalize_name(r.name): r for r in reqs}


def test_every_trace_package_and_tool_is_pinned_exactly() -> None:
    pins = _pins()
    assert TRACE_PACKAGES | {"ruff", "mypy"} <= set(pins), sorted(TRACE_PACKAGES - set(pins))
    for name, req in pins.items():
        (spec,) = req.specifier  # one specifier each
        assert spec.operator == "==" and "*" not in spec.version, (name, str(spec))


def test_pins_lie_in_the_declared_ranges_and_those_have_upper_bounds() -> None:
    pins = _pins()
    declared = [Requirement(d) for d in _project()["dependencies"]]
    declared += [Requirement(d) for d in _project()["optional-dependencies"]["dev"]]
    for req in declared:
        name = canonicalize_name(req.name)
        if name in BOUNDED | {"ruff", "mypy"}:
            assert any(s.operator in ("<", "<=", "~=") for s in req.specifier), (name, str(req.specifier))
        if name in pins:
            (pin,) = pins[name].specifier
            assert req.specifier.contains(pin.version, prereleases=True), (name, pin.version, str(req.specifier))


def test_the_dev_extra_installs_what_ci_runs() -> None:
    dev = {canonicalize_name(Requirement(d).name) for d in _project()["optional-dependencies"]["dev"]}
    run = (ROOT / ".ci" / "run").read_text(encoding="utf-8")
    assert {"ruff", "mypy"} <= dev
    assert '".[test,dev]"' in run and "ruff check" in run and ".ci/mypy" in run
    assert "constraints.txt" in run
