// Environment: a process's environment variables as a map, so that what reads them can be
// tested with any environment.
#ifndef TESSERA_COMMON_CONFIG_ENVIRONMENT_H_
#define TESSERA_COMMON_CONFIG_ENVIRONMENT_H_

#include <map>
#include <string>

namespace tessera {

using Environment = std::map<std::string, std::string>;

}  // namespace tessera

#endif  // TESSERA_COMMON_CONFIG_ENVIRONMENT_H_
