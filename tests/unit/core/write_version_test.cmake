# write_version.cmake records the tree's revision at every build: the commit
# for a clean tree, "<commit>-modified-<digest>" (a different digest for a
# different edit) for uncommitted changes to what the binaries are built from,
# "unrecorded-<version>" outside git;
# and it leaves version.cpp untouched when the revision did not change.
#
#   cmake -DWRITE_VERSION=... -DTEMPLATE=... -DWORK=... -P write_version_test.cmake
file(REMOVE_RECURSE "${WORK}")
file(MAKE_DIRECTORY "${WORK}/repo" "${WORK}/plain")
# No repository above WORK counts (the build tree may sit in a checkout).
set(ENV{GIT_CEILING_DIRECTORIES} "${WORK}")
set(ENV{GIT_CONFIG_GLOBAL} "/dev/null")

function(git)
  execute_process(COMMAND git ${ARGN} WORKING_DIRECTORY "${WORK}/repo" RESULT_VARIABLE result
    OUTPUT_VARIABLE output ERROR_VARIABLE error OUTPUT_STRIP_TRAILING_WHITESPACE)
  if(NOT result EQUAL 0)
    message(FATAL_ERROR "git ${ARGN} failed: ${error}")
  endif()
  set(git_output "${output}" PARENT_SCOPE)
endfunction()

function(recorded_revision source_dir out_var)
  execute_process(COMMAND "${CMAKE_COMMAND}" -DSOURCE_DIR=${source_dir} -DTEMPLATE=${TEMPLATE}
    -DOUTPUT=${WORK}/version.cpp -DPROJECT_VERSION=9.8.7 -P "${WRITE_VERSION}" RESULT_VARIABLE result ERROR_VARIABLE error)
  if(NOT result EQUAL 0)
    message(FATAL_ERROR "write_version.cmake failed: ${error}")
  endif()
  file(READ "${WORK}/version.cpp" text)
  if(NOT text MATCHES "build_git_revision\\(\\) noexcept { return \"([^\"]*)\"; }")
    message(FATAL_ERROR "no revision in version.cpp:\n${text}")
  endif()
  set(${out_var} "${CMAKE_MATCH_1}" PARENT_SCOPE)
endfunction()

function(expect_equal actual expected what)
  if(NOT "${actual}" STREQUAL "${expected}")
    message(FATAL_ERROR "${what}: expected '${expected}', got '${actual}'")
  endif()
endfunction()

git(init -q)
git(config user.email test@example.org)
git(config user.name test)
file(MAKE_DIRECTORY "${WORK}/repo/src" "${WORK}/repo/docs")
file(WRITE "${WORK}/repo/src/a.txt" "one\n")
file(WRITE "${WORK}/repo/docs/notes.md" "notes\n")
git(add src/a.txt docs/notes.md)
git(commit -q -m one)
git(rev-parse HEAD)
set(first_commit "${git_output}")

recorded_revision("${WORK}/repo" clean)
expect_equal("${clean}" "${first_commit}" "a clean tree")

# Unchanged revision: version.cpp is not rewritten (nothing rebuilds).
file(TIMESTAMP "${WORK}/version.cpp" before "%s")
execute_process(COMMAND "${CMAKE_COMMAND}" -E sleep 1.1)
recorded_revision("${WORK}/repo" again)
file(TIMESTAMP "${WORK}/version.cpp" after "%s")
expect_equal("${after}" "${before}" "version.cpp's time after a build with the same revision")

# An edit outside what the binaries are built from changes nothing.
file(WRITE "${WORK}/repo/docs/notes.md" "other notes\n")
recorded_revision("${WORK}/repo" docs_edited)
expect_equal("${docs_edited}" "${first_commit}" "a tree with only a docs edit")

file(WRITE "${WORK}/repo/src/a.txt" "two\n")
recorded_revision("${WORK}/repo" edited)
if(NOT edited MATCHES "^${first_commit}-modified-[0-9a-f]+$")
  message(FATAL_ERROR "an edited tree: got '${edited}'")
endif()
string(LENGTH "${edited}" edited_length)
string(LENGTH "${first_commit}-modified-" prefix_length)
math(EXPR digest_length "${edited_length} - ${prefix_length}")
expect_equal("${digest_length}" "12" "the digest's length")
file(WRITE "${WORK}/repo/src/a.txt" "three\n")
recorded_revision("${WORK}/repo" edited_again)
if(edited_again STREQUAL edited OR NOT edited_again MATCHES "^${first_commit}-modified-")
  message(FATAL_ERROR "a different edit must give a different revision: '${edited}' then '${edited_again}'")
endif()

git(commit -q -am three)
git(rev-parse HEAD)
recorded_revision("${WORK}/repo" committed)
expect_equal("${committed}" "${git_output}" "the tree after a commit")

recorded_revision("${WORK}/plain" outside)
expect_equal("${outside}" "unrecorded-9.8.7" "a tree outside git")
message(STATUS "write_version.cmake: ${clean}, ${edited}, ${committed}, ${outside}")
