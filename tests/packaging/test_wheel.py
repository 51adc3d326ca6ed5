"""The built wheel, installed the way a user installs it (not editable, in a fresh virtual environment, run
from a directory that is not the source checkout), runs the local stack: `sagequeue demo` passes.

Slow (a wheel build and a dependency install): .ci/run runs it as a step of its own.
"""

from __future__ import annotations

import os
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]

pytestmark = pytest.mark.slow


def _clean_environment(home: Path) -> dict[str, str]:
    """No AWS configuration, no sagequeue variables, a home of its own."""
    keep = ("PATH", "LANG", "LC_ALL", "TMPDIR", "PIP_INDEX_URL", "PIP_EXTRA_INDEX_URL", "PIP_FIND_LINKS")
    env = {name: os.environ[name] for name in keep if name in os.environ}
    env.update(HOME=str(home), PIP_DISABLE_PIP_VERSION_CHECK="1")
    return env


@pytest.fixture(scope="module")
def wheel(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("dist")
    subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "-w", str(out), str(ROOT)],
        check=True,
        cwd=ROOT,
        timeout=300,
    )
    (found,) = out.glob("sagequeue-*.whl")
    return found


def test_the_wheel_carries_the_template_and_every_function(wheel: Path) -> None:
    names = set(zipfile.ZipFile(wheel).namelist())
    assert "sagequeue/local/stack_files/template.yaml" in names
    functions = sorted(p.parent.name for p in (ROOT / "functions").glob("*/app.py"))
    assert functions, "the source tree has no functions"
    for function in functions:
        assert f"sagequeue/local/stack_files/functions/{function}/app.py" in names
    # the copies are the sources, byte for byte
    with zipfile.ZipFile(wheel) as archive:
        assert (
            archive.read("sagequeue/local/stack_files/template.yaml") == (ROOT / "template.yaml").read_bytes()
        )


def test_the_installed_wheel_runs_the_demo_outside_the_checkout(wheel: Path, tmp_path: Path) -> None:
    home = tmp_path / "home"
    home.mkdir()
    env = _clean_environment(home)
    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True, timeout=120)
    subprocess.run(
        [str(venv / "bin" / "python"), "-m", "pip", "install", "-q", f"{wheel}[local]"],
        check=True,
        env=env,
        cwd=tmp_path,
        timeout=540,
    )
    # the installed package, not the checkout, is what runs
    where = subprocess.run(
        [str(venv / "bin" / "python"), "-c", "import sagequeue; print(sagequeue.__file__)"],
        capture_output=True,
        text=True,
        check=True,
        env=env,
        cwd=tmp_path,
    ).stdout.strip()
    assert where.startswith(str(venv)), where
    demo = subprocess.run(
        [str(venv / "bin" / "sagequeue"), "demo"],
        capture_output=True,
        text=True,
        env=env,
        cwd=tmp_path,
        timeout=300,
    )
    assert demo.returncode == 0, demo.stdout[-2000:] + demo.stderr[-2000:]
    assert "Demo passed" in demo.stdout
    assert "Traceback" not in demo.stderr
