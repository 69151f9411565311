#include "worker/data/offset_dataset.h"

#include <gtest/gtest.h>

#include "worker/data/in_memory_dataset.h"

namespace tessera::worker::data {
namespace {

TEST(OffsetDatasetTest, RenumbersTheTailAndRejectsIndicesPastIt) {
  auto base = InMemoryDataset::Create(1, 3, {10, 11, 12, 13, 14}, {0, 1, 2, 0, 1});
  ASSERT_TRUE(base.ok()) << base.status();
  OffsetDataset tail(std::move(base).value(), 3);
  EXPECT_EQ(tail.size(), 2u);
  EXPECT_EQ(tail.num_classes(), 3u);
  float feature = 0;
  int64_t label = -1;
  ASSERT_TRUE(tail.Get(1, &feature, &label).ok());
  EXPECT_EQ(feature, 14);
  EXPECT_EQ(label, 1);
  Status past = tail.Get(2, &feature, &label);
  EXPECT_EQ(past.code(), StatusCode::kOutOfRange);
  EXPECT_NE(past.message().find("held-out sample 2 >= 2"), std::string::npos) << past;
}

}  // namespace
}  // namespace tessera::worker::data
