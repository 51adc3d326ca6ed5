"""README's deploy paragraph names the Python `sam build` looks for: the functions' runtime and the core
layer's build method in template.yaml. A runtime bump that forgets the README fails here."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def template_runtimes() -> set[str]:
    text = (ROOT / "template.yaml").read_text(encoding="utf-8")
    found = set(re.findall(r"^\s+(?:Runtime|BuildMethod): (python\d+\.\d+)\s*$", text, flags=re.MULTILINE))
    found |= set(re.findall(r"CompatibleRuntimes: \[(python\d+\.\d+)\]", text))
    return found


def test_the_readme_names_the_python_sam_build_needs_and_how_to_do_without_it() -> None:
    runtimes = template_runtimes()
    assert len(runtimes) == 1, f"the functions and the layer should build with one Python: {runtimes}"
    runtime = runtimes.pop()  # e.g. python3.12
    version = runtime.removeprefix("python")
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    deploy = readme[readme.index("## Deploy") :]
    deploy = deploy[: deploy.index("\n## ", 1)]
    assert f"Python {version}, on PATH" in deploy
    assert f"`{runtime}`" in deploy
    assert f"install {version} beside it" in deploy
    assert "sam build --use-container" in deploy
