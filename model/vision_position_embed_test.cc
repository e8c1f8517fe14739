#include "model/vision_position_embed.h"

#include <catch2/catch.hpp>
#include <vector>

namespace mmserve::model {
namespace {

// A side x side table of dim 2 whose entry (r, c) is {r, c}.
std::vector<float> CoordinateTable(int side) {
  std::vector<float> t;
  for (int r = 0; r < side; ++r) {
    for (int c = 0; c < side; ++c) t.insert(t.end(), {float(r), float(c)});
  }
  return t;
}

TEST_CASE("a grid the size of the table takes each embedding as is, in merge-block order",
          "[vision]") {
  const std::vector<float> table = CoordinateTable(4);
  std::vector<float> x(16 * 2, 0.0f);
  AddPositionEmbeddings(table, 2, {MediaGrid::FromThw(1, 4, 4)}, 2, x.data());
  // Merge blocks of 2x2 patches: (0,0) (0,1) (1,0) (1,1), then the block to the right.
  CHECK(std::vector<float>(x.begin(), x.begin() + 16) ==
        std::vector<float>{0, 0, 0, 1, 1, 0, 1, 1, 0, 2, 0, 3, 1, 2, 1, 3});
}

TEST_CASE("other grid sizes interpolate bilinearly between the table's rows and columns",
          "[vision]") {
  const std::vector<float> table = CoordinateTable(3);
  // 4 rows sample the 3-row table at 0, 2/3, 4/3, 2; 2 columns at 0 and 2.
  // The coordinate table is linear, so each patch gets its sample point.
  std::vector<float> x(8 * 2, 1.0f);  // added to, not overwritten
  AddPositionEmbeddings(table, 2, {MediaGrid::FromThw(1, 4, 2)}, 2, x.data());
  const float rows[4] = {0.0f, 2.0f / 3, 4.0f / 3, 2.0f};
  for (int bh = 0; bh < 2; ++bh) {
    for (int mh = 0; mh < 2; ++mh) {
      for (int mw = 0; mw < 2; ++mw) {
        const int at = ((bh * 2 + mh) * 2 + mw) * 2;
        CHECK(x[at] == Approx(1.0f + rows[bh * 2 + mh]).margin(1e-6));
        CHECK(x[at + 1] == Approx(1.0f + 2.0f * mw).margin(1e-6));
      }
    }
  }
}

TEST_CASE("a video repeats its frame's position embeddings per temporal patch", "[vision]") {
  const std::vector<float> table = CoordinateTable(2);
  std::vector<float> x(2 * 4 * 2, 0.0f);
  AddPositionEmbeddings(table, 2, {MediaGrid::FromThw(2, 2, 2, 2, MediaKind::kVideo)}, 2, x.data());
  CHECK(std::vector<float>(x.begin(), x.begin() + 8) == std::vector<float>(x.begin() + 8, x.end()));
  CHECK(std::vector<float>(x.begin(), x.begin() + 8) == std::vector<float>{0, 0, 0, 1, 1, 0, 1, 1});
}

}  // namespace
}  // namespace mmserve::model
