"""Only the page itself drives the local pages' APIs (`cli.web.guard`): another site's Host (DNS rebinding) and
Origin (CSRF) get 403, a POST that is not JSON gets 415; on the rating page and the chat page, served by uvicorn on
loopback and sent real requests."""

from __future__ import annotations

import json

import httpx
import pytest
from chat_server import make_app
from loopback_servers import serve
from test_chat_session import group
from test_human_ratings import export, make_run

from cli.web.chat_app import body_limit, chat_app
from cli.web.guard import served_names
from cli.web.rating_app import rating_app
from mascot.chat.transcript import Transcript
from mascot.evaluation.human import read_key, sheet_items

FOREIGN_HOST = "rebound.example:8765"
FOREIGN_ORIGIN = "https://evil.example"
LOOPBACK = served_names("127.0.0.1")


@pytest.fixture
def rating(tmp_path):
    run_dir = make_run(tmp_path)
    key_path = export(run_dir).key
    key = read_key(key_path)
    body = {"rater": "ann", "item_id": next(iter(key.items)), "choice": "A"}

    def app(names=LOOPBACK):
        return rating_app(sheet_items(run_dir, key_path), key, run_dir / "eval" / "human_ratings", names)
    return app, body, run_dir / "eval" / "human_ratings" / "ratings-ann.csv"


def test_the_rating_page_refuses_another_sites_host_and_origin_and_a_post_that_is_not_json(rating):
    app, body, saved = rating
    with serve(app()) as url:
        host = url.removeprefix("http://")
        assert httpx.get(url).status_code == 200
        rebound = httpx.get(f"{url}/api/items", headers={"host": FOREIGN_HOST})
        assert rebound.status_code == 403 and "Host 'rebound.example:8765' is not a name" in rebound.json()["detail"]
        assert httpx.post(f"{url}/api/ratings", json=body, headers={"host": FOREIGN_HOST}).status_code == 403
        csrf = httpx.post(f"{url}/api/ratings", json=body, headers={"origin": FOREIGN_ORIGIN})
        assert csrf.status_code == 403 and "is another site" in csrf.json()["detail"]
        assert httpx.post(f"{url}/api/ratings", json=body, headers={"origin": "null"}).status_code == 403
        untyped = httpx.post(f"{url}/api/ratings", content=httpx.Request("POST", url, json=body).content)
        assert untyped.status_code == 415 and "expected application/json" in untyped.json()["detail"]
        form = httpx.post(f"{url}/api/ratings", data=body)  # what a cross-site form can send
        assert form.status_code == 415
        assert not saved.exists(), "a refused request recorded a rating"
        own = httpx.post(f"{url}/api/ratings", json=body, headers={"origin": f"http://{host}"})
        assert own.status_code == 200 and saved.exists(), own.text
        other_names = httpx.get(f"{url}/api/items", headers={"host": host.replace("127.0.0.1", "localhost")})
        assert other_names.status_code == 200, "localhost names the same loopback page"


def test_a_remote_binding_answers_to_its_own_host_and_the_names_allowed(rating):
    app, body, _ = rating
    with serve(app(served_names("192.0.2.7", ["chat.example.org"]))) as url:
        port = url.rsplit(":", 1)[1]
        assert httpx.get(url).status_code == 403, "bound elsewhere, so 127.0.0.1 is not its name"
        assert httpx.get(url, headers={"host": f"192.0.2.7:{port}"}).status_code == 200
        behind_proxy = {"host": "chat.example.org", "origin": "https://chat.example.org"}
        assert httpx.post(f"{url}/api/ratings", json=body, headers=behind_proxy).status_code == 200
        foreign = httpx.post(f"{url}/api/ratings", json=body, headers={**behind_proxy, "origin": FOREIGN_ORIGIN})
        assert foreign.status_code == 403


def test_the_chat_page_refuses_the_same(tmp_path):
    transcript = Transcript(run="r", group="g", domain="emotional_support", personas=[], seed=0, notice="n")
    with serve(chat_app(replay=transcript)) as url:
        assert httpx.get(f"{url}/api/group").status_code == 200
        assert httpx.get(f"{url}/api/group", headers={"host": FOREIGN_HOST}).status_code == 403
        # A replay has no conversations to start (409), so 409 is what passed the guard.
        assert httpx.post(f"{url}/api/sessions", json={}).status_code == 409
        assert httpx.post(f"{url}/api/sessions", json={}, headers={"origin": FOREIGN_ORIGIN}).status_code == 403
        assert httpx.post(f"{url}/api/sessions", json={}, headers={"host": FOREIGN_HOST}).status_code == 403
        assert httpx.post(f"{url}/api/sessions").status_code == 415
        assert httpx.post(f"{url}/api/sessions/x/close", content=b"{}",
                          headers={"content-type": "text/plain"}).status_code == 415


def test_a_message_is_limited_in_characters_after_parsing_and_its_body_in_bytes_with_room_for_escapes():
    with serve(make_app(seconds_per_token=0.0)) as models, serve(chat_app(group(models, max_message_chars=2000))) as url:
        session = httpx.post(f"{url}/api/sessions", json={}).json()["id"]
        messages = f"{url}/api/sessions/{session}/messages"
        # 1,990 characters as json.dumps (and requests) send them: \u00e9 is 6 bytes, an emoji's surrogate pair 12
        escaped = json.dumps({"text": "é" * 1000 + "\U0001F600" * 990, "turns": 1}).encode()
        assert escaped.isascii() and len(escaped) > 4 * 2000 + 1024, "over the old limit of 4 bytes a character"
        accepted = httpx.post(messages, content=escaped, headers={"content-type": "application/json"}, timeout=60)
        assert accepted.status_code == 200 and '"type": "reply"' in accepted.text, accepted.text[:300]
        long = httpx.post(messages, json={"text": "é" * 2001})
        assert long.status_code == 422 and "2001 characters; at most 2000" in long.json()["detail"]
        huge = httpx.post(messages, content=b'{"text": "' + b"a" * body_limit(2000) + b'"}',
                          headers={"content-type": "application/json"})
        assert huge.status_code == 413 and f"over {body_limit(2000)} bytes" in huge.json()["detail"]
