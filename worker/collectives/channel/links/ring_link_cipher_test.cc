#include "worker/collectives/channel/links/ring_link_cipher.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <chrono>
#include <cstdio>
#include <string>
#include <vector>

namespace tessera::worker {
namespace {

using ::testing::HasSubstr;

using Bytes = std::vector<uint8_t>;

KeyBytes Filled(uint8_t fill) {
  KeyBytes key;
  key.fill(fill);
  return key;
}

std::string Nonce(char fill) { return std::string(32, fill); }

KeyBytes KeyFor(LinkCipher cipher, char nonce_fill = 'c') {
  return RecordKey(Filled(9), cipher, 1, 2, Nonce(nonce_fill), Nonce('a'));
}

Bytes Pattern(size_t bytes, uint8_t seed) {
  Bytes out(bytes);
  for (size_t i = 0; i < bytes; ++i) out[i] = static_cast<uint8_t>(i * 131 + seed);
  return out;
}

Bytes Seal(RecordSealer& sealer, const Bytes& plain) {
  Bytes record(plain.size() + kRecordOverheadBytes);
  EXPECT_TRUE(sealer.Seal(plain.data(), plain.size(), record.data()).ok());
  return record;
}

// Opens a whole record (prefix, ciphertext, tag) in place: the plaintext, or the failure.
StatusOr<Bytes> Open(RecordOpener& opener, Bytes record) {
  const size_t bytes = record.size() - kRecordOverheadBytes;
  RETURN_IF_ERROR(opener.Open(record.data(), record.data() + kRecordLengthBytes, bytes,
                              record.data() + kRecordLengthBytes + bytes));
  return Bytes(record.begin() + kRecordLengthBytes, record.begin() + kRecordLengthBytes + bytes);
}

std::vector<LinkCipher> Ciphers() {
  std::vector<LinkCipher> ciphers = {LinkCipher::kChaCha20Poly1305};
  if (LinkCipherAvailable(LinkCipher::kAes256Gcm)) ciphers.push_back(LinkCipher::kAes256Gcm);
  return ciphers;
}

TEST(RingLinkCipherTest, PrefersAesGcmWhereTheCpuHasIt) {
  EXPECT_TRUE(LinkCipherAvailable(LinkCipher::kChaCha20Poly1305));
  EXPECT_FALSE(LinkCipherAvailable(LinkCipher::kNone));
  EXPECT_EQ(PreferredLinkCipher(), LinkCipherAvailable(LinkCipher::kAes256Gcm)
                                       ? LinkCipher::kAes256Gcm
                                       : LinkCipher::kChaCha20Poly1305);
  std::printf("preferred ring-link cipher here: %s\n",
              std::string(LinkCipherName(PreferredLinkCipher())).c_str());
}

TEST(RingLinkCipherTest, RecordKeysDifferByEveryInput) {
  const KeyBytes base = KeyFor(LinkCipher::kAes256Gcm);
  EXPECT_EQ(base, KeyFor(LinkCipher::kAes256Gcm));
  EXPECT_NE(base, KeyFor(LinkCipher::kChaCha20Poly1305));
  EXPECT_NE(base, KeyFor(LinkCipher::kAes256Gcm, 'd'));
  EXPECT_NE(base, RecordKey(Filled(8), LinkCipher::kAes256Gcm, 1, 2, Nonce('c'), Nonce('a')));
  EXPECT_NE(base, RecordKey(Filled(9), LinkCipher::kAes256Gcm, 2, 1, Nonce('c'), Nonce('a')));
  EXPECT_NE(base, RecordKey(Filled(9), LinkCipher::kAes256Gcm, 1, 2, Nonce('a'), Nonce('c')));
  EXPECT_NE(RingLinkAeadKey(JobKey::FromBytes(Filled(1))),
            JobKey::FromBytes(Filled(1)).Derive("ring-link"));
}

TEST(RingLinkCipherTest, RecordsOpenInPlaceInOrder) {
  for (LinkCipher cipher : Ciphers()) {
    SCOPED_TRACE(std::string(LinkCipherName(cipher)));
    RecordSealer sealer(cipher, KeyFor(cipher));
    RecordOpener opener(cipher, KeyFor(cipher));
    for (size_t bytes : {size_t{1}, size_t{64}, size_t{4099}, kMaxRecordBytes}) {
      const Bytes plain = Pattern(bytes, static_cast<uint8_t>(bytes));
      const Bytes record = Seal(sealer, plain);
      ASSERT_EQ(record.size(), bytes + kRecordOverheadBytes);
      EXPECT_EQ(record[0] | (record[1] << 8) | (record[2] << 16), static_cast<int>(bytes));
      // The ciphertext is not the plaintext.
      EXPECT_NE(Bytes(record.begin() + 4, record.begin() + 4 + bytes), plain);
      auto opened = Open(opener, record);
      ASSERT_TRUE(opened.ok()) << opened.status();
      EXPECT_EQ(*opened, plain);
    }
    EXPECT_EQ(sealer.sealed(), 4u);
    EXPECT_EQ(opener.opened(), 4u);
  }
}

// The same plaintext twice seals differently (the sequence number is the nonce).
TEST(RingLinkCipherTest, TheSamePlaintextSealsDifferentlyEachTime) {
  RecordSealer sealer(PreferredLinkCipher(), KeyFor(PreferredLinkCipher()));
  const Bytes plain(100, 0xab);
  EXPECT_NE(Seal(sealer, plain), Seal(sealer, plain));
}

TEST(RingLinkCipherTest, EveryFlippedBitFailsAuthentication) {
  for (LinkCipher cipher : Ciphers()) {
    SCOPED_TRACE(std::string(LinkCipherName(cipher)));
    RecordSealer sealer(cipher, KeyFor(cipher));
    const Bytes record = Seal(sealer, Pattern(40, 1));
    for (size_t at = 0; at < record.size(); ++at) {
      Bytes tampered = record;
      tampered[at] ^= 0x10;
      RecordOpener opener(cipher, KeyFor(cipher));
      if (at < kRecordLengthBytes) {
        // A changed length no longer matches the bytes that follow: refused unopened, and
        // were it accepted, the tag covers it too.
        const Status opened = opener.Open(tampered.data(), tampered.data() + 4, 40,
                                          tampered.data() + 44);
        EXPECT_EQ(opened.code(), StatusCode::kDataLoss) << at;
        continue;
      }
      auto opened = Open(opener, tampered);
      ASSERT_FALSE(opened.ok()) << "byte " << at;
      EXPECT_EQ(opened.status().code(), StatusCode::kDataLoss);
      EXPECT_THAT(opened.status().message(),
                  HasSubstr("a record failed authentication (tampered or not from the job)"));
    }
  }
}

TEST(RingLinkCipherTest, ADroppedReplayedOrReorderedRecordFailsAuthentication) {
  const LinkCipher cipher = PreferredLinkCipher();
  RecordSealer sealer(cipher, KeyFor(cipher));
  const Bytes first = Seal(sealer, Pattern(10, 1));
  const Bytes second = Seal(sealer, Pattern(10, 2));
  {  // dropped: the second arrives first
    RecordOpener opener(cipher, KeyFor(cipher));
    EXPECT_FALSE(Open(opener, second).ok());
    EXPECT_FALSE(Open(opener, first).ok()) << "a failed opener stays failed";
  }
  {  // replayed
    RecordOpener opener(cipher, KeyFor(cipher));
    EXPECT_TRUE(Open(opener, first).ok());
    EXPECT_FALSE(Open(opener, first).ok());
  }
  {  // from another connection (other nonces) or another key
    RecordOpener other_connection(cipher, KeyFor(cipher, 'x'));
    EXPECT_FALSE(Open(other_connection, first).ok());
    RecordOpener other_cipher(LinkCipher::kChaCha20Poly1305,
                              KeyFor(LinkCipher::kChaCha20Poly1305));
    if (cipher != LinkCipher::kChaCha20Poly1305) {
      EXPECT_FALSE(Open(other_cipher, first).ok());
    }
  }
}

TEST(RingLinkCipherTest, LengthsOutsideTheCapAreRefusedBeforeReading) {
  uint8_t prefix[4] = {0, 0, 0, 0};
  EXPECT_FALSE(DecodeRecordLength(prefix).ok());
  prefix[0] = 1;
  ASSERT_TRUE(DecodeRecordLength(prefix).ok());
  EXPECT_EQ(*DecodeRecordLength(prefix), 1u);
  const uint32_t over = kMaxRecordBytes + 1;
  for (int i = 0; i < 4; ++i) prefix[i] = static_cast<uint8_t>(over >> (8 * i));
  EXPECT_THAT(DecodeRecordLength(prefix).status().message(), HasSubstr("1048577 bytes"));
  for (uint8_t& byte : prefix) byte = 0xff;
  EXPECT_FALSE(DecodeRecordLength(prefix).ok());
}

// Not an assertion: one core's seal and open rate, printed for the record.
TEST(RingLinkCipherTest, PrintsSealAndOpenThroughput) {
  for (LinkCipher cipher : Ciphers()) {
    RecordSealer sealer(cipher, KeyFor(cipher));
    RecordOpener opener(cipher, KeyFor(cipher));
    const Bytes plain = Pattern(kSendRecordBytes, 3);
    Bytes record(kSendRecordBytes + kRecordOverheadBytes);
    constexpr int kRecords = 128;  // 32 MiB
    double seal_s = 0, open_s = 0;
    for (int i = 0; i < kRecords; ++i) {
      const auto t0 = std::chrono::steady_clock::now();
      ASSERT_TRUE(sealer.Seal(plain.data(), plain.size(), record.data()).ok());
      const auto t1 = std::chrono::steady_clock::now();
      ASSERT_TRUE(opener.Open(record.data(), record.data() + 4, plain.size(),
                              record.data() + 4 + plain.size())
                      .ok());
      const auto t2 = std::chrono::steady_clock::now();
      seal_s += std::chrono::duration<double>(t1 - t0).count();
      open_s += std::chrono::duration<double>(t2 - t1).count();
    }
    const double bytes = double{kSendRecordBytes} * kRecords;
    std::printf("%s, %zu KiB records, one core: seal %.2f GB/s, open %.2f GB/s\n",
                std::string(LinkCipherName(cipher)).c_str(), kSendRecordBytes >> 10,
                bytes / seal_s / 1e9, bytes / open_s / 1e9);
  }
}

}  // namespace
}  // namespace tessera::worker
