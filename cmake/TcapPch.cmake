# Precompiled LibTorch headers for the programs tcap builds around its library: tests,
# benchmarks, examples and tools (docs/building.md has the figures).
#
# Note [Precompiled LibTorch headers]
# Every test and benchmark source includes <torch/torch.h>: GCC spends about 20 s of a
# test file's 30 s on that header alone on the 2-core machines (parsing it, and writing
# debug information for what it declares). One precompiled copy of it is built once, by
# the target tcap_pch, and every program target reuses it (REUSE_FROM), so each file pays
# for loading it instead. A precompiled header is only valid under the flags it was
# built with: tcap_pch is an executable like its users (-fPIE, where a library's objects
# are -fPIC), links LibTorch (its definitions) and tcap_openmp (-fopenmp: _OPENMP changes
# what ATen's parallel headers declare), and tcap_use_pch() gives every user tcap_openmp
# too. GCC checks the rest itself and parses the header normally when the copy does not
# fit (-Winvalid-pch says so, loudly, rather than silently slowing the build).
# The library's own stages include far less of LibTorch and do not use it.
# -DTCAP_PCH=OFF builds without it. With ccache, dev.sh sets the sloppiness ccache needs to
# cache files that use a precompiled header (pch_defines, time_macros).
option(TCAP_PCH "Precompile LibTorch's headers for tests, benchmarks, examples and tools" ON)

if(TCAP_PCH)
  set(_tcap_pch_main ${CMAKE_BINARY_DIR}/tcap_pch_main.cpp)
  file(GENERATE OUTPUT ${_tcap_pch_main} CONTENT "int main() { return 0; }\n")
  add_executable(tcap_pch ${_tcap_pch_main})
  target_link_libraries(tcap_pch PRIVATE torch tcap_openmp)
  target_precompile_headers(tcap_pch PRIVATE <torch/torch.h>)
  set_target_properties(tcap_pch PROPERTIES BUILD_RPATH "${TCAP_TORCH_LIB_DIR}")
endif()

function(tcap_use_pch target)
  target_link_libraries(${target} PRIVATE tcap_openmp)
  if(TCAP_PCH)
    target_precompile_headers(${target} REUSE_FROM tcap_pch)
    target_compile_options(${target} PRIVATE -Winvalid-pch)
  endif()
endfunction()
