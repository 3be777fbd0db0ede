# Finds LibTorch (D9): the pinned PyPI wheel installed by tools/bootstrap.sh, or any
# LibTorch >= 2.11 given through Torch_DIR / CMAKE_PREFIX_PATH.
#
# The wheel's TorchConfig pulls in Caffe2's CUDA discovery. tcap's CPU build does not
# need CUDA, so when the wheel was built with CUDA we still let it search (it finds
# /usr/local/cuda here) but never fail the configure on it.
find_package(Torch 2.11 REQUIRED)
# Torch's INTERFACE flags include -D_GLIBCXX_USE_CXX11_ABI=...; keep them.
# Mark LibTorch's include dirs as SYSTEM so our -Wall does not drown in their warnings.
get_target_property(_tcap_torch_inc torch INTERFACE_INCLUDE_DIRECTORIES)
if(_tcap_torch_inc)
  set_target_properties(torch PROPERTIES INTERFACE_SYSTEM_INCLUDE_DIRECTORIES "${_tcap_torch_inc}")
endif()
get_filename_component(TCAP_TORCH_LIB_DIR "${TORCH_LIBRARY}" DIRECTORY)
message(STATUS "tcap: LibTorch ${Torch_VERSION} from ${TCAP_TORCH_LIB_DIR}")

# Note [at::parallel_for needs OpenMP in the caller]
# at::parallel_for is a header template. With ATen's OpenMP backend (AT_PARALLEL_OPENMP,
# the PyPI wheel's) it splits the range across threads only in translation units
# compiled with OpenMP: ATen/ParallelOpenMP.h defines the parallel path under
# `#ifdef _OPENMP`. Without the flag every call silently runs the whole range on the
# calling thread. Code that calls at::parallel_for (the fused kernel launcher, the
# bench's bandwidth probe, tests) therefore links tcap_openmp: the compiler's OpenMP flag,
# and the OpenMP runtime LibTorch itself loads (the wheel ships libgomp.so.1 next to
# libtorch_cpu), so one runtime and one thread pool serve ATen and tcap and
# at::set_num_threads applies to both.
add_library(tcap_openmp INTERFACE)
set(_tcap_aten_config "")
foreach(_dir IN LISTS TORCH_INCLUDE_DIRS)
  if(NOT _tcap_aten_config AND EXISTS "${_dir}/ATen/Config.h")
    set(_tcap_aten_config "${_dir}/ATen/Config.h")
  endif()
endforeach()
set(TCAP_ATEN_OPENMP OFF)
if(_tcap_aten_config)
  file(STRINGS "${_tcap_aten_config}" _tcap_openmp_line REGEX "#define AT_PARALLEL_OPENMP 1")
  if(_tcap_openmp_line)
    set(TCAP_ATEN_OPENMP ON)
  endif()
endif()
if(TCAP_ATEN_OPENMP)
  find_package(OpenMP REQUIRED COMPONENTS CXX)
  target_compile_options(tcap_openmp INTERFACE ${OpenMP_CXX_FLAGS})
  if(EXISTS "${TCAP_TORCH_LIB_DIR}/libgomp.so.1" AND CMAKE_CXX_COMPILER_ID STREQUAL "GNU")
    set(TCAP_OPENMP_RUNTIME "${TCAP_TORCH_LIB_DIR}/libgomp.so.1")
  else()
    set(TCAP_OPENMP_RUNTIME OpenMP::OpenMP_CXX)
  endif()
  target_link_libraries(tcap_openmp INTERFACE ${TCAP_OPENMP_RUNTIME})
  message(STATUS "tcap: ATen parallelises with OpenMP; at::parallel_for callers use ${OpenMP_CXX_FLAGS} and ${TCAP_OPENMP_RUNTIME}")
else()
  message(STATUS "tcap: ATen's parallel backend is not OpenMP; at::parallel_for needs no compiler flag")
endif()
