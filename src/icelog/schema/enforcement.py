"""Import alias kept while other branches still import `icelog.schema.enforcement`; the code is in schema/enforce/."""

from icelog.schema.enforce.enforcement import (  # noqa: F401 - re-exported names
    Enforcer,
    HttpSchemaSource,
    InvalidRecordsError,
    LocalSchemaSource,
    SchemaSource,
)
