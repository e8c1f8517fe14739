"""One macro per fuzz target: the libFuzzer binary and its corpus replay test.

    mmserve_fuzz_target(name = "foo_fuzzer", srcs = ["foo_fuzzer.cc"], deps = [...])

makes
  :foo_fuzzer              libFuzzer binary under --config=fuzz (clang); under
                           the normal gcc build a replay binary that runs the
                           files or folders given as arguments once each;
  :foo_fuzzer_corpus_test  cc_test: every file of corpus/foo_fuzzer/ through
                           LLVMFuzzerTestOneInput, so `bazel test //...` checks
                           the target's properties on its committed corpus.
The corpus lives in corpus/<name>/, an optional dictionary in dicts/<name>.dict
(tools/fuzz/run_all.sh finds both by name).
"""

def mmserve_fuzz_target(name, srcs, deps = [], data = []):
    native.cc_library(
        name = name + "_lib",
        testonly = True,
        srcs = srcs,
        deps = deps + ["//fuzz:fuzz_check"],
        data = data,
        alwayslink = True,
    )
    native.cc_binary(
        name = name,
        testonly = True,
        deps = [":" + name + "_lib"] + select({
            "//fuzz:fuzzing": [],
            "//conditions:default": ["//fuzz:replay_main"],
        }),
        linkopts = select({
            "//fuzz:fuzzing": ["-fsanitize=fuzzer"],
            "//conditions:default": [],
        }),
        tags = ["fuzz_target"],
    )
    native.cc_test(
        name = name + "_corpus_test",
        size = "small",
        args = ["fuzz/corpus/" + name],
        data = native.glob(["corpus/" + name + "/**"]),
        deps = [
            ":" + name + "_lib",
            "//fuzz:replay_main",
        ],
    )
