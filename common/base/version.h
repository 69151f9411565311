// Tessera's version, as every process reports it (tessera_build_info{version}).
#ifndef TESSERA_COMMON_BASE_VERSION_H_
#define TESSERA_COMMON_BASE_VERSION_H_

namespace tessera {

inline constexpr const char* kVersion = "0.1.0";

}  // namespace tessera

#endif  // TESSERA_COMMON_BASE_VERSION_H_
