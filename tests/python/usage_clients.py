"""Calls a running edge with the official `openai` and `anthropic` packages and prints the
sums of the `usage` objects they received, for tests/it/usage.rs to compare with the usage
API.

Usage: usage_clients.py HTTP_BASE API_KEY

The edge must serve `echo/reasoning` (usage with cached and reasoning tokens), `echo/default`
(two completions: one lands on a node that refuses it and fails over), `echo/hang` (never
answers: the SDK's call times out and goes away, which cancels the run), `echo/stall` (streams,
then waits: the client goes away after the output) and `echo/fail` (one word, then a failure).
Covers chat (whole and streamed with `include_usage`), completions, Responses (whole and
streamed), Anthropic Messages (whole and streamed), a cancel before output, a cancel after
output and a failure after output, and chat runs keyed by `prompt_cache_key`, the
`x-session-id` header and `user`. Prints `ok`, then one JSON line: runs, input, cached,
output, and the same sums by the affinity source each run was keyed from (`by_affinity`:
`prefix` for chat-like runs without a client key, `none` for completions).
"""

import json
import sys

import anthropic
import openai
from openai import OpenAI

from sdk_support import check

MESSAGES = [{"role": "user", "content": "count these four words"}]


def main():
    base, key = sys.argv[1], sys.argv[2]
    client = OpenAI(base_url=f"{base}/v1", api_key=key, max_retries=0)
    claude = anthropic.Anthropic(base_url=base, api_key=key, max_retries=0)
    totals = {"runs": 0, "input": 0, "cached": 0, "output": 0, "by_affinity": {}}

    def add(input_tokens, cached, output_tokens, source="prefix"):
        zero = {"runs": 0, "input": 0, "cached": 0, "output": 0}
        for sums in (totals, totals["by_affinity"].setdefault(source, zero)):
            sums["runs"] += 1
            sums["input"] += input_tokens
            sums["cached"] += cached or 0
            sums["output"] += output_tokens

    def add_openai(usage, source="prefix"):
        details = usage.prompt_tokens_details
        cached = details.cached_tokens if details else 0
        add(usage.prompt_tokens, cached, usage.completion_tokens, source)

    def add_responses(usage):
        add(usage.input_tokens, usage.input_tokens_details.cached_tokens, usage.output_tokens)

    def add_anthropic(usage):
        # Anthropic's input_tokens leaves out the prompt read from the cache; the usage API
        # counts the whole prompt, as OpenAI's prompt_tokens does.
        cached = usage.cache_read_input_tokens or 0
        add(usage.input_tokens + cached, cached, usage.output_tokens)

    whole = client.chat.completions.create(model="echo/reasoning", messages=MESSAGES)
    add_openai(whole.usage)
    check(whole.usage.prompt_tokens_details.cached_tokens == 1, f"cached: {whole.usage}")

    usage = None
    stream = client.chat.completions.create(
        model="echo/reasoning", messages=MESSAGES, stream=True, stream_options={"include_usage": True}
    )
    for chunk in stream:
        usage = chunk.usage or usage
    check(usage is not None, "the stream carried usage")
    add_openai(usage)

    # Least busy with ties rotating: one of the two lands on the refusing node first.
    for prompt in ["one two three", "four five six seven"]:
        completion = client.completions.create(model="echo/default", prompt=prompt, max_tokens=8)
        add_openai(completion.usage, "none")

    # Chat keyed by what the client gave: each its own affinity source.
    for source, options in [
        ("prompt_cache_key", {"extra_body": {"prompt_cache_key": "conversation-1"}}),
        ("session", {"extra_headers": {"x-session-id": "session-1"}}),
        ("user", {"user": "alice"}),
    ]:
        keyed = client.chat.completions.create(model="echo/reasoning", messages=MESSAGES, **options)
        add_openai(keyed.usage, source)

    response = client.responses.create(model="echo/reasoning", input="hello there you")
    add_responses(response.usage)
    completed = None
    for event in client.responses.create(model="echo/reasoning", input="a b", stream=True):
        if event.type == "response.completed":
            completed = event.response
    check(completed is not None, "the Responses stream completed")
    add_responses(completed.usage)

    message = claude.messages.create(model="echo/reasoning", max_tokens=64, messages=MESSAGES)
    add_anthropic(message.usage)
    with claude.messages.stream(model="echo/reasoning", max_tokens=64, messages=MESSAGES) as events:
        final = events.get_final_message()
    add_anthropic(final.usage)

    # A cancel: `echo/hang` never answers, so the SDK gives up and goes away, which cancels
    # the run; it counts, with no tokens.
    try:
        client.with_options(timeout=1.0).chat.completions.create(
            model="echo/hang", messages=MESSAGES, stream=True
        )
        raise AssertionError("a hanging run answered")
    except openai.APITimeoutError:
        pass
    add(0, 0, 0)

    # A cancel after output: `echo/stall` streams the prompt's four words, then waits. The
    # client reads them and goes away, which cancels the run; it counts what was produced:
    # the output the client saw, and the input its node reported (the mock counts words).
    stream = client.chat.completions.create(model="echo/stall", messages=MESSAGES, stream=True)
    seen = 0
    for chunk in stream:
        if chunk.choices and chunk.choices[0].delta.content:
            seen += 1
        if seen == 4:
            break
    stream.close()
    check(seen == 4, f"the stalled stream's words: {seen}")
    add(4, 0, seen)

    # A failure after output: `echo/fail` streams one word, then fails. Its node reports no
    # usage; it counts the output the client saw (the edge's count of what it relayed).
    seen = 0
    try:
        for chunk in client.chat.completions.create(
            model="echo/fail", messages=MESSAGES, stream=True
        ):
            if chunk.choices and chunk.choices[0].delta.content:
                seen += 1
        raise AssertionError("a failing run completed")
    except openai.APIError:
        pass
    check(seen == 1, f"the failed stream's words: {seen}")
    add(0, 0, seen)

    print("ok")
    print(json.dumps(totals))


if __name__ == "__main__":
    main()
