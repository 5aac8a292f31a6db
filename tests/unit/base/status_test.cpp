// Status and Result (base/status.h): the error a DF_RETURN_IF_ERROR / DF_ASSIGN_OR_RETURN passes up keeps its
// code and message, also when it comes from `.status()` of a temporary Result (which once handed the macro
// a reference into the destroyed temporary: the message came back empty).
#include "base/status.h"

#include <gtest/gtest.h>

#include <memory>
#include <string>

namespace dflash {
namespace {

Result<std::unique_ptr<std::string>> make(bool ok) {
  if (!ok) return invalid_argument("--flag {}: a long enough message to live on the heap, not inline", 42);
  return std::make_unique<std::string>("value");
}

Status pass_status_of_temporary(bool ok) {
  DF_RETURN_IF_ERROR(make(ok).status());
  return Status();
}

Status pass_result(bool ok) {
  DF_ASSIGN_OR_RETURN(auto v, make(ok));
  return *v == "value" ? Status() : Status(ErrorCode::kInternal, "wrong value");
}

TEST(Status, errors_pass_up_with_their_message) {
  for (auto* f : {&pass_status_of_temporary, &pass_result}) {
    EXPECT_TRUE(f(true).ok());
    const Status s = f(false);
    ASSERT_FALSE(s.ok());
    EXPECT_EQ(s.code(), ErrorCode::kInvalidArgument);
    EXPECT_EQ(s.message(), "--flag 42: a long enough message to live on the heap, not inline");
  }
}

TEST(Status, status_of_a_temporary_result_is_a_copy) {
  const Status& s = make(false).status();  // bound to the returned copy, which the reference keeps alive
  EXPECT_EQ(s.message(), "--flag 42: a long enough message to live on the heap, not inline");
  EXPECT_TRUE(make(true).status().ok());
}

}  // namespace
}  // namespace dflash
