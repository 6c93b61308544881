"""The experiments' tests run with the library tests' settings (tests/conftest.py: CPU, the
shared compilation cache, the SmolLM2 fixtures)."""

import importlib.util
from pathlib import Path

_spec = importlib.util.spec_from_file_location(
    "_library_tests_conftest", Path(__file__).resolve().parent.parent / "tests" / "conftest.py")
_library = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(_library)

pytest_configure = _library.pytest_configure
smollm2_path = _library.smollm2_path
smollm2 = _library.smollm2
