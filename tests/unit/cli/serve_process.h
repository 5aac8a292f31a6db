// A `dflash serve` child process for tests that drive the built binary (DFLASH_BIN) over HTTP: started on a free
// port and waited for until /health answers, with small helpers for the endpoints the tests read.
#pragma once

#include <gtest/gtest.h>
#include <httplib.h>

#include <chrono>
#include <cstdint>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include <nlohmann/json.hpp>

#include "base/file_io.h"
#include "support/process.h"

namespace dflash::test {

class ServeProcess {
 public:
  using json = nlohmann::json;
  // `dflash serve --port P --threads 1 ARGS...`, its output in `log`; fails when it exits or is not healthy
  // within 30 s.
  ::testing::AssertionResult start(std::vector<std::string> args, const std::string& log) {
    log_ = log;
    std::string why;
    port_ = start_listening(
        [&](int port) {
          std::vector<std::string> argv = {DFLASH_BIN, "serve", "--port", std::to_string(port), "--threads", "1"};
          argv.insert(argv.end(), args.begin(), args.end());
          return argv;
        },
        log_, &proc_, &why);
    if (port_ <= 0) return ::testing::AssertionFailure() << why;
    client_ = std::make_unique<httplib::Client>("127.0.0.1", port_);
    client_->set_read_timeout(60, 0);
    for (int i = 0; i < 300; ++i) {  // up to 30 s
      auto r = client_->Get("/health");
      if (r && r->status == 200) return ::testing::AssertionSuccess();
      if (!proc_->running()) return ::testing::AssertionFailure() << "the server exited; see " << log_;
      std::this_thread::sleep_for(std::chrono::milliseconds(100));
    }
    return ::testing::AssertionFailure() << "the server did not become healthy; see " << log_;
  }
  json props() { return get_json("/props"); }
  std::string metrics() {
    auto r = client_->Get("/metrics");
    return r && r->status == 200 ? r->body : std::string();
  }
  // A GET's parsed body (null unless the status is 200).
  json get_json(const std::string& path) {
    auto r = client_->Get(path);
    return r && r->status == 200 ? json::parse(r->body, nullptr, false) : json();
  }
  // POSTs a chat completion; the parsed reply (null unless the status is 200).
  json chat(const json& body) {
    auto r = client_->Post("/v1/chat/completions", body.dump(), "application/json");
    return r && r->status == 200 ? json::parse(r->body, nullptr, false) : json();
  }
  // POSTs a streamed chat completion; the raw event stream (empty unless the status is 200).
  std::string chat_stream(const json& body) {
    auto r = client_->Post("/v1/chat/completions", body.dump(), "application/json");
    return r && r->status == 200 ? r->body : std::string();
  }
  // Waits until the disk writer has written every snapshot the requests so far left (at least `entries`).
  ::testing::AssertionResult wait_written(int64_t entries) {
    for (int i = 0; i < 200; ++i) {
      const json c = props()["cache"];
      if (c.is_object() && c["disk_pending"] == 0 && c["disk_entries"].get<int64_t>() >= entries)
        return ::testing::AssertionSuccess();
      std::this_thread::sleep_for(std::chrono::milliseconds(50));
    }
    return ::testing::AssertionFailure() << "the disk cache did not finish writing; see " << log_;
  }
  const std::string& log() const { return log_; }
  std::string log_text() const {
    auto t = read_text_file(log_);
    return t.ok() ? *t : std::string();
  }
  // Ends the process (also what the destructor does).
  void stop() {
    client_.reset();
    proc_.reset();
  }

 private:
  int port_ = 0;
  std::string log_;
  std::unique_ptr<ChildProcess> proc_;
  std::unique_ptr<httplib::Client> client_;
};

}  // namespace dflash::test
