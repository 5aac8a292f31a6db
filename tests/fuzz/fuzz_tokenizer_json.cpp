// libFuzzer target: arbitrary bytes as tokenizer.json; when they load, encode and decode a few texts.
#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>

#include "tokenizer/stream_detokenizer.h"
#include "tokenizer/tokenizer.h"
#include "tokenizer/tokenizer_json.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  std::string_view bytes(reinterpret_cast<const char*>(data), size);
  // An optional tokenizer_config.json follows a NUL byte (NUL cannot appear in valid JSON text).
  std::string_view config;
  if (size_t nul = bytes.find('\0'); nul != std::string_view::npos) {
    config = bytes.substr(nul + 1);
    bytes = bytes.substr(0, nul);
  }
  auto vocab = dflash::vocab_from_tokenizer_json(bytes, config);
  if (!vocab.ok()) return 0;
  auto tok = dflash::Tokenizer::create(std::move(vocab).value());
  if (!tok.ok()) return 0;
  static constexpr std::string_view kTexts[] = {
      "", "Hello, world! It's 2024.", "  \n\n\t x<|im_start|>user\n<think>ok</think>",
      "caf\xC3\xA9 cafe\xCC\x81 \xE4\xB8\xAD\xE6\x96\x87 \xF0\x9F\x98\x80", "\xFF not utf-8"};
  size_t sink = 0;
  for (std::string_view text : kTexts) {
    for (bool special : {true, false}) {
      auto ids = tok->encode(text, special);
      if (!ids.ok()) continue;
      sink += tok->decode(*ids, false).size() + tok->decode_text(*ids, true).size();
      dflash::StreamDetokenizer stream(*tok);
      for (int32_t id : *ids) sink += stream.push(id).size();
      sink += stream.finish().size();
    }
  }
  for (int32_t id : {-1, 0, 1, tok->size() - 1, tok->size(), 1 << 30}) sink += tok->decode({&id, 1}, false).size();
  volatile size_t keep = sink;  // the results must be computed
  (void)keep;
  return 0;
}
