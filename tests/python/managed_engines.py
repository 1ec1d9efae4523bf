"""Drives an edge whose nodes manage an Ollama and two vLLM servers (fakes built from those
engines' source, tests/it/node_support/) with the official `openai` Python package,
unchanged (`max_retries=0`).

Usage: managed_engines.py COMMAND BASE_URL API_KEY [ARG]

BASE_URL is the edge's OpenAI base URL (http://127.0.0.1:PORT/v1). Commands:

  catalogue WINDOWS  waits (polling GET /v1/models) until the list is exactly the keys of the
                     JSON object WINDOWS, each with its context window (null: none listed),
                     then checks the cloud model is not among them.
  chat MODEL         a whole chat answered with the model's sentence ("Hello from ...") and
                     finish_reason "stop"; an Ollama model's request carries Ollama's own
                     `keep_alive` and `options.num_ctx`, which must not reach Ollama.
  two MODEL          two streamed chats of MODEL at once, each complete.
  wake AWAKE ASLEEP  streams a long chat of AWAKE; after its first piece asks ASLEEP (asleep:
                     its engine must put AWAKE to sleep, which it may only do once the stream
                     has ended); the stream ends whole ("stop", every piece) and ASLEEP
                     answers whole; neither answer is empty or aborted.

Prints `ok ...` and exits 0 only if every check holds; raises (exit 1) otherwise. Started by
tests/it/models_engines.rs, which checks the engines' own records after each command.
"""

import json
import sys
import threading
import time

from openai import OpenAI

from sdk_support import chat_piece, check, read_stream

WAIT_SECONDS = 20
POLL_SECONDS = 0.05
CLOUD = "ollama/gpt-oss:120b-cloud"


def listed(client):
    found = {}
    for model in client.models.list():
        extra = model.model_extra or {}
        found[model.id] = extra.get("context_window")
    return found


def catalogue(client, windows):
    deadline = time.monotonic() + WAIT_SECONDS
    while True:
        found = listed(client)
        if found == windows:
            break
        check(time.monotonic() < deadline, f"the catalogue is {found}, not {windows}")
        time.sleep(POLL_SECONDS)
    check(CLOUD not in found, f"the cloud model is listed: {found}")
    # Asked for by name, the cloud model is not a model of the edge.
    try:
        client.models.retrieve(CLOUD)
        check(False, "the cloud model was found")
    except Exception as error:  # openai.NotFoundError
        check(getattr(error, "status_code", None) == 404, f"retrieve {CLOUD}: {error!r}")
    return f"{len(found)} models"


def sentence(model):
    return "Hello from " + model.split("/", 1)[1] + "."


def chat(client, model):
    # Ollama's own knobs, which would unload the model or reload it with another window: the
    # edge and the node must not pass them on (the fake records what reached it).
    knobs = {"keep_alive": -1, "options": {"num_ctx": 32768}} if model.startswith("ollama/") else None
    answer = client.chat.completions.create(
        model=model, messages=[{"role": "user", "content": "Say hello"}], extra_body=knobs
    )
    choice = answer.choices[0]
    check(choice.message.content == sentence(model), f"{model}: {choice.message.content!r}")
    check(choice.finish_reason == "stop", f"{model}: finish_reason {choice.finish_reason}")
    return choice.message.content


def stream(client, model, results, first_piece=None):
    chunks = client.chat.completions.create(
        model=model,
        messages=[{"role": "user", "content": "Tell a long story"}],
        stream=True,
    )
    text, finish = "", None
    for chunk in chunks:
        for choice in chunk.choices:
            text += chat_piece(choice)
            finish = choice.finish_reason or finish
        if first_piece is not None and text:
            first_piece.set()
    results[model] = (text, finish)


def two(client, model):
    results = {}
    threads = [
        threading.Thread(target=lambda i=i: results.__setitem__(i, read_stream(
            client.chat.completions.create(
                model=model, messages=[{"role": "user", "content": f"hi {i}"}], stream=True
            ),
            chat_piece,
        )))
        for i in range(2)
    ]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(WAIT_SECONDS)
    check(len(results) == 2, f"two streams of {model}: {results}")
    for i, (text, finish, _usage, _chunks) in results.items():
        check(finish == "stop" and text.startswith(" w0"), f"stream {i}: {text!r} {finish}")
    return "two streams"


def wake(client, awake, asleep):
    results = {}
    first_piece = threading.Event()
    long = threading.Thread(target=stream, args=(client, awake, results, first_piece))
    long.start()
    check(first_piece.wait(WAIT_SECONDS), f"{awake}: no first piece")
    started = time.monotonic()
    woken = chat(client, asleep)
    waited = time.monotonic() - started
    long.join(WAIT_SECONDS)
    text, finish = results.get(awake, ("", None))
    check(finish == "stop", f"{awake}: finish_reason {finish}, text {text!r}")
    pieces = text.split()
    check(pieces == [f"w{i}" for i in range(len(pieces))] and len(pieces) >= 10,
          f"{awake}: the stream is not whole: {text!r}")
    return f"{awake} whole ({len(pieces)} pieces), {asleep} {woken!r} after {waited:.2f} s"


def main():
    if len(sys.argv) < 4:
        print(__doc__, file=sys.stderr)
        return 2
    command, base_url, key = sys.argv[1:4]
    args = sys.argv[4:]
    client = OpenAI(base_url=base_url, api_key=key, max_retries=0, timeout=60)
    if command == "catalogue":
        said = catalogue(client, json.loads(args[0]))
    elif command == "chat":
        said = chat(client, args[0])
    elif command == "two":
        said = two(client, args[0])
    elif command == "wake":
        said = wake(client, args[0], args[1])
    else:
        print(f"unknown command {command}", file=sys.stderr)
        return 2
    print(f"ok {command}: {said}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
