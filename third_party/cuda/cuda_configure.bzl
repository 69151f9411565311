"""Finds the CUDA toolkit at configure time and writes @local_cuda.

With nvcc present, @local_cuda//:defs.bzl says CUDA_AVAILABLE = True and @local_cuda//:cudart,
:cublas, :nccl (and :cuda, all three) link the toolkit's libraries. Without it, CUDA_AVAILABLE =
False and those are empty libraries, so every package still builds CPU-only. Bazel 4 has no
offline CUDA rules; this plus //third_party/cuda:cuda.bzl is the whole of our CUDA support.

Environment (read here and nowhere else; pass with --repo_env=... or --action_env=...):
  TESSERA_CUDA_PATH     toolkit root, default /usr/local/cuda
  TESSERA_DISABLE_CUDA  "1" builds CPU-only even where the toolkit exists
  CC                    host compiler that nvcc drives (-ccbin); default: g++ on PATH, as
                        Bazel's own C++ toolchain would pick gcc
"""

_FALSE_VALUES = ["", "0", "false", "no"]
_TRUE_VALUES = ["1", "true", "yes"]

def _host_compiler(ctx):
    cc = ctx.os.environ.get("CC", "")
    if cc:
        path = ctx.path(cc) if cc.startswith("/") else ctx.which(cc)
        if path == None or not path.exists:
            fail("cuda_configure: CC=%s (the host compiler for nvcc) was not found" % cc)
        return str(path)
    for name in ["g++", "gcc"]:
        path = ctx.which(name)
        if path != None:
            return str(path)
    return ""

def _linkopts(libdir, name):
    return repr(["-L" + libdir, "-Wl,-rpath," + libdir, "-l" + name])

def _cuda_configure_impl(ctx):
    root = ctx.os.environ.get("TESSERA_CUDA_PATH", "/usr/local/cuda").rstrip("/")
    disable = ctx.os.environ.get("TESSERA_DISABLE_CUDA", "").lower()
    if disable not in _FALSE_VALUES + _TRUE_VALUES:
        fail("cuda_configure: TESSERA_DISABLE_CUDA=%r: expected 1 or 0" % disable)
    nvcc = ctx.path(root + "/bin/nvcc")
    host_cc = _host_compiler(ctx)

    if disable in _TRUE_VALUES:
        available, reason = False, "disabled by TESSERA_DISABLE_CUDA=1"
    elif not nvcc.exists:
        available, reason = False, "no nvcc at %s" % nvcc
    elif not host_cc:
        available, reason = False, "no host compiler (g++/gcc) for nvcc on PATH"
    else:
        available, reason = True, "nvcc at %s, host compiler %s" % (nvcc, host_cc)

    ctx.file("WORKSPACE", 'workspace(name = "%s")\n' % ctx.name)
    ctx.file("defs.bzl", "\n".join([
        "# Written by //third_party/cuda:cuda_configure.bzl: %s." % reason,
        "CUDA_AVAILABLE = %s" % available,
        "CUDA_ROOT = %r" % root,
        "NVCC = %r" % (str(nvcc) if available else ""),
        "HOST_COMPILER = %r" % (host_cc if available else ""),
        "",
    ]))

    if available:
        # The include tree is linked in (not copied) so that cc targets can depend on its headers
        # through `includes`; copts on a cc_library would not reach the libraries that depend on it.
        ctx.symlink(root + "/include", "include")
        libdir = root + "/lib64"
        body = """
cc_library(
    name = "cuda_headers",
    hdrs = glob(["include/**"]),
    includes = ["include"],
)

cc_library(
    name = "cudart",
    linkopts = {cudart},
    deps = [":cuda_headers"],
)

cc_library(
    name = "cublas",
    linkopts = {cublas},
    deps = [":cudart"],
)

cc_library(
    name = "nccl",
    linkopts = {nccl},
    deps = [":cudart"],
)
""".format(
            cudart = _linkopts(libdir, "cudart"),
            cublas = _linkopts(libdir, "cublas"),
            nccl = _linkopts(libdir, "nccl"),
        )
    else:
        body = """
cc_library(name = "cuda_headers")

cc_library(name = "cudart")

cc_library(name = "cublas")

cc_library(name = "nccl")
"""

    ctx.file("BUILD", """package(default_visibility = ["//visibility:public"])

# CUDA toolkit from {root}: available = {available} ({reason}).
# Host C++ sources that include <cuda_runtime.h>, <cublas_v2.h> or <nccl.h> depend on the matching
# library; .cu sources go through cuda_library in //third_party/cuda:cuda.bzl.
{body}
# CUDA runtime, cuBLAS and NCCL together.
cc_library(
    name = "cuda",
    deps = [
        ":cublas",
        ":cudart",
        ":nccl",
    ],
)

exports_files(["defs.bzl"])
""".format(root = root, available = available, reason = reason, body = body))

cuda_configure = repository_rule(
    implementation = _cuda_configure_impl,
    environ = ["TESSERA_CUDA_PATH", "TESSERA_DISABLE_CUDA", "CC", "PATH"],
    local = True,
)
