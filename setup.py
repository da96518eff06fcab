# The C kernel library is compiled by cffi (API mode); see edgellama/_build.py.
from setuptools import setup

setup(cffi_modules=["edgellama/_build.py:ffibuilder"])
