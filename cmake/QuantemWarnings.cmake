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
