# Every dependency comes from the system (Debian 12 packages, or conda-forge in
# the deployment environment). Nothing is vendored.
find_package(Threads REQUIRED)
find_package(PkgConfig REQUIRED)
find_package(HDF5 REQUIRED COMPONENTS C)
find_package(nlohmann_json 3.10 REQUIRED)
find_package(CLI11 2.1 REQUIRED)
find_package(spdlog REQUIRED)
# zlib: the catalog cache's checksum and gzip bodies of the catalog documents.
find_package(ZLIB REQUIRED)
pkg_check_modules(LZ4 REQUIRED IMPORTED_TARGET liblz4)
pkg_check_modules(FFTW3F REQUIRED IMPORTED_TARGET fftw3f)

# Boost.Asio + Boost.Beast (header-only, Boost >= 1.74): the daemon's HTTP
# server (decision 0008). Debian: libboost-dev; conda-forge: libboost-headers.
find_package(Boost 1.74 REQUIRED CONFIG COMPONENTS headers)
add_library(quantem_beast INTERFACE)
target_link_libraries(quantem_beast INTERFACE Boost::headers Threads::Threads)
# One Asio per program, no deprecated interfaces; Beast without its own
# separate-compilation mode.
target_compile_definitions(quantem_beast INTERFACE BOOST_ASIO_NO_DEPRECATED BOOST_BEAST_USE_STD_STRING_VIEW)

# cpp-httplib: only the integration tests' HTTP client and the admission
# benchmark use it (the daemon does not). Debian ships a compiled library with a pkg-config file; conda-forge
# ships a CMake package of the header-only build.
find_package(httplib CONFIG QUIET)
if(TARGET httplib::httplib)
  add_library(quantem_httplib INTERFACE)
  target_link_libraries(quantem_httplib INTERFACE httplib::httplib)
else()
  pkg_check_modules(HTTPLIB REQUIRED IMPORTED_TARGET cpp-httplib)
  add_library(quantem_httplib INTERFACE)
  target_link_libraries(quantem_httplib INTERFACE PkgConfig::HTTPLIB)
endif()

# The HDF5 C library; components reach it through quantem_hdf5 (src/hdf5).
add_library(quantem_libhdf5 INTERFACE)
target_include_directories(quantem_libhdf5 SYSTEM INTERFACE ${HDF5_INCLUDE_DIRS})
target_link_libraries(quantem_libhdf5 INTERFACE ${HDF5_C_LIBRARIES})
target_compile_definitions(quantem_libhdf5 INTERFACE ${HDF5_DEFINITIONS} H5_USE_110_API)
pkg_check_modules(FFTW3 REQUIRED IMPORTED_TARGET fftw3)

# libsystemd (Debian libsystemd-dev): sd_notify for the Type=notify user unit
# (READY=1, STATUS=, STOPPING=1, WATCHDOG=1). Optional: without it the daemon
# sends no notifications (use Type=simple) and the build says so here.
pkg_check_modules(LIBSYSTEMD QUIET IMPORTED_TARGET libsystemd)
add_library(quantem_systemd INTERFACE)
if(LIBSYSTEMD_FOUND)
  target_link_libraries(quantem_systemd INTERFACE PkgConfig::LIBSYSTEMD)
  target_compile_definitions(quantem_systemd INTERFACE QUANTEM_HAVE_SYSTEMD=1)
  message(STATUS "libsystemd ${LIBSYSTEMD_VERSION}: serve notifies systemd (Type=notify)")
else()
  message(WARNING "libsystemd not found (Debian: libsystemd-dev): quantem-gpu serve will send no systemd "
                  "notifications, so the user unit must use Type=simple instead of Type=notify")
endif()
