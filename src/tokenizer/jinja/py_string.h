// Python str semantics over UTF-8 strings: code-point lengths, indices and slices, whitespace, case
// mapping, strip/split/replace/find and repr quoting, as the str methods and filters of Jinja need them.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace dflash::jinja::py {

// Code points of `s`. Bytes that are not well-formed UTF-8 decode to U+DC80..U+DCFF (Python's
// "surrogateescape") and encode back to the same byte, so no input is ever altered or rejected.
std::u32string decode(std::string_view s);
std::string encode(std::u32string_view cps);
void append_code_point(std::string& out, char32_t cp);

bool is_ascii(std::string_view s);
size_t length(std::string_view s);  // in code points

// Python str.isspace() for one character (Unicode White_Space plus the \x1c-\x1f separators).
bool is_space(char32_t c);
bool is_alpha(char32_t c);
bool is_digit(char32_t c);
bool is_alnum(char32_t c);  // letters and any numeric character
bool is_word_char(char32_t c);  // regex \w
bool is_upper(char32_t c);
bool is_lower(char32_t c);
// Python's str.isprintable() for one character (what repr() leaves unescaped).
bool is_printable(char32_t c);

std::string upper(std::string_view s);
std::string lower(std::string_view s);
std::string capitalize(std::string_view s);  // str.capitalize: first upper, the rest lower
std::string title(std::string_view s);       // str.title
std::string swapcase(std::string_view s);

// str.strip / lstrip / rstrip; `chars` nullopt strips whitespace.
std::string strip(std::string_view s, const std::optional<std::string>& chars, bool left, bool right);

// str.split / str.rsplit; `sep` nullopt splits on runs of whitespace. maxsplit < 0: no limit.
std::vector<std::string> split(std::string_view s, const std::optional<std::string>& sep, int64_t maxsplit);
std::vector<std::string> rsplit(std::string_view s, const std::optional<std::string>& sep, int64_t maxsplit);
std::vector<std::string> splitlines(std::string_view s, bool keepends);

// str.replace; count < 0 replaces all.
std::string replace(std::string_view s, std::string_view old, std::string_view with, int64_t count);
// str.find / rfind / count with optional code-point bounds; find returns a code-point index or -1.
int64_t find(std::string_view s, std::string_view sub, std::optional<int64_t> start, std::optional<int64_t> end,
             bool reverse);
int64_t count(std::string_view s, std::string_view sub, std::optional<int64_t> start, std::optional<int64_t> end);
bool starts_with(std::string_view s, std::string_view prefix, std::optional<int64_t> start,
                 std::optional<int64_t> end);
bool ends_with(std::string_view s, std::string_view suffix, std::optional<int64_t> start,
               std::optional<int64_t> end);

// s[i] (negative counts from the end); nullopt when out of range.
std::optional<std::string> char_at(std::string_view s, int64_t i);
// s[start:stop:step]; step must not be 0.
std::string slice(std::string_view s, std::optional<int64_t> start, std::optional<int64_t> stop,
                  std::optional<int64_t> step);

// Python's repr() of a str: single quotes unless the text has ' and no ", escapes for the rest.
std::string quote(std::string_view s);

// Python slice index arithmetic (slice.indices): clamps start/stop for a sequence of `len` items.
struct SliceBounds {
  int64_t start, stop, step, count;
};
SliceBounds slice_indices(int64_t len, std::optional<int64_t> start, std::optional<int64_t> stop,
                          std::optional<int64_t> step);

}  // namespace dflash::jinja::py
