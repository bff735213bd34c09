"""Configuration: ``field()`` keys on classes, schemas, YAML, overrides and ``configure()``."""

from theseus.config.configuration import (
    Configuration,
    configuration,
    configure,
    current_configuration,
    flatten,
    load,
    nest,
    parse_overrides,
    read_yaml,
    resolve,
    write_yaml,
)
from theseus.config.fields import MISSING, FieldSpec, declared_fields, field
from theseus.config.schema import Schema

__all__ = [
    "MISSING",
    "Configuration",
    "FieldSpec",
    "Schema",
    "configuration",
    "configure",
    "current_configuration",
    "declared_fields",
    "field",
    "flatten",
    "load",
    "nest",
    "parse_overrides",
    "read_yaml",
    "resolve",
    "write_yaml",
]
