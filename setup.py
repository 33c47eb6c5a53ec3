"""Only what pyproject.toml cannot say: the compiled extensions.

- icelog.records._records (src/icelog/records/_records.c): the record walker of produced batches;
- icelog.schema.codec._avro_columns (src/icelog/schema/codec/_avro_columns.c): Avro datums to Arrow buffers;
- icelog.schema.codec._proto_columns (src/icelog/schema/codec/_proto_columns.c): Protobuf messages to Arrow buffers;
- icelog.schema.codec._json_columns (src/icelog/schema/codec/_json_columns.c): JSON documents to Arrow buffers.

optional=True: without a C compiler the install still succeeds; icelog.records.walk falls back to its pure-Python
walker (same checks, slower), Avro payloads are decoded by fastavro alone, Protobuf payloads by upb alone and JSON
payloads by the standard library's json alone (same rows, slower).
"""

from setuptools import Extension, setup

SHARED = ["src/icelog/_c/utf8.h", "src/icelog/_c/column_buffers.h"]
MODULES = {
    "icelog.records._records": "src/icelog/records/_records.c",
    "icelog.schema.codec._avro_columns": "src/icelog/schema/codec/_avro_columns.c",
    "icelog.schema.codec._proto_columns": "src/icelog/schema/codec/_proto_columns.c",
    "icelog.schema.codec._json_columns": "src/icelog/schema/codec/_json_columns.c",
}

setup(
    ext_modules=[
        Extension(name, [source], depends=SHARED, extra_compile_args=["-O2", "-std=c11"], optional=True)
        for name, source in MODULES.items()
    ]
)
