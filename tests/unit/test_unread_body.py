"""What a request's headers say of its unread body, read as the server reads them: uvicorn
waits to send 100 Continue when any Expect field asks for it, so a client cannot hide the
ask behind another Expect field and have a refusal keep the connection for a body it has
not sent."""

from __future__ import annotations

from gateway.http.bodies import SMALL_UNREAD_BYTES, unread_body_of


def _scope(*headers: tuple[bytes, bytes]) -> dict[str, object]:
    return {"type": "http", "headers": list(headers), "client": ("10.0.0.1", 5000)}


def test_any_expect_field_asking_for_continue_counts() -> None:
    for fields in (
        ((b"expect", b"100-continue"),),
        ((b"expect", b"something-else"), (b"expect", b"100-Continue ")),
        ((b"expect", b"100-continue"), (b"expect", b"something-else")),
    ):
        assert unread_body_of(_scope((b"content-length", b"10"), *fields)).expects_continue, fields
    assert not unread_body_of(_scope((b"expect", b"other"))).expects_continue


def test_small_is_what_content_length_says() -> None:
    assert unread_body_of(_scope((b"content-length", str(SMALL_UNREAD_BYTES).encode()))).small
    assert not unread_body_of(_scope((b"content-length", str(SMALL_UNREAD_BYTES + 1).encode()))).small
    assert not unread_body_of(_scope((b"content-length", b"1e3"))).small
    assert not unread_body_of(_scope()).small
    assert unread_body_of(_scope()).connection == ("10.0.0.1", 5000)
