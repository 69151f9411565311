#include "worker/collectives/channel/zmq/communicator_tags.h"

#include <set>

#include <gtest/gtest.h>

namespace tessera::worker {
namespace {

TEST(CommunicatorTagsTest, TheWorldsTagsTravelAsTheyAre) {
  for (uint64_t tag : {uint64_t{0}, uint64_t{7}, (uint64_t{1} << 41) + 65536 * 3 + 2,
                       (uint64_t{1} << 60) + 9, ~uint64_t{0}, ~uint64_t{0} - 2,
                       SpaceTag(TagSpace::kPointToPoint, 0, 5)}) {
    EXPECT_EQ(*WireTag(kWorldCommunicator, tag), tag);
  }
}

TEST(CommunicatorTagsTest, GroupsTagsAreTheirOwnAndApartFromTheWorlds) {
  // Every tag a communicator uses, over three groups and the world: no two alike.
  std::set<uint64_t> seen;
  for (uint32_t id : {0u, 1u, 2u, kMaxCommunicatorId}) {
    const uint64_t tags[] = {1,
                             0xffffffffull,
                             ~uint64_t{0},
                             ~uint64_t{0} - 1,
                             SpaceTag(TagSpace::kPointToPoint, id, 1),
                             SpaceTag(TagSpace::kAllToAll, id, 1),
                             SpaceTag(TagSpace::kMonitor, id, 1)};
    for (uint64_t tag : tags) {
      StatusOr<uint64_t> wire = WireTag(id, tag);
      ASSERT_TRUE(wire.ok()) << wire.status().message();
      EXPECT_TRUE(seen.insert(*wire).second) << "communicator " << id << " tag " << tag;
    }
  }
}

TEST(CommunicatorTagsTest, AGroupKnowsItsWireTagsFromOthers) {
  for (uint64_t tag : {uint64_t{1}, ~uint64_t{0}, SpaceTag(TagSpace::kAllToAll, 5, 2)}) {
    EXPECT_TRUE(IsGroupsWireTag(5, *WireTag(5, tag))) << tag;
    EXPECT_FALSE(IsGroupsWireTag(6, *WireTag(5, tag))) << tag;
  }
  EXPECT_FALSE(IsGroupsWireTag(5, 5ull << 32));      // a world tag
  EXPECT_FALSE(IsGroupsWireTag(5, *WireTag(0, ~uint64_t{0})));  // the world's setup
}

TEST(CommunicatorTagsTest, AGroupsSetupTagsCarryItsId) {
  EXPECT_EQ(*WireTag(5, ~uint64_t{0} - 1), 0xff000005fffffffeull);
}

TEST(CommunicatorTagsTest, AGroupRefusesATagThatDoesNotFit) {
  StatusOr<uint64_t> wire = WireTag(3, uint64_t{1} << 41);
  ASSERT_FALSE(wire.ok());
  EXPECT_EQ(wire.status().code(), StatusCode::kInvalidArgument);
  EXPECT_NE(wire.status().message().find("communicator 3"), std::string::npos);
  // Another group's space tag is not this one's.
  EXPECT_FALSE(WireTag(3, SpaceTag(TagSpace::kPointToPoint, 4, 1)).ok());
}

}  // namespace
}  // namespace tessera::worker
