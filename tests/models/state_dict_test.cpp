// read_state_dict on files written by Python's torch.save (make_state_dicts.py, run before these
// tests, writes them into remat::test_paths::state_dict_dir): values, dtypes, shapes, strides and storage
// sharing as Python saved them, in both file formats; errors that name the file and the problem.

#include "remat/models/state_dict.h"
#include "test_paths.h"

#include <torch/types.h>

#include <catch2/catch.hpp>
#include <fstream>
#include <map>
#include <sstream>
#include <string>
#include <vector>

namespace {

using remat::models::read_state_dict;
using remat::models::StateDictEntry;
using remat::models::StateDictError;

std::string data_path(const std::string& name) {
  return std::string(remat::test_paths::state_dict_dir) + "/" + name;
}

std::vector<std::string> names_of(const std::vector<StateDictEntry>& entries) {
  std::vector<std::string> names;
  for (const StateDictEntry& entry : entries) names.push_back(entry.name);
  return names;
}

torch::Tensor find(const std::vector<StateDictEntry>& entries, const std::string& name) {
  for (const StateDictEntry& entry : entries) {
    if (entry.name == name) return entry.tensor;
  }
  FAIL("no entry " << name);
  return {};
}

// Same dtype, shape, strides, storage offset and values.
void check_tensor(const torch::Tensor& actual, const torch::Tensor& expected) {
  REQUIRE(actual.defined());
  CHECK(actual.device() == torch::kCPU);
  REQUIRE(actual.scalar_type() == expected.scalar_type());
  CHECK(actual.sizes() == expected.sizes());
  CHECK(actual.strides() == expected.strides());
  CHECK(actual.storage_offset() == expected.storage_offset());
  CHECK(torch::equal(actual, expected));
}

std::string error_of(const std::string& path) {
  try {
    read_state_dict(path);
  } catch (const StateDictError& e) {
    return e.what();
  }
  return "(no error)";
}

}  // namespace

TEST_CASE("read_state_dict reads every dtype, scalars, strides and shared storages", "[models]") {
  for (const std::string file : {"mixed_zip.pth", "mixed_proto4.pth", "mixed_byteorder.pth",
                                 "mixed_legacy.pth", "mixed_legacy_proto4.pth"}) {
    INFO(file);
    const std::vector<StateDictEntry> entries = read_state_dict(data_path(file));
    CHECK(names_of(entries) == std::vector<std::string>{"f32", "f64", "f16", "bf16", "c64", "i64",
                                                        "i32", "i16", "i8", "u8", "bool", "scalar",
                                                        "scalar_f32", "empty", "transposed", "a",
                                                        "row", "col", "param"});
    const auto ints = [](std::vector<int64_t> values, torch::ScalarType dtype) {
      return torch::tensor(values, torch::kLong).to(dtype);
    };
    check_tensor(find(entries, "f32"),
                 torch::arange(6, torch::kFloat).reshape({2, 3}) * 0.25 - 0.5);
    check_tensor(find(entries, "f64"), torch::arange(5, torch::kDouble) / 3);
    check_tensor(find(entries, "f16"), ((torch::arange(8) - 4) * 0.125).to(torch::kHalf));
    check_tensor(find(entries, "bf16"), (torch::arange(8) * 0.5 - 2).to(torch::kBFloat16));
    check_tensor(find(entries, "c64"),
                 torch::view_as_complex(torch::tensor({1.0f, 2.0f, 0.0f, -3.5f}).reshape({2, 2})));
    check_tensor(find(entries, "i64"),
                 ints({-(int64_t{1} << 40), -1, 0, (int64_t{1} << 40) + 7}, torch::kLong));
    check_tensor(find(entries, "i32"), ints({-2147483648LL, -1, 0, 2147483647}, torch::kInt));
    check_tensor(find(entries, "i16"), ints({-32768, -1, 0, 32767}, torch::kShort));
    check_tensor(find(entries, "i8"), ints({-128, -1, 0, 127}, torch::kChar));
    check_tensor(find(entries, "u8"), ints({0, 1, 128, 255}, torch::kByte));
    check_tensor(find(entries, "bool"), ints({1, 0, 0, 1}, torch::kBool));
    check_tensor(find(entries, "scalar"), torch::scalar_tensor(7, torch::kLong));
    CHECK(find(entries, "scalar").dim() == 0);
    check_tensor(find(entries, "scalar_f32"), torch::scalar_tensor(2.5, torch::kFloat));
    check_tensor(find(entries, "empty"), torch::zeros({0, 3}));
    check_tensor(find(entries, "param"), torch::full({2}, 1.5));

    const torch::Tensor transposed = find(entries, "transposed");
    check_tensor(transposed, torch::arange(6, torch::kFloat).reshape({2, 3}).t());
    CHECK(transposed.strides() == torch::IntArrayRef{1, 3});

    // a, a[1] and a[:, 2] were saved as views of one storage and read back as such.
    const torch::Tensor expected_a = torch::arange(12, torch::kFloat).reshape({3, 4});
    const torch::Tensor a = find(entries, "a");
    const torch::Tensor row = find(entries, "row");
    const torch::Tensor col = find(entries, "col");
    check_tensor(a, expected_a);
    check_tensor(row, expected_a[1]);
    check_tensor(col, expected_a.select(1, 2));
    CHECK(row.storage_offset() == 4);
    CHECK(col.storage_offset() == 2);
    CHECK(col.strides() == torch::IntArrayRef{4});
    CHECK(a.storage().is_alias_of(row.storage()));
    CHECK(a.storage().is_alias_of(col.storage()));
    CHECK_FALSE(a.storage().is_alias_of(find(entries, "f32").storage()));
    a[1][2] = 100.0;
    CHECK(row[2].item<float>() == 100.0f);
    CHECK(col[1].item<float>() == 100.0f);
  }
}

TEST_CASE("read_state_dict reads a torchvision resnet18 state dict in both formats", "[models]") {
  // The reference: per entry, name dtype rank sizes... sum weighted-sum first last (float64).
  struct Reference {
    std::string name, dtype;
    std::vector<int64_t> sizes;
    double sum, weighted_sum, first, last;
  };
  std::vector<Reference> references;
  std::ifstream reference_file(data_path("resnet18_reference.txt"));
  REQUIRE(reference_file);
  for (std::string line; std::getline(reference_file, line);) {
    std::istringstream fields(line);
    Reference reference;
    int64_t rank = 0;
    fields >> reference.name >> reference.dtype >> rank;
    reference.sizes.resize(rank);
    for (int64_t& size : reference.sizes) fields >> size;
    fields >> reference.sum >> reference.weighted_sum >> reference.first >> reference.last;
    REQUIRE(fields);
    references.push_back(reference);
  }
  REQUIRE(references.size() == 122);  // 62 parameters, 60 BatchNorm buffers
  const std::map<std::string, torch::ScalarType> dtypes = {{"torch.float32", torch::kFloat},
                                                           {"torch.int64", torch::kLong}};

  const std::vector<StateDictEntry> zip = read_state_dict(data_path("resnet18_zip.pth"));
  const std::vector<StateDictEntry> legacy = read_state_dict(data_path("resnet18_legacy.pth"));
  for (const auto* entries : {&zip, &legacy}) {
    REQUIRE(entries->size() == references.size());
    CHECK(entries->front().name == "conv1.weight");
    CHECK(entries->back().name == "fc.bias");
    for (size_t i = 0; i < references.size(); ++i) {
      const Reference& reference = references[i];
      const torch::Tensor& tensor = (*entries)[i].tensor;
      INFO((entries == &zip ? "zip " : "legacy ") << reference.name);
      REQUIRE((*entries)[i].name == reference.name);
      CHECK(tensor.scalar_type() == dtypes.at(reference.dtype));
      CHECK(tensor.sizes() == torch::IntArrayRef(reference.sizes));
      CHECK(tensor.is_contiguous());
      const torch::Tensor flat = tensor.reshape(-1).to(torch::kDouble);
      const torch::Tensor weights = torch::arange(1, flat.numel() + 1, torch::kDouble);
      CHECK(flat.sum().item<double>() == Approx(reference.sum).epsilon(1e-9).margin(1e-9));
      CHECK((flat * weights).sum().item<double>() ==
            Approx(reference.weighted_sum).epsilon(1e-9).margin(1e-9));
      CHECK(flat[0].item<double>() == reference.first);
      CHECK(flat[-1].item<double>() == reference.last);
    }
    const torch::Tensor tracked = find(*entries, "bn1.num_batches_tracked");
    CHECK(tracked.dim() == 0);
    CHECK(tracked.scalar_type() == torch::kLong);
    CHECK(tracked.item<int64_t>() == 1002);
  }
  for (size_t i = 0; i < zip.size(); ++i) CHECK(torch::equal(zip[i].tensor, legacy[i].tensor));
}

TEST_CASE("read_state_dict runs the pickle opcodes that torch.save does not emit", "[models]") {
  // A hand-written main pickle (DUP, POP, POP_MARK, LIST, DICT, TUPLE, BINSTRING, BINBYTES,
  // LONG4, NEWOBJ, LONG_BINPUT/GET, ...) that Python's torch.load reads as {x, y}.
  const std::vector<StateDictEntry> entries = read_state_dict(data_path("handwritten_legacy.pth"));
  REQUIRE(names_of(entries) == std::vector<std::string>{"x", "y"});
  const torch::Tensor all = torch::arange(6, torch::kFloat);
  check_tensor(entries[0].tensor, all.reshape({2, 3}));
  check_tensor(entries[1].tensor, all.slice(0, 3));
  CHECK(entries[0].tensor.storage().is_alias_of(entries[1].tensor.storage()));
}

TEST_CASE("read_state_dict unwraps a training checkpoint's state dict", "[models]") {
  for (const std::string file : {"wrapped_state_dict.pth", "wrapped_model_legacy.pth"}) {
    INFO(file);
    const std::vector<StateDictEntry> entries = read_state_dict(data_path(file));
    CHECK(names_of(entries) == std::vector<std::string>{"w", "b"});
    check_tensor(find(entries, "w"), torch::arange(4, torch::kFloat).reshape({2, 2}));
    check_tensor(find(entries, "b"), torch::tensor({0.5f, -0.5f}));
  }
}

TEST_CASE("read_state_dict names the file and the problem", "[models]") {
  const std::vector<std::pair<std::string, std::string>> cases = {
      {"does_not_exist.pth", "cannot open: No such file or directory"},
      {"empty.pth", "not a PyTorch file (no zip archive and no legacy magic number)"},
      {"random.bin", "not a PyTorch file"},
      {"random_pickle.bin", "not a PyTorch file"},
      {"random_zip_magic.bin", "not a zip archive written by torch.save, or a truncated one"},
      {"truncated_zip.pth", "not a zip archive written by torch.save, or a truncated one"},
      {"truncated_legacy_data.pth", "truncated file: "},  // in the last storage's size or bytes
      {"truncated_legacy_pickle.pth", "truncated file: "},
      {"truncated_legacy_storages.pth", "needs more bytes than the file holds"},
      {"zip_without_pickle.zip", "record data.pkl missing"},
      {"missing_record.pth", "record data/3 missing"},
      {"big_endian.pth", "written on a big-endian machine"},
      {"big_endian_legacy.pth", "written on a big-endian machine"},
      {"set.pth", ": data.pkl: unsupported pickle opcode 0x8f at byte "},
      {"global.pth", "unsupported global 'datetime.date'"},
      {"torchscript.pt",
       "unsupported global '__torch__.torch.nn.modules.linear.Linear' at byte 2 "
       "(this is a TorchScript archive: load it with torch::jit::load)"},
      {"list.pth", "the file holds a list, not a state dict"},
      {"no_tensors.pth", "not a state dict ('epoch' holds an int) and has no 'state_dict'"},
      {"bad_wrapped.pth", "the checkpoint's 'state_dict' entry is not a state dict: it is a list"},
      // Read as bool, a byte other than 0 and 1 would be undefined behaviour.
      {"bool_byte_2_zip.pth", "record data/1 (bool) holds 2 at its byte 1; a bool byte is 0 or 1"},
      {"bool_byte_2_legacy.pth", "(bool) holds 2 at its byte 1; a bool byte is 0 or 1"},
      // One storage as two element types: checked as float, it would be read as bool.
      {"two_dtypes_zip.pth",
       "record data/0 is read as Bool here and as Float before; one storage has one element "
       "type"},
      {"two_dtypes_legacy.pth", "' is read as Bool here and as Float before"},
  };
  for (const auto& [file, message] : cases) {
    const std::string path = data_path(file);
    const std::string error = error_of(path);
    INFO(error);
    CHECK_THAT(error, Catch::StartsWith(path + ": ") && Catch::Contains(message));
  }
}
