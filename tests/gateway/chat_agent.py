"""A multi-turn agent program written against the real ``openai`` client, as a user would write
one: it knows nothing of the gateway but its base URL, a header to declare a compaction, and
two plain POSTs for its reward and end. Run by the gateway tests as a subprocess.

    python tests/gateway/chat_agent.py BASE_URL SESSION --turns 5 --compact-at 3 --drop-at 5
"""

from __future__ import annotations

import argparse
import json
import time
import urllib.request

import openai

QUESTIONS = ["Where is the box?", "Which way is up?", "Push it left.", "Is it done?", "Why?"]


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("gateway")
    parser.add_argument("session")
    parser.add_argument("--model", default="tiny-qwen")
    parser.add_argument("--turns", type=int, default=3)
    parser.add_argument("--compact-at", type=int, default=0, help="declared compaction turn")
    parser.add_argument("--drop-at", type=int, default=0, help="undeclared rewrite turn")
    parser.add_argument("--hang-after", type=int, default=0, help="then wait to be killed")
    parser.add_argument("--stream", action="store_true")
    parser.add_argument("--max-tokens", type=int, default=6)
    parser.add_argument("--temperature", type=float, default=0.7)
    parser.add_argument("--top-k", type=int, default=20)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--reward", type=float, default=1.0)
    args = parser.parse_args()
    client = openai.OpenAI(base_url=f"{args.gateway}/s/{args.session}/v1", api_key="none")
    messages = [{"role": "system", "content": "You push boxes."}]
    for turn in range(1, args.turns + 1):
        headers = {}
        if turn == args.compact_at:  # the agent's memory compacts its context, and says so
            summary = f"Summary of {len(messages)} messages: the box is near."
            messages = [messages[0], {"role": "user", "content": summary}]
            headers["X-Memory-Rewrite"] = "compaction"
        if turn == args.drop_at:  # a rewrite the agent does not declare: a truncation
            messages = [messages[0]]
        messages.append({"role": "user", "content": QUESTIONS[(turn - 1) % len(QUESTIONS)]})
        text = _ask(client, args, messages, headers)
        messages.append({"role": "assistant", "content": text})
        if turn == args.hang_after:
            print("hanging", flush=True)
            while True:
                time.sleep(60)
    _post(f"{args.gateway}/s/{args.session}/reward", {"reward": args.reward})
    _post(f"{args.gateway}/s/{args.session}/end", {"won": args.reward > 0})
    print("done", flush=True)


def _ask(client: openai.OpenAI, args: argparse.Namespace, messages: list, headers: dict) -> str:
    kwargs = {
        "model": args.model,
        "messages": messages,
        "max_tokens": args.max_tokens,
        "temperature": args.temperature,
        "seed": args.seed,
        "extra_body": {"top_k": args.top_k},
        "extra_headers": headers,
    }
    if args.stream:
        chunks = client.chat.completions.create(stream=True, **kwargs)
        return "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    return client.chat.completions.create(**kwargs).choices[0].message.content or ""


def _post(url: str, body: dict) -> None:
    request = urllib.request.Request(
        url, json.dumps(body).encode(), {"Content-Type": "application/json"}
    )
    urllib.request.urlopen(request).read()


if __name__ == "__main__":
    main()
