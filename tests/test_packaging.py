"""What a wheel or sdist carries besides the Python files: every ``package-data`` pattern in
pyproject.toml must name files that exist (a pattern matching nothing silently ships nothing),
and the files an installed maitred needs at run time must be among them."""

import tomllib
from pathlib import Path

ROOT = Path(__file__).parents[1]


def _package_data() -> dict[str, list[str]]:
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())
    data: dict[str, list[str]] = project["tool"]["setuptools"]["package-data"]
    return data


def _shipped() -> set[Path]:
    """The data files setuptools would put in the wheel, as paths under the repository."""
    files: set[Path] = set()
    for package, patterns in _package_data().items():
        folder = ROOT / package.replace(".", "/")
        for pattern in patterns:
            matched = {p for p in folder.glob(pattern) if p.is_file()}
            assert matched, f"package-data {package!r}: {pattern!r} matches no file"
            files |= matched
    return files


def test_every_package_data_pattern_names_files_that_exist() -> None:
    _shipped()


def test_the_type_marker_the_sim_model_and_the_migration_template_ship() -> None:
    shipped = {p.relative_to(ROOT).as_posix() for p in _shipped()}
    model = ROOT / "maitred/sim/worker/assets/sim-model"
    assert "maitred/py.typed" in shipped  # PEP 561: type checkers read maitred's annotations
    assert {p.relative_to(ROOT).as_posix() for p in model.iterdir()} <= shipped  # the sim-worker's --model-path default
    assert "maitred/sim/worker/assets/sim-model/tokenizer.json" in shipped
    assert "maitred/storage/migrations/script.py.mako" in shipped  # Alembic's template for new revisions
