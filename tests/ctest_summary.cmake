# Run by ctest after the tests (CTEST_CUSTOM_POST_TEST, see CTestCustom.cmake.in): counts passed, skipped and failed
# tests from Testing/Temporary/LastTest.log. CTest's own line ("100% tests passed ... out of N") counts a skipped
# test among the passed ones; this line does not. A test is skipped when its output has the marker that
# KILN_SKIP prints (tests/test_main.cpp) and it did not fail.
set(log "${CMAKE_ARGV3}/Testing/Temporary/LastTest.log")
if(NOT EXISTS "${log}")
  return()
endif()
file(READ "${log}" text)
string(REGEX MATCHALL "\n[0-9]+/[0-9]+ Testing: [^\n]*\n" starts "${text}")
list(LENGTH starts total)
# One chunk per test: split where each "n/m Testing:" line begins (after taking out what CMake lists treat as
# separators or brackets).
string(REPLACE ";" "," text "${text}")
string(REPLACE "[" "(" text "${text}")
string(REPLACE "]" ")" text "${text}")
string(REGEX REPLACE "\n([0-9]+/[0-9]+ Testing: )" ";\\1" chunks "${text}")
set(passed 0)
set(skipped 0)
set(failed 0)
foreach(c IN LISTS chunks)
  if(NOT c MATCHES "^[0-9]+/[0-9]+ Testing: ")
    continue()
  endif()
  if(c MATCHES "\nTest Passed\\.")
    if(c MATCHES "KILN-SKIPPED:")
      math(EXPR skipped "${skipped} + 1")
    else()
      math(EXPR passed "${passed} + 1")
    endif()
  else()
    math(EXPR failed "${failed} + 1")
  endif()
endforeach()
execute_process(COMMAND "${CMAKE_COMMAND}" -E echo
  "\nKiln tests: ${passed} passed, ${skipped} skipped (did not run: no device or data on this host), ${failed} failed, of ${total}")
