# Install rules (CTLRPC_INSTALL): what `cmake --install build --prefix P`
# puts in place, by component (the Debian packages of scripts/package.sh
# are cut along them):
#
#   runtime      lib/libctlrpc.so.1 (and .so.1.x.y)
#   development  lib/libctlrpc.so, lib/libctlrpc.a, include/ctlrpc/*.h,
#                bin/ctlrpc-gen with its package in share/ctlrpc/gen/,
#                bin/ctlrpc (the generic caller: tools/ctlrpc/ctlrpc_caller.py
#                in share/ctlrpc/gen/ too; it also needs the python component),
#                lib/cmake/ctlrpc/ (ctlrpcConfig.cmake: ctlrpc::ctlrpc,
#                ctlrpc::ctlrpc_static, ctlrpc_generate()),
#                lib/pkgconfig/ctlrpc.pc, share/man/man1/ctlrpc-gen.1
#   programs     bin/ctl-storage-unit, bin/ctl-storage, their man pages
#                (when CTLRPC_EXAMPLES)
#   doc          share/doc/ctlrpc/: the README, docs/*.md, the storage IDL,
#                the example project examples/consumer/ (the docs link to it)
#   python       the Python runtime, package `ctlrpc`, in
#                lib/python3/dist-packages/ (Debian's directory for
#                packaged modules; on another prefix, put it on PYTHONPATH)
#
# The installed generator runs with CTLRPC_PYTHON as found at configure
# time (its #! line); ctlrpcConfig.cmake checks again that that Python has
# jinja2 when a consumer configures.
include(GNUInstallDirs)
include(CMakePackageConfigHelpers)

set(CTLRPC_CMAKE_DIR "${CMAKE_INSTALL_LIBDIR}/cmake/ctlrpc")
set(CTLRPC_GEN_PKG_DIR "${CMAKE_INSTALL_DATADIR}/ctlrpc/gen")

# ---- the library and its headers ----------------------------------------
install(TARGETS ctlrpc_shared EXPORT ctlrpcTargets
  LIBRARY DESTINATION ${CMAKE_INSTALL_LIBDIR} COMPONENT runtime
          NAMELINK_COMPONENT development)
install(TARGETS ctlrpc EXPORT ctlrpcTargets
  ARCHIVE DESTINATION ${CMAKE_INSTALL_LIBDIR} COMPONENT development)
if(CTLRPC_WITH_ETCD)
  set(_ctl_header_skip "")
else()
  set(_ctl_header_skip PATTERN "directory.h" EXCLUDE)
endif()
install(DIRECTORY runtime/include/ctlrpc DESTINATION ${CMAKE_INSTALL_INCLUDEDIR}
        COMPONENT development FILES_MATCHING PATTERN "*.h" ${_ctl_header_skip})

# ---- the generator -------------------------------------------------------
install(DIRECTORY gen/ctlrpc_gen DESTINATION ${CTLRPC_GEN_PKG_DIR} COMPONENT development
        PATTERN "__pycache__" EXCLUDE PATTERN "*.pyc" EXCLUDE)
# bin/ctlrpc-gen finds its package relative to itself, so the prefix can move.
file(RELATIVE_PATH CTLRPC_GEN_PKG_FROM_BIN "/${CMAKE_INSTALL_BINDIR}" "/${CTLRPC_GEN_PKG_DIR}")
if(NOT CTLRPC_PYTHON)
  set(CTLRPC_PYTHON /usr/bin/python3)
endif()
configure_file(cmake/ctlrpc-gen.in "${PROJECT_BINARY_DIR}/install/ctlrpc-gen" @ONLY)
install(PROGRAMS "${PROJECT_BINARY_DIR}/install/ctlrpc-gen"
        DESTINATION ${CMAKE_INSTALL_BINDIR} COMPONENT development)

# ---- CMake package and pkg-config ---------------------------------------
install(EXPORT ctlrpcTargets NAMESPACE ctlrpc:: DESTINATION ${CTLRPC_CMAKE_DIR}
        COMPONENT development)
configure_package_config_file(cmake/ctlrpcConfig.cmake.in
  "${PROJECT_BINARY_DIR}/install/ctlrpcConfig.cmake"
  INSTALL_DESTINATION ${CTLRPC_CMAKE_DIR}
  PATH_VARS CMAKE_INSTALL_BINDIR CTLRPC_GEN_PKG_DIR)
# 0.x: a minor version may break the API, so only the same minor matches.
write_basic_package_version_file("${PROJECT_BINARY_DIR}/install/ctlrpcConfigVersion.cmake"
  COMPATIBILITY SameMinorVersion)
install(FILES "${PROJECT_BINARY_DIR}/install/ctlrpcConfig.cmake"
              "${PROJECT_BINARY_DIR}/install/ctlrpcConfigVersion.cmake"
              runtime/cmake/ctlrpc_generate.cmake runtime/cmake/ctlrpc_deps.cmake
        DESTINATION ${CTLRPC_CMAKE_DIR} COMPONENT development)

# The .pc file names the prefix the files are installed to, which is known
# only at install time (`cmake --install build --prefix P` overrides the
# configured one), so it is written then; DESTDIR (the packages) is
# honoured by file(INSTALL).
set(CTLRPC_PC_REQUIRES_PRIVATE "libzmq")
if(CTLRPC_WITH_ETCD)
  string(APPEND CTLRPC_PC_REQUIRES_PRIVATE " libcurl jansson")
endif()
if(IS_ABSOLUTE "${CMAKE_INSTALL_LIBDIR}" OR IS_ABSOLUTE "${CMAKE_INSTALL_INCLUDEDIR}")
  message(FATAL_ERROR "ctlrpc: CMAKE_INSTALL_LIBDIR and CMAKE_INSTALL_INCLUDEDIR must be "
                      "relative to the prefix")
endif()
install(CODE "
  set(CTLRPC_PC_PREFIX \"\${CMAKE_INSTALL_PREFIX}\")
  set(CMAKE_INSTALL_LIBDIR \"${CMAKE_INSTALL_LIBDIR}\")
  set(CMAKE_INSTALL_INCLUDEDIR \"${CMAKE_INSTALL_INCLUDEDIR}\")
  set(CMAKE_INSTALL_BINDIR \"${CMAKE_INSTALL_BINDIR}\")
  set(PROJECT_VERSION \"${PROJECT_VERSION}\")
  set(CTLRPC_PC_REQUIRES_PRIVATE \"${CTLRPC_PC_REQUIRES_PRIVATE}\")
  configure_file(\"${PROJECT_SOURCE_DIR}/cmake/ctlrpc.pc.in\"
                 \"${PROJECT_BINARY_DIR}/install/pc/ctlrpc.pc\" @ONLY)
  file(INSTALL \"${PROJECT_BINARY_DIR}/install/pc/ctlrpc.pc\"
       DESTINATION \"\${CMAKE_INSTALL_PREFIX}/${CMAKE_INSTALL_LIBDIR}/pkgconfig\")
" COMPONENT development)

# ---- the Python runtime ---------------------------------------------------
set(CTLRPC_PYTHON_DIR "lib/python3/dist-packages" CACHE STRING
    "Where (under the prefix) the Python runtime package ctlrpc is installed")
if(EXISTS "${PROJECT_SOURCE_DIR}/runtime/python/ctlrpc")
  install(DIRECTORY runtime/python/ctlrpc DESTINATION ${CTLRPC_PYTHON_DIR} COMPONENT python
          PATTERN "__pycache__" EXCLUDE PATTERN "*.pyc" EXCLUDE)
endif()

# ---- the generic caller ----------------------------------------------------
# bin/ctlrpc finds its module and ctlrpc-gen's package (share/ctlrpc/gen) and the runtime
# (CTLRPC_PYTHON_DIR) relative to itself.
install(FILES tools/ctlrpc/ctlrpc_caller.py tools/ctlrpc/ctlrpc_fleet.py DESTINATION ${CTLRPC_GEN_PKG_DIR}
        COMPONENT development)
file(RELATIVE_PATH CTLRPC_PYTHON_FROM_BIN "/${CMAKE_INSTALL_BINDIR}" "/${CTLRPC_PYTHON_DIR}")
configure_file(cmake/ctlrpc.in "${PROJECT_BINARY_DIR}/install/ctlrpc" @ONLY)
install(PROGRAMS "${PROJECT_BINARY_DIR}/install/ctlrpc"
        DESTINATION ${CMAKE_INSTALL_BINDIR} COMPONENT development)

# ---- programs, man pages, docs -------------------------------------------
install(FILES man/ctlrpc-gen.1 man/ctlrpc.1 DESTINATION ${CMAKE_INSTALL_MANDIR}/man1
        COMPONENT development)
if(CTLRPC_EXAMPLES)
  install(TARGETS ctl-storage-unit ctl-storage
          RUNTIME DESTINATION ${CMAKE_INSTALL_BINDIR} COMPONENT programs)
  install(FILES man/ctl-storage-unit.1 man/ctl-storage.1
          DESTINATION ${CMAKE_INSTALL_MANDIR}/man1 COMPONENT programs)
endif()
install(FILES README.md DESTINATION ${CMAKE_INSTALL_DOCDIR} COMPONENT doc)
install(DIRECTORY docs/ DESTINATION ${CMAKE_INSTALL_DOCDIR}/docs COMPONENT doc
        FILES_MATCHING PATTERN "*.md")
install(FILES idl/storage.idl DESTINATION ${CMAKE_INSTALL_DOCDIR}/idl COMPONENT doc)
# The example project the docs link to (docs/USING.md): it builds against an install.
install(DIRECTORY examples/consumer DESTINATION ${CMAKE_INSTALL_DOCDIR}/examples COMPONENT doc)
