#include "remat/models/state_dict.h"

#include <c10/util/Exception.h>
#include <caffe2/serialize/inline_container.h>

#include <algorithm>
#include <cerrno>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <functional>
#include <memory>
#include <new>
#include <unordered_map>
#include <utility>

#include "remat/base/text.h"

// What torch.save writes, and so what this reads (torch/serialization.py):
//  - zip format: an archive whose data.pkl is a pickle of the object, each tensor a REDUCE of
//    torch._utils._rebuild_tensor_v2 on a storage named by a persistent id
//    ('storage', torch.FloatStorage, key, location, numel) whose bytes are the record data/<key>.
//  - legacy format: five pickles in a row (magic number, format version 1001, sys_info, the
//    object with persistent ids ('storage', type, key, location, numel, view_metadata), the list
//    of storage keys), then for each key in that list an int64 element count and the raw bytes.
// Only the few globals a state dict needs are known; anything else is refused, so reading an
// untrusted file never runs more than this list.

namespace remat::models {
namespace {

[[noreturn]] void fail(const std::string& where, const std::string& what) {
  // Names and keys from the file, escaped: a NUL would cut the message short, and an escape
  // sequence would reach the terminal.
  throw StateDictError(printable(where + ": " + what));
}

// A bool storage's bytes are 0 or 1: torch reads any other byte as bool, which is undefined
// behaviour in C++ (the safetensors reader refuses them alike).
void check_bool_bytes(const std::string& path, const std::string& what, const uint8_t* bytes,
                      uint64_t size) {
  for (uint64_t i = 0; i < size; ++i) {
    if (bytes[i] > 1) {
      fail(path, what + " (bool) holds " + std::to_string(bytes[i]) + " at its byte " +
                     std::to_string(i) + "; a bool byte is 0 or 1");
    }
  }
}

// torch.save refuses to write one storage as two element types ("Cannot save multiple tensors
// or storages that view the same data as different types"); a file that does would let a
// storage checked as one type be read as another (float bytes as bool).
void check_same_dtype(const std::string& path, const std::string& what, at::ScalarType before,
                      at::ScalarType now) {
  if (now != before) {
    fail(path, what + " is read as " + c10::toString(now) + " here and as " +
                   c10::toString(before) + " before; one storage has one element type");
  }
}

// The unsigned integer of `width` bytes at `bytes`, little-endian unless said otherwise: pickle
// arguments and zip headers alike.
uint64_t decode_uint(const char* bytes, int width, bool big_endian = false) {
  uint64_t value = 0;
  for (int i = 0; i < width; ++i)
    value |= uint64_t{static_cast<unsigned char>(bytes[big_endian ? width - 1 - i : i])} << 8 * i;
  return value;
}

// Bytes read in order from a stream or from memory, with their position and size known, so that a
// truncated file is reported as such, with the offset, and a corrupt length can never make us
// allocate more than the file holds.
class Input {
 public:
  Input(std::istream& stream, uint64_t size, std::string where)
      : stream_(&stream), size_(size), where_(std::move(where)) {}
  // `data` (not copied) must outlive the Input.
  Input(const char* data, uint64_t size, std::string where)
      : data_(data), size_(size), where_(std::move(where)) {}

  const std::string& where() const { return where_; }
  uint64_t pos() const { return pos_; }
  uint64_t size() const { return size_; }
  uint64_t remaining() const { return size_ - pos_; }

  void need(uint64_t n, const std::string& what) const {
    if (n > remaining()) {
      fail(where_, "truncated file: " + what + " at byte " + std::to_string(pos_) + " needs " +
                       std::to_string(n) + " bytes, only " + std::to_string(remaining()) +
                       " remain (download or save it again)");
    }
  }
  void read(void* out, uint64_t n, const std::string& what) {
    need(n, what);
    if (data_ != nullptr) {
      if (n > 0) std::memcpy(out, data_ + pos_, n);
    } else {
      stream_->read(static_cast<char*>(out), static_cast<std::streamsize>(n));
      if (!*stream_) fail(where_, "read error at byte " + std::to_string(pos_));
    }
    pos_ += n;
  }
  std::string read_string(uint64_t n, const std::string& what) {
    need(n, what);  // before allocating
    std::string text(n, '\0');
    read(text.data(), n, what);
    return text;
  }
  uint64_t read_uint(int bytes, const std::string& what, bool big_endian = false) {
    char buffer[8];
    read(buffer, bytes, what);
    return decode_uint(buffer, bytes, big_endian);
  }
  std::string read_line(const std::string& what) {
    std::string line;
    for (char c; (c = static_cast<char>(read_uint(1, what))) != '\n';) {
      if (line.size() > 4096)
        fail(where_, what + " longer than 4096 bytes at byte " + std::to_string(pos_));
      line += c;
    }
    return line;
  }

 private:
  std::istream* stream_ = nullptr;
  const char* data_ = nullptr;
  uint64_t pos_ = 0;
  uint64_t size_;
  std::string where_;
};

struct Value;
using Items = std::vector<Value>;
struct Dict;

struct Value {
  enum class Kind {
    kNone,
    kBool,
    kInt,
    kBigInt,
    kFloat,
    kStr,
    kBytes,
    kTuple,
    kList,
    kDict,
    kGlobal,
    kStorage,
    kTensor
  };
  Kind kind = Kind::kNone;
  int64_t integer = 0;  // kBool, kInt
  double real = 0;      // kFloat
  // kStr, kBytes, kBigInt (little-endian two's complement), kGlobal ("module.name"), kStorage
  // (key). Shared, so that copying a value (DUP, a memo entry used again) never copies its text:
  // a few bytes of pickle could otherwise copy a long string millions of times.
  std::shared_ptr<const std::string> text;
  const std::string& str() const {
    static const std::string empty;
    return text ? *text : empty;
  }
  std::shared_ptr<Items> items;  // kTuple, kList; shared so that a memoized list sees APPENDs
  std::shared_ptr<Dict> dict;    // kDict (dict or OrderedDict)
  at::Storage storage;           // kStorage, bytes shared by every tensor that views it
  at::ScalarType dtype = at::kByte;
  torch::Tensor tensor;  // kTensor
};

using Kind = Value::Kind;

// Python's dict semantics: a key set again keeps its place and takes the new value.
struct Dict {
  std::vector<std::pair<Value, Value>> items;
  std::unordered_map<std::string, size_t> index;  // by hash_key()
};

Value make(Kind kind, int64_t integer = 0, std::string text = {}) {
  Value value;
  value.kind = kind;
  value.integer = integer;
  if (!text.empty()) value.text = std::make_shared<const std::string>(std::move(text));
  if (kind == Kind::kTuple || kind == Kind::kList) value.items = std::make_shared<Items>();
  if (kind == Kind::kDict) value.dict = std::make_shared<Dict>();
  return value;
}

std::string kind_name(const Value& value) {
  static const char* const names[] = {"None",   "bool",    "int",   "int",  "float",
                                      "str",    "bytes",   "tuple", "list", "dict",
                                      "global", "storage", "tensor"};
  const std::string name = names[static_cast<int>(value.kind)];
  return value.kind == Kind::kGlobal ? name + " " + value.str() : name;
}

// "an int", "a list", "None": for messages.
std::string a_kind(const Value& value) {
  const std::string kind = kind_name(value);
  if (value.kind == Kind::kNone) return kind;
  return (std::string("aeiou").find(kind[0]) == std::string::npos ? "a " : "an ") + kind;
}

// The longest dict key hash_key() makes. Keys of a state dict are names of a few dozen bytes;
// the cap bounds the memory and time a hostile key can take (a tuple of tuples sharing memo
// entries doubles its size with every two bytes of pickle).
constexpr size_t kMaxKeyBytes = 4096;

enum class KeyHash { kOk, kUnhashable, kTooLong };

// A string equal for two keys exactly when Python finds them equal (bool and int alike):
// kUnhashable for a list or a dict, kTooLong above kMaxKeyBytes. Iterative, so that a tuple
// nested to any depth cannot overflow the call stack.
KeyHash hash_key(const Value& key, std::string& out) {
  const auto tagged = [&](char tag, const std::string& text) {
    out += tag + std::to_string(text.size()) + ":";
    if (text.size() > kMaxKeyBytes) return false;
    out += text;
    return true;
  };
  // Each open tuple and the index of its next item.
  std::vector<std::pair<const Items*, size_t>> open;
  const Value* next = &key;
  for (;;) {
    if (next != nullptr) {
      bool ok = true;
      switch (next->kind) {
        case Kind::kNone:
          ok = tagged('N', "");
          break;
        case Kind::kBool:
        case Kind::kInt:
          ok = tagged('i', std::to_string(next->integer));
          break;
        case Kind::kBigInt:
          ok = tagged('L', next->str());
          break;
        case Kind::kFloat: {
          uint64_t bits = 0;
          std::memcpy(&bits, &next->real, sizeof bits);
          ok = tagged('f', std::to_string(bits));
          break;
        }
        case Kind::kStr:
          ok = tagged('s', next->str());
          break;
        case Kind::kBytes:
          ok = tagged('b', next->str());
          break;
        case Kind::kTuple:
          out += "t(";
          open.emplace_back(next->items.get(), 0);
          break;
        default:
          return KeyHash::kUnhashable;
      }
      if (!ok || out.size() > kMaxKeyBytes) return KeyHash::kTooLong;
    }
    if (open.empty()) return KeyHash::kOk;
    auto& [items, index] = open.back();
    if (index < items->size()) {
      next = &(*items)[index++];
    } else {
      out += ")";
      open.pop_back();
      next = nullptr;
    }
  }
}

const Value* find_str_key(const Dict& dict, const std::string& name) {
  std::string key;
  if (hash_key(make(Kind::kStr, 0, name), key) != KeyHash::kOk) return nullptr;
  const auto it = dict.index.find(key);
  return it == dict.index.end() ? nullptr : &dict.items[it->second].second;
}

const std::unordered_map<std::string, at::ScalarType>& storage_types() {
  static const std::unordered_map<std::string, at::ScalarType> types = {
      {"torch.FloatStorage", at::kFloat},
      {"torch.DoubleStorage", at::kDouble},
      {"torch.HalfStorage", at::kHalf},
      {"torch.BFloat16Storage", at::kBFloat16},
      {"torch.LongStorage", at::kLong},
      {"torch.IntStorage", at::kInt},
      {"torch.ShortStorage", at::kShort},
      {"torch.CharStorage", at::kChar},
      {"torch.ByteStorage", at::kByte},
      {"torch.BoolStorage", at::kBool},
      {"torch.ComplexFloatStorage", at::kComplexFloat},
      {"torch.ComplexDoubleStorage", at::kComplexDouble},
  };
  return types;
}

bool is_known_function(const std::string& name) {
  return name == "collections.OrderedDict" || name == "torch._utils._rebuild_tensor_v2" ||
         name == "torch._utils._rebuild_parameter" ||
         name == "torch._utils._rebuild_parameter_with_state";
}

// A storage named by a persistent id; its bytes come from the caller (a zip record, or the data
// after the legacy pickles).
struct StorageId {
  std::string key;
  at::ScalarType dtype;
  int64_t numel;
};
using StorageLoader = std::function<at::Storage(const StorageId&)>;

// Caps on what a pickle may build, so that the memory a file takes stays proportional to its size
// (a value costs about 150 bytes). A state dict's pickle makes about a dozen values per tensor and
// keeps few on its stack (a SETITEMS of at most 1,000 entries) and in its memo (one entry per
// string, storage and tensor); the largest state dicts have some thousands of tensors.
constexpr size_t kMaxStack = size_t{1} << 20;  // values on the stack, and MARKs
constexpr size_t kMaxMemo = size_t{1} << 20;   // memo entries
// Values built by a pickle that takes `stored_bytes` in the file. Each opcode builds at most one
// value, so an uncompressed pickle (what torch.save writes) never reaches this; a compressed one
// would otherwise build up to 1,032 values per byte of the file.
uint64_t max_values_for(uint64_t stored_bytes) { return 16 * stored_bytes + (uint64_t{1} << 16); }

// A pickle virtual machine for the opcodes of protocols 2 to 5 that torch.save emits, building
// Values; REDUCE runs only the known functions above.
class Unpickler {
 public:
  // At most `max_values` values built, over all the pickles read.
  Unpickler(Input& in, StorageLoader load_storage, uint64_t max_values)
      : in_(in), load_storage_(std::move(load_storage)), max_values_(max_values) {}
  Unpickler(const Unpickler&) = delete;
  Unpickler& operator=(const Unpickler&) = delete;

  // A corrupt pickle can make a list or dict hold itself, a cycle of shared_ptrs never freed:
  // empty every container made. So no Value from load() may be used after the Unpickler.
  ~Unpickler() {
    for (const Value& value : containers_) {
      if (value.items) value.items->clear();
      if (value.dict) value.dict->items.clear();
    }
  }

  // Reads one pickle, up to its STOP; a file may hold several in a row. Every failure is a
  // StateDictError with the opcode's offset, an allocation failure included.
  Value load() {
    stack_.clear();
    marks_.clear();
    memo_.clear();
    for (Value result;;) {
      op_pos_ = in_.pos();
      try {
        if (run_op(result)) return result;
      } catch (const StateDictError&) {
        throw;
      } catch (const std::bad_alloc&) {
        error("out of memory");
      } catch (const c10::Error& e) {  // from LibTorch, allocating or viewing a storage
        error(e.what_without_backtrace());
      }
    }
  }

 private:
  // Runs the opcode at the input's position; true, with the pickle's value, at its STOP.
  bool run_op(Value& result) {
    {
      const auto op = static_cast<unsigned char>(read(1));
      switch (op) {
        case 0x80: {  // PROTO
          const uint64_t protocol = read(1);
          if (protocol > 5) error("pickle protocol " + std::to_string(protocol) + " is unknown");
          break;
        }
        case 0x95:  // FRAME: a buffering hint
          read(8);
          break;
        case '(':  // MARK
          if (marks_.size() >= kMaxStack) {
            error("more than " + std::to_string(kMaxStack) + " MARKs open");
          }
          marks_.push_back(stack_.size());
          break;
        case '.':  // STOP
          result = pop();
          return true;
        case '0':  // POP
          pop();
          break;
        case '1':  // POP_MARK
          pop_mark();
          break;
        case '2':  // DUP
          push(top());
          break;
        case 'N':  // NONE
          push(make(Kind::kNone));
          break;
        case 0x88:  // NEWTRUE
        case 0x89:  // NEWFALSE
          push(make(Kind::kBool, op == 0x88));
          break;
        case 'J':  // BININT
          push(make(Kind::kInt, static_cast<int32_t>(read(4))));
          break;
        case 'K':  // BININT1
          push(make(Kind::kInt, read(1)));
          break;
        case 'M':  // BININT2
          push(make(Kind::kInt, read(2)));
          break;
        case 0x8a:  // LONG1
          push(make_long(in_.read_string(read(1), "LONG1")));
          break;
        case 0x8b:  // LONG4
          push(make_long(in_.read_string(read_length(4), "LONG4")));
          break;
        case 'G': {  // BINFLOAT
          const uint64_t bits = in_.read_uint(8, "BINFLOAT", /*big_endian=*/true);
          Value value = make(Kind::kFloat);
          std::memcpy(&value.real, &bits, sizeof bits);
          push(std::move(value));
          break;
        }
        case 0x8c:  // SHORT_BINUNICODE
        case 'U':   // SHORT_BINSTRING
          push(read_text(Kind::kStr, 1));
          break;
        case 'X':  // BINUNICODE
        case 'T':  // BINSTRING
          push(read_text(Kind::kStr, 4));
          break;
        case 0x8d:  // BINUNICODE8
          push(read_text(Kind::kStr, 8));
          break;
        case 'C':  // SHORT_BINBYTES
          push(read_text(Kind::kBytes, 1));
          break;
        case 'B':  // BINBYTES
          push(read_text(Kind::kBytes, 4));
          break;
        case 0x8e:  // BINBYTES8
          push(read_text(Kind::kBytes, 8));
          break;
        case ')':  // EMPTY_TUPLE
          push(container(Kind::kTuple));
          break;
        case 't':  // TUPLE
          push(container(Kind::kTuple, pop_mark()));
          break;
        case 0x85:    // TUPLE1
        case 0x86:    // TUPLE2
        case 0x87: {  // TUPLE3
          const size_t n = op - 0x84;
          if (stack_.size() < stack_floor() + n) error("pickle stack underflow");
          Items items(std::make_move_iterator(stack_.end() - n),
                      std::make_move_iterator(stack_.end()));
          stack_.resize(stack_.size() - n);
          push(container(Kind::kTuple, std::move(items)));
          break;
        }
        case ']':  // EMPTY_LIST
          push(container(Kind::kList));
          break;
        case 'l':  // LIST
          push(container(Kind::kList, pop_mark()));
          break;
        case 'a': {  // APPEND
          Value item = pop();
          list_on_top().push_back(std::move(item));
          break;
        }
        case 'e': {  // APPENDS
          Items items = pop_mark();
          Items& list = list_on_top();
          for (Value& item : items) list.push_back(std::move(item));
          break;
        }
        case '}':  // EMPTY_DICT
          push(container(Kind::kDict));
          break;
        case 'd': {  // DICT
          Items items = pop_mark();
          push(container(Kind::kDict));
          set_items(std::move(items));
          break;
        }
        case 's': {  // SETITEM
          Value value = pop();
          Value key = pop();
          set_items({std::move(key), std::move(value)});
          break;
        }
        case 'u':  // SETITEMS
          set_items(pop_mark());
          break;
        case 'c': {  // GLOBAL
          const std::string module = in_.read_line("GLOBAL module");
          push(make_global(module, in_.read_line("GLOBAL name")));
          break;
        }
        case 0x93: {  // STACK_GLOBAL
          const Value name = pop();
          const Value module = pop();
          if (module.kind != Kind::kStr || name.kind != Kind::kStr) {
            error("STACK_GLOBAL of non-str");
          }
          push(make_global(module.str(), name.str()));
          break;
        }
        case 'R':     // REDUCE
        case 0x81: {  // NEWOBJ: cls.__new__(cls, *args), the same as REDUCE for OrderedDict
          const Value args = pop();
          const Value callable = pop();
          push(call(callable, args));
          break;
        }
        case 'b':  // BUILD
          // OrderedDict's state is its attributes: a state dict's `_metadata` (module versions),
          // which loading into LibTorch modules does not use.
          pop();
          if (top().kind != Kind::kDict) error("BUILD (setting the state) of " + a_kind(top()));
          break;
        case 'q':  // BINPUT
          memo_put(read(1));
          break;
        case 'r':  // LONG_BINPUT
          memo_put(read(4));
          break;
        case 0x94:  // MEMOIZE
          memo_put(memo_.size());
          break;
        case 'h':  // BINGET
          push(memo_get(read(1)));
          break;
        case 'j':  // LONG_BINGET
          push(memo_get(read(4)));
          break;
        case 'Q':  // BINPERSID
          push(persistent_load(pop()));
          break;
        default: {
          char hex[8];
          std::snprintf(hex, sizeof hex, "0x%02x", op);
          error(std::string("unsupported pickle opcode ") + hex);
        }
      }
    }
    return false;
  }

  // `detail` goes after the offset: a hint on what to do.
  [[noreturn]] void error(const std::string& what, const std::string& detail = "") const {
    fail(in_.where(), what + " at byte " + std::to_string(op_pos_) + detail);
  }

  uint64_t read(int bytes) { return in_.read_uint(bytes, "pickle opcode argument"); }
  uint64_t read_length(int bytes) {
    const uint64_t length = read(bytes);
    // BINSTRING and LONG4 lengths are signed; nothing in a state dict's pickle nears 2 GiB.
    if (bytes == 4 && length > 0x7fffffff) error("negative length");
    return length;
  }
  Value read_text(Kind kind, int length_bytes) {
    return make(kind, 0, in_.read_string(read_length(length_bytes), "pickled string"));
  }

  // Python ints of more than 8 bytes only appear as the legacy magic number: kept as bytes.
  static Value make_long(const std::string& bytes) {
    if (bytes.size() > 8) return make(Kind::kBigInt, 0, bytes);
    uint64_t value = 0;
    for (size_t i = 0; i < bytes.size(); ++i) {
      value |= uint64_t{static_cast<unsigned char>(bytes[i])} << 8 * i;
    }
    if (!bytes.empty() && bytes.size() < 8 && (static_cast<unsigned char>(bytes.back()) & 0x80)) {
      value |= ~uint64_t{0} << 8 * bytes.size();  // sign extension
    }
    return make(Kind::kInt, static_cast<int64_t>(value));
  }

  Value container(Kind kind, Items items = {}) {
    Value value = make(kind);
    if (value.items) *value.items = std::move(items);
    containers_.push_back(value);
    return value;
  }

  // Items above the innermost MARK belong to it: popping them otherwise means a corrupt pickle.
  size_t stack_floor() const { return marks_.empty() ? 0 : marks_.back(); }
  void push(Value value) {
    // Every value the pickle builds is pushed: counting pushes bounds them all.
    if (++values_ > max_values_) {
      error("the pickle builds more than " + std::to_string(max_values_) +
            " values, more than a file of its size can honestly need");
    }
    if (stack_.size() >= kMaxStack) {
      error("pickle stack deeper than " + std::to_string(kMaxStack) + " values");
    }
    stack_.push_back(std::move(value));
  }
  void memo_put(uint64_t key) {
    if (memo_.size() >= kMaxMemo && memo_.count(key) == 0) {
      error("pickle memo larger than " + std::to_string(kMaxMemo) + " entries");
    }
    memo_[key] = top();
  }
  Value& top() {
    if (stack_.size() <= stack_floor()) error("pickle stack underflow");
    return stack_.back();
  }
  Value pop() {
    Value value = std::move(top());
    stack_.pop_back();
    return value;
  }
  Items pop_mark() {
    if (marks_.empty()) error("no MARK for this opcode");
    Items items(std::make_move_iterator(stack_.begin() + marks_.back()),
                std::make_move_iterator(stack_.end()));
    stack_.resize(marks_.back());
    marks_.pop_back();
    return items;
  }
  Items& list_on_top() {
    if (top().kind != Kind::kList) error("APPEND to " + a_kind(top()));
    return *top().items;
  }
  void set_items(Items pairs) {
    if (top().kind != Kind::kDict) error("SETITEM on " + a_kind(top()));
    if (pairs.size() % 2 != 0) error("odd number of items for SETITEMS");
    Dict& dict = *top().dict;
    for (size_t i = 0; i < pairs.size(); i += 2) {
      std::string key;
      switch (hash_key(pairs[i], key)) {
        case KeyHash::kOk:
          break;
        case KeyHash::kUnhashable:
          error("unhashable dict key (" + kind_name(pairs[i]) + ")");
        case KeyHash::kTooLong:
          error("dict key (" + kind_name(pairs[i]) + ") longer than " +
                std::to_string(kMaxKeyBytes) + " bytes");
      }
      const auto [it, inserted] = dict.index.emplace(key, dict.items.size());
      if (inserted) {
        dict.items.emplace_back(std::move(pairs[i]), std::move(pairs[i + 1]));
      } else {
        dict.items[it->second].second = std::move(pairs[i + 1]);
      }
    }
  }
  const Value& memo_get(uint64_t key) {
    const auto it = memo_.find(key);
    if (it == memo_.end()) error("memo entry " + std::to_string(key) + " used before it was set");
    return it->second;
  }

  Value make_global(const std::string& module, const std::string& name) {
    std::string full = module + "." + name;
    if (!is_known_function(full) && storage_types().count(full) == 0) {
      error("unsupported global '" + full + "'",
            module.rfind("__torch__", 0) == 0
                ? " (this is a TorchScript archive: load it with torch::jit::load)"
                : ": a state dict holds only tensors, dicts and plain values (save "
                  "model.state_dict() rather than the model or other objects)");
    }
    return make(Kind::kGlobal, 0, std::move(full));
  }

  Value call(const Value& callable, const Value& args) {
    if (callable.kind != Kind::kGlobal) error("call of " + a_kind(callable));
    if (args.kind != Kind::kTuple) error("arguments of " + callable.str() + " are not a tuple");
    const Items& arg = *args.items;
    const std::string& name = callable.str();
    if (name == "collections.OrderedDict") {
      if (!arg.empty()) error("OrderedDict with arguments");
      return container(Kind::kDict);
    }
    if (name == "torch._utils._rebuild_tensor_v2") return rebuild_tensor(arg);
    if (name == "torch._utils._rebuild_parameter" ||
        name == "torch._utils._rebuild_parameter_with_state") {
      if (arg.empty() || arg[0].kind != Kind::kTensor) error(name + " of a non-tensor");
      return arg[0];
    }
    error("call of " + name + ", which is not a function");
  }

  int64_t to_int(const Value& value, const std::string& what) {
    if (value.kind == Kind::kBigInt) error(what + " does not fit in 64 bits");
    if (value.kind != Kind::kInt) error(what + " is " + a_kind(value) + ", not an int");
    return value.integer;
  }
  std::vector<int64_t> to_ints(const Value& value, const std::string& what) {
    if (value.kind != Kind::kTuple) error(what + " is " + a_kind(value) + ", not a tuple");
    std::vector<int64_t> ints;
    for (const Value& item : *value.items) ints.push_back(to_int(item, what + " element"));
    return ints;
  }

  // _rebuild_tensor_v2(storage, storage_offset, size, stride, requires_grad, backward_hooks[,
  // metadata]): a view of the storage.
  Value rebuild_tensor(const Items& arg) {
    if (arg.size() != 6 && arg.size() != 7) error("_rebuild_tensor_v2 with a wrong argument count");
    const Value& storage = arg[0];
    if (storage.kind != Kind::kStorage) error("_rebuild_tensor_v2 of " + a_kind(storage));
    const int64_t offset = to_int(arg[1], "storage offset");
    const std::vector<int64_t> sizes = to_ints(arg[2], "tensor size");
    const std::vector<int64_t> strides = to_ints(arg[3], "tensor stride");
    if (sizes.size() != strides.size()) error("tensor size and stride of different lengths");
    // Checked here because set_ would grow the storage (or fail deep in ATen) for a corrupt size,
    // stride or offset instead of saying what is wrong.
    const auto capacity =
        static_cast<int64_t>(storage.storage.nbytes() / c10::elementSize(storage.dtype));
    bool empty = false;
    int64_t last = offset;
    bool bad = offset < 0;
    for (size_t d = 0; d < sizes.size(); ++d) {
      int64_t step = 0;
      bad = bad || sizes[d] < 0 || strides[d] < 0;
      if (sizes[d] == 0) empty = true;
      if (bad || empty) continue;
      bad = __builtin_mul_overflow(sizes[d] - 1, strides[d], &step) ||
            __builtin_add_overflow(last, step, &last);
    }
    if (bad || (!empty && last >= capacity)) {
      error("tensor of size " + c10::str(c10::IntArrayRef(sizes)) + ", stride " +
            c10::str(c10::IntArrayRef(strides)) + " at offset " + std::to_string(offset) +
            " does not fit its storage '" + storage.str() + "' of " + std::to_string(capacity) +
            " elements");
    }
    Value value = make(Kind::kTensor);
    value.tensor = torch::empty({0}, torch::TensorOptions().dtype(storage.dtype));
    value.tensor.set_(storage.storage, offset, sizes, strides);
    return value;
  }

  // ('storage', storage type, key, location, numel) in zip files, with a sixth field
  // view_metadata (None since torch 0.4) in legacy ones.
  Value persistent_load(const Value& pid) {
    const Items* fields = pid.kind == Kind::kTuple ? pid.items.get() : nullptr;
    if (fields == nullptr || (fields->size() != 5 && fields->size() != 6) ||
        (*fields)[0].kind != Kind::kStr || (*fields)[0].str() != "storage" ||
        (*fields)[1].kind != Kind::kGlobal || (*fields)[2].kind != Kind::kStr) {
      error("persistent id that is not ('storage', type, key, location, numel)");
    }
    if (fields->size() == 6 && (*fields)[5].kind != Kind::kNone) {
      error("storage view (written by torch older than 0.4)");
    }
    const auto type = storage_types().find((*fields)[1].str());
    if (type == storage_types().end()) error("storage of type " + (*fields)[1].str());
    const StorageId id{(*fields)[2].str(), type->second, to_int((*fields)[4], "storage size")};
    if (id.numel < 0) error("negative storage size");
    Value value = make(Kind::kStorage, 0, id.key);
    value.storage = load_storage_(id);
    value.dtype = id.dtype;
    return value;
  }

  Input& in_;
  StorageLoader load_storage_;
  std::vector<Value> stack_;
  std::vector<size_t> marks_;  // stack sizes at each MARK
  std::unordered_map<uint64_t, Value> memo_;
  std::vector<Value> containers_;  // every tuple, list and dict made
  uint64_t op_pos_ = 0;
  uint64_t max_values_;
  uint64_t values_ = 0;
};

// Why `value` is not a state dict, or "" when it is a dict of str -> tensor.
std::string why_not_state_dict(const Value& value) {
  if (value.kind != Kind::kDict) return "it is " + a_kind(value);
  for (const auto& [key, item] : value.dict->items) {
    if (key.kind != Kind::kStr) return "it has a key of type " + kind_name(key);
    if (item.kind != Kind::kTensor) return "'" + key.str() + "' holds " + a_kind(item);
  }
  return "";
}

std::vector<StateDictEntry> state_dict_entries(const Value& top, const std::string& path) {
  if (top.kind != Kind::kDict) {
    fail(path, "the file holds " + a_kind(top) + ", not a state dict (a dict of tensors)");
  }
  const std::string why = why_not_state_dict(top);
  const Value* state_dict = why.empty() ? &top : nullptr;
  for (const std::string wrapper : {"state_dict", "model"}) {
    const Value* inner = state_dict ? nullptr : find_str_key(*top.dict, wrapper);
    if (inner == nullptr) continue;
    const std::string inner_why = why_not_state_dict(*inner);
    if (!inner_why.empty()) {
      fail(path, "the checkpoint's '" + wrapper + "' entry is not a state dict: " + inner_why);
    }
    state_dict = inner;
  }
  if (state_dict == nullptr) {
    fail(path, "the top-level dict is not a state dict (" + why +
                   ") and has no 'state_dict' or 'model' entry");
  }
  std::vector<StateDictEntry> entries;
  for (const auto& [key, item] : state_dict->dict->items)
    entries.push_back({key.str(), item.tensor});
  return entries;
}

// A zip archive's entry as its central directory declares it.
struct ZipEntry {
  uint64_t header = 0;      // offset of its local header
  uint64_t data = 0;        // offset of its (compressed) bytes
  uint64_t compressed = 0;  // bytes in the file
  uint64_t size = 0;        // bytes once decompressed: what LibTorch allocates to read it
};

// The most a deflated stream can expand: 1,032 times (258 bytes from each 2-bit code, less
// the block headers), plus a small constant.
constexpr uint64_t kMaxDeflateRatio = 1032;

uint64_t le(const std::string& bytes, size_t at, int width) {
  return decode_uint(bytes.data() + at, width);
}

// Checks the sizes a zip archive declares before LibTorch allocates anything from them (it
// allocates each record's declared decompressed size, then reads): every entry lies inside the
// file, no two entries share bytes, and no entry expands beyond what its compression can give.
// So the records LibTorch reads take at most the file's size, or 1,032 times it when deflated.
// Returns the entries by name less the archive's top folder ("data.pkl", "data/0").
std::unordered_map<std::string, ZipEntry> check_zip(std::istream& file, uint64_t file_size,
                                                    const std::string& path) {
  const auto bad = [&](uint64_t offset, const std::string& what) {
    fail(path, "not a zip archive written by torch.save, or a truncated one (" + what +
                   " at byte " + std::to_string(offset) + ")");
  };
  const auto read_at = [&](uint64_t offset, uint64_t n, const std::string& what) {
    if (offset > file_size || n > file_size - offset) bad(offset, what + " beyond the end");
    std::string bytes(n, '\0');
    file.clear();
    file.seekg(static_cast<std::streamoff>(offset));
    file.read(bytes.data(), static_cast<std::streamsize>(n));
    if (!file) fail(path, "read error at byte " + std::to_string(offset));
    return bytes;
  };
  // The end of central directory record: 22 bytes and a comment of up to 65,535.
  const uint64_t tail_size = std::min<uint64_t>(file_size, 22 + 65535);
  const std::string tail = read_at(file_size - tail_size, tail_size, "the end record");
  size_t end = std::string::npos;
  for (size_t i = tail_size >= 22 ? tail_size - 22 + 1 : 0; i-- > 0;) {
    if (tail.compare(i, 4, "PK\x05\x06") == 0) {
      end = i;
      break;
    }
  }
  if (end == std::string::npos) bad(file_size, "no end of central directory record");
  const uint64_t end_offset = file_size - tail_size + end;
  uint64_t count = le(tail, end + 10, 2);
  uint64_t directory_size = le(tail, end + 12, 4);
  uint64_t directory = le(tail, end + 16, 4);
  if (count == 0xffff || directory_size == 0xffffffff || directory == 0xffffffff) {  // zip64
    if (end_offset < 20) bad(end_offset, "no zip64 locator");
    const std::string locator = read_at(end_offset - 20, 20, "the zip64 locator");
    if (locator.compare(0, 4, "PK\x06\x07") != 0) bad(end_offset - 20, "no zip64 locator");
    const uint64_t record_offset = le(locator, 8, 8);
    const std::string record = read_at(record_offset, 56, "the zip64 end record");
    if (record.compare(0, 4, "PK\x06\x06") != 0) bad(record_offset, "no zip64 end record");
    count = le(record, 32, 8);
    directory_size = le(record, 40, 8);
    directory = le(record, 48, 8);
  }
  if (directory > end_offset || directory_size > end_offset - directory) {
    bad(end_offset, "central directory beyond the end");
  }
  if (count > directory_size / 46) bad(end_offset, "more entries than the central directory holds");
  const std::string entries = read_at(directory, directory_size, "the central directory");
  std::unordered_map<std::string, ZipEntry> by_name;
  std::vector<ZipEntry> all;
  size_t at = 0;
  for (uint64_t i = 0; i < count; ++i) {
    const uint64_t offset = directory + at;
    if (entries.size() - at < 46 || entries.compare(at, 4, "PK\x01\x02") != 0) {
      bad(offset, "central directory entry " + std::to_string(i) + " is corrupt");
    }
    const uint64_t method = le(entries, at + 10, 2);
    ZipEntry entry;
    entry.compressed = le(entries, at + 20, 4);
    entry.size = le(entries, at + 24, 4);
    const uint64_t name_size = le(entries, at + 28, 2);
    const uint64_t extra_size = le(entries, at + 30, 2);
    const uint64_t comment_size = le(entries, at + 32, 2);
    entry.header = le(entries, at + 42, 4);
    if (entries.size() - at - 46 < name_size + extra_size + comment_size) {
      bad(offset, "central directory entry " + std::to_string(i) + " is corrupt");
    }
    const std::string name = entries.substr(at + 46, name_size);
    // The zip64 extra field holds, in this order, each of the sizes and the offset that the
    // fixed fields mark 0xffffffff.
    for (size_t e = at + 46 + name_size; e + 4 <= at + 46 + name_size + extra_size;) {
      const uint64_t id = le(entries, e, 2);
      const uint64_t length = le(entries, e + 2, 2);
      if (e + 4 + length > at + 46 + name_size + extra_size) break;
      if (id == 0x0001) {
        size_t field = e + 4;
        for (uint64_t* value : {&entry.size, &entry.compressed, &entry.header}) {
          if (*value != 0xffffffff) continue;
          if (field + 8 > e + 4 + length) bad(offset, "zip64 field of " + name + " is short");
          *value = le(entries, field, 8);
          field += 8;
        }
      }
      e += 4 + length;
    }
    at += 46 + name_size + extra_size + comment_size;
    if (method != 0 && method != 8) {
      bad(offset, "record " + name + " is compressed with method " + std::to_string(method) +
                      ", not stored or deflated");
    }
    if (method == 0 ? entry.size != entry.compressed
                    : entry.compressed > file_size ||
                          entry.size > kMaxDeflateRatio * entry.compressed + 1024) {
      bad(offset, "record " + name + " declares " + std::to_string(entry.size) + " bytes from " +
                      std::to_string(entry.compressed) + " in the file");
    }
    const std::string local = read_at(entry.header, 30, "the local header of " + name);
    if (local.compare(0, 4, "PK\x03\x04") != 0) bad(entry.header, "no local header for " + name);
    entry.data = entry.header + 30 + le(local, 26, 2) + le(local, 28, 2);
    if (entry.data > directory || entry.compressed > directory - entry.data) {
      bad(entry.header, "record " + name + " runs past the central directory");
    }
    const size_t slash = name.find('/');
    by_name[slash == std::string::npos ? name : name.substr(slash + 1)] = entry;
    all.push_back(entry);
  }
  std::sort(all.begin(), all.end(),
            [](const ZipEntry& a, const ZipEntry& b) { return a.header < b.header; });
  for (size_t i = 1; i < all.size(); ++i) {
    if (all[i].header < all[i - 1].data + all[i - 1].compressed) {
      bad(all[i].header, "two records share bytes");
    }
  }
  file.clear();
  file.seekg(0);
  return by_name;
}

std::vector<StateDictEntry> read_zip(std::istream& file, uint64_t file_size,
                                     const std::string& path) {
  const std::unordered_map<std::string, ZipEntry> zip = check_zip(file, file_size, path);
  std::unique_ptr<caffe2::serialize::PyTorchStreamReader> reader;
  try {
    reader = std::make_unique<caffe2::serialize::PyTorchStreamReader>(path);
  } catch (const c10::Error& e) {
    fail(path, std::string("not a zip archive written by torch.save, or a truncated one (") +
                   e.what_without_backtrace() + ")");
  }
  const auto record = [&](const std::string& name) {
    const auto entry = zip.find(name);
    if (!reader->hasRecord(name) || entry == zip.end()) fail(path, "record " + name + " missing");
    try {
      return reader->getRecord(name);
    } catch (const c10::Error& e) {
      fail(path, "record " + name + " at byte " + std::to_string(entry->second.header) + ": " +
                     e.what_without_backtrace());
    }
  };
  // torch >= 2.0 writes the byte order; files without one are little-endian.
  if (reader->hasRecord("byteorder")) {
    const auto [data, size] = record("byteorder");
    const std::string order(static_cast<const char*>(data.get()), size);
    if (order == "big")
      fail(path, "written on a big-endian machine; save it again on a little-endian one");
    if (order != "little")
      fail(path, "its byteorder record is neither \"little\" nor \"big\" but \"" +
                     printable(order.substr(0, 40)) + (order.size() > 40 ? "...\"" : "\""));
  }
  const auto [pickle, pickle_size] = record("data.pkl");
  // Read where LibTorch put it, not copied again.
  Input in(static_cast<const char*>(pickle.get()), pickle_size, path + ": data.pkl");
  std::unordered_map<std::string, std::pair<at::Storage, at::ScalarType>> storages;
  // Storages shared by several tensors (views) are read once.
  const auto load_storage = [&](const StorageId& id) {
    if (const auto it = storages.find(id.key); it != storages.end()) {
      check_same_dtype(path, "record data/" + id.key, it->second.second, id.dtype);
      return it->second.first;
    }
    auto [data, size] = record("data/" + id.key);
    uint64_t needed = 0;
    if (__builtin_mul_overflow(static_cast<uint64_t>(id.numel), c10::elementSize(id.dtype),
                               &needed) ||
        size < needed) {
      fail(path, "record data/" + id.key + " holds " + std::to_string(size) +
                     " bytes, less than its storage of " + std::to_string(id.numel) +
                     " elements needs");
    }
    if (id.dtype == at::kBool)
      check_bool_bytes(path, "record data/" + id.key, static_cast<const uint8_t*>(data.get()),
                       needed);
    const at::Storage storage(c10::Storage::use_byte_size_t(), static_cast<int64_t>(size),
                              std::move(data), /*allocator=*/nullptr, /*resizable=*/false);
    return storages.emplace(id.key, std::make_pair(storage, id.dtype)).first->second.first;
  };
  Unpickler unpickler(in, load_storage, max_values_for(zip.at("data.pkl").compressed));
  const Value top = unpickler.load();
  return state_dict_entries(top, path);
}

[[noreturn]] void not_a_torch_file(const std::string& path) {
  fail(path, "not a PyTorch file (no zip archive and no legacy magic number)");
}

std::vector<StateDictEntry> read_legacy(std::istream& file, uint64_t size,
                                        const std::string& path) {
  Input in(file, size, path);
  // The storages' bytes follow the pickles: allocate them when a tensor names them, fill later.
  struct Pending {
    torch::Tensor bytes;
    int64_t numel;
    at::ScalarType dtype;
    bool filled = false;
  };
  std::unordered_map<std::string, Pending> pending;
  uint64_t pending_bytes = 0;  // with the 8-byte size before each storage's bytes
  bool in_header = true;
  const auto allocate_storage = [&](const StorageId& id) {
    if (in_header) fail(path, "storage '" + id.key + "' in a header pickle of the legacy format");
    auto it = pending.find(id.key);
    if (it != pending.end()) {
      check_same_dtype(path, "storage '" + id.key + "'", it->second.dtype, id.dtype);
    } else {
      const auto element_size = static_cast<int64_t>(c10::elementSize(id.dtype));
      // All the storages named so far must fit in what is left of the file: so together they
      // never take more memory than the file's size.
      const uint64_t available = in.remaining() - std::min(pending_bytes, in.remaining());
      if (static_cast<uint64_t>(id.numel) > in.remaining() / element_size ||
          8 + static_cast<uint64_t>(id.numel * element_size) > available) {
        fail(path, "truncated file: storage '" + id.key +
                       "' needs more bytes than the file holds (download or save it again)");
      }
      pending_bytes += 8 + id.numel * element_size;
      torch::Tensor bytes = torch::empty({id.numel * element_size}, at::kByte);
      it = pending.emplace(id.key, Pending{bytes, id.numel, id.dtype}).first;
    }
    return it->second.bytes.storage();
  };
  Unpickler unpickler(in, allocate_storage, max_values_for(size));

  Value magic;
  try {
    magic = unpickler.load();
  } catch (const StateDictError&) {
    not_a_torch_file(path);
  }
  // 0x1950a86a20f9469cfc6c as Python's LONG1 writes it.
  if (magic.kind != Kind::kBigInt || magic.str() != "\x6c\xfc\x9c\x46\xf9\x20\x6a\xa8\x50\x19") {
    not_a_torch_file(path);
  }
  const Value version = unpickler.load();
  if (version.kind != Kind::kInt || version.integer != 1001) {
    fail(path, "legacy format version is not 1001 (written by torch older than 0.4?)");
  }
  const Value sys_info = unpickler.load();
  const Value* little_endian =
      sys_info.kind == Kind::kDict ? find_str_key(*sys_info.dict, "little_endian") : nullptr;
  if (little_endian != nullptr && little_endian->kind == Kind::kBool && !little_endian->integer) {
    fail(path, "written on a big-endian machine; save it again on a little-endian one");
  }
  in_header = false;
  const Value top = unpickler.load();
  in_header = true;
  const Value keys = unpickler.load();
  if (keys.kind != Kind::kList) fail(path, "the legacy storage key list is " + a_kind(keys));
  for (const Value& key : *keys.items) {
    const auto it = key.kind == Kind::kStr ? pending.find(key.str()) : pending.end();
    if (it == pending.end()) fail(path, "the legacy storage key list names an unused storage");
    Pending& storage = it->second;
    const std::string what = "storage '" + key.str() + "'";
    const auto numel = static_cast<int64_t>(in.read_uint(8, "the size of " + what));
    if (numel != storage.numel || storage.filled) {
      fail(path, what + " has " + std::to_string(numel) +
                     " elements in the file, the pickle says " + std::to_string(storage.numel));
    }
    in.read(storage.bytes.data_ptr<uint8_t>(), storage.bytes.numel(), what);
    if (storage.dtype == at::kBool)
      check_bool_bytes(path, what, storage.bytes.data_ptr<uint8_t>(),
                       static_cast<uint64_t>(storage.bytes.numel()));
    storage.filled = true;
  }
  for (const auto& [key, storage] : pending) {
    if (!storage.filled) fail(path, "storage '" + key + "' missing from the legacy storage data");
  }
  return state_dict_entries(top, path);
}

}  // namespace

std::vector<StateDictEntry> read_state_dict(const std::string& path) {
  std::ifstream file(path, std::ios::binary);
  if (!file) fail(path, std::string("cannot open: ") + std::strerror(errno));
  file.seekg(0, std::ios::end);
  const auto size = static_cast<uint64_t>(file.tellg());
  file.seekg(0);
  char head[4] = {};
  file.read(head, sizeof head);
  file.clear();
  file.seekg(0);
  try {
    if (size >= 4 && std::memcmp(head, "PK\x03\x04", 4) == 0) return read_zip(file, size, path);
    if (size >= 2 && static_cast<unsigned char>(head[0]) == 0x80) {  // a pickle's PROTO
      return read_legacy(file, size, path);
    }
  } catch (const StateDictError&) {
    throw;
  } catch (const std::bad_alloc&) {
    fail(path, "out of memory");
  } catch (const c10::Error& e) {  // from LibTorch on input we did not foresee: still the file's
    fail(path, e.what_without_backtrace());
  }
  not_a_torch_file(path);
}

}  // namespace remat::models
