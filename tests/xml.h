#pragma once
// A strict little XML reader for the tests: parses a document into elements (name,
// attributes, children, text) and throws std::runtime_error with the offset on anything
// malformed (unclosed or mismatched tags, unquoted or duplicate attributes, bad entities,
// raw '<' or '&' in text). Enough to prove our SVG is well-formed and to inspect it.
#include <cstddef>
#include <functional>
#include <map>
#include <memory>
#include <stdexcept>
#include <string>
#include <vector>

namespace remat::test {

struct XmlElement {
  std::string name;
  std::map<std::string, std::string> attributes;
  std::vector<std::unique_ptr<XmlElement>> children;
  std::string text;

  std::string attr(const std::string& key) const {
    const auto it = attributes.find(key);
    return it == attributes.end() ? std::string() : it->second;
  }
  /// Every element below (and including) this one for which `match` holds, in document order.
  void collect(const std::function<bool(const XmlElement&)>& match,
               std::vector<const XmlElement*>& out) const {
    if (match(*this)) out.push_back(this);
    for (const auto& child : children) child->collect(match, out);
  }
  std::vector<const XmlElement*> find_all(const std::string& element, const std::string& cls = "") const {
    std::vector<const XmlElement*> out;
    collect([&](const XmlElement& e) { return e.name == element && (cls.empty() || e.attr("class") == cls); }, out);
    return out;
  }
};

class XmlParser {
 public:
  explicit XmlParser(const std::string& text) : s_(text) {}

  std::unique_ptr<XmlElement> parse() {
    skip_space();
    if (s_.compare(i_, 5, "<?xml") == 0) {
      const auto end = s_.find("?>", i_);
      if (end == std::string::npos) fail("unterminated XML declaration");
      i_ = end + 2;
    }
    skip_space();
    auto root = element();
    skip_space();
    if (i_ != s_.size()) fail("content after the root element");
    return root;
  }

 private:
  [[noreturn]] void fail(const std::string& why) const {
    throw std::runtime_error("XML error at offset " + std::to_string(i_) + ": " + why);
  }
  void skip_space() {
    while (i_ < s_.size() && std::isspace(static_cast<unsigned char>(s_[i_]))) ++i_;
  }
  std::string name() {
    const std::size_t start = i_;
    while (i_ < s_.size() && (std::isalnum(static_cast<unsigned char>(s_[i_])) || s_[i_] == '-' ||
                              s_[i_] == '_' || s_[i_] == ':' || s_[i_] == '.'))
      ++i_;
    if (i_ == start) fail("expected a name");
    return s_.substr(start, i_ - start);
  }
  std::string decode(const std::string& raw) {
    std::string out;
    for (std::size_t k = 0; k < raw.size(); ++k) {
      if (raw[k] == '<') fail("raw '<' in text or attribute");
      if (raw[k] != '&') {
        out += raw[k];
        continue;
      }
      const auto end = raw.find(';', k);
      if (end == std::string::npos) fail("unterminated entity");
      const std::string entity = raw.substr(k + 1, end - k - 1);
      if (entity == "amp") out += '&';
      else if (entity == "lt") out += '<';
      else if (entity == "gt") out += '>';
      else if (entity == "quot") out += '"';
      else if (entity == "apos") out += '\'';
      else fail("unknown entity &" + entity + ";");
      k = end;
    }
    return out;
  }
  std::unique_ptr<XmlElement> element() {
    if (i_ >= s_.size() || s_[i_] != '<') fail("expected '<'");
    ++i_;
    auto e = std::make_unique<XmlElement>();
    e->name = name();
    for (;;) {
      skip_space();
      if (i_ >= s_.size()) fail("unterminated start tag <" + e->name);
      if (s_.compare(i_, 2, "/>") == 0) {
        i_ += 2;
        return e;
      }
      if (s_[i_] == '>') {
        ++i_;
        break;
      }
      const std::string key = name();
      skip_space();
      if (i_ >= s_.size() || s_[i_] != '=') fail("attribute " + key + " without '='");
      ++i_;
      skip_space();
      if (i_ >= s_.size() || (s_[i_] != '"' && s_[i_] != '\'')) fail("unquoted attribute " + key);
      const char quote = s_[i_++];
      const auto end = s_.find(quote, i_);
      if (end == std::string::npos) fail("unterminated attribute " + key);
      if (!e->attributes.emplace(key, decode(s_.substr(i_, end - i_))).second)
        fail("duplicate attribute " + key);
      i_ = end + 1;
    }
    for (;;) {
      const auto next = s_.find('<', i_);
      if (next == std::string::npos) fail("unclosed element <" + e->name + ">");
      e->text += decode(s_.substr(i_, next - i_));
      i_ = next;
      if (s_.compare(i_, 2, "</") == 0) {
        i_ += 2;
        const std::string closing = name();
        if (closing != e->name) fail("</" + closing + "> closes <" + e->name + ">");
        skip_space();
        if (i_ >= s_.size() || s_[i_] != '>') fail("bad end tag");
        ++i_;
        return e;
      }
      e->children.push_back(element());
    }
  }

  const std::string& s_;
  std::size_t i_ = 0;
};

inline std::unique_ptr<XmlElement> parse_xml(const std::string& text) { return XmlParser(text).parse(); }

}  // namespace remat::test
