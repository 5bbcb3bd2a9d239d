"""Kiln's test_package: builds a plugin against the package (find_package(kiln), kiln_add_plugin), then the packaged
`kiln` app must list it (`kiln plugins --plugin-dir`) and train one epoch of a tiny model that uses its layer."""
import io
import os
import re

from conan import ConanFile
from conan.errors import ConanException
from conan.tools.build import can_run
from conan.tools.cmake import CMake, cmake_layout


class KilnTestPackageConan(ConanFile):
    settings = "os", "compiler", "build_type", "arch"
    generators = "CMakeToolchain", "VirtualRunEnv"
    test_type = "explicit"

    def requirements(self):
        self.requires(self.tested_reference_str)

    def layout(self):
        cmake_layout(self)

    def build(self):
        cmake = CMake(self)
        cmake.configure()
        cmake.build()

    def _kiln(self, args):
        kiln = os.path.join(self.dependencies["kiln"].package_folder, "bin", "kiln")
        plugins = os.path.join(self.build_folder, "plugins")
        out = io.StringIO()
        # A failing command raises ConanException with its exit code; its output is printed above.
        self.run(f'"{kiln}" --plugin-dir "{plugins}" {args}', env="conanrun", stdout=out, stderr=out)
        text = out.getvalue()
        self.output.info(text)
        return text

    def test(self):
        if not can_run(self):
            return
        listed = self._kiln("plugins")
        for want in ("conan_check", "layer conan_dense"):
            if want not in listed:
                raise ConanException(f"test_package: `kiln plugins` does not list '{want}'")
        run_dir = os.path.join(self.build_folder, "run")
        config = os.path.join(self.source_folder, "tiny.toml")
        trained = self._kiln(f'train "{config}" --overwrite --set train.output_dir=\'"{run_dir}"\'')
        m = re.search(r"final test accuracy ([0-9.]+)", trained)
        if not m:
            raise ConanException("test_package: the run with the plugin's layer printed no final test accuracy")
        if float(m.group(1)) < 0.5:
            raise ConanException(f"test_package: the run with the plugin's layer did not learn: test accuracy {m.group(1)}, "
                                 "expected >= 0.5 (chance is 0.25)")
        self.output.success("test_package: the packaged kiln loaded the plugin and trained with its layer")
