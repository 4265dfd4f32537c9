"""Writes the files state_dict_test.cpp reads, into the directory given as argv[1].

Run with Debian's /usr/bin/python3 (torch and torchvision installed). Every value is either
computed the same way in the C++ test or written to a reference file beside the state dict.
"""
import collections
import datetime
import os
import pickle
import random
import re
import struct
import sys
import zipfile

import torch
import torchvision

out = sys.argv[1]
os.makedirs(out, exist_ok=True)


def path(name):
    return os.path.join(out, name)


def save_zip(obj, name, **kwargs):
    torch.save(obj, path(name), **kwargs)


def save_legacy(obj, name, **kwargs):
    torch.save(obj, path(name), _use_new_zipfile_serialization=False, **kwargs)


def mixed():
    """One tensor of each dtype, a scalar, a transpose, views sharing storage, a Parameter."""
    a = torch.arange(12.0).reshape(3, 4)
    sd = collections.OrderedDict()
    sd["f32"] = torch.arange(6, dtype=torch.float32).reshape(2, 3) * 0.25 - 0.5
    sd["f64"] = torch.arange(5, dtype=torch.float64) / 3
    sd["f16"] = ((torch.arange(8) - 4) * 0.125).to(torch.float16)
    sd["bf16"] = (torch.arange(8) * 0.5 - 2).to(torch.bfloat16)
    sd["c64"] = torch.tensor([1 + 2j, -3.5j], dtype=torch.complex64)
    sd["i64"] = torch.tensor([-(2**40), -1, 0, 2**40 + 7], dtype=torch.int64)
    sd["i32"] = torch.tensor([-(2**31), -1, 0, 2**31 - 1], dtype=torch.int32)
    sd["i16"] = torch.tensor([-32768, -1, 0, 32767], dtype=torch.int16)
    sd["i8"] = torch.tensor([-128, -1, 0, 127], dtype=torch.int8)
    sd["u8"] = torch.tensor([0, 1, 128, 255], dtype=torch.uint8)
    sd["bool"] = torch.tensor([True, False, False, True])
    sd["scalar"] = torch.tensor(7)
    sd["scalar_f32"] = torch.tensor(2.5)
    sd["empty"] = torch.zeros(0, 3)
    sd["transposed"] = torch.arange(6.0).reshape(2, 3).t()
    sd["a"] = a
    sd["row"] = a[1]
    sd["col"] = a[:, 2]
    sd["param"] = torch.nn.Parameter(torch.full((2,), 1.5))
    sd._metadata = collections.OrderedDict([("", {"version": 1})])  # as Module.state_dict() has
    return sd


sd = mixed()
save_zip(sd, "mixed_zip.pth")
save_zip(sd, "mixed_proto4.pth", pickle_protocol=4)  # FRAME, MEMOIZE, STACK_GLOBAL, ...
save_legacy(sd, "mixed_legacy.pth")
save_legacy(sd, "mixed_legacy_proto4.pth", pickle_protocol=4)



def handwritten_legacy_file(name):
    """A legacy file whose main pickle is written by hand, to use the opcodes that torch.save
    does not (DUP, POP, POP_MARK, LIST, DICT, TUPLE, BINSTRING, BINBYTES, LONG4, NEWOBJ, ...).
    It holds x = arange(6.).reshape(2, 3) and y = x.view(-1)[3:] as a Parameter."""
    def u8(n): return struct.pack("<B", n)
    def i32(n): return struct.pack("<i", n)
    def binunicode(text): return b"X" + i32(len(text)) + text.encode()
    pid = (b"(" + b"T" + i32(7) + b"storage" + b"ctorch\nFloatStorage\n" +
           b"\x8d" + struct.pack("<Q", 1) + b"0" + binunicode("cpu") + b"J" + i32(6) + b"N" +
           b"t" + b"Q" + b"r" + i32(1000))                  # LONG_BINPUT 1000 the storage
    hooks = b"ccollections\nOrderedDict\n)\x81"            # NEWOBJ
    main = (b"\x80\x02" + b"}q\x00" +                       # the dict, memo 0
            b"(J" + i32(-5) + b"\x8b" + i32(9) + bytes(8) + b"\x01" + b"1" +  # MARK .. POP_MARK
            b"N20" + b"0" +                                  # NONE DUP POP POP
            b"G" + struct.pack(">d", 0.5) + b"0" +           # BINFLOAT POP
            b"(B" + i32(2) + b"ab" + b"C" + u8(1) + b"c" + b"\x8e" + struct.pack("<Q", 0) +
            b"l0" +                                          # LIST of bytes, POP
            b"U" + u8(1) + b"x" +                            # key 'x' (SHORT_BINSTRING)
            b"ctorch._utils\n_rebuild_tensor_v2\n" +
            b"(" + pid + b"K\x00" + b"(K\x02K\x03t" + b"(K\x03K\x01t" + b"\x89" + b"(d" + b"t" +
            b"R" + b"s" +                                    # REDUCE, SETITEM
            b"h\x00" + b"(" + b"\x8c\x01y" +                # BINGET the dict, MARK, 'y'
            b"ctorch._utils\n_rebuild_parameter\n" +
            b"ctorch._utils\n_rebuild_tensor_v2\n" +
            b"(j" + i32(1000) + b"K\x03K\x03\x85K\x01\x85\x88" + hooks + b"t" + b"R" +
            b"\x89" + hooks + b"\x87" + b"R" + b"u" + b"0" +   # TUPLE3, REDUCE, SETITEMS, POP
            b".")
    with open(path(name), "wb") as f:
        for header in (0x1950A86A20F9469CFC6C, 1001,
                       {"protocol_version": 1001, "little_endian": True,
                        "type_sizes": {"short": 2, "int": 4, "long": 4}}):
            pickle.dump(header, f, protocol=2)
        f.write(main)
        pickle.dump(["0"], f, protocol=2)
        f.write(struct.pack("<q", 6) + torch.arange(6.0).numpy().tobytes())
    # Python reads it as meant, so a mismatch in C++ is the C++ reader's.
    loaded = torch.load(path(name), weights_only=False)  # our own file; 2.6+ defaults to True
    assert list(loaded) == ["x", "y"], list(loaded)
    assert torch.equal(loaded["x"], torch.arange(6.0).reshape(2, 3))
    assert torch.equal(loaded["y"], torch.tensor([3.0, 4.0, 5.0]))


handwritten_legacy_file("handwritten_legacy.pth")

# resnet18 with every parameter and buffer random (BatchNorm statistics too), and a reference:
# one line per entry: name dtype rank sizes... sum weighted_sum first last, the sums in float64
# (weights 1..n over the flattened tensor, so a permutation changes them), first and last
# element exactly (repr of a float64).
torch.manual_seed(0)
model = torchvision.models.resnet18(weights=None)
with torch.no_grad():
    for i, module in enumerate(model.modules()):
        if isinstance(module, torch.nn.BatchNorm2d):
            module.weight.uniform_(0.5, 1.5)
            module.bias.normal_()
            module.running_mean.normal_()
            module.running_var.uniform_(0.5, 2.0)
            module.num_batches_tracked.fill_(1000 + i)
resnet = model.state_dict()
save_zip(resnet, "resnet18_zip.pth")
save_legacy(resnet, "resnet18_legacy.pth")
with open(path("resnet18_reference.txt"), "w") as f:
    for name, t in resnet.items():
        flat = t.reshape(-1).double()
        weights = torch.arange(1, flat.numel() + 1, dtype=torch.float64)
        f.write(" ".join([name, str(t.dtype), str(t.dim())] + [str(s) for s in t.shape] +
                         [repr(flat.sum().item()), repr((flat * weights).sum().item()),
                          repr(flat[0].item()), repr(flat[-1].item())]) + "\n")

# Training checkpoints that wrap a state dict.
small = collections.OrderedDict(w=torch.arange(4.0).reshape(2, 2), b=torch.tensor([0.5, -0.5]))
save_zip({"epoch": 3, "state_dict": small, "best_acc": 0.75, "arch": "tiny",
          "optimizer": {"state": {}, "param_groups": [{"lr": 0.1, "params": [0, 1]}]}},
         "wrapped_state_dict.pth")
save_legacy({"model": dict(small), "epoch": 3, "note": None}, "wrapped_model_legacy.pth")

# Files that are not state dicts, or not readable ones.
save_zip([torch.ones(2)], "list.pth")
save_zip({"epoch": 3, "lr": 0.1}, "no_tensors.pth")
save_zip({"epoch": 3, "state_dict": [torch.ones(2)]}, "bad_wrapped.pth")
save_zip({"w": torch.ones(2), "tags": {1, 2}}, "set.pth", pickle_protocol=4)  # EMPTY_SET 0x8f
save_zip({"w": torch.ones(2), "when": datetime.date(2020, 1, 1)}, "global.pth")
torch.jit.save(torch.jit.script(torch.nn.Linear(2, 2)), path("torchscript.pt"))


def rewrite_zip(source, name, drop=None, add=None):
    """A copy of the zip file `source` without the record ending in `drop`, plus `add` (which
    replaces records of the same name: torch 2 writes its own byteorder record)."""
    add = add or {}
    with zipfile.ZipFile(path(source)) as src, \
            zipfile.ZipFile(path(name), "w", zipfile.ZIP_STORED) as dst:
        top = src.namelist()[0].split("/")[0]
        for info in src.infolist():
            record = info.filename[len(top) + 1:]
            if record != drop and record not in add:
                dst.writestr(info.filename, src.read(info.filename))
        for record, data in add.items():
            dst.writestr(top + "/" + record, data)


rewrite_zip("mixed_zip.pth", "missing_record.pth", drop="data/3")
rewrite_zip("mixed_zip.pth", "big_endian.pth", add={"byteorder": "big"})
rewrite_zip("mixed_zip.pth", "mixed_byteorder.pth", add={"byteorder": "little"})  # as torch 2 has
with zipfile.ZipFile(path("zip_without_pickle.zip"), "w") as z:
    z.writestr("archive/version", "3\n")
    z.writestr("archive/notes.txt", "hello")

# A legacy file whose sys_info says big-endian: NEWTRUE after 'little_endian' made NEWFALSE.
data = bytearray(open(path("mixed_legacy.pth"), "rb").read())
at = data.index(b"\x88", data.index(b"little_endian"))
data[at] = 0x89
open(path("big_endian_legacy.pth"), "wb").write(bytes(data))

# A bool tensor whose second byte is 2: torch writes the bytes as they are.
flags = torch.tensor([True, False, True])
flags.view(torch.uint8)[1] = 2
save_zip({"w": torch.ones(2), "flags": flags}, "bool_byte_2_zip.pth")
save_legacy({"w": torch.ones(2), "flags": flags}, "bool_byte_2_legacy.pth")

# One storage read as two element types: the bool tensor named the float tensor's storage (its
# bytes 0x3f800000 hold bytes other than 0 and 1). torch.save refuses to write that; the pickle
# is edited so that the bool storage's key is the float storage's.
flags = torch.tensor([True, False, True])
save_zip({"w": torch.ones(2), "flags": flags}, "two_dtypes_source.pth")
with zipfile.ZipFile(path("two_dtypes_source.pth")) as z:
    pickled = z.read(z.namelist()[0].split("/")[0] + "/data.pkl")
pickled, edits = re.subn(rb"(BoolStorage\n.{1,5}X\x01\x00\x00\x00)1", rb"\g<1>0", pickled,
                         flags=re.S)
assert edits == 1
rewrite_zip("two_dtypes_source.pth", "two_dtypes_zip.pth", add={"data.pkl": pickled})
os.remove(path("two_dtypes_source.pth"))
save_legacy({"w": torch.ones(2), "flags": flags}, "two_dtypes_legacy.pth")
data = open(path("two_dtypes_legacy.pth"), "rb").read()
float_key = re.search(rb"FloatStorage\n.{1,5}X(....)", data, re.S)
bool_key = re.search(rb"BoolStorage\n.{1,5}X(....)", data, re.S)
# The keys are storage addresses in decimal, so their lengths can differ from run to run: the
# bool storage's key is replaced with its length (BINUNICODE's 4-byte count) and its text.
size = struct.unpack("<I", float_key.group(1))[0]
key = data[float_key.end():float_key.end() + size]
bool_size = struct.unpack("<I", bool_key.group(1))[0]
data = data[:bool_key.start(1)] + float_key.group(1) + key + data[bool_key.end() + bool_size:]
open(path("two_dtypes_legacy.pth"), "wb").write(data)

zip_bytes = open(path("mixed_zip.pth"), "rb").read()
legacy_bytes = open(path("mixed_legacy.pth"), "rb").read()
open(path("truncated_zip.pth"), "wb").write(zip_bytes[: len(zip_bytes) * 6 // 10])
open(path("truncated_legacy_data.pth"), "wb").write(legacy_bytes[:-10])  # in the last storage
open(path("truncated_legacy_pickle.pth"), "wb").write(legacy_bytes[:200])  # in the main pickle
open(path("truncated_legacy_storages.pth"), "wb").write(legacy_bytes[:300])  # storages named

rng = random.Random(1)
open(path("random.bin"), "wb").write(b"\0" + bytes(rng.randrange(256) for _ in range(4095)))
open(path("random_zip_magic.bin"), "wb").write(
    b"PK\x03\x04" + bytes(rng.randrange(256) for _ in range(4092)))
open(path("random_pickle.bin"), "wb").write(
    b"\x80\x02" + bytes(rng.randrange(256) for _ in range(4094)))
open(path("empty.pth"), "wb").close()

open(path("stamp"), "w").write("torch %s torchvision %s\n" % (torch.__version__,
                                                              torchvision.__version__))
