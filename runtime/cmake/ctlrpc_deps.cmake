# ctlrpc's dependencies as targets: Threads::Threads, PkgConfig::ZMQ
# (libzmq, through pkg-config) and msgpackc (msgpack-c), and with
# CTLRPC_WITH_ETCD (membership in etcd, ctlrpc/directory.h) PkgConfig::CURL
# (libcurl) and PkgConfig::JANSSON (jansson). Used by the build
# (runtime/CMakeLists.txt) and by ctlrpcConfig.cmake in an install, where
# the static library's users need them too.
find_package(Threads REQUIRED)
find_package(PkgConfig REQUIRED)
if(NOT TARGET PkgConfig::ZMQ)
  pkg_check_modules(ZMQ IMPORTED_TARGET GLOBAL libzmq)
  if(NOT ZMQ_FOUND)
    message(FATAL_ERROR "libzmq not found: install it (Debian: apt-get install libzmq3-dev)")
  endif()
endif()
# msgpack-c 4 ships a CMake package "msgpack" with the target msgpackc; fall
# back to a plain library search where the package config is missing.
if(NOT TARGET msgpackc)
  find_package(msgpack CONFIG QUIET)
  if(TARGET msgpackc)
    set_target_properties(msgpackc PROPERTIES IMPORTED_GLOBAL TRUE)
  endif()
endif()
if(NOT TARGET msgpackc)
  find_library(MSGPACKC_LIBRARY NAMES msgpackc msgpack-c)
  find_path(MSGPACKC_INCLUDE_DIR msgpack.h)
  if(NOT MSGPACKC_LIBRARY OR NOT MSGPACKC_INCLUDE_DIR)
    message(FATAL_ERROR "msgpack-c not found: install it (Debian: apt-get install libmsgpack-dev)")
  endif()
  add_library(msgpackc UNKNOWN IMPORTED GLOBAL)
  set_target_properties(msgpackc PROPERTIES IMPORTED_LOCATION "${MSGPACKC_LIBRARY}"
    INTERFACE_INCLUDE_DIRECTORIES "${MSGPACKC_INCLUDE_DIR}")
endif()
# Membership in etcd: on unless turned off (an installed ctlrpc says which
# it was built with, in ctlrpcConfig.cmake).
if(NOT DEFINED CTLRPC_WITH_ETCD)
  option(CTLRPC_WITH_ETCD "Membership in etcd (ctlrpc/directory.h): needs libcurl and jansson" ON)
endif()
if(CTLRPC_WITH_ETCD)
  if(NOT TARGET PkgConfig::CURL)
    pkg_check_modules(CURL IMPORTED_TARGET GLOBAL libcurl)
    if(NOT CURL_FOUND)
      message(FATAL_ERROR "libcurl not found: install it (Debian: apt-get install "
                          "libcurl4-openssl-dev), or configure with -DCTLRPC_WITH_ETCD=OFF")
    endif()
  endif()
  if(NOT TARGET PkgConfig::JANSSON)
    pkg_check_modules(JANSSON IMPORTED_TARGET GLOBAL jansson)
    if(NOT JANSSON_FOUND)
      message(FATAL_ERROR "jansson not found: install it (Debian: apt-get install "
                          "libjansson-dev), or configure with -DCTLRPC_WITH_ETCD=OFF")
    endif()
  endif()
endif()
