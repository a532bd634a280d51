"""The one setuptools hook (everything else is in pyproject.toml): a wheel carries the shaders.

build_py copies glsl/ into the package as catchat/glsl/ and compiles every shader variant listed
in tools/spirv-variants.txt to catchat/spirv/NAME-KEY.spv with glslc (tools/build_spirv.py), so an
installed catchat needs glslc only for a variant that is not on the list (see catchat/vk/shaders.py).
An editable install skips this: a source checkout compiles glsl/ on demand.
"""

import importlib.util
from pathlib import Path

from setuptools import setup
from setuptools.command.build_py import build_py

ROOT = Path(__file__).resolve().parent
SHADER_DIRS = ("glsl", "spirv")  # under catchat/ in the build


class BuildPyWithShaders(build_py):
    def run(self):
        super().run()
        if getattr(self, "editable_mode", False):
            return
        spec = importlib.util.spec_from_file_location("build_spirv", ROOT / "tools" / "build_spirv.py")
        build_spirv = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(build_spirv)
        n = build_spirv.build(Path(self.build_lib) / "catchat")
        print(f"catchat: compiled {n} SPIR-V variants into {self.build_lib}/catchat/spirv")

    def get_outputs(self, include_bytecode=True):
        pkg = Path(self.build_lib) / "catchat"
        extra = [str(p) for d in SHADER_DIRS for p in sorted((pkg / d).rglob("*")) if p.is_file()]
        return super().get_outputs(include_bytecode) + extra


setup(cmdclass={"build_py": BuildPyWithShaders})
