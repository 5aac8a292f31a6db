#include "tokenizer/bpe_model.h"

#include <algorithm>
#include <mutex>

#include "tokenizer/byte_level.h"

namespace dflash {

Result<std::unique_ptr<BpeModel>> BpeModel::create(const Vocab& vocab) {
  std::unique_ptr<BpeModel> m(new BpeModel());
  DF_ASSIGN_OR_RETURN(m->pre_, PreTokenizer::create(vocab.split_regexes));
  m->ignore_merges_ = vocab.ignore_merges;
  m->unk_id_ = vocab.unk_id.value_or(-1);

  m->token_to_id_.reserve(vocab.tokens.size());
  for (size_t i = 0; i < vocab.tokens.size(); ++i) {
    if (vocab.types[i] == TokenType::kUnused) continue;
    m->token_to_id_.emplace(vocab.tokens[i], static_cast<int32_t>(i));
  }
  auto lookup = [&](const std::string& s) -> int32_t {
    auto it = m->token_to_id_.find(s);
    return it == m->token_to_id_.end() ? -1 : it->second;
  };

  const ByteLevelAlphabet& alphabet = ByteLevelAlphabet::get();
  for (int b = 0; b < 256; ++b) {
    m->byte_token_[b] = lookup(alphabet.utf8(static_cast<uint8_t>(b)));
    m->fallback_token_[b] = vocab.byte_fallback ? lookup(fmt::format("<0x{:02X}>", b)) : -1;
  }

  m->merges_.reserve(vocab.merges.size());
  std::string joined;
  for (size_t r = 0; r < vocab.merges.size(); ++r) {
    const auto& [a, b] = vocab.merges[r];
    int32_t ia = lookup(a), ib = lookup(b);
    joined = a;
    joined += b;
    int32_t ij = lookup(joined);
    if (ia < 0 || ib < 0 || ij < 0) {
      const std::string& missing = ia < 0 ? a : ib < 0 ? b : joined;
      return corrupt("tokenizer: merge {} '{} {}' uses '{}', which is not in the vocabulary", r, a, b, missing);
    }
    // A repeated pair takes the rank of its last occurrence, as HF tokenizers does.
    m->merges_[pair_key(ia, ib)] = Merge{static_cast<uint32_t>(r), ij};
  }

  m->token_bytes_.resize(vocab.tokens.size());
  for (size_t i = 0; i < vocab.tokens.size(); ++i) {
    if (vocab.types[i] == TokenType::kUnused) continue;
    // HF's ByteLevel decoder: a token spelled entirely in the byte alphabet decodes through it;
    // any other token (an added token with a space, say) decodes to its own UTF-8.
    auto bytes = alphabet.decode(vocab.tokens[i]);
    m->token_bytes_[i] = bytes ? std::move(*bytes) : vocab.tokens[i];
  }
  return m;
}

Status BpeModel::encode(std::string_view text, std::vector<int32_t>& out) const {
  std::vector<std::string_view> words;
  DF_RETURN_IF_ERROR(pre_.split(text, words));
  for (std::string_view w : words) encode_word(w, out);
  return Status();
}

void BpeModel::append_bytes(int32_t id, std::string& out) const {
  if (id >= 0 && static_cast<size_t>(id) < token_bytes_.size()) out += token_bytes_[id];
}

int32_t BpeModel::token_to_id(std::string_view token) const {
  auto it = token_to_id_.find(std::string(token));
  return it == token_to_id_.end() ? -1 : it->second;
}

void BpeModel::encode_word(std::string_view word, std::vector<int32_t>& out) const {
  if (word.empty()) return;
  bool cacheable = word.size() <= kCacheMaxWordBytes;
  if (cacheable) {
    std::shared_lock lock(cache_mutex_);
    auto it = cache_.find(std::string(word));
    if (it != cache_.end()) {
      out.insert(out.end(), it->second.begin(), it->second.end());
      return;
    }
  }
  size_t first = out.size();
  merge_word(word, out);
  if (cacheable) {
    std::unique_lock lock(cache_mutex_);
    if (cache_.size() < kCacheCapacity) cache_.emplace(std::string(word), std::vector<int32_t>(out.begin() + first, out.end()));
  }
}

void BpeModel::merge_word(std::string_view word, std::vector<int32_t>& out) const {
  const ByteLevelAlphabet& alphabet = ByteLevelAlphabet::get();
  if (ignore_merges_) {
    auto it = token_to_id_.find(alphabet.encode(word));
    if (it != token_to_id_.end()) {
      out.push_back(it->second);
      return;
    }
  }

  // Symbols form a linked list over the word's bytes; merging folds the right symbol into the left.
  struct Symbol {
    int32_t id;  // -1 once folded into its left neighbour
    int32_t prev;
    int32_t next;
  };
  std::vector<Symbol> syms;
  syms.reserve(word.size());
  auto add = [&](int32_t id) {
    int32_t n = static_cast<int32_t>(syms.size());
    if (n > 0) syms.back().next = n;
    syms.push_back({id, n - 1, -1});
  };
  for (char c : word) {
    uint8_t b = static_cast<uint8_t>(c);
    if (byte_token_[b] >= 0) {
      add(byte_token_[b]);
      continue;
    }
    // The byte's character is not a token (a trimmed vocabulary): byte fallback on that character's
    // UTF-8, else the unknown token, else it is dropped, as HF's BPE does.
    const std::string& ch = alphabet.utf8(b);
    bool all = std::all_of(ch.begin(), ch.end(), [&](char x) { return fallback_token_[static_cast<uint8_t>(x)] >= 0; });
    if (all) {
      for (char x : ch) add(fallback_token_[static_cast<uint8_t>(x)]);
    } else if (unk_id_ >= 0) {
      add(unk_id_);
    }
  }
  if (syms.empty()) return;

  // Candidate merges ordered by rank, then by position (leftmost first), as HF's Word::merge_all.
  struct Candidate {
    uint32_t rank;
    int32_t pos;
    int32_t left, right, result;
  };
  auto later = [](const Candidate& x, const Candidate& y) {
    return x.rank != y.rank ? x.rank > y.rank : x.pos > y.pos;
  };
  std::vector<Candidate> heap;
  heap.reserve(syms.size());
  auto consider = [&](int32_t pos) {
    int32_t nx = syms[pos].next;
    if (nx < 0) return;
    auto it = merges_.find(pair_key(syms[pos].id, syms[nx].id));
    if (it == merges_.end()) return;
    heap.push_back({it->second.rank, pos, syms[pos].id, syms[nx].id, it->second.result});
    std::push_heap(heap.begin(), heap.end(), later);
  };
  for (int32_t i = 0; i + 1 < static_cast<int32_t>(syms.size()); ++i) consider(i);

  while (!heap.empty()) {
    std::pop_heap(heap.begin(), heap.end(), later);
    Candidate c = heap.back();
    heap.pop_back();
    Symbol& s = syms[c.pos];
    // Stale when either side changed since the candidate was queued (symbols only ever grow).
    if (s.id != c.left || s.next < 0 || syms[s.next].id != c.right) continue;
    Symbol& right = syms[s.next];
    s.id = c.result;
    s.next = right.next;
    if (right.next >= 0) syms[right.next].prev = c.pos;
    right.id = -1;
    if (s.prev >= 0) consider(s.prev);
    consider(c.pos);
  }
  for (int32_t i = 0; i >= 0; i = syms[i].next) out.push_back(syms[i].id);
}

}  // namespace dflash
