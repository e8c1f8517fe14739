// stb_image's implementation from libstb-dev's header, for fuzz builds only
// (see //third_party:stb); normal builds link Debian's libstb.
#define STB_IMAGE_IMPLEMENTATION
#include <stb/stb_image.h>
