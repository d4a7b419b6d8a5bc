"""Packaging: the repository root is the package ``ddlsim`` (pyproject.toml maps it), and
every folder below it with an ``__init__.py`` is a subpackage, found here, not listed by hand
(a hand-written list once missed ``ddlsim.simulator.protocols`` and broke every wheel)."""

from setuptools import find_packages, setup
from setuptools.command.build_py import build_py

SUBPACKAGES = find_packages(exclude=("tests", "tests.*", "benchmarks", "benchmarks.*", "build", "build.*"))


class BuildPy(build_py):
    """The package's modules, without this file (it sits in the package's folder)."""

    def find_package_modules(self, package: str, package_dir: str) -> list[tuple[str, str, str]]:
        found = super().find_package_modules(package, package_dir)
        return [m for m in found if not (package == "ddlsim" and m[1] == "setup")]


setup(packages=["ddlsim"] + [f"ddlsim.{p}" for p in SUBPACKAGES], cmdclass={"build_py": BuildPy})
