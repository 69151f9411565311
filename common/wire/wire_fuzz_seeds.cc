// Writes the seed corpus of wire_decode_fuzzer: one message of every type as EncodeMessage
// puts it on the wire, a few with tensors (dense, sparse) so that payload frames are seeded.
//
//   bazel run //common/wire:wire_fuzz_seeds -- $PWD/common/wire/wire_decode_fuzz_corpus
#include <cstdio>
#include <fstream>
#include <string>
#include <utility>
#include <variant>

#include "common/wire/wire_codec.h"
#include "common/wire/wire_fuzz_input.h"

namespace tessera {
namespace {

// Writes `body` as the seed `name`; false (saying why) if the seed would not decode.
bool WriteSeed(const std::string& path, const MessageHeader& header, MessageBody body) {
  const std::string input = wire::FuzzInputOf(EncodeMessage(header, std::move(body)));
  const DecodeResult decoded = DecodeMessage(
      wire::MessageFromFuzzInput(reinterpret_cast<const uint8_t*>(input.data()), input.size()),
      1 << 20);
  if (!decoded.status.ok()) {
    std::fprintf(stderr, "%s does not decode: %s\n", path.c_str(),
                 decoded.status.ToString().c_str());
    return false;
  }
  std::ofstream(path, std::ios::binary) << input;
  return true;
}

template <size_t I = 0>
bool EveryType(const MessageHeader& header, int* written, const std::string& dir) {
  if constexpr (I < std::variant_size_v<MessageBodyVariant>) {
    const std::string path = dir + "/type-" + std::to_string(I);
    const MessageBody body{std::variant_alternative_t<I, MessageBodyVariant>{}};
    if (!WriteSeed(path, header, body)) return false;
    ++*written;
    return EveryType<I + 1>(header, written, dir);
  }
  return true;
}

}  // namespace
}  // namespace tessera

int main(int argc, char** argv) {
  using namespace tessera;
  if (argc != 2) {
    std::fprintf(stderr, "usage: %s DIR\n", argv[0]);
    return 2;
  }
  const std::string dir = argv[1];
  MessageHeader header;
  header.sender_role = Role::kWorker;
  header.sender_rank = 1;
  header.request_id = 9;
  header.step = 3;
  int written = 0;
  bool ok = EveryType(header, &written, dir);
  auto write = [&](const std::string& name, MessageBody body) {
    if (WriteSeed(dir + "/" + name, header, std::move(body))) {
      ++written;
    } else {
      ok = false;
    }
  };
  PsPushPullRequest push;
  push.tensors.push_back(TensorData::Floats("layer0.w", 0, {1.0f, 2.0f, 3.0f, 4.0f}));
  push.tensors.back().shape = {2, 2};
  push.tensors.push_back(TensorData::Floats("layer0.b", 4, {0.5f, -0.5f}));
  push.has_gradients = true;
  push.model = "{\"model\":\"mlp\"}";
  write("push-two-tensors", std::move(push));
  SparsePushRequest sparse;
  sparse.table = "users";
  sparse.row_ids = TensorData::Int64s("ids", {3, 17});
  sparse.values = TensorData::Floats("rows", 0, {1, 2, 3, 4});
  sparse.values.shape = {2, 2};
  write("sparse-push", std::move(sparse));
  RingFrame chunk;
  chunk.kind = RingFrameKind::kData;
  chunk.tag = 5;
  chunk.op = CollectiveOp::kAllReduce;
  chunk.dtype = DataType::kFloat32;
  chunk.element_count = 2;
  chunk.buffer_elements = 8;
  chunk.data = Payload::FromString(std::string(8, '\x01'));
  write("collective-chunk", std::move(chunk));
  std::printf("wrote %d seeds to %s\n", written, dir.c_str());
  return ok ? 0 : 1;
}
