"""torch_python_test: a Python test of the tessera torch.distributed backend (run_python.sh)."""

def torch_python_test(name, src, size = "medium", data = [], args = [], tags = [],
                      sanitizers = True, **kwargs):
    """A test that runs `src` with Debian's /usr/bin/python3 and the built `tessera` package.

    Tagged `no_tsan` (ThreadSanitizer cannot be preloaded into the interpreter: run_python.sh),
    and `no_sanitizers` with sanitizers = False; tools/test.sh --sanitizers leaves such tests
    out of those configurations.

    Args:
      name: the test's name.
      src: the Python file (in this package) to run; it reports through torch_testing.main().
      size: Bazel's size (bounds the test's time).
      data: more files the test reads.
      args: arguments after the script.
      tags: Bazel tags.
      sanitizers: whether the test runs under AddressSanitizer too.
      **kwargs: passed to sh_test.
    """
    native.sh_test(
        name = name,
        size = size,
        srcs = ["//tests/torch:run_python.sh"],
        args = [native.package_name() + "/" + src] + args,
        data = [
            src,
            "//tests/torch:torch_testing.py",
            "//worker/torch/tessera/torch:package",
        ] + data,
        tags = tags + ["no_tsan"] + ([] if sanitizers else ["no_sanitizers"]),
        **kwargs
    )
