// A small byte-level BPE tokenizer.json built in code, for tests that need exact, readable ids.
#pragma once

#include <string>
#include <utility>
#include <vector>

#include <nlohmann/json.hpp>

#include "tokenizer/byte_level.h"
#include "tokenizer/vocab.h"

namespace dflash::test {

// Ids 0..255: the byte alphabet in byte order (so the id of a single-byte token is the byte).
// Then one id per merge result, in merge order, from 256. Added tokens follow.
struct TinyVocabSpec {
  std::vector<std::pair<std::string, std::string>> merges;  // alphabet spelling, e.g. {"Ġ", "w"}
  nlohmann::json added_tokens = nlohmann::json::array();    // HF added_tokens entries without "id"
  std::string regex = std::string(find_pre_tokenizer("qwen2")->regex);
  bool nfc = true;
};

inline nlohmann::json tiny_tokenizer_json(const TinyVocabSpec& spec) {
  const ByteLevelAlphabet& a = ByteLevelAlphabet::get();
  nlohmann::json vocab = nlohmann::json::object();
  int id = 0;
  for (int b = 0; b < 256; ++b) vocab[a.utf8(static_cast<uint8_t>(b))] = id++;
  nlohmann::json merges = nlohmann::json::array();
  for (const auto& [l, r] : spec.merges) {
    if (!vocab.contains(l + r)) vocab[l + r] = id++;
    merges.push_back(l + " " + r);
  }
  nlohmann::json added = nlohmann::json::array();
  for (nlohmann::json t : spec.added_tokens) {
    t["id"] = id++;
    added.push_back(t);
  }
  nlohmann::json j;
  j["version"] = "1.0";
  j["added_tokens"] = added;
  j["normalizer"] = spec.nfc ? nlohmann::json{{"type", "NFC"}} : nlohmann::json(nullptr);
  j["pre_tokenizer"] = {
      {"type", "Sequence"},
      {"pretokenizers",
       {{{"type", "Split"}, {"pattern", {{"Regex", spec.regex}}}, {"behavior", "Isolated"}, {"invert", false}},
        {{"type", "ByteLevel"}, {"add_prefix_space", false}, {"trim_offsets", false}, {"use_regex", false}}}}};
  j["decoder"] = {{"type", "ByteLevel"}};
  j["model"] = {{"type", "BPE"}, {"dropout", nullptr}, {"unk_token", nullptr}, {"byte_fallback", false},
                {"vocab", vocab}, {"merges", merges}};
  return j;
}

inline nlohmann::json added_token(const std::string& content, bool special, bool lstrip = false,
                                  bool rstrip = false, bool normalized = false, bool single_word = false) {
  return {{"content", content}, {"special", special}, {"lstrip", lstrip}, {"rstrip", rstrip},
          {"normalized", normalized}, {"single_word", single_word}};
}

}  // namespace dflash::test
