// A small JSON reader for the two documents the backend reads: the model configuration and the
// backend configuration, both as Triton serialises them (TRITONSERVER_MessageSerializeToJson).
// Protobuf's JSON form writes 64-bit integers as strings ("dims": ["-1", "16"]), so integers are
// read from numbers and from strings of digits alike. ps.json is never read here: strata parses it.
#ifndef STRATA_TRITON_JSON_H
#define STRATA_TRITON_JSON_H

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

namespace strata_triton {

class Json {
  public:
    enum class Kind { Null, Bool, Number, String, Array, Object };

    // Parses `text`; on a syntax error returns false and sets `*error` (with the byte offset).
    static bool parse(const char *text, size_t size, Json *out, std::string *error);

    Kind kind() const { return kind_; }
    bool is_object() const { return kind_ == Kind::Object; }
    bool is_array() const { return kind_ == Kind::Array; }
    bool is_string() const { return kind_ == Kind::String; }

    // The member `key` of an object, or nullptr (also when this is not an object).
    const Json *find(const std::string &key) const;
    // Elements of an array (empty for other kinds); members of an object, in document order.
    const std::vector<Json> &items() const { return items_; }
    const std::vector<std::pair<std::string, Json>> &members() const { return members_; }
    // The text of a string, "" for other kinds.
    const std::string &str() const { return text_; }
    // An integer from a number or from a string of digits; false when it is neither.
    bool as_int(int64_t *out) const;
    bool as_bool(bool *out) const;

  private:
    Kind kind_ = Kind::Null;
    bool flag_ = false;
    double number_ = 0;
    std::string text_;  // strings; a number's own text too, so large integers stay exact
    std::vector<Json> items_;
    std::vector<std::pair<std::string, Json>> members_;

    friend class JsonParser;
};

}  // namespace strata_triton

#endif  // STRATA_TRITON_JSON_H
