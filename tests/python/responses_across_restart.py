"""Reads a background Responses stream across a restart of the edge, with the official `openai`
Python package, unchanged, for tests/it/readopt_engine.rs (issue 32's end-to-end test).

Usage: responses_across_restart.py BASE_URL API_KEY MODEL PROMPT MAX_OUTPUT_TOKENS

Creates the response (`background: true, stream: true`, temperature 0) and prints one JSON
line per event, flushed at once: `{"seq": N, "type": T, "id": RESPONSE_ID, "delta": TEXT}`
(`delta` only on text deltas). When the stream breaks (the test killed the edge) it prints
`{"dropped": true}` and reads the restarted edge's base URL from stdin; then
`responses.retrieve(id, stream=True, starting_after=LAST_SEEN)` goes on, printing its events
the same way, and last `{"status": S, "output_text": TEXT}` from `responses.retrieve(id)`.
Any other error raises (exit 1).
"""

import json
import sys

from openai import OpenAI


def say(line):
    print(json.dumps(line), flush=True)


def report(event):
    line = {"seq": event.sequence_number, "type": event.type}
    response = getattr(event, "response", None)
    if response is not None:
        line["id"] = response.id
    if event.type == "response.output_text.delta":
        line["delta"] = event.delta
    say(line)


def client(base_url, api_key):
    return OpenAI(base_url=base_url, api_key=api_key, max_retries=0, timeout=60)


def main():
    base_url, api_key, model, prompt, max_tokens = sys.argv[1:6]
    stream = client(base_url, api_key).responses.create(
        model=model,
        input=prompt,
        temperature=0,
        max_output_tokens=int(max_tokens),
        background=True,
        stream=True,
    )
    response_id, last_seen = None, None
    try:
        for event in stream:
            response = getattr(event, "response", None)
            if response is not None:
                response_id = response.id
            last_seen = event.sequence_number
            report(event)
    except Exception as error:  # the connection died with the edge
        say({"dropped": True, "error": type(error).__name__})
    else:
        raise AssertionError("the stream ended before the edge was killed")
    resumed = client(sys.stdin.readline().strip(), api_key)
    for event in resumed.responses.retrieve(response_id, stream=True, starting_after=last_seen):
        report(event)
    done = resumed.responses.retrieve(response_id)
    say({"status": done.status, "output_text": done.output_text})


if __name__ == "__main__":
    main()
