# SPDX-License-Identifier: Apache-2.0
"""pyproject.toml has the package's metadata; this adds regen._accel, the
optional binding that puts the client's lanes on libregen's ring
(regen/_accel.c, the stable ABI: one build for every CPython from 3.7 on).
It takes libregen's header from the checkout (client/include/regen.h) and
loads libregen itself at run time. Where it cannot be built (no C compiler,
no Python headers, no checkout around the package) pip installs the package
without it and the client speaks Varlink."""

import os

from setuptools import Extension, setup

INCLUDE = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "include")

setup(ext_modules=[Extension("regen._accel", ["regen/_accel.c"], include_dirs=[INCLUDE], libraries=["dl"],
                             py_limited_api=True, optional=True)])
