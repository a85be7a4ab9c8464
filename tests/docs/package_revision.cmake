# scripts/package.sh gives each build its own Debian revision (CTLRPC_DEB_RELEASE): configure the
# project with one, and check that every package's file name and every dependency between
# ctlrpc's packages carry it, and that it sorts after a release's "-1", so that
# `apt-get install ./dist/ctlrpc*.deb` replaces an installed earlier build.
#   cmake -DCTLRPC_ROOT=... -DBIN=... -DCTLRPC_PYTHON=... -P package_revision.cmake
set(rev "1.20260101000000")
file(REMOVE_RECURSE "${BIN}")
execute_process(COMMAND ${CMAKE_COMMAND} -S "${CTLRPC_ROOT}" -B "${BIN}" -DCTLRPC_TESTS=OFF
                        -DCTLRPC_DEB_RELEASE=${rev} -DCTLRPC_PYTHON=${CTLRPC_PYTHON}
                RESULT_VARIABLE rc OUTPUT_QUIET ERROR_VARIABLE err)
if(NOT rc EQUAL 0)
  message(FATAL_ERROR "configure failed: ${err}")
endif()
file(READ "${BIN}/CPackConfig.cmake" cfg)
foreach(want
    "CPACK_DEBIAN_PACKAGE_RELEASE \"${rev}\""
    "ctlrpc-libctlrpc1_0.2.0-${rev}_"
    "ctlrpc-libctlrpc-dev_0.2.0-${rev}_"
    "ctlrpc-storage_0.2.0-${rev}_"
    "ctlrpc-python3-ctlrpc_0.2.0-${rev}_all.deb"
    "libctlrpc1 (= 0.2.0-${rev})"
    "python3-ctlrpc (= 0.2.0-${rev})")
  string(FIND "${cfg}" "${want}" at)
  if(at LESS 0)
    message(FATAL_ERROR "CPackConfig.cmake lacks '${want}'")
  endif()
endforeach()
if(cfg MATCHES "0\\.1\\.0-1[_)]")
  message(FATAL_ERROR "CPackConfig.cmake still names the revision 1: ${CMAKE_MATCH_0}")
endif()
find_program(DPKG dpkg)
if(DPKG)
  execute_process(COMMAND ${DPKG} --compare-versions "0.2.0-${rev}" gt "0.2.0-1"
                  RESULT_VARIABLE newer)
  if(NOT newer EQUAL 0)
    message(FATAL_ERROR "0.2.0-${rev} does not sort after 0.2.0-1")
  endif()
endif()
file(REMOVE_RECURSE "${BIN}")
message(STATUS "package revision ${rev}: ok")
