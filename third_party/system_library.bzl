"""Wraps a library installed by a Debian package as a Bazel cc_library.

Headers come from /usr/include (already on the compiler's search path), so a
wrapper only carries link flags. By default it links the shared objects; with
--config=static it links the .a archives Debian ships, grouped so that the
order inside one package does not matter.
"""

def system_library(name, libs, deps = [], static_extra = [], linkopts = [], visibility = None):
    """Declares a cc_library that links system libraries.

    Args:
      name: target name.
      libs: library names without the lib prefix, e.g. ["grpc++", "grpc"].
      deps: other system_library targets these libraries need.
      static_extra: extra flags only for static links (e.g. dynamic-only deps).
      linkopts: flags for both modes (e.g. -pthread).
      visibility: Bazel visibility.
    """
    shared = ["-l" + lib for lib in libs]
    static = ["-Wl,--start-group"] + ["-l:lib%s.a" % lib for lib in libs] + ["-Wl,--end-group"]
    native.cc_library(
        name = name,
        linkopts = select({
            "//third_party:static_link": static + static_extra,
            "//conditions:default": shared,
        }) + linkopts,
        deps = deps,
        visibility = visibility,
    )
