"""Only what pyproject.toml cannot say: the compiled record walker (src/icelog/log/_records.c).

optional=True: without a C compiler the install still succeeds and icelog.log.records falls back to its
pure-Python walker (same checks, slower).
"""

from setuptools import Extension, setup

setup(
    ext_modules=[
        Extension(
            "icelog.log._records",
            ["src/icelog/log/_records.c"],
            extra_compile_args=["-O2", "-std=c11"],
            optional=True,
        )
    ]
)
