"""setuptools' entry point for sepp; the decisions live in build_backend/sepp_build.py.

`python -m build` builds the sdist and, from it, a wheel carrying the compiled
build (mypyc extension modules of log_format._compiled.COMPILED_MODULES) and every
source; `pip install -e .` compiles nothing. See README "Building a release".
"""

import os
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "build_backend"))

from sepp_build import setup_arguments
from setuptools import setup

setup(**setup_arguments(sys.argv[1:]))
