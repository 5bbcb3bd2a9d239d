# Run by ctest after the tests (CTEST_CUSTOM_POST_TEST, see CTestCustom.cmake.in): counts the Catch2 test cases
# that passed, were skipped and failed in this run. CTest's own line ("100% tests passed ... out of N") counts a
# skipped test among the passed ones; this line does not. tests/test_main.cpp writes one line per test case to
# Testing/Temporary/KilnTestCases.log, which ctest clears before the run (CTEST_CUSTOM_PRE_TEST).
set(log "${CMAKE_ARGV3}/Testing/Temporary/KilnTestCases.log")
set(passed 0)
set(skipped 0)
set(failed 0)
if(EXISTS "${log}")
  file(STRINGS "${log}" lines)
  foreach(l IN LISTS lines)
    if(l MATCHES "^passed\t")
      math(EXPR passed "${passed} + 1")
    elseif(l MATCHES "^skipped\t")
      math(EXPR skipped "${skipped} + 1")
    else()
      math(EXPR failed "${failed} + 1")
    endif()
  endforeach()
endif()
execute_process(COMMAND "${CMAKE_COMMAND}" -E echo
  "\nKiln test cases: ${passed} passed, ${skipped} skipped (not run: no device or data on this host), ${failed} failed (a test that crashed is not counted here; scripts such as sdk_plugin_test.sh neither)")
