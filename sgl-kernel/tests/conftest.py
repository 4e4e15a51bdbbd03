import importlib.util
import pathlib
import sys

# Lets the kernel tests run from a plain checkout; an installed sgl_kernel takes precedence.
if importlib.util.find_spec("sgl_kernel") is None:
    sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[1] / "python"))
