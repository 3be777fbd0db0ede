# Sanitizer and fuzzing builds (docs/reliability.md). Each goes in a build folder of its
# own; tools/sanitize.sh configures them.
#
#   -DTCAP_SANITIZE=address   AddressSanitizer + UndefinedBehaviorSanitizer (GCC or clang)
#   -DTCAP_SANITIZE=thread    ThreadSanitizer
#   -DTCAP_FUZZ=ON            libFuzzer fuzz targets (clang): tcap's code is built with
#                             coverage for libFuzzer; combine with TCAP_SANITIZE=address.
#
# The flags apply to everything tcap builds; LibTorch, a prebuilt wheel, is not
# instrumented (reports inside it are suppressed by tools/sanitizers/*.supp, which say so).
set(TCAP_SANITIZE "" CACHE STRING "Build with sanitizers: address (ASan+UBSan), thread (TSan), or empty")
set_property(CACHE TCAP_SANITIZE PROPERTY STRINGS "" address thread)
option(TCAP_FUZZ "Build the fuzz targets with libFuzzer (clang)" OFF)

if(TCAP_SANITIZE STREQUAL "address")
  # -fno-sanitize-recover: a UBSan report fails the test instead of scrolling past.
  set(_tcap_san -fsanitize=address,undefined -fno-sanitize-recover=undefined -fno-omit-frame-pointer)
elseif(TCAP_SANITIZE STREQUAL "thread")
  set(_tcap_san -fsanitize=thread -fno-omit-frame-pointer)
elseif(NOT TCAP_SANITIZE STREQUAL "")
  message(FATAL_ERROR "TCAP_SANITIZE must be address, thread or empty, not '${TCAP_SANITIZE}'")
endif()
if(_tcap_san)
  add_compile_options(${_tcap_san})
  add_link_options(${_tcap_san})
  message(STATUS "tcap: sanitizers ${_tcap_san}")
endif()

if(TCAP_FUZZ)
  if(NOT CMAKE_CXX_COMPILER_ID MATCHES "Clang")
    message(FATAL_ERROR "TCAP_FUZZ needs clang (libFuzzer); configure with -DCMAKE_CXX_COMPILER=clang++")
  endif()
  add_compile_options(-fsanitize=fuzzer-no-link)
endif()
