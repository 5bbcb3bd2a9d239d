"""Packages Kiln (core SDK, kiln app, plugins) with Conan 2.

    conan create conan/ --profile:all conan/profiles/debian12-gcc12 -o "kiln/*:with_vulkan=False"

Kiln's third-party libraries come from the system (Debian packages: toml++, Boost, Catch2, OpenBLAS, oneDNN, Vulkan,
CLI11, zlib; the CUDA toolkit in /usr/local/cuda), as the README's setup.sh installs them; this recipe builds and packages
Kiln itself against them (it requires no ConanCenter package) and exports Kiln's own `kiln::core` CMake config
(find_package(kiln), kiln_add_plugin()) for plugin authors. conan/test_package builds a plugin against the package and
loads it with the packaged `kiln` app. docs/plugin_guide.md, "Kiln as a Conan package".
"""
import os

from conan import ConanFile
from conan.tools.cmake import CMake, CMakeToolchain, cmake_layout
from conan.tools.env import Environment
from conan.tools.files import copy

# What the build reads, relative to the repository root (the recipe's parent folder). Tests, benchmarks, samples,
# docs and any build tree stay out: the package builds with KILN_BUILD_TESTS and KILN_BUILD_BENCH off.
_SOURCES = ("CMakeLists.txt", "cmake/*", "core/*", "backends/*", "kernels/*", "plugins/*", "apps/*", "data/*")
# Build trees and files that are never sources, should a checkout hold them inside those folders.
_EXCLUDES = ("*/build/*", "*/build-*/*", "*/__pycache__/*", "*.pyc")


class KilnConan(ConanFile):
    name = "kiln"
    version = "0.1.0"
    license = "Apache-2.0"
    description = "A C++20 deep-learning training framework built from plugins"
    settings = "os", "compiler", "build_type", "arch"
    # with_vulkan / with_cuda: the optional backends, AUTO (if the system has the toolkit), True (required) or False.
    options = {"with_vulkan": ["auto", True, False], "with_cuda": ["auto", True, False]}
    default_options = {"with_vulkan": "auto", "with_cuda": "auto"}

    def export_sources(self):
        # Conan 2 refuses exports_sources patterns that leave the recipe folder ("../"): copy from the parent here.
        root = os.path.normpath(os.path.join(self.recipe_folder, ".."))
        for pattern in _SOURCES:
            copy(self, pattern, root, self.export_sources_folder, excludes=_EXCLUDES)

    def layout(self):
        # In the cache the exported sources are the source folder; a local `conan build conan/` reads the checkout.
        local = not os.path.exists(os.path.join(self.recipe_folder, "CMakeLists.txt")) and \
            os.path.exists(os.path.join(self.recipe_folder, "..", "CMakeLists.txt"))
        cmake_layout(self, src_folder=".." if local else ".")

    def generate(self):
        tc = CMakeToolchain(self)

        def flag(v):
            return "AUTO" if v == "auto" else ("ON" if v in (True, "True") else "OFF")
        tc.cache_variables["KILN_WITH_VULKAN"] = flag(self.options.with_vulkan)
        tc.cache_variables["KILN_WITH_CUDA"] = flag(self.options.with_cuda)
        tc.cache_variables["KILN_BUILD_TESTS"] = "OFF"
        tc.cache_variables["KILN_BUILD_BENCH"] = "OFF"
        # The Python module is installed with pip (pyproject.toml), not as part of the C++ package.
        tc.cache_variables["KILN_PYTHON"] = "OFF"
        tc.cache_variables["KILN_INSTALL"] = "ON"
        tc.generate()
        # Kiln's CMakeLists compiles through ccache when it is installed. Each `conan create` builds in a new folder
        # of the cache; with the base dir set to the source folder ccache sees relative paths and hits across them.
        env = Environment()
        env.define("CCACHE_BASEDIR", self.source_folder)
        env.define("CCACHE_NOHASHDIR", "true")
        env.vars(self, scope="build").save_script("kiln_ccache")

    def build(self):
        cmake = CMake(self)
        cmake.configure()
        cmake.build()

    def package(self):
        CMake(self).install()

    def package_info(self):
        # Consumers use Kiln's own kilnConfig.cmake (kiln::core, kiln::warnings, kiln_add_plugin), not a generated one.
        self.cpp_info.set_property("cmake_find_mode", "none")
        self.cpp_info.builddirs = ["lib/cmake/kiln"]
        # kiln_core is what plugins link; kiln_train (runs, checkpoints, conformance) is what the kiln app adds.
        self.cpp_info.libs = ["kiln_train", "kiln_core"]
        # bin/kiln: the run environment (VirtualRunEnv, test_package's run()) puts it on PATH.
        self.cpp_info.bindirs = ["bin"]
