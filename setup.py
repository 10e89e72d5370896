"""Only the optional C accelerator lives here; everything else is in pyproject.toml."""

from setuptools import Extension, setup

# optional=True: without a compiler the install still succeeds and the reader runs in pure Python.
setup(ext_modules=[Extension("sglang_tuning_exporter.sources._scan", ["exporter/sglang_tuning_exporter/sources/_scan.c"],
                             optional=True, extra_compile_args=["-O2"])])
