# kiln_add_plugin(NAME SOURCES src... [LIBS lib...] [INCLUDES dir...])
# Builds libkiln_<NAME>.so as a loadable module next to the other plugins, linked against kiln::core, with Kiln's
# warnings (kiln::warnings). Installed to <libdir>/kiln unless KILN_INSTALL is OFF.
function(kiln_add_plugin name)
  cmake_parse_arguments(P "" "" "SOURCES;LIBS;INCLUDES" ${ARGN})
  set(target kiln_${name})
  add_library(${target} MODULE ${P_SOURCES})
  target_link_libraries(${target} PRIVATE kiln::core kiln::warnings ${P_LIBS})
  target_include_directories(${target} PRIVATE ${P_INCLUDES})
  set_target_properties(${target} PROPERTIES
    LIBRARY_OUTPUT_DIRECTORY ${KILN_PLUGIN_OUTPUT_DIR}
    CXX_VISIBILITY_PRESET hidden
    VISIBILITY_INLINES_HIDDEN ON
    INSTALL_RPATH "$ORIGIN/..")
  if(NOT DEFINED KILN_INSTALL OR KILN_INSTALL)
    install(TARGETS ${target} LIBRARY DESTINATION ${CMAKE_INSTALL_LIBDIR}/kiln)
  endif()
  set_property(GLOBAL APPEND PROPERTY KILN_ALL_PLUGINS_PROP ${target})
endfunction()
