"""Closes a streamed answer mid-way with the official `openai` and `anthropic` Python
packages, as a chat UI's stop button or an interrupted agent turn does.

Usage: sdk_disconnect.py HTTP_BASE API_KEY

HTTP_BASE is the edge's HTTP address (http://127.0.0.1:PORT), serving `echo/default` from a
node that echoes the prompt slowly. Opens a Chat Completions stream and a Messages stream of
a long prompt, reads a few events of each, and closes each stream the SDK's way
(`stream.close()`, leaving the `with` block). Prints `ok`, then the two runs' ids
(`x-edge-run-id`), one per line. Started by tests/it/client_stop.rs, which checks that the
node was told to stop each run at once.
"""

import sys

import anthropic

from sdk_support import check, openai_from_args

PROMPT = " ".join(f"w{i}" for i in range(2000))
READ = 3


def chat(client):
    response = client.chat.completions.with_raw_response.create(
        model="echo/default",
        stream=True,
        messages=[{"role": "user", "content": PROMPT}],
    )
    run_id = response.headers["x-edge-run-id"]
    stream = response.parse()
    read = 0
    for chunk in stream:
        read += 1
        if read == READ:
            break
    stream.close()
    check(read == READ, f"chat: read {read} chunks")
    return run_id


def messages(base, key):
    client = anthropic.Anthropic(base_url=base, api_key=key, max_retries=0, timeout=30)
    with client.messages.stream(
        model="echo/default",
        max_tokens=4096,
        messages=[{"role": "user", "content": PROMPT}],
    ) as stream:
        run_id = stream.response.headers["x-edge-run-id"]
        read = 0
        for _event in stream:
            read += 1
            if read == READ:
                break
    check(read == READ, f"messages: read {read} events")
    return run_id


def main():
    args = openai_from_args(__doc__)
    if args is None:
        return 2
    base, key, client = args
    ids = [chat(client), messages(base, key)]
    print("ok")
    for run_id in ids:
        print(run_id)
    return 0


if __name__ == "__main__":
    sys.exit(main())
