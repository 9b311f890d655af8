# Writes version.cpp with the source tree's git revision, at every build (not
# only at configure time), so that a rebuild after a commit or an edit never
# keeps the old revision: the daemon's ETags include it (docs/protocol.md).
# configure_file rewrites the file only when its text changes, so an unchanged
# tree rebuilds nothing.
#
#   cmake -DSOURCE_DIR=... -DTEMPLATE=... -DOUTPUT=... -DPROJECT_VERSION=... -P write_version.cmake
#
# The revision: the commit (git rev-parse HEAD); with uncommitted changes to
# the tracked files that go into the binaries (CMake files, cmake/, include/,
# kernels/, src/, web/), "<commit>-modified-<first 12 hex digits of the SHA-1
# of their git diff>", so two different edits never share it (edits to docs or
# tests change nothing); outside a git checkout (a source tarball),
# "unrecorded-<project version>".
execute_process(COMMAND git rev-parse HEAD WORKING_DIRECTORY "${SOURCE_DIR}"
  OUTPUT_VARIABLE QUANTEM_GIT_REVISION OUTPUT_STRIP_TRAILING_WHITESPACE ERROR_QUIET RESULT_VARIABLE git_result)
if(NOT git_result EQUAL 0 OR QUANTEM_GIT_REVISION STREQUAL "")
  set(QUANTEM_GIT_REVISION "unrecorded-${PROJECT_VERSION}")
else()
  execute_process(COMMAND git diff HEAD --no-ext-diff -- CMakeLists.txt cmake include kernels src web
    WORKING_DIRECTORY "${SOURCE_DIR}"
    OUTPUT_VARIABLE uncommitted ERROR_QUIET RESULT_VARIABLE diff_result)
  if(diff_result EQUAL 0 AND NOT uncommitted STREQUAL "")
    string(SHA1 uncommitted_digest "${uncommitted}")
    string(SUBSTRING "${uncommitted_digest}" 0 12 uncommitted_digest)
    set(QUANTEM_GIT_REVISION "${QUANTEM_GIT_REVISION}-modified-${uncommitted_digest}")
  endif()
endif()
configure_file("${TEMPLATE}" "${OUTPUT}" @ONLY)
