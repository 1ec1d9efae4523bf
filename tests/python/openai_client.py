"""Drives a running edge with the official `openai` Python package, unchanged.

Usage: openai_client.py BASE_URL API_KEY

The edge must have node-a (echo: default) and node-b (echo: default, fast) connected, the
alias `gpt-4o-mini` -> `echo/default`, and API_KEY among `[api] keys`. Every check
asserts; the script prints `ok` and exits 0 only if all hold, and exits non-zero otherwise.
Started by tests/openai_python.rs.
"""

import sys

import openai
from openai import OpenAI

from sdk_support import chat_piece, check, read_stream, text_piece


def expect_usage(usage, prompt, completion, what):
    check(usage is not None, f"{what}: no usage")
    got = (usage.prompt_tokens, usage.completion_tokens, usage.total_tokens)
    check(got == (prompt, completion, prompt + completion), f"{what}: usage {got}")


def models(client):
    ids = sorted(model.id for model in client.models.list())
    check(ids == ["echo/default", "echo/fast", "gpt-4o-mini"], f"models: {ids}")
    one = client.models.retrieve("gpt-4o-mini")
    check(one.id == "gpt-4o-mini" and one.owned_by == "echo", f"retrieve: {one}")


def chat(client):
    answer = client.chat.completions.create(
        model="echo/default",
        messages=[
            {"role": "system", "content": "you echo"},
            {"role": "user", "content": "hello from python"},
        ],
        max_tokens=16,
    )
    check(answer.object == "chat.completion", f"object: {answer.object}")
    check(answer.model == "echo/default", f"model: {answer.model}")
    choice = answer.choices[0]
    check(choice.message.role == "assistant", f"role: {choice.message.role}")
    check(choice.message.content == "hello from python", f"content: {choice.message.content!r}")
    check(choice.finish_reason == "stop", f"finish_reason: {choice.finish_reason}")
    expect_usage(answer.usage, 3, 3, "chat")


def chat_stream(client):
    stream = client.chat.completions.create(
        model="gpt-4o-mini",
        messages=[{"role": "user", "content": "streamed words arrive one by one"}],
        stream=True,
        stream_options={"include_usage": True},
    )

    def of_the_model(chunk):
        check(chunk.model == "gpt-4o-mini", f"chunk model: {chunk.model}")

    text, finish, usage, chunks = read_stream(stream, chat_piece, of_the_model)
    check(chunks >= 3, f"only {chunks} chunks")
    check(text == "streamed words arrive one by one", f"streamed text: {text!r}")
    check(finish == "stop", f"streamed finish_reason: {finish}")
    expect_usage(usage, 6, 6, "chat stream")


def completion(client):
    answer = client.completions.create(model="echo/fast", prompt="complete this text", max_tokens=8)
    check(answer.object == "text_completion", f"object: {answer.object}")
    check(answer.choices[0].text == "complete this text", f"text: {answer.choices[0].text!r}")
    check(answer.choices[0].finish_reason == "stop", f"finish_reason: {answer.choices[0].finish_reason}")
    expect_usage(answer.usage, 3, 3, "completion")

    stream = client.completions.create(
        model="echo/fast",
        prompt="a streamed completion",
        stream=True,
        stream_options={"include_usage": True},
    )
    text, finish, usage, _ = read_stream(stream, text_piece)
    check(text == "a streamed completion", f"streamed completion: {text!r}")
    check(finish == "stop", f"streamed completion finish_reason: {finish}")
    expect_usage(usage, 3, 3, "completion stream")


def errors(client, base_url):
    try:
        client.chat.completions.create(
            model="nothing/serves-this", messages=[{"role": "user", "content": "hi"}]
        )
    except openai.NotFoundError as error:
        check(error.status_code == 404, f"status: {error.status_code}")
        check(error.code == "model_not_found", f"code: {error.code}")
    else:
        raise AssertionError("an unknown model did not raise NotFoundError")

    wrong = OpenAI(base_url=base_url, api_key="sk-wrong", max_retries=0)
    try:
        wrong.models.list()
    except openai.AuthenticationError as error:
        check(error.code == "invalid_api_key", f"code: {error.code}")
    else:
        raise AssertionError("a wrong API key did not raise AuthenticationError")


def main():
    if len(sys.argv) != 3:
        print(__doc__, file=sys.stderr)
        return 2
    base_url, api_key = sys.argv[1], sys.argv[2]
    client = OpenAI(base_url=base_url, api_key=api_key, max_retries=0, timeout=30)
    models(client)
    chat(client)
    chat_stream(client)
    completion(client)
    errors(client, base_url)
    print(f"ok: openai {openai.__version__} drove the edge at {base_url}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
