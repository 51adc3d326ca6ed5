"""Build hook: the wheel carries what the local stack runs (template.yaml and the functions' code).

They live at the project's root, where `sam build` and `sam deploy` read them; the wheel copies them into
`sagequeue/local/stack_files/`, which `sagequeue.local.stack.default_template_path()` reads when the package
is not running from a source checkout. Everything else is in pyproject.toml.
"""

from __future__ import annotations

import shutil
from pathlib import Path

from setuptools import setup
from setuptools.command.build_py import build_py

ROOT = Path(__file__).resolve().parent
STACK_FILES = ("template.yaml", "functions/*/*.py")


class BuildWithStackFiles(build_py):  # type: ignore[misc]
    def run(self) -> None:
        super().run()
        if self.editable_mode:
            return  # an editable install reads the source checkout
        target = Path(self.build_lib, "sagequeue", "local", "stack_files")
        for pattern in STACK_FILES:
            sources = sorted(ROOT.glob(pattern))
            if not sources:
                raise FileNotFoundError(f"{pattern} is missing: the local stack cannot run without it")
            for source in sources:
                destination = target / source.relative_to(ROOT)
                destination.parent.mkdir(parents=True, exist_ok=True)
                shutil.copyfile(source, destination)


setup(cmdclass={"build_py": BuildWithStackFiles})
