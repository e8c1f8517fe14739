// The one Catch2 main() shared by every test binary: compiling catch.hpp's
// runner is slow, so it happens once.
#define CATCH_CONFIG_MAIN
#include <catch2/catch.hpp>
