"""Background Responses resumed with the official `openai` Python package.

Usage: responses_background.py HTTP_BASE API_KEY

HTTP_BASE is an edge with the mock node of tests/it/api_support (`echo/default`,
`echo/hang`) and API_KEY among `[api] keys`. A background stream is read part-way and its
connection closed; `responses.retrieve(id, stream=True, starting_after=last_seen)` gives
the rest, and the whole text equals an uninterrupted stream's; a replay from the start has
the first stream's sequence numbers; `retrieve(id)` says completed with usage; `cancel`
cancels a background run and refuses a non-background one. Prints `ok` and exits 0 only if
every check holds. Started by tests/it/responses_background.rs.
"""

import sys

import openai

from sdk_support import check, openai_from_args

PROMPT = "one two three four five six seven eight"


def text_of(events):
    return "".join(e.delta for e in events if e.type == "response.output_text.delta")


def resumed_stream(client):
    whole = list(client.responses.create(model="echo/default", input=PROMPT, stream=True, background=True))
    check(whole[-1].type == "response.completed", f"uninterrupted: {whole[-1]}")
    expected = text_of(whole)
    check(expected != "", "the uninterrupted stream has text")

    stream = client.responses.create(model="echo/default", input=PROMPT, stream=True, background=True)
    first = []
    for event in stream:
        first.append(event)
        if len(first) == 4:
            break
    stream.close()
    response_id = first[0].response.id
    check(response_id.startswith("resp_"), f"id: {response_id}")
    last_seen = first[-1].sequence_number
    rest = list(client.responses.retrieve(response_id, stream=True, starting_after=last_seen))
    check(rest[0].sequence_number == last_seen + 1, f"resumed at {rest[0].sequence_number}, not {last_seen + 1}")
    check(rest[-1].type == "response.completed", f"resumed end: {rest[-1]}")
    numbers = [e.sequence_number for e in first + rest]
    check(numbers == list(range(len(numbers))), f"sequence numbers: {numbers}")
    check(text_of(first + rest) == expected, f"{text_of(first + rest)!r} != {expected!r}")

    replay = list(client.responses.retrieve(response_id, stream=True))
    check([(e.type, e.sequence_number) for e in replay] == [(e.type, e.sequence_number) for e in first + rest],
          "a replay from the start is the first stream again")

    done = client.responses.retrieve(response_id)
    check(done.status == "completed", f"retrieved: {done.status}")
    check(done.output_text == expected, f"retrieved text: {done.output_text!r}")
    check(done.usage is not None and done.usage.output_tokens > 0, f"usage: {done.usage}")


def background_whole_and_cancel(client):
    queued = client.responses.create(model="echo/default", input=PROMPT, background=True)
    check(queued.status in ("queued", "in_progress"), f"background answer: {queued.status}")
    check(queued.background, "the response says background")

    # A dropped background stream leaves its run open: only the cancel ends it (the Rust
    # side checks that the node was sent no `client disconnected` cancel).
    stream = client.responses.create(model="echo/hang", input="x", background=True, stream=True)
    events = iter(stream)
    opening = [next(events), next(events)]
    stream.close()
    hanging_id = opening[0].response.id
    check(opening[1].type == "response.in_progress", f"opening: {opening}")
    cancelled = client.responses.cancel(hanging_id)
    check(cancelled.status == "cancelled", f"cancel: {cancelled.status}")
    check(client.responses.retrieve(hanging_id).status == "cancelled", "retrieved after the cancel")

    plain = client.responses.create(model="echo/default", input="x")
    try:
        client.responses.cancel(plain.id)
        check(False, "a non-background response was cancelled")
    except openai.BadRequestError:
        pass
    try:
        client.responses.retrieve("resp_bg_run-none")
        check(False, "an unknown id was found")
    except openai.NotFoundError:
        pass


def main():
    args = openai_from_args(__doc__)
    if args is None:
        return 2
    base, key, client = args
    resumed_stream(client)
    background_whole_and_cancel(client)
    print(f"ok: openai {openai.__version__} resumed a background response at {base}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
