#include "json.h"

#include <cerrno>
#include <cstring>
#include <cstdlib>

namespace strata_triton {

class JsonParser {
  public:
    JsonParser(const char *text, size_t size) : p_(text), begin_(text), end_(text + size) {}

    bool document(Json *out, std::string *error) {
        if (!value(out, 0) || (skip(), p_ != end_)) {
            if (error_.empty()) error_ = "unexpected text";
            *error = "JSON: " + error_ + " at byte " + std::to_string(p_ - begin_);
            return false;
        }
        return true;
    }

  private:
    const char *p_;
    const char *begin_;
    const char *end_;
    std::string error_;

    void skip() {
        while (p_ != end_ && (*p_ == ' ' || *p_ == '\n' || *p_ == '\r' || *p_ == '\t')) ++p_;
    }
    bool fail(const char *why) {
        error_ = why;
        return false;
    }
    bool literal(const char *word) {
        const char *q = p_;
        for (const char *w = word; *w; ++w, ++q) {
            if (q == end_ || *q != *w) return fail("bad literal");
        }
        p_ = q;
        return true;
    }

    bool string(std::string *out) {
        ++p_;  // the opening quote
        while (p_ != end_ && *p_ != '"') {
            char c = *p_++;
            if (c != '\\') {
                out->push_back(c);
                continue;
            }
            if (p_ == end_) return fail("unterminated escape");
            char e = *p_++;
            switch (e) {
            case '"': case '\\': case '/': out->push_back(e); break;
            case 'b': out->push_back('\b'); break;
            case 'f': out->push_back('\f'); break;
            case 'n': out->push_back('\n'); break;
            case 'r': out->push_back('\r'); break;
            case 't': out->push_back('\t'); break;
            case 'u': {
                if (end_ - p_ < 4) return fail("short \\u escape");
                unsigned code = 0;
                for (int i = 0; i < 4; ++i) {
                    char h = *p_++;
                    code <<= 4;
                    if (h >= '0' && h <= '9') code |= unsigned(h - '0');
                    else if (h >= 'a' && h <= 'f') code |= unsigned(h - 'a' + 10);
                    else if (h >= 'A' && h <= 'F') code |= unsigned(h - 'A' + 10);
                    else return fail("bad \\u escape");
                }
                // UTF-8 for the basic plane; names in configurations are ASCII in practice.
                if (code < 0x80) {
                    out->push_back(char(code));
                } else if (code < 0x800) {
                    out->push_back(char(0xC0 | (code >> 6)));
                    out->push_back(char(0x80 | (code & 0x3F)));
                } else {
                    out->push_back(char(0xE0 | (code >> 12)));
                    out->push_back(char(0x80 | ((code >> 6) & 0x3F)));
                    out->push_back(char(0x80 | (code & 0x3F)));
                }
                break;
            }
            default: return fail("bad escape");
            }
        }
        if (p_ == end_) return fail("unterminated string");
        ++p_;
        return true;
    }

    // The elements of an object or array after its opening bracket: `element` reads one, and
    // they are separated by commas up to `close`.
    template <typename F>
    bool sequence(char close, F element) {
        ++p_;
        skip();
        if (p_ != end_ && *p_ == close) {
            ++p_;
            return true;
        }
        for (;;) {
            if (!element()) return false;
            skip();
            if (p_ != end_ && *p_ == ',') {
                ++p_;
                continue;
            }
            if (p_ != end_ && *p_ == close) {
                ++p_;
                return true;
            }
            return fail(close == '}' ? "expected ',' or '}'" : "expected ',' or ']'");
        }
    }

    bool value(Json *out, int depth) {
        if (depth > 64) return fail("nested too deeply");
        skip();
        if (p_ == end_) return fail("unexpected end");
        switch (*p_) {
        case '{':
            out->kind_ = Json::Kind::Object;
            return sequence('}', [&] {
                skip();
                if (p_ == end_ || *p_ != '"') return fail("expected a member name");
                std::string key;
                if (!string(&key)) return false;
                skip();
                if (p_ == end_ || *p_ != ':') return fail("expected ':'");
                ++p_;
                Json member;
                if (!value(&member, depth + 1)) return false;
                out->members_.emplace_back(std::move(key), std::move(member));
                return true;
            });
        case '[':
            out->kind_ = Json::Kind::Array;
            return sequence(']', [&] {
                Json item;
                if (!value(&item, depth + 1)) return false;
                out->items_.push_back(std::move(item));
                return true;
            });
        case '"':
            out->kind_ = Json::Kind::String;
            return string(&out->text_);
        case 't':
            out->kind_ = Json::Kind::Bool;
            out->flag_ = true;
            return literal("true");
        case 'f':
            out->kind_ = Json::Kind::Bool;
            return literal("false");
        case 'n':
            return literal("null");
        default: {
            const char *start = p_;
            while (p_ != end_ && (std::strchr("+-.eE", *p_) != nullptr || (*p_ >= '0' && *p_ <= '9'))) ++p_;
            if (p_ == start) return fail("unexpected character");
            out->kind_ = Json::Kind::Number;
            out->text_.assign(start, p_);
            char *stop = nullptr;
            out->number_ = std::strtod(out->text_.c_str(), &stop);
            if (stop == nullptr || *stop != '\0') return fail("bad number");
            return true;
        }
        }
    }
};

bool Json::parse(const char *text, size_t size, Json *out, std::string *error) {
    *out = Json();
    return JsonParser(text, size).document(out, error);
}

const Json *Json::find(const std::string &key) const {
    for (const auto &m : members_) {
        if (m.first == key) return &m.second;
    }
    return nullptr;
}

bool Json::as_int(int64_t *out) const {
    if (kind_ != Kind::Number && kind_ != Kind::String) return false;
    if (text_.empty()) return false;
    errno = 0;
    char *stop = nullptr;
    long long v = std::strtoll(text_.c_str(), &stop, 10);
    if (errno != 0 || stop == nullptr || *stop != '\0') return false;
    *out = v;
    return true;
}

bool Json::as_bool(bool *out) const {
    if (kind_ == Kind::Bool) {
        *out = flag_;
        return true;
    }
    if (kind_ == Kind::String && (text_ == "true" || text_ == "false")) {
        *out = text_ == "true";
        return true;
    }
    return false;
}

}  // namespace strata_triton
