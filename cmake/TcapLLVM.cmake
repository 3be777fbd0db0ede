# Finds LLVM 19 for the cpu_llvm kernel backend (D7): Debian's llvm-19-dev, whose
# CMake package lives in /usr/lib/llvm-19/lib/cmake/llvm (or wherever `llvm-config-19
# --cmakedir` says).
#
# Sets TCAP_HAVE_LLVM (ON when the backend is built) and the imported target TcapLLVM::llvm
# (LLVM's include dirs and definitions plus the one shared libLLVM-19.so).
#
# Only LLVM's include directory and definitions are taken, never `llvm-config --cxxflags`:
# those contain -fno-exceptions, and the code that includes LibTorch headers needs
# exceptions. LLVM's headers are used inside csrc/codegen/cpu_llvm/ only.
#
# LLVMConfigVersion.cmake accepts a request only when major.minor match exactly
# ("19" means 19.0), so the version is checked by hand after an unversioned search.

option(TCAP_WITH_LLVM "Build the LLVM ORC JIT CPU kernel backend (needs llvm-19-dev)" ON)
set(TCAP_HAVE_LLVM OFF)

if(TCAP_WITH_LLVM)
  set(_tcap_llvm_hints /usr/lib/llvm-19/lib/cmake/llvm)
  find_program(TCAP_LLVM_CONFIG NAMES llvm-config-19)
  if(TCAP_LLVM_CONFIG)
    execute_process(COMMAND ${TCAP_LLVM_CONFIG} --cmakedir
                    OUTPUT_VARIABLE _tcap_llvm_cmakedir OUTPUT_STRIP_TRAILING_WHITESPACE
                    RESULT_VARIABLE _tcap_llvm_rc)
    if(_tcap_llvm_rc EQUAL 0 AND _tcap_llvm_cmakedir)
      list(APPEND _tcap_llvm_hints ${_tcap_llvm_cmakedir})
    endif()
  endif()
  find_package(LLVM CONFIG QUIET HINTS ${_tcap_llvm_hints})
  if(LLVM_FOUND AND LLVM_VERSION_MAJOR EQUAL 19 AND TARGET LLVM)
    set(TCAP_HAVE_LLVM ON)
    separate_arguments(_tcap_llvm_defs UNIX_COMMAND "${LLVM_DEFINITIONS}")
    add_library(TcapLLVM::llvm INTERFACE IMPORTED)
    # SYSTEM: our -Wall -Wextra should not report warnings inside LLVM's headers.
    set_target_properties(TcapLLVM::llvm PROPERTIES
      INTERFACE_INCLUDE_DIRECTORIES "${LLVM_INCLUDE_DIRS}"
      INTERFACE_SYSTEM_INCLUDE_DIRECTORIES "${LLVM_INCLUDE_DIRS}"
      INTERFACE_COMPILE_OPTIONS "${_tcap_llvm_defs}"
      INTERFACE_LINK_LIBRARIES LLVM)
    get_target_property(_tcap_llvm_lib LLVM LOCATION)
    message(STATUS "tcap: LLVM ${LLVM_PACKAGE_VERSION} from ${LLVM_DIR} (${_tcap_llvm_lib})")
  elseif(LLVM_FOUND)
    message(STATUS "tcap: found LLVM ${LLVM_PACKAGE_VERSION} in ${LLVM_DIR}, but the cpu_llvm backend needs "
                   "LLVM 19 (with the shared libLLVM); building without it")
  else()
    message(STATUS "tcap: LLVM 19 not found (install llvm-19-dev); building without the cpu_llvm backend")
  endif()
else()
  message(STATUS "tcap: TCAP_WITH_LLVM=OFF; building without the cpu_llvm backend")
endif()
