// dflash's HTTP front: OpenAI-compatible routes over one Engine, generations run by a Scheduler
// (`parallel` slots interleaved step by step, a bounded FIFO of waiting requests, 503 beyond it),
// API-key checks, CORS, a body size limit, and one log line per request. Listening starts before the model is loaded: /health answers 503 until
// set_engine() is called.
#pragma once

#include <cstdint>
#include <memory>
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
  int parallel = 1;             // slots: requests generating at once (interleaved a step at a time)
  int64_t max_queue = 64;       // requests waiting for a free slot beyond those running; more get 503
  size_t max_body_bytes = 8u << 20;
  double request_timeout_s = 600;  // a generation's deadline, from its arrival
};

class HttpServer {
 public:
  explicit HttpServer(ServerOptions opt);
  ~HttpServer();
  // Binds the socket (error when the address is taken) and serves on a background thread.
  Status start();
  // The engine requests run on; until it is set, generating routes and /health answer 503. Setting it
  // (or null) cancels the previous engine's requests and frees its sequences before returning.
  void set_engine(const Engine* engine);
  // Cancels running and waiting generations, stops listening and waits for the serving thread (idempotent).
  void stop();
  int port() const { return port_; }

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
  int port_ = 0;
};

}  // namespace dflash::server
