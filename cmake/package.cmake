# Debian packages with CPack, one per install component (cmake/install.cmake):
#
#   libctlrpc1      runtime      the shared library
#   libctlrpc-dev   development  headers, static library, ctlrpc-gen and its
#                   + doc        templates, the generic caller ctlrpc, the CMake
#                                package, ctlrpc.pc, docs
#   ctlrpc-storage  programs     ctl-storage-unit and ctl-storage
#   python3-ctlrpc  python       the Python runtime (package `ctlrpc`)
#
# Files are named ctlrpc-<package>_<version>-<release>_<arch>.deb (ctlrpc-storage
# keeps its name), so `apt-get install ./ctlrpc*.deb` installs them all.
# Build them with scripts/package.sh (configured with the prefix /usr). The
# Debian revision <release> is CTLRPC_DEB_RELEASE: scripts/package.sh gives
# every build its own (1.<UTC time of the build>), so installing a new build
# over an older one of the same version replaces it instead of being "already
# the newest version"; a release build sets it, e.g. -DCTLRPC_DEB_RELEASE=1.
set(CPACK_GENERATOR DEB)
set(CPACK_PACKAGE_NAME ctlrpc)
set(CPACK_PACKAGE_VENDOR "ctlrpc")
set(CTLRPC_MAINTAINER "ctlrpc developers" CACHE STRING
    "The Maintainer field of the Debian packages (name <email>)")
set(CPACK_PACKAGE_CONTACT "${CTLRPC_MAINTAINER}")
set(CPACK_PACKAGE_VERSION ${PROJECT_VERSION})
set(CPACK_PACKAGE_DESCRIPTION_SUMMARY
    "code-generated control-plane RPC over ZeroMQ and msgpack")
set(CPACK_DEB_COMPONENT_INSTALL ON)
set(CPACK_DEBIAN_PACKAGE_SECTION libs)
set(CPACK_DEBIAN_PACKAGE_PRIORITY optional)
set(CTLRPC_DEB_RELEASE 1 CACHE STRING
    "The Debian revision of the packages (scripts/package.sh sets one per build)")
set(CPACK_DEBIAN_PACKAGE_RELEASE ${CTLRPC_DEB_RELEASE})
# dpkg-shlibdeps: libzmq5, libmsgpackc2, libc6 (and libcurl4, libjansson4
# with CTLRPC_WITH_ETCD)
set(CPACK_DEBIAN_PACKAGE_SHLIBDEPS ON)
set(CPACK_DEBIAN_PACKAGE_GENERATE_SHLIBS ON)
find_program(CTLRPC_DPKG dpkg)
if(CTLRPC_DPKG)
  execute_process(COMMAND ${CTLRPC_DPKG} --print-architecture
                  OUTPUT_VARIABLE CPACK_DEBIAN_PACKAGE_ARCHITECTURE
                  OUTPUT_STRIP_TRAILING_WHITESPACE)
endif()
if(NOT CPACK_DEBIAN_PACKAGE_ARCHITECTURE)
  set(CPACK_DEBIAN_PACKAGE_ARCHITECTURE amd64)
endif()
set(_ctl_deb_version "${PROJECT_VERSION}-${CTLRPC_DEB_RELEASE}")
set(_ctl_deb_tail "${_ctl_deb_version}_${CPACK_DEBIAN_PACKAGE_ARCHITECTURE}.deb")

# The doc component goes into the development package.
set(CPACK_COMPONENTS_ALL runtime development doc)
if(EXISTS "${PROJECT_SOURCE_DIR}/runtime/python/ctlrpc")
  list(APPEND CPACK_COMPONENTS_ALL python)
endif()
if(CTLRPC_EXAMPLES)
  list(APPEND CPACK_COMPONENTS_ALL programs)
endif()
set(CPACK_COMPONENT_DOC_GROUP dev)
set(CPACK_COMPONENT_DEVELOPMENT_GROUP dev)
set(CPACK_COMPONENT_RUNTIME_GROUP runtime)
set(CPACK_COMPONENT_PROGRAMS_GROUP programs)
set(CPACK_COMPONENT_PYTHON_GROUP python)
set(CPACK_COMPONENTS_GROUPING ONE_PER_GROUP)

set(CPACK_DEBIAN_RUNTIME_PACKAGE_NAME libctlrpc${CTLRPC_SOVERSION})
set(CPACK_DEBIAN_RUNTIME_FILE_NAME "ctlrpc-libctlrpc${CTLRPC_SOVERSION}_${_ctl_deb_tail}")
set(CPACK_DEBIAN_RUNTIME_DESCRIPTION
    "ctlrpc runtime library\n The shared library under ctlrpc's generated stubs and dispatch tables:\n ZeroMQ ROUTER/DEALER transport, msgpack envelopes, deadlines and fan-out.")

set(CPACK_DEBIAN_DEV_PACKAGE_NAME libctlrpc-dev)
set(CPACK_DEBIAN_DEV_FILE_NAME "ctlrpc-libctlrpc-dev_${_ctl_deb_tail}")
set(CPACK_DEBIAN_DEV_PACKAGE_SECTION libdevel)
# bin/ctlrpc, the generic caller, runs on the Python runtime.
set(CPACK_DEBIAN_DEV_PACKAGE_DEPENDS
    "libctlrpc${CTLRPC_SOVERSION} (= ${_ctl_deb_version}), libzmq3-dev, libmsgpack-dev, python3, python3-jinja2")
if(CTLRPC_WITH_ETCD)
  string(APPEND CPACK_DEBIAN_DEV_PACKAGE_DEPENDS ", libcurl4-openssl-dev, libjansson-dev")
endif()
if(EXISTS "${PROJECT_SOURCE_DIR}/runtime/python/ctlrpc")
  string(APPEND CPACK_DEBIAN_DEV_PACKAGE_DEPENDS ", python3-ctlrpc (= ${_ctl_deb_version})")
endif()
set(CPACK_DEBIAN_DEV_PACKAGE_RECOMMENDS "cmake, pkg-config")
set(CPACK_DEBIAN_DEV_DESCRIPTION
    "ctlrpc development files and the IDL compiler\n Headers, the static library, the CMake package (find_package(ctlrpc),\n ctlrpc_generate()), ctlrpc.pc, the generator ctlrpc-gen and the docs.")

set(CPACK_DEBIAN_PROGRAMS_PACKAGE_NAME ctlrpc-storage)
set(CPACK_DEBIAN_PROGRAMS_FILE_NAME "ctlrpc-storage_${_ctl_deb_tail}")
set(CPACK_DEBIAN_PROGRAMS_PACKAGE_SECTION net)
# --etcd: a fleet registers in (and is found through) an etcd server.
if(CTLRPC_WITH_ETCD)
  set(CPACK_DEBIAN_PROGRAMS_PACKAGE_SUGGESTS "etcd-server, etcd-client")
endif()
set(CPACK_DEBIAN_PROGRAMS_DESCRIPTION
    "ctlrpc example storage service: unit and client\n ctl-storage-unit serves the storage service's control ops; ctl-storage calls\n them from a shell.")

set(CPACK_DEBIAN_PYTHON_PACKAGE_NAME python3-ctlrpc)
set(CPACK_DEBIAN_PYTHON_FILE_NAME "ctlrpc-python3-ctlrpc_${_ctl_deb_version}_all.deb")
set(CPACK_DEBIAN_PYTHON_PACKAGE_ARCHITECTURE all)
set(CPACK_DEBIAN_PYTHON_PACKAGE_SECTION python)
set(CPACK_DEBIAN_PYTHON_PACKAGE_DEPENDS "python3, python3-zmq, python3-msgpack")
set(CPACK_DEBIAN_PYTHON_PACKAGE_SHLIBDEPS OFF)
set(CPACK_DEBIAN_PYTHON_DESCRIPTION
    "ctlrpc Python runtime\n The pure-Python runtime (package ctlrpc) under the Python modules ctlrpc-gen\n generates: the same wire, errors and semantics as libctlrpc.")

set(CPACK_OUTPUT_FILE_PREFIX "${PROJECT_BINARY_DIR}/debs")
include(CPack)
