"""Wraps a library installed by a Debian package as a Bazel cc_library.

Headers come from /usr/include (already on the compiler's search path), so a
wrapper only carries link flags. By default it links the shared objects; with
--config=static it links the .a archives Debian ships, grouped so that the
order inside one package does not matter.
"""

def system_library(name, libs, deps = [], static_extra = [], linkopts = [], whole_archive = False, visibility = None):
    """Declares a cc_library that links system libraries.

    Args:
      name: target name.
      libs: library names without the lib prefix, e.g. ["grpc++", "grpc"].
      deps: other system_library targets these libraries need.
      static_extra: extra flags only for static links (e.g. dynamic-only deps).
      linkopts: flags for both modes (e.g. -pthread).
      whole_archive: static links take every object of the archives, not
        only the referenced ones: for libraries that initialise themselves
        or register parts from constructors nothing references.
      visibility: Bazel visibility.
    """
    shared = ["-l" + lib for lib in libs]
    static = ["-Wl,--start-group"] + ["-l:lib%s.a" % lib for lib in libs] + ["-Wl,--end-group"]
    if whole_archive:
        static = ["-Wl,--whole-archive"] + static[1:-1] + ["-Wl,--no-whole-archive"]
    native.cc_library(
        name = name,
        linkopts = select({
            "//third_party:static_link": static + static_extra,
            "//conditions:default": shared,
        }) + linkopts,
        deps = deps,
        visibility = visibility,
    )
