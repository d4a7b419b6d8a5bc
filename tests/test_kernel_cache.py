"""numba's cache of the fast engines is dropped when any source they are built from changes
(simulator/kernel_cache.py), on a hand-made package whose import graph is known."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from ddlsim.simulator import kernel_cache
from ddlsim.simulator.kernel_cache import STAMP, cache_folders, engine_sources, refresh


def _package(root: Path) -> Path:
    """fast_a imports helper (which imports deep), protocols.rules and other; unrelated is imported by no one."""
    (root / "protocols").mkdir(parents=True)
    files = {
        "__init__.py": "",
        "fast_a.py": "from . import other\nfrom .helper import h\nfrom .protocols import rules\nimport numpy\n",
        "helper.py": "from .deep import d\nh = 1\n",
        "deep.py": "d = 2\n",
        "other.py": "o = 3\n",
        "unrelated.py": "from .deep import d\n",
        "protocols/__init__.py": "",
        "protocols/rules.py": "from ..deep import d\nr = 4\n",
    }
    for name, text in files.items():
        (root / name).write_text(text)
    return root


def _caches(folder: Path) -> list[Path]:
    folder.mkdir(parents=True, exist_ok=True)
    made = [folder / "fast_a._kernel-10.py311.nbi", folder / "fast_a._kernel-10.py311.1.nbc",
            folder / "helper.h-3.py311.nbi"]
    for f in made:
        f.write_bytes(b"x")
    (folder / "helper.cpython-311.pyc").write_bytes(b"keep")
    return made


def test_the_sources_are_the_fast_modules_and_what_they_import(tmp_path: Path) -> None:
    root = _package(tmp_path / "pkg")
    got = {p.relative_to(root).as_posix() for p in engine_sources(root)}
    # (``from . import other`` runs the package's __init__ as Python does)
    assert got == {"fast_a.py", "helper.py", "deep.py", "other.py", "__init__.py", "protocols/__init__.py",
                   "protocols/rules.py"}


def test_an_edit_of_any_source_drops_the_caches_and_only_then(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("NUMBA_CACHE_DIR", raising=False)
    root = _package(tmp_path / "pkg")
    pyc = root / "__pycache__"
    made = _caches(pyc)
    assert sorted(refresh(root)) == sorted(made)  # no stamp yet: nothing known to be current
    assert (pyc / STAMP).is_file() and (pyc / "helper.cpython-311.pyc").read_bytes() == b"keep"
    made = _caches(pyc)
    assert refresh(root) == []  # the sources are the stamp's
    (root / "unrelated.py").write_text("x = 5\n")
    assert refresh(root) == []  # not a source of the fast engines
    (root / "deep.py").write_text("d = 20\n")  # two imports away from the kernel module
    assert sorted(refresh(root)) == sorted(made)
    assert all(not f.exists() for f in made) and (pyc / "helper.cpython-311.pyc").exists()


def test_numba_cache_dir_folders_follow_numbas_locator(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    caching = pytest.importorskip("numba.core.caching")
    locate = getattr(getattr(caching, "_CacheLocator", None), "get_suitable_cache_subpath", None)
    if locate is None:
        pytest.skip("this numba has no _CacheLocator.get_suitable_cache_subpath")
    root = _package(tmp_path / "pkg")
    monkeypatch.setenv("NUMBA_CACHE_DIR", str(tmp_path / "nbcache"))
    folders = cache_folders([root, root / "protocols"])
    assert folders == [tmp_path / "nbcache" / locate(str(root / "fast_a.py")),
                       tmp_path / "nbcache" / locate(str(root / "protocols" / "rules.py"))]
    made = _caches(folders[0])
    assert sorted(refresh(root)) == sorted(made)
    # imported through a link to the package: numba names the folders by the unresolved path
    link = tmp_path / "linked"
    link.symlink_to(root, target_is_directory=True)
    names = {p.relative_to(link).as_posix() for p in engine_sources(link)}
    assert names == {p.relative_to(root).as_posix() for p in engine_sources(root)}
    assert cache_folders([link]) == [tmp_path / "nbcache" / locate(str(link / "fast_a.py"))] != folders[:1]


def test_this_packages_kernels_count_the_helpers_they_compile() -> None:
    """fast_core compiles dataorder's and the cadence's functions; the gossip engines the rules'."""
    names = {p.relative_to(kernel_cache.HERE).as_posix() for p in engine_sources()}
    assert {"fast_core.py", "fast_ps.py", "fast_nodes.py", "dataorder.py", "protocols/cadence.py",
            "protocols/gossip_rules.py", "protocols/ps.py"} <= names
    assert "ps.py" not in names and "gossip.py" not in names  # the SimPy engines are not compiled


def test_a_folder_that_cannot_be_written_is_left_alone(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("NUMBA_CACHE_DIR", raising=False)
    root = _package(tmp_path / "pkg")
    made = _caches(root / "__pycache__")
    os.chmod(root / "__pycache__", 0o555)
    try:
        if os.access(root / "__pycache__", os.W_OK):
            pytest.skip("running as a user whom permissions do not stop")
        assert refresh(root) == [] and all(f.exists() for f in made)
    finally:
        os.chmod(root / "__pycache__", 0o755)
