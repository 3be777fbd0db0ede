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
