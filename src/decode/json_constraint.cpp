// JsonConstraint: the JSON-object byte automaton, the vocabulary's token table, masks and accept.
#include "decode/json_constraint.h"

#include <algorithm>
#include <array>
#include <limits>

#include "tokenizer/utf8.h"

namespace dflash {
namespace {

using Mode = JsonObjectPrefix::Mode;

constexpr float kNegInf = -std::numeric_limits<float>::infinity();

// The literals a value can spell, by kLiteral's aux2.
constexpr std::string_view kLiterals[] = {"true", "false", "null"};

// The byte ranges a UTF-8 continuation byte may take (RFC 3629's table): by kUtf8's aux2. Only the
// first continuation byte after E0, ED, F0 and F4 is narrower than 80..BF (no overlong forms, no
// surrogates, nothing above U+10FFFF).
enum Utf8Range : uint8_t { kAny = 0, kA0toBF, k80to9F, k90toBF, k80to8F };
constexpr uint8_t kRangeLo[] = {0x80, 0xA0, 0x80, 0x90, 0x80};
constexpr uint8_t kRangeHi[] = {0xBF, 0xBF, 0x9F, 0xBF, 0x8F};

// What the 4 hex digits of a \u escape may spell, by kHex's aux2.
enum HexRole : uint8_t {
  kPlain = 0,        // anything but a low surrogate
  kMaybeSurrogate,   // first digit was D: the second decides
  kHigh,             // a high surrogate (D800..DBFF): a low one must follow
  kLow,              // the escape after a high surrogate: must be DC00..DFFF
};

bool is_whitespace(uint8_t c) { return c == ' ' || c == '\t' || c == '\n' || c == '\r'; }
bool is_digit(uint8_t c) { return c >= '0' && c <= '9'; }
int hex_value(uint8_t c) {
  if (c >= '0' && c <= '9') return c - '0';
  if (c >= 'a' && c <= 'f') return c - 'a' + 10;
  if (c >= 'A' && c <= 'F') return c - 'A' + 10;
  return -1;
}

// Bytes as they can be shown in an error message: printable ASCII as is, the rest as \xNN.
std::string printable(std::string_view bytes) {
  std::string out;
  for (unsigned char c : bytes) {
    if (c >= 0x20 && c < 0x7F && c != '\\') out += static_cast<char>(c);
    else out += fmt::format("\\x{:02x}", c);
  }
  return out;
}

}  // namespace

// ---- JsonObjectPrefix ----------------------------------------------------------------------------

bool JsonObjectPrefix::push(uint8_t byte) {
  const JsonObjectPrefix saved = *this;
  if (step(byte)) return true;
  *this = saved;
  return false;
}

size_t JsonObjectPrefix::push(std::string_view bytes) {
  for (size_t i = 0; i < bytes.size(); ++i) {
    if (!push(static_cast<uint8_t>(bytes[i]))) return i;
  }
  return bytes.size();
}

bool JsonObjectPrefix::accepts(std::string_view bytes) const {
  JsonObjectPrefix s = *this;
  for (char c : bytes) {
    if (!s.step(static_cast<uint8_t>(c))) return false;
  }
  return true;
}

bool JsonObjectPrefix::open_container(bool object) {
  if (depth_ >= kMaxDepth) return false;
  if (object) containers_ |= uint64_t{1} << depth_;
  else containers_ &= ~(uint64_t{1} << depth_);
  ++depth_;
  mode_ = object ? Mode::kObjectOpen : Mode::kArrayOpen;
  return true;
}

// A value (string, number, literal, container) just ended.
void JsonObjectPrefix::end_value() { mode_ = depth_ == 0 ? Mode::kDone : Mode::kAfterValue; }

bool JsonObjectPrefix::start_value(uint8_t c) {
  switch (c) {
    case '{': return open_container(true);
    case '[': return open_container(false);
    case '"': mode_ = Mode::kString; in_key_ = false; return true;
    case '-': mode_ = Mode::kMinus; return true;
    case '0': mode_ = Mode::kZero; return true;
    case 't': mode_ = Mode::kLiteral; aux_ = 1; aux2_ = 0; return true;
    case 'f': mode_ = Mode::kLiteral; aux_ = 1; aux2_ = 1; return true;
    case 'n': mode_ = Mode::kLiteral; aux_ = 1; aux2_ = 2; return true;
    default:
      if (c >= '1' && c <= '9') { mode_ = Mode::kInt; return true; }
      return false;
  }
}

// The modes between tokens of the JSON grammar, where whitespace may come.
bool JsonObjectPrefix::step_structural(uint8_t c) {
  if (mode_ == Mode::kBeforeTop) return c == '{' && open_container(true);  // the reply starts with '{'
  if (is_whitespace(c)) {
    const bool line_break = c == '\n' || c == '\r';
    if (ws_run_ >= kMaxWhitespaceRun || (line_break && ws_breaks_ >= kMaxLineBreaksPerRun)) return false;
    ++ws_run_;
    ws_breaks_ += line_break;
    return true;
  }
  ws_run_ = 0;
  ws_breaks_ = 0;
  switch (mode_) {
    case Mode::kObjectOpen:
    case Mode::kKey:
      if (c == '"') {
        mode_ = Mode::kString;
        in_key_ = true;
        return true;
      }
      if (c != '}' || mode_ == Mode::kKey) return false;  // no trailing comma
      --depth_;
      end_value();
      return true;
    case Mode::kColon:
      if (c != ':') return false;
      mode_ = Mode::kValue;
      return true;
    case Mode::kArrayOpen:
      if (c == ']') {
        --depth_;
        end_value();
        return true;
      }
      return start_value(c);
    case Mode::kValue:
      return start_value(c);
    case Mode::kAfterValue:
      if (c == ',') {
        mode_ = top_is_object() ? Mode::kKey : Mode::kValue;
        return true;
      }
      if (c != (top_is_object() ? '}' : ']')) return false;
      --depth_;
      end_value();
      return true;
    default:
      return false;
  }
}

bool JsonObjectPrefix::step(uint8_t c) {
  switch (mode_) {
    case Mode::kString:
      if (c == '"') {
        if (in_key_) {
          in_key_ = false;
          mode_ = Mode::kColon;
        } else {
          end_value();
        }
        return true;
      }
      if (c == '\\') { mode_ = Mode::kEscape; return true; }
      if (c < 0x80) return c >= 0x20;  // raw control characters must be escaped
      // The lead byte of a multi-byte character: how many continuation bytes, and the first one's range.
      if (c >= 0xC2 && c <= 0xDF) { aux_ = 1; aux2_ = kAny; }
      else if (c == 0xE0) { aux_ = 2; aux2_ = kA0toBF; }
      else if (c == 0xED) { aux_ = 2; aux2_ = k80to9F; }
      else if (c >= 0xE1 && c <= 0xEF) { aux_ = 2; aux2_ = kAny; }
      else if (c == 0xF0) { aux_ = 3; aux2_ = k90toBF; }
      else if (c == 0xF4) { aux_ = 3; aux2_ = k80to8F; }
      else if (c >= 0xF1 && c <= 0xF3) { aux_ = 3; aux2_ = kAny; }
      else return false;  // a continuation byte, C0/C1 (overlong) or F5..FF
      mode_ = Mode::kUtf8;
      return true;
    case Mode::kUtf8:
      if (c < kRangeLo[aux2_] || c > kRangeHi[aux2_]) return false;
      aux2_ = kAny;
      if (--aux_ == 0) mode_ = Mode::kString;
      return true;
    case Mode::kEscape:
      switch (c) {
        case '"': case '\\': case '/': case 'b': case 'f': case 'n': case 'r': case 't':
          mode_ = Mode::kString;
          return true;
        case 'u':
          mode_ = Mode::kHex;
          aux_ = 0;
          aux2_ = kPlain;
          return true;
        default:
          return false;
      }
    case Mode::kHex: {
      const int v = hex_value(c);
      if (v < 0) return false;
      if (aux_ == 0) {
        if (aux2_ == kLow && v != 0xD) return false;
        if (aux2_ == kPlain && v == 0xD) aux2_ = kMaybeSurrogate;
      } else if (aux_ == 1) {
        if (aux2_ == kLow && v < 0xC) return false;
        if (aux2_ == kMaybeSurrogate) {
          if (v >= 0xC) return false;  // a low surrogate with no high one before it
          aux2_ = v >= 0x8 ? kHigh : kPlain;
        }
      }
      if (++aux_ == 4) mode_ = aux2_ == kHigh ? Mode::kLowBackslash : Mode::kString;
      return true;
    }
    case Mode::kLowBackslash:
      if (c != '\\') return false;
      mode_ = Mode::kLowU;
      return true;
    case Mode::kLowU:
      if (c != 'u') return false;
      mode_ = Mode::kHex;
      aux_ = 0;
      aux2_ = kLow;
      return true;
    case Mode::kMinus:
      if (c == '0') { mode_ = Mode::kZero; return true; }
      if (c >= '1' && c <= '9') { mode_ = Mode::kInt; return true; }
      return false;
    case Mode::kZero:
    case Mode::kInt:
    case Mode::kFrac:
      if (is_digit(c) && mode_ != Mode::kZero) return true;
      if (c == '.' && mode_ != Mode::kFrac) { mode_ = Mode::kDot; return true; }
      if (c == 'e' || c == 'E') { mode_ = Mode::kExpMark; return true; }
      end_value();  // the number ended before this byte ("01" is refused at the '1' here)
      return step_structural(c);
    case Mode::kDot:
      if (!is_digit(c)) return false;
      mode_ = Mode::kFrac;
      return true;
    case Mode::kExpMark:
      if (c == '+' || c == '-') { mode_ = Mode::kExpSign; return true; }
      if (!is_digit(c)) return false;
      mode_ = Mode::kExp;
      return true;
    case Mode::kExpSign:
      if (!is_digit(c)) return false;
      mode_ = Mode::kExp;
      return true;
    case Mode::kExp:
      if (is_digit(c)) return true;
      end_value();
      return step_structural(c);
    case Mode::kLiteral: {
      const std::string_view lit = kLiterals[aux2_];
      if (c != static_cast<uint8_t>(lit[aux_])) return false;
      if (++aux_ == lit.size()) end_value();
      return true;
    }
    case Mode::kDone:
      return false;
    default:
      return step_structural(c);
  }
}

std::string JsonObjectPrefix::closing_suffix() const {
  std::string out;
  bool close_string = false;
  switch (mode_) {
    case Mode::kBeforeTop: return "{}";
    case Mode::kDone: return "";
    case Mode::kObjectOpen:
    case Mode::kArrayOpen:
    case Mode::kAfterValue:
    case Mode::kZero:
    case Mode::kInt:
    case Mode::kFrac:
    case Mode::kExp:
      break;
    case Mode::kKey: out = "\"\":null"; break;
    case Mode::kColon: out = ":null"; break;
    case Mode::kValue: out = "null"; break;
    case Mode::kMinus:
    case Mode::kDot:
    case Mode::kExpMark:
    case Mode::kExpSign:
      out = "0";
      break;
    case Mode::kLiteral: out = std::string(kLiterals[aux2_].substr(aux_)); break;
    case Mode::kString: close_string = true; break;
    case Mode::kUtf8:
      out += static_cast<char>(kRangeLo[aux2_]);
      out.append(aux_ - 1u, '\x80');
      close_string = true;
      break;
    case Mode::kEscape: out = "n"; close_string = true; break;
    case Mode::kHex:
      if (aux2_ == kLow && aux_ == 0) out = "DC00";
      else if (aux2_ == kLow && aux_ == 1) out = "C00";
      else out.append(4u - aux_, '0');
      if (aux2_ == kHigh) out += "\\uDC00";
      close_string = true;
      break;
    case Mode::kLowBackslash: out = "\\uDC00"; close_string = true; break;
    case Mode::kLowU: out = "uDC00"; close_string = true; break;
  }
  if (close_string) out += in_key_ ? "\":null" : "\"";
  for (int d = depth_ - 1; d >= 0; --d) out += ((containers_ >> d) & 1u) ? '}' : ']';
  return out;
}

// ---- JsonConstraint ------------------------------------------------------------------------------

struct JsonConstraint::TokenTable {
  enum Kind : uint8_t {
    kNever,            // special, added, unknown or padding token, or no bytes
    kText,             // bytes that have to be run through the automaton
    kStringSafe,       // whole UTF-8 characters, none of them '"', '\' or a control: fine anywhere in a string
    kEndOfGeneration,  // allowed exactly when the object is complete
  };
  std::string bytes;              // every token's bytes, concatenated
  std::vector<uint32_t> offsets;  // id -> its bytes are [offsets[id], offsets[id + 1])
  std::vector<uint8_t> kinds;     // id -> Kind
  // What the mask's byte tables need without reaching into `bytes`: the first two bytes (first | second
  // << 8; second 0 for a one-byte token) and the length, capped at 3 (0 for a token that is never text).
  std::vector<uint16_t> lead;
  std::vector<uint8_t> length;
};

JsonConstraint::JsonConstraint(const Tokenizer& tokenizer) {
  auto table = std::make_shared<TokenTable>();
  const Vocab& vocab = tokenizer.vocab();
  const int32_t n = tokenizer.size();
  table->offsets.reserve(static_cast<size_t>(n) + 1);
  table->kinds.assign(static_cast<size_t>(n), TokenTable::kNever);
  table->lead.assign(static_cast<size_t>(n), 0);
  table->length.assign(static_cast<size_t>(n), 0);
  table->offsets.push_back(0);
  std::string one;
  for (int32_t id = 0; id < n; ++id) {
    const TokenType type = vocab.types[id];
    one.clear();
    if (type == TokenType::kNormal || type == TokenType::kByte || type == TokenType::kUndefined)
      tokenizer.append_token_bytes(id, false, one);
    // Offsets are 32-bit: a vocabulary past 4 GiB of token bytes (none exists) would lose its tail.
    if (table->bytes.size() + one.size() > std::numeric_limits<uint32_t>::max()) one.clear();
    table->bytes += one;
    table->offsets.push_back(static_cast<uint32_t>(table->bytes.size()));
    if (one.empty()) continue;
    bool string_safe = utf8::is_valid(one);
    for (unsigned char c : one) string_safe = string_safe && c >= 0x20 && c != '"' && c != '\\';
    table->kinds[id] = string_safe ? TokenTable::kStringSafe : TokenTable::kText;
    table->lead[id] = static_cast<uint16_t>(static_cast<uint8_t>(one[0]) |
                                            (one.size() > 1 ? static_cast<uint8_t>(one[1]) << 8 : 0));
    table->length[id] = static_cast<uint8_t>(std::min<size_t>(one.size(), 3));
  }
  for (int32_t id : vocab.end_of_generation_ids()) {
    if (id >= 0 && id < n) {
      table->kinds[id] = TokenTable::kEndOfGeneration;
      table->length[id] = 0;
    }
  }
  table_ = std::move(table);
}

int32_t JsonConstraint::vocab_size() const { return static_cast<int32_t>(table_->kinds.size()); }

bool JsonConstraint::allows(int32_t token) const {
  const TokenTable& t = *table_;
  if (token < 0 || static_cast<size_t>(token) >= t.kinds.size()) return false;
  const uint8_t kind = t.kinds[token];
  if (state_.complete()) return kind == TokenTable::kEndOfGeneration;
  if (kind == TokenTable::kNever || kind == TokenTable::kEndOfGeneration) return false;
  if (kind == TokenTable::kStringSafe && state_.mode() == Mode::kString) return true;
  const uint32_t begin = t.offsets[token];
  return state_.accepts(std::string_view(t.bytes).substr(begin, t.offsets[token + 1] - begin));
}

Status JsonConstraint::accept(int32_t token) {
  const TokenTable& t = *table_;
  if (!allows(token)) {
    std::string bytes;
    if (token >= 0 && static_cast<size_t>(token) < t.kinds.size())
      bytes = t.bytes.substr(t.offsets[token], t.offsets[token + 1] - t.offsets[token]);
    return invalid_argument(
        "response_format json_object: token {} ('{}') cannot follow the output so far (the JSON object is {})",
        token, printable(bytes), complete() ? "complete: only end of generation may follow" : "not complete");
  }
  if (t.kinds[token] == TokenTable::kEndOfGeneration) return Status();
  const uint32_t begin = t.offsets[token];
  state_.push(std::string_view(t.bytes).substr(begin, t.offsets[token + 1] - begin));
  return Status();
}

// Cost per row (Qwen3's 151,936 logits, one core; json_constraint_test prints it): within a string, tokens
// that are whole safe characters pass without a look at their bytes and the rest run through the
// automaton (0.15-0.2 ms). Between JSON tokens (few allowed first bytes) a table of every allowed
// two-byte start judges each token by its first two bytes, with no unpredictable branch (almost every
// token starts with a space or a letter and is refused there); only the few tokens whose start passes
// run through the automaton (0.2-0.35 ms; 1-1.8 ms with the first byte alone).
Status JsonConstraint::mask(std::span<float> logits) const {
  const TokenTable& t = *table_;
  const size_t n = std::min(logits.size(), t.kinds.size());
  const auto* bytes = reinterpret_cast<const uint8_t*>(t.bytes.data());
  size_t alive = 0;
  auto keep_if = [&](size_t id, bool ok) {
    logits[id] = ok ? logits[id] : kNegInf;
    alive += logits[id] > kNegInf;
  };
  // Runs token `id` from the state after its first byte (`s`) through the rest of its bytes.
  auto run_rest = [&](JsonObjectPrefix s, size_t id) {
    const uint32_t end = t.offsets[id + 1];
    for (uint32_t i = t.offsets[id] + 1; i < end; ++i) {
      if (!s.step(bytes[i])) return false;
    }
    return true;
  };
  if (state_.complete()) {
    for (size_t id = 0; id < n; ++id) keep_if(id, t.kinds[id] == TokenTable::kEndOfGeneration);
  } else {
    std::array<JsonObjectPrefix, 256> after_first;
    std::array<bool, 256> first_ok;
    int n_first_ok = 0;
    for (int b = 0; b < 256; ++b) {
      after_first[b] = state_;
      first_ok[b] = after_first[b].step(static_cast<uint8_t>(b));
      n_first_ok += first_ok[b];
    }
    constexpr int kMaxPairRows = 40;  // between JSON tokens at most 22 first bytes are allowed
    if (n_first_ok <= kMaxPairRows) {
      // pair_ok[b1 | b2 << 8]: b1 then b2 can follow; for a one-byte token (b2 = 0 in `lead`), whether
      // b1 can, in one_ok[b1].
      std::vector<uint8_t> pair_ok(1 << 16, 0);
      for (int b1 = 0; b1 < 256; ++b1) {
        if (!first_ok[b1]) continue;
        for (int b2 = 0; b2 < 256; ++b2) {
          JsonObjectPrefix s = after_first[b1];
          pair_ok[b1 | b2 << 8] = s.step(static_cast<uint8_t>(b2));
        }
      }
      for (size_t id = 0; id < n; ++id) {
        const uint8_t len = t.length[id];  // 0 for tokens that are never text (and end of generation)
        const uint16_t lead = t.lead[id];
        bool ok = len == 1 ? first_ok[lead & 0xFF] : len >= 2 && pair_ok[lead];
        if (ok && len == 3) ok = run_rest(after_first[lead & 0xFF], id);
        keep_if(id, ok);
      }
    } else {
      const bool plain_string = state_.mode() == Mode::kString;
      for (size_t id = 0; id < n; ++id) {
        const uint8_t kind = t.kinds[id];
        bool ok;
        if (kind == TokenTable::kStringSafe && plain_string) {
          ok = true;
        } else if (kind == TokenTable::kNever || kind == TokenTable::kEndOfGeneration) {
          ok = false;
        } else {
          const uint8_t b1 = static_cast<uint8_t>(t.lead[id] & 0xFF);
          ok = first_ok[b1] && run_rest(after_first[b1], id);
        }
        keep_if(id, ok);
      }
    }
  }
  for (size_t id = n; id < logits.size(); ++id) logits[id] = kNegInf;  // past the tokenizer: never text
  if (alive == 0) {
    return invalid_argument(
        "response_format json_object: no token can continue the JSON output here (the vocabulary lacks the "
        "needed tokens, or logits of -inf, e.g. from logit_bias, cover all {})",
        state_.complete() ? "end-of-generation tokens" : "allowed tokens");
  }
  return Status();
}

Result<int32_t> constrained_sample(Sampler& sampler, const JsonConstraint& constraint, std::span<const float> logits,
                                   std::span<const int32_t> history, std::vector<float>* scratch) {
  Result<int32_t> first = sampler.sample(logits, history);
  if (!first.ok() || constraint.allows(first.value())) return first;
  scratch->assign(logits.begin(), logits.end());
  DF_RETURN_IF_ERROR(constraint.mask(*scratch));
  return sampler.sample(*scratch, history);
}

}  // namespace dflash
