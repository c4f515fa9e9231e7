"""The build's one addition to pyproject.toml: the checkout's ``scoring.yaml`` in the package.

The root ``scoring.yaml`` is the contract's canonical file in a checkout (the docs and tests name
it there); an installed wheel has no checkout root, so the build copies that file, byte for byte,
to ``grader/scoring.yaml`` in the built package, where `grader.config.DEFAULT_PATH` looks first.
No second copy is kept in the source tree to drift (``tests/test_package.py`` checks the wheel's
copy equals the root file).
"""

from pathlib import Path

from setuptools import setup
from setuptools.command.build_py import build_py

ROOT = Path(__file__).resolve().parent


class BuildPy(build_py):
    def run(self) -> None:
        super().run()
        if not self.editable_mode:  # an editable install reads the checkout's own file
            target = Path(self.build_lib) / "grader" / "scoring.yaml"
            self.copy_file(str(ROOT / "scoring.yaml"), str(target), preserve_mode=False)

    def get_outputs(self, include_bytecode: bool = True) -> list[str]:
        outputs = super().get_outputs(include_bytecode)
        if not self.editable_mode:
            outputs.append(str(Path(self.build_lib) / "grader" / "scoring.yaml"))
        return outputs


setup(cmdclass={"build_py": BuildPy})
