"""requirements/requirements.txt and requirements/requirements-jax.txt against pyproject.toml.

Offline, always: every dependency of pyproject.toml (with the envpool and jax extras for the JAX file) is
pinned within its constraint, the two files agree on what they share, torch is pinned to the README's and
the Dockerfile's version without its CUDA libraries, and each file says how it was made. With uv and PyPI
reachable: requirements/compile.sh, run again into a temporary folder, writes the same pins (a change of
pyproject.toml, cloud/constraints.txt or requirements/pins.txt without a new compile fails here)."""

import itertools
import os
import re
import shutil
import subprocess
import sys
import tomllib

import pytest
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name
from running import REPO_ROOT

REQUIREMENTS = os.path.join(REPO_ROOT, "requirements")
FILES = {"requirements.txt": [], "requirements-jax.txt": ["envpool", "jax"]}  # file: the extras it adds
CUDA_PACKAGES = re.compile(r"^(nvidia-|cuda-|triton\b)")
UV = shutil.which("uv", path=os.path.dirname(sys.executable) + os.pathsep + os.environ.get("PATH", ""))


def read(name: str) -> str:
    with open(os.path.join(REQUIREMENTS, name)) as f:
        return f.read()


def pins(text: str) -> dict[str, set[str]]:
    """{package: its pinned versions} of a compiled file (a package may have one line per marker)."""
    pinned = {}
    for line in text.splitlines():
        line = line.split("#", 1)[0].strip()
        if line:
            requirement = Requirement(line)
            (specifier,) = requirement.specifier
            assert specifier.operator == "==", line
            pinned.setdefault(canonicalize_name(requirement.name), set()).add(specifier.version)
    return pinned


def pinned_lines(text: str) -> list[str]:
    return sorted(line.strip() for line in text.splitlines() if line.strip() and not line.lstrip().startswith("#"))


def pyproject_requirements(extras: list[str]) -> list[Requirement]:
    with open(os.path.join(REPO_ROOT, "pyproject.toml"), "rb") as f:
        project = tomllib.load(f)["project"]
    names = project["dependencies"] + [r for extra in extras for r in project["optional-dependencies"][extra]]
    return [Requirement(name) for name in names]


@pytest.mark.parametrize("name", sorted(FILES))
def test_every_dependency_of_pyproject_is_pinned_within_its_constraint(name):
    pinned = pins(read(name))
    for requirement in pyproject_requirements(FILES[name]):
        versions = pinned.get(canonicalize_name(requirement.name))
        assert versions, f"{name} lacks {requirement.name}: run bash requirements/compile.sh"
        for version in versions:
            assert requirement.specifier.contains(version, prereleases=True), (
                f"{name}: {requirement.name}=={version} is outside pyproject's {requirement}: "
                "run bash requirements/compile.sh"
            )


def test_the_two_files_agree_on_what_they_share():
    base, jax = pins(read("requirements.txt")), pins(read("requirements-jax.txt"))
    assert base.keys() <= jax.keys()
    assert {package: base[package] for package in base} == {package: jax[package] for package in base}


def test_torch_is_the_readme_and_dockerfile_version_without_its_cuda_libraries():
    with open(os.path.join(REPO_ROOT, "Dockerfile")) as f:
        dockerfile = f.read()
    with open(os.path.join(REPO_ROOT, "README.md")) as f:
        readme = f.read()
    torch_version = re.search(r"^ARG TORCH_VERSION=(\S+)$", dockerfile, re.MULTILINE)[1]
    jax_version = re.search(r"^ARG JAX_VERSION=(\S+)$", dockerfile, re.MULTILINE)[1]
    assert f"pip install torch=={torch_version}" in readme
    assert pins(read("pins.txt")) == {"torch": {torch_version}, "jax": {jax_version}, "jaxlib": {jax_version}}
    for name in FILES:
        text = read(name)
        assert pins(text)["torch"] == {torch_version}
        cuda = [line for line in text.splitlines() if CUDA_PACKAGES.match(line)]
        assert not cuda, f"{name} pins CUDA libraries of torch: add them to requirements/torch-cuda.txt: {cuda}"


@pytest.mark.parametrize("name", sorted(FILES))
def test_each_file_says_how_it_was_made_why_uv_and_how_torch_is_handled(name):
    header = "\n".join(itertools.takewhile(lambda line: line.startswith("#"), read(name).splitlines()))
    for words in ("requirements/compile.sh", "uv", "pip-tools", "torch", "2.13.0+cpu"):
        assert words in header, words


@pytest.mark.skipif(UV is None, reason="uv is not installed (pip install uv; part of the test extra)")
def test_compile_sh_writes_the_same_pins_today(tmp_path):
    env = {**os.environ, "PATH": os.path.dirname(UV) + os.pathsep + os.environ.get("PATH", "")}
    result = subprocess.run(
        ["bash", os.path.join(REQUIREMENTS, "compile.sh"), str(tmp_path)],
        cwd=REPO_ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    offline = re.search(r"(?i)failed to fetch|dns error|connect|network|offline|timed out", result.stderr)
    if result.returncode != 0 and offline:
        pytest.skip(f"PyPI is not reachable: {result.stderr.strip().splitlines()[-1]}")
    assert result.returncode == 0, result.stderr
    for name in FILES:
        with open(tmp_path / name) as f:
            fresh = f.read()
        assert pinned_lines(fresh) == pinned_lines(read(name)), (
            f"requirements/{name} is out of date: run bash requirements/compile.sh and commit it"
        )
