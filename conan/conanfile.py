"""Packages Kiln (core SDK, kiln app, plugins) with Conan 2.

    conan create conan/ --profile conan/profiles/debian12-gcc12 --build=missing

Kiln's third-party libraries come from the system (Debian packages: toml++, Boost, Catch2, OpenBLAS, Vulkan, CLI11,
zlib; the CUDA toolkit in /usr/local/cuda), as the README's setup.sh installs them; this recipe builds and packages
Kiln itself against them and exports the `kiln::core` CMake target for plugin authors.
"""
from conan import ConanFile
from conan.tools.cmake import CMake, CMakeToolchain, cmake_layout


class KilnConan(ConanFile):
    name = "kiln"
    version = "0.1.0"
    license = "Apache-2.0"
    description = "A C++20 deep-learning training framework built from plugins"
    settings = "os", "compiler", "build_type", "arch"
    options = {"with_vulkan": ["auto", True, False], "with_cuda": ["auto", True, False]}
    default_options = {"with_vulkan": "auto", "with_cuda": "auto"}
    exports_sources = ("../CMakeLists.txt", "../cmake/*", "../core/*", "../backends/*", "../kernels/*",
                       "../plugins/*", "../apps/*", "../bench/*", "../tests/*", "../samples/*")

    def layout(self):
        cmake_layout(self, src_folder="..")

    def generate(self):
        tc = CMakeToolchain(self)
        def flag(v):
            return "AUTO" if v == "auto" else ("ON" if v in (True, "True") else "OFF")
        tc.variables["KILN_WITH_VULKAN"] = flag(self.options.with_vulkan)
        tc.variables["KILN_WITH_CUDA"] = flag(self.options.with_cuda)
        tc.variables["KILN_BUILD_TESTS"] = "OFF"
        tc.generate()

    def build(self):
        cmake = CMake(self)
        cmake.configure()
        cmake.build()

    def package(self):
        CMake(self).install()

    def package_info(self):
        self.cpp_info.set_property("cmake_find_mode", "none")  # use Kiln's own kilnConfig.cmake
        self.cpp_info.builddirs = ["lib/cmake/kiln"]
        self.cpp_info.libs = ["kiln_core"]
