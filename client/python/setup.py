# SPDX-License-Identifier: Apache-2.0
"""pyproject.toml has the package's metadata; this adds regen._accel, the
optional C encoder of regen.torch's chained calls (regen/_accel.c, the
stable ABI: one build for every CPython from 3.7 on). Where it cannot be
built (no C compiler or no Python headers) pip installs the package without
it and the Python encoder does its work."""

from setuptools import Extension, setup

setup(ext_modules=[Extension("regen._accel", ["regen/_accel.c"], py_limited_api=True, optional=True)])
