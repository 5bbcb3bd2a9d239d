# Installs the SDK so third-party plugins build with find_package(kiln): kiln::core, kiln::warnings and
# kiln_add_plugin(). kiln::train (runs, checkpoints, the conformance suite) is installed because the kiln app links it;
# a program that drives runs itself links it too, a plugin never needs it.
include(CMakePackageConfigHelpers)
install(TARGETS kiln_core kiln_train kiln_warnings EXPORT kilnTargets
  LIBRARY DESTINATION ${CMAKE_INSTALL_LIBDIR}
  INCLUDES DESTINATION ${CMAKE_INSTALL_INCLUDEDIR})
install(DIRECTORY ${PROJECT_SOURCE_DIR}/core/include/kiln DESTINATION ${CMAKE_INSTALL_INCLUDEDIR})
# Plugins' Vulkan shaders (kiln/kernel_registry.hpp ShaderKernel) include Kiln's kernel conventions.
install(FILES ${PROJECT_SOURCE_DIR}/kernels/vulkan/common.glsl DESTINATION ${CMAKE_INSTALL_INCLUDEDIR}/kiln/vulkan)
install(EXPORT kilnTargets NAMESPACE kiln:: DESTINATION ${CMAKE_INSTALL_LIBDIR}/cmake/kiln)
configure_package_config_file(${PROJECT_SOURCE_DIR}/cmake/kilnConfig.cmake.in
  ${CMAKE_BINARY_DIR}/kilnConfig.cmake INSTALL_DESTINATION ${CMAKE_INSTALL_LIBDIR}/cmake/kiln
  PATH_VARS CMAKE_INSTALL_INCLUDEDIR)
write_basic_package_version_file(${CMAKE_BINARY_DIR}/kilnConfigVersion.cmake COMPATIBILITY SameMinorVersion)
install(FILES ${CMAKE_BINARY_DIR}/kilnConfig.cmake ${CMAKE_BINARY_DIR}/kilnConfigVersion.cmake
  ${PROJECT_SOURCE_DIR}/cmake/KilnPlugin.cmake DESTINATION ${CMAKE_INSTALL_LIBDIR}/cmake/kiln)
