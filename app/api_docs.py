"""The OpenAPI schema as rows for the /docs page (plain HTML: no CDN, no script)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

METHODS = ("get", "post", "put", "patch", "delete")


@dataclass(frozen=True)
class Field:
    """One parameter or body field."""

    name: str
    where: str  # path | query | body
    type: str
    required: bool


@dataclass(frozen=True)
class Operation:
    """One route of the API."""

    method: str
    path: str
    summary: str
    description: str
    fields: list[Field] = field(default_factory=list)
    statuses: list[str] = field(default_factory=list)


def type_name(schema: dict[str, Any]) -> str:
    """A short type for a JSON schema: "integer", "string or null", "MessageCreate"."""
    if "$ref" in schema:
        return str(schema["$ref"]).rsplit("/", 1)[-1]
    if "anyOf" in schema:
        return " or ".join(type_name(option) for option in schema["anyOf"])
    if "enum" in schema:
        return " | ".join(str(value) for value in schema["enum"])
    if schema.get("type") == "array":
        return f"list of {type_name(schema.get('items', {}))}"
    return str(schema.get("type", "any"))


def _body_fields(operation: dict[str, Any], schemas: dict[str, Any]) -> list[Field]:
    body = operation.get("requestBody", {}).get("content", {}).get("application/json", {})
    schema = body.get("schema", {})
    if "$ref" in schema:
        schema = schemas.get(str(schema["$ref"]).rsplit("/", 1)[-1], {})
    required = set(schema.get("required", []))
    return [
        Field(name, "body", type_name(spec), name in required)
        for name, spec in schema.get("properties", {}).items()
    ]


def operations(openapi: dict[str, Any]) -> list[Operation]:
    """Every operation of an OpenAPI schema, in the schema's order."""
    schemas = openapi.get("components", {}).get("schemas", {})
    found: list[Operation] = []
    for path, item in openapi.get("paths", {}).items():
        for method in METHODS:
            operation = item.get(method)
            if operation is None:
                continue
            parameters = [
                Field(p["name"], p["in"], type_name(p.get("schema", {})), bool(p.get("required")))
                for p in operation.get("parameters", [])
            ]
            found.append(
                Operation(
                    method=method.upper(),
                    path=path,
                    summary=operation.get("summary", ""),
                    description=operation.get("description", ""),
                    fields=parameters + _body_fields(operation, schemas),
                    statuses=list(operation.get("responses", {})),
                )
            )
    return found
