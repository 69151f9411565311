#include "common/messages/fleet_view.h"

#include <gtest/gtest.h>

#include "common/wire/wire_codec.h"

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

TEST(FleetViewTest, EncodeDecodeRoundTrip) {
  FleetView view;
  view.job = "job-1";
  view.epoch = 3;
  view.num_servers = 1;
  view.num_workers = 2;
  view.key_space = 1000;
  view.members.push_back({Role::kServer, 0, "tcp://127.0.0.1:5000", "http://127.0.0.1:6000/metrics",
                          "h", 11, MemberState::kAlive, 0, 1000});
  view.members.push_back({Role::kWorker, 1, "tcp://127.0.0.1:5002", "", "h", 13,
                          MemberState::kFailed, 0, 0});
  MessageBuilder builder(proto::Role::Coordinator, 0);
  Message m = builder.Finish(EncodeFleetView(&builder.fbb(), view), 1);
  VerifyResult v = VerifyMessage(m, 1 << 20);
  ASSERT_TRUE(v.status.ok()) << v.status;
  StatusOr<FleetView> back = DecodeFleetView(*v.header->body_as_FleetView());
  ASSERT_TRUE(back.ok()) << back.status();
  EXPECT_EQ(back->job, "job-1");
  EXPECT_EQ(back->epoch, 3u);
  ASSERT_EQ(back->members.size(), 2u);
  const MemberInfo* server = back->Find(Role::kServer, 0);
  ASSERT_NE(server, nullptr);
  EXPECT_EQ(server->key_end, 1000u);
  EXPECT_EQ(server->metrics_address, "http://127.0.0.1:6000/metrics");
  EXPECT_EQ(back->Find(Role::kWorker, 1)->state, MemberState::kFailed);
  EXPECT_EQ(back->Find(Role::kWorker, 1)->Name(), "worker 1");
  EXPECT_EQ(back->OfRole(Role::kWorker).size(), 1u);
  auto owner = back->ServerOwningKey(999);
  ASSERT_TRUE(owner.ok()) << owner.status();
  EXPECT_EQ((*owner)->rank, 0);
  EXPECT_EQ(back->ServerOwningKey(1000).status().code(), StatusCode::kNotFound);
}

TEST(FleetViewTest, RejectsUnknownRole) {
  flatbuffers::FlatBufferBuilder fbb;
  std::vector<flatbuffers::Offset<proto::Member>> members = {
      proto::CreateMemberDirect(fbb, proto::Role::Launcher, 0, "tcp://x:1")};
  fbb.Finish(proto::CreateFleetViewDirect(fbb, "j", 1, 0, 0, 0, &members));
  auto* wire = flatbuffers::GetRoot<proto::FleetView>(fbb.GetBufferPointer());
  EXPECT_EQ(DecodeFleetView(*wire).status().code(), StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace tessera
