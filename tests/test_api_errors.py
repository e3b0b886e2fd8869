"""Error statuses of the Agent API: 400, 401, 413, 422; always JSON {"detail": ...}, never a 500."""

import io
import json
import re
from datetime import UTC, timedelta, timezone

import hypothesis
import pytest
from django.test import Client, override_settings
from hypothesis import strategies
from ninja.responses import NinjaJSONEncoder

from memory_app import auth
from memory_app.api import common
from tests.api_helpers import ApiClient, make_key, new_context

pytestmark = pytest.mark.django_db


@pytest.fixture
def api():
    return make_key(scopes=["read", "write"])


@pytest.fixture
def cid(api):
    return new_context(api)


@pytest.mark.parametrize(
    "raw",
    [
        "{bad",
        '{"role": "user",}',
        '{"role": NaN}',
        '{"role": "user", "metadata": {"x": Infinity}}',
        '{"role": "user", "metadata": {"x": 1e999}}',
        b"\xff\xfe\x00garbage",
    ],
)
def test_malformed_json_is_400(api, cid, raw):
    response = api.post(f"/api/v1/contexts/{cid}/messages", raw=raw)
    assert response.status_code == 400
    assert response.json()["detail"]


@pytest.mark.parametrize("raw", ["[]", '"text"', "12", "null"])
def test_json_that_is_not_an_object_is_422(api, cid, raw):
    assert api.post(f"/api/v1/contexts/{cid}/messages", raw=raw).status_code in (400, 422)


def test_lone_surrogate_in_text_is_422(api, cid):
    response = api.post(
        f"/api/v1/contexts/{cid}/messages", raw='{"role": "user", "text": "\\ud800"}'
    )
    assert response.status_code == 422


@pytest.mark.parametrize(
    "header",
    [
        None,
        "Bearer",
        "Bearer ",
        "Basic abc",
        "Bearer am_000000000000_nope",
        "Bearer not-a-key",
        "Token x",
    ],
)
def test_missing_or_bad_key_is_401_with_a_bearer_challenge(cid, header):
    extra = {"HTTP_AUTHORIZATION": header} if header is not None else {}
    response = Client().get(f"/api/v1/contexts/{cid}", **extra)
    assert response.status_code == 401
    assert response.json()["detail"]
    sent_a_token = (
        header is not None and header.startswith("Bearer ") and header.strip() != "Bearer"
    )
    expected = 'Bearer error="invalid_token"' if sent_a_token else "Bearer"
    assert response["WWW-Authenticate"] == expected


def test_revoked_key_is_401_with_an_invalid_token_challenge(api, cid):
    assert api.get(f"/api/v1/contexts/{cid}").status_code == 200
    auth.apikey_revoke(key=api.key)
    response = api.get(f"/api/v1/contexts/{cid}")
    assert response.status_code == 401
    assert response["WWW-Authenticate"] == 'Bearer error="invalid_token"'


@pytest.mark.parametrize("path", ["/api/v1/traces", "/v1/traces"])
def test_an_otlp_export_without_a_key_is_401_with_a_bearer_challenge(path):
    response = Client().post(path, data=b"{}", content_type="application/json")
    assert response.status_code == 401
    assert response["WWW-Authenticate"] == "Bearer"


def test_a_wrong_secret_with_a_real_prefix_is_401(api, cid):
    forged = ApiClient(api.secret[:-4] + "AAAA")
    assert forged.get(f"/api/v1/contexts/{cid}").status_code == 401


@override_settings(MAX_REQUEST_BODY_BYTES=1000)
def test_body_over_the_limit_is_413_before_it_is_read(api, cid):
    response = api.post(f"/api/v1/contexts/{cid}/messages", {"role": "user", "text": "x" * 2000})
    assert response.status_code == 413
    assert "limit" in response.json()["detail"]
    assert (
        api.post(f"/api/v1/contexts/{cid}/messages", {"role": "user", "text": "x" * 10}).status_code
        == 201
    )


@override_settings(MAX_REQUEST_BODY_BYTES=1000)
def test_streamed_body_without_length_over_the_limit_is_413(api, cid):
    body = b'{"role": "user", "text": "' + b"x" * 2000 + b'"}'
    response = api.client.generic(
        "POST",
        f"/api/v1/contexts/{cid}/messages",
        b"",
        content_type="application/json",
        HTTP_AUTHORIZATION=f"Bearer {api.secret}",
        CONTENT_LENGTH="",
        HTTP_TRANSFER_ENCODING="chunked",
        **{"wsgi.input": io.BytesIO(body)},
    )
    assert response.status_code == 413


@override_settings(MAX_REQUEST_BODY_BYTES=1000)
def test_streamed_body_without_length_under_the_limit_is_accepted(api, cid):
    body = b'{"role": "user", "text": "streamed"}'
    response = api.client.generic(
        "POST",
        f"/api/v1/contexts/{cid}/messages",
        b"",
        content_type="application/json",
        HTTP_AUTHORIZATION=f"Bearer {api.secret}",
        CONTENT_LENGTH="",
        HTTP_TRANSFER_ENCODING="chunked",
        **{"wsgi.input": io.BytesIO(body)},
    )
    assert response.status_code == 201
    assert response.json()["text"] == "streamed"


def test_non_numeric_content_length_is_400(api, cid):
    response = api.client.generic(
        "POST",
        f"/api/v1/contexts/{cid}/messages",
        b"{}",
        content_type="application/json",
        HTTP_AUTHORIZATION=f"Bearer {api.secret}",
        CONTENT_LENGTH="abc",
    )
    assert response.status_code == 400


@pytest.mark.parametrize(
    "path",
    [
        "/api/v1/contexts/0",
        "/api/v1/contexts/-1",
        "/api/v1/contexts/abc",
        f"/api/v1/contexts/{2**63}",
        f"/api/v1/runs/{2**64}",
        "/api/v1/steps/1.5",
    ],
)
def test_ids_that_are_not_bigints_are_422_or_404_never_500(api, path):
    assert api.get(path).status_code in (404, 422)


@pytest.mark.parametrize("after", ["-1", str(2**63), "x"])
def test_cursor_out_of_range_is_422(api, cid, after):
    assert api.get(f"/api/v1/contexts/{cid}/messages", {"after": after}).status_code == 422


# --- the fast JSON path (orjson) answers exactly as the strict standard-library parser ----------


@pytest.mark.parametrize(
    "number", ["NaN", "Infinity", "-Infinity", "1e400", "-1e400", "1.7976931348623159e308"]
)
def test_non_finite_numbers_in_a_vector_batch_are_400(api, cid, number):
    vector = ", ".join(["0.25"] * 383 + [number])
    raw = '{"messages": [{"role": "user", "text": "x", "vector": [' + vector + "]}]}"
    response = api.post(f"/api/v1/contexts/{cid}/messages/batch", raw=raw)
    assert response.status_code == 400
    assert api.get(f"/api/v1/contexts/{cid}/messages").json()["items"] == []


def test_integers_beyond_64_bits_keep_every_digit(api, cid):
    big = "123456789012345678901234567890"
    raw = '{"role": "user", "text": "x", "metadata": {"big": ' + big + ', "neg": -' + big + "}}"
    response = api.post(f"/api/v1/contexts/{cid}/messages", raw=raw)
    assert response.status_code == 201, response.content
    assert response.json()["metadata"] == {"big": int(big), "neg": -int(big)}
    stored = api.get(f"/api/v1/messages/{response.json()['id']}").json()
    assert stored["metadata"] == {"big": int(big), "neg": -int(big)}


def test_rendering_keeps_text_and_the_datetime_format(api, cid):
    text = 'naïve café — 日本語 😀 \\" </script>'
    created = api.post(f"/api/v1/contexts/{cid}/messages", {"role": "user", "text": text}).json()
    assert created["text"] == text
    # ninja's encoder format: milliseconds and Z, whichever encoder wrote it.
    assert re.fullmatch(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d(\.\d{3})?Z", created["created_at"])
    listed = api.get(f"/api/v1/contexts/{cid}/messages").json()["items"][0]
    assert listed["created_at"] == created["created_at"]
    assert listed["text"] == text


@pytest.mark.parametrize(
    "doc",
    [
        b'{"a": 1, "a": 2}',
        b"[1.5e308, -0.0, 0.1, 1E5, 5e-324, 18446744073709551615, -9223372036854775808]",
        b'["\\u0000", "\\ud83d\\ude00", "\xc3\xa9"]',
        b'\xef\xbb\xbf{"bom": true}',
        b'{"n": 12345678901234567890123}',
        b"[-12345678901234567890, 123456789012345678901.5]",
        b"[0.00012345678901234567891, 1e-000000000000000000001, 1.5e+00000000000000000000300]",
        b"  [ ]  ",
    ],
)
def test_fast_parser_agrees_with_the_standard_library(doc):
    assert common.json_loads(doc) == json.loads(doc)


@pytest.mark.parametrize(
    "doc",
    [
        b"12345678901234567890",
        b"[-12345678901234567890]",
        b'{"below_int64": -9223372036854775809, "above_uint64": 18446744073709551616}',
        b'{"f": 0.000123456789012345678901, "n": 123456789012345678901234}',
        b'{"e": 1e-000000000000000000001, "s": "id-12345678901234567890"}',
    ],
)
def test_long_integers_after_long_fractions_still_go_to_the_exact_parser(doc):
    expected = json.loads(doc)
    assert common.json_loads(doc) == expected
    assert repr(common.json_loads(doc)) == repr(expected)  # ints stay ints, not rounded floats


def test_long_fractions_stay_on_the_fast_parser(monkeypatch):
    # Python's json writes 20 digits in a row for every value in [1e-4, 1e-3): a vector body
    # holds hundreds of them, and each used to send the whole body to the exact parser.
    doc = json.dumps(
        {"vector": [0.00012345678901234567, -0.000987654321098765, 0.5], "n": 2**63 - 1}
    ).encode()
    expected = json.loads(doc)
    monkeypatch.setattr(common.json, "loads", lambda *a, **k: pytest.fail("exact parser used"))
    assert common.json_loads(doc) == expected


@pytest.mark.parametrize(
    "doc", [b"NaN", b"[Infinity]", b"[-1e400]", b'["a\x00b"]', b"[01]", b"", b'{"a" 1}']
)
def test_fast_parser_refuses_what_the_strict_parser_refuses(doc):
    with pytest.raises(ValueError):
        common.json_loads(doc)


def test_fast_renderer_writes_what_ninjas_encoder_writes():
    from datetime import datetime
    from decimal import Decimal

    a = datetime(2026, 11, 23, 7, 0, 0, 123456, tzinfo=UTC)
    b = a.astimezone(timezone(timedelta(hours=2)))  # equal to `a`, written differently
    whole, naive = a.replace(microsecond=0), a.replace(tzinfo=None)
    data = {"x": [a, a, b, a, whole, naive, a.date(), Decimal("1.10")], "t": "é\u2028<", "n": 2**70}
    # The second has nothing orjson refuses: its datetimes go through the API's own writer.
    for value in (data, {"x": [a, b, a, b, whole, naive, whole]}):
        assert json.loads(common.json_dumps(value)) == json.loads(
            json.dumps(value, cls=NinjaJSONEncoder)
        )


@hypothesis.settings(max_examples=500, deadline=None)
@hypothesis.given(
    moment=strategies.datetimes(
        timezones=strategies.sampled_from(
            [None, UTC, timezone(timedelta(hours=5, minutes=30)), timezone(-timedelta(hours=8))]
        )
    )
)
def test_the_api_writes_any_time_as_ninjas_encoder_does(moment):
    """Every year, every microsecond, UTC (written by orjson) or not."""
    assert common.json_dumps([moment]) == json.dumps([moment], cls=NinjaJSONEncoder).encode()


@pytest.mark.parametrize("match_keys", ['{"user": "a\\u0000"}', '{"us\\u0000er": "a"}'])
def test_an_export_filter_holding_a_nul_is_422_before_the_stream_starts(api, cid, match_keys):
    """PostgreSQL refuses the NUL in the first query, which used to run after the 200 went out:
    the body then broke off mid-stream."""
    response = api.get("/api/v1/export", {"match_keys": match_keys})
    assert response.status_code == 422
    assert "match_keys" in response.json()["detail"]
