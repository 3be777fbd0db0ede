# Warning flags for tcap's own targets (not for LibTorch's headers, which come in as SYSTEM).
function(tcap_warnings target)
  target_compile_options(${target} PRIVATE -Wall -Wextra -Wno-unused-parameter)
endfunction()
