"""The wheel `pip install saga-engine` gets: the library and its data, and nothing else.

The demo (services_demo/) and the tests run from the checkout; installing the package
must not put a top-level ``services_demo`` (or ``tests``) package into site-packages.
The wheel is built from a copy of the checkout's files, so no build output lands in it.
"""

from __future__ import annotations

import configparser
import shutil
import subprocess
import sys
import tomllib
import zipfile
from importlib.metadata import PackageNotFoundError, version

import pytest

from tests.doc_blocks import ROOT

PYPROJECT = tomllib.loads((ROOT / "pyproject.toml").read_text())
#: The first setuptools that reads `license` as an SPDX expression (PEP 639).
_SETUPTOOLS_WITH_PEP_639 = (77,)


def _local_setuptools_suffices() -> bool:
    try:
        installed = version("setuptools")
    except PackageNotFoundError:
        return False
    return tuple(int(p) for p in installed.split(".")[:1]) >= _SETUPTOOLS_WITH_PEP_639


@pytest.fixture(scope="module")
def wheel(tmp_path_factory: pytest.TempPathFactory) -> zipfile.ZipFile:
    source = tmp_path_factory.mktemp("source")
    shutil.copy(ROOT / "pyproject.toml", source)
    shutil.copy(ROOT / "README.md", source)
    junk = shutil.ignore_patterns("__pycache__", "*.pyc", "*.egg-info")
    for package in ("saga_engine", "services_demo", "tests"):
        shutil.copytree(ROOT / package, source / package, ignore=junk)
    out = tmp_path_factory.mktemp("dist")
    command = [sys.executable, "-m", "pip", "wheel", "--no-deps", "-q", "-w", str(out)]
    # With a recent enough setuptools in this environment the build needs no index;
    # otherwise pip fetches the build requirements, as `pip install` from source does.
    if _local_setuptools_suffices():
        command.append("--no-build-isolation")
    build = subprocess.run(
        [*command, str(source)], capture_output=True, text=True, timeout=300, check=False
    )
    assert build.returncode == 0, build.stdout + build.stderr
    [built] = out.glob("saga_engine-*.whl")
    return zipfile.ZipFile(built)


def test_the_wheel_holds_only_the_library(wheel: zipfile.ZipFile) -> None:
    names = wheel.namelist()
    dist_info = f"saga_engine-{PYPROJECT['project']['version']}.dist-info"
    assert {n.split("/")[0] for n in names} == {"saga_engine", dist_info}
    assert not [n for n in names if n.startswith(("services_demo/", "tests/"))]
    assert wheel.read(f"{dist_info}/top_level.txt").decode().split() == ["saga_engine"]
    scripts = configparser.ConfigParser()
    scripts.read_string(wheel.read(f"{dist_info}/entry_points.txt").decode())
    assert scripts["console_scripts"]["saga"] == "saga_engine.cli:main"


def test_the_wheel_holds_every_module_and_its_data(wheel: zipfile.ZipFile) -> None:
    names = set(wheel.namelist())
    source = ROOT / "saga_engine"
    modules = {
        p.relative_to(ROOT).as_posix() for p in source.rglob("*.py") if "__pycache__" not in p.parts
    }
    assert "saga_engine/cli/__init__.py" in modules
    assert "saga_engine/core/runtime/_runtime.py" in modules
    assert modules <= names, sorted(modules - names)
    # Every package-data pattern of pyproject.toml matches files, and all of them shipped.
    data = PYPROJECT["tool"]["setuptools"]["package-data"]
    for package, patterns in data.items():
        folder = ROOT / package.replace(".", "/")
        for pattern in patterns:
            files = {p.relative_to(ROOT).as_posix() for p in folder.glob(pattern) if p.is_file()}
            assert files, f"{package}: {pattern} matches nothing"
            assert files <= names, sorted(files - names)
    for needed in (
        "saga_engine/py.typed",
        "saga_engine/store/migrations/0001_initial.sql",
        "saga_engine/participant/migrations/0001_participant.sql",
        "saga_engine/admin/templates/base.html",
        "saga_engine/admin/static/admin.css",
    ):
        assert needed in names, needed
