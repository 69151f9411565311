"""cuda_library: .cu sources compiled by nvcc when the toolkit is present, a CPU fallback otherwise.

    cuda_library(
        name = "device",
        cuda_srcs = ["device_cuda.cu"],   # compiled with nvcc for sm_90 + PTX
        cpu_srcs = ["device_cpu.cc"],     # used instead where there is no toolkit
        hdrs = ["device.h"],
        deps = [...],
    )

Both variants implement the same header, so callers never see an #if.
"""

load("@local_cuda//:defs.bzl", "CUDA_AVAILABLE", "CUDA_ROOT", "NVCC")

# Hopper (H100/H200) machine code plus PTX that newer GPUs can JIT.
_GENCODE = "-gencode arch=compute_90,code=sm_90 -gencode arch=compute_90,code=compute_90"

def cuda_library(name, cuda_srcs, cpu_srcs, hdrs = [], deps = [], visibility = None, **kwargs):
    if not CUDA_AVAILABLE:
        native.cc_library(
            name = name,
            srcs = cpu_srcs,
            hdrs = hdrs,
            deps = deps,
            visibility = visibility,
            **kwargs
        )
        return
    objs = []
    for src in cuda_srcs:
        obj = name + "_" + src.replace("/", "_").replace(".cu", ".o")
        native.genrule(
            name = obj + "_nvcc",
            srcs = [src] + hdrs + native.glob(["**/*.h"]),
            outs = [obj],
            cmd = ("{nvcc} -c -O3 -std=c++17 -Xcompiler -fPIC {gencode} " +
                   "-I. -I$(GENDIR) -o $@ $(location {src})").format(
                nvcc = NVCC,
                gencode = _GENCODE,
                src = src,
            ),
            message = "nvcc " + src,
        )
        objs.append(obj)
    native.cc_library(
        name = name,
        srcs = objs,
        hdrs = hdrs,
        deps = deps + ["@local_cuda//:cuda"],
        visibility = visibility,
        **kwargs
    )
