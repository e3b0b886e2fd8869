"""The OpenAPI schema documents every operation with examples; docs are served without a CDN."""

import re

import jsonschema
import pytest
from django.test import Client

pytestmark = pytest.mark.django_db


@pytest.fixture(scope="module")
def schema():
    return Client().get("/api/openapi.json").json()


def _resolve(schema, node):
    if "anyOf" in node:  # an optional body: the object alternative
        node = next(n for n in node["anyOf"] if n.get("type") != "null")
    while "$ref" in node:
        name = node["$ref"].rsplit("/", 1)[-1]
        node = schema["components"]["schemas"][name]
    return node


def operations(schema):
    for path, methods in schema["paths"].items():
        for method, op in methods.items():
            yield path, method, op


def test_schema_is_served_without_a_key():
    response = Client().get("/api/openapi.json")
    assert response.status_code == 200
    assert response.json()["paths"]


def test_the_served_schema_has_no_duplicate_keys():
    """JSON.parse keeps the last of two equal keys, but Swagger UI reads the schema as YAML and
    stops at the first duplicate (an int 200 and a str "200" from `openapi_extra` both come out
    as "200"), rendering no operation at all."""
    import json

    def refuse_duplicates(pairs):
        keys = [key for key, _ in pairs]
        duplicated = {key for key in keys if keys.count(key) > 1}
        assert not duplicated, f"duplicated keys {duplicated} beside {keys}"
        return dict(pairs)

    json.loads(Client().get("/api/openapi.json").content, object_pairs_hook=refuse_duplicates)


def test_every_operation_is_authenticated_and_documents_its_errors(schema):
    for path, method, op in operations(schema):
        assert op.get("security"), (method, path)
        for code in ("401", "403", "404", "422"):
            assert code in op["responses"], (method, path, code)
        if method in ("post", "patch"):
            assert {"400", "409", "413"} <= set(op["responses"]), (method, path)


def test_schema_class_names_are_unique_across_api_modules():
    """OpenAPI components are keyed by class name: two `StepsOut` would document one wrongly."""
    import importlib
    import pkgutil

    from pydantic import BaseModel

    import memory_app.api as package

    seen: dict[str, str] = {}
    for info in pkgutil.iter_modules(package.__path__):
        module = importlib.import_module(f"memory_app.api.{info.name}")
        for name, obj in vars(module).items():
            if (
                isinstance(obj, type)
                and issubclass(obj, BaseModel)
                and obj.__module__ == module.__name__
            ):
                assert name not in seen, f"{name} defined in {seen.get(name)} and {module.__name__}"
                seen[name] = module.__name__


def _documented_examples(schema, media):
    """The examples of one media type: the schema's own (an array's on its items), else the media
    type's `example`/`examples` (for a body that is no JSON object: text, JSON Lines, free-form)."""
    node = _resolve(schema, media.get("schema", {}))
    if node.get("type") == "array" and "items" in node:
        node = _resolve(schema, node["items"])
    found = list(node.get("examples") or [])
    if "example" in media:
        found.append(media["example"])
    found += [e.get("value") for e in (media.get("examples") or {}).values()]
    return node, found


def _check_examples(schema, media, where):
    node, found = _documented_examples(schema, media)
    assert found, where
    validator = jsonschema.Draft202012Validator(
        {**node, "components": schema["components"]},
        format_checker=jsonschema.Draft202012Validator.FORMAT_CHECKER,
    )
    for example in found:
        errors = [e.message for e in validator.iter_errors(example)]
        assert not errors, (where, example, errors)


def test_every_operation_has_a_summary_and_examples(schema):
    for path, method, op in operations(schema):
        assert op.get("summary"), (method, path)
        ok = next(r for code, r in op["responses"].items() if code.startswith("2"))
        assert ok.get("content"), (method, path, "response")
        for media_type, media in ok["content"].items():
            _check_examples(schema, media, (method, path, "response", media_type))
        for media_type, media in op.get("requestBody", {}).get("content", {}).items():
            _check_examples(schema, media, (method, path, "request", media_type))


def test_swagger_ui_is_served_from_local_static_files():
    page = Client().get("/api/docs")
    assert page.status_code == 200
    html = page.content.decode()
    urls = re.findall(r'(?:src|href)="([^"]+)"', html)
    assert urls and all(u.startswith("/") for u in urls), urls
    for u in urls:
        assert Client().get(u).status_code == 200, u
