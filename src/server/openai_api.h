// The OpenAI wire format: request parsing with validation (every malformed field is a 4xx with an
// OpenAI-style error body naming it), and the response and stream-chunk objects.
#pragma once

#include <cstdint>
#include <string>

#include <nlohmann/json.hpp>

#include "base/status.h"
#include "server/generation.h"
#include "server/output_parser.h"

namespace dflash::server {

// The invalid-argument error of a request field: "'param' what".
Status field_error(const std::string& param, const std::string& what);

// HTTP status for a Status (400 invalid argument, 404 not found, 413/501 as fitting, 500 otherwise).
int http_status_for(const Status& st);
// {"error": {"message", "type", "param", "code"}}; type from the status (invalid_request_error,
// not_found_error, server_error, ...); param, when not given, is the field a client error's message
// opens with ("'response_format' must be ..." -> "response_format").
nlohmann::json error_body(const Status& st, const std::string& param = {});

struct ChatRequest {
  nlohmann::ordered_json messages;       // role/content objects, content flattened to strings
  nlohmann::ordered_json template_kwargs = nlohmann::ordered_json::object();
  GenerationRequest gen;                 // without the prompt (rendered by the server)
  bool stream = false;
  bool include_usage = false;            // stream_options.include_usage
  std::string model;
  nlohmann::ordered_json tools;          // null: none offered
  std::string tool_choice = "auto";      // auto, none, required, function (tool_name)
  std::string tool_name;
};

// Parses a /v1/chat/completions body. max_tokens defaults to what is left of n_ctx (at most 4096);
// stop takes a string or up to 4 strings; n must be 1. response_format is {"type": "text"} (default) or
// {"type": "json_object"} (gen.json_object = true); json_schema and anything else are a 400 naming
// 'response_format'. Fields this server does not implement yet are refused with a clear message.
Result<ChatRequest> parse_chat_request(const std::string& body, int64_t n_ctx);

struct CompletionRequest {
  std::string prompt_text;          // a string prompt, or
  std::vector<int32_t> prompt_ids;  // token ids given directly
  bool has_ids = false;
  GenerationRequest gen;            // without the prompt
  bool stream = false;
  bool include_usage = false;
  std::string model;
};

// Parses a /v1/completions body: prompt is a string, an array of one string, or an array of token ids;
// max_tokens defaults to 16 (OpenAI's); the other fields as for chat.
Result<CompletionRequest> parse_completion_request(const std::string& body, int64_t n_ctx);
nlohmann::json text_completion(const std::string& id, const std::string& model, int64_t created,
                               const GenerationResult& r);
nlohmann::json text_chunk(const std::string& id, const std::string& model, int64_t created, const std::string& text,
                          const std::string& finish_reason = {});

// The non-streaming response: the message is the plain text, or the one given (reasoning_content,
// tool_calls: assistant_message) with its finish reason.
nlohmann::json chat_completion(const std::string& id, const std::string& model, int64_t created,
                               const GenerationResult& r);
nlohmann::json chat_completion(const std::string& id, const std::string& model, int64_t created,
                               const GenerationResult& r, const nlohmann::json& message,
                               const std::string& finish_reason);
// {"content": [{token, logprob, bytes, top_logprobs: [...]}]} for a result that kept logprobs, else null.
nlohmann::json logprobs_of(const GenerationResult& r, const Tokenizer& tok);
// {"role": "assistant", "content" (null when only tool calls), "reasoning_content"?, "tool_calls"?}.
nlohmann::json assistant_message(const OutputDelta& d);
// The stream deltas of a piece of split output (tool call indexes from first_index).
std::vector<nlohmann::json> delta_objects(const OutputDelta& d, int first_index);
// One "data:" payload of a stream: a delta (role and/or content) or the final chunk (finish_reason set).
nlohmann::json chat_chunk(const std::string& id, const std::string& model, int64_t created,
                          const nlohmann::json& delta, const std::string& finish_reason = {});
// The usage object (with prompt_tokens_details.cached_tokens) and the timings of a result.
nlohmann::json usage_of(const GenerationResult& r);
nlohmann::json timings_of(const GenerationResult& r);

}  // namespace dflash::server
