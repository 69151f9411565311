"""Finds the CUDA toolkit at configure time and writes @local_cuda.

With nvcc present, @local_cuda//:defs.bzl says CUDA_AVAILABLE = True and @local_cuda//:cuda
links cudart, cuBLAS and NCCL. Without it, CUDA_AVAILABLE = False and @local_cuda//:cuda is an
empty library, so every package still builds CPU-only. Bazel 4 has no offline CUDA rules; this
plus //third_party/cuda:cuda.bzl is the whole of our CUDA support.
"""

def _cuda_configure_impl(ctx):
    root = ctx.os.environ.get("TESSERA_CUDA_PATH", "/usr/local/cuda")
    nvcc = ctx.path(root + "/bin/nvcc")
    available = nvcc.exists and ctx.os.environ.get("TESSERA_DISABLE_CUDA", "") != "1"
    ctx.file("WORKSPACE", 'workspace(name = "%s")\n' % ctx.name)
    ctx.file("defs.bzl", "CUDA_AVAILABLE = %s\nCUDA_ROOT = %r\nNVCC = %r\n" % (
        "True" if available else "False",
        root,
        str(nvcc) if available else "",
    ))
    if available:
        linkopts = [
            "-L%s/lib64" % root,
            "-Wl,-rpath,%s/lib64" % root,
            "-lcudart",
            "-lcublas",
            "-lnccl",
        ]
        # Headers are reached through -isystem rather than a copied include tree.
        copts = ["-isystem", "%s/include" % root]
    else:
        linkopts = []
        copts = []
    ctx.file("BUILD", """package(default_visibility = ["//visibility:public"])

# CUDA runtime, cuBLAS and NCCL from {root} (available = {available}).
cc_library(
    name = "cuda",
    linkopts = {linkopts},
)

# Compiler options that put the CUDA headers on the path of host C++ sources.
cc_library(
    name = "cuda_headers",
    copts = {copts},
)

exports_files(["defs.bzl"])
""".format(root = root, available = available, linkopts = repr(linkopts), copts = repr(copts)))

cuda_configure = repository_rule(
    implementation = _cuda_configure_impl,
    environ = ["TESSERA_CUDA_PATH", "TESSERA_DISABLE_CUDA"],
    local = True,
)
