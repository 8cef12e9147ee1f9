"""Schemathesis hooks for fuzzing the Retrysafe services (loaded by `.ci/fuzz`).

An `Idempotency-Key` names one intended action, so a fuzzer that reuses a
generated key across different bodies is answered 422 `idempotency_key_reused`
(or a replay), which is the contract, not a bug. Every request that carries a
valid key therefore gets a fresh one; a key that is missing or invalid on
purpose (a negative case) is sent as generated, so the server's refusal of it
is still tested.

A page `cursor` is opaque: only one the API gave out means anything, so a
generated one is dropped from a case that is meant to be valid.
"""

import base64
import binascii
import re
import uuid

import schemathesis

# What the server accepts, as the OpenAPI document declares it: a bare token
# of visible ASCII, or an RFC 8941 sf-string that unquotes to one; 1-255
# characters either way.
VALID_KEY = re.compile(r'[!#-~][!-~]{0,254}|"(?:[!#-\[\]-~]|\\["\\]){1,255}"')


def given_out(cursor):
    """Whether the API could have given out this cursor (`after:<seq>`, base64url)."""
    try:
        text = base64.urlsafe_b64decode(cursor + "=" * (-len(cursor) % 4)).decode()
    except (binascii.Error, UnicodeDecodeError, ValueError):
        return False
    return text.startswith("after:") and text[6:].isdigit()


@schemathesis.hook
def before_call(ctx, case, **kwargs):
    headers = case.headers or {}
    for name, value in list(headers.items()):
        if name.lower() == "idempotency-key" and isinstance(value, str) and VALID_KEY.fullmatch(value):
            headers[name] = str(uuid.uuid4())
            case.headers = headers
    query = case.query or {}
    cursor = query.get("cursor")
    meant_valid = case.meta is not None and case.meta.generation.mode.is_positive
    if isinstance(cursor, str) and cursor and not given_out(cursor) and meant_valid:
        case.query = {name: value for name, value in query.items() if name != "cursor"}
