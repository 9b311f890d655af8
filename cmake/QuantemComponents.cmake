# Each component's public headers (include/quantem/<component>/) are visible
# only to the targets that link the component's library: the build, not a
# convention, keeps the layering of docs/architecture.md. There is no project-
# wide include directory; every component gets an include root of its own in
# the build tree holding one link, quantem/<component> -> include/quantem/<component>,
# and publishes that root as a PUBLIC include directory of its library.
#
#   quantem_component_headers(TARGET COMPONENT...)
function(quantem_component_headers target)
  foreach(component IN LISTS ARGN)
    set(source ${PROJECT_SOURCE_DIR}/include/quantem/${component})
    if(NOT IS_DIRECTORY ${source})
      message(FATAL_ERROR "quantem_component_headers(${target}): no folder include/quantem/${component}")
    endif()
    set(root ${PROJECT_BINARY_DIR}/component-headers/${component})
    if(NOT EXISTS ${root}/quantem/${component})
      file(MAKE_DIRECTORY ${root}/quantem)
      file(CREATE_LINK ${source} ${root}/quantem/${component} SYMBOLIC)
    endif()
    target_include_directories(${target} PUBLIC $<BUILD_INTERFACE:${root}>)
  endforeach()
endfunction()
