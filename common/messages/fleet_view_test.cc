#include "common/messages/fleet_view.h"

#include <gtest/gtest.h>


namespace tessera {
namespace {

TEST(ServerKeyRangeTest, CoversTheKeySpaceContiguously) {
  for (uint64_t key_space : {0ull, 1ull, 7ull, 100ull, 1ull << 32}) {
    for (int servers : {1, 2, 3, 5, 8}) {
      uint64_t next = 0;
      for (int rank = 0; rank < servers; ++rank) {
        auto [begin, end] = ServerKeyRange(key_space, servers, rank);
        EXPECT_EQ(begin, next) << key_space << " " << servers << " " << rank;
        EXPECT_LE(end - begin, key_space / servers + 1);
        next = end;
      }
      EXPECT_EQ(next, key_space);
    }
  }
}

TEST(FleetViewTest, FindsMembersAndKeyOwners) {
  FleetView view;
  view.key_space = 1000;
  view.num_servers = 1;
  view.members.push_back({Role::kServer, 0, "tcp://127.0.0.1:5000", "http://127.0.0.1:6000/metrics",
                          "h", 11, MemberState::kAlive, 0, 1000});
  view.members.push_back({Role::kWorker, 1, "tcp://127.0.0.1:5002", "", "h", 13,
                          MemberState::kFailed, 0, 0});
  ASSERT_NE(view.Find(Role::kServer, 0), nullptr);
  EXPECT_EQ(view.Find(Role::kWorker, 1)->Name(), "worker 1");
  EXPECT_EQ(view.Find(Role::kWorker, 0), nullptr);
  EXPECT_EQ(view.OfRole(Role::kWorker).size(), 1u);
  auto owner = view.ServerOwningKey(999);
  ASSERT_TRUE(owner.ok()) << owner.status();
  EXPECT_EQ((*owner)->rank, 0);
  EXPECT_EQ(view.ServerOwningKey(1000).status().code(), StatusCode::kNotFound);
}

}  // namespace
}  // namespace tessera
