"""The one build step pyproject.toml cannot declare: the bundled pipelines (the top-level
``pipelines/``, their source) ship inside the wheel as ``tianji_dask/pipelines/``."""

from pathlib import Path

from setuptools import setup
from setuptools.command.build_py import build_py


class BuildWithPipelines(build_py):
    def run(self):
        super().run()
        target = Path(self.build_lib) / "tianji_dask" / "pipelines"
        target.mkdir(parents=True, exist_ok=True)
        for source in sorted((Path(__file__).resolve().parent / "pipelines").glob("*.yaml")):
            self.copy_file(str(source), str(target / source.name))


setup(cmdclass={"build_py": BuildWithPipelines})
