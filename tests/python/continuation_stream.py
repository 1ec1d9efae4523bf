"""Streams one answer from an edge with the official `openai` Python package, unchanged, and
reports it piece by piece, for tests/it/continuation_engine.rs (issue 31's end-to-end test).

Usage: continuation_stream.py chat|completion BASE_URL API_KEY MODEL PROMPT

Prints one JSON line per line of progress, flushed at once: `{"run_id": ...}` (the edge's
`x-edge-run-id`) when the stream opens, `{"delta": TEXT}` for each piece of text as the SDK
hands it over, and `{"text": ALL, "finish_reason": ...}` when the stream completes. The test
reads the deltas to know how far the answer got before it kills the node serving it. Any
error raises (exit 1).
"""

import json
import sys

from openai import OpenAI


def say(line):
    print(json.dumps(line), flush=True)


def main():
    mode, base_url, api_key, model, prompt = sys.argv[1:6]
    client = OpenAI(base_url=base_url, api_key=api_key, max_retries=0, timeout=60)
    if mode == "chat":
        raw = client.chat.completions.with_raw_response.create(
            model=model,
            messages=[{"role": "user", "content": prompt}],
            temperature=0,
            stream=True,
        )
    else:
        raw = client.completions.with_raw_response.create(
            model=model, prompt=prompt, temperature=0, stream=True
        )
    say({"run_id": raw.headers.get("x-edge-run-id")})
    text, finish_reason = "", None
    for chunk in raw.parse():
        if not chunk.choices:
            continue
        choice = chunk.choices[0]
        piece = choice.delta.content if mode == "chat" else choice.text
        if piece:
            text += piece
            say({"delta": piece})
        finish_reason = choice.finish_reason or finish_reason
    say({"text": text, "finish_reason": finish_reason})


if __name__ == "__main__":
    main()
