// dflash's HTTP front: OpenAI-compatible routes over one Engine, a bounded FIFO of requests served one
// generation at a time (fair: first come, first served), API-key checks, CORS, a body size limit, and
// one log line per request. Listening starts before the model is loaded: /health answers 503 until
// set_engine() is called.
#pragma once

#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <memory>
#include <mutex>
#include <string>

#include "base/status.h"
#include "server/generation.h"

namespace httplib {
class Server;
}

namespace dflash::server {

struct ServerOptions {
  std::string host = "127.0.0.1";
  int port = 8080;
  std::string api_key;          // empty: no key required
  std::string cors_origin;      // empty: no CORS headers; "*" or an origin
  int64_t max_queue = 64;       // requests waiting for the engine beyond the one running; more get 503
  size_t max_body_bytes = 8u << 20;
  double request_timeout_s = 600;  // a generation's deadline, from its arrival
};

class HttpServer {
 public:
  explicit HttpServer(ServerOptions opt);
  ~HttpServer();
  // Binds the socket (error when the address is taken) and serves on a background thread.
  Status start();
  // The engine requests run on; until it is set, generating routes and /health answer 503.
  void set_engine(const Engine* engine);
  // Stops listening and waits for the serving thread (idempotent).
  void stop();
  int port() const { return port_; }

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
  int port_ = 0;
};

}  // namespace dflash::server
