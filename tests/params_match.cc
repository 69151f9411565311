#include "tests/params_match.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>

#include "worker/params_file.h"

namespace tessera::testing {

void ExpectParamsMatch(const std::string& got_path, const std::string& want_path,
                       double relative) {
  auto got = worker::LoadParams(got_path);
  auto want = worker::LoadParams(want_path);
  ASSERT_TRUE(got.ok()) << got.status();
  ASSERT_TRUE(want.ok()) << want.status();
  ASSERT_EQ(got->values.size(), want->values.size());
  ASSERT_EQ(got->layout.views().size(), want->layout.views().size());
  for (const ParameterView& view : want->layout.views()) {
    const ParameterView* other = got->layout.Find(view.name);
    ASSERT_NE(other, nullptr) << view.name;
    ASSERT_EQ(other->shape, view.shape) << view.name;
    double scale = 0, worst = 0;
    for (uint64_t i = 0; i < view.size; ++i) {
      const double w = want->values[view.offset + i];
      scale = std::max(scale, std::fabs(w));
      worst = std::max(worst, std::fabs(static_cast<double>(got->values[other->offset + i]) - w));
    }
    EXPECT_LE(worst, relative * scale)
        << view.name << ": largest difference " << worst << " at scale " << scale;
  }
}

}  // namespace tessera::testing
