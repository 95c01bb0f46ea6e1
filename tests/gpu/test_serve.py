"""`vllm serve configs/north-mini-code --load-format dummy` with the plugin installed answers the OpenAI
completions and chat endpoints (vLLM defaults otherwise: torch.compile and CUDA graphs on)."""

import json
import sys
import urllib.request

import pytest

from conftest import FULL_CONFIG

pytestmark = [pytest.mark.gpu, pytest.mark.slow]
PORT = 8123


def post(path, body):
    req = urllib.request.Request(f"http://127.0.0.1:{PORT}{path}", data=json.dumps(body).encode(),
                                 headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=120) as r:
        return r.status, json.loads(r.read())


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    from benchmarks.serve_load import served

    log_path = tmp_path_factory.mktemp("serve") / "serve.log"
    cmd = [sys.executable, "-m", "vllm.entrypoints.cli.main", "serve", str(FULL_CONFIG), "--load-format", "dummy",
           "--served-model-name", "north-mini-code", "--host", "127.0.0.1", "--port", str(PORT)]
    with served(cmd, PORT, log_path, startup_timeout=600):
        yield log_path
    print(f"--- server log tail ({log_path})\n" + log_path.read_text()[-3000:])


def test_completions_endpoint_answers(server):
    status, body = post("/v1/completions", {"model": "north-mini-code", "prompt": "def fib(n):",
                                            "max_tokens": 16, "temperature": 0})
    assert status == 200
    assert body["usage"]["completion_tokens"] == 16
    assert isinstance(body["choices"][0]["text"], str)
    print("completion:", json.dumps(body)[:400])


def test_chat_completions_endpoint_answers(server):
    status, body = post("/v1/chat/completions", {
        "model": "north-mini-code", "max_tokens": 16, "temperature": 0,
        "messages": [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hello!"}]})
    assert status == 200
    assert body["choices"][0]["message"]["role"] == "assistant"
    assert body["usage"]["completion_tokens"] == 16
    print("chat:", json.dumps(body)[:400])


def test_server_log_names_the_decode_path(server):
    lines = [line for line in server.read_text().splitlines() if "vllm_megakernel: decode runs on" in line]
    assert lines
    print("decision:", lines[0])
    from vllm_megakernel.options import AUTOMATIC_DEFAULT, MEASURED_MAX_BATCH

    if AUTOMATIC_DEFAULT:  # the key is absent here: automatic mode, the measured batch limit and why
        assert f"decode runs on the megakernel for batches of 1 to {MEASURED_MAX_BATCH} (measured" in lines[0]
