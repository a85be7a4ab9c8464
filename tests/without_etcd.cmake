# build_without_etcd: the build with its optional component CTLRPC_WITH_ETCD turned off, which
# no other test builds. Configures this source tree with -DCTLRPC_WITH_ETCD=OFF and no tests (so
# it stays short) into BIN, afresh, builds and installs it there, and checks that
#   - libctlrpc.so needs neither libcurl nor jansson (objdump -p, NEEDED) and exports the public
#     API less ctlrpc/directory.h (shared_exports.cmake); libctlrpc.a refers to no curl_ or
#     json_ symbol (nm -u);
#   - the install has no ctlrpc/directory.h, and its pkg-config file and CMake package ask for
#     neither libcurl nor jansson;
#   - ctl-storage-unit and ctl-storage refuse --etcd (or $CTLRPC_ETCD) with exit status 2 and a
#     message saying this build has no etcd support, and their --help says so too.
# Run by ctest with
#   cmake -D SOURCE=<tree> -D BIN=<dir> -D GENERATOR=... -D CC=... -D PYTHON=... -D NM=...
#         -D OBJDUMP=... -D SONAME=libctlrpc.so.N -P without_etcd.cmake
foreach(v SOURCE BIN GENERATOR CC PYTHON NM OBJDUMP SONAME)
  if(NOT ${v})
    message(FATAL_ERROR "without_etcd.cmake: ${v} is required")
  endif()
endforeach()

function(step what)
  execute_process(COMMAND ${ARGN} RESULT_VARIABLE rc OUTPUT_VARIABLE out ERROR_VARIABLE out)
  if(NOT rc EQUAL 0)
    message(FATAL_ERROR "${what} failed (${rc}):\n${out}")
  endif()
endfunction()

file(REMOVE_RECURSE "${BIN}")
set(build "${BIN}/build")
set(prefix "${BIN}/prefix")
# (CTLRPC_REQUIRE_ETCD, if set for the outer build, does not apply: this build has no tests.)
step("configure with -DCTLRPC_WITH_ETCD=OFF"
     "${CMAKE_COMMAND}" -E env --unset=CTLRPC_ETCD
     "${CMAKE_COMMAND}" -S "${SOURCE}" -B "${build}" -G "${GENERATOR}"
     -DCMAKE_C_COMPILER=${CC} -DCMAKE_BUILD_TYPE=RelWithDebInfo -DCTLRPC_PYTHON=${PYTHON}
     -DCTLRPC_WITH_ETCD=OFF -DCTLRPC_TESTS=OFF -DCTLRPC_EXAMPLES=ON -DCTLRPC_INSTALL=ON)
step("build" "${CMAKE_COMMAND}" --build "${build}")
step("install" "${CMAKE_COMMAND}" -E env --unset=DESTDIR
     "${CMAKE_COMMAND}" --install "${build}" --prefix "${prefix}")

set(problems "")
set(lib "${build}/runtime/libctlrpc.so")
set(static "${build}/runtime/libctlrpc.a")
execute_process(COMMAND ${OBJDUMP} -p "${lib}" OUTPUT_VARIABLE dyn RESULT_VARIABLE rc)
if(NOT rc EQUAL 0 OR NOT dyn MATCHES "NEEDED +libzmq")
  message(FATAL_ERROR "cannot read the dynamic section of ${lib} with ${OBJDUMP}:\n${dyn}")
endif()
string(REGEX MATCHALL "NEEDED +[^\n]*(curl|jansson)[^\n]*" needed "${dyn}")
if(needed)
  string(APPEND problems "libctlrpc.so needs ${needed}\n")
endif()
execute_process(COMMAND ${NM} -u "${static}" OUTPUT_VARIABLE undefined RESULT_VARIABLE rc)
if(NOT rc EQUAL 0 OR NOT undefined MATCHES "zmq_")
  message(FATAL_ERROR "cannot read the symbols of ${static} with ${NM}")
endif()
string(REGEX MATCHALL "[ \n](curl_[A-Za-z0-9_]+|json_[A-Za-z0-9_]+)" found "${undefined}")
if(found)
  list(REMOVE_DUPLICATES found)
  string(APPEND problems "libctlrpc.a refers to ${found}\n")
endif()
step("shared_exports.cmake on ${lib}" "${CMAKE_COMMAND}" -D "LIB=${lib}"
     -D "HEADERS=${SOURCE}/runtime/include/ctlrpc" -D "NM=${NM}" -D "OBJDUMP=${OBJDUMP}"
     -D "SONAME=${SONAME}" -D "SKIP=directory.h" -P "${CMAKE_CURRENT_LIST_DIR}/shared_exports.cmake")

file(GLOB_RECURSE installed_directory_h "${prefix}/*/directory.h")
if(installed_directory_h)
  string(APPEND problems "installed ${installed_directory_h}\n")
endif()
file(GLOB_RECURSE pc "${prefix}/*/pkgconfig/ctlrpc.pc")
file(GLOB_RECURSE config "${prefix}/*/cmake/ctlrpc/ctlrpcConfig.cmake")
if(NOT pc OR NOT config)
  message(FATAL_ERROR "the install in ${prefix} has no ctlrpc.pc or ctlrpcConfig.cmake")
endif()
file(READ "${pc}" pc_text)
if(pc_text MATCHES "libcurl|jansson")
  string(APPEND problems "${pc} asks for libcurl or jansson:\n${pc_text}\n")
endif()
file(STRINGS "${config}" with_etcd REGEX "^set\\(CTLRPC_WITH_ETCD ")
if(NOT with_etcd STREQUAL "set(CTLRPC_WITH_ETCD OFF)")
  string(APPEND problems "${config} says '${with_etcd}', not set(CTLRPC_WITH_ETCD OFF)\n")
endif()

# The programs: --etcd, and $CTLRPC_ETCD (which --etcd defaults to), refused with a reason.
set(unit "${build}/examples/ctl-storage-unit")
set(cli "${build}/examples/ctl-storage")
# (Each case: a name, then its command line with its words separated by |.)
set(cases
  "ctl-storage-unit --etcd" "${unit}|--bind|tcp://127.0.0.1:0|--etcd|http://127.0.0.1:2379"
  "ctl-storage --etcd" "${cli}|--etcd|http://127.0.0.1:2379|--service|storage|stats"
  "ctl-storage-unit with CTLRPC_ETCD" "${unit}|--bind|tcp://127.0.0.1:0"
  "ctl-storage with CTLRPC_ETCD" "${cli}|stats")
while(cases)
  list(POP_FRONT cases name)
  list(POP_FRONT cases argv)
  string(REPLACE "|" ";" argv "${argv}")
  if(name MATCHES "CTLRPC_ETCD$")
    set(env CTLRPC_ETCD=http://127.0.0.1:2379)
  else()
    set(env --unset=CTLRPC_ETCD)
  endif()
  execute_process(COMMAND "${CMAKE_COMMAND}" -E env ${env} ${argv}
                  RESULT_VARIABLE rc OUTPUT_VARIABLE out ERROR_VARIABLE err TIMEOUT 30)
  if(NOT rc EQUAL 2 OR NOT err MATCHES "this build has no etcd support")
    string(APPEND problems "${name}: exit status ${rc} (wanted 2), stderr:\n${err}\n")
  elseif(out)
    string(APPEND problems "${name}: printed on stdout:\n${out}\n")
  endif()
endwhile()
foreach(prog "${unit}" "${cli}")
  execute_process(COMMAND "${prog}" --help RESULT_VARIABLE rc OUTPUT_VARIABLE out
                  ERROR_VARIABLE out TIMEOUT 30)
  if(NOT rc EQUAL 0 OR NOT out MATCHES "this build has no etcd support")
    string(APPEND problems "${prog} --help (exit status ${rc}) does not say that its fleet "
                           "flags are not in this build:\n${out}\n")
  endif()
endforeach()

if(problems)
  message(FATAL_ERROR "the build with CTLRPC_WITH_ETCD=OFF (${build}):\n${problems}")
endif()
message(STATUS "CTLRPC_WITH_ETCD=OFF builds and installs without libcurl or jansson; the "
               "programs refuse --etcd saying why")
