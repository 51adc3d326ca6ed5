"""The built wheel, installed the way a user installs it (not editable, in a fresh virtual environment, run
from a directory that is not the source checkout), runs the local stack: `sagequeue demo` passes, and every
`--help` of the command runs. The README's "try it" command, run as written in a copy of the checkout,
installs a `sagequeue` whose every `--help` runs too.

Slow (a wheel build and dependency installs): .ci/run runs it as a step of its own.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest
from support.cli_help import every_help, failures

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


class Install:
    """A virtual environment with sagequeue installed, and how to run its command as a user would."""

    def __init__(self, venv: Path, home: Path, cwd: Path) -> None:
        self.venv, self.home, self.cwd = venv, home, cwd
        self.env = _clean_environment(home)

    def run(self, args: list[str] | tuple[str, ...], timeout: int = 120) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [str(self.venv / "bin" / "sagequeue"), *args],
            capture_output=True,
            text=True,
            env=self.env,
            cwd=self.cwd,
            timeout=timeout,
            check=False,
        )


@pytest.fixture(scope="module")
def installed_wheel(wheel: Path, tmp_path_factory: pytest.TempPathFactory) -> Install:
    tmp_path = tmp_path_factory.mktemp("wheel-install")
    home = tmp_path / "home"
    home.mkdir()
    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True, timeout=120)
    install = Install(venv, home, tmp_path)
    subprocess.run(
        [str(venv / "bin" / "python"), "-m", "pip", "install", "-q", f"{wheel}[local]"],
        check=True,
        env=install.env,
        cwd=tmp_path,
        timeout=540,
    )
    return install


def test_the_installed_wheel_runs_the_demo_outside_the_checkout(installed_wheel: Install) -> None:
    venv, env, tmp_path = installed_wheel.venv, installed_wheel.env, installed_wheel.cwd
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


def test_every_help_of_the_installed_wheel_runs(installed_wheel: Install) -> None:
    answers = every_help(installed_wheel.run)

    assert failures(answers) == []
    assert {(), ("ls",), ("cache",), ("cache", "ls"), ("local",), ("local", "env")} <= set(answers)


def _readme_try_it() -> str:
    """The README's "try it" command line, as a reader copies it."""
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    section = readme.split("## Try it", 1)[1]
    (block,) = re.findall(r"```bash\n(.*?)\n```", section.split("\n## ", 1)[0], flags=re.S)[:1]
    assert block.startswith("python3 -m venv .venv && "), block
    return block


def test_the_readmes_try_it_runs_as_written_and_every_help_of_it(tmp_path: Path) -> None:
    # GIVEN a fresh copy of the checkout (its tracked files and those about to be), no .venv in it
    listed = subprocess.run(
        ["git", "ls-files", "--cached", "--others", "--exclude-standard"],
        capture_output=True,
        text=True,
        check=True,
        cwd=ROOT,
    ).stdout.split()
    clone = tmp_path / "sagequeue"
    for name in listed:
        source = ROOT / name
        if source.is_file():
            (clone / name).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(source, clone / name)
    home = tmp_path / "home"
    home.mkdir()
    env = _clean_environment(home)
    env["PATH"] = os.pathsep.join(
        [str(Path(sys.executable).resolve().parent), env.get("PATH", "")]
    )  # the `python3` of the README is this interpreter's

    # WHEN the README's command runs, word for word
    command = _readme_try_it()
    done = subprocess.run(
        ["bash", "-c", command], capture_output=True, text=True, env=env, cwd=clone, timeout=900, check=False
    )

    # THEN it installs, the demo passes, and every --help of the command it installed runs
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
    assert "Demo passed" in done.stdout
    answers = every_help(Install(clone / ".venv", home, clone).run)
    assert failures(answers) == []
    assert {(), ("ls",), ("cache",), ("cache", "ls"), ("simulate",)} <= set(answers)
