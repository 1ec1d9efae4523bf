"""Drives an edge that serves a real llama-server through the reference node, with the
official `openai` Python package, unchanged.

Usage: engine_e2e.py COMMAND BASE_URL API_KEY MODEL REPLY

BASE_URL is the edge's OpenAI base URL (http://127.0.0.1:PORT/v1), MODEL the model id the
edge serves the engine as (ADAPTER/TARGET), REPLY the tiny model's answer to any chat
(tests/python/make_tiny_model.py). Every command first waits, polling `GET /v1/models`, for
what it needs; the waits are bounded by WAIT_SECONDS. Commands:

  answers  MODEL is listed; chat whole and streamed, completions whole and streamed, a cut
           answer (`max_tokens`), each with the engine's usage and finish reason.
  leave    MODEL is listed; opens an endless streamed chat (end-of-sequence banned), reads a
           few chunks, prints `streaming`, waits for a line on stdin, then closes the stream
           mid-way, as a client that leaves does.
  down     MODEL leaves the list; a chat for it then fails with 503 and Retry-After once the
           edge's wait for a node expires (not 404: the model is configured, just not
           servable now).
  up       MODEL is listed again and a chat is answered.

Prints `ok ...` and exits 0 only if every check holds; raises (exit 1) otherwise. Started by
tests/it/engines_e2e.rs.
"""

import sys
import time

import openai
from openai import OpenAI

from sdk_support import chat_piece, check, read_stream, text_piece

# The longest any wait for the edge's model list may take.
WAIT_SECONDS = 20
# Between two looks at the model list.
POLL_SECONDS = 0.05
# The tiny model's end-of-sequence token: banned, it never stops on its own.
EOS_TOKEN = "2"


def listed(client):
    return sorted(model.id for model in client.models.list())


def wait_until(client, model, present):
    """Polls the model list until MODEL is (or is not) in it, within WAIT_SECONDS."""
    deadline = time.monotonic() + WAIT_SECONDS
    while True:
        ids = listed(client)
        if (model in ids) == present:
            return ids
        state = "listed" if present else "gone"
        check(time.monotonic() < deadline, f"{model} not {state} after {WAIT_SECONDS} s: {ids}")
        time.sleep(POLL_SECONDS)


def check_usage(usage, what, completion=None):
    check(usage is not None, f"{what}: no usage")
    check(usage.prompt_tokens > 0, f"{what}: prompt_tokens {usage.prompt_tokens}")
    check(usage.completion_tokens > 0, f"{what}: completion_tokens {usage.completion_tokens}")
    check(
        usage.total_tokens == usage.prompt_tokens + usage.completion_tokens,
        f"{what}: total_tokens {usage.total_tokens}",
    )
    if completion is not None:
        check(usage.completion_tokens == completion, f"{what}: completion_tokens {usage.completion_tokens}")


def chat(client, model, reply):
    answer = client.chat.completions.create(
        model=model, messages=[{"role": "user", "content": "Say hello"}]
    )
    check(answer.object == "chat.completion", f"object: {answer.object}")
    check(answer.model == model, f"model: {answer.model}")
    choice = answer.choices[0]
    check(choice.message.role == "assistant", f"role: {choice.message.role}")
    check(choice.message.content == reply, f"content: {choice.message.content!r}")
    check(choice.finish_reason == "stop", f"finish_reason: {choice.finish_reason}")
    check_usage(answer.usage, "chat")


def chat_stream(client, model, reply):
    stream = client.chat.completions.create(
        model=model,
        messages=[
            {"role": "system", "content": "You are tiny."},
            {"role": "user", "content": "Stream a greeting"},
        ],
        stream=True,
        stream_options={"include_usage": True},
    )

    def is_chunk(chunk):
        check(chunk.object == "chat.completion.chunk", f"chunk object: {chunk.object}")

    text, finish, usage, _ = read_stream(stream, chat_piece, is_chunk)
    check(text == reply, f"streamed text: {text!r}")
    check(finish == "stop", f"streamed finish_reason: {finish}")
    check_usage(usage, "chat stream")


def cut_short(client, model, reply):
    """`max_tokens` reaches the engine: the first three tokens, `length`, 3 tokens used."""
    answer = client.chat.completions.create(
        model=model, messages=[{"role": "user", "content": "Be brief"}], max_tokens=3
    )
    content = answer.choices[0].message.content
    check(len(content) < len(reply) and reply.startswith(content), f"cut content: {content!r}")
    check(answer.choices[0].finish_reason == "length", f"cut finish_reason: {answer.choices[0].finish_reason}")
    check_usage(answer.usage, "cut chat", completion=3)


def completions(client, model, reply):
    answer = client.completions.create(model=model, prompt="Once upon a time")
    check(answer.object == "text_completion", f"object: {answer.object}")
    check(answer.choices[0].text == reply, f"completion: {answer.choices[0].text!r}")
    check(answer.choices[0].finish_reason == "stop", f"finish_reason: {answer.choices[0].finish_reason}")
    check_usage(answer.usage, "completion")

    stream = client.completions.create(
        model=model,
        prompt="Far, far away",
        stream=True,
        stream_options={"include_usage": True},
    )
    text, finish, usage, _ = read_stream(stream, text_piece)
    check(text == reply, f"streamed completion: {text!r}")
    check(finish == "stop", f"streamed completion finish_reason: {finish}")
    check_usage(usage, "completion stream")


def answers(client, model, reply):
    ids = wait_until(client, model, present=True)
    check(ids == [model], f"models: {ids}")
    chat(client, model, reply)
    chat_stream(client, model, reply)
    cut_short(client, model, reply)
    completions(client, model, reply)
    return "chat, chat stream, max_tokens, completions and completion stream answered"


def leave(client, model, reply):
    wait_until(client, model, present=True)
    stream = client.chat.completions.create(
        model=model,
        messages=[{"role": "user", "content": "Never stop"}],
        max_tokens=30000,
        logit_bias={EOS_TOKEN: -100},
        stream=True,
    )
    text = ""
    for chunk in stream:
        for choice in chunk.choices:
            check(choice.finish_reason is None, f"the endless answer finished: {choice.finish_reason}")
            text += choice.delta.content or ""
        if len(text) > 2 * len(reply):
            break
    check(text.startswith(reply), f"endless text: {text[:200]!r}")
    print("streaming", flush=True)
    sys.stdin.readline()
    stream.close()
    return f"left after {len(text)} characters"


def down(client, model, reply):
    wait_until(client, model, present=False)
    try:
        client.chat.completions.create(model=model, messages=[{"role": "user", "content": "Anyone?"}])
    except openai.NotFoundError as error:
        raise AssertionError(f"a configured model that is down is not 404: {error}") from error
    except openai.APIStatusError as error:
        check(error.status_code == 503, f"status: {error.status_code}: {error}")
        # The edge waited `runs.no_node_timeout_ms` for a node that can serve it, in vain.
        check(error.code == "no_node_available", f"code: {error.code}: {error}")
        retry_after = error.response.headers.get("retry-after")
        check(retry_after is not None and retry_after.isdigit(), f"Retry-After: {retry_after!r}")
        return f"503 ({error.code}) with Retry-After {retry_after}"
    raise AssertionError("a chat for a model no engine serves was answered")


def up(client, model, reply):
    wait_until(client, model, present=True)
    chat(client, model, reply)
    return "listed and answered"


COMMANDS = {"answers": answers, "leave": leave, "down": down, "up": up}


def main():
    if len(sys.argv) != 6 or sys.argv[1] not in COMMANDS:
        print(__doc__, file=sys.stderr)
        return 2
    command, base_url, api_key, model, reply = sys.argv[1:]
    client = OpenAI(base_url=base_url, api_key=api_key, max_retries=0, timeout=30)
    done = COMMANDS[command](client, model, reply)
    print(f"ok: {command}: {done} (openai {openai.__version__})", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
