#include "common/training/parameter_layout.h"

#include <gtest/gtest.h>

namespace tessera {
namespace {

TEST(ParameterLayoutTest, PacksViewsInOrder) {
  ParameterLayout layout;
  ASSERT_TRUE(layout.Add("fc0.weight", {4, 3}).ok());
  ASSERT_TRUE(layout.Add("fc0.bias", {4}).ok());
  ASSERT_TRUE(layout.Add("fc1.weight", {2, 4}).ok());
  EXPECT_EQ(layout.total_size(), 12u + 4u + 8u);
  EXPECT_EQ(layout.Find("fc0.bias")->offset, 12u);
  EXPECT_EQ(layout.Find("fc1.weight")->offset, 16u);
  EXPECT_EQ(layout.Find("fc1.weight")->ToString(), "fc1.weight [2, 4] @ 16");
  EXPECT_EQ(layout.Find("nope"), nullptr);
}

TEST(ParameterLayoutTest, RejectsBadParameters) {
  ParameterLayout layout;
  ASSERT_TRUE(layout.Add("w", {2}).ok());
  EXPECT_NE(layout.Add("w", {3}).status().message().find("added twice"), std::string::npos);
  EXPECT_NE(layout.Add("", {3}).status().message().find("empty name"), std::string::npos);
  EXPECT_NE(layout.Add("z", {3, 0}).status().message().find("[3, 0]"), std::string::npos);
  EXPECT_NE(layout.Add("big", {1ll << 40, 1ll << 40}).status().message().find("overflows"),
            std::string::npos);
  EXPECT_EQ(layout.total_size(), 2u);  // nothing rejected was added
}

TEST(ParameterLayoutTest, FingerprintSeesNamesShapesAndOrder) {
  auto make = [](std::vector<std::pair<std::string, std::vector<int64_t>>> params) {
    ParameterLayout layout;
    for (auto& [name, shape] : params) EXPECT_TRUE(layout.Add(name, shape).ok());
    return layout.Fingerprint();
  };
  uint64_t base = make({{"a", {2, 3}}, {"b", {4}}});
  EXPECT_EQ(base, make({{"a", {2, 3}}, {"b", {4}}}));
  EXPECT_NE(base, make({{"b", {4}}, {"a", {2, 3}}}));
  EXPECT_NE(base, make({{"a", {3, 2}}, {"b", {4}}}));
  EXPECT_NE(base, make({{"a", {2, 3}}, {"c", {4}}}));
  EXPECT_NE(base, make({{"a", {6}}, {"b", {4}}}));
}

}  // namespace
}  // namespace tessera
