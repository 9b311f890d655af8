# Warnings and sanitizers as INTERFACE targets that every component links.
add_library(quantem_warnings INTERFACE)
target_compile_options(quantem_warnings INTERFACE
  $<$<COMPILE_LANGUAGE:CXX>:-Wall -Wextra -Wpedantic -Wshadow -Wnon-virtual-dtor -Wcast-align -Wunused -Woverloaded-virtual>)

add_library(quantem_sanitizers INTERFACE)
if(QUANTEM_SANITIZE)
  target_compile_options(quantem_sanitizers INTERFACE
    $<$<COMPILE_LANGUAGE:CXX>:-fsanitize=address,undefined -fno-sanitize-recover=undefined -fno-omit-frame-pointer>)
  target_link_options(quantem_sanitizers INTERFACE -fsanitize=address,undefined)
endif()

# The fuzz build: coverage for libFuzzer in every library (the fuzz targets
# themselves link -fsanitize=fuzzer, tests/fuzz/CMakeLists.txt), with ASan + UBSan.
if(QUANTEM_FUZZ)
  if(NOT CMAKE_CXX_COMPILER_ID STREQUAL "Clang")
    message(FATAL_ERROR "QUANTEM_FUZZ=ON needs clang (-DCMAKE_CXX_COMPILER=clang++ -DCMAKE_C_COMPILER=clang)")
  endif()
  target_compile_options(quantem_sanitizers INTERFACE
    $<$<COMPILE_LANGUAGE:CXX,C>:-fsanitize=fuzzer-no-link,address,undefined -fno-sanitize-recover=undefined -fno-omit-frame-pointer>)
  target_link_options(quantem_sanitizers INTERFACE -fsanitize=address,undefined)
endif()
