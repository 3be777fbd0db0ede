# Finds what tcap::DistributedDataParallel needs (DESIGN.md D13): LibTorch's c10d headers
# and Gloo's headers. LibTorch's wheel ships c10d (ProcessGroupGloo, TCPStore, the Gloo
# library itself, inside libtorch_cpu.so) but not the Gloo headers that
# ProcessGroupGloo.hpp includes. Debian's libgloo-dev provides them (tools/bootstrap.sh
# installs it). Only the headers are used: nothing links libgloo.so; every Gloo symbol
# tcap calls is LibTorch's own (Note [Gloo headers from Debian], docs/distributed.md).
#
# Sets TCAP_HAVE_DISTRIBUTED and, when ON, TCAP_GLOO_INCLUDE_DIR.

option(TCAP_WITH_DISTRIBUTED "Build tcap::DistributedDataParallel on c10d/Gloo (needs libgloo-dev's headers)" ON)
set(TCAP_HAVE_DISTRIBUTED OFF)

if(TCAP_WITH_DISTRIBUTED)
  set(_tcap_c10d_header "")
  foreach(_dir IN LISTS TORCH_INCLUDE_DIRS)
    if(NOT _tcap_c10d_header AND EXISTS "${_dir}/torch/csrc/distributed/c10d/ProcessGroupGloo.hpp")
      set(_tcap_c10d_header "${_dir}/torch/csrc/distributed/c10d/ProcessGroupGloo.hpp")
    endif()
  endforeach()
  find_path(TCAP_GLOO_INCLUDE_DIR gloo/algorithm.h HINTS /usr/include /usr/local/include)
  if(NOT _tcap_c10d_header)
    message(STATUS "tcap: LibTorch has no c10d headers (ProcessGroupGloo.hpp); building without tcap::DistributedDataParallel")
  elseif(NOT TCAP_GLOO_INCLUDE_DIR OR NOT EXISTS "${TCAP_GLOO_INCLUDE_DIR}/gloo/algorithm.h")
    message(STATUS "tcap: Gloo headers not found (install libgloo-dev, or set TCAP_GLOO_INCLUDE_DIR); "
                   "building without tcap::DistributedDataParallel")
  else()
    set(TCAP_HAVE_DISTRIBUTED ON)
    message(STATUS "tcap: distributed (c10d/Gloo) on, Gloo headers from ${TCAP_GLOO_INCLUDE_DIR}")
  endif()
else()
  message(STATUS "tcap: TCAP_WITH_DISTRIBUTED=OFF; building without tcap::DistributedDataParallel")
endif()
