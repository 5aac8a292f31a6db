// Builtin filters, with Jinja 3.1's arguments and results, and transformers' tojson.
#include <gtest/gtest.h>

#include "jinja_test_helpers.h"

namespace dflash::jinja {
namespace {

using testing::ctx;
using testing::error_of;
using testing::render;

const char* kData = R"({"d": {"z": 1, "a": 2, "m": {"x": [1, {"y": null}]}}, "l": [3, 1, 2], "s": "héllo",
                        "msgs": [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "yo"}]})";

TEST(JinjaFilters, tojson_matches_transformers_json_dumps) {
  // json.dumps(x, ensure_ascii=False, indent=None, separators=None, sort_keys=False): keys keep their order.
  EXPECT_EQ(render("{{ d|tojson }}", ctx(kData)), R"({"z": 1, "a": 2, "m": {"x": [1, {"y": null}]}})");
  EXPECT_EQ(render("{{ d|tojson(indent=2) }}", ctx(kData)),
            "{\n  \"z\": 1,\n  \"a\": 2,\n  \"m\": {\n    \"x\": [\n      1,\n      {\n        \"y\": null\n      }\n    ]\n  }\n}");
  EXPECT_EQ(render("{{ d|tojson(separators=(',', ':')) }} {{ d|tojson(sort_keys=true) }}", ctx(kData)),
            R"({"z":1,"a":2,"m":{"x":[1,{"y":null}]}} {"a": 2, "m": {"x": [1, {"y": null}]}, "z": 1})");
  EXPECT_EQ(render(R"({{ 'é"\n\\'|tojson }} {{ 'é😀'|tojson(ensure_ascii=true) }})"),
            R"("é\"\n\\" "\u00e9\ud83d\ude00")");
  EXPECT_EQ(render(R"({{ '\x01\x7f'|tojson }})"), "\"\\u0001\x7f\"");
  EXPECT_EQ(render("{{ [1.0, 1e16, 1e-5, none, true, (1, 2), [], {}]|tojson }} {{ {1: 'a', true: 'b', none: 'c'}|tojson }}"),
            R"([1.0, 1e+16, 1e-05, null, true, [1, 2], [], {}] {"1": "b", "null": "c"})");
  EXPECT_EQ(render("{{ [1, [2]]|tojson(indent='\t') }}"), "[\n\t1,\n\t[\n\t\t2\n\t]\n]");
  EXPECT_NE(error_of("{{ foo|tojson }}").find("Object of type Undefined is not JSON serializable"), std::string::npos);
  EXPECT_NE(error_of("{{ namespace(a=1)|tojson }}").find("not JSON serializable"), std::string::npos);
}

TEST(JinjaFilters, string_filters) {
  EXPECT_EQ(render("{{ s|upper }} {{ 'AbC'|lower }} {{ 'hello'|capitalize }} {{ 'hELLo wORLD'|title }} {{ 'hello-world foo'|title }} {{ 'straße'|upper }}",
                   ctx(kData)),
            "HÉLLO abc Hello Hello World Hello-World Foo STRASSE");
  EXPECT_EQ(render("{{ '  héllo  '|trim }}|{{ 'xyhixy'|trim('xy') }}|{{ s|replace('l', 'L', 1) }}|{{ 'x'|center(7) }}|",
                   ctx(kData)),
            "héllo|hi|héLlo|   x   |");
  EXPECT_EQ(render("{{ 'a\nb\n\nc'|indent(2) }}|{{ 'a\nb'|indent(2, true) }}|{{ 'a\n\nb\n'|indent }}|{{ 'a\n\nb'|indent(1, blank=true) }}"),
            "a\n  b\n\n  c|  a\n  b|a\n\n    b\n|a\n \n b");
  EXPECT_EQ(render("{{ 'hello world foo'|truncate(9) }}|{{ 'hello world foo bar'|truncate(11, true) }}|{{ 'hello'|truncate(3, end='') }}|{{ 'short'|truncate(3) }}"),
            "hello...|hello wo...|hello|short");
  EXPECT_EQ(render(R"({{ "<a href='x'>&"|e }} {{ 'hello world, foo-bar'|wordcount }} {{ 'abc'|reverse }} {{ 42|string ~ 'x' }} {{ 5|safe }})"),
            "&lt;a href=&#39;x&#39;&gt;&amp; 4 cba 42x 5");
  EXPECT_EQ(render("{{ '%s-%d'|format('a', 3) }} {{ '%05.2f'|format(3.14159) }} {{ '%s and %r'|format('x', 'y') }} {{ '%d%%'|format(50) }} {{ '%(k)s'|format(k='v') }}"),
            "a-3 03.14 x and 'y' 50% v");
}

TEST(JinjaFilters, default_and_length) {
  EXPECT_EQ(render("{{ foo|default('dflt') }} [{{ ''|default('dflt') }}] {{ ''|default('dflt', true) }} {{ none|default('x') }} {{ foo|d('y') }}"),
            "dflt [] dflt None y");
  EXPECT_EQ(render("{{ msgs|length }} {{ msgs|count }} {{ d|length }} {{ ''|length }} {{ foo|length }} {{ s|length }}", ctx(kData)),
            "2 2 3 0 0 5");
  EXPECT_NE(error_of("{{ 5|length }}").find("has no len()"), std::string::npos);
}

TEST(JinjaFilters, sequence_filters) {
  EXPECT_EQ(render("{{ l|sort }} {{ l|sort(reverse=true) }} {{ ['b', 'A', 'a']|sort }} {{ ['b', 'a', 'C']|sort(case_sensitive=true) }}",
                   ctx(kData)),
            "[1, 2, 3] [3, 2, 1] ['A', 'a', 'b'] ['C', 'a', 'b']");
  EXPECT_EQ(render("{{ [{'n': 'b'}, {'n': 'A'}]|sort(attribute='n')|map(attribute='n')|join }} "
                   "{{ [{'a': {'b': 2}}, {'a': {'b': 1}}]|sort(attribute='a.b')|map(attribute='a.b')|list }}"),
            "Ab [1, 2]");
  EXPECT_EQ(render("{{ l|first }} {{ l|last }} {{ l|max }} {{ l|min }} {{ l|sum }} {{ [1, 2]|sum(start=10) }} [{{ []|first }}] {{ 'abc'|first }}",
                   ctx(kData)),
            "3 2 3 1 6 13 [] a");
  EXPECT_EQ(render("{{ l|reverse|list }} {{ ['a', 'B', 'a', 'b']|unique|list }} {{ ['a', 'B', 'a', 'b']|unique(case_sensitive=true)|list }}",
                   ctx(kData)),
            "[2, 1, 3] ['a', 'B'] ['a', 'B', 'b']");
  EXPECT_EQ(render("{{ 'abc'|list }} {{ d|list }} {{ (1, 2)|list }} {{ l|join(', ') }} {{ msgs|join('|', attribute='role') }}",
                   ctx(kData)),
            "['a', 'b', 'c'] ['z', 'a', 'm'] [1, 2] 3, 1, 2 user|assistant");
  EXPECT_EQ(render("{{ [1, 2, 3, 4, 5]|batch(2)|list }} {{ [1, 2, 3, 4, 5]|batch(2, 'x')|list }} {{ [1, 2, 3, 4, 5]|slice(2)|list }}"),
            "[[1, 2], [3, 4], [5]] [[1, 2], [3, 4], [5, 'x']] [[1, 2, 3], [4, 5]]");
}

TEST(JinjaFilters, map_select_reject) {
  EXPECT_EQ(render("{{ msgs|map(attribute='role')|list }} {{ ['a', 'b']|map('upper')|list }} {{ [' a ', 'b ']|map('trim')|join('|') }} "
                   "{{ msgs|map(attribute='missing', default='-')|list }}",
                   ctx(kData)),
            "['user', 'assistant'] ['A', 'B'] a|b ['-', '-']");
  EXPECT_EQ(render("{{ msgs|selectattr('role', 'equalto', 'user')|map(attribute='content')|first }} "
                   "{{ msgs|rejectattr('role', 'eq', 'user')|map(attribute='content')|first }} "
                   "{{ [1, 2, 3, 4]|select('even')|list }} {{ [0, 1, '', 2]|select|list }} {{ [1, none, 2]|reject('none')|list }} "
                   "{{ [1, 2, 3]|select('gt', 1)|list }} {{ [{'a': 1}, {'b': 2}]|selectattr('a')|list }}",
                   ctx(kData)),
            "hi yo [2, 4] [1, 2] [1, 2] [2, 3] [{'a': 1}]");
}

TEST(JinjaFilters, mapping_filters) {
  EXPECT_EQ(render("{{ {'b': 1, 'a': 2}|dictsort }} {{ {'b': 2, 'a': 1}|dictsort(by='value') }} {{ {'B': 1, 'a': 2}|dictsort }} "
                   "{{ {'b': 1, 'a': 2}|dictsort(reverse=true) }} {{ {'k': 1}|items|list }} {{ foo|items|list }}"),
            "[('a', 2), ('b', 1)] [('a', 1), ('b', 2)] [('a', 2), ('B', 1)] [('b', 1), ('a', 2)] [('k', 1)] []");
  EXPECT_EQ(render("{{ [{'g': 'a', 'v': 1}, {'g': 'b', 'v': 2}, {'g': 'a', 'v': 3}]|groupby('g')|list }}"),
            "[('a', [{'g': 'a', 'v': 1}, {'g': 'a', 'v': 3}]), ('b', [{'g': 'b', 'v': 2}])]");
  EXPECT_NE(error_of("{{ 'x'|items|list }}").find("Can only get item pairs from a mapping"), std::string::npos);
  EXPECT_EQ(render("{{ 'x'|attr('upper')() }} [{{ {'k': 'v'}|attr('k') }}]"), "X []");
}

TEST(JinjaFilters, number_filters) {
  EXPECT_EQ(render("{{ 2.5|round }} {{ 3.14159|round(2) }} {{ 2.675|round(2) }} {{ 2.5|round(0, 'floor') }} {{ 2.1|round(0, 'ceil') }} {{ 3|round }} {{ 12345|round(-2) }}"),
            "2.0 3.14 2.67 2.0 3.0 3 12300");
  EXPECT_EQ(render("{{ '3.7'|int }} {{ '42'|int }} {{ 'x'|int }} {{ 'x'|int(7) }} {{ '0x1A'|int(base=16) }} {{ ' 12 '|int }} {{ 3.99|int }} {{ none|int }}"),
            "3 42 0 7 26 12 3 0");
  EXPECT_EQ(render("{{ '1.5'|float }} {{ '1e3'|float }} {{ 'x'|float }} {{ 3|float }} {{ -3|abs }} {{ -2.5|abs }}"),
            "1.5 1000.0 0.0 3.0 3 2.5");
  EXPECT_NE(error_of("{{ foo|int }}").find("'foo' is undefined"), std::string::npos);
}

}  // namespace
}  // namespace dflash::jinja
