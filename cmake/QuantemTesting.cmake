find_package(GTest REQUIRED)
include(GoogleTest)

# The Python reference (h5py + the official bitshuffle filter + numpy) comes from
# Debian's python3-h5py/python3-hdf5plugin/bitshuffle/python3-numpy: prefer that interpreter.
if(EXISTS /usr/bin/python3)
  set(QUANTEM_PYTHON /usr/bin/python3 CACHE FILEPATH "Python with h5py, hdf5plugin and numpy")
else()
  find_package(Python3 REQUIRED COMPONENTS Interpreter)
  set(QUANTEM_PYTHON ${Python3_EXECUTABLE} CACHE FILEPATH "Python with h5py, hdf5plugin and numpy")
endif()
# Real detector-written files (shared/data/real beside the checkout). Tests that
# need them skip with a message when none of the candidates exists.
set(_quantem_real_data_default "")
foreach(candidate "${CMAKE_SOURCE_DIR}/../shared/data/real" "${CMAKE_SOURCE_DIR}/shared/data/real" "/work/shared/data/real")
  if(_quantem_real_data_default STREQUAL "" AND EXISTS "${candidate}/arina")
    get_filename_component(_quantem_real_data_default "${candidate}" ABSOLUTE)
  endif()
endforeach()
set(QUANTEM_REAL_DATA_DIR "${_quantem_real_data_default}" CACHE PATH "Real detector files (empty: real-data tests skip)")
message(STATUS "quantem-gpu: real detector files: ${QUANTEM_REAL_DATA_DIR}")

# quantem_add_test(NAME SOURCES ... LIBS ... [LABELS ...] [GPU] [GPU_CASES FILTER])
# Tests that need a GPU carry the label "gpu" so CPU machines can run the rest.
# GPU_CASES: a gtest filter (e.g. "ResidentConformance/1.*") naming the cases
# of a mixed suite that need a GPU; only those get the "gpu" label.
function(quantem_add_test name)
  cmake_parse_arguments(ARG "GPU" "GPU_CASES" "SOURCES;LIBS;LABELS" ${ARGN})
  add_executable(${name} ${ARG_SOURCES})
  target_link_libraries(${name} PRIVATE ${ARG_LIBS} quantem_test_support GTest::gtest GTest::gtest_main quantem_warnings quantem_sanitizers)
  set(labels ${ARG_LABELS})
  if(ARG_GPU)
    list(APPEND labels gpu)
  endif()
  if(NOT labels)
    set(labels cpu)  # an empty LABELS value would swallow the next property
  endif()
  # QUANTEM_BINARY is a plain path, not $<TARGET_FILE:quantem-gpu>, so a test
  # target does not depend on the executable (the sanitizer build compiles only
  # the decoder tests); tests that run the binary skip when it is missing.
  # The test environment goes through `cmake -E env` in front of every test
  # command: gtest_discover_tests (CMake 3.25) flattens list-valued PROPERTIES,
  # so an ENVIRONMENT list would reach the tests as its first entry only.
  set_property(TARGET ${name} PROPERTY CROSSCOMPILING_EMULATOR "${CMAKE_COMMAND}" -E env
    "QUANTEM_PYTHON=${QUANTEM_PYTHON}" "QUANTEM_REAL_DATA_DIR=${QUANTEM_REAL_DATA_DIR}"
    "QUANTEM_SOURCE_DIR=${CMAKE_SOURCE_DIR}" "QUANTEM_BINARY=${CMAKE_BINARY_DIR}/src/cli/quantem-gpu"
    "HDF5_PLUGIN_PATH=/usr/lib/x86_64-linux-gnu/hdf5/serial/plugins")
  if(ARG_GPU_CASES)
    gtest_discover_tests(${name} TEST_FILTER "-${ARG_GPU_CASES}"
      PROPERTIES LABELS "${labels}"
      DISCOVERY_TIMEOUT 60)
    gtest_discover_tests(${name} TEST_FILTER "${ARG_GPU_CASES}"
      PROPERTIES LABELS "gpu"  # one value: list-valued PROPERTIES are flattened (see above)
      DISCOVERY_TIMEOUT 60)
  else()
    gtest_discover_tests(${name}
      PROPERTIES LABELS "${labels}"
      DISCOVERY_TIMEOUT 60)
  endif()
endfunction()
