# PYCOLLECTIVE_CUDA=AUTO|ON|OFF decides whether csrc/cuda/ is compiled into the extension.
#   OFF : CPU-only, nvcc is never looked for.
#   AUTO: CUDA when nvcc is found, else CPU-only (said in a STATUS line, never silently).
#   ON  : CUDA or a configuration error that says how to fix it.
# The result is PYCOLLECTIVE_HAVE_CUDA (config.h, build_info()).
set(PYCOLLECTIVE_CUDA "AUTO" CACHE STRING "Build the CUDA kernels: AUTO, ON or OFF")
set_property(CACHE PYCOLLECTIVE_CUDA PROPERTY STRINGS AUTO ON OFF)
string(TOUPPER "${PYCOLLECTIVE_CUDA}" _pc_cuda)

set(PYCOLLECTIVE_HAVE_CUDA 0)
set(PYCOLLECTIVE_CUDA_VERSION "")
set(PYCOLLECTIVE_CUDA_ARCHITECTURES "")
file(GLOB _pc_cuda_sources "${CMAKE_CURRENT_SOURCE_DIR}/csrc/cuda/*.cu")

if(_pc_cuda STREQUAL "OFF")
  message(STATUS "pycollective: PYCOLLECTIVE_CUDA=OFF, CPU-only build")
elseif(_pc_cuda STREQUAL "AUTO" OR _pc_cuda STREQUAL "ON")
  if(NOT _pc_cuda_sources)
    # Nothing to compile yet: do not pay for toolkit detection (or claim CUDA) without kernels.
    if(_pc_cuda STREQUAL "ON")
      message(FATAL_ERROR "pycollective: PYCOLLECTIVE_CUDA=ON but this source tree has no CUDA "
                          "sources (csrc/cuda/*.cu); build with PYCOLLECTIVE_CUDA=AUTO or OFF")
    endif()
    message(STATUS "pycollective: no CUDA sources in csrc/cuda, CPU-only build")
  else()
    include(CheckLanguage)
    check_language(CUDA)
    if(CMAKE_CUDA_COMPILER)
      if(NOT DEFINED CMAKE_CUDA_ARCHITECTURES OR CMAKE_CUDA_ARCHITECTURES STREQUAL "")
        # Explicit list: the build host may have no GPU (never "native"), and CUDA 13 refuses
        # anything below sm_75. Machine code for sm_75 (T4) and sm_80 (A100; sm_86/89 run it
        # too), sm_90 code plus PTX (H100/H200; newer GPUs JIT the PTX). The kernels are small:
        # on a 2-core host each architecture adds about 2.5 s to the build (measured with
        # nvcc 13.0). Override with -DCMAKE_CUDA_ARCHITECTURES=... (e.g. "90" in CI).
        set(CMAKE_CUDA_ARCHITECTURES "75-real;80-real;90")
      endif()
      # Static CUDA runtime: a wheel needs only the driver (libcuda.so.1), which cudart loads.
      set(CMAKE_CUDA_RUNTIME_LIBRARY Static)
      enable_language(CUDA)
      find_package(CUDAToolkit REQUIRED)
      foreach(_pc_arch IN LISTS CMAKE_CUDA_ARCHITECTURES)
        string(REGEX MATCH "^[0-9]+" _pc_arch_number "${_pc_arch}")
        if(_pc_arch_number AND _pc_arch_number LESS 75)
          message(FATAL_ERROR "pycollective: CMAKE_CUDA_ARCHITECTURES contains ${_pc_arch}; "
                              "the minimum is 75 (CUDA 13 dropped older GPUs)")
        endif()
      endforeach()
      set(PYCOLLECTIVE_HAVE_CUDA 1)
      set(PYCOLLECTIVE_CUDA_VERSION "${CUDAToolkit_VERSION}")
      set(PYCOLLECTIVE_CUDA_ARCHITECTURES "${CMAKE_CUDA_ARCHITECTURES}")
      message(STATUS "pycollective: CUDA ${CUDAToolkit_VERSION}, architectures "
                     "${CMAKE_CUDA_ARCHITECTURES}")
    elseif(_pc_cuda STREQUAL "ON")
      message(FATAL_ERROR "pycollective: PYCOLLECTIVE_CUDA=ON but no CUDA compiler was found. "
                          "Put nvcc on PATH or set CUDACXX=/path/to/nvcc, or build with "
                          "PYCOLLECTIVE_CUDA=AUTO (CPU-only when nvcc is absent).")
    else()
      message(STATUS "pycollective: no CUDA compiler found, CPU-only build")
    endif()
  endif()
else()
  message(FATAL_ERROR "pycollective: PYCOLLECTIVE_CUDA must be AUTO, ON or OFF, got "
                      "'${PYCOLLECTIVE_CUDA}'")
endif()
