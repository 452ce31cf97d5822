"""Compile every kernel a simulator script launched (``kernel_signatures``) for a real GPU,
to PTX for compute capability 9.0, with no GPU: prints one JSON line per kernel and
signature, its problem or "".

The compiler is numba-cuda, the version the lent GPU machines run, with NVIDIA's NVVM and
NVRTC libraries, installed by ``make setup`` apart from the venv (``cudasim_run.COMPILER``,
named to this script by ``GRADPRESS_CUDA_COMPILER``): the venv's numba keeps its built-in
CUDA target, whose simulator the tests use (and which refuses ``max``/``min`` of scalars
in kernels that numba-cuda compiles). The caller puts the libraries' folder on
``LD_LIBRARY_PATH``. Never imported: it makes ``numba.cuda`` numba-cuda's.

    GRADPRESS_CUDA_COMPILER=DIR python tests/support/ptx_check.py SIGNATURES_FILE
"""
import hashlib
import importlib
import json
import os
import pickle
import site
import sys
from pathlib import Path

assert os.environ.get("NUMBA_ENABLE_CUDASIM") != "1", "compiles with the real CUDA target"
REPO = Path(__file__).parents[2]
COMPILER_DIR = os.environ["GRADPRESS_CUDA_COMPILER"]
sys.path.insert(0, str(REPO))
site.addsitedir(COMPILER_DIR)  # its .pth makes ``numba.cuda`` numba-cuda's

from numba import cuda  # noqa: E402
from numba.cuda import dispatcher  # noqa: E402

CC = (9, 0)  # the H100 and H200 of the lent machines
COMPILED_ENV = "GP_PTX_COMPILED"


class _NoDevice:
    """What numba asks of the current device when a kernel calls a device function: its
    compute capability (numba opens the driver for it; there is none here)."""
    compute_capability = CC


dispatcher.get_current_device = _NoDevice


def signatures(path: str) -> set:
    found = set()
    with open(path, "rb") as fh:
        while True:
            try:
                found.update(pickle.load(fh))
            except EOFError:
                return found


def main(path: str) -> None:
    if getattr(cuda, "implementation", "") != "NVIDIA":
        print(json.dumps({"case": "ptx/compiler", "problem": f"numba-cuda is not in {COMPILER_DIR}: run make setup"}))
        return
    for module, name, types in sorted(signatures(path), key=str):
        kernel = importlib.import_module(module)
        for part in name.split("."):
            kernel = getattr(kernel, part)
        case = f"ptx/{module.rsplit('.', 1)[-1]}.{name}({', '.join(map(str, types))})"
        done = compiled_before(module, name, types)
        if done is not None and done.exists():
            problem = ""
        else:
            try:
                cuda.compile_ptx(kernel.py_func, types, cc=CC)
                problem = ""
                if done is not None:
                    done.touch()
            except Exception as e:  # noqa: BLE001 - each refusal is the finding, named
                problem = f"{type(e).__name__}: {str(e)[:400]}"
        print(json.dumps({"case": case, "problem": problem}), flush=True)


def compiled_before(module: str, name: str, types: tuple) -> Path | None:
    """The file that marks a kernel and signature compiled by an earlier check of this test
    session (the folder ``GP_PTX_COMPILED`` names, made by tests/conftest.py: the sources
    cannot change within a session), or None outside one. The simulator scripts launch
    many of the same kernels: 102 compiles, 37 of them distinct, at about 0.2 s each."""
    folder = os.environ.get(COMPILED_ENV)
    if not folder:
        return None
    return Path(folder) / hashlib.sha256(repr((module, name, tuple(map(str, types)))).encode()).hexdigest()


if __name__ == "__main__":
    main(sys.argv[1])
