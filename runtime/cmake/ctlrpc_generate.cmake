# ctlrpc_generate(): regenerate typed stubs from an IDL file during the build.
#
#   ctlrpc_generate(<target> IDL <file.idl> [OUT <dir>])
#
# Runs ctlrpc-gen on <file.idl> into <dir> (default:
# ${CMAKE_CURRENT_BINARY_DIR}/ctlrpc-gen/<stem>), adds the generated
# <stem>.ctl.c to <target>'s sources, <dir> to its include path, and links it
# against libctlrpc. The files are regenerated whenever the IDL, any IDL it
# imports, the generator's code or one of its templates changes; they live
# in the build tree and are never committed.
#
# The generator needs a Python 3 with jinja2. CTLRPC_PYTHON (a cache
# variable) names it; when unset, /usr/bin/python3 and then the python3 on
# PATH are tried, and configure fails early, naming the Debian package, if
# none can import jinja2.

set(CTLRPC_GEN_DIR "${CMAKE_CURRENT_LIST_DIR}/../../gen" CACHE INTERNAL "")
get_filename_component(CTLRPC_GEN_DIR "${CTLRPC_GEN_DIR}" ABSOLUTE)

function(_ctlrpc_find_python)
  if(CTLRPC_PYTHON_OK)
    return()
  endif()
  set(candidates "")
  if(CTLRPC_PYTHON)
    list(APPEND candidates "${CTLRPC_PYTHON}")
  else()
    find_program(_ctlrpc_path_python3 NAMES python3)
    list(APPEND candidates /usr/bin/python3 ${_ctlrpc_path_python3})
  endif()
  foreach(py IN LISTS candidates)
    if(NOT EXISTS "${py}")
      continue()
    endif()
    execute_process(COMMAND "${py}" -c "import sys, jinja2; assert sys.version_info >= (3, 7)"
                    RESULT_VARIABLE rc OUTPUT_QUIET ERROR_QUIET)
    if(rc EQUAL 0)
      set(CTLRPC_PYTHON "${py}" CACHE FILEPATH "Python 3 with jinja2 for ctlrpc-gen" FORCE)
      set(CTLRPC_PYTHON_OK TRUE CACHE INTERNAL "")
      message(STATUS "ctlrpc-gen runs with ${py}")
      return()
    endif()
  endforeach()
  message(FATAL_ERROR
    "ctlrpc-gen needs Python 3 with jinja2, and none was found (tried: ${candidates}).\n"
    "On Debian: apt-get install python3-jinja2 (it installs into /usr/bin/python3),\n"
    "or point -DCTLRPC_PYTHON=/path/to/python3 at an interpreter that has jinja2.")
endfunction()

function(ctlrpc_generate target)
  cmake_parse_arguments(ARG "" "IDL;OUT" "" ${ARGN})
  if(NOT ARG_IDL)
    message(FATAL_ERROR "ctlrpc_generate(${target}): IDL <file> is required")
  endif()
  if(NOT TARGET ${target})
    message(FATAL_ERROR "ctlrpc_generate(${target}): no such target")
  endif()
  _ctlrpc_find_python()
  get_filename_component(idl "${ARG_IDL}" ABSOLUTE)
  if(NOT EXISTS "${idl}")
    message(FATAL_ERROR "ctlrpc_generate(${target}): IDL file ${idl} does not exist")
  endif()
  get_filename_component(stem "${idl}" NAME_WE)
  if(NOT ARG_OUT)
    set(ARG_OUT "${CMAKE_CURRENT_BINARY_DIR}/ctlrpc-gen/${stem}")
  endif()
  set(outputs "${ARG_OUT}/${stem}.ctl.h" "${ARG_OUT}/${stem}.ctl.c")

  # Everything the output depends on: the generator and its templates, and
  # the IDL files this one imports (listed by the generator itself, so a
  # change to an import also regenerates).
  file(GLOB_RECURSE gen_sources CONFIGURE_DEPENDS
       "${CTLRPC_GEN_DIR}/ctlrpc-gen"
       "${CTLRPC_GEN_DIR}/ctlrpc_gen/*.py"
       "${CTLRPC_GEN_DIR}/ctlrpc_gen/templates/*")
  set(depfile "${ARG_OUT}/${stem}.ctl.d")
  # ctlrpc-gen rewrites a file only when its text changes. Ninja sees that
  # (CMake marks custom commands `restat`), so touching an IDL without
  # changing what it generates recompiles nothing. Make only compares
  # times: an output left older than its IDL would rerun the generator on
  # every build, so there the outputs are touched after each run.
  set(touch_outputs "")
  if(NOT CMAKE_GENERATOR MATCHES "Ninja")
    set(touch_outputs COMMAND "${CMAKE_COMMAND}" -E touch_nocreate ${outputs})
  endif()
  add_custom_command(
    OUTPUT ${outputs}
    COMMAND "${CTLRPC_PYTHON}" "${CTLRPC_GEN_DIR}/ctlrpc-gen" "${idl}"
            -o "${ARG_OUT}" --depfile "${depfile}"
    ${touch_outputs}
    MAIN_DEPENDENCY "${idl}"
    DEPENDS ${gen_sources}
    DEPFILE "${depfile}"
    COMMENT "ctlrpc-gen ${stem}.idl"
    VERBATIM)
  target_sources(${target} PRIVATE ${outputs})
  target_include_directories(${target} PUBLIC "${ARG_OUT}")
  target_link_libraries(${target} PUBLIC ctlrpc::ctlrpc)
endfunction()
