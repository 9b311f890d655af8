# `cmake --install build --prefix P` (docs/deploy.md):
#   P/bin/quantem-gpu
#   P/share/quantem-gpu/systemd/quantem-gpu.service   (ExecStart names P/bin/quantem-gpu)
#   P/share/quantem-gpu/quantem-gpu.env.example
#   P/share/doc/quantem-gpu/                          (README.md and docs/)
# The prefix may be /usr/local or a conda environment ($CONDA_PREFIX); the unit
# is written at install time, so it names the prefix given to --install.
include(GNUInstallDirs)
set(QUANTEM_INSTALL_DATADIR "${CMAKE_INSTALL_DATADIR}/quantem-gpu")
set(QUANTEM_INSTALL_DOCDIR "${CMAKE_INSTALL_DATADIR}/doc/quantem-gpu")

# Libraries found outside the system directories (a conda prefix) stay found
# from the installed binary.
set(CMAKE_INSTALL_RPATH_USE_LINK_PATH TRUE)

install(FILES "${PROJECT_SOURCE_DIR}/packaging/quantem-gpu.env.example" DESTINATION "${QUANTEM_INSTALL_DATADIR}")
install(FILES "${PROJECT_SOURCE_DIR}/README.md" DESTINATION "${QUANTEM_INSTALL_DOCDIR}")
install(DIRECTORY "${PROJECT_SOURCE_DIR}/docs/" DESTINATION "${QUANTEM_INSTALL_DOCDIR}" FILES_MATCHING PATTERN "*.md")
install(CODE "
  set(QUANTEM_BINDIR \"\${CMAKE_INSTALL_PREFIX}/${CMAKE_INSTALL_BINDIR}\")
  set(QUANTEM_DOCDIR \"\${CMAKE_INSTALL_PREFIX}/${QUANTEM_INSTALL_DOCDIR}\")
  set(QUANTEM_UNIT_PATH \"\${CMAKE_INSTALL_PREFIX}/${QUANTEM_INSTALL_DATADIR}/systemd/quantem-gpu.service\")
  set(QUANTEM_ENV_EXAMPLE_PATH \"\${CMAKE_INSTALL_PREFIX}/${QUANTEM_INSTALL_DATADIR}/quantem-gpu.env.example\")
  message(STATUS \"Installing: \$ENV{DESTDIR}\${QUANTEM_UNIT_PATH}\")
  configure_file(\"${PROJECT_SOURCE_DIR}/packaging/systemd/quantem-gpu.service.in\"
                 \"\$ENV{DESTDIR}\${QUANTEM_UNIT_PATH}\" @ONLY)
  # In install_manifest.txt like every other installed file (the uninstall reads it).
  list(APPEND CMAKE_INSTALL_MANIFEST_FILES \"\$ENV{DESTDIR}\${QUANTEM_UNIT_PATH}\")
")
