"""The extension module itself: what it shows the process that loads it."""

import shutil
import subprocess

import remat


def test_the_extension_keeps_the_symbols_of_its_static_libraries():
    # remat's libraries, and the C++ runtime where the compiler links it statically, are
    # linked into the module: their symbols stay inside it (python/CMakeLists.txt). Exported,
    # they met the copies the process had loaded first, and on a GPU machine whose compiler
    # links libstdc++ statically the first std::ostringstream of measure() crashed.
    nm = shutil.which("nm")
    assert nm is not None, "this test needs nm (binutils)"
    listing = subprocess.run([nm, "-D", "--defined-only", remat._C.__file__],
                             capture_output=True, text=True, check=True).stdout
    names = [line.split()[-1] for line in listing.splitlines() if line.strip()]
    assert "PyInit__C" in names
    ours = [name for name in names if "5remat" in name]  # remat:: in a mangled name
    assert not ours, f"{len(ours)} of remat's symbols exported, e.g. {ours[:3]}"
