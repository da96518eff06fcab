# The C kernel library is compiled by cffi (API mode); see edgellama/native/build.py.
from setuptools import setup

setup(cffi_modules=["edgellama/native/build.py:make_ffibuilder"])
