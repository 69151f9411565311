#include "common/base/shared_library.h"

#include <gtest/gtest.h>

#include <cmath>

namespace tessera {
namespace {

TEST(SharedLibraryTest, BindsSymbolsAndNamesWhatIsMissing) {
  auto libm = SharedLibrary::Open("libm.so.6", "the C math library");
  ASSERT_TRUE(libm.ok()) << libm.status();
  double (*cosine)(double) = nullptr;
  ASSERT_TRUE(libm->Bind(&cosine, "cos").ok());
  EXPECT_EQ(cosine(0.0), 1.0);
  Status missing = libm->Bind(&cosine, "no_such_function");
  EXPECT_EQ(missing.code(), StatusCode::kUnavailable);
  EXPECT_NE(missing.message().find("libm.so.6 has no symbol no_such_function"), std::string::npos);
  EXPECT_EQ(cosine, nullptr);
  Status absent = SharedLibrary::Open("libtessera-absent.so.9", "a test library").status();
  EXPECT_NE(absent.message().find("cannot load libtessera-absent.so.9 (a test library)"),
            std::string::npos)
      << absent;
}

}  // namespace
}  // namespace tessera
