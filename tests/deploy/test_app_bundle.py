"""The app bundle (FAB) that `flwr run` ships builds from a source checkout and from the docker image's /app.

The compose demo's data-holder check and any operator inside a container run `flwr run /app`: Flower builds the
FAB from the files the image holds, which are exactly what deploy/docker/Dockerfile copies.  Flower refuses a
`fab-include` / `fab-exclude` pattern that matches no file, so a pattern naming something only a checkout has
(benchmark records, tests) breaks the image while every run from the checkout still works.  These tests assemble
the Dockerfile's file set in a temporary folder, without Docker, and build both FABs with Flower's own builder
(the function `flwr run` calls); about a second.
"""

from __future__ import annotations

import io
import shlex
import shutil
import tomllib
import zipfile
from pathlib import Path, PurePosixPath

import pytest
from flwr.cli.build import build_fab_from_disk

ROOT = Path(__file__).resolve().parents[2]
DOCKERFILE = ROOT / "deploy" / "docker" / "Dockerfile"


def _instructions(dockerfile: Path) -> list[list[str]]:
    """The Dockerfile's instructions, each split into words, with continuation lines joined and comments dropped."""
    lines: list[str] = []
    pending = ""
    for raw in dockerfile.read_text().splitlines():
        line = raw.strip()
        if not pending and (not line or line.startswith("#")):
            continue
        if line.endswith("\\"):
            pending += line[:-1] + " "
            continue
        lines.append(pending + line)
        pending = ""
    return [shlex.split(line) for line in lines]


def image_app_folder(dockerfile: Path, context: Path, into: Path) -> Path:
    """Lay out in ``into`` what the image's working directory holds after the Dockerfile's COPY lines: a copied
    folder's contents land in the destination folder, a file in the destination folder when that ends in ``/``
    or several sources share it.  Returns the working directory's copy (``into`` + WORKDIR)."""
    workdir = PurePosixPath("/")
    copies = []
    for words in _instructions(dockerfile):
        keyword, args = words[0].upper(), [w for w in words[1:] if not w.startswith("--")]
        if keyword == "WORKDIR":
            workdir = workdir / args[0]
        elif keyword in ("COPY", "ADD"):
            *sources, dest = args
            copies.append((sources, workdir / dest, dest.endswith("/") or len(sources) > 1))
    assert copies, f"{dockerfile} copies nothing"
    for sources, target, into_folder in copies:
        for source in sources:
            src = context / source
            assert src.exists(), f"{dockerfile} copies {source}, which the build context does not have"
            dst = into / str(target).lstrip("/")
            if src.is_dir():
                shutil.copytree(src, dst, dirs_exist_ok=True)
            else:
                dst = dst / src.name if into_folder else dst
                dst.parent.mkdir(parents=True, exist_ok=True)
                shutil.copy2(src, dst)
    return into / str(workdir).lstrip("/")


def _manifest(fab: bytes) -> dict[str, str]:
    """The FAB's files and their sha256, from the CONTENT manifest Flower writes into it."""
    with zipfile.ZipFile(io.BytesIO(fab)) as archive:
        lines = archive.read(".info/CONTENT").decode().splitlines()
    return {path: digest for path, digest, _ in (line.rsplit(",", 2) for line in lines)}


@pytest.fixture(scope="module")
def image_app(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return image_app_folder(DOCKERFILE, ROOT, tmp_path_factory.mktemp("image"))


def test_the_image_holds_the_app_where_flwr_run_looks(image_app: Path) -> None:
    """The data-holder check runs `flwr run /app` in a SuperNode's container: /app is the image's app folder."""
    assert image_app.name == "app"
    assert (image_app / "pyproject.toml").is_file()


def test_the_app_bundle_builds_from_the_images_files_and_from_the_checkout_alike(image_app: Path) -> None:
    from_image = _manifest(build_fab_from_disk(image_app))
    from_checkout = _manifest(build_fab_from_disk(ROOT))
    assert from_image == from_checkout


def test_the_app_bundle_is_the_apps_packages_and_nothing_of_the_tests_or_benchmarks() -> None:
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())
    packages = project["tool"]["hatch"]["build"]["targets"]["wheel"]["packages"]
    files = set(_manifest(build_fab_from_disk(ROOT)))
    for package in packages:
        modules = {
            p.relative_to(ROOT).as_posix()
            for p in (ROOT / package).rglob("*.py")
            if "__pycache__" not in p.parts and not p.name.startswith("test_")
        }
        assert modules, package
        assert modules <= files, f"modules of {package} missing from the FAB: {sorted(modules - files)}"
    for component in project["tool"]["flwr"]["app"]["components"].values():
        module = component.split(":")[0].replace(".", "/") + ".py"
        assert module in files, f"the FAB lacks {module}, which [tool.flwr.app.components] names"
    assert not {f for f in files if f.split("/")[0] in ("tests", "benchmarks", "deploy", "docs")}
