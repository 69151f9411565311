#include "common/base/and_list.h"

#include <gtest/gtest.h>

namespace tessera {
namespace {

TEST(AndListTest, ListsNumbersAsASentenceDoes) {
  EXPECT_EQ(AndList({}), "");
  EXPECT_EQ(AndList({2}), "2");
  EXPECT_EQ(AndList({0, 2}), "0 and 2");
  EXPECT_EQ(AndList({0, 1, 2}), "0, 1 and 2");
}

}  // namespace
}  // namespace tessera
