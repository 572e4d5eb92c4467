"""User ids that look alike are one user or refused (issue 23, point 10): the issue's six ids on
chat, the memory API and MCP; a key's binding, Open WebUI's token, a move and the CLI."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import httpx
import pytest
import respx
from pydantic import ValidationError

import app.ui
from app.config import Settings
from app.proxy.user_ids import LOOK_LATIN, UserIdRefused, normal_user_id
from tests.conftest import AppClientFactory
from tests.helpers import RecordingHooks, assert_openai_error, chat_body, completion_json
from tests.test_memory_cli import run
from tests.test_openwebui_jwt import SECRET, mint

NFC, NFD = "Jos\u00e9", "Jose\u0301"
REFUSED = {
    "\u0430lice": "scripts (Cyrillic and Latin)",  # a Cyrillic "а"
    "alice\u200b": "(U+200B)",  # zero-width space
    "al\u00adice": "(U+00AD)",  # soft hyphen
    "alice\u202e": "(U+202E)",  # right-to-left override
    "\uff41\uff4c\uff49\uff43\uff45": "variant form of 'a' (U+FF41)",  # fullwidth
}
"""The issue's ids that pass for "alice" (and two the review found), and what the refusal
says."""
JSON_RPC = {"Accept": "application/json, text/event-stream", "Content-Type": "application/json"}


def header(value: str) -> bytes:
    return value.encode()  # UTF-8 bytes on the wire, as curl and Open WebUI send them


@pytest.fixture
def ok(upstream: respx.Router) -> respx.Route:
    return upstream.post("/chat/completions").respond(json=completion_json())


@pytest.mark.parametrize(
    ("given", "user"),
    [
        ("alice", "alice"),
        (NFD, NFC),
        (" Jose\u0301 ", NFC),
        ("\u0410\u043b\u0438\u0441\u0430", "\u0410\u043b\u0438\u0441\u0430"),  # Алиса: Cyrillic
        ("\u0395\u03bb\u03ad\u03bd\u03b7", "\u0395\u03bb\u03ad\u03bd\u03b7"),  # Ελένη: Greek
        ("Zo\u00eb-\u6771\u4eac", "Zo\u00eb-\u6771\u4eac"),  # Zoë-東京: Latin with Han
        ("\u4f50\u3005\u6728\u3055\u3093", "\u4f50\u3005\u6728\u3055\u3093"),  # 佐々木さん
        ("Hawai\u02bbi", "Hawai\u02bbi"),  # the okina is a modifier letter: of no script
        ("ann smith 42", "ann smith 42"),
        ("", ""),
    ],
)
def test_ids_kept_in_nfc(given: str, user: str) -> None:
    assert normal_user_id(given) == user


@pytest.mark.parametrize(
    "name",
    [
        "\u0414\u043c\u0438\u0442\u0440\u0438\u0439",  # Дмитрий
        "\u041c\u0430\u0440\u0438\u044f",  # Мария: "М", "а", "р" look Latin, "и", "я" do not
        "\u043e\u043b\u044f",  # оля
        "\u03a3\u03bf\u03c6\u03af\u03b1",  # Σοφία
        "\u0395\u03bb\u03ad\u03bd\u03b7 42",  # Ελένη 42
        "Bj\u00f6rk \u00c6gir",  # no compatibility form in it
        "\ud55c\uac00\ub78c",  # 한가람: Hangul, whose NFKC is itself
    ],
)
def test_names_of_one_script_that_do_not_look_latin_are_kept(name: str) -> None:
    assert normal_user_id(name) == name


WHOLE_SCRIPT = [
    "\u0430\u04cf\u0456\u0441\u0435",  # аӏісе
    "\u0412\u041e\u0412",  # ВОВ ("BOB")
    "\u0412\u0435\u0440\u0430",  # Вера, a name ("Bepa")
    "\u0410\u041d\u041d\u0410",  # АННА
    "\u03c1\u03bf\u03ba",  # ροκ ("pok")
]


@pytest.mark.parametrize("name", WHOLE_SCRIPT)
def test_ids_of_one_script_whose_letters_all_look_latin_are_kept(name: str) -> None:
    """Real names are written so; the page shows them escaped (tests/browser)."""
    assert normal_user_id(name) == name
    assert all(c in set().union(*LOOK_LATIN.values()) for c in name if c.isalpha())


@pytest.mark.parametrize(
    "name",
    [
        "david-\u05d3\u05d5\u05d3",  # david-דוד: Latin with Hebrew
        "ali-\u0639\u0644\u06cc",  # ali-علی: Latin with Arabic
        "\u0e2a\u0e21\u0e0a\u0e32\u0e22 s.",  # สมชาย s.: Thai with Latin
        "\u10dc\u10d8\u10dc\u10dd nino",  # ნინო nino: Georgian with Latin
        "\u0639\u0644\u06cc\u200c\u0631\u0636\u0627",  # علی‌رضا: ZWNJ after a joining letter
        "\u0645\u06cc\u200c\u062e\u0648\u0627\u0647\u0645",  # می‌خواهم
        "\u0dc1\u0dca\u200d\u0dbb\u0dd3 \u0dbd\u0d82\u0d9a\u0dcf",  # ශ්‍රී ලංකා: ZWJ after a virama
        "\u0915\u094d\u200d\u0937",  # क्‍ष: a half form (ZWJ after the virama)
        "\u0915\u094d\u200c\u0937",  # क्‌ष: the virama shown (ZWNJ after it)
    ],
)
def test_latin_with_one_script_that_does_not_look_latin_and_joiners_that_show_are_kept(
    name: str,
) -> None:
    """UTS #39's "moderately restrictive" mixes; ZWNJ and ZWJ where they change what is shown
    (IDNA's CONTEXTJ rules)."""
    assert normal_user_id(name) == name


@pytest.mark.parametrize(
    ("given", "says"),
    [
        ("\u03b4\u03b7\u03bc\u03ae\u03c4\u03c1\u03b7\u03c2@gmail.com", "Greek and Latin"),
        ("\u0570ello", "Armenian and Latin"),  # Armenian "հ" passes for "h"
        ("\u13aalice", "Cherokee and Latin"),  # Cherokee "Ꭺ" passes for "A"
        ("\ua4e2am", "Latin and Lisu"),  # Lisu "ꓢ" passes for "S"
        ("\u0391\u043b\u0438\u0441\u0430", "Cyrillic and Greek"),  # Greek "Α" with Cyrillic
        ("\u05d3\u05d5\u05d3-\u0639\u0644\u06cc", "Arabic and Hebrew"),  # no Latin: one script
        ("david-\u05d3\u05d5\u05d3-\u0639\u0644\u06cc", "Arabic and Hebrew and Latin"),
        ("alice\u200d", "(U+200D)"),  # after a Latin letter, a joiner shows nothing
        ("alice\u200c", "(U+200C)"),
        ("\u0631\u200c\u0636\u0627", "(U+200C)"),  # after "ر", which never joins what follows
        ("\u0639\u0644\u06cc\u200c", "(U+200C)"),  # at the end: nothing to keep apart
        ("\u200c\u0639\u0644\u06cc", "(U+200C)"),
        ("\u0639\u200d\u0644\u06cc", "(U+200D)"),  # Arabic letters join anyway
        ("\u0915\u200d\u0937", "(U+200D)"),  # no virama before it
        ("\u0915\u094d\u200d", "(U+200D)"),  # no letter after it
        ("\u0915\u094d\u200dx", "(U+200D)"),  # a Latin letter after it
        ("\u0dc1\u0dca\u200d\u0937", "(U+200D)"),  # a Sinhala virama, a Devanagari letter
    ],
)
def test_look_alike_mixes_and_joiners_that_show_nothing_are_refused(given: str, says: str) -> None:
    with pytest.raises(UserIdRefused) as refused:
        normal_user_id(given)
    assert says in str(refused.value)


LOOK_ALIKES = {
    "a\u217cice": "a variant form of 'l' (U+217C)",  # SMALL ROMAN NUMERAL FIFTY (Nl)
    "bob\u2180": "scripts (Latin and Roman)",  # a numeral (Nl) with no compatibility form
    "\U0001d41a\U0001d425\U0001d422\U0001d41c\U0001d41e": "variant form of 'a' (U+1D41A)",
    "\uff41\uff4c\uff49\uff43\uff45": "a variant form of 'a' (U+FF41)",  # ａｌｉｃｅ
    "\ufb01ona": "a variant form of 'fi' (U+FB01)",  # the ligature ﬁ
    "x\u00b2": "a variant form of '2' (U+00B2)",  # superscript two
    "\u2460bob": "a variant form of '1' (U+2460)",  # circled one
}
"""Ids that pass for Latin ones through letters of another script, numerals or compatibility
forms (fullwidth, mathematical, ligatures), and what the refusal says."""


@pytest.mark.parametrize(("given", "says"), LOOK_ALIKES.items())
def test_look_alike_letters_numerals_and_variant_forms_are_refused(given: str, says: str) -> None:
    with pytest.raises(UserIdRefused) as refused:
        normal_user_id(given)
    assert says in str(refused.value)


@pytest.mark.parametrize(
    ("given", "says"),
    [
        *REFUSED.items(),
        ("\u0430\u0440\u0435-team", "Cyrillic and Latin"),  # "аре" in Cyrillic, with Latin
        ("p\u0430yp\u0430l", "Cyrillic and Latin"),
        ("\u03bfscar", "Greek and Latin"),  # a Greek omicron
        ("\uff50aypal", "a variant form of 'p' (U+FF50)"),
        ("\U0001d41alice", "a variant form of 'a' (U+1D41A)"),
        ("alice\u2066", "(U+2066)"),  # left-to-right isolate
        ("ali\u200dce", "(U+200D)"),  # zero-width joiner
        ("alice\u3164", "(U+3164)"),  # Hangul filler: a letter that shows nothing
        ("alice\ufe0f", "(U+FE0F)"),  # variation selector
        ("ann\u00a0smith", "(U+00A0)"),  # a space that is not the space
        ("ann\x85smith", "control character (U+0085)"),
        ("a" * 257, "longer than 256"),
    ],
)
def test_ids_that_pass_for_others_are_refused(given: str, says: str) -> None:
    with pytest.raises(UserIdRefused, match=None) as refused:
        normal_user_id(given)
    assert says in str(refused.value)


async def test_chat_maps_nfd_to_nfc_and_refuses_the_others(
    make_client: AppClientFactory, ok: respx.Route
) -> None:
    hooks = RecordingHooks()
    client = await make_client(hooks=hooks)
    for body, headers in (
        (chat_body(user=NFD), {}),
        (chat_body(), {"X-User-Id": header(NFD)}),
        (chat_body(), {"X-OpenWebUI-User-Id": header(NFD)}),
    ):
        response = await client.post("/v1/chat/completions", json=body, headers=headers)
        assert response.status_code == 200, response.text
        assert hooks.prepared[-1].user_id == NFC
    for user, says in REFUSED.items():
        by_body = await client.post("/v1/chat/completions", json=chat_body(user=user))
        error = assert_openai_error(by_body, 400, param="user")
        assert error["code"] == "invalid_user" and says in error["message"]
        by_header = await client.post(
            "/v1/chat/completions", json=chat_body(), headers={"X-User-Id": header(user)}
        )
        assert assert_openai_error(by_header, 400, param="X-User-Id")["code"] == "invalid_user"
    assert ok.call_count == 3  # nothing refused reached the upstream


async def test_the_memory_api_maps_nfd_to_nfc_and_refuses_the_others(
    client: httpx.AsyncClient,
) -> None:
    created = await client.post(
        "/v1/memories", json={"content": "Likes tea"}, headers={"X-User-Id": header(NFD)}
    )
    assert created.status_code == 201 and created.json()["user_id"] == NFC
    for named in (NFC, NFD):
        listed = (await client.get("/v1/memories", params={"user": named})).json()
        assert [m["content"] for m in listed["data"]] == ["Likes tea"]
    for user, says in REFUSED.items():
        by_header = await client.post(
            "/v1/memories", json={"content": "x"}, headers={"X-User-Id": header(user)}
        )
        error = assert_openai_error(by_header, 400, param="X-User-Id")
        assert error["code"] == "invalid_user" and says in error["message"]
        by_query = await client.get("/v1/memories", params={"user": user})
        assert assert_openai_error(by_query, 400, param="user")["code"] == "invalid_user"
    users = (await client.get("/v1/users")).json()["data"]
    assert [u["id"] for u in users] == [NFC]  # one user; none of the refused was created


async def test_mcp_maps_nfd_to_nfc_and_refuses_the_others(client: httpx.AsyncClient) -> None:
    call: dict[str, Any] = {
        "jsonrpc": "2.0", "id": 1, "method": "tools/call",
        "params": {"name": "remember", "arguments": {"content": "Plays the cello"}},
    }  # fmt: skip
    done = await client.post("/mcp", json=call, headers=JSON_RPC | {"X-User-Id": header(NFD)})
    assert done.status_code == 200 and not done.json()["result"]["isError"], done.text
    listed = (await client.get("/v1/memories", params={"user": NFC})).json()
    assert [m["content"] for m in listed["data"]] == ["Plays the cello"]
    for user, says in REFUSED.items():
        refused = await client.post(
            "/mcp", json=call, headers=JSON_RPC | {"X-OpenWebUI-User-Id": header(user)}
        )
        error = assert_openai_error(refused, 400, param="X-OpenWebUI-User-Id")
        assert error["code"] == "invalid_user" and says in error["message"]
    assert [u["id"] for u in (await client.get("/v1/users")).json()["data"]] == [NFC]


async def test_open_webui_s_token_names_users_by_the_same_rule(
    make_client: AppClientFactory, ok: respx.Route
) -> None:
    hooks = RecordingHooks()
    client = await make_client(hooks=hooks, openwebui_jwt_secret=SECRET)
    token = {"X-OpenWebUI-User-Jwt": mint(NFD)}
    response = await client.post("/v1/chat/completions", json=chat_body(), headers=token)
    assert response.status_code == 200 and hooks.prepared[-1].user_id == NFC
    bad = {"X-OpenWebUI-User-Jwt": mint("alice\u202e")}
    refused = await client.post("/v1/chat/completions", json=chat_body(), headers=bad)
    assert assert_openai_error(refused, 400)["code"] == "invalid_user"


def test_a_key_s_user_is_normalised_and_a_bad_one_stops_the_start() -> None:
    settings = Settings(api_keys=f"sk-one:{NFD},sk-two")
    assert [k.user_id for k in settings.parsed_api_keys] == [NFC, None]
    with pytest.raises(ValidationError) as refused:
        Settings(api_keys="sk-one:ann,sk-two:alice\u200b")
    assert "the user of key 2 contains an invisible" in str(refused.value)


async def test_a_key_bound_to_the_nfd_form_is_the_nfc_user(
    make_client: AppClientFactory, ok: respx.Route
) -> None:
    hooks = RecordingHooks()
    client = await make_client(hooks=hooks, api_keys=[f"sk-jose:{NFD}"])
    key = {"Authorization": "Bearer sk-jose"}
    same = {"X-User-Id": header(NFC)}  # naming itself is no other user
    response = await client.post("/v1/chat/completions", json=chat_body(), headers=key | same)
    assert response.status_code == 200 and hooks.prepared[-1].user_id == NFC


async def test_a_move_s_target_is_normalised_and_its_source_taken_as_stored(
    client: httpx.AsyncClient,
) -> None:
    """A user stored before ids were normalised can still be given to a normal id."""
    services = client._transport.app.state.services  # type: ignore[attr-defined]
    from app.memory.store.records import NewMemory

    await services.memory.add("alice\u200b", [NewMemory("Likes tea")])  # as an older version did
    bad = await client.post(
        "/v1/memories/move", json={"from_user": "alice\u200b", "to_user": "bob\u200b"}
    )
    assert assert_openai_error(bad, 400, param="to_user")["code"] == "invalid_user"
    moved = await client.post(
        "/v1/memories/move", json={"from_user": "alice\u200b", "to_user": NFD}
    )
    assert moved.status_code == 200 and moved.json()["to_user"] == NFC, moved.text
    listed = (await client.get("/v1/memories", params={"user": NFC})).json()
    assert [m["content"] for m in listed["data"]] == ["Likes tea"]


def test_the_cli_normalises_users_and_refuses_bad_ones(capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _ = run(capsys, "memories", "add", "--user", NFD, "Likes tea", "--json")
    assert code == 0 and NFC in out
    code, out, _ = run(capsys, "memories", "list", "--user", NFC, "--json")
    assert code == 0 and "Likes tea" in out
    for user, says in REFUSED.items():
        code, _, err = run(capsys, "memories", "list", "--user", user)
        assert code == 2 and "--user" in err and says in " ".join(err.split()), err
    code, _, err = run(capsys, "memories", "move", "--from", NFC, "--to", "al\u00adice")
    assert code == 2 and "--to" in err


def test_the_page_knows_the_same_look_alike_letters() -> None:
    """The users table escapes ids stored before this rule by the same table (app.js)."""
    script = (Path(app.ui.__file__).parent / "static" / "app.js").read_text(encoding="utf-8")
    (line,) = [line for line in script.splitlines() if line.startswith("const LOOK_LATIN = ")]
    assert set(line.split("[", 1)[1].split("]", 1)[0]) == set().union(*LOOK_LATIN.values())
