# ctlrpc_generate(): regenerate typed stubs from an IDL file during the build.
#
#   ctlrpc_generate(<target> IDL <file.idl> [OUT <dir>] [AGAINST <old.idl> [STRICT]])
#
# Runs ctlrpc-gen on <file.idl> into <dir> (default:
# ${CMAKE_CURRENT_BINARY_DIR}/ctlrpc-gen/<stem>), adds the generated
# <stem>.ctl.c to <target>'s sources, <dir> to its include path, and links it
# against libctlrpc. The files are regenerated whenever the IDL, any IDL it
# imports, the generator's code or one of its templates changes; they live
# in the build tree and are never committed.
#
# AGAINST <old.idl> (a released version of the service, kept in the source
# tree) checks each generation against it (`ctlrpc-gen --against`, see
# docs/IDL.md, "Evolving a service"): a wire-breaking change fails the build
# with its diagnostics and writes nothing; STRICT fails it on
# source-breaking changes too. <old.idl> and its imports are dependencies.
#
# One IDL, one stubs target: a server and a client of the same service link
# the one library that generated it. Generating the same files twice (the
# same IDL twice in one directory, or two calls with one OUT) is refused at
# configure time, since two rules writing one file race in a parallel build.
#
# The generator needs a Python 3 with jinja2. CTLRPC_PYTHON (a cache
# variable) names it; when unset, /usr/bin/python3 and then the python3 on
# PATH are tried, and configure fails early, naming the Debian package, if
# none can import jinja2. The generator must be of the runtime's version
# (`ctlrpc-gen --version`); configure fails naming both otherwise.
#
# Used from the source tree (the variables below are set by
# runtime/CMakeLists.txt) and from an install (ctlrpcConfig.cmake sets them
# to the installed generator before including this file):
#   CTLRPC_GEN          the generator script
#   CTLRPC_GEN_DEPENDS  the files its output depends on (package, templates)
#   CTLRPC_GEN_VERSION  the version the generator must report

# In the source tree they are cache entries, so that every directory of the
# build (and of a project that adds ours) sees them.
if(NOT CTLRPC_GEN_INSTALLED)
  get_filename_component(_ctl_gen_dir "${CMAKE_CURRENT_LIST_DIR}/../../gen" ABSOLUTE)
  file(GLOB_RECURSE _ctl_gen_depends CONFIGURE_DEPENDS
       "${_ctl_gen_dir}/ctlrpc-gen"
       "${_ctl_gen_dir}/ctlrpc_gen/*.py"
       "${_ctl_gen_dir}/ctlrpc_gen/templates/*")
  set(CTLRPC_GEN "${_ctl_gen_dir}/ctlrpc-gen" CACHE INTERNAL "")
  set(CTLRPC_GEN_DEPENDS "${_ctl_gen_depends}" CACHE INTERNAL "")
  set(CTLRPC_GEN_VERSION "${PROJECT_VERSION}" CACHE INTERNAL "")
  set(CTLRPC_GEN_DIR "${_ctl_gen_dir}" CACHE INTERNAL "")
endif()

# The generator reports the version the runtime has, or configure stops.
function(_ctlrpc_check_gen_version py)
  execute_process(COMMAND "${py}" "${CTLRPC_GEN}" --version
                  RESULT_VARIABLE rc OUTPUT_VARIABLE out ERROR_VARIABLE err
                  OUTPUT_STRIP_TRAILING_WHITESPACE)
  if(NOT rc EQUAL 0)
    message(FATAL_ERROR "ctlrpc_generate: ${CTLRPC_GEN} --version failed (${rc}): ${err}")
  endif()
  if(NOT out STREQUAL "ctlrpc-gen ${CTLRPC_GEN_VERSION}")
    message(FATAL_ERROR
      "ctlrpc_generate: ${CTLRPC_GEN} is '${out}', but the runtime linked is ctlrpc "
      "${CTLRPC_GEN_VERSION}: generated code must come from the generator of the same "
      "version (install them together)")
  endif()
endfunction()

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
      message(STATUS "ctlrpc-gen runs with ${py}")
      set(CTLRPC_PYTHON_OK TRUE CACHE INTERNAL "")
      return()
    endif()
  endforeach()
  message(FATAL_ERROR
    "ctlrpc-gen needs Python 3 with jinja2, and none was found (tried: ${candidates}).\n"
    "On Debian: apt-get install python3-jinja2 (it installs into /usr/bin/python3),\n"
    "or point -DCTLRPC_PYTHON=/path/to/python3 at an interpreter that has jinja2.")
endfunction()

function(ctlrpc_generate target)
  cmake_parse_arguments(ARG "STRICT" "IDL;OUT;AGAINST" "" ${ARGN})
  if(NOT ARG_IDL)
    message(FATAL_ERROR "ctlrpc_generate(${target}): IDL <file> is required")
  endif()
  if(NOT TARGET ${target})
    message(FATAL_ERROR "ctlrpc_generate(${target}): no such target")
  endif()
  _ctlrpc_find_python()
  get_property(checked GLOBAL PROPERTY CTLRPC_GEN_CHECKED)
  if(NOT checked)
    _ctlrpc_check_gen_version("${CTLRPC_PYTHON}")
    set_property(GLOBAL PROPERTY CTLRPC_GEN_CHECKED TRUE)
  endif()
  get_filename_component(idl "${ARG_IDL}" ABSOLUTE)
  if(NOT EXISTS "${idl}")
    message(FATAL_ERROR "ctlrpc_generate(${target}): IDL file ${idl} does not exist")
  endif()
  set(against "")
  if(ARG_AGAINST)
    get_filename_component(ARG_AGAINST "${ARG_AGAINST}" ABSOLUTE)
    if(NOT EXISTS "${ARG_AGAINST}")
      message(FATAL_ERROR "ctlrpc_generate(${target}): AGAINST file ${ARG_AGAINST} does not exist")
    endif()
    set(against --against "${ARG_AGAINST}")
    if(ARG_STRICT)
      list(APPEND against --strict)
    endif()
  elseif(ARG_STRICT)
    message(FATAL_ERROR "ctlrpc_generate(${target}): STRICT needs AGAINST <old.idl>")
  endif()
  get_filename_component(stem "${idl}" NAME_WLE) # as ctlrpc-gen: only the last extension goes
  if(NOT ARG_OUT)
    set(ARG_OUT "${CMAKE_CURRENT_BINARY_DIR}/ctlrpc-gen/${stem}")
  endif()
  get_filename_component(ARG_OUT "${ARG_OUT}" ABSOLUTE BASE_DIR "${CMAKE_CURRENT_BINARY_DIR}")
  set(outputs "${ARG_OUT}/${stem}.ctl.h" "${ARG_OUT}/${stem}.ctl.c")
  get_property(done GLOBAL PROPERTY CTLRPC_GENERATED)
  foreach(entry IN LISTS done)
    string(REPLACE "|" ";" entry "${entry}")
    list(GET entry 0 done_file)
    list(GET entry 1 done_target)
    if(done_file STREQUAL "${ARG_OUT}/${stem}.ctl.c")
      message(FATAL_ERROR
        "ctlrpc_generate(${target}): ${stem}.ctl.c in ${ARG_OUT} is already generated for "
        "target ${done_target}: generate ${idl} once, into a static stubs library that both "
        "link (add_library(${stem}_stubs STATIC), ctlrpc_generate(${stem}_stubs IDL ...), "
        "target_link_libraries(<program> PRIVATE ${stem}_stubs) for each program; see "
        "docs/USING.md, \"One IDL, a server and a client\"), or give another OUT")
    endif()
  endforeach()
  set_property(GLOBAL APPEND PROPERTY CTLRPC_GENERATED "${ARG_OUT}/${stem}.ctl.c|${target}")

  # Everything the output depends on: the generator and its templates, and
  # the IDL files this one imports (listed by the generator itself, so a
  # change to an import also regenerates).
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
    COMMAND "${CTLRPC_PYTHON}" "${CTLRPC_GEN}" "${idl}"
            -o "${ARG_OUT}" --depfile "${depfile}" ${against}
    ${touch_outputs}
    MAIN_DEPENDENCY "${idl}"
    DEPENDS ${CTLRPC_GEN_DEPENDS} ${ARG_AGAINST}
    DEPFILE "${depfile}"
    COMMENT "ctlrpc-gen ${stem}.idl"
    VERBATIM)
  target_sources(${target} PRIVATE ${outputs})
  target_include_directories(${target} PUBLIC "${ARG_OUT}")
  target_link_libraries(${target} PUBLIC ctlrpc::ctlrpc)
endfunction()
