// Metrics scraping: reads another process's /metrics page over HTTP, for the coordinator's
// dashboard (coordinator/dashboard.h). Prometheus itself needs none of this; it scrapes the fleet
// through service discovery (coordinator/service_discovery.h).
//
//   ASSIGN_OR_RETURN(std::vector<MetricSample> samples,
//                    ScrapeMetrics("http://127.0.0.1:40187/metrics", Deadline::AfterMillis(800)));
//   std::optional<double> loss = FindSample(samples, "tessera_train_loss", {});
//
// Two small parts:
//   - HttpGet: an HTTP/1.0 GET client in which every step (connect, send, receive) is bounded
//     by one deadline and the response by a size cap, so a hung or huge member cannot stall
//     the scraping thread; errors name the URL and the step that failed.
//   - ParseExpositionText: the text exposition format 0.0.4 (what every Tessera process
//     serves), reduced to what the dashboard reads: sample name, labels and value. Comments
//     (# HELP, # TYPE) and timestamps are skipped.
//
// Thread-safety: free functions without shared state; call them from any thread.
#ifndef TESSERA_COORDINATOR_METRICS_SCRAPER_H_
#define TESSERA_COORDINATOR_METRICS_SCRAPER_H_

#include <cstddef>
#include <map>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "common/base/deadline.h"
#include "common/base/status.h"

namespace tessera::coordinator {

struct HttpGetResult {
  int status = 0;  // the HTTP status code
  std::string content_type;
  std::string body;
};

// GET `url` ("http://HOST:PORT/PATH"; HOST a name, an IPv4 address or a bracketed IPv6 one).
// InvalidArgument for another URL form; Unavailable when it cannot connect or the connection
// breaks; DeadlineExceeded when `deadline` passes first; ResourceExhausted when the response
// exceeds `max_response_bytes`; DataLoss when the response is not HTTP. Any status code is a
// result, not an error. The host name is resolved with getaddrinfo, which the deadline does not
// bound (numeric addresses, which the fleet registers with, need no lookup).
StatusOr<HttpGetResult> HttpGet(std::string_view url, Deadline deadline,
                                size_t max_response_bytes = size_t{16} << 20);

struct MetricSample {
  std::string name;  // with its suffix: "tessera_train_step_phase_seconds_sum"
  std::map<std::string, std::string> labels;
  double value = 0;
};

// Every sample of `text`, in order. DataLoss naming the line number and quoting the line when
// a sample line is malformed.
StatusOr<std::vector<MetricSample>> ParseExpositionText(std::string_view text);

// HttpGet + ParseExpositionText; a status other than 200 is Unavailable naming it.
StatusOr<std::vector<MetricSample>> ScrapeMetrics(std::string_view url, Deadline deadline);

// The value of the first sample named `name` whose labels include every pair of `labels`
// (others may be present too); nullopt when there is none.
std::optional<double> FindSample(const std::vector<MetricSample>& samples, std::string_view name,
                                 const std::map<std::string, std::string>& labels);

}  // namespace tessera::coordinator

#endif  // TESSERA_COORDINATOR_METRICS_SCRAPER_H_
