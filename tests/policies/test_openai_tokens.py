"""The ``openai`` policy's token ids and log-probs, against the bundled mock server speaking vLLM's
and SGLang's exact JSON with a real tiny model: every recorded log-prob is recomputed by teacher
forcing with the same model (tolerance 1e-4, float32).
"""

from __future__ import annotations

import re
import shutil

import pytest

from agent_memory.policies.openai_client import OpenAIPolicy, TokenIdsMissing
from agent_memory.policies.openai_protocol import read_answer

torch = pytest.importorskip("torch", reason="the 'llm' extra is not installed")
pytest.importorskip("transformers", reason="the 'llm' extra is not installed")

from mock_server import ModelBackend  # noqa: E402
from mock_server.mock_openai import MockOpenAIServer  # noqa: E402

PROMPTS = ["you see a box", "the key is at the wall ; go up", "push the red box left"]
SAMPLING = {"temperature": 0.8, "top_p": 0.9, "max_tokens": 6}


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    from agent_memory.models import build_tiny_lm, words_from_texts

    return build_tiny_lm(tmp_path_factory.mktemp("lm") / "tiny", words_from_texts(PROMPTS))


@pytest.fixture(scope="module")
def model(tiny):
    from transformers import AutoModelForCausalLM

    torch.set_num_threads(1)
    return AutoModelForCausalLM.from_pretrained(tiny, local_files_only=True).eval()


def _serve(tiny, dialect="vllm"):
    return MockOpenAIServer(
        ModelBackend(tiny, logprobs_mode="processed_logprobs"), dialect=dialect, max_in_flight=4
    )


def _teacher_forced(model, prompt_ids, response_ids, temperature, top_p):
    """Each response token's log-prob under the processed distribution (temperature, top-p)."""
    from transformers import LogitsProcessorList, TemperatureLogitsWarper, TopPLogitsWarper

    ids = torch.tensor([prompt_ids + response_ids])
    with torch.no_grad():
        logits = model(ids).logits[0].float()
    warp = LogitsProcessorList([TemperatureLogitsWarper(temperature), TopPLogitsWarper(top_p)])
    n = len(prompt_ids)
    return [
        warp(ids[:, : n + j], logits[n + j - 1].unsqueeze(0)).log_softmax(-1)[0, t].item()
        for j, t in enumerate(response_ids)
    ]


def _check(model, generations, prompts_ids=None):
    for k, g in enumerate(generations):
        assert g.has_tokens and len(g.response_ids) == len(g.response_logprobs) > 0
        assert g.finish_reason in ("stop", "length") and g.sampling.temperature == 0.8
        if prompts_ids is not None:
            assert g.prompt_ids == prompts_ids[k]
        want = _teacher_forced(model, g.prompt_ids, g.response_ids, 0.8, 0.9)
        assert g.response_logprobs == pytest.approx(want, abs=1e-4)


@pytest.mark.parametrize("dialect", ["vllm", "sglang"])
@pytest.mark.parametrize("mode", ["chat", "completion"])
def test_token_ids_and_logprobs_are_recorded_as_the_server_sampled_them(tiny, model, dialect, mode):
    with (
        _serve(tiny, dialect) as server,
        OpenAIPolicy(
            server.base_url,
            "tiny",
            mode=mode,
            return_tokens=True,
            server=dialect,
            seed=1,
            **SAMPLING,
        ) as policy,
    ):
        gens = policy.generate(PROMPTS, [{"traj_uid": f"t{i}", "step": 1} for i in range(3)])
    _check(model, gens)


def test_token_in_sends_the_local_rendering_and_counts_no_mismatch(tiny, model):
    from transformers import AutoTokenizer

    from agent_memory.policies.rendering import PromptRenderer

    local = PromptRenderer(AutoTokenizer.from_pretrained(tiny, local_files_only=True))
    with (
        _serve(tiny) as server,
        OpenAIPolicy(
            server.base_url,
            "tiny",
            mode="completion",
            token_in=True,
            tokenizer=str(tiny),
            **SAMPLING,
        ) as policy,
    ):
        gens = policy.generate(PROMPTS)
        assert server.stats().requests == 3 + 1  # the prompts and the policy's server check
    _check(model, gens, [local.ids(p) for p in PROMPTS])
    assert policy.stats.prompt_id_mismatches == 0


def test_a_server_rendering_differently_fails_each_request(tiny, tmp_path):
    other = tmp_path / "other-template"
    shutil.copytree(tiny, other)
    template = other / "chat_template.jinja"  # where transformers saves the chat template
    template.write_text(template.read_text().replace("assistant :", "assistant : :"))
    with (
        _serve(tiny) as server,
        OpenAIPolicy(
            server.base_url, "tiny", return_tokens=True, tokenizer=str(other), **SAMPLING
        ) as policy,
    ):
        gens = policy.generate(PROMPTS)
    # Nothing tells the server's own rendering from another request's ids: no row holds them.
    assert policy.stats.prompt_id_mismatches == policy.stats.failures == 3
    assert all(g.finish_reason == "error" and g.prompt_ids is None for g in gens)
    assert policy.last_errors[0].startswith(
        "the server's prompt ids are not this prompt's (11 ids, 12 sent or rendered here by "
        "policy.params.tokenizer; first difference at position 11: the end, here "
    )


def test_per_episode_seeds_do_not_depend_on_the_order_of_requests(tiny):
    meta = [{"traj_uid": f"t{i}", "step": 2} for i in range(3)]
    with (
        _serve(tiny) as server,
        OpenAIPolicy(server.base_url, "tiny", return_tokens=True, seed=5, **SAMPLING) as policy,
    ):
        forward = policy.generate(PROMPTS, meta)
        backward = policy.generate(PROMPTS[::-1], meta[::-1])[::-1]
    assert [g.response_ids for g in forward] == [g.response_ids for g in backward]
    assert len({g.sampling.seed for g in forward}) == 3


def test_a_server_without_token_ids_stops_the_run_with_the_fix():
    with pytest.raises(
        TokenIdsMissing,
        match=re.escape(
            "answered without prompt ids, response ids, log-probs although return_tokens=True "
            "asked for them (vllm field names): vLLM needs >= 0.10.2 (return_token_ids)"
        ),
    ):
        _generate_without_ids()


def _generate_without_ids():
    """A server that answers plain OpenAI JSON (no token ids) to a policy asking for them."""
    import json
    import threading
    from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

    class Plain(BaseHTTPRequestHandler):
        def log_message(self, *args):
            pass

        def do_POST(self):
            self.rfile.read(int(self.headers["Content-Length"]))
            body = json.dumps(
                {
                    "choices": [
                        {"message": {"role": "assistant", "content": "up"}, "finish_reason": "stop"}
                    ]
                }
            ).encode()
            self.send_response(200)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

    httpd = ThreadingHTTPServer(("127.0.0.1", 0), Plain)
    thread = threading.Thread(target=httpd.serve_forever, daemon=True)
    thread.start()
    try:
        url = f"http://127.0.0.1:{httpd.server_address[1]}/v1"
        with OpenAIPolicy(url, "m", return_tokens=True, max_retries=0) as policy:
            policy.generate(["go"])
    finally:
        httpd.shutdown()
        httpd.server_close()


def test_token_ids_spelled_as_token_strings_are_read():
    answer = {
        "choices": [
            {
                "text": "up",
                "finish_reason": "stop",
                "logprobs": {
                    "token_logprobs": [-0.2, -0.1],
                    "tokens": ["token_id:7", "token_id:3"],
                },
                "prompt_token_ids": [1, 2],
            }
        ]
    }
    got = read_answer(answer, "completion")
    assert got.response_ids == [7, 3] and got.logprobs == [-0.2, -0.1] and got.prompt_ids == [1, 2]
