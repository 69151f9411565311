#include "server/ps/forward_chain.h"

#include <gtest/gtest.h>

namespace tessera::server {
namespace {

TEST(ForwardChainTest, SplitsTheFirstCopyFromTheRest) {
  EXPECT_EQ(SplitChain("tcp://a:1,tcp://b:2,tcp://c:3"),
            std::make_pair(std::string("tcp://a:1"), std::string("tcp://b:2,tcp://c:3")));
  EXPECT_EQ(SplitChain("tcp://a:1"), std::make_pair(std::string("tcp://a:1"), std::string()));
  EXPECT_EQ(SplitChain(""), std::make_pair(std::string(), std::string()));
}

TEST(ForwardChainTest, AJoinedServerGoesLastOnce) {
  EXPECT_EQ(ChainWith("", ""), "");
  EXPECT_EQ(ChainWith("tcp://b:2", ""), "tcp://b:2");
  EXPECT_EQ(ChainWith("", "tcp://j:9"), "tcp://j:9");
  EXPECT_EQ(ChainWith("tcp://b:2", "tcp://j:9"), "tcp://b:2,tcp://j:9");
  // Workers that took it in name it already.
  EXPECT_EQ(ChainWith("tcp://b:2,tcp://j:9", "tcp://j:9"), "tcp://b:2,tcp://j:9");
  EXPECT_EQ(ChainWith("tcp://j:9", "tcp://j:9"), "tcp://j:9");
  // A prefix of another address is not it.
  EXPECT_EQ(ChainWith("tcp://j:90", "tcp://j:9"), "tcp://j:90,tcp://j:9");
}

}  // namespace
}  // namespace tessera::server
