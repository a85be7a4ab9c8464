# ctlrpc_generate(... AGAINST old.idl [STRICT]) in a build, step by step (cmake -P run.cmake
# -DCTLRPC_ROOT=<source tree> -DCTLRPC_PYTHON=<python> -DGENERATOR=<cmake generator> -DBIN=<dir>):
#   1. new.idl a safe change from old.idl: the build succeeds and shows the notes;
#   2. new.idl changed to a wire-breaking one: the rebuild fails, showing the error;
#   3. old.idl (the AGAINST file) changed to that same version: the rebuild succeeds, so the
#      AGAINST file is a dependency;
#   4. a fresh build with STRICT of a source-breaking change fails; without STRICT it passes.
set(src "${CMAKE_CURRENT_LIST_DIR}")
file(REMOVE_RECURSE "${BIN}")

function(use which as)
  configure_file("${src}/${which}.idl" "${BIN}/idl/${as}.idl" COPYONLY)
endfunction()

function(configure dir)
  execute_process(COMMAND "${CMAKE_COMMAND}" -S "${src}" -B "${dir}" -G "${GENERATOR}"
                          -DCTLRPC_ROOT=${CTLRPC_ROOT} -DCTLRPC_PYTHON=${CTLRPC_PYTHON}
                          -DIDL_DIR=${BIN}/idl ${ARGN}
                  RESULT_VARIABLE rc OUTPUT_VARIABLE out ERROR_VARIABLE out)
  if(NOT rc EQUAL 0)
    message(FATAL_ERROR "configure failed:\n${out}")
  endif()
endfunction()

# build(<dir> <expect: pass|fail> <regex the output must match> <step>)
function(build dir expect regex step)
  execute_process(COMMAND "${CMAKE_COMMAND}" --build "${dir}"
                  RESULT_VARIABLE rc OUTPUT_VARIABLE out ERROR_VARIABLE out)
  message("---- step ${step} (the build must ${expect}):\n${out}")
  if(expect STREQUAL "pass" AND NOT rc EQUAL 0)
    message(FATAL_ERROR "step ${step}: the build failed")
  elseif(expect STREQUAL "fail" AND rc EQUAL 0)
    message(FATAL_ERROR "step ${step}: the build succeeded")
  endif()
  if(NOT out MATCHES "${regex}")
    message(FATAL_ERROR "step ${step}: the output does not match '${regex}'")
  endif()
endfunction()

use(old old)
use(new_safe new)
configure("${BIN}/build")
build("${BIN}/build" pass "new.idl:5:4: note: op 'status' was added" 1)
if(NOT EXISTS "${BIN}/build/ctlrpc-gen/new/new.ctl.h")
  message(FATAL_ERROR "step 1: new.ctl.h was not generated")
endif()

# (Make compares times to the second: let the copies be newer than the last outputs.)
execute_process(COMMAND "${CMAKE_COMMAND}" -E sleep 1.1)
use(new_breaking new)
build("${BIN}/build" fail
      "new.idl:4:4: error: arg 'id' of op 'cancel' was removed: .* \\[wire-breaking\\]" 2)

execute_process(COMMAND "${CMAKE_COMMAND}" -E sleep 1.1)
use(new_breaking old)
build("${BIN}/build" pass "ctlrpc-gen new.idl" 3)

use(old old)
use(new_source new)
configure("${BIN}/strict" -DSTRICT=ON)
build("${BIN}/strict" fail "new.idl:3:4: error: the args of op 'submit' were reordered" 4)
configure("${BIN}/lenient")
build("${BIN}/lenient" pass "new.idl:3:4: warning: the args of op 'submit' were reordered" 4)
