"""cuda_library: .cu sources compiled by nvcc when the toolkit is present, a CPU fallback otherwise.

    load("//third_party/cuda:cuda.bzl", "cuda_library")

    cuda_library(
        name = "device",
        cuda_srcs = ["device.cu"],        # compiled with nvcc for sm_90 + PTX, linked with cudart
        cpu_srcs = ["device_cpu.cc"],     # used instead where there is no toolkit
        hdrs = ["device.h"],
        deps = [":status"],
    )

Both variants implement the same header, so callers never see an #if. A .cu file includes by
workspace path ("common/base/status.h") and sees the headers of `hdrs` and of every cc `deps`,
transitively, exactly as a .cc in a cc_library would. In a CUDA build the CPU fallback is
still compiled (as `<name>_cpu_fallback`, private) so that it cannot rot unnoticed.

CUDA_ENABLED tells a BUILD file which variant this build chose (e.g. for a test's local_defines).
"""

load("@local_cuda//:defs.bzl", "CUDA_AVAILABLE", "HOST_COMPILER", "NVCC")

CUDA_ENABLED = CUDA_AVAILABLE

# Hopper (H100/H200) machine code plus compute_90 PTX that newer GPUs can JIT.
_GENCODE = [
    "-gencode=arch=compute_90,code=sm_90",
    "-gencode=arch=compute_90,code=compute_90",
]

# Host side: position-independent (the objects go into shared libraries too) and the same
# warnings as .bazelrc gives C++ sources.
# Device front end: #2810 is a false positive of nvcc's front end on `status_ = ...` inside
# status.h (an assignment returns a reference to a [[nodiscard]] type); really discarded Status
# values are still reported, by the front end (#3004) and by g++ (-Wunused-result).
_HOST_FLAGS = [
    "-Xcompiler=-fPIC,-Wall,-Wextra,-Wno-unused-parameter",
    "-diag-suppress=2810",
]

def _nvcc_compile_impl(ctx):
    cc_info = cc_common.merge_cc_infos(cc_infos = [d[CcInfo] for d in ctx.attr.deps])
    cc_ctx = cc_info.compilation_context
    private_hdrs = [f for f in ctx.files.srcs if not f.path.endswith(".cu")]
    inputs = depset(ctx.files.hdrs + private_hdrs, transitive = [cc_ctx.headers])

    # Same search path a cc_library source gets: the workspace root (and its generated twin),
    # then what deps declare through `includes` / `strip_include_prefix` / external repositories.
    dirs = ["."] + [ctx.bin_dir.path] + cc_ctx.quote_includes.to_list() + cc_ctx.includes.to_list()
    flags = ["-I" + d for d in _unique(dirs)]
    for d in cc_ctx.system_includes.to_list():
        flags += ["-isystem", d]
    flags += ["-D" + d for d in cc_ctx.defines.to_list()]

    objs = []
    for src in ctx.files.srcs:
        if not src.path.endswith(".cu"):
            continue
        obj = ctx.actions.declare_file("_nvcc/%s/%s.pic.o" % (ctx.label.name, src.basename[:-len(".cu")]))
        args = [
            ctx.attr.nvcc,
            "-ccbin=" + ctx.attr.host_compiler,
            "-c",
            "-std=c++17",
            "-O3",
        ] + _HOST_FLAGS + _GENCODE + flags + ctx.attr.copts + ["-o", obj.path, src.path]
        cmd = " ".join([_shell_quote(a) for a in args])
        ctx.actions.run_shell(
            inputs = depset([src], transitive = [inputs]),
            outputs = [obj],
            # nvcc's own diagnostics come first; this line says which target and tools failed.
            command = cmd + (" || { status=$?; echo >&2; echo >&2 \"ERROR: nvcc failed (exit $status) " +
                             "compiling %s for %s; nvcc=%s, host compiler=%s. Build CPU-only with " +
                             "--repo_env=TESSERA_DISABLE_CUDA=1.\"; exit $status; }") % (
                src.path,
                ctx.attr.library,
                ctx.attr.nvcc,
                ctx.attr.host_compiler,
            ),
            mnemonic = "Nvcc",
            progress_message = "Compiling %s with nvcc (sm_90 + PTX)" % src.short_path,
            use_default_shell_env = True,
        )
        objs.append(obj)
    return [DefaultInfo(files = depset(objs))]

_SHELL_SAFE = "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789_-+=.,:/@%"

def _shell_quote(s):
    # Plain words stay plain so that a failed command line stays readable.
    if s and all([c in _SHELL_SAFE for c in s.elems()]):
        return s
    return "'" + s.replace("'", "'\\''") + "'"

def _unique(items):
    seen = {}
    out = []
    for item in items:
        if item not in seen:
            seen[item] = True
            out.append(item)
    return out

_nvcc_compile = rule(
    implementation = _nvcc_compile_impl,
    attrs = {
        "srcs": attr.label_list(allow_files = [".cu", ".cuh", ".h"]),
        "hdrs": attr.label_list(allow_files = [".h", ".cuh"]),
        "deps": attr.label_list(providers = [CcInfo]),
        "copts": attr.string_list(),
        "nvcc": attr.string(mandatory = True),
        "host_compiler": attr.string(mandatory = True),
        "library": attr.string(doc = "the cuda_library this compiles for, as named in errors"),
    },
)

def cuda_library(
        name,
        cuda_srcs,
        cpu_srcs,
        hdrs = [],
        deps = [],
        nvcc_copts = [],
        visibility = None,
        **kwargs):
    """A cc_library whose implementation is CUDA where the toolkit is present.

    Args:
      name: target name, as for cc_library.
      cuda_srcs: .cu files (and private .cuh/.h headers) compiled by nvcc.
      cpu_srcs: .cc files implementing the same `hdrs` without CUDA; empty for a library that
        only CUDA sources use (an adapter whose header names CUDA types), whose CPU variant is
        then the bare header, never included in a CPU-only build.
      hdrs: public headers; must not include CUDA headers, so both variants can serve them
        (unless cpu_srcs is empty).
      deps: cc deps, visible to both the .cu and the .cc sources.
      nvcc_copts: extra nvcc flags (e.g. ["-lineinfo"]).
      visibility: as for cc_library.
      **kwargs: passed to the cc_library (testonly, tags, copts for cpu_srcs, ...).
    """
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

    _nvcc_compile(
        name = name + "_nvcc",
        srcs = cuda_srcs,
        hdrs = hdrs,
        deps = deps,  # nvcc finds the toolkit's own headers itself
        copts = nvcc_copts,
        nvcc = NVCC,
        host_compiler = HOST_COMPILER,
        library = "//%s:%s" % (native.package_name(), name),
        visibility = ["//visibility:private"],
        tags = kwargs.get("tags", []),
        testonly = kwargs.get("testonly", False),
    )
    native.cc_library(
        name = name,
        srcs = [":" + name + "_nvcc"],
        hdrs = hdrs,
        deps = deps + ["@local_cuda//:cudart"],
        visibility = visibility,
        **kwargs
    )

    # Compiled, never linked into anything: keeps the fallback building where nvcc is used.
    native.cc_library(
        name = name + "_cpu_fallback",
        srcs = cpu_srcs,
        hdrs = hdrs,
        deps = deps,
        visibility = ["//visibility:private"],
        **kwargs
    )
