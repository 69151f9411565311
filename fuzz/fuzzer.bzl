"""tessera_fuzzer: a libFuzzer target and the regression test of its corpus."""

load("//tools:test_tags.bzl", "SINGLE_THREADED")

def tessera_fuzzer(name, srcs, deps):
    """Declares `name` and `name`_test.

    `name` is the fuzzer: under --config=fuzz (clang, ASan and UBSan; tools/fuzz.sh) it links
    libFuzzer's main, otherwise the standalone driver. `name`_test runs in the default
    configuration and under ASan (a decoder is single-threaded: not under TSan): it feeds the
    fuzz function every file of the seed corpus, the folder `<decoder>_fuzz_corpus` beside the
    source (the seeds, and every input a fuzzing run found to crash, once fixed).

    Args:
      name: the fuzzer's name, `<decoder>_fuzzer`.
      srcs: the source defining LLVMFuzzerTestOneInput.
      deps: what it calls.
    """
    if not name.endswith("_fuzzer"):
        fail("a fuzz target's name ends with _fuzzer: " + name)
    corpus = name[:-len("_fuzzer")] + "_fuzz_corpus"
    native.cc_binary(
        name = name,
        testonly = True,
        srcs = srcs,
        deps = deps + select({
            "//fuzz:libfuzzer": [],
            "//conditions:default": ["//fuzz:standalone_driver"],
        }),
        linkopts = select({
            "//fuzz:libfuzzer": ["-fsanitize=fuzzer"],
            "//conditions:default": [],
        }),
    )
    native.cc_test(
        name = name + "_test",
        size = "small",
        tags = SINGLE_THREADED,
        srcs = srcs,
        deps = deps + ["//fuzz:standalone_driver"],
        data = native.glob([corpus + "/**"]),
        args = [native.package_name() + "/" + corpus],
    )
