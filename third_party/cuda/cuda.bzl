"""cuda_library: compiles .cu files with the installed nvcc (no rules_cuda).

Targets are built only under --config=cuda; otherwise they are incompatible
and `bazel build //...` skips them, so machines without nvcc still build.
nvcc is $CUDA_HOME/bin/nvcc (default /usr/local/cuda).
"""

CUDA_ONLY = select({
    "//third_party/cuda:enabled": [],
    "//conditions:default": ["//third_party/cuda:cuda_disabled"],
})

def cuda_library(name, srcs, hdrs = [], deps = [], copts = [], arch = "sm_90", visibility = None):
    """A cc_library whose .cu sources are compiled by nvcc.

    Args:
      name: target name.
      srcs: .cu files (each compiled to one relocatable object).
      hdrs: headers exposed to C++ dependents (host-only declarations).
      deps: cc_library targets whose headers the .cu files include.
      copts: extra nvcc flags.
      arch: the GPU architecture compiled for (Hopper by default).
      visibility: Bazel visibility.
    """
    objs = []
    for src in srcs:
        obj = "_objs/%s/%s.o" % (name, src.replace(".cu", ""))
        native.genrule(
            name = "%s_%s_nvcc" % (name, src.replace("/", "_").replace(".", "_")),
            srcs = [src] + hdrs,
            outs = [obj],
            cmd = ("\"$${CUDA_HOME:-/usr/local/cuda}/bin/nvcc\" -std=c++17 -O3 " +
                   "-arch=%s -Xcompiler -fPIC -I. -I$(GENDIR) %s -c $(location %s) -o $@") %
                  (arch, " ".join(copts), src),
            target_compatible_with = CUDA_ONLY,
            tags = ["no-remote"],
        )
        objs.append(obj)
    native.cc_library(
        name = name,
        srcs = objs,
        hdrs = hdrs,
        deps = deps + ["//third_party/cuda:cudart"],
        target_compatible_with = CUDA_ONLY,
        visibility = visibility,
    )
