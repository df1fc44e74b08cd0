"""The playground in a real headless browser: type a prompt, set W / threshold / lossless, watch it stream.

Uses Debian's chromium (installed here with apt-get when missing and possible); skips, saying why, only when it
can be neither found nor installed.
"""

import pytest
from headless_chromium import Browser, find_or_install_chromium
from live_server import MODEL_ID, LiveServer, offline_text
from PIL import Image

PROMPT = "count from 20 by 5, 20 numbers:"
SETTINGS = {"wedlm_window_size": 8, "wedlm_entropy_threshold": 0.6, "wedlm_lossless": False}


pytestmark = pytest.mark.heavy  # a browser


@pytest.fixture(scope="module")
def chromium():
    path, why = find_or_install_chromium()
    if path is None:
        pytest.skip(why)
    return path


def test_playground_streams_the_api_answer_coloured_by_forward(chromium, tmp_path):
    with LiveServer() as server:
        api = server.client().completions.create(
            model=MODEL_ID, prompt=PROMPT, max_tokens=48, temperature=0, extra_body=SETTINGS
        )
        assert api.choices[0].text == offline_text(PROMPT, 48, **SETTINGS)[0]
        browser = Browser(chromium)
        try:
            browser.goto(server.url + "/")
            browser.wait_for(f"document.getElementById('model').textContent === {MODEL_ID!r}")
            browser.type_into("#prompt", PROMPT)
            browser.type_into("#window", "8")
            browser.type_into("#threshold", "0.6")
            browser.type_into("#max-tokens", "48")
            assert browser.eval("document.getElementById('lossless').checked") is False
            # No API key is set: the key field is not shown (a CSS display rule used to override `hidden`).
            assert browser.eval("getComputedStyle(document.getElementById('key-field')).display") == "none"
            browser.click("#send")
            browser.wait_for("document.getElementById('status').textContent === 'done'")
            text = browser.eval("document.getElementById('out').textContent")
            spans = browser.eval(
                "[...document.querySelectorAll('#out span')].map(s => [s.textContent, s.style.background])"
            )
            shown = {
                k: browser.eval(f"document.getElementById('{k}').textContent") for k in ("tokens", "forwards", "tpf")
            }
            screenshot = tmp_path / "playground.png"
            browser.screenshot(screenshot)
            out_box = browser.box("#out")
        finally:
            browser.close()
    assert text == api.choices[0].text
    assert int(shown["tokens"]) == api.usage.completion_tokens and int(shown["forwards"]) == api.usage.forwards
    assert float(shown["tpf"]) > 1  # several tokens per forward, shown live
    assert len(spans) > 1 and len({colour for _, colour in spans}) > 1  # each forward's commit has its colour
    # The screenshot shows the coloured output: the output box holds many colours, not a blank page.
    image = Image.open(screenshot).convert("RGB")
    scale = out_box["scale"]
    region = image.crop(
        tuple(
            int(v * scale)
            for v in (out_box["x"], out_box["y"], out_box["x"] + out_box["width"], out_box["y"] + out_box["height"])
        )
    )
    colours = region.getcolors(maxcolors=1 << 20)
    background = max(colours)[1]
    not_background = sum(count for count, colour in colours if colour != background)
    assert len(colours) > 20 and not_background > 0.05 * region.width * region.height


def test_playground_asks_for_the_api_key_the_server_requires(chromium):
    with LiveServer(api_key="s3cret") as server:
        browser = Browser(chromium)
        try:
            browser.goto(server.url + "/")
            browser.wait_for("!document.getElementById('key-field').hidden")
            assert browser.eval("getComputedStyle(document.getElementById('key-field')).display") != "none"
            assert "401" not in browser.eval("document.getElementById('model').textContent")
            browser.type_into("#api-key", "s3cret")
            browser.wait_for(f"document.getElementById('model').textContent === {MODEL_ID!r}")
            browser.type_into("#prompt", PROMPT)
            browser.type_into("#max-tokens", "8")
            browser.click("#send")
            browser.wait_for("document.getElementById('status').textContent === 'done'")
            text = browser.eval("document.getElementById('out').textContent")
        finally:
            browser.close()
    assert text == offline_text(PROMPT, 8, wedlm_window_size=16, wedlm_entropy_threshold=0.4)[0]
